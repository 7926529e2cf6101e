"""memlab_rs: where your PyTorch memory goes. A fast, exact successor of pytorch_memlab.

``import memlab_rs as pytorch_memlab`` works in existing code.
"""

# The public API, imported when first used (PEP 562's module __getattr__): importing
# torch takes seconds, and `import memlab_rs` (the command line's --help and --version,
# pytest's plugin, a result loaded for its text) must not pay it before a tool is used.
# `memlab_rs.LineProfiler` imports the module that defines it, then the name is an
# ordinary attribute. Type checkers read the imports under TYPE_CHECKING instead.

# (The module's own imports take a leading underscore: its attributes are the public API.)
import importlib as _importlib
import sys as _sys
import types as _types
import typing as _typing

from ._core import __version__ as __version__  # Cargo.toml's, the one source (no torch)

if _typing.TYPE_CHECKING:
    from . import results as results  # memlab_rs.results: the saved-result format
    from . import trace as trace  # memlab_rs.trace: what was alive at the peak
    from ._core import parse_size, readable_size
    from .courtesy import (
        Courtesy,
        CourtesyRegionError,
        CourtesyRestoreError,
        RegionReport,
        RestoreReport,
        YieldReport,
    )
    from .doctor import (
        LeakCheck,
        LeakResult,
        OOMGuard,
        PostMortemResult,
        leak_check,
        leaks,
        oom_guard,
    )
    from .doctor.allocator_fragmentation import FragmentationResult, fragmentation
    from .estimation import (
        FakeStepError,
        MemoryEstimate,
        MemoryPlan,
        estimate,
        max_batch_size,
        plan,
    )
    from .line_profiler import (
        DEFAULT_COLUMNS,
        LineProfiler,
        LineProfileResult,
        LineRecordsDisplay,
        MergedLineProfile,
        clear_global_line_profiler,
        global_line_profiler,
        profile,
        profile_every,
        set_target_gpu,
    )
    from .monitor import MemoryMonitor, MonitorResult, memory_profiler
    from .results import load
    from .results.diff import ResultDiff, diff_results
    from .results.merge import gather_results, merge_results
    from .tensor_report import MemoryReport, MemReporter, MergedTensorReport, TensorRow
    from .test_memory import PytestMemoryResult
    from .tracker import MemTracker, TrackResult, TrackRow

__all__ = [
    "DEFAULT_COLUMNS",
    "Courtesy",
    "CourtesyRegionError",
    "CourtesyRestoreError",
    "FakeStepError",
    "FragmentationResult",
    "LeakCheck",
    "LeakResult",
    "LineProfileResult",
    "LineProfiler",
    "LineRecordsDisplay",
    "MemReporter",
    "MemTracker",
    "MergedLineProfile",
    "MergedTensorReport",
    "MemoryEstimate",
    "MemoryMonitor",
    "MemoryPlan",
    "MemoryReport",
    "MonitorResult",
    "OOMGuard",
    "PostMortemResult",
    "PytestMemoryResult",
    "RegionReport",
    "RestoreReport",
    "ResultDiff",
    "TensorRow",
    "TrackResult",
    "TrackRow",
    "YieldReport",
    "clear_global_line_profiler",
    "diff_results",
    "estimate",
    "fragmentation",
    "gather_results",
    "global_line_profiler",
    "leak_check",
    "leaks",
    "load",
    "max_batch_size",
    "memory_profiler",
    "merge_results",
    "oom_guard",
    "parse_size",
    "plan",
    "profile",
    "profile_every",
    "readable_size",
    "set_target_gpu",
]

#: Each public name -> the module that defines it (as the TYPE_CHECKING imports say).
_HOMES: dict[str, str] = {
    **dict.fromkeys(["parse_size", "readable_size"], "._core"),
    **dict.fromkeys(
        [
            "Courtesy",
            "CourtesyRegionError",
            "CourtesyRestoreError",
            "RegionReport",
            "RestoreReport",
            "YieldReport",
        ],
        ".courtesy",
    ),
    **dict.fromkeys(
        ["FakeStepError", "MemoryEstimate", "MemoryPlan", "estimate", "max_batch_size", "plan"],
        ".estimation",
    ),  # fmt: skip
    **dict.fromkeys(
        [
            "DEFAULT_COLUMNS",
            "LineProfiler",
            "LineProfileResult",
            "LineRecordsDisplay",
            "MergedLineProfile",
            "clear_global_line_profiler",
            "global_line_profiler",
            "profile",
            "profile_every",
            "set_target_gpu",
        ],
        ".line_profiler",
    ),  # fmt: skip
    **dict.fromkeys(["LeakCheck", "LeakResult", "leak_check", "leaks"], ".doctor"),
    **dict.fromkeys(["MemoryMonitor", "MonitorResult", "memory_profiler"], ".monitor"),
    **dict.fromkeys(
        ["MemoryReport", "MemReporter", "MergedTensorReport", "TensorRow"], ".tensor_report"
    ),  # fmt: skip
    **dict.fromkeys(["OOMGuard", "PostMortemResult", "oom_guard"], ".doctor"),
    **dict.fromkeys(["FragmentationResult", "fragmentation"], ".doctor.allocator_fragmentation"),
    "load": ".results",
    **dict.fromkeys(["ResultDiff", "diff_results"], ".results.diff"),
    **dict.fromkeys(["gather_results", "merge_results"], ".results.merge"),
    "PytestMemoryResult": ".test_memory",
    **dict.fromkeys(["MemTracker", "TrackResult", "TrackRow"], ".tracker"),
}

#: Submodules that are part of the public API as modules.
_MODULES = ("results", "trace")


def __getattr__(name: str) -> _typing.Any:
    """A public name, imported from its module on first use; else a submodule (as
    ``import memlab_rs.x`` makes ``memlab_rs.x``: ``memlab_rs.trace``)."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(_importlib.import_module(home, __name__), name)
    elif name.startswith("__"):  # a probe for a protocol (__wrapped__, __path__...)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        try:
            value = _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise  # the submodule exists; something it imports does not
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, *_MODULES})


class _Front(_types.ModuleType):
    """This package's module object. No submodule shares a public name (the function
    ``profile`` lives in ``line_profiler.global_profiler``, ``estimate`` in the
    ``estimation`` package); should one ever be imported under a public name, the binding
    the import system makes on the package would replace the function: this keeps it."""

    def __setattr__(self, name: str, value: _typing.Any) -> None:
        submodule = isinstance(value, _types.ModuleType) and value.__name__ == f"{__name__}.{name}"
        if submodule and name in _HOMES:
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Front


def load_ipython_extension(ipython):
    """``%load_ext memlab_rs``: register the ``%mlrun``/``%%mlrun`` magics (needs IPython)."""
    # By name, as every import of this front: it stands above the whole package, which
    # imports it (``_core`` is its attribute), so it imports nothing until asked.
    _importlib.import_module(".integrations.ipython", __name__).load_ipython_extension(ipython)
