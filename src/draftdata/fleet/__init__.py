"""fleet stage."""
