"""The doctor: why memory ran out and where it goes wrong (the post-mortem of an
out-of-memory error, the caching allocator's fragmentation, memory that grows step after
step). The Rust side is ``_core.doctor``."""

__all__: list[str] = []
