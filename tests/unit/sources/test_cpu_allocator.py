"""The CPU source at torch's allocator (src/sources/cpu): per-line numbers equal the
allocator's truth on every path a CPU storage can be made, memory alive before tracking is
adopted once, and nothing of ours stays installed after tracking ends.

The truth for a case with temporaries inside an operator is torch's own profiler, which
hears every CPU allocation and free of the calling thread from the same allocator.
"""

from __future__ import annotations

import ctypes
import gc
import io
import pickle
import threading
import warnings

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memlab_rs import LineProfiler, _core
from memlab_rs._sources import cpu_source as _cpu_source

MiB = 1 << 20
COLUMNS = (
    "active_bytes.all.peak",
    "active_bytes.all.current",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed",
    "allocation.all.allocated",
)
pytestmark = pytest.mark.skipif(
    _cpu_source.library() is None, reason="this torch has no libc10.so (the fallback is used)"
)


def profile(func, *args):
    """Run ``func`` under a CPU profiler; its records by line text."""
    with LineProfiler(func, device="cpu") as lp:
        assert lp.stats_reader == "allocator hook"
        func(*args)
    report = lp.display(columns=COLUMNS)
    assert report.notices == []
    return {r["code"].strip(): r for r in report.records() if r["hits"]}


def line(records, code):
    return records[code]


def rise(records, code, before):
    """How far the line's peak rose above the current value after the line ``before``."""
    return records[code]["active_bytes.all.peak"] - records[before]["active_bytes.all.current"]


def test_out_argument_of_mm_is_counted():
    def f(a, b):
        c = torch.mm(a, b, out=torch.empty(0))
        return c

    records = profile(f, torch.ones(256, 256), torch.ones(256, 1024))
    assert line(records, "c = torch.mm(a, b, out=torch.empty(0))")[COLUMNS[2]] == MiB


def test_resize_is_counted():
    def f():
        d = torch.empty(0).resize_(256, 1024)
        return d

    records = profile(f)
    entry = line(records, "d = torch.empty(0).resize_(256, 1024)")
    assert entry["allocated_bytes.all.allocated"] == MiB
    assert entry["allocation.all.allocated"] == 1


def test_cat_into_an_out_buffer_is_counted():
    def f(a, b):
        buf = torch.empty(0)
        torch.cat([a, b], out=buf)
        return buf

    records = profile(f, torch.ones(256, 1024), torch.ones(256, 1024))
    assert line(records, "torch.cat([a, b], out=buf)")["allocated_bytes.all.allocated"] == 2 * MiB


def test_pickle_round_trip_is_counted():
    def f(c):
        e = pickle.loads(pickle.dumps(c))
        return e

    records = profile(f, torch.ones(512, 1024))
    entry = line(records, "e = pickle.loads(pickle.dumps(c))")
    assert entry["allocated_bytes.all.allocated"] == 2 * MiB
    assert entry["active_bytes.all.current"] - entry["active_bytes.all.peak"] <= 0


def test_torch_load_is_counted():
    saved = io.BytesIO()
    torch.save(torch.ones(512, 1024), saved)

    def f(data):
        g = torch.load(io.BytesIO(data))
        return g

    records = profile(f, saved.getvalue())
    entry = line(records, "g = torch.load(io.BytesIO(data))")
    # The storage, plus the archive's small records (read through the same allocator).
    _, net, allocated = profiler_truth(torch.load, io.BytesIO(saved.getvalue()))
    assert net == 2 * MiB
    assert entry["allocated_bytes.all.allocated"] == allocated
    assert entry["allocated_bytes.all.allocated"] - entry["allocated_bytes.all.freed"] == net


def test_numpy_conversion_that_copies_is_counted_and_one_that_shares_is_not():
    def f(array):
        copied = torch.tensor(array)
        shared = torch.from_numpy(array)
        return copied, shared

    records = profile(f, np.ones((256, 1024), dtype=np.float32))
    assert line(records, "copied = torch.tensor(array)")[COLUMNS[2]] == MiB
    assert line(records, "shared = torch.from_numpy(array)")[COLUMNS[2]] == 0


