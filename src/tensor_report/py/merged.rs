//! `_core.merged_tensor_report`: the reports of several ranks merged (`merge`), and the
//! merged report checked (`validate`), rendered (`render`) and listed (`records`) from its
//! JSON text.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::results::py::{no_view, submodule};
use crate::results::{from_json, to_json};
use crate::tensor_report::merge::{self as merging, MergeInput};
use crate::tensor_report::render::merged as render_merged;
use crate::tensor_report::result::MergedTensorReport;

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "merged_tensor_report",
        "Tensor reports of several ranks merged tensor by tensor, checked and rendered from \
         the merged report's JSON text.",
    )?;
    m.add_function(wrap_pyfunction!(merge, &m)?)?;
    m.add_function(wrap_pyfunction!(validate, &m)?)?;
    m.add_function(wrap_pyfunction!(render, &m)?)?;
    m.add_function(wrap_pyfunction!(records, &m)?)?;
    Ok(())
}

/// Merge reports: `inputs` is `{"ranks": [...], "world_size": N, "reports": [data, ...]}`,
/// the reports' data ordered by rank; the merged report's JSON.
#[pyfunction]
fn merge(inputs: &str) -> PyResult<String> {
    let input: MergeInput = from_json(inputs)?;
    Ok(to_json(&merging::merge(input)?))
}

/// A `merged_tensor_report` result's data as its derive reads it, and its rules between
/// fields (one rank once, one size per rank), or a ValueError naming the field.
#[pyfunction]
fn validate(data: &str) -> PyResult<String> {
    Ok(to_json(&MergedTensorReport::read(data)?))
}

/// The merged report as `text`, `html` or `csv` (its records); it takes no view.
#[pyfunction]
fn render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let merged = MergedTensorReport::read(data)?;
    no_view(view, "a merged_tensor_report")?;
    match format {
        "text" => Ok(render_merged::text(&merged)),
        "html" => Ok(render_merged::html(&merged)),
        "csv" => Ok(render_merged::csv(&merged)),
        other => Err(PyValueError::new_err(format!(
            "format={other:?}: a merged_tensor_report result renders as text, html or csv"
        ))),
    }
}

/// One record per tensor as a JSON list: name, device, shape, dtype, `min`, `median`,
/// `max`, `max_rank` and `rank<R>` (bytes on each rank).
#[pyfunction]
fn records(data: &str) -> PyResult<String> {
    let merged = MergedTensorReport::read(data)?;
    Ok(to_json(&merging::records(&merged)))
}
