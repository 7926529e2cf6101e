//! The tensor report's renderers, plain data in, text out: pytorch_memlab's text, HTML and
//! JSON of a report; text and HTML of a merged report; the text of a diff of two.

pub mod diff;
pub mod html;
pub mod json;
pub mod merged;
pub mod text;
