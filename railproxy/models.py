"""Django models of this app."""
