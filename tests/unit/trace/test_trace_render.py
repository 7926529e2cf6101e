"""The trace timeline as offline HTML and as PNG, the keyword-group plot, the top-entries
table.

The HTML checks (parsed with html.parser) always run. The browser checks run the page in
headless Chromium with the network blocked (skipped, saying so, where no Chromium is on
PATH); the PNG checks need matplotlib (the `plot` extra) and are skipped without it. Both
decode the PNG (a small decoder below: no imaging library needed) and look for the colours
of the plot: the peak marker and the biggest layer must be on the picture.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from memlab_rs.trace import plots as _trace_plots
from memlab_rs.trace.timeline import timeline_html as _trace_timeline_html

MiB = 1 << 20
PEAK_RGB = (0xB0, 0x00, 0x20)
FIRST_LAYER_RGB = (0x4E, 0x79, 0xA7)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
CHROMIUM = next((path for path in map(shutil.which, BROWSERS) if path), None)
# Every host name resolves nowhere and every request goes to a closed port: no network.
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9"]
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason=f"no Chromium on PATH (looked for {', '.join(BROWSERS)}); "
    "on Debian: apt-get install chromium",
)

NAMES = [
    "/home/alice/gpt/model.py:88 (forward)",
    "/home/alice/gpt/model.py:61 (forward)",
    "/home/alice/gpt/train.py:40 (<module>)",
    "/home/alice/.venv/lib/python3.11/site-packages/torch/optim/adamw.py:471 (_multi_tensor_adamw)",
    "/home/alice/gpt/model.py:95 (backward)",
]


def training_view(steps: int = 2, per_step: int = 300) -> dict:
    """A made-up trace of two training steps: activations grow in the forward pass and are
    freed in the backward pass, gradients and optimizer state appear; the peak is in the
    second step's forward pass."""
    cols: dict[str, list[int]] = {n: [] for n in [*NAMES, "other"]}
    time_us, now = [], 1_700_000_000_000_000
    for step in range(steps):
        for i in range(per_step):
            f = i / per_step
            opt = 800 * MiB if step > 0 or f > 0.85 else 0
            if f < 0.45:
                k, grads = f / 0.45, 0
            elif f < 0.85:
                k = 1 - (f - 0.45) / 0.4
                grads = int(400 * MiB * (1 - k))
            else:
                k, grads = 0.0, 400 * MiB if f < 0.95 else 0
            other = int((20 + 15 * math.sin(i / 7)) * MiB) + (i * 7919) % (4 * MiB)
            values = [int(900 * MiB * k), int(600 * MiB * k), 400 * MiB, opt, grads, other]
            for name, value in zip(cols, values):
                cols[name].append(value)
            time_us.append(now)
            now += 1400 + (i * 31) % 600
    total = [sum(v[i] for v in cols.values()) for i in range(len(time_us))]
    peak = max(range(len(total)), key=lambda i: (total[i], -i))
    layers = sorted(((n, cols[n]) for n in NAMES), key=lambda layer: -max(layer[1]))
    return {
        "title": "cpu — traced region",
        "time_us": time_us,
        "total": total,
        "layers": [*layers, ("other", cols["other"])],
        "peak_index": peak,
        "peak_bytes": total[peak],
        "notices": ["2 allocations were made on threads without a Python stack."],
    }


VOID = {"meta", "br", "line", "circle"}  # no end tag here (the SVG ones are self-closed)


