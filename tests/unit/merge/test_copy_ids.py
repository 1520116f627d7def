"""Upsampled copies never take a real row's id (issue 31).

The shape (generated): ids of any form, among them ids that look like copies of other rows
(``m0~r1``, ``m0~~r2``, ``x~~~r10``), in the domain that is upsampled and in the others, for
tokenized and chat inputs. Every output id is unique, every input row keeps its id, and every
copy is named ``ID`` + a ``~``-run one longer than any input id's ``~...~r<digits>`` ending +
``r`` + its copy number.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.merge.helpers import CHAT_TEXT, write_jsonl

from draftdata.merge.config import MergeConfig
from draftdata.merge.stage import merge
from draftdata.shared.formats import SAMPLE_SCHEMA
from draftdata.store.write import parquet_bytes

BASE = st.text("abm0", min_size=1, max_size=3)
COPYLIKE = st.builds(
    lambda base, tildes, k: f"{base}{'~' * tildes}r{k}",
    BASE,
    st.integers(1, 3),
    st.integers(0, 12),
)
IDS = st.lists(st.one_of(BASE, COPYLIKE), min_size=12, max_size=30, unique=True)


def _samples(folder: Path, ids: list[str], small: int) -> str:
    folder.mkdir(parents=True)
    rows = []
    for k, rid in enumerate(ids):
        tokens = [k % 250 + 1, (k * 7) % 250 + 1, 3, 4, 5]
        rows.append(
            {
                "id": rid,
                "source": "s",
                "domain": "math" if k < small else "general",
                "input_ids": tokens,
                "loss_mask": [0, 1, 1, 1, 1],
                "num_tokens": 5,
                "num_loss_tokens": 4,
                "truncated": False,
            }
        )
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    (folder / "part-00000.parquet").write_bytes(parquet_bytes(table))
    return str(folder)


def _chat(path: Path, ids: list[str], small: int) -> str:
    rows: list[Any] = []
    for k, rid in enumerate(ids):
        text = CHAT_TEXT["math" if k < small else "general"].format(i=k)
        conv = [{"role": "user", "content": text}, {"role": "assistant", "content": f"A{k}."}]
        rows.append({"id": rid, "conversations": conv})
    return str(write_jsonl(path, rows))


def _ids(out: Path) -> list[str]:
    return [
        i
        for p in sorted(out.glob("*/*.parquet"))
        for i in pq.read_table(p).column("id").to_pylist()
    ]


@settings(max_examples=25, deadline=None)
@given(ids=IDS, data=st.data(), chat=st.booleans(), fraction=st.sampled_from([0.0, 0.1]))
def test_copies_never_take_a_real_rows_id(
    ids: list[str], data: st.DataObject, chat: bool, fraction: float
) -> None:
    small = data.draw(st.integers(2, max(2, len(ids) // 4)))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = _chat(root / "in.jsonl", ids, small) if chat else _samples(root / "in", ids, small)
        out = root / "out"
        summary = merge(
            MergeConfig(
                add=[src],
                out=str(out),
                mix={"math": 0.5, "general": 0.5},
                mix_by="rows",
                upsample=True,
                max_repeat=4,
                eval_fraction=fraction,
                allow_drop=True,
            )
        )
        got = _ids(out)
    counts = Counter(got)
    assert all(n == 1 for n in counts.values()), [i for i, n in counts.items() if n > 1]
    runs = [len(m.group(1)) for i in ids if (m := re.search(r"(~+)r[0-9]+\Z", i))]
    suffix = "~" * (max(runs, default=0) + 1) + "r"
    assert summary.report.copy_ids == f"ID{suffix}K"
    copies = [i for i in got if i not in set(ids)]
    assert sum(summary.report.upsampled.values()) == len(copies) > 0
    assert all(re.fullmatch(rf".+{re.escape(suffix)}[1-9][0-9]*", c) for c in copies)
    upsampled = set(ids[:small])  # copies are of the short domain's rows, named after them
    assert all(c[: c.rindex(suffix)] in upsampled for c in copies)
