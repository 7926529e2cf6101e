//! Courtesy's Python face, `_core.courtesy`: the host book (`HostBook`, whose calls carry
//! plain numbers: the indexes and sizes of storages and buffers) and the reports' text,
//! each report crossing once as the JSON text of its dataclass's fields.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::book::{self, Pending, Placement};
use super::render::text;
use super::result::{RestoreReport, YieldReport};
use crate::results::from_json;
use crate::results::py::submodule;

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "courtesy",
        "Courtesy's host book (where each yielded storage sits in the pinned buffers) and \
         its reports' text.",
    )?;
    m.add_class::<HostBook>()?;
    m.add_function(wrap_pyfunction!(yield_text, &m)?)?;
    m.add_function(wrap_pyfunction!(restore_text, &m)?)?;
    Ok(())
}

/// A yield's report (`YieldReport`'s fields as JSON) as the message `str()` gives.
#[pyfunction]
fn yield_text(report: &str) -> PyResult<String> {
    Ok(text::yield_text(&from_json::<YieldReport>(report)?))
}

/// A restore's report (`RestoreReport`'s fields as JSON) as the message `str()` gives.
#[pyfunction]
fn restore_text(report: &str) -> PyResult<String> {
    Ok(text::restore_text(&from_json::<RestoreReport>(report)?))
}

/// The host side of a `Courtesy`: buffers and storage records (`book`).
#[pyclass(module = "memlab_rs._core.courtesy")]
#[derive(Default)]
pub struct HostBook {
    book: book::HostBook,
}

#[pymethods]
impl HostBook {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Place storages of `(device, nbytes)` on the host. Returns the index of the buffer
    /// they go to, the size of a buffer to allocate first (0 to reuse a free one), and for
    /// each storage its record index and byte offset in that buffer.
    fn place(&mut self, storages: Vec<(i64, u64)>) -> PyResult<Placement> {
        self.book.place(storages).map_err(PyValueError::new_err)
    }

    /// Records still on the host, as (record, device, nbytes, buffer, offset), largest
    /// first.
    fn pending(&self) -> Vec<Pending> {
        self.book.pending()
    }

    /// These records are back on their device.
    fn restored(&mut self, records: Vec<usize>) -> PyResult<()> {
        self.book.restored(records).map_err(PyValueError::new_err)
    }

    /// Every tensor of these records died while they were on the host.
    fn gone(&mut self, records: Vec<usize>) -> PyResult<()> {
        self.book.gone(records).map_err(PyValueError::new_err)
    }

    /// (storages, bytes) on the host now.
    fn on_host(&self) -> (usize, u64) {
        self.book.on_host()
    }

    /// Capacities of the pinned buffers (kept for the next yield).
    fn buffers(&self) -> Vec<u64> {
        self.book.buffers()
    }

    /// Which buffers hold nothing that still has to come back.
    fn free_buffers(&self) -> Vec<usize> {
        self.book.free_buffers()
    }

    /// Drop the free buffers and the records of storages already back; the indexes of the
    /// buffers dropped, in descending order.
    fn release_free(&mut self) -> Vec<usize> {
        self.book.release_free()
    }
}
