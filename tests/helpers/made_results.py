"""Results of known CPU tensors, made the same way by the tests of several folders: tracks
(the tracker's own tests, tests/unit/tracker) and tensor reports (tests/unit/tensor_report),
and those of the merges and result files every kind shares (tests/unit/results)."""

from __future__ import annotations

import torch

import memlab_rs


def tracked(tmp_path, detail=True):
    """Two tracks: the first (with the log's header), then one that sees a 1 MiB tensor
    and a named 512 KiB parameter appear and the first's 256 KiB tensor vanish."""
    model = torch.nn.Module()
    tracker = memlab_rs.MemTracker(
        detail=detail, path=str(tmp_path) + "/", device="cpu", model=model
    )
    gone = torch.zeros(64, 1024)  # 256 KiB
    first = tracker.track()
    del gone
    kept = torch.zeros(256, 1024)  # 1 MiB
    model.w = torch.nn.Parameter(torch.zeros(128, 1024))  # 512 KiB, named "w"
    second = tracker.track()
    log = open(tracker.gpu_profile_fn).read()
    del kept
    return first, second, log


def tensor_report(**kwargs):
    """A CPU report of a Linear(1024, 256) (weight 1 MiB, bias 1 KiB) and a view sharing the
    weight's storage; ``kwargs`` are ``collect()``'s."""
    linear = torch.nn.Linear(1024, 256)
    view = linear.weight.view(-1)  # shares the weight's storage
    report = memlab_rs.MemReporter(linear).collect(device="cpu", **kwargs)
    del view
    return report


# An odd row width, so that no tensor another test left alive has these shapes.
WIDTH = 1021


def reports_with(sizes: list[int]) -> memlab_rs.MemoryReport:
    """A CPU report while unnamed tensors of these row counts are alive, in this order."""
    held = [torch.zeros(n, WIDTH) for n in sizes]
    report = memlab_rs.MemReporter().collect(device="cpu")
    del held
    return report
