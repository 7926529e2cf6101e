"""`_core.line_profiler`: the line profiler's collector and interpreter hooks, and its results
(line profiles, merged profiles, diffs) checked, viewed and rendered from their JSON text."""

import types
from collections.abc import Callable, Sequence
from typing import Any, final

__all__ = [
    "DEFAULT_COLUMNS",
    "LineCollector",
    "ThreadTracer",
    "_fork_child",
    "_fork_parent",
    "_fork_prepare",
    "_hook_errors",
    "_line_engine_table",
    "_monitoring_on_leave",
    "_monitoring_on_line",
    "_monitoring_on_resume",
    "_monitoring_on_start",
    "_monitoring_on_throw",
    "_run_inside_engine",
    "_set_cpu_tracking",
    "_trace_new_thread",
    "catalogue",
    "check_columns",
    "diff",
    "diff_render",
    "merge",
    "merged_records",
    "merged_render",
    "merged_validate",
    "records",
    "render",
    "validate",
]

DEFAULT_COLUMNS: tuple[str, ...]

# results: each crosses as the JSON text of its data
def validate(data: str) -> str:
    """A line profile's data as its derive reads it (a ValueError naming the field that does
    not fit), in canonical form."""

def render(data: str, format: str, view: str) -> str:
    """A line profile as ``"text"``, ``"html"``, ``"csv"`` or ``"json"`` with the view (a JSON
    object: ``func``, ``columns``, ``device``) applied."""

def records(data: str, view: str) -> str:
    """A line profile's records with the view applied: ``{"names": [...], "rows": [...]}``."""

def merge(profiles: Sequence[str], ranks: Sequence[int], world_size: int) -> str:
    """One line profile's data per rank, ordered by rank: the merged profile's data."""

def merged_validate(data: str) -> str:
    """A merged line profile's data as its derive reads it, in canonical form."""

def merged_render(data: str, format: str, view: str) -> str:
    """A merged line profile as ``"text"``, ``"html"``, ``"csv"`` or ``"json"``."""

def merged_records(data: str, view: str) -> str:
    """A merged line profile's records with the view applied."""

def diff(a: str, b: str, names: Sequence[str], view: str) -> str:
    """What changed from line profile ``a`` to ``b``: the diff's data (kind, names, rows,
    totals)."""

def diff_render(diff: str, format: str) -> str:
    """A line-profile diff as ``"text"``."""

def catalogue(device: str) -> list[str]:
    """The columns the source of ``device`` (``"cpu"`` or ``"cuda:N"``) can have."""

def check_columns(columns: Sequence[str], device: str, known: Sequence[str] = ...) -> None:
    """A ValueError naming the first unknown column, the closest valid one and every valid
    one."""

# the collector
@final
class LineCollector:
    """The Rust side of one ``LineProfiler``: its code objects, rows and memory source."""

    def __new__(cls, device: str) -> LineCollector: ...
    def add_code(self, code: types.CodeType, qualname: str) -> bool: ...
    def enable(self) -> None: ...
    def disable(self) -> None: ...
    def clear(self) -> None: ...
    def set_device(self, device: str) -> None: ...
    @property
    def device(self) -> str: ...
    @property
    def stats_reader(self) -> str | None: ...
    @property
    def enabled(self) -> bool: ...
    def codes(self) -> list[types.CodeType]: ...
    def column_names(self) -> list[str]: ...
    def session_peaks(self) -> list[tuple[str, int]]: ...
    def result(
        self,
        selected: Sequence[int],
        sources: Sequence[tuple[int, list[str]] | None],
        asked: Sequence[str] = ...,
        extra: dict[str, list[dict[int, int]]] | None = None,
    ) -> str:
        """The line profile of the selected functions, as its data's JSON text."""

def _set_cpu_tracking(
    start: Callable[[int], None], stop: Callable[[], None], retire: Callable[[int], None]
) -> None:
    """Tell the engine how the CPU source starts, stops and retires tracking."""

def _hook_errors() -> list[str]: ...
def _run_inside_engine(callback: Callable[[], Any]) -> None:
    """Run ``callback`` with the line profiler's engine held (for tests)."""

def _line_engine_table() -> tuple[int, int]:
    """The line profiler engine's collector table: (slots, collectors alive in them), once
    queued drops are retired (for tests)."""

def _fork_prepare() -> None: ...
def _fork_parent() -> None: ...
def _fork_child() -> None: ...

# the interpreter hooks
@final
class ThreadTracer:
    """The trace object of a profiled thread on 3.9-3.11 (what ``sys.gettrace()`` returns);
    put back with ``sys.settrace``, it puts the profiler's tracer back."""

    def __call__(self, frame: Any, event: str, arg: Any) -> None: ...

def _monitoring_on_start(code: types.CodeType, _offset: int) -> None: ...
def _monitoring_on_resume(code: types.CodeType, offset: int) -> None: ...
def _monitoring_on_line(code: types.CodeType, line: int) -> None: ...
def _monitoring_on_leave(code: types.CodeType, _offset: int, _value: object) -> None: ...
def _monitoring_on_throw(code: types.CodeType, offset: int, _error: object) -> None: ...
def _trace_new_thread(frame: types.FrameType, _event: str, _arg: object) -> None: ...
