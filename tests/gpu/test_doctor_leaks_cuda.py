"""The leak check on CUDA: a list of CUDA tensors growing by exact bytes per step is found
at its line with exactly those bytes (multiples of 512 bytes: the history's sizes are the
caching allocator's blocks); a steady loop says nothing; the history is off afterwards
unless the user had it on, and then it stays on."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

import memlab_rs
from memlab_rs._sources import cuda_history

pytestmark = pytest.mark.cuda

HERE = os.path.basename(__file__)


def history_on() -> bool:
    return cuda_history.history_enabled()  # (torch segfaults if asked before CUDA starts)


def line_of(function, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    (offset,) = [i for i, line in enumerate(lines) if text in line]
    return first + offset


def test_a_cuda_list_growing_by_exact_bytes_is_found_at_its_line():
    kept = []

    def step():
        kept.append(torch.empty(3 * 1024 * 1024, dtype=torch.uint8, device="cuda"))  # 3 MiB
        x = torch.randn(1024, 1024, device="cuda")
        return (x @ x).sum().item()

    assert not history_on()
    result = memlab_rs.leaks(step, steps=4, warmup=2, device="cuda")
    assert not history_on()
    (site,) = result.sites(f"cuda:{torch.cuda.current_device()}")
    assert site["location"].endswith(f"{HERE}:{line_of(step, 'kept.append')} (step)"), site
    assert site["bytes_per_step"] == 3 * 1024 * 1024
    assert site["live_bytes"] == [3 * 3 << 20, 4 * 3 << 20, 5 * 3 << 20, 6 * 3 << 20]
    assert site["allocations"] == 6
    assert result.devices == [f"cuda:{torch.cuda.current_device()}"]


def test_a_steady_cuda_loop_says_nothing_and_a_users_history_stays_on():
    model = torch.nn.Linear(256, 256).cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def train_step():
        loss = model(torch.randn(64, 256, device="cuda")).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    torch.cuda.memory._record_memory_history("all", context="alloc", stacks="python")
    try:
        result = memlab_rs.leaks(train_step, steps=5, warmup=2)  # CPU tensors and CUDA
        assert history_on()
    finally:
        torch.cuda.memory._record_memory_history(None)
    assert result.sites() == []
    assert result.devices == ["cpu", f"cuda:{torch.cuda.current_device()}"]
    assert "already on" in " ".join(result.notices(result.devices[1]))
