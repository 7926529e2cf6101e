"""What a real step allocates on the CPU, read from the CPU source: the estimate's tests
compare each step's estimated rise with this."""

from __future__ import annotations

import gc
from collections.abc import Callable

from memlab_rs import _core


def cpu_step_rises(step: Callable[[], None], steps: int) -> dict[int, int]:
    """Per step 1..steps: the CPU source's peak during `step()` minus what was allocated
    when it began."""
    rises = {}
    for n in range(1, steps + 1):
        gc.collect()
        _core._cpu_start()
        try:
            start = dict(_core._cpu_stats())["allocated_bytes.all.current"]
            step()
            rises[n] = dict(_core._cpu_stats())["allocated_bytes.all.peak"] - start
        finally:
            _core._cpu_stop()
    return rises
