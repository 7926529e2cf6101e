//! The doctor room's Python face, `_core.doctor`: each result checked and rendered from its
//! JSON text.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::results::py::{no_view, submodule};
use crate::results::{from_json, to_json};

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "doctor",
        "The doctor's results (post-mortem, fragmentation, leaks) checked and rendered from their JSON text.",
    )?;
    leaks::register(&m)?;
    Ok(())
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
