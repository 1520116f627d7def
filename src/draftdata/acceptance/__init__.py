"""Measuring the current drafter on speculative servers, per domain (``draftdata acceptance``)."""
