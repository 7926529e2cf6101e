"""Line-by-line memory profiling: pytorch_memlab's ``LineProfiler``, exact and cheap.

Only the functions you register are watched (``sys.monitoring`` local events on Python
3.12+, a C trace function below), state is kept per frame (recursion, generators,
threads and exceptions are attributed to the right line), and each line costs one read of
the allocator's statistics.
"""

from __future__ import annotations

import functools
import inspect
import operator
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import torch

from . import _args, _core, results
from ._columns import catalogue, check_columns
from ._sources import cpu_source  # noqa: F401  (the CPU source's glue)
from ._torch import check_target_gpu, line_profiler_device, local_cuda_index, parse_device
from .line_result import DEFAULT_COLUMNS, LineProfileResult

# The bytes a line allocated that were still alive at the peak (from the allocation history).
PEAK_LIVE = "peak_live"


class _ThisProcessGpu(int):
    """``target_gpu``'s default: this process's GPU (``_torch.local_cuda_index()``: the
    current device, else torchrun's ``LOCAL_RANK``). It equals pytorch_memlab's default, 0,
    and is 0 in a single process that never called ``torch.cuda.set_device``; an explicit
    ``target_gpu=0`` still means GPU 0."""

    def __repr__(self) -> str:
        return "0"


_THIS_PROCESS_GPU = _ThisProcessGpu(0)


