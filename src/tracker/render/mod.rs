//! The tensor diff tracker: the original's log text, and HTML.

pub mod html;
pub mod text;
