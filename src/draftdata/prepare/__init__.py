"""prepare stage."""
