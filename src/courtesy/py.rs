//! Courtesy's Python face, `_core.courtesy`: the host book (`HostBook`, whose calls carry
//! plain numbers: the indexes and sizes of storages and buffers) and the reports' text,
//! each report crossing once as the JSON text of its dataclass's fields.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::book::{self, Pending, Placement};
use super::region;
use super::region_book::TagSettings;
use super::render::text;
use super::result::{RegionReport, RestoreReport, YieldReport};
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
    m.add_function(wrap_pyfunction!(region_text, &m)?)?;
    m.add_function(wrap_pyfunction!(region_configure, &m)?)?;
    m.add_function(wrap_pyfunction!(region_slot, &m)?)?;
    m.add_function(wrap_pyfunction!(region_pause, &m)?)?;
    m.add_function(wrap_pyfunction!(region_resume, &m)?)?;
    m.add_function(wrap_pyfunction!(region_state, &m)?)?;
    m.add_function(wrap_pyfunction!(region_owner, &m)?)?;
    m.add_function(wrap_pyfunction!(region_release_host, &m)?)?;
    m.add_function(wrap_pyfunction!(region_close, &m)?)?;
    m.add_function(wrap_pyfunction!(region_counters, &m)?)?;
    // The C functions torch's pluggable allocator looks up in this library: one
    // allocation function per slot ("memlab_rs_region_malloc_<slot>"), one free.
    m.add("REGION_MALLOC_PREFIX", "memlab_rs_region_malloc_")?;
    m.add("REGION_FREE", "memlab_rs_region_free")?;
    m.add("REGION_SLOTS", region::SLOTS)?;
    Ok(())
}

/// A region's pause or resume report (`RegionReport`'s fields as JSON) as text.
#[pyfunction]
fn region_text(report: &str) -> PyResult<String> {
    Ok(text::region_text(&from_json::<RegionReport>(report)?))
}

/// How `tag`'s segments are paused: copied to the host or discarded, host buffers pinned
/// ahead or at the pause.
#[pyfunction]
fn region_configure(tag: &str, keep_contents: bool, prepare_host: bool) {
    region::configure(
        tag,
        TagSettings {
            keep_contents,
            prepare_host,
        },
    );
}

/// The allocation function slot of `tag` (a free one if it has none); None when all are
/// taken.
#[pyfunction]
fn region_slot(tag: &str) -> Option<usize> {
    region::slot(tag)
}

/// Pause `tags` (all when empty), copying the live `(address, length)` ranges (gaps
/// shorter than `join_gap` bytes copied with them); the report as JSON. The GIL is
/// released: the copies take a while and touch no Python object.
#[pyfunction]
#[pyo3(signature = (tags, live, join_gap=region::JOIN_GAP))]
fn region_pause(
    py: Python<'_>,
    tags: Vec<String>,
    live: Vec<(u64, u64)>,
    join_gap: u64,
) -> PyResult<String> {
    let report = py.detach(|| region::pause(&tags, &live, join_gap));
    serde_json::to_string(&report).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Resume `tags` (all when empty); the report as JSON.
#[pyfunction]
fn region_resume(py: Python<'_>, tags: Vec<String>) -> PyResult<String> {
    let report = py.detach(|| region::resume(&tags));
    serde_json::to_string(&report).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Per (tag, device): segments, mapped, paused and host bytes, ranges; as JSON.
#[pyfunction]
fn region_state() -> PyResult<String> {
    serde_json::to_string(&region::state()).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The tag of the region segment holding `address`, or None.
#[pyfunction]
fn region_owner(address: u64) -> Option<String> {
    region::owner(address)
}

/// Free the pinned host buffers of `tags` (all when empty) that hold nothing paused, and
/// the spare ones; the bytes freed.
#[pyfunction]
fn region_release_host(py: Python<'_>, tags: Vec<String>) -> u64 {
    py.detach(|| region::release_host(&tags))
}

/// `tag`'s region closes: its settings and slot go now if it has no segment left, else
/// with its last one (whose host buffers are then freed); whether it is gone.
#[pyfunction]
fn region_close(tag: &str) -> bool {
    region::close(tag)
}

/// (seconds, bytes) the background thread spent pinning host buffers, and frees of
/// addresses no region gave out.
#[pyfunction]
fn region_counters() -> (f64, u64, u64) {
    region::counters()
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
