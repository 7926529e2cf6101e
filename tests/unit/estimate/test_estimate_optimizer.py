"""memlab_rs.estimate given the optimizer a user already has: the same class on the fake
copy with each param group's hyperparameters, state where it has some, the instance left
as it was, clear errors."""

from __future__ import annotations

import copy

import pytest
import torch

from memlab_rs import estimate, max_batch_size
from memlab_rs.models import TinyGPT

SMALL = dict(vocab=100, dim=32, layers=2, heads=4, context=16)


def _tiny():
    torch.manual_seed(0)
    return TinyGPT(**SMALL), torch.zeros(2, 8, dtype=torch.long)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_an_instance_gives_the_same_estimate_as_its_class_and_kwargs(device):
    model, x = _tiny()
    kwargs = {"lr": 1e-3, "weight_decay": 0.1}
    by_class = estimate(
        model, x, optimizer=torch.optim.AdamW, optimizer_kwargs=kwargs, device=device
    )
    opt = torch.optim.AdamW(model.parameters(), **kwargs)
    by_instance = estimate(model, x, optimizer=opt, device=device)
    assert by_instance.phase_peaks == by_class.phase_peaks
    assert by_instance.phase_ends == by_class.phase_ends
    assert by_instance.peak_reserved == by_class.peak_reserved
    # exp_avg and exp_avg_sq of every parameter, and AdamW's step counters: CPU tensors of
    # 4 bytes each (not counted on CUDA).
    steps = 4 * len(list(model.parameters())) if device == "cpu" else 0
    assert by_instance.optimizer_state == 2 * by_class.parameters + steps


def _three_linears():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.Linear(64, 32), torch.nn.Linear(32, 16)
    )
    model[0].requires_grad_(False)  # a frozen part, in no group
    return model, torch.zeros(4, 64)


def test_param_groups_keep_their_own_hyperparameters_and_a_frozen_part_has_no_state():
    model, x = _three_linears()
    opt = torch.optim.SGD(
        [
            {"params": model[1].parameters(), "momentum": 0.9},  # a momentum buffer each
            {"params": model[2].parameters(), "lr": 0.01},  # momentum 0: no state
        ],
        lr=0.1,
    )
    est = estimate(model, x, optimizer=opt, device="cpu")
    b, c = (sum(p.numel() * 4 for p in model[i].parameters()) for i in (1, 2))
    assert est.parameters == b + c + (64 * 64 + 64) * 4
    assert est.gradients == b + c  # the frozen layer has none
    assert est.optimizer_state == b  # only the first group keeps momentum


def test_a_group_s_foreach_is_respected_on_cuda():
    model, x = _three_linears()
    loop = estimate(
        model,
        x,
        optimizer=torch.optim.Adam,
        optimizer_kwargs={"foreach": False},
        device="cuda",
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam([{"params": trainable, "foreach": False}])
    assert estimate(model, x, optimizer=opt, device="cuda").phase_peaks == loop.phase_peaks
    # Unset, it becomes foreach=True on CUDA as with a class: another peak.
    default = estimate(model, x, optimizer=torch.optim.Adam(trainable), device="cuda")
    assert default.phase_peaks != loop.phase_peaks


def test_an_optimizer_with_state_starts_the_estimate_with_state_and_is_untouched():
    model, x = _three_linears()
    opt = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=1e-3)
    fresh = estimate(model, x, optimizer=opt, device="cpu")
    model(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    groups = copy.deepcopy(hyper)
    state = {p: {k: (v, v.clone()) for k, v in s.items()} for p, s in opt.state.items()}

    resumed = estimate(model, x, optimizer=opt, device="cpu")
    # The state is on the device before the first step: setup holds it.
    assert resumed.phase_ends["setup"] == fresh.phase_ends["setup"] + fresh.optimizer_state
    assert resumed.optimizer_state == fresh.optimizer_state
    # Both steps are steady ones; fresh, the second is.
    assert resumed.step_peaks[1] == resumed.step_peaks[2] == fresh.step_peaks[2]
    assert any("optimizer has state" in note for note in resumed.notes)

    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups
    for p, values in state.items():
        assert opt.state[p].keys() == values.keys()
        for key, (tensor, before) in values.items():
            assert opt.state[p][key] is tensor and torch.equal(tensor, before)
    assert all(p.grad is None for p in model.parameters())


def test_max_batch_size_takes_an_instance():
    model = torch.nn.Linear(1000, 1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    best = max_batch_size(
        model, lambda b: torch.zeros(b, 1000), budget=30_000_000, optimizer=opt, device="cpu"
    )
    assert best > 0

    def need(batch):
        return estimate(model, torch.zeros(batch, 1000), optimizer=opt, device="cpu")

    assert need(best).peak_reserved <= 30_000_000 < need(best + 1).peak_reserved


def test_bad_optimizer_instances_are_clear_errors():
    model, x = _three_linears()
    other = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD([*model[1].parameters(), other.weight], lr=0.1)
    with pytest.raises(ValueError, match=r"optimizer's param group 0 .* not a parameter of model"):
        estimate(model, x, optimizer=opt, device="cpu")
    good = torch.optim.SGD(model[1].parameters(), lr=0.1)
    with pytest.raises(TypeError, match="optimizer_kwargs go with an optimizer class"):
        estimate(model, x, optimizer=good, optimizer_kwargs={"lr": 0.1}, device="cpu")
    with pytest.raises(TypeError, match="optimizer must be an optimizer class"):
        estimate(model, x, optimizer="adamw", device="cpu")

    class NeedsMore(torch.optim.SGD):
        def __init__(self, params, schedule, lr=0.1):  # `schedule` is not in its defaults
            super().__init__(params, lr=lr)

    with pytest.raises(ValueError, match="optimizer: a NeedsMore could not be built"):
        estimate(model, x, optimizer=NeedsMore(model[1].parameters(), None), device="cpu")
