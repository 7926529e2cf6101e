"""memlab_rs.fragmentation on a GPU, against what the allocator then really does.

Each run is a fresh process (the memory fraction and the allocator settings are per
process): one 100 MiB tensor is made and freed, 25 tensors of 4 MiB carve its cached
segment, two runs of five are freed (two free blocks of 20 MiB in a split segment), and the
process may reserve only 10 MiB more than it holds. A 30 MiB request then does not fit as
configured (fragmentation: 40 MiB free, no block of 30), and the analysis says whether it
would with expandable_segments:True and with max_split_size_mb: each prediction is checked
by running the same program with that setting and making the allocation for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.cuda

MiB = 1 << 20

PROGRAM = """
import json
import torch
import memlab_rs

MiB = 1 << 20
dev = torch.device("cuda:0")
torch.cuda.init()
big = torch.empty(100 * MiB, dtype=torch.uint8, device=dev)
del big
tensors = [torch.empty(4 * MiB, dtype=torch.uint8, device=dev) for _ in range(25)]
for i in [*range(5, 10), *range(15, 20)]:
    tensors[i] = None
torch.cuda.synchronize(dev)
reserved = torch.cuda.memory_reserved(dev)
free, total = torch.cuda.mem_get_info(dev)
torch.cuda.set_per_process_memory_fraction((reserved + 10 * MiB) / total, dev)
result = memlab_rs.fragmentation(dev, request=30 * MiB)
stats = torch.cuda.memory_stats(dev)
segments = torch.cuda.memory_snapshot()
try:
    extra = torch.empty(30 * MiB, dtype=torch.uint8, device=dev)
    allocated = True
except torch.cuda.OutOfMemoryError:
    allocated = False
print(json.dumps({
    "data": result.to_data(),
    "text": result.text(),
    "fits": {s or "configured": result.fits(s) for s in
             (None, "expandable_segments:True", "max_split_size_mb")},
    "fragmented": result.fragmented(),
    "stats": {k: stats[k] for k in ("reserved_bytes.all.current",
              "allocated_bytes.all.current", "inactive_split_bytes.all.current")},
    "inactive": [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"],
    "allocated": allocated,
}))
"""


def _run(conf: str) -> dict:
    """PROGRAM in a fresh interpreter with the allocator settings ``conf``."""
    # Both names: torch 2.9+ reads PYTORCH_ALLOC_CONF first, older torch the CUDA one.
    env = {**os.environ, "PYTORCH_ALLOC_CONF": conf, "PYTORCH_CUDA_ALLOC_CONF": conf}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "fragment.py")
        with open(path, "w") as f:
            f.write(PROGRAM)
        proc = subprocess.run(
            [sys.executable, path], capture_output=True, text=True, timeout=300, env=env
        )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def default_run():
    """The program with the default settings, run once for the module's tests."""
    return _run("")


def test_the_figures_are_the_allocators(default_run):
    d, stats = default_run["data"], default_run["stats"]
    assert d["reserved_bytes"] == stats["reserved_bytes.all.current"] == 100 * MiB
    assert d["allocated_bytes"] == stats["allocated_bytes.all.current"] == 60 * MiB
    assert d["inactive_split_bytes"] == stats["inactive_split_bytes.all.current"] == 40 * MiB
    assert d["free_bytes"] == sum(default_run["inactive"]) == 40 * MiB
    assert d["largest_free"]["size"] == max(default_run["inactive"]) == 20 * MiB
    assert d["notices"] == []


def test_a_fragmented_request_fails_as_predicted(default_run):
    v = default_run["data"]["request"]
    assert default_run["fragmented"] is True
    assert (v["free_bytes"], v["largest_free"], v["rounded_bytes"]) == (
        40 * MiB,
        20 * MiB,
        30 * MiB,
    )
    assert v["configured"]["outcome"] == "out_of_memory", default_run["text"]
    assert default_run["fits"]["configured"] is False
    assert default_run["allocated"] is False


@pytest.mark.parametrize(
    ("conf", "scenario"),
    [("expandable_segments:True", "expandable_segments:True"), (None, "max_split_size_mb")],
)
def test_the_settings_do_what_was_predicted(default_run, conf, scenario):
    v = default_run["data"]["request"]
    if conf is None:  # the max_split_size_mb the analysis chose
        assert v["max_split"] is not None, default_run["text"]
        conf = v["max_split"]["setting"]
    predicted = default_run["fits"][scenario]
    assert predicted is not None, default_run["text"]
    run = _run(conf)
    assert run["allocated"] is predicted, (conf, default_run["text"], run["text"])
    # Run with the setting on, the analysis of that process agrees with what it then did.
    assert run["fits"]["configured"] is run["allocated"], run["text"]
    assert run["data"]["reserved_bytes"] == run["stats"]["reserved_bytes.all.current"]
    assert run["data"]["inactive_split_bytes"] == run["stats"]["inactive_split_bytes.all.current"]


REPORT = """
import json
import torch
import memlab_rs

MiB = 1 << 20
dev = torch.device("cuda:0")
big = torch.empty(100 * MiB, dtype=torch.uint8, device=dev)
del big
tensors = [torch.empty(4 * MiB, dtype=torch.uint8, device=dev) for _ in range(25)]
for i in [*range(5, 10), *range(15, 20)]:
    tensors[i] = None
torch.cuda.synchronize(dev)
stats = torch.cuda.memory_stats(dev)
report = memlab_rs.MemReporter().collect(device="cuda:0")
section = next(s for s in report.to_data()["sections"] if s["device"] == "cuda:0")
print(json.dumps({
    "free": section["cuda"]["free_in_reserved"],
    "reserved": stats["reserved_bytes.all.current"],
    "allocated": stats["allocated_bytes.all.current"],
    "inactive_split": stats["inactive_split_bytes.all.current"],
    "text": report.text(),
}))
"""


def test_the_cuda_tensor_report_says_where_the_free_reserved_bytes_are():
    """The CUDA tensor report's line on the free bytes inside reserved segments: exactly
    the allocator's reserved minus allocated, its inactive split bytes, and the 20 MiB
    largest free block of the carved segment."""
    proc = subprocess.run(
        [sys.executable, "-c", REPORT], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    free = got["free"]
    assert free["free_bytes"] == got["reserved"] - got["allocated"]
    assert free["inactive_split_bytes"] == got["inactive_split"]
    assert free["largest_free"] == 20 * MiB
    assert "Free inside reserved segments: 40.0 MiB" in got["text"]
