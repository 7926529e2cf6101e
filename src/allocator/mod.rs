//! Models of allocators that several rooms replay: torch's CUDA caching allocator
//! (`caching`).

pub mod caching;
