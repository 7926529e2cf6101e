//! Courtesy's room: the host side of a yield (`book`: which storages live on the host,
//! where in the pinned buffers, what is left to bring back), its reports (`result`) and
//! their text (`render`); `py` is its Python face, `_core.courtesy`. The torch calls
//! (finding the tensors, the copies, re-pointing them) are `python/memlab_rs/courtesy/`.
//! Regions (memory that a pause gives back while every address stays): the allocator torch
//! calls and the pause and resume (`region`), their book as plain data (`region_book`), and
//! the driver's virtual memory calls (`vmm`).

pub mod book;
pub mod py;
pub mod region;
pub mod region_book;
pub mod render;
pub mod result;
pub mod vmm;
