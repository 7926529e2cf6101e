"""Nothing of ours changes what a user can do with their model while a tool is on: with each
tool attached (and with all of them at once), and after each is detached,
``copy.deepcopy``, ``pickle``, ``torch.save``/``torch.load`` (``weights_only`` both ways),
``state_dict``/``load_state_dict`` and ``torch.compile`` work exactly as on a model no tool
has seen. What the user gets back (a copy, a loaded model, a file) is theirs alone: it holds
nothing of memlab_rs (a file loads where memlab_rs is not installed, and under
``weights_only=True`` with only the user's classes allowed), and running a copy reaches no
tool of ours. And each tool still works on the original afterwards."""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import io
import pickle
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import memlab_rs
from memlab_rs import _module_hooks, trace

# the module (memlab_rs.profile is the function), imported here: the lazy front imports it
# only when a name of it is first used
PROFILE_MODULE = importlib.import_module("memlab_rs.line_profiler.global_profiler")


class Net(nn.Module):
    """An embedding tied to the output layer, a Linear/ReLU/BatchNorm body (a buffer) and
    a keyword argument: the parts of a model that copying and saving must keep."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.BatchNorm1d(16), nn.Linear(16, 8))
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.head(self.body(self.embed(ids).mean(1)) * scale)


# What torch.load(weights_only=True) needs to rebuild a whole Net: the user's classes only.
USER_CLASSES = [Net, nn.Embedding, nn.Sequential, nn.Linear, nn.ReLU, nn.BatchNorm1d]


def ids() -> torch.Tensor:
    """The model's input (made per call: a tensor alive at import would sit in the CPU
    figures of every later test in the session)."""
    return torch.arange(24).remainder(16).reshape(6, 4)


def make() -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Net()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(ids(), scale=0.5).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def evaluate(model: nn.Module) -> torch.Tensor:
    """The model's output in eval mode (its training flag put back)."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(ids(), scale=0.5)
    finally:
        model.train(training)


# ----- the tools, attached ----------------------------------------------------------------
# Each attaches its tool to the model, trains a step with it on, yields a check that the
# tool still works (run after the user's operations, while attached), and detaches.

Attach = Callable[[Net, torch.optim.Optimizer, Any], contextlib.AbstractContextManager]


@contextlib.contextmanager
def line_profiler(model, optimizer, tmp_path) -> Iterator[Callable[[], None]]:
    profiler = memlab_rs.LineProfiler(Net.forward, train_step, device="cpu")
    profiler.enable()
    try:
        train_step(model, optimizer)

        def works() -> None:
            train_step(model, optimizer)
            records = profiler.display(columns=["allocated_bytes.all.peak"]).records()
            assert any(r["code"].strip().startswith("return self.head") for r in records)

        yield works
    finally:
        profiler.disable()


@contextlib.contextmanager
def profile(model, optimizer, tmp_path) -> Iterator[Callable[[], None]]:
    before = (PROFILE_MODULE._global, PROFILE_MODULE._global_device)
    PROFILE_MODULE._global, PROFILE_MODULE._global_device = None, "cpu"
    try:
        memlab_rs.profile(Net.forward)
        train_step(model, optimizer)

        def works() -> None:
            train_step(model, optimizer)
            text = str(memlab_rs.global_line_profiler().display(Net.forward))
            assert "return self.head" in text

        yield works
    finally:
        memlab_rs.clear_global_line_profiler()
        if PROFILE_MODULE._global is not None:
            PROFILE_MODULE._global.disable()
        PROFILE_MODULE._global, PROFILE_MODULE._global_device = before


@contextlib.contextmanager
def reporter(model, optimizer, tmp_path) -> Iterator[Callable[[], None]]:
    train_step(model, optimizer)
    memlab_rs.MemReporter(model).collect(device=torch.device("cpu"))

    def works() -> None:
        report = memlab_rs.MemReporter(model).collect(device=torch.device("cpu"))
        rows = {row.name: row.bytes for row in report.rows}
        assert rows["embed.weight+head.weight"] == 16 * 8 * 4

    yield works


@contextlib.contextmanager
def courtesy(model, optimizer, tmp_path) -> Iterator[Callable[[], None]]:
    train_step(model, optimizer)
    tensors = list(model.parameters()) + list(model.buffers())
    kept = [t.detach().clone() for t in tensors]
    # CPU storages through the same steps as GPU ones (tests/test_courtesy.py).
    lender = memlab_rs.Courtesy(_allow_cpu=True, _only=tensors)
    report = lender.yield_memory()
    assert report.moved_storages > 0

    def works() -> None:
        assert lender.on_host == (report.moved_storages, report.moved_bytes)  # still yielded

    assert all(torch.equal(t, k) for t, k in zip(tensors, kept))
    try:
        yield works
    finally:
        kept = [t.detach().clone() for t in tensors]
        lender.restore()
        assert all(torch.equal(t, k) for t, k in zip(tensors, kept))


