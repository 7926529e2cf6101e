"""LineProfiler as a drop-in for pytorch_memlab's: the calls its users make, the objects
they pass, the errors they get for what cannot work, and what it keeps alive."""

from __future__ import annotations

import functools
import gc
import weakref

import pytest
import torch

import memlab_rs
from memlab_rs import LineProfiler
from memlab_rs.line_profiler import columns as line_columns

MiB = 1 << 20


def allocate(n):
    a = torch.empty(n, 1024)
    return a


class WithProperty:
    @property
    def size(self):
        return 1


def test_columns_none_shows_every_column_the_source_has():
    lp = LineProfiler(allocate, device="cpu")
    with lp:
        allocate(256)
    shown = lp.display(columns=None)
    assert shown.columns == list(line_columns.catalogue("cpu"))
    assert shown.columns == lp._collector.column_names()
    row = next(r for r in shown.records() if r["code"].strip() == "a = torch.empty(n, 1024)")
    assert row["allocated_bytes.all.allocated"] == MiB and row["allocation.all.allocated"] == 1
    assert "segment" in str(shown)  # the text shows them all
    assert str(lp.display(columns=None)) == str(shown)


def test_the_cpu_catalogue_is_what_the_cpu_source_has():
    # The catalogue checked before anything runs is the names the CPU source reports.
    with LineProfiler(allocate, device="cpu") as lp:
        allocate(1)
    assert tuple(lp._collector.column_names()) == line_columns.catalogue("cpu")


def test_properties_partials_and_builtins_warn_as_pytorch_memlab_and_are_skipped():
    partial = functools.partial(allocate, 256)
    for thing in (WithProperty.size, partial, len):
        with pytest.warns(UserWarning, match="Could not extract a code object for the object"):
            lp = LineProfiler(thing, allocate, device="cpu")
        with lp:
            allocate(256)  # the other function is still profiled
        assert [r["function"] for r in lp.display().records()][0] == "allocate"
    with pytest.warns(UserWarning, match=r"partial\.func"):
        LineProfiler(device="cpu").add_function(partial)
    with pytest.warns(UserWarning, match=r"fget"):
        LineProfiler(device="cpu").add_function(WithProperty.size)
    # and pytorch_memlab really does warn the same way (its message starts ours)
    pytorch_memlab = pytest.importorskip("pytorch_memlab")
    with pytest.warns(UserWarning, match="Could not extract a code object for the object"):
        pytorch_memlab.LineProfiler(WithProperty.size)
    # the fget itself has code and is profiled
    lp = LineProfiler(WithProperty.size.fget, device="cpu")
    with lp:
        assert WithProperty().size == 1
    assert lp.display().records()[0]["function"] == "WithProperty.size"


def test_enabled_is_settable():
    lp = LineProfiler(allocate, device="cpu")
    lp.enabled = True
    assert lp.enabled
    allocate(256)
    lp.enabled = False
    assert not lp.enabled
    allocate(512)  # not profiled
    rows = lp.display(columns=["allocated_bytes.all.allocated"]).records()
    row = next(r for r in rows if r["code"].strip() == "a = torch.empty(n, 1024)")
    assert row["hits"] == 1 and row["allocated_bytes.all.allocated"] == MiB
    lp.enabled = 1  # truthy
    assert lp.enabled
    lp.enabled = None
    assert not lp.enabled


def test_a_profiled_closure_does_not_keep_what_it_captured():
    def make():
        captured = torch.zeros(1 << 16)

        def closure():
            b = captured + 1
            return b

        return closure, weakref.ref(captured)

    closure, watch = make()
    lp = LineProfiler(closure, device="cpu")
    with lp:
        closure()
    assert watch() is not None
    del closure
    gc.collect()
    assert watch() is None  # the profiler holds the code object, not the function
    # the report still has the source, read from the code object
    codes = [r["code"].strip() for r in lp.display().records()]
    assert codes[:2] == ["def closure():", "b = captured + 1"]


def test_target_gpu_that_does_not_exist_is_an_error():
    with pytest.raises(ValueError, match="target_gpu=99"):
        LineProfiler(target_gpu=99)
    with pytest.raises(ValueError, match="target_gpu=99"):
        LineProfiler(device="cpu").target_gpu = 99
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available on this machine"):
            LineProfiler(target_gpu=1)
        with pytest.raises(ValueError, match="only CPU memory can be profiled"):
            LineProfiler(target_gpu="cuda:1")
        lp = LineProfiler(target_gpu=0)  # the default still works: it profiles the CPU
        assert lp.device == "cpu" and lp.target_gpu == 0
    np = pytest.importorskip("numpy")
    assert LineProfiler(target_gpu=np.int64(0), device="cpu").target_gpu == 0
    with pytest.raises(TypeError, match="target_gpu must be a GPU index"):
        LineProfiler(target_gpu=1.5)
    with pytest.raises(ValueError, match="target_gpu='gpu0' is not a device"):
        LineProfiler(target_gpu="gpu0")


def test_a_wrong_device_names_the_parameter():
    with pytest.raises(TypeError, match=r"device must be a torch.device.*got 1.5"):
        LineProfiler(device=1.5)
    with pytest.raises(ValueError, match="device='gpu' is not a device"):
        LineProfiler(device="gpu")
    with pytest.raises(ValueError, match="device=-1: a CUDA device index is 0 or more"):
        LineProfiler(device=-1)
    with pytest.raises(TypeError, match="device must be"):
        LineProfiler(device=True)


