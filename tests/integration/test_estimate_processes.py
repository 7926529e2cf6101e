"""The estimate in fresh interpreters: its CUDA emulation on meta tensors against what fake
CUDA tensors allocate, CUDA's autocast included (a fake CUDA forward without a GPU aborts
some torch versions, so each runs in a process of its own). Moved from
tests/unit/estimate/test_estimate.py."""

from __future__ import annotations

import json
import subprocess
import sys

import paths
import pytest
import torch

# Run in fresh interpreters: a fake CUDA forward without a GPU aborts some torch versions.
FORWARD_ALLOCATIONS = '''
import contextlib, json, sys
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from memlab_rs.estimation import _fake_step as fs
from memlab_rs.estimation._cuda_dispatch import CudaDispatch
from memlab_rs.models import TinyGPT


def forward_allocations(model, x, run_on, emulate):
    """(op, bytes) of every storage the forward allocates, run on fake `run_on` tensors."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    book = fs.Book("cuda")
    book.counts = lambda t: t.device.type == run_on
    book.phase_begin("setup")
    fake = fs.fake_model(model, mode, torch.device(run_on), None)
    inputs = fs.fake_inputs(x, mode, torch.device(run_on), None)
    book.phase_begin("forward 1")
    dispatch = CudaDispatch(book) if emulate else None
    below = dispatch.exclude_below if dispatch else None
    with mode, dispatch or contextlib.nullcontext(), fs._Recorder(book, None, below):
        fake(inputs).sum()
    return [[book.origins[i].split(" (")[0], b] for op, i, b in book.events if op == 0]


if __name__ == "__main__":
    # The token ids go in first (an identity: dropout acts on floats), then dropout.
    model = torch.nn.Sequential(
        torch.nn.Identity(),
        TinyGPT(vocab=100, dim=32, layers=2, heads=4, context=16),
        torch.nn.Dropout(0.2),
        torch.nn.GELU(),
    )
    x = torch.zeros(2, 8, dtype=torch.long)
    print(json.dumps(forward_allocations(model, x, sys.argv[1], sys.argv[2] == "1")))
'''


def test_cuda_emulation_on_meta_allocates_what_fake_cuda_tensors_allocate(tmp_path):
    # Fake CUDA tensors can run a forward without a GPU (not a backward) on recent torch:
    # there, CUDA's branches of the composite ops are taken by torch itself. The emulation
    # (meta tensors) must allocate the same.
    script = tmp_path / "forward_allocations.py"
    script.write_text(FORWARD_ALLOCATIONS)

    def run(run_on: str, emulate: bool):
        return subprocess.run(
            [sys.executable, str(script), run_on, "1" if emulate else "0"],
            capture_output=True,
            text=True,
            timeout=300,
        )

    emulated = run("meta", True)
    assert emulated.returncode == 0, emulated.stderr
    allocations = json.loads(emulated.stdout)
    assert ["aten.native_dropout.default", 2 * 8 * 100] in allocations  # the 1-byte mask
    real = run("cuda", False)
    if real.returncode < 0 and not torch.cuda.is_available():
        # torch 2.8 aborts (SIGABRT) on a fake CUDA forward without a GPU: no reference.
        pytest.skip(f"torch {torch.__version__} aborts on fake CUDA tensors without a GPU")
    assert real.returncode == 0, real.stderr
    assert allocations == json.loads(real.stdout)


def test_cuda_autocast_emulation_allocates_what_torch_s_own_autocast_allocates():
    # tests/helpers/autocast_oracle.py: named models (a transformer block with SDPA and
    # layer norm, a conv net with batch norm, an MLP with GELU, dropout and cross-entropy,
    # nn.TransformerEncoderLayer) in bfloat16, float16 and without autocast, and random
    # module stacks (hypothesis): the forward on meta with the emulation against torch's
    # C++ CUDA autocast on fake CUDA tensors, storage by storage (dtype, bytes, in order).
    proc = subprocess.run(
        [sys.executable, str(paths.TESTS / "helpers" / "autocast_oracle.py"), "25"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode < 0 and not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} aborts on fake CUDA tensors without a GPU")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert len(result["named"]) == 12
    assert {name: diff for name, diff in result["named"].items() if diff} == {}
    assert result["random"] == []
