"""Courtesy on the GPU: bitwise round trips, shared storage kept, training goes on with the
same losses, and a restore that fails halfway can be finished later."""

from __future__ import annotations

import copy

import pytest
import torch

from memlab_rs import Courtesy, CourtesyRestoreError
from memlab_rs.models import TinyGPT

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda:0")


def train_state(seed=0, steps=1):
    torch.manual_seed(seed)
    model = TinyGPT(vocab=5000, dim=256, layers=4, heads=4, context=128).to(DEV)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = [step(model, optimizer, i) for i in range(steps)]
    return model, optimizer, losses


def step(model, optimizer, i):
    g = torch.Generator(device=DEV).manual_seed(1000 + i)
    vocab = model.wte.num_embeddings
    tokens = torch.randint(0, vocab, (4, 65), device=DEV, generator=g)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    optimizer.step()
    return loss.detach()


def everything(model, optimizer):
    """Parameters, grads and the optimizer state on the GPU (AdamW keeps `step` on the CPU)."""
    tensors = list(model.parameters()) + [p.grad for p in model.parameters()]
    tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return [t for t in tensors if t.is_cuda]


def bytes_of(tensors):
    return [t.detach().cpu().reshape(-1).view(torch.uint8).clone() for t in tensors]


def test_round_trip_is_bitwise_and_keeps_ties_and_views():
    model, optimizer, _ = train_state()
    base = torch.randn(1000, device=DEV)
    view = base[100:300].view(10, 20)
    tensors = everything(model, optimizer) + [base, view]
    before = bytes_of(tensors)
    ids = [id(t) for t in tensors]
    courtesy = Courtesy()
    report = courtesy.yield_memory()
    assert report.moved_bytes > 20 << 20
    assert all(t.device.type == "cpu" and t.is_pinned() for t in tensors)
    assert torch.cuda.memory_allocated(DEV) == report.still_allocated["cuda:0"]
    assert report.invisible_bytes["cuda:0"] <= report.still_allocated["cuda:0"]
    courtesy.restore()
    assert all(t.device == DEV for t in tensors)
    assert all(torch.equal(a, b) for a, b in zip(before, bytes_of(tensors)))
    assert [id(t) for t in tensors] == ids
    assert model.lm_head.weight is model.wte.weight
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert view.data_ptr() == base.data_ptr() + 100 * 4


def test_a_yielded_model_saves_pickles_and_copies_as_its_own(tmp_path):
    # Each storage on the host is a storage of its own on its bytes of the pinned buffer:
    # torch.save of the model writes the model's bytes (not its grads' and AdamW's state,
    # which share the buffer), and the copy owns storages of their own sizes.
    model, optimizer, _ = train_state()
    courtesy = Courtesy()
    courtesy.yield_memory()
    try:
        assert all(p.is_pinned() for p in model.parameters())
        path = tmp_path / "model.pt"
        torch.save(model, path)
        params = {p.data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
        assert path.stat().st_size < sum(params.values()) + (1 << 20)
        loaded = torch.load(path, weights_only=False)
        for (name, mine), theirs in zip(model.state_dict().items(), loaded.state_dict().values()):
            assert torch.equal(mine, theirs), name
        clone = copy.deepcopy(model)
        assert {p.untyped_storage().nbytes() for p in clone.parameters()} == set(params.values())
        assert clone.lm_head.weight is clone.wte.weight
    finally:
        courtesy.restore()
    assert all(p.device == DEV for p in model.parameters())


def test_training_goes_on_with_the_same_losses():
    model, optimizer, first = train_state(steps=2)
    courtesy = Courtesy()
    courtesy.yield_memory()
    courtesy.restore()
    resumed = torch.stack(first + [step(model, optimizer, i) for i in range(2, 4)])
    straight = torch.stack(train_state(steps=4)[2])
    again = torch.stack(train_state(steps=4)[2])
    if torch.equal(straight, again):  # the GPU run is deterministic: demand the same bits
        assert torch.equal(resumed, straight)
    else:  # otherwise no further from it than two uninterrupted runs are from each other
        assert (resumed - straight).abs().max() <= 2 * (again - straight).abs().max()


def test_grads_set_to_none_stay_none():
    model, optimizer, _ = train_state()
    optimizer.zero_grad(set_to_none=True)
    with Courtesy():
        assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is None and p.device == DEV for p in model.parameters())


def test_a_restore_that_runs_out_of_memory_can_be_finished_later():
    torch.manual_seed(0)
    model = TinyGPT(vocab=50000, dim=256, layers=2, heads=4, context=128).to(DEV)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step(model, optimizer, 0)
    tensors = everything(model, optimizer)
    before = bytes_of(tensors)
    courtesy = Courtesy()
    report = courtesy.yield_memory()
    free, _ = torch.cuda.mem_get_info(DEV)
    hog = torch.empty(free - report.moved_bytes // 2, dtype=torch.uint8, device=DEV)
    with pytest.raises(CourtesyRestoreError, match="call restore\\(\\) again") as failed:
        courtesy.restore()
    partial = failed.value.report
    assert partial.restored_storages > 0 and partial.remaining_storages > 0
    devices = {t.device.type for t in tensors}
    assert devices == {"cuda", "cpu"}  # some back, some still on the host
    assert all(torch.equal(a, b) for a, b in zip(before, bytes_of(tensors)))  # all valid
    del hog
    torch.cuda.empty_cache()
    courtesy.restore()
    assert all(t.device == DEV for t in tensors)
    assert all(torch.equal(a, b) for a, b in zip(before, bytes_of(tensors)))


def test_any_order_of_calls_loses_nothing():
    model, optimizer, _ = train_state()
    tensors = everything(model, optimizer)
    before = bytes_of(tensors)
    courtesy = Courtesy()
    assert courtesy.restore().restored_storages == 0  # restore without yield
    courtesy.yield_memory()
    extra = torch.ones(1000, device=DEV)  # made while yielded
    courtesy.yield_memory()  # yield twice
    assert extra.device.type == "cpu"
    courtesy.restore()
    assert courtesy.restore().restored_storages == 0  # restore twice
    assert extra.device == DEV and torch.equal(extra, torch.ones(1000, device=DEV))
    assert all(torch.equal(a, b) for a, b in zip(before, bytes_of(tensors)))


def test_the_report_names_what_could_not_move():
    model, optimizer, _ = train_state()
    tokens = torch.randint(0, 5000, (4, 64), device=DEV)
    pending = model(tokens).sum()  # a graph waiting for backward: saved activations
    courtesy = Courtesy()
    report = courtesy.yield_memory()
    assert report.invisible_bytes["cuda:0"] > 1 << 20
    assert "no Python tensor holds" in str(report)
    courtesy.restore()
    del pending


def test_only_the_devices_asked_for():
    model, optimizer, _ = train_state()
    courtesy = Courtesy(devices=[1])  # a device the state is not on
    assert courtesy.yield_memory().moved_storages == 0
    assert next(model.parameters()).device == DEV
