"""memlab_rs.plan: every row is the estimate of its settings, the largest size that fits is
the largest (by the estimate, and by real steps on the CPU source where the estimate is
exact), a row that cannot be estimated says why, bad arguments name the parameter, and the
result saves, loads and renders as every result does."""

from __future__ import annotations

import pytest
import torch
from cpu_step_rises import cpu_step_rises
from hypothesis import example, given, settings
from hypothesis import strategies as st

import memlab_rs
from memlab_rs import estimate, plan
from memlab_rs._sources import cpu_source as _cpu_source
from memlab_rs.estimation.search import largest_within
from memlab_rs.estimation.what_if import DEFAULT_OPTIMIZERS, precision_settings

WIDTH = 128


def _blocks(n: int = 3) -> torch.nn.Module:
    """An MLP of `n` repeated blocks (what checkpointing wraps) and a head."""
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()) for _ in range(n)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(WIDTH, 8))


def _inputs(n: int) -> torch.Tensor:
    return torch.zeros(n, WIDTH)


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1)


@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=["cpu", "emulated-gpu"])
def test_each_row_is_the_estimate_of_its_settings(device):
    model = _blocks()
    # A large batch and SGD without state: the activations make the peak.
    p = plan(model, _inputs, 512, device=device, budget="64MiB", search=False,
             optimizer=_sgd, precisions=["bf16", "amp-fp16"])  # fmt: skip
    assert [r["axis"] for r in p.rows] == [
        "baseline", "size", "size", "precision", "precision", "checkpointing", "optimizer",
        "optimizer",
    ]  # fmt: skip
    for row in p.rows:
        settings = precision_settings(row["precision"])
        spec = {"_sgd": _sgd}.get(row["optimizer"])
        if spec is None:
            spec = DEFAULT_OPTIMIZERS[row["optimizer"]]
        est = estimate(model, _inputs(row["size"]), optimizer=spec, device=device,
                       checkpointing=row["checkpointing"], **settings)  # fmt: skip
        assert (row["peak_allocated"], row["peak_reserved"]) == (
            est.peak_allocated,
            est.peak_reserved,
        ), row
        assert row["largest_size"] is None and row["error"] is None
    assert p.rows[0]["precision"] == "as given (float32)"
    assert p.rows[4]["precision"] == "amp-fp16 + GradScaler"
    if device == "cpu":
        # Checkpointing three blocks keeps less for backward than saving all of them (on
        # the GPU the recomputation's transients outweigh these small activations).
        assert p.rows[5]["peak_allocated"] < p.rows[0]["peak_allocated"]
    choices = [r["peak_reserved"] for r in p.rows if r["axis"] not in ("baseline", "size")]
    if min(choices) < p.baseline["peak_reserved"]:
        assert p.best is not None and p.best["axis"] != "size"
        assert p.best["peak_reserved"] == min(choices)
        assert "Saves the most: " + p.best["axis"] in p.text()
    else:
        assert p.best is None
        assert "Saves the most: no choice lowers the baseline's peak" in p.text()


def test_the_largest_size_is_the_largest_the_estimate_fits():
    model = _blocks()
    budget = 3_000_000
    p = plan(model, _inputs, 64, budget, device="cpu", optimizer=_sgd,
             precisions=[], optimizers={}, try_checkpointing=False)  # fmt: skip

    def need(n: int) -> int:
        return estimate(model, _inputs(n), optimizer=_sgd, device="cpu").peak_reserved

    for row in p.rows:
        n = row["largest_size"]
        assert n > 0 and need(n) <= budget < need(n + 1), row


@pytest.mark.skipif(_cpu_source.library() is None, reason="this torch has no libc10.so")
def test_the_size_that_fits_fits_in_real_steps_and_one_more_does_not():
    """On the CPU, where the estimate of an MLP is exact to the byte: real steps (the CPU
    source's peak over what the parameters and inputs hold) of the plan's largest size fit
    the budget and one size more does not."""
    model = _blocks()
    budget = 2_500_000
    p = plan(model, _inputs, 32, budget, device="cpu", optimizer=_sgd, sizes=[],
             precisions=[], optimizers={}, try_checkpointing=False)  # fmt: skip
    opt = _sgd(model.parameters())
    held = sum(t.nbytes for t in model.parameters())

    def real_peak(n: int) -> int:
        x = _inputs(n)

        def step() -> None:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return held + x.nbytes + max(cpu_step_rises(step, 2).values())

    n = p.baseline["largest_size"]
    assert real_peak(n) <= budget < real_peak(n + 1)


def test_a_row_that_cannot_be_estimated_says_why_and_the_rest_stand():
    model = torch.nn.Linear(WIDTH, 8)  # nothing repeated to checkpoint
    p = plan(model, _inputs, 8, device="cpu", budget="1MiB", search=False, sizes=[],
             precisions=[], optimizers={})  # fmt: skip
    row = p.rows[-1]
    assert row["axis"] == "checkpointing" and row["peak_reserved"] is None
    assert "no repeated blocks to checkpoint" in row["error"]
    assert p.baseline["peak_reserved"] > 0
    text = p.text()
    assert "no estimate [1]" in text and "[1] ValueError: checkpointing=True" in text


