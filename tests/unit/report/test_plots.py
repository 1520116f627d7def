"""The figure helpers: PNG out for data, None for nothing, no matplotlib warnings (errors here)."""

from __future__ import annotations

from draftdata.report import plots

PNG = b"\x89PNG\r\n\x1a\n"


def test_each_kind_draws_a_png_and_nothing_for_no_data() -> None:
    summary = {"count": 3, "p5": 1, "p25": 2, "p50": 3, "p75": 4, "p95": 5, "mean": 3.1}
    drawn = [
        plots.grouped_bars("a", "t", {"_x": {"code": 0.5}, "_y": {"code": 0.2}}, "y", percent=True),
        plots.hbars("b", "t", {"context_length": 3, "": 1}, "x"),
        plots.length_boxes("c", "t", {"code": summary, "math": {"count": 0}}, "tokens"),
        plots.lines("d", "t", {"_e": [(0.0, 1.0), (1.0, 2.0)], "f": []}, "s", "tok/s"),
    ]
    for p in drawn:
        assert p is not None and p.png.startswith(PNG) and len(p.png) > 2000
    assert plots.grouped_bars("a", "t", {}, "y") is None
    assert plots.grouped_bars("a", "t", {"s": {}}, "y") is None
    assert plots.hbars("b", "t", {}, "x") is None
    assert plots.length_boxes("c", "t", {"code": {"count": 0}}, "y") is None
    assert plots.lines("d", "t", {"e": []}, "s", "y") is None
