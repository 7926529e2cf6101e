"""Tracks of known CPU tensors, made the same way by the tests of several folders: the
tracker's own (tests/unit/tracker) and those of the result files every kind shares
(tests/unit/results)."""

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
