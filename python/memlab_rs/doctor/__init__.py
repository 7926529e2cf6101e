"""The doctor: why memory ran out and where it goes wrong (the post-mortem of an
out-of-memory error, the caching allocator's fragmentation, memory that grows step after
step). The Rust side is ``_core.doctor``.

It sits above the other rooms: a post-mortem names the live tensors with the tensor
report's walk, the live set by line with the trace, and the batch that fits with the
estimate."""

from memlab_rs.doctor.allocator_fragmentation import (
    FragmentationResult,
    fragmentation,
    from_snapshot,
)
from memlab_rs.doctor.growth import LeakCheck, leak_check, leaks
from memlab_rs.doctor.guard import OOMGuard, oom_guard
from memlab_rs.doctor.leak_result import LeakResult
from memlab_rs.doctor.result import PostMortemResult

__all__ = [
    "FragmentationResult",
    "LeakCheck",
    "LeakResult",
    "OOMGuard",
    "PostMortemResult",
    "fragmentation",
    "from_snapshot",
    "leak_check",
    "leaks",
    "oom_guard",
]
