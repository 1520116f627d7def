"""report: one self-contained HTML page of a run, a merged dataset, or a demo output.

``build_report(inputs..., out)`` is the entry point (``build.py``); ``find.py`` says how inputs
are located, ``collect.py`` gathers the numbers, ``plots.py`` draws, ``page.py`` writes HTML.
"""

from draftdata.report.build import build_report

__all__ = ["build_report"]
