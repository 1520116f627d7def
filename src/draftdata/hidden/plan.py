"""The plan: which samples get hidden states, their rows (file numbers), and batches by length.

The input is tokenize's output or a merged tokenized dataset, read through ``stats/readers``
(``open_dataset`` finds the sample shards, refuses an unfinished tokenize or merge output, and
``iter_sample_batches`` streams them typed as ``SAMPLE_SCHEMA``). One pass in file order makes
the plan:

- a sample whose id an earlier one already had is left out (``duplicates``: the first copy
  counts, as everywhere in draftdata), and so is one with no tokens (``empty``);
- a sample longer than the longest allowed (``--max-length``, default the model's context) is
  cut to it (input_ids and loss_mask together, ``truncated``); one left with no loss token is
  left out (``no_loss_tokens``: a trainer learns nothing from it);
- every sample kept gets the next row, 0, 1, 2, ...: the number in its file's name;
- the dataset's identity is the sha256 over every kept sample's id, token ids and loss mask in
  row order, so a changed dataset is refused on resume (``manifest.py``).

The plan holds ids, lengths and counts, not token lists (a few bytes a sample); the token lists
are read again, in file order and in windows, when the batches are made (``windows``): each
window of samples is sorted by length and cut into batches under the token budget, so padding
stays small without holding the dataset in memory. ``rows_of_pilot`` picks the pilot's samples.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from draftdata.errors import InputError
from draftdata.hidden.writer import SampleRow
from draftdata.stats.readers import Dataset, iter_sample_batches, open_dataset

READ_ROWS = 1024  # samples per read batch
WINDOW_TOKENS = 1 << 22  # a window of samples sorted together holds about this many tokens


@dataclass
class Plan:
    """The planned samples (row = index into these arrays) and what was left out, by reason."""

    url: str
    ids: list[str]
    sources: list[str]
    domains: list[str]
    num_tokens: npt.NDArray[np.int64]
    num_loss_tokens: npt.NDArray[np.int64]
    truncated: npt.NDArray[np.bool_]
    sha256: str
    max_length: int | None
    dropped: Counter[str] = field(default_factory=Counter)

    @property
    def samples(self) -> int:
        """How many samples are planned."""
        return len(self.ids)

    @property
    def tokens(self) -> int:
        """Their tokens."""
        return int(self.num_tokens.sum())

    def index_table(self, file_of: list[str]) -> pa.Table:
        """``hidden_index.parquet``'s rows (``formats.HIDDEN_INDEX_SCHEMA``)."""
        from draftdata.shared.formats import HIDDEN_INDEX_SCHEMA

        n = self.samples
        return pa.table(
            [
                pa.array(np.arange(n, dtype=np.int64)),
                pa.array(self.ids, pa.string()),
                pa.array(file_of, pa.string()),
                pa.array(self.sources, pa.string()),
                pa.array(self.domains, pa.string()),
                pa.array(self.num_tokens.astype(np.int32)),
                pa.array(self.num_loss_tokens.astype(np.int32)),
                pa.array(self.truncated),
            ],
            schema=HIDDEN_INDEX_SCHEMA,
        )


class _Reader:
    """The dataset's kept samples in row order, cut to the longest allowed (one pass)."""

    def __init__(self, ds: Dataset, max_length: int | None) -> None:
        self.ds = ds
        self.max_length = max_length
        self.dropped: Counter[str] = Counter()

    def __iter__(self) -> Iterator[tuple[SampleRow, str, str, bool]]:
        seen: set[str] = set()
        row = 0
        for _where, table in iter_sample_batches(self.ds, batch_rows=READ_ROWS):
            ids = table.column("id").to_pylist()
            sources = table.column("source").to_pylist()
            domains = table.column("domain").to_pylist()
            cut_before = table.column("truncated").to_pylist()
            tok = table.column("input_ids").combine_chunks()
            msk = table.column("loss_mask").combine_chunks()
            tok_off = tok.offsets.to_numpy()
            tok_val = tok.values.to_numpy(zero_copy_only=False)
            msk_off = msk.offsets.to_numpy()
            msk_val = msk.values.to_numpy(zero_copy_only=False)
            for i, sid in enumerate(ids):
                if sid is None or sid in seen:
                    self.dropped["duplicates" if sid is not None else "no_id"] += 1
                    continue
                seen.add(sid)
                a, b = int(tok_off[i]), int(tok_off[i + 1])
                c, d = int(msk_off[i]), int(msk_off[i + 1])
                if b - a != d - c:
                    raise InputError(
                        f"{self.ds.url}: sample {sid!r}: input_ids has {b - a} tokens but "
                        f"loss_mask {d - c}; the dataset is damaged"
                    )
                if b == a:
                    self.dropped["empty"] += 1
                    continue
                input_ids = tok_val[a:b].astype(np.int64)
                loss_mask = msk_val[c:d].astype(np.int64)
                cut = bool(cut_before[i])
                if self.max_length is not None and len(input_ids) > self.max_length:
                    input_ids = input_ids[: self.max_length]
                    loss_mask = loss_mask[: self.max_length]
                    cut = True
                if not loss_mask.any():
                    self.dropped["no_loss_tokens"] += 1
                    continue
                yield (
                    SampleRow(row=row, id=sid, input_ids=input_ids, loss_mask=loss_mask),
                    sources[i] or "",
                    domains[i] or "",
                    cut,
                )
                row += 1


