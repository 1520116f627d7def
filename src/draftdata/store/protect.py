"""Protected prefixes: locations a run may never write to, nor overlap.

A protected prefix (``--protect s3://bucket/completions/``, repeatable, or ``protect:`` in a
config) forbids any output prefix that equals it, contains it or lies inside it. Comparison is
by path components after normalisation (``s3://b/a/`` == ``s3://b/a``; local paths are made
absolute and symlinks resolved), so ``s3://b/completions_v2`` does not overlap
``s3://b/completions``. The checks run before a run sends any request; the store repeats the
key-level check on every write as a second line of defence.

This module only compares locations and lists what is there for the message; it never writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftdata.errors import ProtectedPrefixError
from draftdata.store.store import normalise_url


def _parts(url: str) -> tuple[str, ...]:
    canon = normalise_url(url)
    if canon.startswith("s3://"):
        return ("s3:", *[p for p in canon[5:].split("/") if p])
    return ("file:", *[p for p in canon.split("/") if p])


def overlap(a: str, b: str) -> str | None:
    """How location ``a`` relates to ``b``: 'equals', 'contains', 'lies inside', or None."""
    pa, pb = _parts(a), _parts(b)
    if pa == pb:
        return "equals"
    if pb[: len(pa)] == pa:
        return "contains"
    if pa[: len(pb)] == pb:
        return "lies inside"
    return None


def _found_there(prefix: str) -> str:
    from draftdata.store.store import open_store

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
    for prot in protect:
        rel = overlap(location, prot)
        if rel is None:
            continue
        found = f"; {_found_there(prot)}" if describe else ""
        raise ProtectedPrefixError(
            f"{what} {normalise_url(location)} {rel} the protected prefix "
            f"{normalise_url(prot)}{found}; choose an output prefix outside it "
            "(or remove it from --protect / protect: if that is really intended)"
        )