def test_columns_are_checked_with_a_clear_message():
    lp = LineProfiler(allocate, device="cpu")
    with lp:
        allocate(1)
    with pytest.raises(ValueError, match=r"did you mean 'active_bytes.all.peak'"):
        lp.display(columns=["active_byte.all.peak"])
    with pytest.raises(ValueError, match="CUDA statistic that the CPU source does not have"):
        lp.display(columns=["num_ooms"])
    with pytest.raises(TypeError, match="columns must be a list of column names"):
        lp.display(columns=5)
    with pytest.raises(TypeError, match="columns must be names"):
        lp.display(columns=[b"active_bytes.all.peak"])
    # before anything ran, the catalogue is used: typos are caught as early
    fresh = LineProfiler(allocate, device="cpu")
    with pytest.raises(ValueError, match="unknown column 'bogus.all.peak'"):
        fresh.display(columns=["bogus.all.peak"])
    assert line_columns.check_columns(("reserved_bytes.large_pool.peak",), "cuda:0")


def test_signatures_match_pytorch_memlab():
    """Every parameter of pytorch_memlab's public calls exists here, same name, same kind,
    same position; ours may add parameters after them."""
    import inspect

    pytorch_memlab = pytest.importorskip("pytorch_memlab")
    from pytorch_memlab.line_profiler.line_profiler import DEFAULT_COLUMNS as THEIR_DEFAULT_COLUMNS

    pairs = [
        (pytorch_memlab.LineProfiler.__init__, LineProfiler.__init__),
        (pytorch_memlab.LineProfiler.add_function, LineProfiler.add_function),
        (pytorch_memlab.LineProfiler.display, LineProfiler.display),
        (pytorch_memlab.LineProfiler.print_stats, LineProfiler.print_stats),
        (pytorch_memlab.LineProfiler.enable, LineProfiler.enable),
        (pytorch_memlab.LineProfiler.disable, LineProfiler.disable),
        (pytorch_memlab.LineProfiler.clear, LineProfiler.clear),
        (pytorch_memlab.profile, memlab_rs.profile),
        (pytorch_memlab.profile_every, memlab_rs.profile_every),
        (pytorch_memlab.set_target_gpu, memlab_rs.set_target_gpu),
        (pytorch_memlab.clear_global_line_profiler, memlab_rs.clear_global_line_profiler),
        (pytorch_memlab.MemReporter.__init__, memlab_rs.MemReporter.__init__),
        (pytorch_memlab.MemReporter.report, memlab_rs.MemReporter.report),
        (pytorch_memlab.MemReporter.add_optimizer, memlab_rs.MemReporter.add_optimizer),
        (pytorch_memlab.MemReporter.collect_tensor, memlab_rs.MemReporter.collect_tensor),
        (pytorch_memlab.MemReporter.get_stats, memlab_rs.MemReporter.get_stats),
        (pytorch_memlab.MemReporter.print_stats, memlab_rs.MemReporter.print_stats),
        (pytorch_memlab.Courtesy.yield_memory, memlab_rs.Courtesy.yield_memory),
        (pytorch_memlab.Courtesy.restore, memlab_rs.Courtesy.restore),
    ]
    for theirs, ours in pairs:
        their_params = list(inspect.signature(theirs).parameters.values())
        our_params = list(inspect.signature(ours).parameters.values())
        assert len(our_params) >= len(their_params), theirs
        for t, o in zip(their_params, our_params):
            assert (t.name, t.kind) == (o.name, o.kind), (theirs.__qualname__, t, o)
            # stream: theirs binds sys.stdout at import; ours (None) writes to the current one
            if t.default is not inspect.Parameter.empty and t.name != "stream":
                assert o.default == t.default or (t.default, o.default) == (
                    THEIR_DEFAULT_COLUMNS,
                    memlab_rs.DEFAULT_COLUMNS,
                ), (theirs.__qualname__, t, o)
    assert memlab_rs.DEFAULT_COLUMNS == THEIR_DEFAULT_COLUMNS
    # pytorch_memlab's device_tensor_stat attribute exists too
    assert isinstance(memlab_rs.MemReporter().device_tensor_stat, dict)


def test_column_docstring_examples():
    import doctest

    failures, tried = doctest.testmod(line_columns, optionflags=doctest.ELLIPSIS)
    assert tried >= 3 and failures == 0


def test_pytorch_memlab_line_profiler_path_gives_the_same_objects():
    """``import memlab_rs as pytorch_memlab`` with ``sys.modules["pytorch_memlab"]`` set, as
    code written for pytorch_memlab does: ``pytorch_memlab.line_profiler.LineProfiler``,
    ``.profile``, ``.profile_every`` and ``.set_target_gpu`` are memlab_rs's own objects,
    also when the submodule is imported under the alias (its package runs again under that
    name and must hand out the same objects, not copies)."""
    import importlib
    import inspect
    import sys

    import memlab_rs as pytorch_memlab

    names = ("LineProfiler", "profile", "profile_every", "set_target_gpu")
    room = pytorch_memlab.line_profiler
    for name in names:
        assert getattr(room, name) is getattr(memlab_rs, name), name
    assert inspect.isfunction(memlab_rs.profile)  # no module of the room is named profile
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "pytorch_memlab"}
    for key in saved:
        del sys.modules[key]
    sys.modules["pytorch_memlab"] = pytorch_memlab
    try:
        aliased = importlib.import_module("pytorch_memlab.line_profiler")
        assert aliased.__name__ == "pytorch_memlab.line_profiler"
        for name in names:
            assert getattr(aliased, name) is getattr(memlab_rs, name), name
        from pytorch_memlab.line_profiler import profile

        assert profile is memlab_rs.profile
    finally:
        for key in [k for k in sys.modules if k.split(".")[0] == "pytorch_memlab"]:
            del sys.modules[key]
        sys.modules.update(saved)
        memlab_rs.line_profiler = room  # the import bound the alias's module there
