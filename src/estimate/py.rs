//! The estimate's Python face, `_core.estimate`: a fake step's recording replayed (it comes
//! in once as JSON, the replay's figures go out once as JSON), and an estimate checked and
//! rendered from its JSON text.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::plan::{analyse as plan_analyse, render as plan_text, result::Plan};
use super::render::{html, text};
use super::replay::{self, Recording};
use super::result::Estimate;
use crate::results::py::{no_view, submodule};
use crate::results::{from_json, to_json};

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "estimate",
        "A fake training step's recording replayed through an allocator model, and an \
         estimate checked and rendered from its JSON text.",
    )?;
    m.add_function(wrap_pyfunction!(replay_recording, &m)?)?;
    m.add_function(wrap_pyfunction!(validate, &m)?)?;
    m.add_function(wrap_pyfunction!(render, &m)?)?;
    m.add_function(wrap_pyfunction!(plan_complete, &m)?)?;
    m.add_function(wrap_pyfunction!(plan_validate, &m)?)?;
    m.add_function(wrap_pyfunction!(plan_render, &m)?)?;
    Ok(())
}

/// Replay a recording (`{"device_type", "events": [[op, id, bytes], ...], "categories",
/// "n_categories", "n_phases"}`); the replay's figures as JSON (`replay::Replay`).
#[pyfunction]
#[pyo3(name = "replay")]
fn replay_recording(py: Python<'_>, recording: &str) -> PyResult<String> {
    let r: Recording = from_json(recording)?;
    let found = py.detach(|| {
        replay::replay(
            r.device_type,
            &r.events,
            &r.categories,
            r.n_categories,
            r.n_phases,
        )
    });
    Ok(to_json(&found))
}

/// An `estimate` result's data as its derive reads it, with the rules between its fields,
/// in canonical form; a ValueError names the field that does not fit.
#[pyfunction]
fn validate(data: &str) -> PyResult<String> {
    Ok(to_json(&Estimate::from_json(data)?))
}

/// The estimate as `text` (the modelsize style) or `html`; it takes no view.
#[pyfunction]
fn render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let estimate = Estimate::from_json(data)?;
    no_view(view, "an estimate")?;
    match format {
        "text" => Ok(text::render(&estimate)),
        "html" => Ok(html::render(&estimate)),
        other => Err(PyValueError::new_err(format!(
            "format={other:?}: an estimate renders as text or html"
        ))),
    }
}

/// A what-if plan from its rows (JSON): the choice that saves the most found.
#[pyfunction]
fn plan_complete(rows: &str) -> PyResult<String> {
    Ok(to_json(&plan_analyse::complete(Plan::from_json(rows)?)))
}

/// A plan's data as its derive reads it, with the rules between its fields (a ValueError
/// naming the field that does not fit).
#[pyfunction]
fn plan_validate(data: &str) -> PyResult<String> {
    Ok(to_json(&Plan::from_json(data)?))
}

/// The plan as `text` (its table) or `json`; it takes no view.
#[pyfunction]
fn plan_render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let plan = Plan::from_json(data)?;
    no_view(view, "a plan")?;
    match format {
        "text" => Ok(plan_text::text(&plan)),
        "json" => Ok(to_json(&plan)),
        other => Err(PyValueError::new_err(format!(
            "format={other:?}: a plan renders as text or json"
        ))),
    }
}
