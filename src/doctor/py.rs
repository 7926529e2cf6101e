//! The doctor room's Python face, `_core.doctor`: each result checked, completed and
//! rendered from its JSON text.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::postmortem::{analyse, render as pm_render, result::PostMortem};
use crate::results::py::{no_view, submodule};
use crate::results::{from_json, to_json};

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "doctor",
        "The doctor's results (post-mortem, fragmentation, leaks) checked and rendered from their JSON text.",
    )?;
    m.add_function(wrap_pyfunction!(postmortem_complete, &m)?)?;
    m.add_function(wrap_pyfunction!(postmortem_validate, &m)?)?;
    m.add_function(wrap_pyfunction!(postmortem_render, &m)?)?;
    Ok(())
}

/// The post-mortem from the facts Python gathered (JSON): its pools and advice computed.
#[pyfunction]
fn postmortem_complete(facts: &str) -> PyResult<String> {
    Ok(to_json(&analyse::complete(from_json::<PostMortem>(facts)?)))
}

/// A post-mortem's data as its derive reads it (a ValueError naming the field).
#[pyfunction]
fn postmortem_validate(data: &str) -> PyResult<String> {
    Ok(to_json(&from_json::<PostMortem>(data)?))
}

/// The post-mortem as `text`, `summary` (stderr's lines), `html` or `json`.
#[pyfunction]
fn postmortem_render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let pm: PostMortem = from_json(data)?;
    no_view(view, "a postmortem result")?;
    match format {
        "text" => Ok(pm_render::text(&pm)),
        "summary" => Ok(pm_render::summary(&pm)),
        "html" => Ok(pm_render::html(&pm)),
        "json" => Ok(to_json(&pm)),
        other => Err(PyValueError::new_err(format!(
            "format={other:?}: a postmortem result renders as text, summary, html or json"
        ))),
    }
}
