"""The convolutions' workspaces, measured on the device (``estimation._kernel_probe``).

On the CPU the estimate of a conv net is checked against real steps read from the CPU
source, to the byte: oneDNN's scratch is what the fake step could not see before."""

from __future__ import annotations

import io
import json

import pytest
import torch
from cpu_step_rises import cpu_step_rises
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn

from memlab_rs import estimate, max_batch_size, plan
from memlab_rs._sources import cpu_source as _cpu_source
from memlab_rs.estimation import _kernel_probe

needs_cpu_hook = pytest.mark.skipif(
    _cpu_source.library() is None, reason="this torch has no libc10.so (the fallback is used)"
)
SGD = {"lr": 0.1, "momentum": 0.9}


def _conv_net(channels: int, layers: int, kernel: int, groups: int) -> nn.Sequential:
    mods: list[nn.Module] = [nn.Conv2d(3, channels, 3, padding=1)]
    for i in range(layers):
        mods += [
            nn.ReLU(),
            nn.Conv2d(channels, channels, kernel, padding=kernel // 2, groups=groups,
                      stride=1 + i % 2),
        ]  # fmt: skip
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)]
    return nn.Sequential(*mods)


def _real_and_estimated(model, x, memory_format=torch.contiguous_format, **kwargs):
    model = model.to(memory_format=memory_format)
    x = x.to(memory_format=memory_format)
    est = estimate(model, x, optimizer=torch.optim.SGD, optimizer_kwargs=SGD, device="cpu",
                   **kwargs)  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), **SGD)

    def step() -> None:  # as the estimate's: the output and the loss live to its end
        out = model(x)
        loss = out.sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    real = cpu_step_rises(step, 2)
    starts = {1: est.phase_ends["setup"], 2: est.phase_ends["optimizer 1"]}
    return {n: peak - starts[n] for n, peak in est.step_peaks.items()}, real, est


@pytest.fixture
def one_worker():
    """One worker for every example (as a plan holds it), not a torch import per example."""
    with _kernel_probe.held_open():
        yield


@needs_cpu_hook
@pytest.mark.usefixtures("one_worker")
@settings(
    max_examples=8,
    deadline=None,
    # The worker held across examples is meant to be shared: it keeps no state between them.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    channels=st.sampled_from([4, 8, 16, 24]),
    layers=st.integers(1, 3),
    kernel=st.sampled_from([1, 3, 5]),
    grouped=st.booleans(),
    batch=st.integers(1, 4),
    side=st.integers(6, 24),
    bf16=st.booleans(),
    channels_last=st.booleans(),
)
@example(channels=16, layers=3, kernel=3, grouped=False, batch=4, side=24, bf16=False,
         channels_last=False)  # fmt: skip
def test_random_conv_nets_match_real_cpu_steps_to_the_byte(
    channels, layers, kernel, grouped, batch, side, bf16, channels_last
):
    dtype = torch.bfloat16 if bf16 else torch.float32
    torch.manual_seed(0)
    model = _conv_net(channels, layers, kernel, 4 if grouped else 1).to(dtype)
    x = torch.randn(batch, 3, side, side, dtype=dtype)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    ours, real, est = _real_and_estimated(model, x, fmt)
    assert ours == real
    assert any("oneDNN scratch measured on this CPU" in n for n in est.notes), est.notes


@needs_cpu_hook
def test_without_measuring_the_scratch_is_missing_and_the_note_says_so():
    torch.manual_seed(0)
    model, x = _conv_net(16, 3, 3, 1), torch.randn(4, 3, 24, 24)
    measured, real, _ = _real_and_estimated(model, x)
    blind, _, est = _real_and_estimated(model, x, measure_kernels=False)
    assert measured == real
    assert all(blind[n] < real[n] for n in real)  # oneDNN's scratch is not in it
    assert "convolutions' oneDNN scratch not counted (measure_kernels=False)" in est.notes


def test_a_cuda_estimate_without_a_gpu_says_the_workspaces_are_not_counted():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/gpu measures its workspaces")
    est = estimate(_conv_net(8, 1, 3, 1), torch.zeros(2, 3, 8, 8), device="cuda")
    assert "convolutions' cuDNN workspaces not counted (no GPU here)" in est.notes


def test_a_model_without_convolutions_starts_no_worker_and_says_nothing_of_them():
    est = estimate(nn.Linear(8, 8), torch.zeros(2, 8), device="cpu")
    assert not _kernel_probe._workers
    assert not any("convolution" in n for n in est.notes)


def test_the_worker_lives_for_one_estimate_or_for_a_whole_plan():
    model, x = _conv_net(8, 1, 3, 1), torch.zeros(2, 3, 8, 8)
    estimate(model, x, device="cpu")
    assert not _kernel_probe._workers  # gone with its estimate
    seen = []
    with _kernel_probe.held_open():
        for side in (9, 11):  # shapes not measured yet: the worker is asked
            estimate(model, torch.zeros(2, 3, side, side), device="cpu")
            seen.append([w.proc.pid for w in _kernel_probe._workers.values()])
    assert seen[0] == seen[1] and len(seen[0]) == 1  # one worker for both
    assert not _kernel_probe._workers