@contextlib.contextmanager
def tracer(model, optimizer, tmp_path) -> Iterator[Callable[[], None]]:
    recorder = trace.Tracer(device="cpu", tag_modules=True, model=model).start()
    try:
        train_step(model, optimizer)

        def works() -> None:
            train_step(model, optimizer)

        yield works
    finally:
        result = recorder.stop()
    assert result.max_mem("cpu") > 0


def _monitor(**options: Any) -> Attach:
    @contextlib.contextmanager
    def attach(model, optimizer, tmp_path) -> Iterator[Callable[[], None]]:
        out = io.StringIO()
        monitor = memlab_rs.memory_profiler(model, optimizer=optimizer, file=out, **options)
        try:
            for _ in range(3):
                train_step(model, optimizer)
                monitor.record_stats()

            def works() -> None:
                steps = len(monitor.rows())
                train_step(model, optimizer)
                monitor.record_stats()
                rows = monitor.rows()
                assert len(rows) == steps + 1
                assert rows[-1]["weight_usage"] == sum(
                    p.untyped_storage().nbytes() for p in model.parameters()
                )

            yield works
        finally:
            monitor.stop()

    return attach


@contextlib.contextmanager
def tracker(model, optimizer, tmp_path) -> Iterator[Callable[[], None]]:
    tensors = memlab_rs.MemTracker(path=f"{tmp_path}/", device="cpu", model=model)
    tensors.track()
    train_step(model, optimizer)
    tensors.track()

    def works() -> None:
        extra = torch.zeros(64, 64)
        assert [r.bytes for r in tensors.track().rows if r.shape == "(64, 64)"] == [64 * 64 * 4]
        del extra

    yield works


@contextlib.contextmanager
def estimate(model, optimizer, tmp_path) -> Iterator[Callable[[], None]]:
    train_step(model, optimizer)

    def works() -> None:
        found = memlab_rs.estimate(model, (ids(),), device="cpu")
        assert found.parameters == sum(p.numel() * 4 for p in model.parameters())

    works()
    yield works


TOOLS: dict[str, Attach] = {
    "LineProfiler": line_profiler,
    "profile": profile,
    "MemReporter": reporter,
    "Courtesy": courtesy,
    "Tracer": tracer,
    "monitor": _monitor(),
    "monitor-verbose": _monitor(verbose=True),
    "monitor-every": _monitor(feature_maps="every"),
    "MemTracker": tracker,
    "estimate": estimate,
}


@contextlib.contextmanager
def all_tools(model, optimizer, tmp_path) -> Iterator[Callable[[], None]]:
    """Every tool at once (Courtesy last: it re-points what the others look at)."""
    with contextlib.ExitStack() as stack:
        checks = [
            stack.enter_context(attach(model, optimizer, tmp_path))
            for name, attach in TOOLS.items()
            if name not in ("monitor-verbose", "monitor-every")  # one monitor at a time
        ]

        def works() -> None:
            for check in checks:
                check()

        yield works


TOOLS_AND_ALL = {**TOOLS, "all": all_tools}


# ----- what the user does with the model ---------------------------------------------------


def assert_same_model(other: nn.Module, model: Net, expected: torch.Tensor) -> None:
    """``other`` is an independent model equal to ``model``: the same state, the tie kept,
    the same output, and no tensor shared with ``model``."""
    assert isinstance(other, Net) and other is not model
    ours, theirs = model.state_dict(), other.state_dict()
    assert list(theirs) == list(ours)
    for key in ours:
        assert torch.equal(theirs[key], ours[key]), key
    assert other.head.weight is other.embed.weight
    assert other.embed.weight.data_ptr() != model.embed.weight.data_ptr()
    assert torch.equal(evaluate(other), expected)


def user_operations(model: Net, optimizer: torch.optim.Optimizer) -> None:
    """Everything a user does with a model, each checked against what it gives without us."""
    expected = evaluate(model)

    clone = copy.deepcopy(model)
    assert_same_model(clone, model, expected)
    train_step(clone, torch.optim.SGD(clone.parameters(), lr=0.1))  # the copy trains alone
    assert torch.equal(evaluate(model), expected)

    data = pickle.dumps(model)
    assert b"memlab_rs" not in data
    assert_same_model(pickle.loads(data), model, expected)

    saved = io.BytesIO()
    torch.save(model, saved)
    assert b"memlab_rs" not in saved.getvalue()
    saved.seek(0)
    assert_same_model(torch.load(saved, weights_only=False), model, expected)
    saved.seek(0)
    with torch.serialization.safe_globals(USER_CLASSES):
        assert_same_model(torch.load(saved, weights_only=True), model, expected)

    state = model.state_dict()
    assert list(state) == list(Net().state_dict())
    saved = io.BytesIO()
    torch.save({"model": state, "optimizer": optimizer.state_dict()}, saved)
    assert b"memlab_rs" not in saved.getvalue()
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)
    fresh = Net()
    assert fresh.load_state_dict(loaded["model"]) is not None
    assert_same_model(fresh, model, expected)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    fresh_opt.load_state_dict(loaded["optimizer"])
    model.load_state_dict(state)  # onto itself, strict
    assert torch.equal(evaluate(model), expected)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    try:
        model.eval()
        with torch.no_grad():
            assert torch.equal(compiled(ids(), scale=0.5), expected)
        model.train()
        compiled(ids(), scale=0.5).square().mean().backward()  # trains through the compiled model
        optimizer.zero_grad()
    finally:
        model.train()
        torch._dynamo.reset()


