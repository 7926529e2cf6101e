"""pytorch_memlab's module-level helpers around one global ``LineProfiler``: ``profile``,
``profile_every``, ``set_target_gpu``, ``clear_global_line_profiler``.

The global profiler is created (and enabled) when the first function is decorated, not
at import, so importing memlab_rs never touches CUDA. (No module of the room is named
``profile``: ``memlab_rs.line_profiler.profile`` is the decorator, as in pytorch_memlab.)
"""

from __future__ import annotations

import atexit
import functools
import operator
import sys
import traceback
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from memlab_rs.line_profiler.code import code_of, no_code_warning
from memlab_rs.line_profiler.columns import DEFAULT_COLUMNS
from memlab_rs.line_profiler.profiler import LineProfiler

_global: LineProfiler | None = None
# The device the global profiler reads when it is created (None: LineProfiler's default,
# this process's GPU, else the CPU); `memlab-rs run --device` sets it.
_global_device: Any = None
# What @profile prints at exit: the code object (never the function, which would keep its
# closure alive) and the columns, checked when the function was decorated.
_print_at_exit: list[tuple[types.CodeType, tuple[str, ...]]] = []


def global_line_profiler() -> LineProfiler:
    """The profiler behind ``profile`` and ``profile_every`` (created and enabled on use).

    >>> global_line_profiler() is global_line_profiler()
    True
    """
    global _global
    if _global is None:
        _global = LineProfiler(device=_global_device)
        _global.enable()
    return _global


def _existing() -> LineProfiler | None:
    """The global profiler if something made it (``@profile``, ``--line``), else None."""
    return _global


def _use_device(device: Any) -> None:
    """Make the global profiler read ``device`` (checked now) when it is created."""
    global _global_device
    if _global is not None:
        raise RuntimeError("the global line profiler already exists; set its device first")
    LineProfiler(device=device)  # a device that does not exist is an error here
    _global_device = device


def clear_global_line_profiler() -> None:
    """Forget every function and line the global profiler recorded.

    >>> clear_global_line_profiler()
    """
    if _global is not None:
        _global.clear()
    _print_at_exit.clear()


def set_target_gpu(gpu_id: Any) -> None:
    """Profile GPU ``gpu_id`` (an index or a ``torch.device``) from now on, even from
    inside a profiled function. A GPU that does not exist is a ValueError that says which
    ones do (without CUDA, only the default, 0, is accepted).

    >>> set_target_gpu(0)
    """
    global_line_profiler().target_gpu = gpu_id


def _print_all() -> None:
    """Print every @profile report, each on its own: one that fails says why on stderr
    and the others still print."""
    for code, columns in _print_at_exit:
        try:
            global_line_profiler().print_stats(code, columns)
        except Exception:
            print(
                f"memlab_rs: could not print the @profile report of {code.co_name}:",
                file=sys.stderr,
            )
            traceback.print_exc()


def profile(func: Any = None, columns: Sequence[str] = DEFAULT_COLUMNS) -> Any:
    """Profile ``func`` line by line; the report prints when the interpreter exits
    (also after a KeyboardInterrupt).

    Use bare (``@profile``) or with columns (``@profile(columns=(...))``). A column the
    profiler's source does not have is a ValueError here, when the function is decorated.

    >>> @profile(columns=("active_bytes.all.peak",))
    ... def step():
    ...     pass
    >>> clear_global_line_profiler()
    """
    if func is None or isinstance(func, (str, list, tuple)):
        # @profile(columns=...), or the columns given first: @profile(("active_bytes.all.peak",))
        chosen = columns if func is None else func
        global_line_profiler()._checked_columns(chosen)
        return lambda f: profile(f, chosen)
    profiler = global_line_profiler()
    checked = profiler._checked_columns(columns)
    found = code_of(func)
    if found is None:  # pytorch_memlab's warning; the object is left as it is
        warnings.warn(no_code_warning(func), stacklevel=2)
        return func
    profiler.add_function(func)
    if not _print_at_exit:
        atexit.register(_print_all)
    _print_at_exit.append((found[0], checked))
    return func


def profile_every(
    output_interval: int = 1, enable: bool = True, columns: Sequence[str] = DEFAULT_COLUMNS
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Profile a function and print its report after every ``output_interval``-th call.

    ``enable=False`` leaves the function untouched, so the decorator can stay in code.

    >>> @profile_every(2)
    ... def step():
    ...     pass
    >>> clear_global_line_profiler()
    """
    if isinstance(output_interval, bool):
        raise TypeError(f"output_interval must be an int >= 1, got {output_interval!r}")
    try:
        output_interval = operator.index(output_interval)
    except TypeError:
        raise TypeError(f"output_interval must be an int >= 1, got {output_interval!r}") from None
    if output_interval < 1:
        raise ValueError(f"output_interval must be >= 1, got {output_interval}")
    columns = global_line_profiler()._checked_columns(columns) if enable else tuple(columns)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        if not enable:
            return func
        if code_of(func) is None:  # pytorch_memlab's warning; the object is left as it is
            warnings.warn(no_code_warning(func), stacklevel=2)
            return func
        global_line_profiler().add_function(func)
        calls = 0

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            result = func(*args, **kwargs)
            calls += 1
            if calls % output_interval == 0:
                global_line_profiler().print_stats(func, columns)
            return result

        return run

    return decorate
