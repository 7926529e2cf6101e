//! Models of allocators that several rooms replay: torch's CUDA caching allocator
//! (`caching`), and the fragmentation of its cache read from a snapshot (`fragmentation`:
//! the doctor's `fragmentation` and the CUDA tensor report share it).

pub mod caching;
pub mod fragmentation;