@pytest.mark.parametrize("tool", list(TOOLS_AND_ALL))
def test_user_operations_with_the_tool_attached(tool, tmp_path):
    model, optimizer = make()
    with TOOLS_AND_ALL[tool](model, optimizer, tmp_path) as still_works:
        user_operations(model, optimizer)
        still_works()


@pytest.mark.parametrize("tool", list(TOOLS_AND_ALL))
def test_user_operations_after_the_tool_is_detached(tool, tmp_path):
    model, optimizer = make()
    with TOOLS_AND_ALL[tool](model, optimizer, tmp_path):
        pass
    user_operations(model, optimizer)
    assert all(
        not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
        for m in model.modules()
    )


def test_user_operations_on_a_model_no_tool_has_seen():
    # The reference the other tests hold every tool to: these operations all work here.
    model, optimizer = make()
    train_step(model, optimizer)
    user_operations(model, optimizer)


def test_a_copy_of_a_monitored_model_is_not_monitored():
    model, optimizer = make()
    with memlab_rs.memory_profiler(model, file=io.StringIO(), verbose=True) as monitor:
        train_step(model, optimizer)
        monitor.record_stats()
        clone = copy.deepcopy(model)
        keys = list(monitor._keys)
        # The copy's forward is not the model's: the monitor notes no call and no module.
        clone(ids(), scale=0.5)
        assert monitor._keys == keys
        assert monitor._module_stack == []
        model(ids(), scale=0.5)
        assert len(monitor._keys) == len(keys) + 1


@pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="torch.compile's default backend (inductor) needs a C++ compiler on the CPU",
)
def test_default_compile_backend_with_every_tool_attached(tmp_path):
    # One compile, with the tools on, against the eager output with the tools on (a compile
    # without them as well only tested torch, and cost 10 s of the 21).
    model, optimizer = make()
    torch._dynamo.reset()
    with all_tools(model, optimizer, tmp_path):
        expected = evaluate(model)
        compiled = torch.compile(model)
        model.eval()
        try:
            with torch.no_grad():
                torch.testing.assert_close(compiled(ids(), scale=0.5), expected)
        finally:
            model.train()
            torch._dynamo.reset()


def test_module_getstate_is_ours_only_while_a_hook_of_ours_is_on():
    original = nn.Module.__getstate__
    model, _ = make()
    first = memlab_rs.memory_profiler(model, file=io.StringIO(), verbose=True)
    second = memlab_rs.memory_profiler(model, file=io.StringIO())
    assert _module_hooks.installed()
    first.stop()
    assert _module_hooks.installed()  # the second monitor's hook is still on
    second.stop()
    assert nn.Module.__getstate__ is original


def test_a_monitor_dropped_without_stop_gives_getstate_back_once_collected():
    original = nn.Module.__getstate__
    model, _ = make()
    memlab_rs.memory_profiler(model, file=io.StringIO())  # never stopped
    torch._C._autograd._pop_saved_tensors_default_hooks()  # its pair, as stop() would
    assert nn.Module.__getstate__ is not original
    del model  # the model and the monitor its hook holds: a cycle, collected together
    gc.collect()
    assert nn.Module.__getstate__ is original


def test_a_getstate_wrapped_after_ours_is_left_in_place():
    original = nn.Module.__getstate__
    model, _ = make()
    monitor = memlab_rs.memory_profiler(model, file=io.StringIO())
    ours = nn.Module.__getstate__

    def theirs(self):
        return ours(self)

    nn.Module.__getstate__ = theirs
    try:
        monitor.stop()
        assert nn.Module.__getstate__ is theirs  # ours stays under theirs, passing through
        assert b"memlab_rs" not in pickle.dumps(model)
    finally:
        nn.Module.__getstate__ = original


class OwnState(Net):
    """A model whose ``__getstate__`` skips Module's (so ours cannot leave our hooks out)."""

    def __getstate__(self):
        return dict(self.__dict__)


def test_a_getstate_that_skips_modules_gets_a_clear_error():
    torch.manual_seed(0)
    model = OwnState()
    pickle.dumps(model)  # fine without a tool
    with memlab_rs.memory_profiler(model, file=io.StringIO()):
        with pytest.raises(TypeError, match=r"super\(\).__getstate__\(\).*stop\(\)"):
            pickle.dumps(model)
    pickle.dumps(model)
