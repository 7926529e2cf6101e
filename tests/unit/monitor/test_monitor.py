"""The training monitor (memory_profiler) on CPU: exact bytes on a tiny model whose figures
are computed by hand, categories summing to the CPU source's peak, the original's CSV,
gradient accumulation, iterations without backward, checkpointing, clean stop, threads and
bad arguments. The original's block, line for line against a golden file in a fresh
interpreter, is in tests/integration/test_monitor_processes.py."""

from __future__ import annotations

import io
import os
import re
import threading
import time
from pathlib import Path

import pytest
import torch
from signal_alarms import alarms_into, spread
from torch.utils.checkpoint import checkpoint

import memlab_rs
from memlab_rs import _core, _module_hooks
from memlab_rs._categories import CATEGORIES

# Linear(1000, 500) -> ReLU -> Linear(500, 10), float32:
PARAMS = 1000 * 500 * 4 + 500 * 4 + 500 * 10 * 4 + 10 * 4  # 2_022_040
# Saved for backward with a batch of 8: the input of the first Linear (8x1000, needed for
# its weight gradient), ReLU's output (8x500), which the second Linear saves again (the same
# storage, counted once). The weights addmm saves are parameters: excluded.
FEATURE_MAPS = 8 * 1000 * 4 + 8 * 500 * 4  # 48_000
# Adam: exp_avg and exp_avg_sq per parameter, and a 4-byte float32 step per parameter.
ADAM_STATE = 2 * PARAMS + 4 * 4


def tiny() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1000, 500), torch.nn.ReLU(), torch.nn.Linear(500, 10)
    )


def step(model, optimizer=None, backwards=1):
    for _ in range(backwards):
        model(torch.randn(8, 1000)).sum().backward()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad()


def assert_sums(row):
    values = [row[c] for c in CATEGORIES]
    assert all(v >= 0 for v in values), row
    assert sum(values) == row["peak_allocated"], row


def test_exact_bytes_of_a_known_model():
    model = tiny()
    opt = torch.optim.Adam(model.parameters())
    with memlab_rs.memory_profiler(model, optimizer=opt, file=io.StringIO()) as mon:
        for _ in range(3):
            step(model, opt)
            mon.record_stats()
    rows = mon.rows()
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["feature_maps"] == FEATURE_MAPS
        assert r["weight_usage"] == PARAMS
        assert r["weight_gradient_usage"] == PARAMS
        assert r["optimizer_state_usage"] == ADAM_STATE
        assert r["parameter"] == PARAMS
        assert r["backward_passes"] == 1
        assert_sums(r)
    # The first step creates Adam's state inside the optimizer window: counted as state.
    assert rows[0]["peak_window"] == "optimizer"
    assert rows[0]["optimizer_state"] == ADAM_STATE
    assert rows[0]["gradient"] == PARAMS


class _Rebinding(torch.optim.Optimizer):
    """Keeps one state tensor per parameter and replaces it at every step with a new one
    of another size (as optimizers that update out of place, LBFGS's, rebind theirs)."""

    def __init__(self, params):
        super().__init__(params, {})
        self.steps = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.steps += 1
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["buf"] = torch.zeros(1000 * (1 + self.steps % 7))
        return None


