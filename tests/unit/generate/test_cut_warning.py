"""The cut-answers warning: over 5% cut, one line whose advice fits how the limit was set."""

from __future__ import annotations

import pytest

from draftdata.generate.summary import GenerateSummary


@pytest.mark.parametrize("max_tokens", [None, 2048])
def test_advice_fits_the_limit(max_tokens: int | None) -> None:
    s = GenerateSummary(out="run", completed=100, truncated=6, max_tokens=max_tokens)
    (line,) = [x for x in s.lines() if "warning" in x]
    assert "6 of 100" in line
    if max_tokens is None:  # the limit already filled the context: unsetting it cannot help
        assert "--max-tokens" not in line and "longer context length" in line
    else:
        assert "leave --max-tokens unset" in line and "(now 2048)" in line


def test_no_warning_at_five_percent_or_less() -> None:
    s = GenerateSummary(out="run", completed=100, truncated=5)
    assert not [x for x in s.lines() if "warning" in x]
