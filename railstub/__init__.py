"""railstub app."""
