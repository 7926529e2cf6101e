//! One CUDA device's caching-allocator statistics: torch's binding until the allocator's own
//! fields are located (`direct`), then those fields, checked against the binding (`stats`).

pub mod direct;
pub mod stats;
