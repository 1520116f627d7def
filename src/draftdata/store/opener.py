"""A create-only object store over local directories and ``s3://`` URLs.

The run store never overwrites and never deletes data: the only write is ``put_new``, which
creates an object that did not exist, atomically (a reader sees the whole object or nothing);
``put_new_file`` does the same from a local file, streamed (exports use it).

- Local: the bytes go to a temp file beside the target (``.<name>.tmp-<random>``), are fsynced,
  then hard-linked to the final name with ``os.link`` (which fails if the name exists: no
  replace), and the directory is fsynced. Names starting with ``.`` are never listed, so a temp
  file left by a killed process is invisible.
- S3 (``s3.py``): a conditional ``PutObject`` with ``If-None-Match: *``; 412 means the key exists.

In both, a ``put_new`` that finds the key holding exactly its own bytes counts as done: that is
how a retried write whose first attempt did land (response lost) succeeds. Different bytes raise
AlreadyExistsError. A store may carry protected prefixes; a write under one is refused.

Keys are relative and ``/``-separated. The protocol and the key and location rules are
``base.py``; the backends are ``local.py`` and ``s3.py``; this module opens the one a URL names.
Nothing here knows about runs or parquet.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from draftdata.store.base import Store, normalise_url, split_s3_url
from draftdata.store.local import LocalStore
from draftdata.store.s3 import S3Store


def open_store(url: str, *, protect: Sequence[str] = ()) -> Store:
    """Open the store at ``url``: a local directory (or ``file://``) or ``s3://bucket/prefix``.

    S3 credentials, region and endpoint come from the standard AWS configuration (environment,
    profiles, ``AWS_ENDPOINT_URL``). Writes under any of ``protect`` are refused.
    """
    canon = normalise_url(url)
    if canon.startswith("s3://"):
        bucket, prefix = split_s3_url(canon)
        return S3Store(bucket, prefix, protect=protect)
    return LocalStore(Path(canon), protect=protect)
