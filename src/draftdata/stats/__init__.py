"""stats: what a dataset holds (domain mix, sources, lengths, reasoning, finish reasons).

``compute_stats(url)`` is the entry point; ``readers`` (shared with merge) locates a dataset
and streams its rows; ``render`` prints the result as tables.
"""

from draftdata.stats.compute import DatasetStats, compute_stats

__all__ = ["DatasetStats", "compute_stats"]
