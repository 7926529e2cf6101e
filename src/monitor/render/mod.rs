//! The training monitor: the original block and CSV, and the per-iteration HTML plot.

pub mod html;
pub mod text;
