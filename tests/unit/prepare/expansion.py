"""``examples/expansion.yaml`` as shipped, over local files: the one substitution the tests (and
the README's walkthrough) make. Each hub source reads the bundled sample file of its schema, the
live set ``s3://BUCKET/completions/`` is the given location, and the budget is scaled down;
everything else (the mix, the dedup, no fixed ``take:``) is the shipped config's."""

from __future__ import annotations

from pathlib import Path

import msgspec

from draftdata.prepare.config import PrepareConfig
from draftdata.prepare.samples import SAMPLE_FILES
from draftdata.support.config import load_config

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "examples" / "expansion.yaml"
LIVE = "s3://BUCKET/completions/"


def local_expansion(samples: Path, live: str, budget: int) -> PrepareConfig:
    """The shipped config with its sources on ``samples`` (``write_sample_sources``), its
    existing set at ``live`` and ``budget`` new prompts."""
    cfg = load_config(SHIPPED, PrepareConfig)
    sources = [
        msgspec.structs.replace(
            s, hub=None, hub_config=None, split="train", path=str(samples / SAMPLE_FILES[s.schema])
        )
        for s in cfg.sources
    ]
    assert cfg.existing is not None and cfg.existing.path == LIVE
    return msgspec.structs.replace(
        cfg,
        sources=sources,
        budget=budget,
        existing=msgspec.structs.replace(cfg.existing, path=live),
    )
