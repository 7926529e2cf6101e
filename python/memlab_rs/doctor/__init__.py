"""The doctor: why memory ran out and where it goes wrong (the post-mortem of an
out-of-memory error, the caching allocator's fragmentation, memory that grows step after
step). The Rust side is ``_core.doctor``."""

from memlab_rs.doctor.allocator_fragmentation import (
    FragmentationResult,
    fragmentation,
    from_snapshot,
)

__all__: list[str] = ["FragmentationResult", "fragmentation", "from_snapshot"]
