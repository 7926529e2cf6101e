"""`_core.courtesy`: Courtesy's host book (where each yielded storage sits in the pinned
buffers), its regions (the allocator torch calls for a region's segments, pause and
resume) and its reports' text."""

from collections.abc import Sequence
from typing import final

__all__ = [
    "REGION_FREE",
    "REGION_MALLOC_PREFIX",
    "REGION_SLOTS",
    "HostBook",
    "region_close",
    "region_configure",
    "region_counters",
    "region_owner",
    "region_pause",
    "region_release_host",
    "region_resume",
    "region_slot",
    "region_state",
    "region_text",
    "restore_text",
    "yield_text",
]

#: The allocation function of region slot N is REGION_MALLOC_PREFIX + str(N).
REGION_MALLOC_PREFIX: str
REGION_FREE: str
REGION_SLOTS: int

@final
class HostBook:
    """Courtesy's host side: pinned buffers and where each moved storage sits."""

    def __new__(cls) -> HostBook: ...
    def place(
        self, storages: Sequence[tuple[int, int]]
    ) -> tuple[int, int, list[tuple[int, int]]]: ...
    def pending(self) -> list[tuple[int, int, int, int, int]]: ...
    def restored(self, records: Sequence[int]) -> None: ...
    def gone(self, records: Sequence[int]) -> None: ...
    def on_host(self) -> tuple[int, int]: ...
    def buffers(self) -> list[int]: ...
    def free_buffers(self) -> list[int]: ...
    def release_free(self) -> list[int]: ...

def yield_text(report: str) -> str:
    """A yield's report (``YieldReport``'s fields as JSON) as ``str()`` gives it."""

def restore_text(report: str) -> str:
    """A restore's report (``RestoreReport``'s fields as JSON) as ``str()`` gives it."""

def region_text(report: str) -> str:
    """A region's pause or resume report (``RegionReport``'s fields as JSON) as text."""

def region_configure(tag: str, keep_contents: bool, prepare_host: bool) -> None:
    """How ``tag``'s segments are paused."""

def region_slot(tag: str) -> int | None:
    """The allocation function slot of ``tag`` (a free one if it has none); None when all
    are taken."""

def region_pause(
    tags: Sequence[str], live: Sequence[tuple[int, int]], join_gap: int = ...
) -> str:
    """Pause ``tags`` (all when empty), copying the live ``(address, length)`` ranges (gaps
    shorter than ``join_gap`` bytes copied with them); the report as JSON."""

def region_resume(tags: Sequence[str]) -> str:
    """Resume ``tags`` (all when empty); the report as JSON."""

def region_state() -> str:
    """Per (tag, device): segments, mapped, paused and host bytes, ranges; as JSON."""

def region_owner(address: int) -> str | None:
    """The tag of the region segment holding ``address``, or None."""

def region_release_host(tags: Sequence[str]) -> int:
    """Free the pinned host buffers of ``tags`` that hold nothing paused, and the spare
    ones; the bytes freed."""

def region_close(tag: str) -> bool:
    """``tag``'s region closes: its settings and slot go now if it has no segment left, else
    with its last one (whose host buffers are then freed); whether it is gone."""

def region_counters() -> tuple[float, int, int]:
    """(seconds, bytes) the background thread spent pinning host buffers, and frees of
    addresses no region gave out."""
