"""Line-by-line memory profiling: pytorch_memlab's ``LineProfiler``, exact and cheap.

Only the functions you register are watched (``sys.monitoring`` local events on Python
3.12+, a C trace function below), state is kept per frame (recursion, generators,
threads and exceptions are attributed to the right line), and each line costs one read of
the allocator's statistics.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import torch

from . import _core, _cpu_source  # noqa: F401  (_cpu_source registers the CPU hooks)
from ._torch import checked_cuda_device, line_profiler_device

DEFAULT_COLUMNS = ("active_bytes.all.peak", "reserved_bytes.all.peak")


def _code_of(func: Any) -> tuple[types.CodeType, Callable[..., Any]]:
    """The code object to watch for ``func``, and the function it belongs to."""
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    if isinstance(func, torch.nn.Module):
        func = type(func).forward
    if inspect.ismethod(func):
        func = func.__func__
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if not isinstance(code, types.CodeType):
        raise TypeError(
            f"LineProfiler profiles Python functions and methods; {func!r} has no Python code "
            "object (builtins and C extensions cannot be profiled line by line)"
        )
    return code, func


def _columns(columns: Any) -> tuple[str, ...]:
    if isinstance(columns, str):
        columns = (columns,)
    columns = tuple(columns)
    bad = [c for c in columns if not isinstance(c, str)]
    if bad:
        raise TypeError(f"columns must be names of memory statistics (strings), got {bad!r}")
    return columns


class LineRecordsDisplay:
    """A line report: ``str()``/``repr()`` give pytorch_memlab's text, Jupyter shows HTML.

    >>> shown = LineProfiler().display()
    >>> str(shown)
    'No data collected\\n'
    """

    def __init__(self, view: _core.LineReportView):
        self._view = view

    def __repr__(self) -> str:
        return self._view.text()

    __str__ = __repr__

    def _repr_html_(self) -> str:
        return self._view.html()

    @property
    def columns(self) -> list[str]:
        """The columns shown."""
        return self._view.columns

    @property
    def notices(self) -> list[str]:
        """Why the numbers may be incomplete, one line each (events dropped, errors met,
        threads whose tracer was replaced); empty when there is nothing to say. The text and
        HTML print them under the tables.

        >>> LineProfiler().display().notices
        []
        """
        return self._view.notices

    def records(self) -> list[dict[str, Any]]:
        """One dict per source line: function, line, hits, code and each column's value.

        Values are None for lines that never ran.
        """
        out = []
        for qualname, line, hits, code, values in self._view.records():
            record = {"function": qualname, "line": line, "hits": hits, "code": code}
            for column, value in zip(self.columns, values or [None] * len(self.columns)):
                record[column] = value
            out.append(record)
        return out

    def to_dataframe(self):
        """The records as a pandas DataFrame (needs the ``pandas`` extra); the notices are in
        its ``attrs["notices"]``."""
        import pandas as pd

        frame = pd.DataFrame(self.records())
        frame.attrs["notices"] = self.notices
        return frame


class LineProfiler:
    """Profile the memory of each line of the given functions.

    ``device`` picks the memory to read: ``"cuda"`` (the caching allocator of
    ``target_gpu``), ``"cuda:N"``, or ``"cpu"`` (live CPU tensor storages). The default is
    CUDA when it is available, else CPU.

    >>> import torch
    >>> def make():
    ...     x = torch.empty(256, 1024)
    ...     return x
    >>> with LineProfiler(make, device="cpu") as lp:
    ...     _ = make()
    >>> lp.display(columns=["allocated_bytes.all.allocated"]).records()[1]["code"]
    '    x = torch.empty(256, 1024)'
    """

    def __init__(self, *functions: Callable[..., Any], target_gpu: Any = 0, device: Any = None):
        self._target_gpu = _gpu_index(target_gpu)
        self._collector = _core.LineCollector(line_profiler_device(device, self._target_gpu))
        self._functions: dict[types.CodeType, Callable[..., Any]] = {}
        self._names: dict[types.CodeType, str] = {}
        for func in functions:
            self.add_function(func)

    @property
    def device(self) -> str:
        """The memory being read: ``"cuda:N"`` or ``"cpu"``."""
        return self._collector.device

    @property
    def enabled(self) -> bool:
        """Whether the profiler is recording (between ``enable()`` and ``disable()``)."""
        return self._collector.enabled

    @property
    def stats_reader(self) -> str | None:
        """How statistics are read while enabled (None when disabled).

        ``"allocator memory"``: CUDA statistics read from the caching allocator's own
        fields, located once and checked against torch whenever a segment comes or goes;
        ``"torch._C._cuda_memoryStats"``: the binding, on every line (set
        ``MEMLAB_RS_CUDA_STATS=binding`` to force it); ``"storage counts"``: CPU.
        """
        return self._collector.stats_reader

    @property
    def target_gpu(self) -> int:
        """The GPU read when profiling CUDA; setting it switches at once, even mid-run."""
        return self._target_gpu

    @target_gpu.setter
    def target_gpu(self, gpu: Any) -> None:
        index = _gpu_index(gpu)
        if self.device != "cpu":
            self._collector.set_device(checked_cuda_device(index))
        self._target_gpu = index

    def add_function(self, func: Callable[..., Any]) -> None:
        """Profile ``func`` too: a function, method, ``nn.Module`` (its ``forward``), or a
        decorated function (the one it wraps)."""
        code, func = _code_of(func)
        self._functions.setdefault(code, func)
        self._add_code(code, func.__qualname__)

    def _add_code(self, code: types.CodeType, qualname: str) -> None:
        """Profile a code object directly (a function defined by code not yet run)."""
        self._names.setdefault(code, qualname)
        self._collector.add_code(code, qualname)

    def enable(self) -> None:
        """Start profiling (does not reset or empty the CUDA allocator)."""
        self._collector.enable()

    def disable(self) -> None:
        """Stop profiling; lines still running keep what they did so far."""
        self._collector.disable()

    def clear(self) -> None:
        """Forget every registered function and every recorded line."""
        self._collector.clear()
        self._functions.clear()
        self._names.clear()

    def __enter__(self) -> LineProfiler:
        self.enable()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.disable()

    def peak_memory_stats(self) -> dict[str, int]:
        """The highest value of every ``*.peak`` statistic while profiling.

        Use it instead of ``torch.cuda.max_memory_allocated()``, whose peak the profiler
        resets at each line to measure that line alone.
        """
        return dict(self._collector.session_peaks())

    def display(
        self, func: Any = None, columns: Sequence[str] = DEFAULT_COLUMNS
    ) -> LineRecordsDisplay:
        """The report of ``func`` (a function, a qualname, or a list of them; None for all).

        Any key of ``torch.cuda.memory_stats()`` is a column; see
        https://pytorch.org/docs/stable/generated/torch.cuda.memory_stats.html

        >>> str(LineProfiler().display())
        'No data collected\\n'
        """
        codes = self._collector.codes()
        selected = self._select(func, codes)
        sources = [_source_of(self._functions.get(codes[i]), codes[i]) for i in selected]
        return LineRecordsDisplay(self._collector.report(_columns(columns), selected, sources))

    def print_stats(
        self,
        func: Any = None,
        columns: Sequence[str] = DEFAULT_COLUMNS,
        stream: TextIO | None = None,
    ) -> None:
        """Write the text report to ``stream`` (standard output by default).

        >>> LineProfiler().print_stats()
        No data collected
        <BLANKLINE>
        """
        (stream or sys.stdout).write(str(self.display(func, columns)))

    def _select(self, func: Any, codes: list[types.CodeType]) -> list[int]:
        if func is None:
            return list(range(len(codes)))
        wanted: Iterable[Any] = func if isinstance(func, (list, tuple)) else [func]
        selected = []
        for item in wanted:
            if isinstance(item, str):
                found = [i for i, c in enumerate(codes) if self._qualname(c) == item]
            else:
                code, _ = _code_of(item)
                found = [i for i, c in enumerate(codes) if c is code]
            if not found:
                names = ", ".join(self._qualname(c) for c in codes) or "none"
                raise ValueError(
                    f"{item!r} is not profiled by this LineProfiler (profiled: {names}); "
                    "add it with add_function() or LineProfiler(func)"
                )
            selected += [i for i in found if i not in selected]
        return sorted(selected)

    def _qualname(self, code: types.CodeType) -> str:
        return self._names.get(code, code.co_name)


def _source_of(func: Any, code: types.CodeType) -> tuple[int, list[str]] | None:
    try:
        lines, start = inspect.getsourcelines(func if func is not None else code)
    except (OSError, TypeError):
        return None
    return max(start, 1), lines


def _gpu_index(gpu: Any) -> int:
    if isinstance(gpu, torch.device):
        if gpu.type != "cuda":
            raise ValueError(f"target_gpu must be a CUDA device, got {gpu}")
        return gpu.index if gpu.index is not None else 0
    if isinstance(gpu, str):
        return _gpu_index(torch.device(gpu))
    if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
        raise TypeError(
            f"target_gpu must be a GPU index (an int >= 0) or a torch.device, got {gpu!r}"
        )
    return gpu
