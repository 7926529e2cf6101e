"""MemTracker.track() per call in a training loop, ours against the original's approach.

The original (Pytorch-Memory-Utils' gpu_mem_track.py) walks ``gc.get_objects()`` twice per
call, tests every object with ``torch.is_tensor`` / ``hasattr(obj, 'data')`` and diffs sets
of (type, size, count, MiB, dtype). Ours resumes the gc walk from the last call. Both look at
CPU tensors here (the original looks at CUDA ones; the walk is the same work).

    python bench/tracker_cost.py --objects 350000 --steps 1000 --original-steps 50

Prints median, p99 and max per call, and the ratio of medians.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings

import torch

import memlab_rs

# The original's walk calls torch.is_tensor and hasattr(obj, "data") on every gc object,
# deprecated torch aliases and lazy op handlers included, some of which warn once: noise,
# not a result.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message="undefined OpHandler")


def original_snapshot(last):
    """The original's track() work, re-stated: the gc walk, the groups, the set diff."""

    def tensors():
        for obj in gc.get_objects():
            try:
                if torch.is_tensor(obj) or (hasattr(obj, "data") and torch.is_tensor(obj.data)):
                    if obj.device.type == "cpu":
                        yield obj
            except Exception:
                pass

    sizes = [(t.size(), t.dtype) for t in tensors()]
    now = {
        (
            type(x),
            tuple(x.size()),
            sizes.count((x.size(), x.dtype)),
            x.numel() * x.element_size() / 1024**2,
            x.dtype,
        )
        for x in tensors()
    }
    return now, (now - last, last - now)


def stats(times):
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(round(0.99 * (len(times) - 1))))]
    return statistics.median(times), p99, times[-1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--objects", type=int, default=350_000)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--original-steps", type=int, default=50)
    args = p.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    filler = [[i] for i in range(max(0, args.objects - len(gc.get_objects())))]
    n_objects = len(gc.get_objects())

    def step():
        x = torch.randn(32, 64)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    folder = tempfile.mkdtemp()
    tracker = memlab_rs.MemTracker(path=folder + "/", device="cpu", model=model)
    tracker.track()
    ours, ours_cpu, strategies = [], [], {}
    for _ in range(args.steps):
        step()
        c0, t0 = time.thread_time(), time.perf_counter()
        result = tracker.track()
        ours.append(time.perf_counter() - t0)
        ours_cpu.append(time.thread_time() - c0)
        strategies[result.strategy] = strategies.get(result.strategy, 0) + 1

    last = set()
    theirs = []
    for _ in range(args.original_steps):
        step()
        t0 = time.perf_counter()
        last, _diff = original_snapshot(last)
        theirs.append(time.perf_counter() - t0)
    del filler

    print(
        f"python {platform.python_version()} torch {torch.__version__} on {platform.machine()}, "
        f"{os.cpu_count()} cpus; gc objects at start: {n_objects}"
    )
    print(f"{'':28}{'median ms':>10}{'p99 ms':>10}{'max ms':>10}{'calls':>8}")
    for label, times in (
        ("memlab_rs MemTracker.track", ours),
        ("  the same, thread CPU time", ours_cpu),
        ("original (gc.get_objects)", theirs),
    ):
        med, p99, mx = stats(times)
        print(f"{label:28}{med * 1e3:10.3f}{p99 * 1e3:10.3f}{mx * 1e3:10.3f}{len(times):8d}")
    ratio = statistics.median(theirs) / statistics.median(ours)
    print(f"ratio of medians (original / ours): {ratio:.0f}x")
    print(f"walk strategies of our calls: {strategies}")
    print(f"calls over 5 ms: {sum(t > 5e-3 for t in ours)} of {len(ours)} wall, "
          f"{sum(t > 5e-3 for t in ours_cpu)} in thread CPU time (the rest: waiting for a core)")


if __name__ == "__main__":
    sys.exit(main())
