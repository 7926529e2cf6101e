//! Python entry points of the monitor renderers: the printed block, the CSV and the HTML
//! plot, and the row names they share.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::render::html;
use super::render::text::{block, csv_header, csv_row, to_block, Figures};

/// The parameter rows' names (tied weights joined by `+`), held on the Rust side: they change
/// only when the model's parameters do, and a block is printed every iteration.
#[pyclass(module = "memlab_rs._core", frozen)]
pub struct MonitorRowNames {
    names: Vec<String>,
}

#[pymethods]
impl MonitorRowNames {
    #[new]
    fn new(names: Vec<String>) -> Self {
        Self { names }
    }

    fn __len__(&self) -> usize {
        self.names.len()
    }

    /// The names, in row order (what a saved monitor result holds).
    #[getter]
    fn names(&self) -> Vec<String> {
        self.names.clone()
    }
}

/// (name, bytes, gradient bytes) per row, or an error naming the mismatch.
fn weights(
    names: &MonitorRowNames,
    bytes: &[i64],
    grads: &[i64],
) -> PyResult<Vec<(String, i64, i64)>> {
    if bytes.len() != names.names.len() || grads.len() != names.names.len() {
        return Err(PyValueError::new_err(format!(
            "monitor rows: {} names, {} byte counts, {} gradient counts",
            names.names.len(),
            bytes.len(),
            grads.len()
        )));
    }
    Ok(names
        .names
        .iter()
        .zip(bytes.iter().zip(grads))
        .map(|(n, (b, g))| (n.clone(), *b, *g))
        .collect())
}

/// The printed block (see `block`).
#[pyfunction]
#[pyo3(signature = (figures, modules, names, bytes, grads, notice=None))]
pub fn _monitor_text(
    figures: Figures,
    modules: Vec<(String, i64)>,
    names: &Bound<'_, MonitorRowNames>,
    bytes: Vec<i64>,
    grads: Vec<i64>,
    notice: Option<String>,
) -> PyResult<String> {
    let weights = weights(names.get(), &bytes, &grads)?;
    Ok(block(&to_block(figures, modules, weights, notice)))
}

/// The CSV header for these parameter names.
#[pyfunction]
pub fn _monitor_csv_header(names: Vec<String>) -> String {
    csv_header(&names)
}

/// One CSV row.
#[pyfunction]
pub fn _monitor_csv_row(
    figures: Figures,
    names: &Bound<'_, MonitorRowNames>,
    bytes: Vec<i64>,
    grads: Vec<i64>,
) -> PyResult<String> {
    let weights = weights(names.get(), &bytes, &grads)?;
    Ok(csv_row(&to_block(figures, Vec::new(), weights, None)))
}

/// Memory per iteration by category as one HTML fragment.
#[pyfunction]
pub fn _monitor_html(
    title: &str,
    names: Vec<String>,
    labels: Vec<String>,
    values: Vec<Vec<i64>>,
) -> PyResult<String> {
    if labels.len() != values.len() || values.iter().any(|v| v.len() != names.len()) {
        return Err(PyValueError::new_err(
            "_monitor_html: one label per row and one value per category name",
        ));
    }
    Ok(html::render(title, &names, &labels, &values))
}
