"""The line profiler on the CPU source: exact per-line numbers from real CPU tensors.

Sizes: torch.empty(256, 1024) is 1 MiB of float32 ("1.00M"), (512, 1024) 2 MiB, and so on.
"""

from __future__ import annotations

import io
import sys
import threading

import pytest
import torch

import memlab_rs
from memlab_rs import LineProfiler

MiB = 1 << 20
ALL = (
    "active_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed",
    "allocated_bytes.all.current",
)


def by_line(lp: LineProfiler, func, columns=ALL) -> dict[str, dict]:
    """{source line stripped: record} for ``func``; lines that never ran have None values."""
    out = {}
    for record in lp.display(func, columns).records():
        out[record["code"].strip()] = record
    return out


def allocate_and_free(n):
    a = torch.empty(256, 1024)
    b = torch.empty(n, 1024)
    del a
    c = b + b  # not b * 2: the wrapped scalar 2 is a (tiny) CPU tensor of its own
    return c


def test_each_line_gets_exactly_what_it_allocated():
    with LineProfiler(allocate_and_free, device="cpu") as lp:
        allocate_and_free(512)
    lines = by_line(lp, allocate_and_free)
    base = lines["def allocate_and_free(n):"]["allocated_bytes.all.current"]
    a, b = lines["a = torch.empty(256, 1024)"], lines["b = torch.empty(n, 1024)"]
    assert a["allocated_bytes.all.allocated"] == MiB
    assert a["active_bytes.all.peak"] == base + MiB
    assert b["allocated_bytes.all.allocated"] == 2 * MiB
    assert b["allocated_bytes.all.current"] == base + 3 * MiB
    assert lines["del a"]["allocated_bytes.all.freed"] == MiB
    assert lines["del a"]["allocated_bytes.all.current"] == base + 2 * MiB
    c = lines["c = b + b  # not b * 2: the wrapped scalar 2 is a (tiny) CPU tensor of its own"]
    assert c["allocated_bytes.all.allocated"] == 2 * MiB
    assert c["active_bytes.all.peak"] == base + 4 * MiB
    assert lines["return c"]["hits"] == 1


def test_text_shows_one_more_mebibyte_on_the_allocating_line():
    with LineProfiler(allocate_and_free, device="cpu") as lp:
        allocate_and_free(512)
    text = str(lp.display(columns=("allocated_bytes.all.current", "reserved_bytes.all.peak")))
    assert text.startswith("## allocate_and_free\n\nallocated_bytes reserved_bytes line code")
    rows = text.splitlines()
    entry = next(r for r in rows if "def allocate_and_free" in r).split()[0]
    row = next(r for r in rows if "a = torch.empty(256, 1024)" in r).split()[0]
    base = by_line(lp, allocate_and_free)["def allocate_and_free(n):"]
    assert entry == memlab_rs.readable_size(base["allocated_bytes.all.current"])
    assert row == memlab_rs.readable_size(base["allocated_bytes.all.current"] + MiB)


def test_text_matches_pytorch_memlab_layout_for_the_same_numbers():
    line_records = pytest.importorskip("pytorch_memlab.line_profiler.line_records")
    columns = ("active_bytes.all.peak", "active_bytes.all.current", "reserved_bytes.all.peak")
    with LineProfiler(allocate_and_free, device="cpu") as lp:
        allocate_and_free(512)
    shown = lp.display(allocate_and_free, columns)
    raw = []
    for record in shown.records():
        if record[columns[0]] is None:
            continue
        raw.append(
            {
                "code_hash": 1,
                "line": record["line"],
                "prev_record_idx": len(raw) - 1,
                "num_alloc_retries": 0,
                "num_ooms": 0,
                **{c: record[c] for c in columns},
            }
        )
    infos = {1: {"func": allocate_and_free}}
    theirs = line_records.LineRecords(raw, infos).display(None, columns)
    assert str(shown) == str(theirs)


def inner():
    t = torch.empty(1024, 1024)
    del t
    return 0


def outer():
    x = torch.empty(256, 1024)
    inner()
    return x


def test_a_line_calling_a_profiled_function_accounts_for_it():
    with LineProfiler(inner, outer, device="cpu") as lp:
        outer()
    lines = by_line(lp, outer)
    base = lines["def outer():"]["allocated_bytes.all.current"]
    call = lines["inner()"]
    assert call["active_bytes.all.peak"] == base + 5 * MiB
    assert call["allocated_bytes.all.allocated"] == 4 * MiB
    assert call["allocated_bytes.all.freed"] == 4 * MiB
    assert call["allocated_bytes.all.current"] == base + MiB
    inner_peak = by_line(lp, inner)["t = torch.empty(1024, 1024)"]["active_bytes.all.peak"]
    assert inner_peak == base + 5 * MiB
    text = str(lp.display())
    assert text.index("## inner") < text.index("## outer")


