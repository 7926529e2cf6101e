//! MemReporter's tensor report: pytorch_memlab's text, HTML and JSON.

pub mod html;
pub mod json;
pub mod text;
