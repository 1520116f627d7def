"""One target's answers per merged set: the models of merge's inputs, checked before any work.

A drafter learns to predict one target model; a set that holds two targets' answers trains it to
predict neither. ``input_models`` finds what answered each input (``stats/models.py``: a run's
completions, a tokenized output's summary, a merge output's report; None where the files do not
tell, e.g. an existing training set of chat rows), and ``check_models`` refuses, in one line,
inputs answered by more than one model unless the user says they mean it (``--allow-models``).
Each input's models and all of them go into ``merge_report.json`` (``inputs[].models``,
``models``), so a merged set says whose answers it holds.
"""

from __future__ import annotations

from draftdata.errors import ConfigError
from draftdata.merge.inputs import InputInfo
from draftdata.stats.models import dataset_models


def input_models(infos: list[InputInfo]) -> list[list[str] | None]:
    """The models that answered each input, in input order (None: not known)."""
    return [dataset_models(i.dataset) for i in infos]


def check_models(infos: list[InputInfo], models: list[list[str] | None], allow: bool) -> None:
    """ConfigError (one line) when the inputs were answered by more than one model and
    ``allow`` is False."""
    where: dict[str, list[str]] = {}
    for info, found in zip(infos, models, strict=True):
        for m in found or []:
            where.setdefault(m, []).append(info.path)
    if len(where) < 2 or allow:
        return
    each = "; ".join(
        f"{m!r} ({', '.join(paths[:2])}{f' and {len(paths) - 2} more' if len(paths) > 2 else ''})"
        for m, paths in sorted(where.items())
    )
    raise ConfigError(
        f"merge: the inputs were answered by different models: {each}; a drafter trained on "
        "two targets' answers predicts neither: merge one model's data, or pass "
        "--allow-models if that is what you mean"
    )


def all_models(models: list[list[str] | None]) -> list[str]:
    """Every model that answered some input (sorted)."""
    return sorted({m for found in models for m in found or []})
