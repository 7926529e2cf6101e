"""The line profiler: what each line of the profiled functions did to memory.

The public front of the room (pytorch_memlab's ``pytorch_memlab.line_profiler`` too):
``LineProfiler`` and its display, the global profiler behind ``profile``,
``profile_every`` and ``set_target_gpu``, and the results: a line profile, line profiles of
several ranks merged, two compared. The Rust side is ``_core.line_profiler``.

Imports here are absolute: ``import memlab_rs as pytorch_memlab`` then
``pytorch_memlab.line_profiler`` runs this file again under that name, and must hand out
the same objects, not a second copy of each module.
"""

from memlab_rs.line_profiler.columns import DEFAULT_COLUMNS
from memlab_rs.line_profiler.diff import LineProfileDiff
from memlab_rs.line_profiler.display import LineRecordsDisplay
from memlab_rs.line_profiler.global_profiler import (
    clear_global_line_profiler,
    global_line_profiler,
    profile,
    profile_every,
    set_target_gpu,
)
from memlab_rs.line_profiler.merged import MergedLineProfile
from memlab_rs.line_profiler.profiler import LineProfiler
from memlab_rs.line_profiler.result import LineProfileResult

__all__ = [
    "DEFAULT_COLUMNS",
    "LineProfileDiff",
    "LineProfileResult",
    "LineProfiler",
    "LineRecordsDisplay",
    "MergedLineProfile",
    "clear_global_line_profiler",
    "global_line_profiler",
    "profile",
    "profile_every",
    "set_target_gpu",
]
