//! The line profiler's report: pytorch_memlab's text layout and HTML.

pub mod html;
pub mod text;
