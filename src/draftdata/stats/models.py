"""Which target models answered a dataset, as far as the files tell.

A drafter learns one target's answers; data from two targets trains it to predict neither. So
the stages that combine data ask where each input's answers came from:

- a run: the ``model`` column of its completions (a run of ``--allow-mixed-models`` may hold
  several), else the model its manifest recorded;
- tokenize's output: the models its ``summary.json`` recorded (``models``), else those of the
  run its settings name, when that run can be read;
- merge's output: the models its ``merge_report.json`` recorded (``models``);
- anything else (a training set of chat rows, foreign parquet): not known (None).

A name the servers gave when they named none (``default``) or an empty one is not a model.
This module reads; it decides nothing (``merge`` refuses two models, ``tokenize`` records them).
"""

from __future__ import annotations

from draftdata.errors import DraftdataError
from draftdata.shared.formats import COMPLETION_FORMAT, MERGE_REPORT, TOKENIZE_SUMMARY
from draftdata.stats.readers import Dataset, open_dataset
from draftdata.store.base import Store
from draftdata.store.merge_report import read_any_report
from draftdata.store.read import read_shards_parallel
from draftdata.store.settings import recorded_settings

UNNAMED = ("", "default")  # what a run records when the servers named no model


def run_models(store: Store, keys: tuple[str, ...] | list[str]) -> list[str]:
    """The models a run's completion shards ``keys`` were answered by (sorted; [] when they
    name none and the manifest recorded none)."""
    found: set[str] = set()
    for table in read_shards_parallel(store, list(keys), COMPLETION_FORMAT, ["model"]):
        found.update(str(m) for m in table.column("model").unique().to_pylist() if m)
    if not found:
        settings = recorded_settings(store)
        if settings is not None and settings.model:
            found.add(settings.model)
    return sorted(found - set(UNNAMED))


def _listed(value: object) -> list[str] | None:
    if not isinstance(value, list):
        return None
    return sorted({str(m) for m in value if isinstance(m, str) and m not in UNNAMED}) or None


def dataset_models(ds: Dataset) -> list[str] | None:
    """The models that answered ``ds`` (module docstring); None when the files do not tell."""
    try:
        if ds.is_run:
            return run_models(ds.store, ds.keys) or None
        store = ds.store
        if store.exists(TOKENIZE_SUMMARY.name):
            key = TOKENIZE_SUMMARY.name
            doc = TOKENIZE_SUMMARY.load(store.read(key), store.key_url(key))
            if "models" in doc:
                return _listed(doc["models"])
            run = (doc.get("settings") or {}).get("run")  # an output of an older tokenize
            if isinstance(run, str) and run:
                source = open_dataset(run)
                if source.is_run:
                    return run_models(source.store, source.keys) or None
            return None
        if store.exists(MERGE_REPORT.name):  # any merge's: an older one without models too
            key = MERGE_REPORT.name
            return _listed(read_any_report(store.read(key), store.key_url(key)).models)
    except DraftdataError:
        return None  # unreadable: not known (reading its rows says what is wrong)
    return None
