//! The trace room's Python face, `_core.trace`: the analysis (`TraceAnalysis`, in `analysis`),
//! the dict reader it uses for a snapshot dict (`load`, the room's collector: it reads Python
//! objects), the pickle guard, the saved trace's check, and the timeline drawn from a view.
//! Everything structured crosses as JSON text read or written by a `result` derive.

mod analysis;
mod load;

use pyo3::exceptions::{
    PyFileNotFoundError, PyMemoryError, PyNotImplementedError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;

pub use analysis::TraceAnalysis;

use crate::results::py::submodule;
use crate::results::{from_json, to_json};
use crate::trace::error::ReadError;
use crate::trace::pickle_guard::{check_file, Refusal};
use crate::trace::render::timeline::{self as timeline_render, ViewError};
use crate::trace::result::{CheckedPickle, Saved};

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "trace",
        "Allocation histories analysed (what was alive at the peak, by line and by module), \
         snapshot pickles checked before anything reads them, the timeline drawn.",
    )?;
    m.add_class::<TraceAnalysis>()?;
    m.add_function(wrap_pyfunction!(validate, &m)?)?;
    m.add_function(wrap_pyfunction!(check_snapshot_pickle, &m)?)?;
    m.add_function(wrap_pyfunction!(timeline_view, &m)?)?;
    m.add_function(wrap_pyfunction!(timeline_html, &m)?)?;
    Ok(())
}

impl From<ReadError> for PyErr {
    fn from(e: ReadError) -> PyErr {
        match e {
            ReadError::Invalid(m) => PyValueError::new_err(m),
            ReadError::Unsupported(m) => PyNotImplementedError::new_err(m),
            ReadError::Missing(m) => PyFileNotFoundError::new_err(m),
            ReadError::NoMemory(m) => PyMemoryError::new_err(m),
        }
    }
}

impl From<ViewError> for PyErr {
    fn from(e: ViewError) -> PyErr {
        match e {
            ViewError::Type(m) => PyTypeError::new_err(m),
            ViewError::Missing(m) | ViewError::Inconsistent(m) => PyValueError::new_err(m),
        }
    }
}

/// Check a saved trace's fields but its snapshot (the JSON of `result::Saved`: `source`,
/// `exclude`, `paths`, `frames`, `stacks`): a ValueError naming the field that does not fit.
/// The snapshot, torch's schema, is checked by the reader that analyses it.
#[pyfunction]
fn validate(data: &str) -> PyResult<()> {
    from_json::<Saved>(data)?.check()?;
    Ok(())
}

/// Check the pickle at `path` before anything reads it (`pickle_guard`): plain data only,
/// every table bounded by the file's size. Returns the JSON of `{"protocol", "values"}` (the
/// values a full walk visits); raises ValueError naming the opcode or bound and its byte,
/// FileNotFoundError.
#[pyfunction]
fn check_snapshot_pickle(py: Python<'_>, path: String) -> PyResult<String> {
    match py.detach(|| check_file(&path)) {
        Ok(c) => Ok(to_json(&CheckedPickle {
            protocol: c.protocol,
            values: c.values,
        })),
        Err(Refusal::Missing) => Err(PyFileNotFoundError::new_err(format!(
            "no snapshot file at {path:?}"
        ))),
        Err(refusal) => Err(PyValueError::new_err(refusal.message(&path))),
    }
}

/// A timeline view (the JSON of what `TraceResult.timeline(device)` returns, or one made by
/// hand) checked as the renderers draw it, in canonical form: a ValueError for a missing key
/// or lengths that disagree, a TypeError naming the key whose value is not what it holds.
#[pyfunction]
fn timeline_view(view: &str) -> PyResult<String> {
    Ok(to_json(&timeline_render::read(view)?))
}

/// The timeline as one self-contained HTML document (a view's JSON in, as `timeline_view`
/// checks it; the page out).
#[pyfunction]
fn timeline_html(view: &str) -> PyResult<String> {
    Ok(timeline_render::timeline_html(&timeline_render::read(
        view,
    )?))
}
