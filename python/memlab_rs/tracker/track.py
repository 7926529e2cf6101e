"""MemTracker: which tensors appeared and vanished between two calls, at the caller's line.

A drop-in for Pytorch-Memory-Utils' ``gpu_mem_track.MemTracker`` (same arguments, log file
and layout) with exact numbers: storage bytes as the allocator holds them, each storage
once, views not counted twice. From the second call on, the gc walk resumes from the last
one (``memlab_rs._core.tracker.TrackerCore``), so a call costs about what changed; each
call's result crosses from Rust as data (``TrackResult``) and the log's block is rendered
from it.
"""

from __future__ import annotations

import datetime
import gc
import json
import sys
import weakref
from typing import Union

import torch

from .. import _core, _torch, results
from .result import TrackResult

DeviceLike = Union[torch.device, str, int]


def _parse_device(device: DeviceLike) -> str:
    """``"cpu"`` or ``"cuda:N"``; a clear error for anything else, or for CUDA without one."""
    key = _torch.device_key(device)  # names the argument in its TypeError/ValueError
    if key == "cpu":
        return "cpu"
    if not key.startswith("cuda:"):
        raise ValueError(f"device={device!r}: MemTracker tracks 'cuda' or 'cpu' tensors")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} asks for CUDA, but torch sees no CUDA device here; pass "
            "device='cpu' to track CPU tensors"
        )
    _torch.cuda_index_exists(int(key[5:]), f"device={device!r}")
    return key


class MemTracker:
    """Log which tensors appeared and vanished since the last ``track()``.

    ``MemTracker(detail=True, path="", verbose=False, device=0, *, model=None)``: as the
    original, ``path`` is a prefix of the log file ``{path}{timestamp}-gpu_mem_track.txt``;
    ``device`` a CUDA index, ``"cuda:N"`` or ``"cpu"``; with ``model``, new parameters and
    buffers are named after the model's names. ``track()`` appends a block to the log and
    returns it as data.

    >>> import torch, tempfile, os, memlab_rs
    >>> folder = tempfile.mkdtemp()
    >>> tracker = memlab_rs.MemTracker(path=folder + "/", device="cpu")
    >>> _ = tracker.track()
    >>> x = torch.zeros(256, 1024)
    >>> result = tracker.track()
    >>> [(r.sign, r.count, r.shape, r.bytes) for r in result.rows]
    [('+', 1, '(256, 1024)', 1048576)]
    >>> os.listdir(folder)[0].endswith("-gpu_mem_track.txt")
    True
    """

    def __init__(
        self,
        detail: bool = True,
        path: str = "",
        verbose: bool = False,
        device: DeviceLike = 0,
        *,
        model: torch.nn.Module | None = None,
    ):
        if not isinstance(path, str):
            raise TypeError(f"path must be a str prefix of the log file, not {type(path).__name__}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        self.print_detail = bool(detail)
        self.verbose = verbose
        self.device = _parse_device(device)
        self.gpu_profile_fn = (
            path + f"{datetime.datetime.now():%d-%b-%y-%H:%M:%S}-gpu_mem_track.txt"
        )
        self.begin = True
        self._model = weakref.ref(model) if model is not None else None
        self._core = _core.tracker.TrackerCore(self.device)

    def _named(self) -> list[tuple[torch.Tensor, str]]:
        model = self._model() if self._model is not None else None
        if model is None:
            return []
        named = list(_torch.module_tensor_names(model))
        grads = [(t.grad, f"{name}.grad") for t, name in named if t.grad is not None]
        return named + grads

    def _allocated(self) -> int | None:
        """The allocator's bytes on the device; None on the CPU (the tensors' total)."""
        if self.device == "cpu":
            return None
        return int(torch.cuda.memory_allocated(self.device))

    def track(self) -> TrackResult:
        """Append what changed since the last call to the log, and return it."""
        frame = sys._getframe(1)
        where = f"{frame.f_code.co_filename} line {frame.f_lineno}: {frame.f_code.co_name}"
        del frame
        named = self._named()
        stamp = f"{datetime.datetime.now():%d-%b-%y-%H:%M:%S}" if self.begin else None
        data = self._core.track(named, where, self.print_detail, stamp, self._allocated())
        del named
        self.begin = False
        result = TrackResult._from_json(data, results.run_meta(self.device))
        # The log block is rendered from the record, as a loaded result renders it.
        with open(self.gpu_profile_fn, "a+") as f:
            f.write(result.text())
        return result

    def clear_cache(self) -> None:
        """``gc.collect()``, then ``torch.cuda.empty_cache()`` when CUDA is in use."""
        gc.collect()
        if self.device != "cpu":
            torch.cuda.empty_cache()

    def get_tensor_usage(self) -> float:
        """MiB of the storages on the device, each once, their own bytes as the log's
        "Total Tensor Used Memory" (the original's method name)."""
        found = _core.tracker.TrackerCore(self.device).track(self._named(), "", False)
        return json.loads(found)["total_storage_bytes"] / 1024**2

    def get_allocate_usage(self) -> float:
        """MiB the allocator holds for tensors (``torch.cuda.memory_allocated``)."""
        if self.device == "cpu":
            return self.get_tensor_usage()
        return torch.cuda.memory_allocated(self.device) / 1024**2
