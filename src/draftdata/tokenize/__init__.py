"""tokenize stage."""
