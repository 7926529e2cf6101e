//! Python entry points of the estimate renderers.

use pyo3::prelude::*;

use super::render::text::Line;
use super::render::{html, text};

/// The estimate as the original modelsize-style text table.
#[pyfunction]
pub fn _estimate_text(model: &str, lines: Vec<Line>, notes: Vec<String>) -> String {
    text::render(model, &lines, &notes)
}

/// The estimate as HTML.
#[pyfunction]
pub fn _estimate_html(model: &str, lines: Vec<Line>, notes: Vec<String>) -> String {
    html::render(model, &lines, &notes)
}
