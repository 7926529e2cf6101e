//! The test-memory room's Python face, `_core.test_memory`: the result checked and rendered
//! from its JSON text, the limit failure of one measurement, the session's table of peaks.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::render::{text, Measurement, Peak};
use super::result::TestMemory;
use crate::results::py::{no_view, submodule};
use crate::results::{from_json, to_json};

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "test_memory",
        "A test's memory (the pytest plugin's result) checked and rendered from its JSON text.",
    )?;
    m.add_function(wrap_pyfunction!(validate, &m)?)?;
    m.add_function(wrap_pyfunction!(render, &m)?)?;
    m.add_function(wrap_pyfunction!(limit_text, &m)?)?;
    m.add_function(wrap_pyfunction!(top_table, &m)?)?;
    Ok(())
}

/// A `test_memory` result's data as its derive reads it (a ValueError naming the field
/// that does not fit), in canonical form.
#[pyfunction]
fn validate(data: &str) -> PyResult<String> {
    Ok(to_json(&from_json::<TestMemory>(data)?))
}

/// The result as text: its node id, outcome, and each device measured. It takes no view.
#[pyfunction]
fn render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let result: TestMemory = from_json(data)?;
    no_view(view, "a test_memory result")?;
    match format {
        "text" => Ok(text::render(&result)),
        other => Err(PyValueError::new_err(format!(
            "format={other:?}: a test_memory result renders as text"
        ))),
    }
}

/// The failure message of a test over its limit (`marker` as the test wrote it), with the
/// `top` biggest rows alive at the peak; `measurement` is one measurement's JSON.
#[pyfunction]
fn limit_text(measurement: &str, marker: &str, top: usize) -> PyResult<String> {
    let m: Measurement = from_json(measurement)?;
    Ok(text::limit_exceeded(&m, marker, top))
}

/// The session's table of one device's highest peaks (`peaks`: a JSON list of `{nodeid,
/// peak_bytes, limit_bytes, outcome}`, highest first), out of `measured` tests.
#[pyfunction]
fn top_table(device: &str, peaks: &str, measured: usize) -> PyResult<String> {
    let peaks: Vec<Peak> = from_json(peaks)?;
    Ok(text::top_table(device, &peaks, measured))
}