@needs_cpu_hook
def test_the_size_plan_and_max_batch_size_find_fits_real_steps_and_one_more_does_not():
    """With the scratch measured, the search's answer for a conv net holds on real steps
    (without it, oneDNN's scratch would make the answer's real step overflow)."""
    torch.manual_seed(0)
    model = _conv_net(16, 2, 3, 1)
    budget = 3_000_000

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, 3, 20, 20)

    p = plan(model, inputs, 2, budget, device="cpu", optimizer=torch.optim.SGD,
             optimizer_kwargs=SGD, sizes=[], precisions=[], optimizers={},
             try_checkpointing=False)  # fmt: skip
    assert p.text().count("convolutions' oneDNN scratch measured on this CPU") == 1
    n = p.baseline["largest_size"]
    assert n == max_batch_size(model, inputs, budget, device="cpu", optimizer=torch.optim.SGD,
                               optimizer_kwargs=SGD)  # fmt: skip
    assert not _kernel_probe._workers  # each closed its worker
    opt = torch.optim.SGD(model.parameters(), **SGD)
    held = sum(t.nbytes for t in model.parameters())

    def real_peak(batch: int) -> int:
        x = inputs(batch)

        def step() -> None:
            out = model(x)
            loss = out.sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return held + x.nbytes + max(cpu_step_rises(step, 2).values())

    assert 0 < n and real_peak(n) <= budget < real_peak(n + 1)


def test_a_convolution_the_device_refuses_is_reported_not_raised():
    probe = _kernel_probe.KernelProbe(torch.device("cpu"))
    x, w = torch.zeros(1, 3, 8, 8), torch.zeros(4, 5, 3, 3)  # 5 input channels, not 3
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    try:
        assert probe.events("aten.convolution.default", args, {}) is None
    finally:
        probe.close()
    assert "aten.convolution.default" in probe.failures
    assert probe.failures["aten.convolution.default"].startswith("RuntimeError")
    note = probe.describe()[-1]
    assert note.startswith("aten.convolution.default: its oneDNN scratch not counted (")
    again = _kernel_probe.KernelProbe(torch.device("cpu"))  # the next estimate's probe
    assert again.events("aten.convolution.default", args, {}) is None  # not asked again ...
    assert again.describe()[-1] == note  # ... and it still says why
    assert not _kernel_probe._workers


def test_the_worker_answers_each_request_and_a_bad_one_with_its_error():
    request = json.dumps(
        ["aten.convolution.default",
         [{"t": [[1, 3, 8, 8], [192, 64, 8, 1], "float32"]},
          {"t": [[4, 3, 3, 3], [27, 9, 3, 1], "float32"]},
          None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1],
         {}]
    )  # fmt: skip
    lines = [json.dumps(_kernel_probe.settings(torch.device("cpu"))), request, "not json"]
    out = io.StringIO()
    if _cpu_source.library() is None:
        pytest.skip("this torch has no libc10.so: the worker has no allocator to read")
    try:
        _kernel_probe._serve(lines, lambda answer: out.write(json.dumps(answer) + "\n"))
    finally:
        from memlab_rs import _core

        _core._cpu_stop()  # the worker's meter started the CPU source in this process
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answers[0] == {"ready": True}
    # The output (1 x 4 x 6 x 6 floats) stays allocated; any scratch is freed inside.
    for events in (answers[1]["first"], answers[1]["later"]):
        assert [size for kind, size in events if kind == "o"] == [4 * 36 * 4]
        opened = {i for i, (kind, _) in enumerate(events) if kind == "a"}
        assert opened == {i for kind, i in events if kind == "f"}
    assert answers[2]["error"].startswith("JSONDecodeError")


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_measure_kernels_must_be_a_bool(value):
    with pytest.raises(TypeError, match="measure_kernels must be True or False"):
        estimate(nn.Linear(2, 2), torch.zeros(1, 2), device="cpu", measure_kernels=value)


def test_an_interrupt_while_the_worker_computes_leaves_no_answer_for_the_next_request():
    """Ctrl-C between a request and its answer: the worker is stopped, so its late answer
    cannot be read as the next request's; the next estimate starts a new one."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    probe = _kernel_probe.KernelProbe(torch.device("cpu"))
    big = (torch.zeros(32, 64, 128, 128), torch.zeros(64, 64, 3, 3), None, [1, 1], [1, 1],
           [1, 1], False, [0, 0], 1)  # fmt: skip
    small = (torch.zeros(1, 3, 8, 8), torch.zeros(4, 3, 3, 3), None, [1, 1], [0, 0], [1, 1],
             False, [0, 0], 1)  # fmt: skip
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with _kernel_probe.held_open():
            assert probe.events("aten.convolution.default", small, {}) is not None
            (worker,) = _kernel_probe._workers.values()
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(KeyboardInterrupt):
                probe.events("aten.convolution.default", big, {})
            signal.setitimer(signal.ITIMER_REAL, 0)
            assert not worker.alive()
            other = (torch.zeros(1, 3, 9, 9), *small[1:])
            events = probe.events("aten.convolution.default", other, {})
            assert events is not None and [s for k, s in events if k == "o"] == [4 * 49 * 4]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        probe.close()
    assert not _kernel_probe._workers
