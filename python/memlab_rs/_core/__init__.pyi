"""Type stubs for the Rust core, memlab_rs._core.

Every class and function the module registers (src/lib.rs) is here; tests/test_stub.py
compares the names with ``dir(memlab_rs._core)``.
"""

from collections.abc import Callable, Sequence
from typing import Any, SupportsIndex

from . import courtesy as courtesy
from . import doctor as doctor
from . import estimate as estimate
from . import line_profiler as line_profiler
from . import merged_tensor_report as merged_tensor_report
from . import monitor as monitor
from . import tensor_report as tensor_report
from . import test_memory as test_memory
from . import trace as trace
from . import tracker as tracker

# pyo3 lists every registered name (a stubtest check keeps this in step)
__all__ = [
    "LineReportView",
    "_CPU_PROBE_BYTES",
    "__version__",
    "_cpu_adopted",
    "_cpu_adopted_gone",
    "_cpu_allocated",
    "_cpu_freed",
    "_cpu_hook_slot_addresses",
    "_cpu_hook_slots",
    "_cpu_live",
    "_cpu_mode",
    "_cpu_start",
    "_cpu_stats",
    "_cpu_stop",
    "_cpu_table_has",
    "_cpu_trace_active",
    "_cpu_trace_mark",
    "_cpu_trace_set_tag",
    "_cpu_trace_start",
    "_cpu_trace_stop",
    "_cuda_direct_checks",
    "_cuda_direct_notice",
    "_cuda_direct_why_not",
    "_gc_callback",
    "_gc_watch_state",
    "_instances_of",
    "_interrupts",
    "_set_cpu_glue",
    "check_result_json",
    "driver_available",
    "driver_device_memory",
    "courtesy",
    "doctor",
    "estimate",
    "merged_tensor_report",
    "monitor",
    "parse_size",
    "readable_size",
    "line_profiler",
    "tensor_report",
    "test_memory",
    "trace",
    "tracker",
    "tracked_tensors",
]
__version__: str
_CPU_PROBE_BYTES: int

# size.rs
def parse_size(size: str | SupportsIndex) -> int:
    """The bytes of a size written as ``"512 MB"`` (powers of 1000), ``"1.5GiB"`` or
    ``"16M"`` (powers of 1024) or ``"1048576"`` (bytes), exactly; an int of bytes is taken
    as is. ValueError for a malformed size, TypeError for a value of another type."""

def readable_size(num_bytes: Any) -> str:
    """pytorch_memlab's size string: ``readable_size(4194304) == '4.00M'``."""

# stats/driver.rs
def driver_available() -> bool:
    """Whether the CUDA driver library could be loaded."""

def driver_device_memory(ordinal: int) -> tuple[int, int] | None:
    """(used, total) bytes on a device by all processes, or None; never creates a context."""

# gc_walk/
def tracked_tensors(
    held: Sequence[Any] = ..., resume: bool = ...
) -> tuple[list[Any], str, str | None]:
    """Every tensor the gc walk finds, the walk's strategy, and why it may be incomplete."""

def _interrupts(error: BaseException) -> bool:
    """Whether ``error``, caught where a failed read counts as unknown, interrupts instead
    (KeyboardInterrupt, MemoryError, what a Python signal handler raised) and must go on."""

def _instances_of(
    cls: type, held: Sequence[Any] = ..., resume: bool = ...
) -> tuple[list[Any], str, str | None]:
    """Every live instance of ``cls`` the gc walk finds (the walk without torch, for tests)."""

def _gc_callback(phase: str, info: dict[str, Any]) -> None:
    """The ``gc.callbacks`` entry that counts collections for the walk."""

def _gc_watch_state() -> tuple[int, int, bool]:
    """(collections under way, gen-0 and older collections seen since the last walk)."""

class LineReportView:
    """What a display shows of a line profile (its functions and columns), rendered as often
    as asked."""

    def __new__(cls, data: str, view: str) -> LineReportView: ...
    def render(self, format: str) -> str:
        """``"text"``, ``"html"``, ``"csv"`` or ``"json"`` (the data shown)."""
    def records(self) -> str:
        """The records as JSON: ``{"names": [...], "rows": [[...], ...]}``."""
    @property
    def columns(self) -> list[str]: ...
    @property
    def notices(self) -> list[str]: ...

# sources/cpu/
def _cpu_allocated(nbytes: int) -> None: ...
def _cpu_adopted(nbytes: int) -> None: ...
def _cpu_freed(nbytes: int) -> None: ...
def _cpu_live() -> tuple[int, int]: ...
def _set_cpu_glue(
    library: str | None,
    probe: Callable[[], bool],
    baseline: Callable[[], tuple[list[tuple[int, int]], list[Any]]],
    forget: Callable[[], None],
) -> None:
    """Register the CPU source's torch side: libc10.so's path, the probe, the baseline walk,
    and the fallback's reset."""

def _cpu_adopted_gone(address: int, nbytes: int) -> None: ...
def _cpu_table_has(address: int, nbytes: int) -> bool: ...
def _cpu_mode() -> str | None:
    """None (nobody counts CPU memory), "allocator", or "dispatch: <why>"."""

def _cpu_hook_slots() -> list[tuple[str, bool, bool]]:
    """libc10's GOT slots for posix_memalign and free: (name, in RELRO, holds our hook)."""

def _cpu_hook_slot_addresses() -> list[tuple[str, int, bool]]: ...
def _cpu_start() -> str:
    """Start counting CPU memory (shared, counted); returns the mode as ``_cpu_mode``."""

def _cpu_stop() -> None: ...
def _cpu_stats() -> list[tuple[str, int]]:
    """The CPU counters in ``torch.cuda.memory_stats()`` names."""

def _cpu_trace_start(max_entries: int) -> None:
    """Start recording CPU allocations and frees with their Python stacks (a ring buffer of
    ``max_entries`` entries); RuntimeError if one runs already or the allocator hook is not
    usable here."""

def _cpu_trace_stop() -> dict[str, Any]:
    """Stop the CPU trace: a snapshot dict in ``torch.cuda.memory._snapshot()``'s schema
    plus a ``"memlab_rs"`` key; RuntimeError if none runs."""

def _cpu_trace_set_tag(tag: str) -> None:
    """This thread's tag (``user_metadata``) for its CPU entries from now on; "" clears."""

def _cpu_trace_active() -> bool:
    """Whether a CPU trace is running."""

def _cpu_trace_mark() -> int:
    """How many entries the running CPU trace has taken so far, kept and dropped (a step's
    end, for the leak check); RuntimeError if none runs."""

def _cuda_direct_why_not(device: int) -> str | None: ...
def _cuda_direct_notice(device: int) -> str | None:
    """Why ``cuda:device`` went back to the binding after memory disagreed with torch."""

def _cuda_direct_checks(device: int) -> tuple[int, int, int]:
    """Checks against the binding in this process: (compared, mismatched, inconclusive)."""

# saved_json.rs
def check_result_json(text: bytes) -> None:
    """Check a result file's JSON text (UTF-8 bytes) before parsing it: a ValueError saying
    what no result holds (nesting past 64 levels, a number of more than 32 characters, NaN,
    Infinity, an infinite float) and at which byte."""

# A measurement: (device, peak bytes, bytes at the call's start, limit bytes or None,
# rows as (location, bytes, count), notices).
