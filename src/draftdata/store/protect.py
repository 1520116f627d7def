"""Protected prefixes: locations a run may never write to, nor overlap.

A protected prefix (``--protect s3://bucket/completions/``, repeatable, or ``protect:`` in a
config) forbids any output prefix that equals it, contains it or lies inside it. Comparison is
by path components after normalisation (``s3://b/a/`` == ``s3://b/a``; local paths are made
absolute and symlinks resolved), so ``s3://b/completions_v2`` does not overlap
``s3://b/completions``. The checks run before a run sends any request; the store repeats the
key-level check on every write as a second line of defence.

The rule itself (``overlap``, ``refuse_protected``) is in ``base.py``, where the store's every
write checks it; this module adds the start-up check that lists what is stored under the
protected prefix. It never writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftdata.store.base import refuse_protected
from draftdata.store.opener import open_store


def _found_there(prefix: str) -> str:
    try:
        keys = open_store(prefix).list()
    except Exception as exc:  # the message must not hide the refusal behind a listing error
        return f"(could not list it: {exc})"
    if not keys:
        return "nothing is stored there yet"
    shown = ", ".join(keys[:3])
    more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
    return f"it holds {len(keys)} object(s): {shown}{more}"


def check_not_protected(
    location: str, protect: Sequence[str], *, what: str = "output", describe: bool = False
) -> None:
    """Raise ProtectedPrefixError if ``location`` equals, contains or lies inside a protected one.

    ``describe=True`` lists what is stored under the protected prefix in the message (one
    listing; used by the run's start-up check, not by every write).
    """
    refuse_protected(location, protect, what=what, found=_found_there if describe else None)
