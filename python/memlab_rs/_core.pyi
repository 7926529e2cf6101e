"""Type stubs for the Rust core, memlab_rs._core."""

from collections.abc import Sequence
from typing import Any

import numpy as np

def readable_size(num_bytes: Any) -> str:
    """pytorch_memlab's size string: ``readable_size(4194304) == '4.00M'``."""

def driver_available() -> bool:
    """Whether the CUDA driver library could be loaded."""

def driver_device_memory(ordinal: int) -> tuple[int, int] | None:
    """(used, total) bytes on a device by all processes, or None; never creates a context."""

def collect_report(named: Sequence[tuple[Any, str]], pre_collect: bool = False) -> ReportTable:
    """Walk gc and build a report of every tensor Python can reach."""

def tracked_tensors(held: Sequence[Any] = ()) -> tuple[list[Any], str]:
    """Every tensor the gc walk finds, and the walk's strategy (for tests)."""

class ReportTable:
    def with_cuda(
        self,
        device: str,
        allocated: int,
        requested: int | None = None,
        reserved: int | None = None,
    ) -> ReportTable: ...
    def view(
        self,
        devices: Sequence[str] | None = None,
        sort_by: str | None = None,
        top: int | None = None,
    ) -> ReportTable: ...
    def devices(self) -> list[str]: ...
    def text(self, verbose: bool = False) -> str: ...
    def html(self) -> str: ...
    def json(self) -> str: ...
    def sections(self) -> list[dict[str, Any]]: ...
    def columns(self) -> dict[str, list[Any] | np.ndarray]: ...

# --- line profiler: hooks, engine and CPU source (issue 9) ---

class ThreadTracer:
    """The trace object of a profiled thread on 3.9-3.11 (what ``sys.gettrace()`` returns);
    put back with ``sys.settrace``, it puts the profiler's tracer back."""

    def __call__(self, frame: Any, event: str, arg: Any) -> None: ...

def _run_inside_engine(callback: Any) -> None:
    """Run ``callback`` with the line profiler's engine held (for tests)."""

def _set_cpu_tracking(start: Any, stop: Any, retire: Any) -> None:
    """Tell the core how the CPU source starts, stops and retires tracking."""

def _fork_prepare() -> None: ...
def _fork_parent() -> None: ...
def _fork_child() -> None: ...
