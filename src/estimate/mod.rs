//! A training step's memory without allocating it: the Python side (`memlab_rs.estimate`)
//! runs the step on fake tensors and records every storage's birth and death; this module
//! replays that record through a model of the device's allocator.

pub mod allocator;
pub mod py;
pub mod render;
pub mod replay;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use allocator::Kind;
use replay::Event;

/// Replay a recorded step. Each event is `(op, id, bytes)`: op 0 allocates storage `id` of
/// `bytes` bytes, 1 frees it, 2 starts phase `id`; `categories[id]` indexes the caller's
/// category names. Returns a dict of the replay's figures.
#[pyfunction]
#[pyo3(signature = (device_type, recorded, categories, n_categories, n_phases))]
pub fn _estimate_replay<'py>(
    py: Python<'py>,
    device_type: &str,
    recorded: Vec<(u8, u64, u64)>,
    categories: Vec<u8>,
    n_categories: usize,
    n_phases: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let kind = match device_type {
        "cuda" => Kind::Cuda,
        "cpu" => Kind::Cpu,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "no allocator model for device type {other:?}: use \"cuda\" or \"cpu\""
            )))
        }
    };
    let mut events = Vec::with_capacity(recorded.len());
    for (op, id, size) in recorded {
        events.push(match op {
            0 => Event::Alloc { id, bytes: size },
            1 => Event::Free { id },
            2 => Event::Phase { index: id as usize },
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown event kind {other} (0 alloc, 1 free, 2 phase)"
                )))
            }
        });
    }
    let r = py.detach(|| replay::replay(kind, &events, &categories, n_categories, n_phases));
    let d = PyDict::new(py);
    d.set_item("peak_allocated", r.peak_allocated)?;
    d.set_item("peak_phase", r.peak_phase)?;
    d.set_item("peak_by_category", r.peak_by_category)?;
    d.set_item("phase_peaks", r.phase_peaks)?;
    d.set_item("phase_end_by_category", r.phase_end_by_category)?;
    d.set_item("peak_reserved", r.peak_reserved)?;
    d.set_item("reserved_end", r.reserved_end)?;
    d.set_item("segments", r.segments)?;
    d.set_item("unmatched_frees", r.unmatched_frees)?;
    Ok(d)
}
