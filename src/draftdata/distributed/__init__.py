"""Generate and tokenize on a Ray cluster (above generate and tokenize; see ARCHITECTURE.md)."""
