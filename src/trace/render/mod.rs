//! Allocation-history results: text, HTML, CSV/JSON data and the offline timeline.

pub mod data;
pub mod html;
pub mod text;
pub mod timeline;