def _code_of(func: Any) -> tuple[types.CodeType, str] | None:
    """The code object to watch for ``func`` and its qualname, or None if it has none.

    Only the code object is kept, never the function: a profiled closure's captured
    values die with the function.
    """
    if isinstance(func, types.CodeType):
        return func, getattr(func, "co_qualname", func.co_name)
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    if isinstance(func, torch.nn.Module):
        func = type(func).forward
    if inspect.ismethod(func):
        func = func.__func__
    try:
        func = inspect.unwrap(func)
    except ValueError:  # a cycle of __wrapped__
        return None
    code = getattr(func, "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    return code, getattr(func, "__qualname__", code.co_name)


def _no_code_warning(func: Any) -> str:
    """pytorch_memlab's warning for an object without a code object, and what to pass."""
    hint = "pass a Python function, method or nn.Module"
    if isinstance(func, property):
        hint = "pass the property's getter, e.g. Cls.prop.fget"
    elif isinstance(func, functools.partial):
        hint = "pass the function it calls, partial.func"
    return f"Could not extract a code object for the object {func!r}; it is not profiled ({hint})"


class LineRecordsDisplay:
    """A line report: ``str()``/``repr()`` give pytorch_memlab's text, Jupyter shows HTML.

    >>> shown = LineProfiler().display()
    >>> str(shown)
    'No data collected\\n'
    """

    def __init__(self, view: _core.LineReportView, heading: str | None = None):
        self._view = view
        #: Which rank the report comes from, in a job of several processes (else None).
        self.heading = heading

    def __repr__(self) -> str:
        text = self._view.text()
        return text if self.heading is None else f"# {self.heading}\n\n{text}"

    __str__ = __repr__

    def _repr_html_(self) -> str:
        html = self._view.html()
        if self.heading is None:
            return html
        from html import escape

        return f"<p><b>{escape(self.heading)}</b></p>\n{html}"

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
            record: dict[str, Any] = {"function": qualname, "line": line, "hits": hits}
            record["code"] = code
            row: Sequence[int | None] = values if values is not None else [None] * len(self.columns)
            for column, value in zip(self.columns, row):
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
    CUDA when it is available, else CPU. ``target_gpu`` left at its default is this
    process's GPU: the current device once CUDA is initialised, else ``LOCAL_RANK`` (so each
    rank of a ``torchrun`` job profiles its own GPU), else 0, as in pytorch_memlab.

    >>> import torch
    >>> def make():
    ...     x = torch.empty(256, 1024)
    ...     return x
    >>> with LineProfiler(make, device="cpu") as lp:
    ...     _ = make()
    >>> lp.display(columns=["allocated_bytes.all.allocated"]).records()[1]["code"]
    '    x = torch.empty(256, 1024)'
    """

    def __init__(
        self,
        *functions: Callable[..., Any],
        target_gpu: Any = _THIS_PROCESS_GPU,
        device: Any = None,
        peak_live: bool = False,
    ):
        if target_gpu is _THIS_PROCESS_GPU:
            target_gpu = local_cuda_index()
        self._target_gpu = _gpu_index(target_gpu)
        check_target_gpu(self._target_gpu, target_gpu)
        self._collector = _core.LineCollector(line_profiler_device(device, self._target_gpu))
        # Code objects only (never functions): what is profiled does not stay alive.
        self._names: dict[types.CodeType, str] = {}
        for func in functions:
            self._add_function(func)
        # peak_live: an allocation history over the same region (memlab_rs.trace).
        self._peak_live = bool(peak_live)
        self._tracer: Any = None
        self.trace_result: Any = None

    @property
    def device(self) -> str:
        """The memory being read: ``"cuda:N"`` or ``"cpu"``."""
        return self._collector.device

    @property
    def enabled(self) -> bool:
        """Whether the profiler is recording (between ``enable()`` and ``disable()``).

        Settable, as in pytorch_memlab: a true value enables, a false one disables.
        """
        return self._collector.enabled

    @enabled.setter
    def enabled(self, value: Any) -> None:
        if value:
            self.enable()
        else:
            self.disable()

    @property
    def stats_reader(self) -> str | None:
        """How statistics are read while enabled (None when disabled).

        ``"allocator memory"``: CUDA statistics read from the caching allocator's own
        fields, located once and checked against torch at enable, disable and every few
        thousand lines or every second; ``"torch._C._cuda_memoryStats"``: the binding, on
        every line (set ``MEMLAB_RS_CUDA_STATS=binding`` to force it; it also takes over
        for good after any disagreement, and the report says so); ``"allocator hook"``:
        CPU, memlab_rs's hook on torch's CPU allocator, which counts every CPU storage;
        ``"dispatch mode"``: CPU, the fallback where the hook cannot be used (it counts
        the outputs of torch's operators, and the report says why it was taken).
        """
        return self._collector.stats_reader

    @property
    def target_gpu(self) -> int:
        """The GPU read when profiling CUDA; setting it switches at once, even mid-run."""
        return self._target_gpu

    @target_gpu.setter
    def target_gpu(self, gpu: Any) -> None:
        index = _gpu_index(gpu)
        check_target_gpu(index, gpu)
        if self.device != "cpu":
            self._collector.set_device(f"cuda:{index}")
        self._target_gpu = index

    def add_function(self, func: Callable[..., Any]) -> None:
        """Profile ``func`` too: a function, method, ``nn.Module`` (its ``forward``), or a
        decorated function (the one it wraps).

        An object without Python code (a property, a ``functools.partial``, a builtin)
        gets pytorch_memlab's warning and is skipped. Only the code object is kept.
        """
        self._add_function(func)

    def _add_function(self, func: Callable[..., Any]) -> None:
        found = _code_of(func)
        if found is None:  # stacklevel: the caller of add_function() or LineProfiler()
            warnings.warn(_no_code_warning(func), stacklevel=3)
            return
        self._add_code(*found)

    def _add_code(self, code: types.CodeType, qualname: str) -> None:
        """Profile a code object directly (a function defined by code not yet run)."""
        self._names.setdefault(code, qualname)
        self._collector.add_code(code, qualname)

    def enable(self) -> None:
        """Start profiling (does not reset or empty the CUDA allocator)."""
        started = None
        if self._peak_live and self._tracer is None:
            from .trace import Tracer

            started = self._tracer = Tracer(device=self.device, tag_modules=False).start()
        try:
            self._collector.enable()
        except BaseException:
            if started is not None:  # an enable that fails leaves no recording behind
                self._tracer = None
                started.stop()
            raise

    def disable(self) -> None:
        """Stop profiling; lines still running keep what they did so far. With
        ``peak_live=True`` the allocation history of the region is kept in ``trace_result``."""
        self._collector.disable()
        if self._tracer is not None:
            tracer, self._tracer = self._tracer, None
            self.trace_result = tracer.stop()

    def clear(self) -> None:
        """Forget every registered function and every recorded line."""
        self._collector.clear()
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
        self, func: Any = None, columns: Sequence[str] | None = DEFAULT_COLUMNS
    ) -> LineRecordsDisplay:
        """The report of ``func`` (a function, a qualname, or a list of them; None for all).

        Any key of ``torch.cuda.memory_stats()`` is a column; see
        https://pytorch.org/docs/stable/generated/torch.cuda.memory_stats.html
        ``columns=None`` shows every column the source has, as pytorch_memlab does.

        >>> str(LineProfiler().display())
        'No data collected\\n'
        """
        checked = self._checked_columns(columns)
        return self._result(func, checked).display(columns=list(checked))

    def result(self, func: Any = None) -> LineProfileResult:
        """The line profile of ``func`` (a function, a qualname, or a list of them; None for
        all) as data: every column the source has, the functions' source lines, the notices
        and where it was made. It renders as ``display()`` does, saves to a file
        (``result.save(path)``) and loads back (``memlab_rs.load``) anywhere.

        >>> LineProfiler().result().functions
        []
        """
        return self._result(func, ())

    def _result(self, func: Any, wanted: Sequence[str]) -> LineProfileResult:
        codes = self._collector.codes()
        selected = self._select(func, codes)
        sources = [_source_of(codes[i]) for i in selected]
        columns = list(self._collector.column_names()) or list(catalogue(self.device))
        columns += [c for c in wanted if c not in columns and c != PEAK_LIVE]
        extra = None
        if self._peak_live:
            per_line = self._peak_live_by_line()
            files = [codes[i].co_filename for i in selected]
            maps = [{ln: n for (f, ln), n in per_line.items() if f == file} for file in files]
            extra = {PEAK_LIVE: maps}
            columns.append(PEAK_LIVE)
        view = self._collector.report(columns, selected, sources, extra)
        filenames = {self._qualname(codes[i]): codes[i].co_filename for i in selected}
        meta = results.run_meta(self.device)
        return LineProfileResult._from_view(view, filenames, meta)

    def _peak_live_by_line(self) -> dict[tuple[str, int], int]:
        """{(file, line): bytes} alive at the peak of the traced region (one analysis)."""
        if self.trace_result is None or not self.trace_result.devices:
            return {}
        return self.trace_result.line_peak_live(self.trace_result.devices[0])

    def _checked_columns(self, columns: Any = None) -> tuple[str, ...]:
        """``columns`` checked against what this profiler's source has (every column it
        has for None): a TypeError or ValueError that lists the valid ones otherwise.
        ``peak_live`` is accepted when the profiler records the allocation history."""
        known = self._collector.column_names()
        if columns is None:
            return tuple(known) or catalogue(self.device)
        if isinstance(columns, str):
            columns = (columns,)
        if isinstance(columns, Iterable) and PEAK_LIVE in list(columns):
            columns = list(columns)
            if not self._peak_live:
                raise ValueError(
                    "column 'peak_live' needs the allocation history: "
                    "LineProfiler(..., peak_live=True)"
                )
            check_columns([c for c in columns if c != PEAK_LIVE], self.device, known)
            return tuple(columns)
        return check_columns(columns, self.device, known)

    def print_stats(
        self,
        func: Any = None,
        columns: Sequence[str] | None = DEFAULT_COLUMNS,
        stream: TextIO | None = None,
    ) -> None:
        """Write the text report to ``stream`` (standard output by default).

        >>> LineProfiler().print_stats()
        No data collected
        <BLANKLINE>
        """
        out = sys.stdout if stream is None else _args.stream(stream, "stream")
        out.write(str(self.display(func, columns)))

    def _select(self, func: Any, codes: list[types.CodeType]) -> list[int]:
        if func is None:
            return list(range(len(codes)))
        wanted: Iterable[Any] = func if isinstance(func, (list, tuple)) else [func]
        selected = []
        for item in wanted:
            if isinstance(item, str):
                found = [i for i, c in enumerate(codes) if self._qualname(c) == item]
            else:
                code = (_code_of(item) or (None,))[0]
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


def _source_of(code: types.CodeType) -> tuple[int, list[str]] | None:
    """(first line, lines) of a code object's source, read from the code object alone
    (the function may be gone), or None where the source cannot be read."""
    try:
        lines, start = inspect.getsourcelines(code)
    except (OSError, TypeError, IndexError):
        return None
    return max(start, 1), lines


def _gpu_index(gpu: Any) -> int:
    """A ``target_gpu`` as an index: an int (or integer-like), ``"cuda:N"`` or a CUDA
    ``torch.device``; anything else is an error naming ``target_gpu``."""
    if isinstance(gpu, str):
        gpu = parse_device(gpu, "target_gpu")
    if isinstance(gpu, torch.device):
        if gpu.type != "cuda":
            raise ValueError(f"target_gpu must be a CUDA device, got {gpu}")
        return gpu.index if gpu.index is not None else 0
    if not isinstance(gpu, bool):
        try:
            index = operator.index(gpu)
        except TypeError:
            pass
        else:
            if index >= 0:
                return index
    raise TypeError(
        f"target_gpu must be a GPU index (an int >= 0) or a torch.device, got {gpu!r}"
    )
