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
pub mod view;

pub use analyse::analyse;
pub use input::{Input, Request};
pub use result::{Fragmentation, Verdict};

/// A snapshot or setting that does not fit: the field's path (`segments[3].total_size`) and
/// what is wrong there. The doctor's binding makes it a ValueError.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl std::error::Error for FieldError {}

#[cfg(test)]
mod tests;
