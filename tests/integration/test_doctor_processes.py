"""The out-of-memory post-mortem of a whole process: `memlab-rs run --oom` on a script whose
address space is limited (RLIMIT_AS) until torch's CPU allocator refuses a tensor. The
script fails as it would without us (its traceback, status 1), the post-mortem names the
request's exact bytes, the failing line and the tensors alive, and `memlab-rs show` reads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from console_script import MEMLAB_RS

import memlab_rs

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc: Linux")

SCRIPT = """\
import resource
import torch
model = torch.nn.Linear(1024, 1024)
keep = torch.ones(32 << 20, dtype=torch.uint8)  # 32 MiB alive when it fails
with open("/proc/self/status") as f:
    size = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
def step():
    return torch.empty(1 << 30, dtype=torch.uint8)  # 1 GiB: over the limit
step()
"""


def test_run_oom_explains_a_cpu_allocator_failure_under_a_memory_limit(tmp_path: Path):
    (tmp_path / "limited.py").write_text(SCRIPT)
    proc = subprocess.run(
        [str(MEMLAB_RS), "run", "--oom", "limited.py"], cwd=tmp_path,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" in proc.stderr and "DefaultCPUAllocator" in proc.stderr
    assert "Out of memory on cpu" in proc.stderr
    written = list(tmp_path.glob("memlab_oom_*.json"))
    assert len(written) == 1, proc.stderr
    data = memlab_rs.load(written[0]).to_data()
    assert data["request"]["bytes"] == 1 << 30
    assert data["stack"][-1]["function"] == "step" and data["stack"][-1]["line"] == 9
    names = {t["name"]: t["bytes"] for t in data["tensors"]}
    assert names["model.weight"] == 1024 * 1024 * 4
    assert (32 << 20) in names.values()
    assert data["host"]["address_space_limit"] is not None
    shown = subprocess.run(
        [str(MEMLAB_RS), "show", str(written[0])], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert "Asked for: 1,073,741,824 B (1.0 GiB)" in shown.stdout
