"""pytorch_memlab's module-level helpers around one global ``LineProfiler``.

The global profiler is created (and enabled) when the first function is decorated, not
at import, so importing memlab_rs never touches CUDA.
"""

from __future__ import annotations

import atexit
import functools
from collections.abc import Callable, Sequence
from typing import Any

from .line_profiler import DEFAULT_COLUMNS, LineProfiler

_global: LineProfiler | None = None
_print_at_exit: list[tuple[Callable[..., Any], Sequence[str]]] = []


def global_line_profiler() -> LineProfiler:
    """The profiler behind ``profile`` and ``profile_every`` (created and enabled on use).

    >>> global_line_profiler() is global_line_profiler()
    True
    """
    global _global
    if _global is None:
        _global = LineProfiler()
        _global.enable()
    return _global


def clear_global_line_profiler() -> None:
    """Forget every function and line the global profiler recorded.

    >>> clear_global_line_profiler()
    """
    if _global is not None:
        _global.clear()
    _print_at_exit.clear()


def set_target_gpu(gpu: Any) -> None:
    """Profile GPU ``gpu`` (an index or a ``torch.device``) from now on, even from inside
    a profiled function.

    >>> set_target_gpu(0)
    """
    global_line_profiler().target_gpu = gpu


def _print_all() -> None:
    for func, columns in _print_at_exit:
        global_line_profiler().print_stats(func, columns)


def profile(func: Any = None, columns: Sequence[str] = DEFAULT_COLUMNS) -> Any:
    """Profile ``func`` line by line; the report prints when the interpreter exits
    (also after a KeyboardInterrupt).

    Use bare (``@profile``) or with columns (``@profile(columns=(...))``).

    >>> @profile(columns=("active_bytes.all.peak",))
    ... def step():
    ...     pass
    >>> clear_global_line_profiler()
    """
    if func is None or not callable(func):
        chosen = columns if func is None else func
        return lambda f: profile(f, chosen)
    global_line_profiler().add_function(func)
    if not _print_at_exit:
        atexit.register(_print_all)
    _print_at_exit.append((func, tuple(columns)))
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
    if isinstance(output_interval, bool) or not isinstance(output_interval, int):
        raise TypeError(f"output_interval must be an int >= 1, got {output_interval!r}")
    if output_interval < 1:
        raise ValueError(f"output_interval must be >= 1, got {output_interval}")
    columns = tuple(columns)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        if not enable:
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
