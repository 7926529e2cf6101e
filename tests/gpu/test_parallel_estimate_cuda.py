"""Two GPUs, NCCL (run on the two-GPU machine): `estimate(world_size=2, parallel=...)` within
5% of rank 0's real steps, under DDP and under FSDP2 (DDP's later steps between the
estimate's floor and its bound, and at the floor once NCCL's watchdog has swept), on two
models of
the validation zoo (a decoder with grouped-query attention in bf16, a vision transformer in
fp32 with AdamW), run by `bench/parallel_check.py` under torchrun."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
    ),
]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "parallel_check.py"


@pytest.mark.parametrize("only", ["llama_gqa bf16", "vit_b_16 fp32"])
def test_each_rank_is_within_five_percent(tmp_path: Path, only: str):
    pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    out = tmp_path / "table.txt"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(BENCH), "--only", only, "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=480, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    table = out.read_text()
    rows = [line for line in table.splitlines() if line.startswith(only.split()[0])]
    assert [line.split()[3] for line in rows] == ["ddp", "ddp-settled", "fsdp2"], table
    for line in rows:
        # Rank 0's errors on steps 1, 2 and 3, then the verdict (which holds DDP's real
        # steps 2 and 3 of back-to-back steps between the estimate's floor and its bound).
        first, second, steady = (float(x) for x in re.findall(r"([+-]\d+\.\d+)%", line)[:3])
        assert abs(first) <= 5, line
        if " ddp " not in line:  # FSDP2, and DDP once NCCL's watchdog has swept: the floor
            assert abs(second) <= 5 and abs(steady) <= 5, line
        assert " ok " in line, line
    assert "within 5% on both steps: 3 of 3 rows" in table
