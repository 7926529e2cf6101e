"""Which iterations the training monitor measures (``feature_maps="auto"``): saved-tensor
hooks only while the step changes, the figures of an identical measured step reused
otherwise. Checked against a monitor that measures every iteration on identical runs
(same seeds), by hand-written cases and by random sequences of steps; and the backward
boundaries found through the wrapped ``torch.autograd.backward``/``grad``."""

from __future__ import annotations

import io
import random

import pytest
import torch

import memlab_rs
from memlab_rs._categories import CATEGORIES
from memlab_rs.monitor import _backward_calls


class Net(torch.nn.Module):
    """Linear(1000, 500) -> ReLU -> Linear(500, 10); ``extra`` adds a ``tanh`` whose output
    (8 x 10 floats at batch 8) autograd saves, a change the inputs do not show."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(1000, 500), torch.nn.ReLU(), torch.nn.Linear(500, 10)
        )
        self.extra = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return y.tanh() if self.extra else y


def feature_maps(batch: int, extra: bool = False) -> int:
    # The first Linear's input, ReLU's output (saved by the second Linear too: once), and
    # tanh's output when ``extra``.
    return batch * 1000 * 4 + batch * 500 * 4 + (batch * 10 * 4 if extra else 0)


def run(plan, mode: str, optimizer: bool = True, verbose: bool = False):
    """Train Net through ``plan`` (a list of (batch, extra, backwards)) under a monitor."""
    model = Net()
    opt = torch.optim.Adam(model.parameters()) if optimizer else None
    torch.manual_seed(1)
    with memlab_rs.memory_profiler(
        model, optimizer=opt, file=io.StringIO(), feature_maps=mode, verbose=verbose
    ) as mon:
        for batch, extra, backwards in plan:
            model.extra = extra
            for _ in range(backwards):
                model(torch.randn(batch, 1000)).sum().backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            mon.record_stats()
    return mon


NUMBERS = [
    "peak_cached",
    "current_cached",
    "weight_usage",
    "weight_gradient_usage",
    "optimizer_state_usage",
    "peak_allocated",
    "peak_window",
    "backward_passes",
]


def assert_same_step(auto: dict, every: dict) -> None:
    assert {k: auto[k] for k in NUMBERS} == {k: every[k] for k in NUMBERS}
    if auto["feature_maps_from"] is not None:
        assert auto["feature_maps"] == every["feature_maps"]
        # Measured with the feature maps (hooks on the graph's nodes), or reused with them.
        assert auto["intermediate_gradients"] == every["intermediate_gradients"]
        assert [auto[c] for c in CATEGORIES] == [every[c] for c in CATEGORIES]
    else:
        # Unmeasured: the saved tensors are counted in 'other'; the rest is exact.
        assert auto["feature_maps"] is None
        assert auto["intermediate_gradients"] is None
        assert "not measured" in auto["notice"]
        assert auto["activation"] == 0
        assert auto["other"] == every["other"] + every["activation"]
        for c in CATEGORIES:
            if c not in ("activation", "other"):
                assert auto[c] == every[c], c
    assert sum(auto[c] for c in CATEGORIES) == auto["peak_allocated"]


def test_identical_steps_are_measured_until_two_agree_then_reused():
    plan = [(8, False, 1)] * 6
    auto, every = run(plan, "auto"), run(plan, "every")
    rows = auto.rows()
    # Step 1 creates Adam's state, so step 2 differs from it; steps 2 and 3 agree.
    assert [r["feature_maps_from"] for r in rows] == [1, 2, 3, 3, 3, 3]
    assert [r["feature_maps_from"] for r in every.rows()] == [1, 2, 3, 4, 5, 6]
    for a, e in zip(rows, every.rows()):
        assert a["feature_maps"] == feature_maps(8)
        assert_same_step(a, e)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_hooks_are_off_once_the_step_is_stable():
    model = Net()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        tops = []
        for _ in range(4):
            tops.append(torch._C._autograd._top_saved_tensors_default_hooks(False))
            model(torch.randn(8, 1000)).sum().backward()
            mon.record_stats()
    # Step 1 creates the gradients (never zeroed here): step 2 differs, 3 agrees with 2.
    assert [t is not None for t in tops] == [True, True, True, False]
    assert [r["feature_maps_from"] for r in mon.rows()] == [1, 2, 3, 3]


def test_new_input_shapes_are_measured_at_once():
    plan = [(8, False, 1)] * 4 + [(16, False, 1)] * 2 + [(8, False, 1)] * 2
    auto, every = run(plan, "auto"), run(plan, "every")
    rows = auto.rows()
    assert [r["feature_maps"] for r in rows] == [feature_maps(b) for b, _extra, _n in plan]
    # Step 5 is measured from its forward on; 6 agrees with it. Step 7 is measured again
    # (its inputs differ from step 6's), and 8 agrees with 7.
    assert [r["feature_maps_from"] for r in rows] == [1, 2, 3, 3, 5, 6, 7, 8]
    for a, e in zip(rows, every.rows()):
        assert_same_step(a, e)


def test_a_change_the_inputs_do_not_show_is_unmeasured_then_measured():
    plan = [(8, False, 1)] * 4 + [(8, True, 1)] * 3
    out = io.StringIO()
    model = Net()
    with memlab_rs.memory_profiler(model, file=out) as mon:
        for batch, extra, _n in plan:
            model.extra = extra
            model(torch.randn(batch, 1000)).sum().backward()
            mon.record_stats()
    rows = mon.rows()
    assert [r["feature_maps_from"] for r in rows] == [1, 2, 3, 3, None, 6, 7]
    assert rows[4]["feature_maps"] is None
    assert [r["feature_maps"] for r in rows[5:]] == [feature_maps(8, True)] * 2
    block = mon.text(5)
    assert "\nTotal feature map usage" + "." * 14 + "n/a\n" in block
    assert "Feature maps were not measured this iteration" in block
    assert block.endswith("\nIntermediate gradients...............n/a\nNote: " + rows[4]["notice"])
    assert "n/a" not in mon.text(6)


def test_verbose_modules_are_reused():
    plan = [(8, False, 1)] * 5
    mon = run(plan, "auto", verbose=True)
    assert [r["feature_maps_from"] for r in mon.rows()] == [1, 2, 3, 3, 3]
    expected = [("body.0", 8 * 1000 * 4), ("body.1", 8 * 500 * 4)]
    details = mon.result().to_data()["details"]
    assert all([tuple(m) for m in d["modules"]] == expected for d in details)


@pytest.mark.parametrize("seed", range(30))
def test_random_steps_agree_with_measuring_every_step(seed):
    rng = random.Random(seed)
    plan = []
    for _ in range(rng.randint(3, 12)):
        if plan and rng.random() < 0.6:
            plan.append(plan[-1])  # long runs of identical steps, as in training
        else:
            plan.append((rng.choice([4, 8]), rng.random() < 0.3, rng.choice([1, 1, 2])))
    optimizer = rng.random() < 0.7
    auto, every = run(plan, "auto", optimizer), run(plan, "every", optimizer)
    rows = auto.rows()
    assert len(rows) == len(plan)
    for i, (a, e, (batch, extra, _n)) in enumerate(zip(rows, every.rows(), plan)):
        assert_same_step(a, e)
        if a["feature_maps_from"] is not None:
            assert a["feature_maps"] == feature_maps(batch, extra)
            # A reused step's figures come from an earlier measured step of the same plan.
            assert plan[a["feature_maps_from"] - 1] == plan[i]
        if i > 0 and rows[i - 1]["feature_maps_from"] is None:
            assert a["feature_maps_from"] == i + 1  # measured right after an unmeasured one


def test_backward_through_autograd_grad_is_a_boundary():
    model = Net()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        x = torch.randn(8, 1000)
        params = list(model.parameters())
        grads = torch.autograd.grad(model(x).sum(), params)
        mon.record_stats()
    (r,) = mon.rows()
    assert r["backward_passes"] == 1
    assert r["feature_maps"] == feature_maps(8)
    assert sum(g.numel() for g in grads) * 4 == r["weight_usage"]


def test_a_backward_torch_compile_traces_is_no_boundary():
    # AOTAutograd traces the backward through torch.autograd.grad on functional tensors
    # while it compiles the first forward: nothing is allocated, no boundary, no gradients.
    model = Net()
    compiled = torch.compile(model, backend="aot_eager")
    try:
        with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
            for _ in range(2):
                compiled(torch.randn(8, 1000)).sum().backward()
                mon.record_stats()
    finally:
        torch._dynamo.reset()
    assert [r["backward_passes"] for r in mon.rows()] == [1, 1]
    assert [r["notice"] for r in mon.rows()] == [None, None]
    # The compiled backward is one node: the loss's gradient in, nothing but leaves' out.
    assert [r["intermediate_gradients"] for r in mon.rows()] == [4, 4]


def test_the_estimates_fake_step_is_no_boundary():
    model = Net()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        for estimate in (False, True):
            if estimate:  # its step runs backward on fake tensors: nothing real
                memlab_rs.estimate(model, torch.randn(8, 1000), device="cpu")
            model(torch.randn(8, 1000)).sum().backward()
            mon.record_stats()
    assert [r["backward_passes"] for r in mon.rows()] == [1, 1]
    assert [r["intermediate_gradients"] for r in mon.rows()] == [4 + 2 * 8 * 500 * 4] * 2


def test_the_backward_wrappers_are_removed_and_leave_others_in_place():
    original = torch.autograd.backward
    mon = memlab_rs.memory_profiler(Net(), file=io.StringIO())
    assert _backward_calls.installed()
    mon.stop()
    assert torch.autograd.backward is original and not _backward_calls.installed()

    # Another tool wraps backward while the monitor runs: stopping keeps its wrapper.
    calls = []
    mon = memlab_rs.memory_profiler(Net(), file=io.StringIO())
    ours = torch.autograd.backward

    def theirs(*args, **kwargs):
        calls.append(1)
        return ours(*args, **kwargs)

    torch.autograd.backward = theirs
    try:
        mon.stop()
        assert torch.autograd.backward is theirs
        torch.ones(2, requires_grad=True).sum().backward()
        assert calls == [1]
    finally:
        torch.autograd.backward = original


def test_a_dropped_monitor_does_not_keep_listening():
    import gc

    mon = memlab_rs.memory_profiler(Net(), file=io.StringIO())
    mon._hooks.stop()
    torch._C._autograd._pop_saved_tensors_default_hooks()
    del mon
    gc.collect()
    torch.ones(2, requires_grad=True).sum().backward()  # the dead listener is skipped
    assert not any(r() is not None for r in _backward_calls._listeners)
    _backward_calls.remove(None)  # type: ignore[arg-type]
    assert not _backward_calls.installed()


def test_bad_feature_maps_mode():
    with pytest.raises(ValueError, match="feature_maps must be 'auto'"):
        memlab_rs.memory_profiler(Net(), feature_maps="sometimes")
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert not _backward_calls.installed()


def test_no_push_inside_a_hook_block_the_user_opened():
    model = Net()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        for batch in (8, 8, 8, 16, 16):
            if batch == 16 and len(mon.rows()) == 3:
                # New inputs inside the user's own block: pushing ours there would let
                # their exit pop ours and leave theirs on the stack.
                with torch.autograd.graph.save_on_cpu():
                    loss = model(torch.randn(batch, 1000)).sum()
                assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
            else:
                loss = model(torch.randn(batch, 1000)).sum()
            loss.backward()
            mon.record_stats()
    rows = mon.rows()
    assert [r["feature_maps_from"] for r in rows] == [1, 2, 3, None, 5]
    assert rows[4]["feature_maps"] == feature_maps(16)


def test_keyboard_interrupt_in_backward_closes_the_window():
    model = Net()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        out = model(torch.randn(8, 1000))

        def interrupt(grad):
            raise KeyboardInterrupt

        out.register_hook(interrupt)
        with pytest.raises(KeyboardInterrupt):
            out.sum().backward()
        assert mon._phase == "after"  # the backward's end was seen despite the interrupt
        mon.record_stats()
        model(torch.randn(8, 1000)).sum().backward()
        mon.record_stats()
    first, second = mon.rows()
    assert first["backward_passes"] == second["backward_passes"] == 1
    # The interrupted graph is still held (by ``out``): both graphs' saved tensors count.
    assert second["feature_maps"] == 2 * feature_maps(8)
    for r in (first, second):
        assert sum(r[c] for c in CATEGORIES) == r["peak_allocated"]


def test_cprofile_and_a_trace_function_alongside():
    import cProfile
    import sys

    lines = []

    def tracer(frame, event, arg):
        if event == "line":
            lines.append(frame.f_lineno)
        return tracer

    plan = [(8, False, 1)] * 5
    profiler = cProfile.Profile()
    old = sys.gettrace()
    sys.settrace(tracer)
    profiler.enable()
    try:
        auto = run(plan, "auto")
    finally:
        profiler.disable()
        sys.settrace(old)
    assert lines  # the trace function saw our code run
    every = run(plan, "every")
    for a, e in zip(auto.rows(), every.rows()):
        assert_same_step(a, e)
    assert [r["feature_maps_from"] for r in auto.rows()] == [1, 2, 3, 3, 3]


def test_a_steady_loop_with_residual_sums_reuses_its_measured_step():
    # A transformer's residual connections sum gradients in backward. A measured backward's
    # node hooks hold each gradient while they read it, so torch allocates those sums anew
    # instead of in place: its allocation and free counts differ from an unmeasured one's.
    # The steady steps must still be recognised and take the third step's figures.
    from memlab_rs.models import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(vocab=100, dim=32, layers=2, heads=4, context=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 100, (2, 16))
    with memlab_rs.memory_profiler(model, optimizer=opt, file=io.StringIO()) as mon:
        for _ in range(6):
            model(ids).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.record_stats()
    rows = mon.rows()
    assert [r["feature_maps_from"] for r in rows] == [1, 2, 3, 3, 3, 3]
    assert all(r["feature_maps"] == rows[2]["feature_maps"] > 0 for r in rows[3:])
    assert all(r["intermediate_gradients"] == rows[2]["intermediate_gradients"] for r in rows[3:])
