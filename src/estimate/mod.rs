//! The estimate's room: a training step's memory without allocating it. The Python side
//! (`python/memlab_rs/estimation/`) runs the step on fake tensors and records every
//! storage's birth and death; here that recording is replayed through a model of the
//! device's allocator (`allocator`, `replay`), the estimate is a serde struct (`result`,
//! kind `estimate`) rendered as text and HTML (`render`); `py` is its Python face,
//! `_core.estimate`.

pub mod allocator;
pub mod plan;
pub mod py;
pub mod render;
pub mod replay;
pub mod result;
