"""The trace timeline's HTML page in a real browser: headless Chromium with the network
blocked draws it offline and runs its hover readout (skipped, saying so, where no Chromium is
on PATH). The page's markup is checked in process by tests/unit/trace/test_trace_render.py."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest
from trace_pictures import NAMES, Page, assert_a_plot, read_png, training_view

from memlab_rs.trace.timeline import timeline_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
CHROMIUM = next((path for path in map(shutil.which, BROWSERS) if path), None)
# Every host name resolves nowhere and every request goes to a closed port: no network.
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9"]
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason=f"no Chromium on PATH (looked for {', '.join(BROWSERS)}); "
    "on Debian: apt-get install chromium",
)


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
    page.write_text(timeline_html(training_view()), encoding="utf-8")
    shot = tmp_path / "shot.png"
    done = browser(f"--screenshot={shot}", "--window-size=1200,700", page.as_uri())
    assert shot.exists(), done.stderr[-2000:]
    pixels = read_png(shot.read_bytes())
    assert pixels.shape == (700, 1200, 3)
    assert_a_plot(pixels)


@needs_chromium
def test_chromium_runs_the_hover_readout(tmp_path):
    html = timeline_html(training_view())
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