def test_it_saves_loads_and_renders_as_every_result(tmp_path):
    p = plan(_blocks(2), _inputs, 8, "8MiB", device="cpu", sizes=[16], precisions=["bf16"],
             optimizers={"SGD": _sgd}, limit=64)  # fmt: skip
    path = tmp_path / "plan.json"
    p.save(path)
    loaded = memlab_rs.load(path)
    assert isinstance(loaded, memlab_rs.MemoryPlan)
    assert loaded.text() == p.text() and loaded.rows == p.rows
    lines = p.text().splitlines()
    assert lines[0] == "What-if plan: Sequential on cpu, budget 8.0 MiB (given)"
    # At the search limit the table says a larger size may fit.
    assert all(line.endswith("64+") for line in lines[2:6]), lines


@pytest.mark.parametrize(
    "kwargs, error, names",
    [
        ({"precision": "fp8"}, ValueError, "precision must be one of"),
        ({"precisions": ["bf16", "int4"]}, ValueError, "precisions must be one of"),
        ({"precisions": "bf16"}, TypeError, "precisions must be a list"),
        ({"sizes": 8}, TypeError, "sizes must be a list"),
        ({"sizes": [0]}, ValueError, "sizes"),
        ({"size_name": ""}, TypeError, "size_name"),
        ({"optimizers": {"x": 3}}, TypeError, "optimizers['x']"),
        ({"search": "yes"}, TypeError, "search must be True or False"),
        ({"budget": "lots"}, ValueError, "budget"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, error, names):
    with pytest.raises(error, match=None) as raised:
        plan(torch.nn.Linear(4, 4), lambda n: torch.zeros(n, 4), 2, device="cpu",
             **{"budget": "1MiB", **kwargs})  # fmt: skip
    assert names in str(raised.value)


def test_a_cuda_plan_without_a_gpu_or_budget_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the budget defaults to its memory (tests/gpu covers it)")
    p = plan(torch.nn.Linear(4, 4), lambda n: torch.zeros(n, 4), 2, device="cuda",
             sizes=[], precisions=[], optimizers={}, try_checkpointing=False)  # fmt: skip
    assert p.budget is None and p.baseline["largest_size"] is None
    assert "no budget: pass budget=<bytes>" in p.text()


@given(
    threshold=st.integers(min_value=0, max_value=5000),
    start=st.integers(min_value=1, max_value=5000),
    limit=st.integers(min_value=1, max_value=4096),
)
@settings(max_examples=300, deadline=None)
def test_the_search_finds_the_largest_size_that_fits_from_any_start(threshold, start, limit):
    """Whatever the baseline's size (the search's start) and the limit, the answer is the
    largest size within the limit that fits, found in about 2 log2(answer) estimates."""
    calls = []

    def need(n: int) -> int:  # fits while n <= threshold
        calls.append(n)
        return n

    assert largest_within(need, threshold, limit, start=start) == min(threshold, limit)
    assert all(1 <= n <= limit for n in calls)
    assert len(calls) <= 2 * (max(threshold, start, limit).bit_length() + 2)


@given(
    base=st.integers(min_value=0, max_value=10**9),
    slope=st.integers(min_value=1, max_value=10**7),
    curve=st.integers(min_value=0, max_value=10**4),
    block=st.sampled_from([1, 512, 2 << 20]),
    budget=st.integers(min_value=0, max_value=10**11),
    start=st.integers(min_value=1, max_value=4096),
    limit=st.integers(min_value=1, max_value=1 << 16),
)
@example(base=0, slope=3990, curve=0, block=2 << 20, budget=6461607, start=1, limit=2047)
@settings(max_examples=400, deadline=None)
def test_the_interpolation_search_finds_what_brute_force_finds(
    base, slope, curve, block, budget, start, limit
):
    """Peaks that grow with the batch as steps' do (a base, a slope, some curvature, the
    allocator's rounding): the largest size within the budget, as a bisection of the same
    closed form finds it independently, in no more distinct estimates than bisection's
    bound."""
    calls = []

    def need(n: int) -> int:
        calls.append(n)
        raw = base + slope * n + curve * n * n
        return -(-raw // block) * block

    def brute() -> int:
        best = 0
        low, high = 1, limit
        while low <= high:  # need is non-decreasing: bisect the closed form
            mid = (low + high) // 2
            if -(-(base + slope * mid + curve * mid * mid) // block) * block <= budget:
                best, low = mid, mid + 1
            else:
                high = mid - 1
        return best

    assert largest_within(need, budget, limit, start=start) == brute()
    assert len(set(calls)) <= 2 * (max(start, limit).bit_length() + 2)
