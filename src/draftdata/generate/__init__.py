"""The generate stage: prompts -> completions on a fleet, every answer captured once.

Its folders are its layers, top down (imports only point down; ARCHITECTURE.md's "generate's
floors", which ``tests/unit/test_architecture.py`` checks):

- ``plan/``: ``generate --pilot``: the pilot's sample, the fleet's saturated rate while it
  runs, and the forecast of the whole run; the pilot runs the stage, so it sits above it.
- ``stage.py``: ``generate(config) -> GenerateSummary``, the stage in named phases;
  ``preflight.py``: everything checked before a run is opened.
- ``engine/``: the event loop and the layers of one answer's way (dispatcher, caller, output
  limit, client) with the parts they hold.
- ``config.py`` (the settings), ``summary.py`` (what a run did), ``run_model.py`` (which
  model a run is written by): what the layers above pass around.
- ``prompts/``: the prompt stream (files, partitions, rejected lines); ``answers/``: what an
  answer is (parsing a body, its bounds, the thinking mode).
"""
