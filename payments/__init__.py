"""payments app."""
