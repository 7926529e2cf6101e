//! Python entry points of the trace renderers: the offline timeline from the dict that
//! `TraceResult.timeline(device)` returns.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::render::trace::timeline::{check, timeline_html, TimelineView};

fn view_error(key: &str, what: &str, err: impl std::fmt::Display) -> PyErr {
    PyTypeError::new_err(format!(
        "timeline view['{key}'] must be {what} ({err}); pass the dict report.timeline(device) returns"
    ))
}

fn required<'py>(view: &Bound<'py, PyDict>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    view.get_item(key)?.ok_or_else(|| {
        PyValueError::new_err(format!(
            "timeline view has no '{key}'; it needs title, time_us, total, layers, peak_index, \
             peak_bytes and notices, as report.timeline(device) returns"
        ))
    })
}

fn byte_list(value: &Bound<'_, PyAny>, key: &str) -> PyResult<Vec<u64>> {
    if value.is_instance_of::<PyString>() {
        return Err(view_error(key, "a list of byte counts", "got a str"));
    }
    value
        .extract::<Vec<u64>>()
        .map_err(|e| view_error(key, "a list of byte counts (ints >= 0)", e))
}

fn view_from_dict(view: &Bound<'_, PyDict>) -> PyResult<TimelineView> {
    let title = match view.get_item("title")? {
        Some(t) => t
            .extract::<String>()
            .map_err(|e| view_error("title", "a str", e))?,
        None => String::new(),
    };
    let time_us = required(view, "time_us")?
        .extract::<Vec<i64>>()
        .map_err(|e| view_error("time_us", "a list of ints (microseconds)", e))?;
    let total = byte_list(&required(view, "total")?, "total")?;
    let mut layers = Vec::new();
    for item in required(view, "layers")?
        .try_iter()
        .map_err(|e| view_error("layers", "a list of (name, byte counts) pairs", e))?
    {
        let item = item?;
        let (name, values): (String, Bound<'_, PyAny>) = match item.extract() {
            Ok(pair) => pair,
            Err(_) => {
                let parts: Vec<Bound<'_, PyAny>> = item
                    .extract()
                    .map_err(|e| view_error("layers", "a list of (name, byte counts) pairs", e))?;
                let [name, values]: [Bound<'_, PyAny>; 2] = parts.try_into().map_err(|_| {
                    view_error(
                        "layers",
                        "a list of (name, byte counts) pairs",
                        "not a pair",
                    )
                })?;
                let name = name
                    .extract::<String>()
                    .map_err(|e| view_error("layers", "pairs whose name is a str", e))?;
                (name, values)
            }
        };
        layers.push((name, byte_list(&values, "layers")?));
    }
    let peak_index = required(view, "peak_index")?
        .extract::<usize>()
        .map_err(|e| view_error("peak_index", "an int >= 0", e))?;
    let peak_bytes = required(view, "peak_bytes")?
        .extract::<u64>()
        .map_err(|e| view_error("peak_bytes", "an int >= 0", e))?;
    let notices = match view.get_item("notices")? {
        Some(n) if !n.is_instance_of::<PyString>() => n
            .extract::<Vec<String>>()
            .map_err(|e| view_error("notices", "a list of str", e))?,
        Some(_) => return Err(view_error("notices", "a list of str", "got a str")),
        None => Vec::new(),
    };
    let view = TimelineView {
        title,
        time_us,
        total,
        layers,
        peak_index,
        peak_bytes,
        notices,
    };
    if let Some(problem) = check(&view) {
        return Err(PyValueError::new_err(format!(
            "timeline view is inconsistent: {problem}"
        )));
    }
    Ok(view)
}

/// The timeline of a trace as one self-contained HTML document (a dict with the keys of
/// `report.timeline(device)` in, the page out).
///
/// >>> from memlab_rs._core import _trace_timeline_html
/// >>> page = _trace_timeline_html({"title": "cpu", "time_us": [0, 1000, 2000],
/// ...     "total": [0, 1 << 20, 0], "layers": [("model.py:3 (f)", [0, 1 << 20, 0])],
/// ...     "peak_index": 1, "peak_bytes": 1 << 20, "notices": []})
/// >>> "peak 1.0 MiB (1048576 bytes)" in page
/// True
#[pyfunction]
pub fn _trace_timeline_html(view: &Bound<'_, PyDict>) -> PyResult<String> {
    Ok(timeline_html(&view_from_dict(view)?))
}
