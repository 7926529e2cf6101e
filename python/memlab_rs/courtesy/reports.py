"""What a yield and a restore report: ``YieldReport``, ``RestoreReport`` (dataclasses of the
public API) and ``CourtesyRestoreError``; a region's pause and resume: ``RegionReport`` and
``CourtesyRegionError``. Their text is rendered in Rust
(``_core.courtesy.yield_text``/``restore_text``, ``src/courtesy/render/text.rs``) from the
report's fields, handed over once as JSON.

>>> print(RestoreReport(restored_storages=2, restored_bytes=2 << 20, seconds=0.001))
Courtesy: restored 2 storages, 2.00M, in 1.0 ms (2.1 GB/s); 0 still on the host
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from .. import _core


@dataclass
class YieldReport:
    """What a ``yield_memory()`` moved, and what stayed on the GPU and why."""

    moved_storages: int = 0
    moved_bytes: int = 0
    seconds: float = 0.0
    #: per device: ``torch.cuda.memory_allocated()`` after the yield (all of it unmoved)
    still_allocated: dict[str, int] = field(default_factory=dict)
    #: per device: bytes of tensors Python can see that could not be moved, and why
    unmovable: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    #: per device: allocated bytes no visible tensor accounts for (autograd's saved
    #: tensors, C++ buffers, other libraries using torch's allocator)
    invisible_bytes: dict[str, int] = field(default_factory=dict)
    #: per device: what the caching allocator still reserves after ``empty_cache()``
    reserved: dict[str, int] = field(default_factory=dict)
    #: per device: memory in use on the device by every process, from the driver
    device_used: dict[str, int | None] = field(default_factory=dict)
    message: str = ""
    #: why the walk that found the tensors may have missed some (None when it did not):
    #: a tensor it missed keeps its CUDA memory
    incomplete: str | None = None

    @property
    def gb_per_s(self) -> float:
        """Moved bytes per second, in GB/s."""
        return self.moved_bytes / self.seconds / 1e9 if self.seconds else 0.0

    def __str__(self) -> str:
        return str(_core.courtesy.yield_text(_dumps(self)))


@dataclass
class RestoreReport:
    """What a ``restore()`` brought back."""

    restored_storages: int = 0
    restored_bytes: int = 0
    seconds: float = 0.0
    remaining_storages: int = 0
    remaining_bytes: int = 0

    @property
    def gb_per_s(self) -> float:
        """Restored bytes per second, in GB/s."""
        return self.restored_bytes / self.seconds / 1e9 if self.seconds else 0.0

    def __str__(self) -> str:
        return str(_core.courtesy.restore_text(_dumps(self)))


class CourtesyRestoreError(RuntimeError):
    """``restore()`` could not bring everything back (the GPU is still too full). Every
    tensor is valid, on the GPU or on the host; call ``restore()`` again later."""

    def __init__(self, message: str, report: RestoreReport):
        super().__init__(message)
        self.report = report


@dataclass
class RegionReport:
    """What ``Courtesy.pause(tag)`` or ``Courtesy.resume(tag)`` did: the region segments
    whose physical memory was given back or mapped again, what was copied, how fast, and
    per device what the driver says is in use before and after and what remains."""

    #: "pause" or "resume"
    action: str = ""
    #: the tags asked for (empty: every region)
    tags: list[str] = field(default_factory=list)
    segments: int = 0
    #: bytes of physical memory given back (pause) or mapped again (resume)
    region_bytes: int = 0
    #: bytes copied to the host (pause) or back (resume)
    moved_bytes: int = 0
    #: region bytes a pause did not copy: the caching allocator's free blocks, and all of a
    #: region whose contents are disposable
    discarded_bytes: int = 0
    seconds: float = 0.0
    #: seconds and bytes of pinning host buffers inside this call (0 when ready ahead)
    pin_seconds: float = 0.0
    pinned_bytes: int = 0
    #: seconds in the driver's unmap and release (pause) or create and map (resume)
    map_seconds: float = 0.0
    #: per device: region bytes given back or mapped again
    per_device: dict[str, int] = field(default_factory=dict)
    #: bytes a resume could not map (they stay paused; call resume again)
    left_paused_bytes: int = 0
    #: per device: memory in use by every process (``torch.cuda.mem_get_info``)
    device_used_before: dict[str, int | None] = field(default_factory=dict)
    device_used_after: dict[str, int | None] = field(default_factory=dict)
    #: per device: (what, bytes) still on the device after the call
    remaining: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    #: what stopped the call early, if anything (what was done is in the figures)
    error: str | None = None

    @property
    def gb_per_s(self) -> float:
        """Moved bytes per second, in GB/s."""
        return self.moved_bytes / self.seconds / 1e9 if self.seconds else 0.0

    def __str__(self) -> str:
        return str(_core.courtesy.region_text(_dumps(self)))


class CourtesyRegionError(RuntimeError):
    """A region's pause or resume stopped early (the device had no room to map a paused
    segment again, the host none to pin a buffer). What was done is in ``report``; every
    segment is either paused or mapped, so calling it again later goes on."""

    def __init__(self, message: str, report: RegionReport):
        super().__init__(message)
        self.report = report


def _dumps(report: Any) -> str:
    """The report's fields as JSON text (what its Rust side reads)."""
    return json.dumps(dataclasses.asdict(report), allow_nan=False)
