"""The autograd graph walk the estimate's accumulation model and the doctor's saved-tensor
count share (``_torch.autograd_nodes``): each node once, however many paths reach it."""

from __future__ import annotations

import pytest
import torch
from autograd_graphs import dense_graph, distinct_nodes

from memlab_rs import _torch
from memlab_rs.doctor import facts


def test_each_node_comes_once_however_many_paths_reach_it():
    loss = dense_graph()
    expected, _ = distinct_nodes(loss)
    # the sum, 8 layers' adds (one fewer than their terms) and tanh of each earlier layer
    # (1 + 2 + ... + 8 = 36 of each less the adds' first terms), x's AccumulateGrad
    assert expected == 74
    walked = [type(node).__name__ for node in _torch.autograd_nodes([loss.grad_fn])]
    assert len(walked) == expected
    assert walked.count("TanhBackward0") == 36 and walked.count("AccumulateGrad") == 1


def test_roots_may_repeat_or_be_none():
    loss = dense_graph(3)
    walked = list(_torch.autograd_nodes([None, loss.grad_fn, loss.grad_fn]))
    assert len(walked) == distinct_nodes(loss)[0]


def test_the_doctor_counts_each_node_once_and_stops_at_its_cap(monkeypatch: pytest.MonkeyPatch):
    loss = dense_graph()
    cpu = torch.device("cpu")
    whole = facts.autograd_saved(cpu, [(loss, "loss")], {}, {})
    assert whole is not None and whole["complete"]
    # the gc walk's other live graphs may add nodes, never the same node twice
    assert whole["nodes"] >= 74
    assert whole["saved_bytes"] > 0
    monkeypatch.setattr(facts, "AUTOGRAD_NODES", 10)
    capped = facts.autograd_saved(cpu, [(loss, "loss")], {}, {})
    assert capped is not None
    assert capped["nodes"] == 10 and not capped["complete"]


def test_the_doctor_reads_hooked_saved_tensors_as_packed_without_unpacking():
    """Under saved-tensors hooks (save_on_cpu, offloading) reading ``node._saved_x`` runs
    the user's unpack hook: on a GPU, a copy back to the device in the middle of an OOM.
    Where torch tells the hook and keeps the packed value (``_raw_saved_x``), the doctor
    counts the packed tensors and never unpacks; where it does not (torch 2.8), it reads
    the attribute as before."""
    unpacked: list[int] = []

    def pack(t: torch.Tensor) -> tuple[str, torch.Tensor]:
        return ("kept", t.clone())

    def unpack(packed: tuple[str, torch.Tensor]) -> torch.Tensor:
        unpacked.append(1)
        return packed[1]

    h = torch.randn(64, 128, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = (h * 2).sin()  # sin keeps its input: as a packed 64 x 128 float32 copy
    raw = out.grad_fn._raw_saved_self
    tells_its_hook = hasattr(raw, "unpack_hook") and hasattr(raw, "data")
    found = facts.autograd_saved(torch.device("cpu"), [(out, "out")], {}, {})
    assert found is not None
    assert found["saved_bytes"] >= 64 * 128 * 4
    assert (len(unpacked) == 0) == tells_its_hook
    out.sum().backward()  # the graph is as it was: backward unpacks as usual
    assert torch.allclose(h.grad, 2 * torch.cos(h * 2))
