"""merge stage."""
