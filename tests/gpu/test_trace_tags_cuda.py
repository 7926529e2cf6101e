"""Module and phase tags in torch's CUDA history: each allocation's ``user_metadata``."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from memlab_rs.trace.tags import ModuleTagger

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not hasattr(torch.cuda.memory, "_set_memory_metadata"),
        reason="torch < 2.10 records no allocation tags (torch.cuda.memory._set_memory_metadata)",
    ),
]


def alloc_tags(run) -> list[str]:
    """The tags of the CUDA allocations ``run()`` makes, in order, repeats collapsed."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        run()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    device = torch.cuda.current_device()
    tags = [
        entry.get("user_metadata", "")
        for entry in snapshot["device_traces"][device]
        if entry["action"] == "alloc"
    ]
    return [tag for tag, _ in itertools.groupby(tags)]


def test_cuda_allocations_carry_phase_and_module_and_the_user_tag_comes_back():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256),
        torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()),
        torch.nn.Linear(256, 1),
    ).cuda()
    adam = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 256, device="cuda")
    torch.cuda.memory._set_memory_metadata("user tag")
    try:

        def train():
            with ModuleTagger(model):
                for _ in range(2):
                    loss = (model(x) ** 2).sum()
                    loss.backward()  # on the autograd engine's CUDA device thread
                    adam.step()
                    adam.zero_grad()
            torch.empty(1024, device="cuda")  # after uninstall: the user's own tag again

        tags = alloc_tags(train)
        assert torch.cuda.memory._get_memory_metadata() == "user tag"
    finally:
        torch.cuda.memory._set_memory_metadata("")
    step = [
        "forward:0",
        "forward:1.0",
        "forward:1.1",
        "forward:2",
        "",  # the loss, outside the model
        "backward:2",
        "backward:1.1",
        "backward:1.0",
        "backward:0",
        "optimizer:Adam",
    ]
    # The second step's loss gradient is "" again, not the first backward's last module:
    # the end of a backward clears its device thread's tag.
    assert tags == step + step + ["user tag"]


@pytest.mark.parametrize("reentrant", [False, True])
def test_cuda_checkpoint_recomputation_is_tagged_backward(reentrant):
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(256, 256)
            self.b = torch.nn.GELU()

        def forward(self, x):
            return self.b(self.a(x))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(256, 256)
            self.blk = Block()
            self.out = torch.nn.Linear(256, 1)

        def forward(self, x):
            return self.out(checkpoint(self.blk, self.inp(x), use_reentrant=reentrant))

    model = Model().cuda()
    x = torch.randn(64, 256, device="cuda")

    def train():
        with ModuleTagger(model):
            model(x).sum().backward()

    tags = alloc_tags(train)
    first_backward = next(i for i, tag in enumerate(tags) if tag.startswith("backward:"))
    assert tags[:first_backward] == [
        "forward:inp",
        "forward:blk.a",
        "forward:blk.b",
        "forward:out",
        "",  # the sum, then its gradient on the device thread before any module's backward
    ]
    after = tags[first_backward:]
    assert not [tag for tag in after if tag.startswith("forward")]
    assert "backward:blk.a" in after and "backward:inp" in after