def test_a_thread_the_profiled_function_starts_is_counted():
    kept = []

    def f():
        worker = threading.Thread(target=lambda: kept.append(torch.empty(2 * MiB)))
        worker.start(); worker.join()  # noqa: E702
        return kept

    records = profile(f)
    entry = line(records, "worker.start(); worker.join()  # noqa: E702")
    assert entry["allocated_bytes.all.allocated"] == 8 * MiB
    assert entry["active_bytes.all.current"] - records["worker = threading.Thread(target=lambda: "
                                                      "kept.append(torch.empty(2 * MiB)))"][
        "active_bytes.all.current"] == 8 * MiB


def profiler_truth(func, *args) -> tuple[int, int, int]:
    """(peak rise, net change, bytes allocated) of ``func`` as torch's profiler hears the
    CPU allocator on this thread (what ``func`` returns stays alive until the end)."""
    from torch._C._profiler import _EventType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        kept = func(*args)
    sizes: list[tuple[int, int]] = []

    def walk(nodes):
        for node in nodes:
            if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
                sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    del kept
    live = peak = allocated = 0
    for _, size in sorted(sizes):
        live += size
        peak = max(peak, live)
        allocated += max(size, 0)
    return peak, live, allocated


def test_temporaries_inside_an_operator_reach_the_line_peak():
    n, classes = 512, 1000
    logits = torch.randn(n, classes)
    target = torch.zeros(n, dtype=torch.long)

    def loss_of(logits, target):
        return torch.nn.functional.cross_entropy(logits, target)

    def f(logits, target):
        start = None
        loss = torch.nn.functional.cross_entropy(logits, target)
        return start, loss

    truth_peak, truth_net, truth_allocated = profiler_truth(loss_of, logits, target)
    assert truth_peak >= n * classes * 4  # log_softmax's output, freed inside the operator
    records = profile(f, logits, target)
    code = "loss = torch.nn.functional.cross_entropy(logits, target)"
    assert rise(records, code, "start = None") == truth_peak
    entry = line(records, code)
    assert entry["allocated_bytes.all.allocated"] == truth_allocated
    net = entry["active_bytes.all.current"] - records["start = None"]["active_bytes.all.current"]
    assert net == truth_net == 4  # the scalar loss


def test_a_python_scalar_operand_is_the_small_tensor_torch_makes_of_it():
    x = torch.ones(256, 1024)

    def times_two(x):
        return x * 2

    def f(x):
        y = x * 2
        return y

    _, _, truth = profiler_truth(times_two, x)
    records = profile(f, x)
    assert truth > MiB  # the result, and the 2 wrapped as a tensor and cast
    assert line(records, "y = x * 2")["allocated_bytes.all.allocated"] == truth


