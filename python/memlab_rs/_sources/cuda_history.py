"""torch's CUDA allocation history: turning it on and off, and getting it out cheaply.

Everything here is a private torch API (``torch.cuda.memory._record_memory_history``,
``_snapshot``, ``torch._C._cuda_*``); the differences between torch versions are kept here.
Nothing here initialises CUDA by itself: the tracer calls it only for CUDA recordings.
"""

from __future__ import annotations

import sys
import time
import types
import uuid
from typing import Any

import torch


def history_enabled() -> bool:
    """Whether the allocator records history now (someone else may have turned it on).
    Never before CUDA is initialised: torch 2.11 segfaults asking then (and turning the
    history on initialises CUDA, so it is off)."""
    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if probe is None or not torch.cuda.is_initialized():
        return False
    return bool(probe())


def ensure_initialised() -> None:
    """Initialise CUDA: the allocator's history and snapshot calls assume it (a snapshot
    taken before any CUDA call crashes in torch 2.11). Tracing CUDA asked for it."""
    torch.cuda.init()


def enable(max_entries: int) -> None:
    """Record every alloc and free with its Python stack (torch's cheapest useful setting:
    about 2 us per allocation)."""
    torch.cuda.memory._record_memory_history(
        "all", context="alloc", stacks="python", max_entries=max_entries
    )


def disable() -> None:
    torch.cuda.memory._record_memory_history(None)


def _get_metadata() -> str:
    getter = getattr(torch._C, "_cuda_getMemoryMetadata", None)
    return getter() if getter is not None else ""


def metadata_supported() -> bool:
    """Whether ``_set_memory_metadata`` tags history entries (torch 2.10+, native allocator)."""
    if not hasattr(torch.cuda.memory, "_set_memory_metadata"):
        return False
    check = getattr(torch.cuda.memory, "_memory_metadata_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return False


def segments_now() -> list[dict[str, Any]]:
    """The allocator's layout without its history (well under a millisecond where torch can
    leave the history out, 2.11+). Taking it leaves a ``snapshot`` entry in the history."""
    try:
        return torch._C._cuda_memorySnapshot((0, 0, False))["segments"]
    except (TypeError, RuntimeError):
        return torch.cuda.memory.memory_snapshot()


def start_layout() -> dict[str, Any]:
    """The layout when recording begins, and how to find that moment in the history: the
    snapshot entry taking it leaves, tagged with a unique marker where torch can tag entries,
    else the first snapshot entry after ``time_us``."""
    start: dict[str, Any] = {"time_us": time.time_ns() // 1000 - 1000}
    if metadata_supported():
        marker = f"memlab_rs-start-{uuid.uuid4().hex}"
        before = _get_metadata()
        torch.cuda.memory._set_memory_metadata(marker)
        try:
            start["segments"] = segments_now()
        finally:
            torch.cuda.memory._set_memory_metadata(before)
        start["marker"] = marker
    else:
        start["segments"] = segments_now()
    return start


def mark(marker: str) -> None:
    """Leave a ``snapshot`` entry in the history now, tagged ``marker`` where torch can tag
    entries (``metadata_supported``): where a step ends, for the leak check, found again in
    the history by that tag (else as the snapshot entries in order). Cheap where torch can
    leave the history out of a snapshot (2.11+; ``segments_now``)."""
    if metadata_supported():
        before = _get_metadata()
        torch.cuda.memory._set_memory_metadata(marker)
        try:
            segments_now()
        finally:
            torch.cuda.memory._set_memory_metadata(before)
    else:
        segments_now()


class _NoInductor(types.SimpleNamespace):
    """Stands in for ``torch._inductor`` while torch symbolises frames (see `snapshot`)."""


def snapshot() -> dict[str, Any]:
    """``torch.cuda.memory._snapshot()`` without its first-call cost.

    Symbolising frames asks ``hasattr(torch, "_inductor")``, and torch's lazy attribute
    import then loads inductor: seconds on the first call. When inductor is not loaded, no
    frame can come from inductor's generated code, so a stand-in without ``codecache``
    answers the question for the duration of the call; inductor imported meanwhile by another
    thread replaces it and is left alone.
    """
    if "torch._inductor" in sys.modules:
        return torch.cuda.memory._snapshot()
    stand_in = _NoInductor()
    torch._inductor = stand_in  # type: ignore[assignment]
    try:
        return torch.cuda.memory._snapshot()
    finally:
        if getattr(torch, "_inductor", None) is stand_in:
            del torch._inductor
