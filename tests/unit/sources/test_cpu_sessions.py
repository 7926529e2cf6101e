"""Sessions of the CPU source (src/sources/cpu): a line profiler, the training monitor and a
CPU trace share one session of the allocator hook while any of them runs, and nothing one
session leaves behind counts in the next, whichever source (the hook or the dispatch-mode
fallback) either used. Checked against a plain model of what each profiled line allocates
and frees, over random sequences of starts, stops and tensors kept alive or freed between.
"""

from __future__ import annotations

import io
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memlab_rs
from memlab_rs import LineProfiler, _core, trace
from memlab_rs._sources import cpu_source as _cpu_source

MiB = 1 << 20
pytestmark = pytest.mark.skipif(
    _cpu_source.library() is None, reason="this torch has no libc10.so (the fallback is used)"
)


def work(kept, nbytes, drop):
    kept.append(torch.empty(nbytes, dtype=torch.uint8))
    gone = kept.pop(drop) if drop is not None else None
    del gone


FIRST = work.__code__.co_firstlineno
ALLOCATES, FREES = FIRST + 1, FIRST + 3  # the lines of torch.empty and of del gone
COLUMNS = ["allocated_bytes.all.allocated", "allocated_bytes.all.freed"]


def current() -> int:
    return dict(_core._cpu_stats())["allocated_bytes.all.current"]


class Lines:
    """The plain model of one profiler's lines: each line's bytes allocated and freed, the
    largest over its hits (as the report takes them)."""

    def __init__(self) -> None:
        self.allocated = {ALLOCATES: 0, FREES: 0}
        self.freed = {ALLOCATES: 0, FREES: 0}

    def hit(self, nbytes: int, freed: int) -> None:
        self.allocated[ALLOCATES] = max(self.allocated[ALLOCATES], nbytes)
        self.freed[FREES] = max(self.freed[FREES], freed)

    def check(self, lp: LineProfiler) -> None:
        rows = {r["line"]: r for r in lp.display(work, columns=COLUMNS).records()}
        got = {
            line: tuple(rows.get(line, {}).get(column) or 0 for column in COLUMNS)
            for line in (ALLOCATES, FREES)
        }
        want = {line: (self.allocated[line], self.freed[line]) for line in (ALLOCATES, FREES)}
        assert got == want


