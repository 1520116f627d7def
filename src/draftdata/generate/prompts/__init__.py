"""The prompt stream a run answers, below the engine and the settings.

- ``source.py``: which prompt files, their identity, and a lazy, filtered reader.
- ``partition.py``: stable partitioning of prompts by id (distributed and hidden-states use
  the same rule).
- ``rejects.py``: prompt lines that are not prompts: the summary, the run's list, the
  wrong-file stop.
"""
