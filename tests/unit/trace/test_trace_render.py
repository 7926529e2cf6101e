"""The trace timeline as offline HTML and as PNG, the keyword-group plot, the top-entries
table.

The HTML checks (parsed with html.parser) always run; the page in a browser is
tests/integration/test_trace_browser.py's. The PNG checks need matplotlib (the `plot`
extra) and are skipped without it; they decode the PNG (tests/helpers/trace_pictures.py)
and look for the colours of the plot: the peak marker and the biggest layer must be on the
picture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from trace_pictures import (
    FIRST_LAYER_RGB,
    NAMES,
    MiB,
    Page,
    assert_a_plot,
    read_png,
    share_near,
    training_view,
)

from memlab_rs.trace import plots
from memlab_rs.trace.timeline import timeline_html


def test_the_page_has_one_plot_every_layer_and_the_exact_peak():
    view = training_view()
    page = Page(timeline_html(view))
    assert page.open == []
    assert len(page.find("svg")) == 1
    assert [a["data-layer"] for a in page.find("polygon", **{"class": "layer"})] == [
        str(k) for k in range(len(view["layers"]))
    ]
    legend = [a for _, a in page.tags if "data-full" in a]
    assert [a["data-full"] for a in legend] == [name for name, _ in view["layers"]]
    peak = view["peak_bytes"]
    label = page.find("text", **{"class": "peak-label"})
    assert [a["data-bytes"] for a in label] == [str(peak)]
    human = plots.human_bytes(peak)
    assert page.text["peak-label"] == f"peak {human} ({peak} bytes)"
    assert f"Peak {human} ({peak} bytes) at " in page.text["summary"]
    assert page.text["notices"] == view["notices"][0]
    # the short names in the legend, the full ones on hover
    assert "model.py:88 (forward)" in page.text["name"]
    assert "/home/alice" not in page.text["name"]


def test_the_page_loads_nothing():
    html = timeline_html(training_view())
    assert "http://" not in html and "https://" not in html
    page = Page(html)
    assert not page.find("link") and not page.find("img") and not page.find("iframe")
    for tag, attrs in page.tags:
        assert not {"src", "href", "xlink:href", "xmlns"} & set(attrs), (tag, attrs)
    style = html[html.index("<style>") : html.index("</style>")]
    assert "url(" not in style and "@import" not in style
    # two scripts: inert numbers for the readout, and the readout itself
    kinds = [attrs.get("type") for attrs, _ in page.scripts]
    assert kinds == ["application/json", None]
    data = json.loads(page.scripts[0][1])
    assert len(data["t"]) == len(data["x"]) == len(data["total"]) == 600
    assert data["total"] == training_view()["total"]


def test_user_text_is_escaped_and_comes_back_unchanged():
    evil = '</script><script>alert("pwned")</script><img src=x onerror=alert(1)>&amp;\'"'
    view = training_view(steps=1, per_step=20)
    view["title"] = evil
    view["layers"][0] = (f"/tmp/{evil}.py:1 (f)", view["layers"][0][1])
    view["notices"] = [evil]
    html = timeline_html(view)
    page = Page(html)
    assert len(page.scripts) == 2 and not page.find("img")
    assert page.find("li", **{"data-full": f"/tmp/{evil}.py:1 (f)"})
    assert page.text["notices"] == evil
    assert evil in page.text["layer"]  # the area's <title> tooltip
    assert all(evil not in body and "pwned" not in body for _, body in page.scripts)


def test_a_long_view_is_downsampled_and_says_so():
    n = 10_001
    total = [(i * 7919) % 1000 * 1024 for i in range(n)]
    total[4321] = 5000 * 1024
    view = {
        "title": "big",
        "time_us": list(range(0, 100 * n, 100)),
        "total": total,
        "layers": [("other", total)],
        "peak_index": 4321,
        "peak_bytes": 5000 * 1024,
        "notices": [],
    }
    page = Page(timeline_html(view))
    assert page.text["notices"].startswith("Downsampled from 10001 to 2000 samples")
    data = json.loads(page.scripts[0][1])
    assert len(data["total"]) == 2000 and max(data["total"]) == 5000 * 1024
    assert page.text["peak-label"] == "peak 4.9 MiB (5120000 bytes)"


def test_bad_views_are_named():
    view = training_view(steps=1, per_step=10)
    with pytest.raises(ValueError, match="has no 'total'"):
        timeline_html({k: v for k, v in view.items() if k != "total"})
    with pytest.raises(ValueError, match="time_us has 10 samples but total has 9"):
        timeline_html({**view, "total": view["total"][:9]})
    with pytest.raises(ValueError, match="peak_index 10 is past the last sample"):
        timeline_html({**view, "peak_index": 10})
    with pytest.raises(TypeError, match=r"view\['total'\] must be a list of byte counts"):
        timeline_html({**view, "total": [-1] * 10})
    with pytest.raises(TypeError, match=r"view\['layers'\] must be"):
        timeline_html({**view, "layers": [("a", [0] * 10, "extra")]})
    # the PNG renderer checks by the same rules, before it needs matplotlib
    with pytest.raises(ValueError, match="time_us has 10 samples but total has 9"):
        plots.timeline_png({**view, "total": view["total"][:9]}, "never.png")
    with pytest.raises(ValueError, match="has no 'peak_bytes'"):
        plots.timeline_png({k: v for k, v in view.items() if k != "peak_bytes"}, "x")
    assert not Path("never.png").exists()
    # lists or tuples, lists or arrays: what Python code hands over
    listed = {**view, "layers": [[n, np.asarray(v)] for n, v in view["layers"]]}
    assert timeline_html(listed) == timeline_html(view)


def test_python_and_rust_label_and_size_alike():
    for n in (0, 10, 1023, 1024, 1048575, 1048576, 5 * MiB + 123, 3 << 30, (1 << 40) + 1):
        view = {"time_us": [0], "total": [n], "layers": [], "peak_index": 0, "peak_bytes": n}
        page = Page(timeline_html(view))
        assert page.text["peak-label"] == f"peak {plots.human_bytes(n)} ({n} bytes)"
    names = [*NAMES, "<untraced>", "forward:transformer.h.3.attn", "/x/" + "a" * 80 + ".py:7 (g)"]
    view = {
        "time_us": [0],
        "total": [len(names)],
        "layers": [(name, [1]) for name in names],
        "peak_index": 0,
        "peak_bytes": len(names),
    }
    page = Page(timeline_html(view))
    shown = page.text["name"].split("total allocated", 1)[1]
    assert shown == "".join(plots.short_label(name) for name in names)


def test_top_entries_table():
    rows = [("embed", 12.5), ("attn", 100.0), ("mlp", 137.5), ("Untrackable", 50.0)]
    assert plots.top_entries_table(rows, n=3) == (
        "Top 3 of 4 entries by MiB\n"
        "Rank         MiB   Share  Entry\n"
        "   1      137.50   45.8%  mlp\n"
        "   2      100.00   33.3%  attn\n"
        "   3       50.00   16.7%  Untrackable"
    )
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        plots.top_entries_table(rows, n=0)
    with pytest.raises(TypeError, match=r"rows must hold \(name, MiB\) pairs"):
        plots.top_entries_table([("a", "lots")])


def test_without_matplotlib_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "memlab_rs\[plot\]"'):
        plots.timeline_png(training_view(steps=1, per_step=10), "never.png")
    with pytest.raises(ImportError, match="matplotlib"):
        plots.keyword_plot_png([("a", 1.0)], 2.0, "never.png")
    assert not Path("never.png").exists()


def test_timeline_png(tmp_path):
    pytest.importorskip("matplotlib", reason='the PNG pictures need the "plot" extra')
    path = tmp_path / "timeline.png"
    plots.timeline_png(training_view(), path)
    pixels = read_png(path.read_bytes())
    assert pixels.shape == (620, 1200, 3)
    assert_a_plot(pixels)
    big = training_view(steps=20, per_step=300)  # 6000 samples: downsampled first
    plots.timeline_png(big, tmp_path / "big.png")
    assert_a_plot(read_png((tmp_path / "big.png").read_bytes()))


def test_keyword_plot_png(tmp_path):
    pytest.importorskip("matplotlib", reason='the PNG pictures need the "plot" extra')
    groups = [("attn", 612.3), ("mlp", 903.1), ("Others", 42.5), ("Untrackable", 310.0)]
    path = tmp_path / "groups.png"
    plots.keyword_plot_png(groups, 1868.0, path)
    pixels = read_png(path.read_bytes())
    assert pixels.shape == (600, 900, 3)
    assert share_near(pixels, FIRST_LAYER_RGB, 4) > 0.03  # the first group's block
    assert share_near(pixels, (0x4D, 0x4D, 0x4D), 4) > 0.05  # the expected bar
    with pytest.raises(ValueError, match="sizes must be finite"):
        plots.keyword_plot_png([("a", float("nan"))], 1.0, path)
