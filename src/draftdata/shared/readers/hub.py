"""A Hugging Face hub dataset, streamed by ``datasets`` (``load_dataset(..., streaming=True)``).

Rows come decoded, one at a time; ``split`` may name several splits joined by ``+``, read in
turn. Nothing is downloaded whole. Whether the hub can be reached at all is the caller's
business (prepare checks it once before reading any source).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from draftdata.shared.readers.base import Parse, Reader, T


class HubReader(Reader[T]):
    """Rows of hub dataset ``name`` (config ``config``), split by split."""

    def __init__(
        self,
        name: str,
        parse: Parse[T],
        *,
        config: str | None = None,
        split: str = "train",
        **kw: Any,
    ) -> None:
        super().__init__(parse, **kw)
        self.name, self.config, self.split = name, config, split

    def raw_rows(self) -> Iterator[tuple[str, Any]]:
        from datasets import load_dataset

        for split in self.split.split("+"):
            ds = load_dataset(self.name, name=self.config, split=split, streaming=True)
            for n, row in enumerate(ds):
                yield f"{self.name}[{split}]: row {n}", row
