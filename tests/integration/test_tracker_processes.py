"""MemTracker in a fresh interpreter: the log of a fixed example, line for line against the
golden file (tensors other tests leave alive would be listed first in the test process)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from paths import FIXTURES

GOLDEN = str(FIXTURES / "tracker" / "cpu_steps.txt")


def _normalise(text: str) -> str:
    return re.sub(r"\d\d-\w\w\w-\d\d-\d\d:\d\d:\d\d", "<stamp>", text)


# A fixed example: the original's README in small (CPU, 1/1024 of its sizes), compiled as
# "main.py" so that the `At` lines are the same on every checkout.
GOLDEN_SCRIPT = """\
import torch
tracker.track()
model = torch.nn.Linear(16, 8)
tracker_with_model = None
tracker.track()
d1 = torch.zeros(30, 3, 16, 16)
d2 = torch.zeros(40, 3, 16, 16)
d3 = torch.zeros(60, 3, 16, 16)
tracker.track()
d4 = torch.zeros(120, 3, 16, 16)
d5 = torch.zeros(80, 3, 16, 16)
tracker.track()
del d4, d2
tracker.clear_cache()
tracker.track()
"""


def test_golden_log(tmp_path):
    # In a fresh interpreter: tensors other tests leave alive would be listed first.
    runner = (
        "import sys, memlab_rs\n"
        "tracker = memlab_rs.MemTracker(path=sys.argv[1], device='cpu')\n"
        "exec(compile(sys.argv[2], 'main.py', 'exec'), {'tracker': tracker})\n"
        "print(tracker.gpu_profile_fn)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", runner, f"{tmp_path}/", GOLDEN_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(proc.stdout.strip()) as f:
        got = _normalise(f.read())
    if os.environ.get("MEMLAB_RS_UPDATE_GOLDEN"):
        with open(GOLDEN, "w") as f:
            f.write(got)
    with open(GOLDEN) as f:
        want = f.read()
    assert got.splitlines() == want.splitlines()