class Sessions:
    """The readers that are on, the tensors kept alive, and each profiler's model."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []
        self.tracer: trace.Tracer | None = None
        self.monitor: memlab_rs.MemoryMonitor | None = None
        self.profiler: LineProfiler | None = None
        self.lines = Lines()
        self.model = torch.nn.Linear(2, 2)

    def call(self, nbytes: int, drop: int | None, lines: Lines) -> None:
        """One call of ``work``, checked against the model by every reader that is on."""
        freed = 0
        if drop is not None:
            drop %= len(self.kept) + 1  # len(kept): the tensor the call makes
            freed = self.kept[drop].untyped_storage().nbytes() if drop < len(self.kept) else nbytes
        if self.monitor is not None:
            self.monitor.record_stats()
        before = current() if _core._cpu_mode() == "allocator" else None
        work(self.kept, nbytes, drop)
        if before is not None:
            assert current() - before == nbytes - freed
        if self.monitor is not None:
            self.monitor.record_stats()
            rows = self.monitor.rows()
            assert rows[-1]["current_cached"] - rows[-2]["current_cached"] == nbytes - freed
        lines.hit(nbytes, freed)

    def keep_or_drop(self, what: str, n: int) -> None:
        """Make a tensor and keep it, or free one kept, outside profiled code: a session on
        counts exactly that."""
        before = current() if _core._cpu_mode() == "allocator" else None
        if what == "keep":
            self.kept.append(torch.empty(n, dtype=torch.uint8))
            change = n
        elif self.kept:
            change = -self.kept.pop(n % len(self.kept)).untyped_storage().nbytes()
        else:
            return
        if before is not None:
            assert current() - before == change

    def toggle(self, reader: str) -> None:
        if reader == "tracer":
            if self.tracer is None:
                self.tracer = trace.Tracer(device="cpu").start()
            else:
                tracer, self.tracer = self.tracer, None
                tracer.stop()
        elif reader == "monitor":
            if self.monitor is None:
                self.monitor = memlab_rs.memory_profiler(
                    self.model, device="cpu", print_period=1 << 30, file=io.StringIO()
                )
            else:
                monitor, self.monitor = self.monitor, None
                monitor.stop()
        elif self.profiler is None:
            self.profiler = LineProfiler(work, device="cpu")
            self.profiler.enable()
            assert self.profiler.stats_reader == "allocator hook"
            self.lines = Lines()
        else:
            lp, self.profiler = self.profiler, None
            lp.disable()
            self.lines.check(lp)

    def fallback(self, calls: list[tuple[int, int | None]]) -> None:
        """A whole session of the dispatch-mode fallback, when no reader holds the hook."""
        if _core._cpu_mode() is not None:
            return
        os.environ["MEMLAB_RS_CPU_SOURCE"] = "dispatch"
        try:
            lp = LineProfiler(work, device="cpu")
            lp.enable()
        finally:
            del os.environ["MEMLAB_RS_CPU_SOURCE"]
        try:
            assert lp.stats_reader == "dispatch mode"
            lines = Lines()
            for nbytes, drop in calls:
                self.call(nbytes, drop, lines)
        finally:
            lp.disable()
        lines.check(lp)

    def close(self) -> None:
        """Stop every reader still on (the profiler's lines checked), then free the tensors."""
        try:
            if self.profiler is not None:
                self.toggle("profiler")
        finally:
            for reader in (self.profiler, self.tracer, self.monitor):
                if reader is not None:  # after a failure: only stopped
                    reader.disable() if isinstance(reader, LineProfiler) else reader.stop()
            self.profiler = self.tracer = self.monitor = None
            self.kept.clear()


SIZES = st.integers(1, 64).map(lambda k: k * 1024 + 8)
DROPS = st.none() | st.integers(0, 99)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["tracer", "monitor", "profiler"])),
        st.tuples(st.just("keep"), SIZES),
        st.tuples(st.just("drop"), st.integers(0, 99)),
        st.tuples(st.just("call"), SIZES, DROPS),
        st.tuples(st.just("fallback"), st.lists(st.tuples(SIZES, DROPS), min_size=1, max_size=3)),
    ),
    max_size=20,
)


@settings(
    max_examples=int(30 * float(os.environ.get("MEMLAB_RS_FUZZ_SCALE", "1"))),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(STEPS)
def test_each_line_counts_what_it_allocates_and_frees_whatever_ran_before(
    garbage_collected_once, steps
):
    sessions = Sessions()
    try:
        for step in steps:
            what = step[0]
            if what in ("keep", "drop"):
                sessions.keep_or_drop(what, step[1])
            elif what == "call":
                sessions.call(step[1], step[2], sessions.lines)
            elif what == "fallback":
                sessions.fallback(step[1])
            else:
                sessions.toggle(what)
    finally:
        sessions.close()
    assert _core._cpu_mode() is None


def test_a_storage_the_fallback_counted_is_uncounted_once_when_the_hook_sees_it_freed(
    monkeypatch,
):
    """The fallback's session ends with storages it counted still alive; a later session of
    the hook (a line profiler's, the monitor's) adopts them and sees one freed: it is freed
    once, not once more by the weak reference the fallback had put on it."""
    held = {}

    def make():
        held["profiler"] = torch.empty(MiB, dtype=torch.uint8)
        held["monitor"] = torch.empty(MiB, dtype=torch.uint8)

    def drop(key):
        del held[key]

    monkeypatch.setenv("MEMLAB_RS_CPU_SOURCE", "dispatch")
    with LineProfiler(make, device="cpu") as lp:
        assert lp.stats_reader == "dispatch mode"
        make()
    monkeypatch.delenv("MEMLAB_RS_CPU_SOURCE")

    with LineProfiler(drop, device="cpu") as lp:
        assert lp.stats_reader == "allocator hook"
        before = current()
        drop("profiler")
        assert before - current() == MiB
    (row,) = [r for r in lp.display(drop, columns=COLUMNS).records() if "del" in r["code"]]
    assert row["allocated_bytes.all.freed"] == MiB

    model = torch.nn.Linear(2, 2)
    with memlab_rs.memory_profiler(model, device="cpu", file=io.StringIO()) as monitor:
        monitor.record_stats()
        drop("monitor")
        monitor.record_stats()
    first, second = monitor.rows()[-2:]
    assert first["current_cached"] - second["current_cached"] == MiB
