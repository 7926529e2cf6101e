"""The training monitor (``memory_profiler(model, print_period, csv)``, the original
per-iteration profiler's block, line for line): the live monitor (``memory_monitor``), its
record as data (``result``, kind ``monitor``; ``plot``: its PNG and data frame), the
backward boundaries it listens to (``_backward_calls``), the saved-tensor hook stack
(``_hook_stack``) and what it reads of the user's model and arguments (``_model``). The Rust
side is ``_core.monitor``: the saved-tensor hooks, the reads at each boundary, the
intermediate-gradient log, the record and its renderings."""

from memlab_rs.monitor.memory_monitor import MemoryMonitor, memory_profiler
from memlab_rs.monitor.result import MonitorResult

__all__ = ["MemoryMonitor", "MonitorResult", "memory_profiler"]