def recurse(n):
    a = torch.empty(256, 1024)
    if n > 0:
        recurse(n - 1)
    return a


def test_recursion_keeps_one_open_line_per_frame():
    with LineProfiler(recurse, device="cpu") as lp:
        recurse(3)
    lines = by_line(lp, recurse)
    base = lines["def recurse(n):"]["allocated_bytes.all.current"] - 3 * MiB  # deepest entry
    make = lines["a = torch.empty(256, 1024)"]
    assert make["hits"] == 4
    assert make["allocated_bytes.all.allocated"] == MiB  # each frame made one, not more
    assert make["active_bytes.all.peak"] == base + 4 * MiB
    call = lines["recurse(n - 1)"]
    assert call["hits"] == 3
    assert call["allocated_bytes.all.allocated"] == 3 * MiB  # the outermost call: 3 below it
    assert call["allocated_bytes.all.freed"] == 3 * MiB
    assert call["active_bytes.all.peak"] == base + 4 * MiB
    assert lines["return a"]["hits"] == 4


def produce(k):
    for _ in range(k):
        t = torch.empty(256, 1024)
        yield t


def consume():
    kept = []
    for t in produce(3):
        kept.append(t)
        big = torch.empty(2048, 1024)
        del big
    return kept


def test_a_generator_is_not_charged_for_what_its_consumer_does():
    with LineProfiler(produce, consume, device="cpu") as lp:
        consume()
    gen = by_line(lp, produce)
    loop = by_line(lp, consume)
    base = loop["def consume():"]["allocated_bytes.all.current"]
    assert gen["t = torch.empty(256, 1024)"]["allocated_bytes.all.allocated"] == MiB
    assert gen["t = torch.empty(256, 1024)"]["hits"] == 3
    # 8 MiB come and go in the consumer between yields: none of it belongs to these lines.
    assert max(r["active_bytes.all.peak"] for r in gen.values() if r["hits"]) == base + 3 * MiB
    assert loop["big = torch.empty(2048, 1024)"]["active_bytes.all.peak"] == base + 11 * MiB
    assert loop["for t in produce(3):"]["allocated_bytes.all.allocated"] == MiB


def boom():
    t = torch.empty(256, 1024)
    raise RuntimeError(f"failed holding {t.numel()} floats")


def survive():
    try:
        boom()
    except RuntimeError:
        pass
    y = torch.empty(512, 1024)
    return y


def test_an_exception_closes_the_frames_it_leaves():
    with LineProfiler(boom, survive, device="cpu") as lp:
        survive()
        survive()
    lines = by_line(lp, survive)
    assert lines["boom()"]["allocated_bytes.all.allocated"] == MiB
    after = lines["y = torch.empty(512, 1024)"]
    assert after["allocated_bytes.all.allocated"] == 2 * MiB
    assert after["hits"] == 2
    assert by_line(lp, boom)["t = torch.empty(256, 1024)"]["hits"] == 2


def threaded_work():
    x = torch.empty(512, 1024)
    return x


def test_a_thread_started_before_enable_is_profiled():
    go = threading.Event()
    results = []

    def run():
        go.wait(timeout=60)
        results.append(threaded_work())

    thread = threading.Thread(target=run, daemon=True)  # never blocks the exit
    thread.start()
    try:
        with LineProfiler(threaded_work, device="cpu") as lp:
            go.set()
            thread.join()
    finally:
        go.set()
    line = by_line(lp, threaded_work)["x = torch.empty(512, 1024)"]
    assert line["allocated_bytes.all.allocated"] == 2 * MiB
    assert line["hits"] == 1


def test_threads_started_after_enable_are_profiled():
    # One after another: the statistics are process-wide (as the CUDA allocator's are), so
    # threads running at the same time would see each other's allocations on open lines.
    with LineProfiler(threaded_work, device="cpu") as lp:
        for _ in range(4):
            thread = threading.Thread(target=threaded_work)
            thread.start()
            thread.join()
    line = by_line(lp, threaded_work)["x = torch.empty(512, 1024)"]
    assert line["hits"] == 4
    assert line["allocated_bytes.all.allocated"] == 2 * MiB


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(1024, 256, bias=False)

    def forward(self, x):
        h = self.fc(x)
        return h.relu()


def test_module_forward_and_methods_are_profiled():
    net = Net()
    x = torch.ones(64, 1024)
    with LineProfiler(net.forward, device="cpu") as lp:
        net(x)
    lines = by_line(lp, Net.forward)
    assert lines["h = self.fc(x)"]["allocated_bytes.all.allocated"] == 64 * 256 * 4
    assert "## Net.forward" in str(lp.display())


def test_nested_functions_share_their_code_object():
    def make_inner():
        def body():
            z = torch.empty(256, 1024)
            return z

        return body

    lp = LineProfiler(make_inner(), device="cpu")
    with lp:
        make_inner()()  # another function object, the same code
    assert by_line(lp, "test_nested_functions_share_their_code_object.<locals>.make_inner."
                   "<locals>.body")["z = torch.empty(256, 1024)"]["hits"] == 1


