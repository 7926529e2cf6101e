//! The training monitor's Python face, `_core.monitor`: a folder, because the monitor's
//! collector is itself interpreter hooks. The hot path stays pyclasses with their own cost
//! per tensor and per node (`saved`: the saved-tensor hooks; `live`: the reads at each
//! boundary; `gradients`: a backward's intermediate gradients; `source`: the allocator's
//! figures); only results cross as data. Each iteration's figures come in once as JSON text
//! (`Recorder.push`), the record goes out once as the JSON text of its derive
//! (`Recorder.data`), and a saved record is checked and rendered from that text
//! (`validate`, `render`).

pub mod gradients;
pub mod live;
pub mod saved;
pub mod source;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::record::{Head, Iteration, Recorder as Books};
use super::render::{render as render_record, View};
use super::result::{Layout, MonitorRecord};
use crate::results::py::submodule;
use crate::results::{from_json, to_json};

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "monitor",
        "The training monitor's hooks, its record growing per iteration, and a monitor \
         result checked and rendered from its JSON text.",
    )?;
    m.add_class::<source::MonitorSource>()?;
    m.add_class::<saved::SavedTensorHooks>()?;
    m.add_class::<saved::SavedHeld>()?;
    m.add_class::<live::MonitorTensors>()?;
    m.add_class::<gradients::GradientLog>()?;
    m.add_class::<gradients::GradientNodeHook>()?;
    m.add_class::<Recorder>()?;
    m.add_function(wrap_pyfunction!(live::data_ptrs, &m)?)?;
    m.add_function(wrap_pyfunction!(live::state_ids, &m)?)?;
    m.add_function(wrap_pyfunction!(validate, &m)?)?;
    m.add_function(wrap_pyfunction!(render, &m)?)?;
    Ok(())
}

/// A `monitor` result's data as its derive reads it, with the rules between its fields
/// (`MonitorRecord::check`), in canonical form; a ValueError names the field that does not
/// fit.
#[pyfunction]
fn validate(data: &str) -> PyResult<String> {
    Ok(to_json(&MonitorRecord::from_json(data)?))
}

/// The record as `format` (`text`: one iteration's block; `csv`: the file, one row, or the
/// header; `html`: the plot) with `view` (`{"iteration": step, "header": bool}`).
#[pyfunction]
fn render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let record = MonitorRecord::from_json(data)?;
    rendered(&record, format, view)
}

fn rendered(record: &MonitorRecord, format: &str, view: &str) -> PyResult<String> {
    let view: View = from_json(view)?;
    render_record(record, format, &view).map_err(PyValueError::new_err)
}

/// A live monitor's record: its settings (`head`, JSON: device, verbose, print_period,
/// csv_names) first, then one `push` per iteration. The monitor prints from it every
/// iteration without the record crossing to Python; `data()` hands it over whole.
#[pyclass(module = "memlab_rs._core.monitor")]
pub struct Recorder {
    books: Books,
}

#[pymethods]
impl Recorder {
    #[new]
    fn new(head: &str) -> PyResult<Self> {
        let head: Head = from_json(head)?;
        Ok(Self {
            books: Books::new(head),
        })
    }

    /// The parameter rows from now on (`{"names": [...], "bytes": [...]}`).
    fn set_layout(&mut self, layout: &str) -> PyResult<()> {
        let layout: Layout = from_json(layout)?;
        Ok(self.books.set_layout(layout)?)
    }

    /// Add one iteration (its JSON, `record::Iteration`); its step (1, 2, ...).
    fn push(&mut self, iteration: &str) -> PyResult<usize> {
        let iteration: Iteration = from_json(iteration)?;
        Ok(self.books.push(iteration)?)
    }

    /// The record so far as the JSON text of its derive (a `monitor` result's data).
    fn data(&self) -> String {
        to_json(self.books.record())
    }

    /// The record so far rendered, as `render` does.
    fn render(&self, format: &str, view: &str) -> PyResult<String> {
        rendered(self.books.record(), format, view)
    }

    fn __len__(&self) -> usize {
        self.books.record().rows.len()
    }
}
