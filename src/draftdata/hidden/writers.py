"""``--format`` -> its writer: the registry of the trainers' offline formats (``writer.py``)."""

from __future__ import annotations

from draftdata.errors import ConfigError
from draftdata.hidden.specforge import SpecForgeWriter
from draftdata.hidden.speculators import SpeculatorsWriter
from draftdata.hidden.writer import Compression, StoredDtype, Writer

WRITERS: dict[str, type[SpeculatorsWriter] | type[SpecForgeWriter]] = {
    "speculators": SpeculatorsWriter,
    "specforge": SpecForgeWriter,
}


def writer_for(
    format: str, *, dtype: StoredDtype = "bf16", compress: Compression = "none"
) -> Writer:
    """The writer of ``--format``; ConfigError naming the option when the format does not take
    the dtype or the compression."""
    cls = WRITERS.get(format)
    if cls is None:
        raise ConfigError(f"--format {format!r}: choose speculators or specforge")
    if dtype not in cls.dtypes:
        raise ConfigError(
            f"--dtype {dtype}: {format}'s offline reader does not read it; "
            f"{format} takes {', '.join(cls.dtypes)}"
        )
    if compress not in cls.compressions:
        raise ConfigError(
            f"--compress {compress}: {format}'s offline reader does not read compressed files; "
            f"{format} takes {', '.join(cls.compressions)}"
        )
    return cls(dtype=dtype, compress=compress)