def test_state_tensors_replaced_between_records_are_read_again():
    """Two optimizer steps between records, the state rebound at each: each record reads
    the state alive then. Ids alone could not tell: the tensor the second step makes
    often gets the address, and so the id, of the one the first step freed (the one the
    last record saw)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1000, 10, bias=False)
    opt = _Rebinding(model.parameters())
    expected = []
    with memlab_rs.memory_profiler(model, optimizer=opt, file=io.StringIO()) as mon:
        step(model, opt)
        mon.record_stats()
        expected.append(1000 * (1 + opt.steps % 7) * 4)
        for _ in range(12):
            opt.step()
            opt.step()
            mon.record_stats()
            expected.append(1000 * (1 + opt.steps % 7) * 4)
    assert [r["optimizer_state_usage"] for r in mon.rows()] == expected


def test_peak_in_forward_has_the_activations():
    model = tiny()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        out = model(torch.randn(8, 1000))
        mon.record_stats()  # no backward: the end of forward is the record
        del out
    (r,) = mon.rows()
    assert r["backward_passes"] == 0
    assert r["peak_window"] == "forward"
    assert r["feature_maps"] == FEATURE_MAPS
    assert r["activation"] == FEATURE_MAPS
    assert r["gradient"] == 0
    assert r["intermediate_gradients"] == 0
    assert_sums(r)


def test_peak_allocated_is_the_cpu_sources_peak():
    model = tiny()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        _core._cpu_start()
        try:
            dict(_core._cpu_stats())  # the monitor resets the peak at each boundary
            step(model)
            mon.record_stats()
        finally:
            _core._cpu_stop()
    (r,) = mon.rows()
    assert_sums(r)
    assert r["peak_allocated"] <= r["peak_cached"]  # CPU: cached = the CPU source's bytes


def test_gradient_accumulation_has_one_window_per_backward():
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memlab_rs.memory_profiler(model, optimizer=opt, file=io.StringIO()) as mon:
        step(model, opt, backwards=3)
        mon.record_stats()
    (r,) = mon.rows()
    assert r["backward_passes"] == 3
    assert r["feature_maps"] == FEATURE_MAPS  # at the first backward start
    assert r["weight_gradient_usage"] == PARAMS
    assert r["optimizer_state_usage"] == 0  # plain SGD keeps no state
    assert_sums(r)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing(reentrant):
    model = tiny()
    x = torch.randn(8, 1000, requires_grad=True)
    model(x).sum().backward()
    expected = model[0].weight.grad.clone()
    model.zero_grad()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        checkpoint(model, x, use_reentrant=reentrant).sum().backward()
        mon.record_stats()
    torch.testing.assert_close(model[0].weight.grad, expected)
    (r,) = mon.rows()
    # Inside the checkpointed region nothing is held (non-reentrant checkpointing pushes its
    # own hooks, reentrant runs forward without grad): only the checkpoint's input x, which
    # it saves through our hooks in both modes, is a feature map (48_000 without it).
    assert r["feature_maps"] == 8 * 1000 * 4
    assert r["backward_passes"] == 1
    assert_sums(r)


def test_outer_hook_pair_is_chained_and_restored():
    model = tiny()
    with torch.autograd.graph.save_on_cpu():
        outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
        mon = memlab_rs.memory_profiler(model, file=io.StringIO())
        step(model)
        mon.record_stats()
        mon.stop()
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) == outer
    (r,) = mon.rows()
    # save_on_cpu's pack returns (device, copy): no tensor of ours is held.
    assert r["feature_maps"] == 0
    assert "chained" in r["notice"]
    assert model[0].weight.grad is not None


def test_a_saved_leaf_counts_while_the_graph_holds_it():
    # Pack holds a leaf (here the input) as is, not detached; it must still count only
    # while autograd holds it, not while the caller does.
    model = torch.nn.Linear(1000, 500)
    x = torch.randn(8, 1000)
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        loss = model(x).sum()
        assert len(mon._hooks) == 1  # the input (x needs no gradient: the weight is not saved)
        loss.backward()
        assert len(mon._hooks) == 0  # released by backward, though x is alive
        mon.record_stats()
    row = mon.rows()[0]
    assert row["feature_maps"] == 8 * 1000 * 4  # x
    assert_sums(row)


def test_stop_removes_everything():
    model = tiny()
    before = _core._cpu_mode()
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    mon = memlab_rs.memory_profiler(model, verbose=True, file=io.StringIO())
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
    assert _core._cpu_mode() is not None
    step(model)
    mon.record_stats()
    mon.stop()
    mon.stop()
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert not _module_hooks.installed()  # torch.nn.Module.__getstate__ is torch's again
    assert _core._cpu_mode() == before
    with pytest.raises(RuntimeError, match="stopped"):
        mon.record_stats()
    assert len(mon.rows()) == 1  # the records stay


def test_verbose_feature_maps_per_module():
    model = tiny()
    out = io.StringIO()
    with memlab_rs.memory_profiler(model, verbose=True, file=out) as mon:
        step(model)
        mon.record_stats()
    text = out.getvalue()
    assert re.search(r"^  0\.+ +0 MB$|^  0\.+0 MB$", text, re.M)
    (details,) = mon.result().to_data()["details"]
    assert [tuple(m) for m in details["modules"]] == [("0", 8 * 1000 * 4), ("1", 8 * 500 * 4)]


def test_monitor_in_a_worker_thread():
    # Saved-tensor hooks are per thread: a monitor created on the training thread sees it.
    results = {}

    def train():
        model = tiny()
        with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
            step(model)
            mon.record_stats()
        results["row"] = mon.rows()[0]
        results["top"] = torch._C._autograd._top_saved_tensors_default_hooks(False)

    worker = threading.Thread(target=train)
    worker.start()
    worker.join()
    assert results["row"]["feature_maps"] == FEATURE_MAPS
    assert results["top"] is None
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_stop_from_another_thread_leaves_an_inert_hook():
    model = tiny()
    mon = memlab_rs.memory_profiler(model, file=io.StringIO())
    worker = threading.Thread(target=mon.stop)
    worker.start()
    worker.join()
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    try:
        assert top is not None and top[0] is mon._pack  # cannot pop another thread's stack
        step(model)  # still trains; nothing is recorded
        assert len(mon._hooks) == 0
    finally:
        torch._C._autograd._pop_saved_tensors_default_hooks()


def test_monitors_stopped_in_the_order_they_started_leave_nothing_pushed():
    model = tiny()
    first = memlab_rs.memory_profiler(model, file=io.StringIO())
    second = memlab_rs.memory_profiler(model, file=io.StringIO())
    first.stop()  # under the second's pair: left on, inert
    second.stop()  # pops its own pair, then the first's, now on top
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        step(model)
        mon.record_stats()
    # Had the first pair stayed, this monitor would have chained it and counted nothing.
    assert mon.rows()[0]["feature_maps"] == FEATURE_MAPS
    assert mon.rows()[0]["notice"] is None


def test_a_pair_left_by_a_stop_from_another_thread_goes_with_the_next_monitor():
    model = tiny()
    stopped = memlab_rs.memory_profiler(model, file=io.StringIO())
    worker = threading.Thread(target=stopped.stop)
    worker.start()
    worker.join()
    assert torch._C._autograd._top_saved_tensors_default_hooks(False)[0] is stopped._pack
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        step(model)
        mon.record_stats()
    assert mon.rows()[0]["feature_maps"] == FEATURE_MAPS
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_tied_weights_once_under_all_names():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(100, 50)
            self.head = torch.nn.Linear(50, 100, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, idx):
            return self.head(self.embed(idx))

    model = Tied()
    out = io.StringIO()
    with memlab_rs.memory_profiler(model, file=out) as mon:
        model(torch.tensor([[1, 2, 3]])).sum().backward()
        mon.record_stats()
    (r,) = mon.rows()
    assert r["weight_usage"] == r["parameter"] == 100 * 50 * 4
    assert r["weight_gradient_usage"] == 100 * 50 * 4
    assert "  embed.weight+head.weight......" in out.getvalue()


def test_csv_file(tmp_path):
    model = tiny()
    out = io.StringIO()
    with memlab_rs.memory_profiler(
        model, print_period=2, csv=True, csv_dir=tmp_path / "csv", file=out
    ) as mon:
        for _ in range(4):
            step(model)
            mon.record_stats()
    path = Path(mon.csv_path)
    assert re.fullmatch(r"\d{14}\.csv", path.name) and path.parent == tmp_path / "csv"
    assert out.getvalue().startswith(f"Logging data in {mon.csv_path}\n")
    lines = path.read_text().splitlines()
    assert lines[0] == (
        "epoch,iteration,peak_cached,current_cached,total_feature_map_usage,"
        "total_weight_usage,0.weight,0.bias,2.weight,2.bias,"
        "total_layer_weight_gradient_usage,0.weight_grad,0.bias_grad,2.weight_grad,"
        "2.bias_grad,intermediate_gradients"
    )
    assert len(lines) == 3  # iterations 2 and 4
    rows = mon.rows()
    for line, r in zip(lines[1:], (rows[1], rows[3])):
        cells = [int(c) for c in line.split(",")]
        assert cells[:2] == [1, r["iteration"]]
        assert cells[2] == round(r["peak_cached"] / 1e6)
        assert cells[5] == cells[6] == round(PARAMS / 1e6) == 2
        assert cells[-1] == round(r["intermediate_gradients"] / 1e6)


def test_epoch_end_restarts_iterations():
    model = tiny()
    out = io.StringIO()
    with memlab_rs.memory_profiler(model, print_period=2, file=out) as mon:
        for _ in range(2):
            for _ in range(2):
                step(model)
                mon.record_stats()
            mon.epoch_end()
    assert [(r["epoch"], r["iteration"], r["step"]) for r in mon.rows()] == [
        (1, 1, 1),
        (1, 2, 2),
        (2, 1, 3),
        (2, 2, 4),
    ]
    text = out.getvalue()
    assert "Memory Usage for Iteration 2 of Epoch 2" in text
    assert "Epoch 1 finished\n" in text and "Iteration 1 of" not in text
    assert mon.text(1).splitlines()[1] == "Memory Usage for Iteration 1 of Epoch 1"


def test_text_html_and_dataframe():
    model = tiny()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        with pytest.raises(ValueError, match="nothing recorded"):
            mon.text()
        step(model)
        mon.record_stats()
    assert mon.text().splitlines()[0] == "*" * 43
    with pytest.raises(ValueError, match="steps recorded are 1 to 1"):
        mon.text(5)
    html = mon._repr_html_()
    assert "<svg" in html and "<script" not in html and "src=" not in html
    assert f'<td class="num">{mon.rows()[0]["peak_allocated"]}</td>' in html
    pandas = pytest.importorskip("pandas")
    frame = mon.to_dataframe()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame["parameter"]) == [PARAMS]


def test_plot_png(tmp_path):
    pytest.importorskip("matplotlib")
    model = tiny()
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as mon:
        step(model)
        mon.record_stats()
    mon.plot_png(tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"model": "net"}, TypeError, "torch.nn.Module"),
        ({"print_period": 0}, ValueError, "print_period must be an integer >= 1"),
        ({"print_period": True}, ValueError, "print_period"),
        ({"csv": "yes"}, TypeError, "csv must be True or False"),
        ({"verbose": 1}, TypeError, "verbose must be True or False"),
        ({"optimizer": object()}, TypeError, "torch.optim.Optimizer"),
        ({"device": "meta"}, ValueError, "only 'cpu' and CUDA"),
        ({"device": 1.5}, TypeError, "device must be"),
        ({"file": 3}, TypeError, "write"),
        ({"csv_dir": 3}, TypeError, "csv_dir"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = {"model": tiny(), **kwargs}
    with pytest.raises(error, match=match):
        memlab_rs.memory_profiler(**args)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_device_without_a_gpu():
    with pytest.raises(ValueError, match="CUDA is not available"):
        memlab_rs.memory_profiler(tiny(), device="cuda:0")


def test_csv_default_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with memlab_rs.memory_profiler(tiny(), csv=True, file=io.StringIO()) as mon:
        pass
    assert os.path.dirname(mon.csv_path) == "memory_csv_data"
    assert (tmp_path / mon.csv_path).exists()


# --- a signal handler's exception during a boundary's reads reaches the caller ------------


class PythonTensor(torch.Tensor):
    """Every attribute read and method call goes through torch.Tensor.__torch_function__,
    Python code: a signal handler can run inside the monitor's read itself."""


def _under_alarms(call):
    start = time.perf_counter()
    call()
    return alarms_into(call, spread(time.perf_counter() - start, 12))


def test_a_timeout_raised_while_reading_gradients_reaches_the_caller():
    params = []
    for _ in range(2_000):
        p = torch.ones(4).as_subclass(PythonTensor).requires_grad_()
        p.grad = torch.ones(4)
        params.append(p)
    tensors = _core.monitor.Tensors(-1)
    tensors.set_model([(p, i) for i, p in enumerate(params)], len(params), set(), set())
    assert tensors.gradients()[1] == [16] * len(params)
    raised, seen = _under_alarms(tensors.gradients)
    assert raised > 0 and seen == raised


def test_a_timeout_raised_while_reading_saved_tensors_reaches_the_caller():
    hooks = _core.monitor.SavedTensorHooks(torch.Tensor)
    saved = [torch.ones(4).as_subclass(PythonTensor) for _ in range(2_000)]
    held = [hooks.pack(t) for t in saved]
    tensors = _core.monitor.Tensors(-1)
    assert tensors.activations(hooks) == 16 * len(saved)
    raised, seen = _under_alarms(lambda: tensors.activations(hooks))
    assert raised > 0 and seen == raised
    del held
