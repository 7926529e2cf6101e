//! Fragmentation of torch's CUDA caching allocator, read from a snapshot
//! (`torch.cuda.memory_snapshot()` plus a few counters and the allocator's settings):
//! where the reserved-but-unallocated bytes are (by pool, stream and segment, free blocks
//! by size, the largest free block, inactive split bytes), what the expandable-segments
//! allocator would make of the same blocks, and whether a request of a given size fits,
//! replayed through torch's malloc path (`request`).
//!
//! `input` is what comes in (serde, checked: a damaged snapshot names its field),
//! `analyse` and `request` are pure functions, `result` the serde result (kind
//! `fragmentation`), `render` its text and HTML. The doctor's `fragmentation()` and its
//! post-mortem, and the CUDA tensor report, all use this floor; none of it knows a room.

pub mod analyse;
pub mod input;
pub mod render;
pub mod request;
pub mod result;

pub use analyse::analyse;
pub use input::{Input, Request};
pub use result::{Fragmentation, Verdict};

#[cfg(test)]
mod tests;
