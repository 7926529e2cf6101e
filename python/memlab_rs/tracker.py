"""MemTracker: which tensors appeared and vanished between two calls, at the caller's line.

A drop-in for Pytorch-Memory-Utils' ``gpu_mem_track.MemTracker`` (same arguments, log file
and layout) with exact numbers: storage bytes as the allocator holds them, each storage
once, views not counted twice. From the second call on, the gc walk resumes from the last
one (``memlab_rs._core.TrackerCore``), so a call costs about what changed.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import torch

from . import _core, _torch, results

DeviceLike = Union[torch.device, str, int]


@dataclass(frozen=True)
class TrackRow:
    """One ``+``/``-`` line: tensors of one (type, shape, dtype) that appeared or vanished."""

    sign: str
    count: int
    shape: str
    dtype: str
    #: Bytes the allocator holds for the storages that appeared (or vanished) with them,
    #: each storage once: on CUDA each rounded up to the caching allocator's 512-byte blocks,
    #: on the CPU their own bytes.
    bytes: int
    #: The storages' own bytes (``nbytes()``), each once: what the log prints, as the
    #: original counts a tensor (numel times the element size).
    storage_bytes: int
    #: ``str(type(tensor))``, e.g. ``<class 'torch.nn.parameter.Parameter'>``.
    type: str
    #: The model's names of the tensors that appeared (or vanished), when a model is given.
    names: tuple[str, ...] = ()
    #: The row as written to the log.
    line: str = ""


@dataclass(frozen=True)
class TrackResult(results.SavedResult):
    """What one ``track()`` found: the diff rows and the totals, plain data.

    ``text()`` is the block ``track()`` appended to the log (rendered from this record),
    ``html()`` a table (Jupyter shows it); ``save(path)`` writes a ``tracker`` result file
    that ``memlab_rs.load`` reads back, rendering the same.

    >>> import os, tempfile, torch, memlab_rs
    >>> tracker = memlab_rs.MemTracker(path=tempfile.mkdtemp() + "/", device="cpu")
    >>> _ = tracker.track()
    >>> x = torch.zeros(256, 1024)
    >>> result = tracker.track()
    >>> path = os.path.join(tempfile.mkdtemp(), "track.json")
    >>> result.save(path)
    >>> memlab_rs.load(path).text() == result.text()
    True
    """

    kind: ClassVar[str] = "tracker"

    rows: list[TrackRow]
    #: Bytes the allocator holds for every storage on the device, each once (CUDA: in
    #: 512-byte blocks).
    total_bytes: int
    #: The own bytes of every storage on the device, each once: the log's "Total Tensor Used
    #: Memory".
    total_storage_bytes: int
    #: ``torch.cuda.memory_allocated(device)``; on CPU the same as ``total_bytes``.
    allocated_bytes: int
    #: Live tensors on the device.
    tensors: int
    #: Where ``track()`` was called: ``file line N: function``.
    where: str
    #: How the gc walk found them (``..., since the last walk`` when it resumed).
    strategy: str
    #: Why the result may miss tensors, or None.
    incomplete: str | None
    seconds: dict[str, float] = field(default_factory=dict)
    #: Whether the log lists the rows (the tracker's ``detail``).
    detail: bool = True
    #: The log's header time stamp, on the first ``track()`` only (its block starts with
    #: the header line).
    stamp: str | None = None
    #: Where and when it was made (``results.run_meta``: device, rank, versions, time).
    meta: dict[str, Any] = field(default_factory=lambda: results.run_meta(None), compare=False)

    @property
    def device(self) -> str | None:
        """The device tracked (``"cuda:0"``, ``"cpu"``)."""
        return self.meta.get("device")

    def _row_dicts(self) -> list[dict[str, Any]]:
        return [
            {
                "sign": r.sign,
                "count": r.count,
                "shape": r.shape,
                "dtype": r.dtype,
                "bytes": r.bytes,
                "storage_bytes": r.storage_bytes,
                "type": r.type,
                "names": list(r.names),
            }
            for r in self.rows
        ]

    def text(self) -> str:
        """The log block of this ``track()``, as written to the log file (the header line
        first on the first call, the note when the result may be incomplete)."""
        text = _core.render_tracker_block(
            self._row_dicts(),
            self.detail,
            self.where,
            self.total_storage_bytes,
            self.allocated_bytes,
            self.stamp,
        )
        if self.incomplete:
            text += f"Note: {self.incomplete}\n\n"
        return text

    def html(self) -> str:
        """The diff as a self-contained HTML table (Jupyter shows it): each row's storage
        bytes (what the log prints) beside the allocator's bytes for them."""
        return _core._tracker_html(
            self._row_dicts(),
            self.where,
            self.total_storage_bytes,
            self.total_bytes,
            self.allocated_bytes,
            self.incomplete,
        )

    def to_data(self) -> dict[str, Any]:
        """The result as JSON values (a saved file's ``data``)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del data["meta"]
        data["rows"] = [{**row, "line": r.line} for row, r in zip(self._row_dicts(), self.rows)]
        data["seconds"] = dict(self.seconds)
        return data

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> TrackResult:
        """The result from a saved file's ``data`` and ``meta`` (checked by ``load``
        against ``_result_schema.TRACKER``)."""
        rows = [
            TrackRow(
                sign=r["sign"],
                count=r["count"],
                shape=r["shape"],
                dtype=r["dtype"],
                bytes=r["bytes"],
                # files saved before the storage's own bytes were kept: the allocator's
                storage_bytes=r.get("storage_bytes", r["bytes"]),
                type=r["type"],
                names=tuple(r["names"]),
                line=r["line"],
            )
            for r in data["rows"]
        ]
        return cls(
            rows=rows,
            total_bytes=data["total_bytes"],
            total_storage_bytes=data.get("total_storage_bytes", data["total_bytes"]),
            allocated_bytes=data["allocated_bytes"],
            tensors=data["tensors"],
            where=data["where"],
            strategy=data["strategy"],
            incomplete=data["incomplete"],
            seconds={k: float(v) for k, v in data["seconds"].items()},
            detail=data["detail"],
            stamp=data["stamp"],
            meta=meta,
        )


results.register("tracker", TrackResult.from_data)


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
        self._core = _core.TrackerCore(self.device)

    def _named(self) -> list[tuple[torch.Tensor, str]]:
        model = self._model() if self._model is not None else None
        if model is None:
            return []
        named = list(_torch.module_tensor_names(model))
        grads = [(t.grad, f"{name}.grad") for t, name in named if t.grad is not None]
        return named + grads

    def _allocated(self, total: int) -> int:
        if self.device == "cpu":
            return total
        return int(torch.cuda.memory_allocated(self.device))

    def track(self) -> TrackResult:
        """Append what changed since the last call to the log, and return it."""
        frame = sys._getframe(1)
        where = f"{frame.f_code.co_filename} line {frame.f_lineno}: {frame.f_code.co_name}"
        del frame
        named = self._named()
        found = self._core.track(named)
        del named
        allocated = self._allocated(found["total_bytes"])
        stamp = None
        if self.begin:
            stamp = f"{datetime.datetime.now():%d-%b-%y-%H:%M:%S}"
            self.begin = False
        rows = [
            TrackRow(
                sign=r["sign"],
                count=r["count"],
                shape=r["shape"],
                dtype=r["dtype"],
                bytes=r["bytes"],
                storage_bytes=r["storage_bytes"],
                type=r["type"],
                names=tuple(r["names"]),
                line=r["line"],
            )
            for r in found["rows"]
        ]
        result = TrackResult(
            rows=rows,
            total_bytes=found["total_bytes"],
            total_storage_bytes=found["total_storage_bytes"],
            allocated_bytes=allocated,
            tensors=found["tensors"],
            where=where,
            strategy=found["strategy"],
            incomplete=found["incomplete"],
            seconds={"walk": found["walk_s"], "facts": found["facts_s"]},
            detail=self.print_detail,
            stamp=stamp,
            meta=results.run_meta(self.device),
        )
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
        found = _core.TrackerCore(self.device).track(self._named())
        return found["total_storage_bytes"] / 1024**2

    def get_allocate_usage(self) -> float:
        """MiB the allocator holds for tensors (``torch.cuda.memory_allocated``)."""
        if self.device == "cpu":
            return self.get_tensor_usage()
        return torch.cuda.memory_allocated(self.device) / 1024**2
