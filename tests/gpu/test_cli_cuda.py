"""`memlab-rs run` on a GPU (run on the GPU machine): each rank profiles its own GPU by
default. The CPU side of the command line is tests/integration/test_cli.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from console_script import MEMLAB_RS

import memlab_rs

MiB = 1 << 20


def cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The installed console script, run in ``cwd`` with ``env`` added."""
    return subprocess.run(
        [str(MEMLAB_RS), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=180,
    )


CUDA_SCRIPT = """\
import os
import torch

torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


@profile
def step():
    x = torch.zeros(256, 1024, device="cuda")
    return x


step()
"""


@pytest.mark.cuda
def test_run_profiles_this_rank_gpu_by_default(tmp_path: Path):
    """Without --device, each rank reads its own GPU: LOCAL_RANK's, as torchrun sets it,
    even though @profile made the profiler before the script chose its device."""
    import torch

    (tmp_path / "gpu.py").write_text(CUDA_SCRIPT)
    last = torch.cuda.device_count() - 1
    env = {"RANK": str(last), "LOCAL_RANK": str(last), "WORLD_SIZE": str(last + 1)}
    proc = cli("run", "-o", "gpu.json", "gpu.py", cwd=tmp_path, env=env)  # no --device
    assert proc.returncode == 0, proc.stderr
    saved_name = "gpu.json" if last == 0 else f"gpu.rank{last}.json"
    result = memlab_rs.load(tmp_path / saved_name)
    assert result.meta["device"] == f"cuda:{last}"
    (line,) = [r for r in result.records() if "torch.zeros" in r["code"]]
    assert line["allocated_bytes.all.allocated"] == MiB