class Page(HTMLParser):
    """What the checks need from the page: tags with their attributes, the text of the
    elements of each class (as textContent: descendants included), the scripts."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.open: list[tuple[str, dict]] = []
        self.text: dict[str, str] = {}
        self.scripts: list[tuple[dict, str]] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag not in VOID:
            self.open.append((tag, attrs))
        if tag == "script":
            self.scripts.append((attrs, ""))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in VOID:  # a browser's serialisation writes </line>
            return
        assert self.open and self.open[-1][0] == tag, f"unbalanced </{tag}>"
        self.open.pop()

    def handle_data(self, data):
        if self.open and self.open[-1][0] == "script":
            self.scripts[-1] = (self.scripts[-1][0], self.scripts[-1][1] + data)
        for _, attrs in self.open:
            for cls in (attrs.get("class") or "").split():
                self.text[cls] = self.text.get(cls, "") + data

    def find(self, tag, **attrs):
        return [
            a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())
        ]


def test_the_page_has_one_plot_every_layer_and_the_exact_peak():
    view = training_view()
    page = Page(_trace_timeline_html(view))
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
    human = _trace_plots.human_bytes(peak)
    assert page.text["peak-label"] == f"peak {human} ({peak} bytes)"
    assert f"Peak {human} ({peak} bytes) at " in page.text["summary"]
    assert page.text["notices"] == view["notices"][0]
    # the short names in the legend, the full ones on hover
    assert "model.py:88 (forward)" in page.text["name"]
    assert "/home/alice" not in page.text["name"]


def test_the_page_loads_nothing():
    html = _trace_timeline_html(training_view())
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
    html = _trace_timeline_html(view)
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
    page = Page(_trace_timeline_html(view))
    assert page.text["notices"].startswith("Downsampled from 10001 to 2000 samples")
    data = json.loads(page.scripts[0][1])
    assert len(data["total"]) == 2000 and max(data["total"]) == 5000 * 1024
    assert page.text["peak-label"] == "peak 4.9 MiB (5120000 bytes)"


def test_bad_views_are_named():
    view = training_view(steps=1, per_step=10)
    with pytest.raises(ValueError, match="has no 'total'"):
        _trace_timeline_html({k: v for k, v in view.items() if k != "total"})
    with pytest.raises(ValueError, match="time_us has 10 samples but total has 9"):
        _trace_timeline_html({**view, "total": view["total"][:9]})
    with pytest.raises(ValueError, match="peak_index 10 is past the last sample"):
        _trace_timeline_html({**view, "peak_index": 10})
    with pytest.raises(TypeError, match=r"view\['total'\] must be a list of byte counts"):
        _trace_timeline_html({**view, "total": [-1] * 10})
    with pytest.raises(TypeError, match=r"view\['layers'\] must be"):
        _trace_timeline_html({**view, "layers": [("a", [0] * 10, "extra")]})
    # the PNG renderer checks by the same rules, before it needs matplotlib
    with pytest.raises(ValueError, match="time_us has 10 samples but total has 9"):
        _trace_plots.timeline_png({**view, "total": view["total"][:9]}, "never.png")
    with pytest.raises(ValueError, match="has no 'peak_bytes'"):
        _trace_plots.timeline_png({k: v for k, v in view.items() if k != "peak_bytes"}, "x")
    assert not Path("never.png").exists()
    # lists or tuples, lists or arrays: what Python code hands over
    listed = {**view, "layers": [[n, np.asarray(v)] for n, v in view["layers"]]}
    assert _trace_timeline_html(listed) == _trace_timeline_html(view)


def test_python_and_rust_label_and_size_alike():
    for n in (0, 10, 1023, 1024, 1048575, 1048576, 5 * MiB + 123, 3 << 30, (1 << 40) + 1):
        view = {"time_us": [0], "total": [n], "layers": [], "peak_index": 0, "peak_bytes": n}
        page = Page(_trace_timeline_html(view))
        assert page.text["peak-label"] == f"peak {_trace_plots.human_bytes(n)} ({n} bytes)"
    names = [*NAMES, "<untraced>", "forward:transformer.h.3.attn", "/x/" + "a" * 80 + ".py:7 (g)"]
    view = {
        "time_us": [0],
        "total": [len(names)],
        "layers": [(name, [1]) for name in names],
        "peak_index": 0,
        "peak_bytes": len(names),
    }
    page = Page(_trace_timeline_html(view))
    shown = page.text["name"].split("total allocated", 1)[1]
    assert shown == "".join(_trace_plots.short_label(name) for name in names)


def test_top_entries_table():
    rows = [("embed", 12.5), ("attn", 100.0), ("mlp", 137.5), ("Untrackable", 50.0)]
    assert _trace_plots.top_entries_table(rows, n=3) == (
        "Top 3 of 4 entries by MiB\n"
        "Rank         MiB   Share  Entry\n"
        "   1      137.50   45.8%  mlp\n"
        "   2      100.00   33.3%  attn\n"
        "   3       50.00   16.7%  Untrackable"
    )
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        _trace_plots.top_entries_table(rows, n=0)
    with pytest.raises(TypeError, match=r"rows must hold \(name, MiB\) pairs"):
        _trace_plots.top_entries_table([("a", "lots")])


def test_without_matplotlib_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "memlab_rs\[plot\]"'):
        _trace_plots.timeline_png(training_view(steps=1, per_step=10), "never.png")
    with pytest.raises(ImportError, match="matplotlib"):
        _trace_plots.keyword_plot_png([("a", 1.0)], 2.0, "never.png")
    assert not Path("never.png").exists()


# -- pixels -------------------------------------------------------------------------------


def read_png(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA, non-interlaced PNG as an (height, width, 3) array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
    assert header is not None
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    ch = 3 if color == 2 else 4
    stride = width * ch
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 1:  # sub: a running sum along each channel
            line = np.cumsum(line.reshape(width, ch), axis=0).reshape(-1) & 0xFF
        elif kind == 2:  # up
            line = (line + prev) & 0xFF
        elif kind in (3, 4):  # average, Paeth: each byte needs the one decoded before it
            row = line.tolist()
            up = prev.tolist()
            for i in range(stride):
                left = row[i - ch] if i >= ch else 0
                if kind == 3:
                    row[i] = (row[i] + (left + up[i]) // 2) & 0xFF
                else:
                    corner = up[i - ch] if i >= ch else 0
                    p = left + up[i] - corner
                    pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - corner)
                    guess = left if pa <= pb and pa <= pc else up[i] if pb <= pc else corner
                    row[i] = (row[i] + guess) & 0xFF
            line = np.array(row, dtype=np.int32)
        out[y] = line
        prev = line
    return out.reshape(height, width, ch)[:, :, :3]


def blended(rgb, alpha=0.85):
    """A colour drawn with opacity `alpha` over white."""
    return tuple(round(alpha * c + (1 - alpha) * 255) for c in rgb)


def share_near(pixels: np.ndarray, rgb, tolerance=14) -> float:
    distance = np.abs(pixels.astype(np.int32) - np.array(rgb)).max(axis=2)
    return float((distance <= tolerance).mean())


def assert_a_plot(pixels: np.ndarray):
    """Not blank, and the peak marker and the biggest layer are on it."""
    flat = pixels.reshape(-1, 3)
    assert len(np.unique(flat, axis=0)) > 50, "the picture is (nearly) one colour"
    assert share_near(pixels, (255, 255, 255), 0) < 0.85, "the picture is mostly empty"
    assert share_near(pixels, PEAK_RGB, 40) > 0.0002, "no peak marker"
    assert share_near(pixels, blended(FIRST_LAYER_RGB)) > 0.02, "no biggest layer"


def browser(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-dev-shm-usage",
                f"--user-data-dir={profile}",
                *OFFLINE,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@needs_chromium
def test_chromium_offline_draws_the_timeline(tmp_path):
    page = tmp_path / "timeline.html"
    page.write_text(_trace_timeline_html(training_view()), encoding="utf-8")
    shot = tmp_path / "shot.png"
    done = browser(f"--screenshot={shot}", "--window-size=1200,700", page.as_uri())
    assert shot.exists(), done.stderr[-2000:]
    pixels = read_png(shot.read_bytes())
    assert pixels.shape == (700, 1200, 3)
    assert_a_plot(pixels)


@needs_chromium
def test_chromium_runs_the_hover_readout(tmp_path):
    html = _trace_timeline_html(training_view())
    hover = """<script>