def test_functions_that_never_ran_and_lines_that_never_ran():
    lp = LineProfiler(allocate_and_free, device="cpu")
    assert str(lp.display()) == "No data collected\n"
    with lp:
        allocate_and_free(256)
    assert lp.display().records()[0]["line"] == allocate_and_free.__code__.co_firstlineno


def test_unknown_column_lists_the_valid_ones():
    with LineProfiler(allocate_and_free, device="cpu") as lp:
        allocate_and_free(1)
    with pytest.raises(ValueError, match="allocated_bytes.all.current") as err:
        lp.display(columns=("active_bytes.large_pool.peak",))
    assert "active_bytes.large_pool.peak" in str(err.value)


def test_bad_input_gets_clear_errors():
    with pytest.warns(UserWarning, match="Could not extract a code object"):
        LineProfiler(len)  # pytorch_memlab's warning; the builtin is skipped
    with pytest.raises(TypeError, match="target_gpu"):
        LineProfiler(target_gpu=-1)
    with pytest.raises(ValueError, match="not profiled"):
        LineProfiler(device="cpu").display(outer)
    with pytest.raises(ValueError, match="CPU or CUDA"):
        LineProfiler(device="meta")
    with pytest.raises(ValueError, match="cannot profile cuda:99"):
        LineProfiler(device="cuda:99")
    with pytest.raises(ValueError, match=">= 1"):
        memlab_rs.profile_every(0)


def test_print_stats_writes_the_text():
    with LineProfiler(allocate_and_free, device="cpu") as lp:
        allocate_and_free(1)
    out = io.StringIO()
    lp.print_stats(stream=out)
    assert out.getvalue() == str(lp.display())


def test_clear_forgets_functions_and_rows():
    lp = LineProfiler(allocate_and_free, device="cpu")
    with lp:
        allocate_and_free(1)
    lp.clear()
    with lp:
        allocate_and_free(1)
    assert str(lp.display()) == "No data collected\n"


def test_two_profilers_at_once_see_the_same_lines():
    first = LineProfiler(outer, device="cpu")
    second = LineProfiler(inner, outer, device="cpu")
    with first, second:
        outer()
    for lp in (first, second):
        lines = by_line(lp, outer)
        base = lines["def outer():"]["allocated_bytes.all.current"]
        assert lines["inner()"]["active_bytes.all.peak"] == base + 5 * MiB


def test_the_previous_tracer_comes_back():
    seen = []

    def tracer(frame, event, arg):
        seen.append(event)
        return None

    if sys.version_info >= (3, 12):
        with LineProfiler(outer, device="cpu"):
            assert "memlab_rs" in (sys.monitoring.get_tool(3), sys.monitoring.get_tool(4))
        assert "memlab_rs" not in (sys.monitoring.get_tool(3), sys.monitoring.get_tool(4))
        return
    sys.settrace(tracer)
    try:
        with LineProfiler(outer, device="cpu"):
            outer()
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


def free_existing(holder):
    holder.pop()


def test_tensors_from_before_profiling_count_as_live_and_can_be_freed():
    holder = [torch.empty(1024, 1024)]
    with LineProfiler(free_existing, device="cpu") as lp:
        free_existing(holder)
    entry = by_line(lp, free_existing)["def free_existing(holder):"]
    assert entry["allocated_bytes.all.current"] >= 4 * MiB
    pop = by_line(lp, free_existing)["holder.pop()"]
    assert pop["allocated_bytes.all.freed"] == 4 * MiB
    assert pop["allocated_bytes.all.allocated"] == 0
    assert pop["allocated_bytes.all.current"] == entry["allocated_bytes.all.current"] - 4 * MiB


def test_peak_memory_stats_survive_the_per_line_resets():
    with LineProfiler(inner, device="cpu") as lp:
        inner()
    assert lp.peak_memory_stats()["active_bytes.all.peak"] >= 4 * MiB


def test_a_disabled_profiler_sees_nothing_of_another_ones_lines():
    idle = LineProfiler(inner, device="cpu")
    with idle:
        inner()
    before = idle.peak_memory_stats()
    with LineProfiler(inner, device="cpu") as busy:
        inner()
        big = torch.empty(16, 1024, 1024)  # 64 MiB: more than `idle` ever saw
        del big
        inner()  # its first line sees the 64 MiB peak
    assert busy.peak_memory_stats()["active_bytes.all.peak"] >= 64 * MiB
    assert idle.peak_memory_stats() == before
    assert by_line(idle, inner)["t = torch.empty(1024, 1024)"]["hits"] == 1
    assert by_line(busy, inner)["t = torch.empty(1024, 1024)"]["hits"] == 2
