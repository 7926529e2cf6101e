"""The peak tracer's module-level functions (``start_tracing``, ``stop_tracing``,
``report_stats``, ``switch_allocator``): one recording at a time, kept here between calls."""

from __future__ import annotations

from typing import Any

from .result import TraceResult
from .tracer import DEFAULT_MAX_ENTRIES, Tracer

_global: Tracer | None = None
_last: TraceResult | None = None


def switch_allocator() -> None:
    """Kept for the peak tracer's users: a no-op. memlab_rs reads torch's own allocation
    history, so the caching allocator stays in place."""


def start_tracing(device: Any = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
    """Start recording (the peak tracer's name for ``Tracer().start()``)."""
    global _global
    if _global is not None:
        raise RuntimeError("tracing is already on; call stop_tracing() first")
    _global = Tracer(device=device, max_entries=max_entries).start()


def stop_tracing() -> TraceResult:
    """Stop recording and keep the result for ``report_stats()``."""
    global _global, _last
    if _global is None:
        raise RuntimeError("tracing is not on; call start_tracing() first")
    tracer, _global = _global, None
    _last = tracer.stop()
    return _last


def report_stats() -> None:
    """Print ``Max mem``, ``Total mem allocated`` and the rows of the last traced region."""
    if _last is None:
        raise RuntimeError("nothing traced yet: start_tracing(), run, stop_tracing()")
    _last.report_stats()
