//! One CUDA device's caching-allocator statistics: torch's binding until the allocator's own
//! fields are located (`direct`), then those fields, checked against the binding (`stats`,
//! with `py`, the calls into torch and the `_core` functions).

pub mod direct;
pub mod py;
pub mod stats;
