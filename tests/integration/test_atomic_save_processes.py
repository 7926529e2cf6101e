"""A process killed while saving leaves a readable file: the process-level test of atomic
saves (moved from tests/unit/results/test_atomic_save.py, as it forks).

A colleague saw SIGKILL during a repeated `.json.gz` save leave it unreadable in 2 of 5
runs. Every writer now goes through `memlab_rs.results.atomic.atomic_open` (a new file in the
same folder, flushed, fsync'ed and renamed over the target): a forked child saves over and
over and is killed at a random moment, and every file it was writing still loads.
"""

from __future__ import annotations

import os
import random
import signal
import time

import torch

import memlab_rs
from memlab_rs import results
from memlab_rs.line_profiler import LineProfileResult


def _big_profile(n: int) -> LineProfileResult:
    """A line profile of ``n`` lines: a few MB of JSON, whose gzip takes long enough that a
    kill lands in the middle of writing it most of the time."""
    lines = [[i, f"x{i} = torch.zeros({i})\n", i, [i * 512, n * 1024]] for i in range(1, n)]
    function = {"qualname": "f", "filename": "a.py", "lines": lines}
    return LineProfileResult(
        ["active_bytes.all.peak", "reserved_bytes.all.peak"], [function], [], results.run_meta()
    )


def test_a_process_killed_while_saving_leaves_a_readable_file(tmp_path, wait_child):
    """A child saves two results in turn, over and over, to a .json.gz, a .json and a trace
    snapshot .pickle; SIGKILL at a random moment, five times: every file loads, as one of
    the two results, and nothing but our temporary files (``.NAME.PID.RANDOM.tmp``) is left
    beside them."""
    versions = [_big_profile(20_000), _big_profile(20_001)]
    with memlab_rs.trace.Tracer(device="cpu") as tracer:
        kept = torch.zeros(256, 1024)
    del kept
    traces = [tracer.result, memlab_rs.trace.load({"segments": [], "device_traces": [[]]})]
    files = [tmp_path / "r.json.gz", tmp_path / "r.json"]
    pickle_file = tmp_path / "t.pickle"
    for path in files:
        versions[0].save(path)
    traces[0].save(pickle_file)
    rng = random.Random(os.getpid())
    for _ in range(5):
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest
            try:
                while True:
                    for version, trace in zip(versions, traces):
                        for path in files:
                            version.save(path)
                        trace.save(pickle_file)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.05, 0.8))
        os.kill(pid, signal.SIGKILL)
        assert wait_child(pid) & 0x7F == signal.SIGKILL
        for path in files:
            assert len(memlab_rs.load(path).blocks[0]["lines"]) in (19_999, 20_000), path
        assert memlab_rs.trace.load(pickle_file).devices in ([], traces[0].devices)
    names = {p.name for p in tmp_path.iterdir()} - {"r.json.gz", "r.json", "t.pickle"}
    assert all(n.startswith((".r.json.gz.", ".r.json.", ".t.pickle.")) for n in names), names
    assert all(n.endswith(".tmp") for n in names), names
