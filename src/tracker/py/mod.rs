//! The tracker's Python face, `_core.tracker`: the collector (`TrackerCore`, whose `track`
//! returns a result's JSON), and a `tracker` result checked (`validate`) and rendered
//! (`render`) from its JSON text.

mod core;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::render as renderers;
use super::result::Track;
use crate::results::py::{no_view, submodule};
use crate::results::{from_json, to_json};

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "tracker",
        "The tensor diff tracker (MemTracker): its collector, and a track()'s result checked \
         and rendered from its JSON text.",
    )?;
    m.add_class::<core::TrackerCore>()?;
    m.add_function(wrap_pyfunction!(validate, &m)?)?;
    m.add_function(wrap_pyfunction!(render, &m)?)?;
    Ok(())
}

/// A `tracker` result's data as its derive reads it (a ValueError naming the field that
/// does not fit), in canonical form.
#[pyfunction]
fn validate(data: &str) -> PyResult<String> {
    Ok(to_json(&from_json::<Track>(data)?))
}

/// The result as `text` (the block `track()` appended to the log, in the original's
/// layout) or `html` (a table); neither takes a view.
///
/// >>> import json
/// >>> from memlab_rs._core import tracker
/// >>> row = dict(sign="+", count=1, shape="(2,)", dtype="torch.float32", bytes=512,
/// ...            storage_bytes=8, type="<class 'torch.Tensor'>", names=[], line="")
/// >>> data = dict(rows=[row], total_bytes=512, total_storage_bytes=8, allocated_bytes=512,
/// ...             tensors=1, where="a.py line 3: f", strategy="gc.get_objects()",
/// ...             incomplete=None, seconds={}, detail=True, stamp=None)
/// >>> print(tracker.render(json.dumps(data), "text", "{}").strip())
/// + | 1 * Size:(2,)                 | Memory: 0.0000 M | <class 'torch.Tensor'> | torch.float32
/// <BLANKLINE>
/// At a.py line 3: f                                      Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb
#[pyfunction]
fn render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let track: Track = from_json(data)?;
    no_view(view, "a tracker result")?;
    match format {
        "text" => Ok(renderers::log_block(&track)),
        "html" => Ok(renderers::table(&track)),
        other => Err(PyValueError::new_err(format!(
            "format={other:?}: a tracker result renders as text or html"
        ))),
    }
}
