//! The post-mortem of an out-of-memory error: the facts Python gathered at the failing
//! allocation (`result`), what they mean (`analyse`: the free bytes of each pool and stream,
//! and advice computed from the numbers), and the report as text and HTML (`render`).

pub mod analyse;
pub mod render;
pub mod result;