def test_storages_alive_before_enable_are_adopted_once_and_their_frees_recognised():
    before = torch.empty(3, MiB // 4)  # 3 MiB, made before tracking: adopted, not allocated
    from_numpy = torch.from_numpy(np.ones(MiB // 8))  # 1 MiB numpy's memory: adopted too
    held = {"before": before, "numpy": from_numpy}
    del before, from_numpy

    def f(held):
        start = None
        held.pop("before")
        held.pop("numpy")
        return start

    with LineProfiler(f, device="cpu") as lp:
        live_at_start = dict(_core._cpu_stats())["allocated_bytes.all.current"]
        f(held)
        live_at_end = dict(_core._cpu_stats())["allocated_bytes.all.current"]
    assert live_at_start >= 4 * MiB
    assert live_at_start - live_at_end == 4 * MiB
    records = {r["code"].strip(): r for r in lp.display(columns=COLUMNS).records() if r["hits"]}
    assert records['held.pop("before")']["allocated_bytes.all.freed"] == 3 * MiB
    assert records['held.pop("numpy")']["allocated_bytes.all.freed"] == MiB
    assert records['held.pop("before")']["allocated_bytes.all.allocated"] == 0


def test_fake_tensors_alive_at_enable_are_not_adopted():
    """A fake tensor (torch.compile's caches and the estimate make them) reports a CPU
    device and a storage of its size, on no memory: the baseline leaves it out, and never
    reads its data pointer (torch warns at that, calling it a bug in the user's code)."""
    with FakeTensorMode():
        fake = torch.empty(4, MiB // 4)  # 4 MiB that exist nowhere
    real = torch.empty(MiB // 4)
    assert _core._cpu_mode() is None  # the start below walks (a second user would not)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _core._cpu_start() == "allocator"
    try:
        assert _core._cpu_table_has(real.data_ptr(), MiB)
        assert not _core._cpu_table_has(0, 4 * MiB)
        assert fake.untyped_storage().device.type == "meta"
    finally:
        _core._cpu_stop()


def test_per_call_work_does_not_walk_live_tensors():
    """The baseline walk happens at enable only: profiled calls made while many more tensors
    are alive than at enable adopt nothing more."""
    def f():
        return None

    with LineProfiler(f, device="cpu"):
        adopted = dict(_core._cpu_stats())["allocation.all.current"]
        many = [torch.empty(1) for _ in range(1000)]
        for _ in range(10):
            f()
        grown = dict(_core._cpu_stats())["allocation.all.current"] - adopted
        del many
    assert grown == 1000  # exactly the new ones, counted as allocated, once


def test_slots_hold_our_hook_only_while_tracking_and_relro_pages_stay_read_only():
    slots = _core._cpu_hook_slots()
    assert {name for name, _, _ in slots} == {"posix_memalign", "free"}
    assert not any(ours for _, _, ours in slots)
    assert _core._cpu_mode() is None
    assert _core._cpu_start() == "allocator"
    try:
        assert all(ours for _, _, ours in _core._cpu_hook_slots())
        for _, address, relro in _core._cpu_hook_slot_addresses():
            assert page_permissions(address).startswith("r-" if relro else "rw")
    finally:
        _core._cpu_stop()
    assert not any(ours for _, _, ours in _core._cpu_hook_slots())
    for _, address, relro in _core._cpu_hook_slot_addresses():
        assert page_permissions(address).startswith("r-" if relro else "rw")
        # What was put back is the function itself, never a lazy-binding stub inside
        # libc10: a stub would let the dynamic linker rewrite the slot under a later start.
        assert not mapping_of(ctypes.c_size_t.from_address(address).value).endswith("libc10.so")
    assert _core._cpu_mode() is None


def mapping_of(address: int) -> str:
    """The file mapped at ``address`` ("" for anonymous memory)."""
    with open("/proc/self/maps") as maps:
        for entry in maps:
            fields = entry.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5] if len(fields) > 5 else ""
    raise AssertionError(f"{address:#x} is not mapped")


def page_permissions(address: int) -> str:
    with open("/proc/self/maps") as maps:
        for entry in maps:
            span, permissions = entry.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= address < end:
                return permissions
    raise AssertionError(f"{address:#x} is not mapped")


def test_tracking_is_shared_and_ends_with_its_last_user():
    assert _core._cpu_start() == "allocator"
    with LineProfiler(test_resize_is_counted, device="cpu"):
        assert _core._cpu_mode() == "allocator"
    assert _core._cpu_mode() == "allocator"  # our own start still holds it
    x = torch.empty(MiB // 4)
    assert _core._cpu_table_has(x.data_ptr(), MiB)
    _core._cpu_stop()
    assert _core._cpu_mode() is None
    assert not _core._cpu_table_has(x.data_ptr(), MiB)


def test_a_probe_the_hook_does_not_see_means_the_fallback_and_the_report_says_why(monkeypatch):
    # A torch whose CPU allocator does not call libc10's posix_memalign: the probe's
    # allocation never reaches the table.
    monkeypatch.setattr(_cpu_source, "probe", lambda: False)

    def f():
        x = torch.empty(256, 1024)
        return x

    with LineProfiler(f, device="cpu") as lp:
        assert lp.stats_reader == "dispatch mode"
        f()
    assert not any(ours for _, _, ours in _core._cpu_hook_slots())
    report = lp.display(columns=COLUMNS)
    (notice,) = [n for n in report.notices if "dispatch-mode fallback" in n]
    assert "did not reach libc10's posix_memalign" in notice
    assert {r["code"].strip(): r for r in report.records()}["x = torch.empty(256, 1024)"][
        "allocated_bytes.all.allocated"] == MiB


def test_torch_compile_compiles_the_same_frames_profiled():
    dynamo = pytest.importorskip("torch._dynamo")

    def body(x):
        y = torch.sin(x) + 1
        return y * 2

    def run(x):
        return compiled(x)

    def frames() -> int:
        return sum(dynamo.utils.counters["frames"].values())

    dynamo.reset()
    dynamo.utils.counters.clear()
    compiled = torch.compile(body, backend="eager")
    run(torch.ones(8))
    unprofiled = dict(dynamo.utils.counters["frames"])
    dynamo.reset()
    dynamo.utils.counters.clear()
    compiled = torch.compile(body, backend="eager")
    with LineProfiler(run, device="cpu"):
        out = run(torch.ones(8))
    profiled = dict(dynamo.utils.counters["frames"])
    dynamo.reset()  # dynamo's caches hold fake tensors that later reports would list
    gc.collect()
    assert torch.equal(out, (torch.sin(torch.ones(8)) + 1) * 2)
    assert unprofiled.get("ok", 0) >= 1
    assert profiled == unprofiled
    assert frames() == sum(unprofiled.values())


def test_starts_and_stops_from_many_threads_leave_nothing_installed():
    errors: list[BaseException] = []

    def worker():
        try:
            # 8 threads x 40: the starts and stops interleave all the same; 200 each cost
            # 13 s on 3.13 late in the suite (a first start walks the heap).
            for _ in range(40):
                assert _core._cpu_start() == "allocator"
                kept = torch.empty(1024)
                assert _core._cpu_mode() == "allocator"
                del kept
                _core._cpu_stop()
        except BaseException as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _core._cpu_mode() is None
    assert not any(ours for _, _, ours in _core._cpu_hook_slots())
    assert _core._cpu_start() == "allocator"
    x = torch.empty(MiB // 4)
    assert _core._cpu_table_has(x.data_ptr(), MiB)
    _core._cpu_stop()


def test_a_failing_baseline_walk_leaves_nothing_installed(monkeypatch):
    def broken():
        raise RuntimeError("walk failed for the test")

    monkeypatch.setattr(_cpu_source, "baseline", broken)
    with pytest.raises(RuntimeError, match="walk failed for the test"):
        _core._cpu_start()
    assert _core._cpu_mode() is None
    assert not any(ours for _, _, ours in _core._cpu_hook_slots())
    monkeypatch.undo()
    assert _core._cpu_start() == "allocator"
    _core._cpu_stop()


def write_slot(address: int, value: int) -> None:
    """Write a GOT slot the way another interposing tool (memray, say) would."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = address & ~(mmap.PAGESIZE - 1)
    readonly = page_permissions(address).startswith("r-")
    assert libc.mprotect(page, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE) == 0
    ctypes.c_size_t.from_address(address).value = value
    if readonly:
        assert libc.mprotect(page, mmap.PAGESIZE, mmap.PROT_READ) == 0


def test_another_tool_replacing_the_hook_is_reported_and_kept():
    import ctypes

    real = ctypes.cast(ctypes.CDLL(None).posix_memalign, ctypes.c_void_p).value

    def f():
        x = torch.empty(256, 1024)
        return x

    (address,) = [a for name, a, _ in _core._cpu_hook_slot_addresses() if name == "posix_memalign"]
    with LineProfiler(f, device="cpu") as lp:
        ours = ctypes.c_size_t.from_address(address).value
        write_slot(address, real)  # the other tool calls the C library itself
        f()
    try:
        report = lp.display(columns=COLUMNS)
        (notice,) = [n for n in report.notices if "Another tool replaced" in n]
        assert "not counted" in notice
        # Its function stays where it is: putting ours back would undo the other tool.
        assert ctypes.c_size_t.from_address(address).value == real
    finally:
        assert ours != real
        write_slot(address, real)
