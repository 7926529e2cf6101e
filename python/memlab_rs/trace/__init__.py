"""What was alive at the peak, and who allocated it: allocation history, by line and by module.

On CUDA it reads torch's own allocation history (every alloc and free with its Python stack,
about 2 us per allocation; no custom allocator), and turns your previous history setting back
on stop. On CPU it records through memlab_rs's CPU allocator hook, capturing stacks only while
tracing. Either way the recording is a snapshot in torch's schema, so files from
``torch.cuda.memory._dump_snapshot`` load and analyse the same way, and ours open in
pytorch.org/memory_viz.

>>> import torch, memlab_rs.trace as trace
>>> with trace.Tracer(device="cpu") as tr:
...     x = torch.empty(1024, 256)        # 1 MiB, alive at the peak
>>> tr.result.max_mem("cpu") >= 1 << 20
True
"""

# The room's public front: re-exports only. Its modules, one job each: tracer (recording),
# result (the analysis's answers and renderings), files (load), options (the arguments),
# names (what was alive at the start, by tensor), tags (module and phase hooks), saved (the
# snapshot in a result file), plain_pickle (a pickle read as plain data), timeline and plots
# (the pictures), memory_viz (files torch's viewer reads), peak_tracer (the module-level API).
from memlab_rs.trace.files import load
from memlab_rs.trace.options import default_exclude
from memlab_rs.trace.peak_tracer import (
    report_stats,
    start_tracing,
    stop_tracing,
    switch_allocator,
)
from memlab_rs.trace.result import PeakRow, TraceResult
from memlab_rs.trace.tracer import DEFAULT_MAX_ENTRIES as DEFAULT_MAX_ENTRIES
from memlab_rs.trace.tracer import Tracer

__all__ = [
    "PeakRow",
    "TraceResult",
    "Tracer",
    "default_exclude",
    "load",
    "report_stats",
    "start_tracing",
    "stop_tracing",
    "switch_allocator",
]