def _digest(h: hashlib._Hash, s: SampleRow) -> None:
    raw = s.id.encode("utf-8")
    h.update(len(raw).to_bytes(8, "little"))
    h.update(raw)
    h.update(len(s.input_ids).to_bytes(8, "little"))
    h.update(s.input_ids.astype("<i8").tobytes())
    h.update(s.loss_mask.astype(np.int8).tobytes())


def open_input(url: str) -> Dataset:
    """The tokenized dataset at ``url`` (found, not read): InputError when it holds no
    tokenized samples (conversations, a run, prompts: tokenize them first)."""
    ds = open_dataset(url)  # an empty input is refused there, as empty (no conversation)
    if ds.kind != "tokenized":
        raise InputError(
            f"{url}: holds {ds.kind}, not tokenized samples; run `draftdata tokenize` first "
            "(hidden states are computed over token ids)"
        )
    return ds


def make_plan(url: str, max_length: int | None) -> Plan:
    """Read the tokenized dataset at ``url`` once and plan it (see the module docstring).

    InputError when it holds no tokenized samples or a damaged sample."""
    ds = open_input(url)
    reader = _Reader(ds, max_length)
    h = hashlib.sha256()
    ids: list[str] = []
    sources: list[str] = []
    domains: list[str] = []
    lengths: list[int] = []
    losses: list[int] = []
    cuts: list[bool] = []
    for s, source, domain, cut in reader:
        _digest(h, s)
        ids.append(s.id)
        sources.append(source)
        domains.append(domain)
        lengths.append(len(s.input_ids))
        losses.append(int(s.loss_mask.sum()))
        cuts.append(cut)
    return Plan(
        url=url,
        ids=ids,
        sources=sources,
        domains=domains,
        num_tokens=np.asarray(lengths, dtype=np.int64),
        num_loss_tokens=np.asarray(losses, dtype=np.int64),
        truncated=np.asarray(cuts, dtype=np.bool_),
        sha256="sha256:" + h.hexdigest(),
        max_length=max_length,
        dropped=reader.dropped,
    )


def iter_rows(plan: Plan) -> Iterator[SampleRow]:
    """The planned samples again, in row order, with their token lists (one more read).
    InputError when the dataset no longer gives the planned samples (changed since)."""
    ds = open_dataset(plan.url)
    for s, _source, _domain, _cut in _Reader(ds, plan.max_length):
        if (
            s.row >= plan.samples
            or plan.ids[s.row] != s.id
            or plan.num_tokens[s.row] != len(s.input_ids)
        ):
            raise InputError(
                f"{plan.url}: changed while it was being read (sample {s.row}, {s.id!r}, is not "
                "the planned one); run the command again"
            )
        yield s


def batches(samples: list[SampleRow], budget: int) -> Iterator[list[SampleRow]]:
    """``samples`` sorted by length (longest first) and cut into batches whose padded size
    (longest × count) stays within ``budget`` tokens; a sample longer than the budget is a
    batch of its own."""
    order = sorted(samples, key=lambda s: (-len(s.input_ids), s.row))
    batch: list[SampleRow] = []
    longest = 0
    for s in order:
        n = len(s.input_ids)
        top = max(longest, n)
        if batch and top * (len(batch) + 1) > budget:
            yield batch
            batch, top = [], n
        batch.append(s)
        longest = top
    if batch:
        yield batch


def windows(
    rows: Iterator[SampleRow], wanted: set[int] | None, window_tokens: int = WINDOW_TOKENS
) -> Iterator[list[SampleRow]]:
    """The samples of ``rows`` whose row is in ``wanted`` (None: all), in windows of about
    ``window_tokens`` tokens (the batcher sorts within a window)."""
    window: list[SampleRow] = []
    tokens = 0
    for s in rows:
        if wanted is not None and s.row not in wanted:
            continue
        window.append(s)
        tokens += len(s.input_ids)
        if tokens >= window_tokens:
            yield window
            window, tokens = [], 0
    if window:
        yield window


def rows_of_pilot(plan: Plan, pilot: float, todo: set[int]) -> set[int]:
    """The pilot's rows: a fraction (``pilot`` < 1) or a count of all planned samples, drawn
    with a fixed seed (the same pilot on a rerun), of which those still to do."""
    n = plan.samples
    k = max(1, round(pilot * n)) if pilot < 1 else min(n, int(pilot))
    chosen = random.Random(0).sample(range(n), k) if n else []
    return {r for r in chosen if r in todo}
