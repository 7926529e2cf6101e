//! The memory estimate: the original modelsize-style text table and HTML.

pub mod html;
pub mod text;
