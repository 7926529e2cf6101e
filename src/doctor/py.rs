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
    leaks::register(&m)?;
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

/// The leak check: `leaks_analyse` (a recording in, the result's JSON out), `leaks_validate`,
/// `leaks_render`, `leaks_limit_text`.
mod leaks {
    use super::*;
    use crate::doctor::leaks::{analyse, render, result::LeakReport};

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_function(wrap_pyfunction!(leaks_analyse, m)?)?;
        m.add_function(wrap_pyfunction!(leaks_validate, m)?)?;
        m.add_function(wrap_pyfunction!(leaks_render, m)?)?;
        m.add_function(wrap_pyfunction!(leaks_limit_text, m)?)?;
        Ok(())
    }

    /// The growing sites of a recording (`analyse::Input` as JSON), as a `leaks` result's
    /// JSON; a ValueError naming what does not fit.
    #[pyfunction]
    fn leaks_analyse(py: Python<'_>, recording: &str) -> PyResult<String> {
        let input: analyse::Input = from_json(recording)?;
        let report = py
            .detach(|| analyse::analyse(&input))
            .map_err(PyValueError::new_err)?;
        Ok(to_json(&report))
    }

    /// A `leaks` result's data as its derive reads it, in canonical form.
    #[pyfunction]
    fn leaks_validate(data: &str) -> PyResult<String> {
        Ok(to_json(&from_json::<LeakReport>(data)?))
    }

    /// The result as text. It takes no view.
    #[pyfunction]
    fn leaks_render(data: &str, format: &str, view: &str) -> PyResult<String> {
        let report: LeakReport = from_json(data)?;
        no_view(view, "a leaks result")?;
        match format {
            "text" => Ok(render::text(&report)),
            other => Err(PyValueError::new_err(format!(
                "format={other:?}: a leaks result renders as text"
            ))),
        }
    }

    /// The failure message of a test whose sites grew by more than `limit` bytes per call
    /// (`marker` as the test wrote it).
    #[pyfunction]
    fn leaks_limit_text(data: &str, marker: &str, limit: i64) -> PyResult<String> {
        let report: LeakReport = from_json(data)?;
        Ok(render::limit_text(&report, marker, limit))
    }
}