window.addEventListener('load', function () {
  var r = document.querySelector('svg').getBoundingClientRect();
  document.querySelector('svg').dispatchEvent(new MouseEvent('mousemove',
    {clientX: r.left + r.width * 0.6, clientY: r.top + r.height / 2, bubbles: true}));
});
</script></body>"""
    page = tmp_path / "hover.html"
    page.write_text(html.replace("</body>", hover), encoding="utf-8")
    done = browser("--dump-dom", "--virtual-time-budget=3000", page.as_uri())
    dom = Page(done.stdout)
    readout = dom.text["readout"]
    assert readout.startswith("t = "), (readout, done.stderr[-2000:])
    assert " ms   total " in readout and " bytes)" in readout
    assert NAMES[3] in readout  # the optimizer state is alive after the first step


@needs_chromium
def test_the_browser_flags_block_the_network(tmp_path):
    """The flags the checks above run with: a request to a real host fails under them."""
    page = tmp_path / "fetch.html"
    page.write_text(
        "<!DOCTYPE html><title>pending</title><script>"
        "fetch('https://pypi.org/simple/', {mode: 'no-cors'})"
        ".then(() => document.title = 'reached', () => document.title = 'blocked');"
        "</script>",
        encoding="utf-8",
    )
    done = browser("--dump-dom", "--virtual-time-budget=5000", page.as_uri())
    assert "<title>blocked</title>" in done.stdout, done.stdout[:500]


def test_timeline_png(tmp_path):
    pytest.importorskip("matplotlib", reason='the PNG pictures need the "plot" extra')
    path = tmp_path / "timeline.png"
    _trace_plots.timeline_png(training_view(), path)
    pixels = read_png(path.read_bytes())
    assert pixels.shape == (620, 1200, 3)
    assert_a_plot(pixels)
    big = training_view(steps=20, per_step=300)  # 6000 samples: downsampled first
    _trace_plots.timeline_png(big, tmp_path / "big.png")
    assert_a_plot(read_png((tmp_path / "big.png").read_bytes()))


def test_keyword_plot_png(tmp_path):
    pytest.importorskip("matplotlib", reason='the PNG pictures need the "plot" extra')
    groups = [("attn", 612.3), ("mlp", 903.1), ("Others", 42.5), ("Untrackable", 310.0)]
    path = tmp_path / "groups.png"
    _trace_plots.keyword_plot_png(groups, 1868.0, path)
    pixels = read_png(path.read_bytes())
    assert pixels.shape == (600, 900, 3)
    assert share_near(pixels, FIRST_LAYER_RGB, 4) > 0.03  # the first group's block
    assert share_near(pixels, (0x4D, 0x4D, 0x4D), 4) > 0.05  # the expected bar
    with pytest.raises(ValueError, match="sizes must be finite"):
        _trace_plots.keyword_plot_png([("a", float("nan"))], 1.0, path)
