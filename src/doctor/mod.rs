//! The doctor: why memory ran out and where it goes wrong. The post-mortem of an
//! out-of-memory error (`postmortem`), the caching allocator's fragmentation (`fragmentation`)
//! and memory that grows step after step (`leaks`); `py` is its Python face.

pub mod leaks;
pub mod postmortem;
pub mod py;
