"""executor app."""
