"""distributed stage."""
