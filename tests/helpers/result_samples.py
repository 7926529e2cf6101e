"""One small real result of every saved kind, made once per test process from CPU tensors: what
the load-safety and atomic-save tests damage, save and load. ``samples()`` maps each kind to
its result; ``use(result)`` does with a loaded result everything a user does next."""

from __future__ import annotations

import functools
import io
import tempfile
from typing import Any

import torch

import memlab_rs
import memlab_rs.doctor
from memlab_rs import PytestMemoryResult, results


def _grow(n: int) -> torch.Tensor:
    a = torch.zeros(n, 1024)
    b = torch.ones(2 * n, 1024)
    del a
    return b


def _line_profile(n: int, rank: int) -> Any:
    with memlab_rs.LineProfiler(_grow, device="cpu") as profiler:
        _grow(n)
    result = profiler.result()
    result.meta.update(rank=rank, world_size=2, local_rank=rank)
    return result


@functools.cache
def samples() -> dict[str, Any]:
    """kind -> a real result of that kind (the same objects on every call). Every tensor
    made here is gone when it returns: a CPU LineProfiler started later in the process
    counts tensors that were alive while a Tracer or a monitor ran as allocated on a line
    it measures (a CPU-source bug outside these tests; the doctests of merge and diff,
    which run later in the suite, saw it)."""
    profiles = [_line_profile(64, 0), _line_profile(128, 1)]
    linear = torch.nn.Linear(64, 32)
    held = [linear, torch.zeros(16, 1024)]
    report = memlab_rs.MemReporter(linear).collect(device="cpu")
    with memlab_rs.trace.Tracer(device="cpu") as tracer:
        kept = _grow(32)
    del kept
    model = torch.nn.Linear(64, 32)
    with memlab_rs.memory_profiler(model, file=io.StringIO(), verbose=True) as monitor:
        for _ in range(3):
            model(torch.randn(4, 64, requires_grad=True)).sum().backward()
            monitor.record_stats()
    tracker = memlab_rs.MemTracker(detail=True, path=tempfile.mkdtemp() + "/", device="cpu")
    tracker.track()
    held.append(torch.zeros(16, 1024))
    track = tracker.track()
    del held
    estimate = memlab_rs.estimate(torch.nn.Linear(10, 10), torch.zeros(2, 10), device="cpu")
    # A plan with a row that could not be estimated (a Linear has no blocks to checkpoint).
    plan = memlab_rs.plan(torch.nn.Linear(10, 10), lambda n: torch.zeros(n, 10), 2, "1MiB",
                          device="cpu", sizes=[4], precisions=["bf16"], optimizers={},
                          limit=8)  # fmt: skip
    leak_kept: list[torch.Tensor] = []
    leaks = memlab_rs.leaks(lambda: leak_kept.append(torch.zeros(64)), steps=3, device="cpu")
    leak_kept.clear()  # no tensor of it outlives samples()
    measured = {
        "device": "cpu",
        "peak_bytes": 1 << 20,
        "start_bytes": 4096,
        "limit_bytes": 2 << 20,
        "rows": [{"location": "test_a.py:3", "bytes": 1 << 20, "count": 1}],
        "notices": ["a notice"],
    }
    test_memory = PytestMemoryResult(
        "test_a.py::test_big", "passed", [measured], results.run_meta("cpu")
    )
    mib = 1 << 20
    carved = [{"size": 4 * mib, "state": "active_allocated"}] * 5 + [
        {"size": 20 * mib, "state": "inactive"},
        {"size": 4 * mib, "state": "active_pending_free"},
    ]
    fragmentation = memlab_rs.doctor.from_snapshot(
        [{"address": 1 << 40, "total_size": 44 * mib, "stream": 0, "segment_type": "large",
          "blocks": carved}],
        request=30 * mib,
        device_free_bytes=0,
    )  # fmt: skip
    # A post-mortem of a real refused allocation: torch's CPU allocator has no 2^60 bytes.
    guard = memlab_rs.oom_guard(dir=tempfile.mkdtemp(), summary=False)
    try:
        with guard:
            torch.empty(1 << 60, dtype=torch.uint8)
    except RuntimeError:
        pass
    return {
        "postmortem": guard.last,
        "fragmentation": fragmentation,
        "line_profile": profiles[0],
        "tensor_report": report,
        "trace": tracer.result,
        "monitor": monitor.result(),
        "tracker": track,
        "estimate": estimate,
        "plan": plan,
        "test_memory": test_memory,
        "leaks": leaks,
        "merged_line_profile": memlab_rs.merge_results(profiles),
        "merged_tensor_report": memlab_rs.merge_results([report, report], ranks=[0, 1]),
    }


def second_rank(kind: str) -> Any:
    """A result of ``kind`` from rank 1 of the same job, for merge (line profiles and
    tensor reports only)."""
    if kind == "line_profile":
        return _line_profile(128, 1)
    report = samples()["tensor_report"]
    meta = {**report.meta, "rank": 1, "world_size": 2}
    return memlab_rs.MemoryReport(report.to_data(), meta=meta)


def use(result: Any) -> None:
    """Everything a user does with a loaded result: every rendering, every figure, merged
    and compared where the kind merges and compares. The only exception it may raise for a
    damaged file is a ValueError."""
    kind = getattr(result, "kind", "trace recording")
    str(result)
    repr(result)
    results.dumps(result, indent=1)  # show --format json
    if hasattr(result, "_repr_html_"):
        result._repr_html_()
    if hasattr(result, "to_csv") and kind != "trace":
        result.to_csv()
    if kind in ("line_profile", "merged_line_profile"):
        result.text(columns=None)
        result.html(columns=None)
        result.records()
    if kind == "line_profile":
        result.to_csv(columns=None)
        good = samples()["line_profile"]
        memlab_rs.diff_results(good, result, columns=None).text()
        memlab_rs.diff_results(result, result).to_data()
        memlab_rs.merge_results([result, good], ranks=[0, 1]).text()
    if kind == "tensor_report":
        result.to_text(verbose=True)
        result.rows  # noqa: B018
        result.sections()
        result.to_json()
        good = samples()["tensor_report"]
        memlab_rs.diff_results(good, result).text()
        memlab_rs.merge_results([result, good], ranks=[0, 1]).text()
    if kind == "trace":
        result.to_json()
        result.module_text()
        for device in result.devices:
            result.rows(device)
            result.module_rows(device)
            result.to_csv(device=device)
            result.timeline_html(device=device)
            result.untagged_log(device=device)
            result.line_peak_live(device)
        with tempfile.TemporaryDirectory() as folder:
            result.export_memory_viz(f"{folder}/viz.pickle")
            result.export_memory_viz(f"{folder}/viz.json", format="json")
    if kind == "monitor":
        for step in range(1, len(result.rows()) + 1):
            result.text(step)
            result.csv_row(step)
        result.plot_html()
    if kind == "estimate":
        result.to_json()
        result.activations_at_peak  # noqa: B018
    if kind == "test_memory":
        for device in result.devices:
            result.peak_bytes(device)
    if kind == "postmortem":
        result.summary()
        result.advice_kinds()
        result.render("html")
    if kind == "fragmentation":
        result.render("csv")
        if result.verdict is not None:
            result.fits()
            result.fits("expandable_segments:True")
            result.fragmented()
    if kind == "tracker":
        result.html()
