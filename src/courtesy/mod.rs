//! Courtesy's room: the host side of a yield (`book`: which storages live on the host,
//! where in the pinned buffers, what is left to bring back), its reports (`result`) and
//! their text (`render`); `py` is its Python face, `_core.courtesy`. The torch calls
//! (finding the tensors, the copies, re-pointing them) are `python/memlab_rs/courtesy/`.

pub mod book;
pub mod py;
pub mod render;
pub mod result;
