//! The doctor room's Python face, `_core.doctor`: each result checked, completed and
//! rendered from its JSON text.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::postmortem::{analyse, render as pm_render, result::PostMortem};
use crate::allocator::fragmentation::{self, render, Fragmentation, Input};
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
    m.add_function(wrap_pyfunction!(fragmentation_analyse, &m)?)?;
    m.add_function(wrap_pyfunction!(fragmentation_validate, &m)?)?;
    m.add_function(wrap_pyfunction!(fragmentation_render, &m)?)?;
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

// -- fragmentation (the analysis is the allocator floor's: src/allocator/fragmentation) --

/// The fragmentation of one device from its snapshot's JSON (`input`: device, segments,
/// allocator_conf, max_split_size, reported, device_free_bytes, allowed_bytes, request), as
/// the result's JSON; a ValueError naming the field a damaged snapshot breaks.
#[pyfunction]
fn fragmentation_analyse(py: Python<'_>, input: &str) -> PyResult<String> {
    let input: Input = from_json(input)?;
    // Pure Rust over owned data: other threads may run meanwhile.
    let result = py
        .detach(|| fragmentation::analyse(&input))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(to_json(&result))
}

/// A `fragmentation` result's data as its derive reads it, in canonical form.
#[pyfunction]
fn fragmentation_validate(data: &str) -> PyResult<String> {
    Ok(to_json(&from_json::<Fragmentation>(data)?))
}

/// The result as text, html, json or csv (its segments). It takes no view.
#[pyfunction]
fn fragmentation_render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let result: Fragmentation = from_json(data)?;
    no_view(view, "a fragmentation result")?;
    match format {
        "text" => Ok(render::text(&result)),
        "html" => Ok(render::html(&result)),
        "json" => Ok(render::json(&result)),
        "csv" => Ok(render::csv(&result)),
        other => Err(PyValueError::new_err(format!(
            "format={other:?}: a fragmentation result renders as text, html, json or csv"
        ))),
    }
}
