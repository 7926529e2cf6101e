//! A test's memory, the pytest plugin's result: the limit failure, the result's text, and the
//! session's table of the highest peaks (`render`); `py` is its Python face.

pub mod py;
pub mod render;
pub mod result;
