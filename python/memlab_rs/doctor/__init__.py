"""The doctor: why memory ran out and where it goes wrong (the post-mortem of an
out-of-memory error, the caching allocator's fragmentation, memory that grows step after
step). The Rust side is ``_core.doctor``."""

from memlab_rs.doctor.growth import LeakCheck, leak_check, leaks
from memlab_rs.doctor.leak_result import LeakResult

__all__ = ["LeakCheck", "LeakResult", "leak_check", "leaks"]
