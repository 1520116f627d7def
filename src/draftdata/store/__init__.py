"""The durable run store: create-only objects (local or S3), the run layout, resume, readers.

- ``base.py``: ``Store`` (``put_new``, create-only, and reads) and the key and location rules;
  ``local.py`` and ``s3.py`` are its backends; ``opener.py``: ``open_store(url)``.
- ``protect.py``: protected-prefix checks.
- ``manifest.py``: manifest.json, settings hash, allowed-change history, opening a run's;
  ``settings.py``: a generate run's settings as one typed record (``RunSettings``).
- ``forecast.py``: a pilot's forecasts of its run as one typed record (``Forecast``), written
  create-only as forecast.json, forecast-2.json, ...
- ``merge_report.py``: a merge output's ``merge_report.json`` as one typed record
  (``MergeReport``).
- ``doneset.py``: the compact done-set; ``resume.py``: rebuilding it when a run resumes.
- ``run.py``: ``Run``, the buffered writer that other stages (generate) drive; ``shards.py``
  names and writes its shards, rollups and metrics; ``rollup.py``, ``lease.py`` beside it.
- ``read.py``: readers of a run used by tokenize, merge, stats, report and export;
  ``write.py``: the create-only parquet writer (the run, tokenize and merge write with it).
- ``prompts.py``: reading a prompts JSONL file, local or s3://.
(Exporting a run for training is the ``export`` package, above the store.)
"""

from draftdata.store.base import Store
from draftdata.store.opener import open_store
from draftdata.store.read import (
    iter_completion_tables,
    iter_completions,
    iter_failures,
    read_manifest,
    read_metrics,
)
from draftdata.store.run import Run
from draftdata.store.write import write_parquet_shard

__all__ = [
    "Run",
    "Store",
    "iter_completion_tables",
    "iter_completions",
    "iter_failures",
    "open_store",
    "read_manifest",
    "read_metrics",
    "write_parquet_shard",
]
