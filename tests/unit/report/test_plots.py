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


def _png_width(p: plots.Plot) -> int:
    import struct

    return int(struct.unpack(">I", p.png[16:20])[0])


def test_many_series_keep_the_width_and_are_named_in_html() -> None:
    from draftdata.report import page

    few = plots.grouped_bars("a", "t", {"s1": {"code": 1.0}, "s2": {"code": 2.0}}, "y")
    series = {
        f"a long series name number {i} (merge input)": {
            f"domain{j}": float(i + j) for j in range(7)
        }
        for i in range(7)
    }
    many = plots.grouped_bars("domain-mix", "Domain mix", series, "y", percent=True)
    assert few is not None and many is not None
    assert _png_width(many) <= 1.3 * _png_width(few) and _png_width(many) < 900
    assert [label for label, _ in many.legend] == list(series)
    html = page.render("r", "s", {}, [page.Section("Domain mix", [many])])
    assert html.count("<li><i style=") == 7 and 'data-text-px="16.7"' in html


def test_numbers_drawn_carry_thousands_separators() -> None:
    bars = plots.grouped_bars("t", "t", {"run": {"code": 65_293.0, "math": 1_234_567.0}}, "n")
    assert bars is not None and {"65,293", "1,234,567"} <= set(bars.texts)
    h = plots.hbars("f", "f", {"stop": 123_456, "length": 7}, "completions")
    assert h is not None and "123,456" in h.texts
    assert plots.number(53_997.0) == "53,997" and plots.number(7.5) == "7.5"


def test_a_rate_card_has_no_useless_decimal() -> None:
    from draftdata.report import page

    html = page.cards({"output_tokens_per_s": 53_997.0, "small": 7.25})
    assert ">53,997<" in html and "53,997.0" not in html and ">7.2<" in html
