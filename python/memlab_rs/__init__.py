"""memlab_rs: where your PyTorch memory goes. A fast, exact successor of pytorch_memlab.

``import memlab_rs as pytorch_memlab`` works in existing code.
"""

from . import results as results  # memlab_rs.results: the saved-result format
from . import trace as trace  # memlab_rs.trace: what was alive at the peak
from ._core import __version__ as __version__  # Cargo.toml's, the one source
from ._core import parse_size, readable_size
from .courtesy import Courtesy, CourtesyRestoreError, RestoreReport, YieldReport
from .estimate import FakeStepError, MemoryEstimate, estimate, max_batch_size
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
from .merge import MergedTensorReport
from .monitor import MemoryMonitor, memory_profiler
from .monitor_result import MonitorResult
from .reporter import MemoryReport, MemReporter, TensorRow
from .results import load
from .results.diff import ResultDiff, diff_results
from .results.merge import gather_results, merge_results
from .test_memory import PytestMemoryResult
from .tracker import MemTracker, TrackResult, TrackRow

__all__ = [
    "DEFAULT_COLUMNS",
    "Courtesy",
    "CourtesyRestoreError",
    "FakeStepError",
    "LineProfileResult",
    "LineProfiler",
    "LineRecordsDisplay",
    "MemReporter",
    "MemTracker",
    "MergedLineProfile",
    "MergedTensorReport",
    "MemoryEstimate",
    "MemoryMonitor",
    "MemoryReport",
    "MonitorResult",
    "PytestMemoryResult",
    "RestoreReport",
    "ResultDiff",
    "TensorRow",
    "TrackResult",
    "TrackRow",
    "YieldReport",
    "clear_global_line_profiler",
    "diff_results",
    "estimate",
    "gather_results",
    "global_line_profiler",
    "load",
    "max_batch_size",
    "memory_profiler",
    "merge_results",
    "parse_size",
    "profile",
    "profile_every",
    "readable_size",
    "set_target_gpu",
]


def load_ipython_extension(ipython):
    """``%load_ext memlab_rs``: register the ``%mlrun``/``%%mlrun`` magics (needs IPython)."""
    from .ipython import load_ipython_extension as load

    load(ipython)
