"""Which model a run is written by: one model per run unless the user says otherwise.

``check_fleet_models`` refuses, before any request, a fleet whose endpoints report different
models at ``/v1/models`` (``--allow-mixed-models`` lets it go on; each completion then records
the model of the endpoint that wrote it). ``check_resume_model`` turns a resumed run whose
manifest recorded another model into one line that says what the difference means and which
option accepts it (the generic settings diff of ``Run.open`` does not); a run that holds no
completion yet takes the model the endpoints serve now (nothing was written by the other).
``recorded_model`` is what a resumed run recorded, for a start when no endpoint names its
model (the run goes on as what it is, rather than as ``default``).

It does not probe endpoints (``fleet/probe.py`` does) nor write anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftdata.errors import ConfigError, DraftdataError, RunMismatchError
from draftdata.store.base import Store
from draftdata.store.opener import open_store
from draftdata.store.read import COMPLETIONS_PREFIX
from draftdata.store.settings import recorded_settings


def _shown(urls: list[str]) -> str:
    return ", ".join(urls[:2]) + (f" and {len(urls) - 2} more" if len(urls) > 2 else "")


def check_fleet_models(urls: Sequence[str], models: Sequence[str | None], allow: bool) -> None:
    """ConfigError when the endpoints report more than one model and ``allow`` is False."""
    served: dict[str, list[str]] = {}
    for url, model in zip(urls, models, strict=True):
        if model:
            served.setdefault(model, []).append(url)
    if len(served) < 2 or allow:
        return
    parts = "; ".join(f"{m!r} at {_shown(u)}" for m, u in served.items())
    raise ConfigError(
        f"generate: the endpoints serve different models ({parts}); a run is one model's "
        "answers: fix the fleet, or pass --allow-mixed-models to go on (each completion "
        "records the model that wrote it)"
    )


def _recorded(out: str) -> tuple[str | None, Store | None]:
    """The model the run at ``out`` recorded (None: no run, or none recorded) and its store."""
    try:
        store = open_store(out)
        settings = recorded_settings(store)
    except DraftdataError:
        return None, None  # Run.open reports problems with the prefix itself
    if settings is None:
        return None, None
    return settings.model, store


def _has_completions(store: Store) -> bool:
    try:
        return bool(store.list(COMPLETIONS_PREFIX))
    except DraftdataError:
        return True  # unknown: keep the check


def recorded_model(out: str) -> str | None:
    """The model the run at ``out`` recorded, if it is a run that holds completions."""
    model, store = _recorded(out)
    if model is None or model == "default" or store is None:
        return None
    return model if _has_completions(store) else None


def check_resume_model(out: str, model: str, allow_config_change: bool) -> None:
    """RunMismatchError (one line) when the run at ``out`` recorded another model than
    ``model`` in its completions and ``allow_config_change`` is False; nothing for a new run or
    one without a completion (nothing was answered by the model it recorded: the run takes the
    new one)."""
    if allow_config_change:
        return
    before, store = _recorded(out)
    if before is None or store is None or before == model or not _has_completions(store):
        return
    same_name = (
        " ('default' is what a server without a served model name reports, or what a run "
        "records when /v1/models did not answer)"
        if before == "default"
        else ""
    )
    raise RunMismatchError(
        f"{store.url}: this run recorded model {before!r}{same_name} and the endpoints now "
        f"serve {model!r}; if it is the same model under another name, pass "
        "--allow-config-change (recorded in manifest-history/, the completions keep the name "
        "that wrote them); if it is another model, use a new --out: one run mixing two "
        "models' answers trains the drafter on two targets"
    )
