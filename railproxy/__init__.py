"""railproxy app."""
