//! The tensor report (MemReporter): every tensor Python can reach, by device, each storage
//! counted once. `py::collect` walks gc into plain facts -> `analyse` builds the rows,
//! attaches the CUDA figures and cuts views -> `result` is what is saved and loaded ->
//! `render` writes pytorch_memlab's text, HTML and JSON. Over results: `merge` (several
//! ranks into a `merged_tensor_report`) and `diff` (two reports, tensor by tensor). `py`
//! is its Python face.

pub mod analyse;
pub mod diff;
pub mod merge;
pub mod py;
pub mod render;
pub mod result;
