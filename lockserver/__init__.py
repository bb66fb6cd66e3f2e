"""lockserver app."""
