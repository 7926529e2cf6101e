"""Type stubs for the Rust core, memlab_rs._core.

Every class and function the module registers (src/lib.rs) is here; tests/test_stub.py
compares the names with ``dir(memlab_rs._core)``.
"""

from collections.abc import Callable, Sequence
from typing import Any, SupportsIndex, final

from . import line_profiler as line_profiler
from . import merged_tensor_report as merged_tensor_report
from . import tensor_report as tensor_report
from . import test_memory as test_memory
from . import trace as trace
from . import tracker as tracker

# pyo3 lists every registered name (a stubtest check keeps this in step)
__all__ = [
    "GradientLog",
    "GradientNodeHook",
    "HostBook",
    "LineReportView",
    "MonitorRowNames",
    "MonitorSource",
    "MonitorTensors",
    "SavedHeld",
    "SavedTensorHooks",
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
    "_cpu_trace_set_tag",
    "_cpu_trace_start",
    "_cpu_trace_stop",
    "_cuda_direct_checks",
    "_cuda_direct_notice",
    "_cuda_direct_why_not",
    "_estimate_html",
    "_estimate_replay",
    "_estimate_text",
    "_gc_callback",
    "_gc_watch_state",
    "_instances_of",
    "_monitor_csv_header",
    "_monitor_csv_row",
    "_monitor_data_ptrs",
    "_monitor_html",
    "_monitor_iteration",
    "_monitor_state_ids",
    "_monitor_text",
    "_set_cpu_glue",
    "check_result_json",
    "driver_available",
    "driver_device_memory",
    "merged_tensor_report",
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

# estimate/ and render/estimate_*.rs
def _estimate_replay(
    device_type: str,
    recorded: Sequence[tuple[int, int, int]],
    categories: Sequence[int],
    n_categories: int,
    n_phases: int,
) -> dict[str, Any]:
    """Replay a recorded step's (op, id, bytes) events through the allocator model."""

def _estimate_text(model: str, lines: Sequence[tuple[str, int, str]], notes: Sequence[str]) -> str:
    """An estimate's figures in Pytorch-Memory-Utils' ``modelsize`` style."""

def _estimate_html(model: str, lines: Sequence[tuple[str, int, str]], notes: Sequence[str]) -> str:
    """An estimate's figures as an HTML table."""

# courtesy.rs
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

# The training monitor (src/monitor/, src/render/monitor_*.rs)
@final
class MonitorSource:
    """Allocated/reserved bytes of one device ("cpu" or "cuda:N"), peaks reset per read."""
    def __init__(self, device: str) -> None: ...
    def read(self) -> tuple[int, int, int, int, list[int]]:
        """(allocated, peak allocated, reserved, peak reserved, counts: allocations and frees
        since the last read, live blocks, requested bytes, those the source has); then
        resets the peaks."""
    def reader(self) -> str: ...
    def notice(self) -> str | None: ...

@final
class SavedHeld:
    """What autograd holds for one tensor saved under the monitor's hooks."""

@final
class SavedTensorHooks:
    """The monitor's saved-tensor pack/unpack pair and the weak log of what it saved."""
    def __init__(self, tensor_type: type, modules: list[str] | None = None) -> None: ...
    def chain(self, outer: tuple[Callable[..., Any], Callable[..., Any]] | None = None) -> None:
        """Chain ``outer`` under this pair from now on (called just before it is pushed)."""
    def pack(self, t: Any) -> SavedHeld: ...
    def unpack(self, held: SavedHeld) -> Any: ...
    def stop(self) -> None: ...
    def __len__(self) -> int: ...

@final
class MonitorTensors:
    """The monitor's known tensors on one device (-1: CPU), read at each boundary."""
    def __init__(self, device: int) -> None: ...
    def set_model(
        self,
        params: Sequence[tuple[Any, int]],
        rows: int,
        param_ptrs: set[int],
        buffer_ptrs: set[int],
    ) -> None: ...
    def set_state(self, ptrs: set[int]) -> None: ...
    def gradients(self) -> tuple[int, list[int]]: ...
    def known_storages(self) -> set[int]: ...
    def activations(self, hooks: SavedTensorHooks) -> int: ...
    def activations_by_module(
        self, hooks: SavedTensorHooks, outside: str
    ) -> list[tuple[str, int]]: ...

@final
class GradientLog:
    """The intermediate gradients of a backward on one device (-1: CPU): hooks on the
    graph's nodes log what each receives and returns, weakly."""
    def __init__(self, device: int) -> None: ...
    def watch(self, roots: Sequence[Any]) -> list[Any]:
        """A post-hook on every node reachable from ``roots`` but AccumulateGrad; the
        handles, for the caller to remove."""
    def peak(self) -> int:
        """The most bytes of gradients that never became a leaf's, alive at once."""
    def close(self) -> None:
        """Stop logging; give torch's weak references to the storages back."""
    @property
    def incomplete(self) -> bool: ...
    @property
    def samples(self) -> int: ...

@final
class GradientNodeHook:
    """One node's post-hook (torch calls it with what the node returned and received)."""
    def __call__(self, grad_inputs: Any, grad_outputs: Any) -> None: ...

def _monitor_state_ids(state: Any) -> list[int]:
    """The identities of an optimizer's state values (a dict of dicts), in order."""
def _monitor_data_ptrs(tensors: Sequence[Any]) -> list[int]: ...
def _monitor_iteration(
    windows: Sequence[tuple[str, Sequence[int], Sequence[int], int]],
) -> tuple[int, list[int], bool] | None:
    """(peak window, categories, inexact) of an iteration."""

@final
class MonitorRowNames:
    """The monitor's parameter row names, held once for the renderers."""
    def __init__(self, names: Sequence[str]) -> None: ...
    def __len__(self) -> int: ...
    @property
    def names(self) -> list[str]: ...

def _monitor_text(
    figures: tuple[int, int, int, int, int | None, int | None, int | None],
    modules: Sequence[tuple[str, int]],
    names: MonitorRowNames,
    bytes: Sequence[int],
    grads: Sequence[int],
    notice: str | None = None,
) -> str: ...
def _monitor_csv_header(names: Sequence[str]) -> str: ...
def _monitor_csv_row(
    figures: tuple[int, int, int, int, int | None, int | None, int | None],
    names: MonitorRowNames,
    bytes: Sequence[int],
    grads: Sequence[int],
) -> str: ...
def _monitor_html(
    title: str, names: Sequence[str], labels: Sequence[str], values: Sequence[Sequence[int]]
) -> str: ...

# A measurement: (device, peak bytes, bytes at the call's start, limit bytes or None,
# rows as (location, bytes, count), notices).


