//! The CPU source's Python side: the glue's calls (`lifecycle`: start and stop, which call
//! the probe, the baseline walk and the fallback's reset), the calling thread's stack read
//! from its frames (`stack`), the CPU trace's start, stop and snapshot in torch's schema
//! (`trace`), and the `_core` functions below (registered by lib.rs): the dispatch-mode
//! fallback's counts, the hook's table, mode and slots, for the glue and for tests.

pub mod lifecycle;
pub mod stack;
pub mod trace;

use std::path::Path;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use super::{adopted_gone, fallback_counts, got, has, mode, ours, table, Mode, COUNTERS, NAMES};
use lifecycle::{set_glue, start, stop, GLUE};

/// Count a new CPU storage of `nbytes` (called by the dispatch-mode fallback; ignored
/// unless the fallback is what counts now: see `fallback_counts`).
#[pyfunction]
pub fn _cpu_allocated(nbytes: i64) {
    if fallback_counts() {
        COUNTERS.allocated(nbytes);
    }
}

/// Count a CPU storage that existed before tracking started (live, not allocated; ignored
/// unless the fallback counts now).
#[pyfunction]
pub fn _cpu_adopted(nbytes: i64) {
    if fallback_counts() {
        COUNTERS.adopted(nbytes);
    }
}

/// Count a freed CPU storage of `nbytes` (called when its weak reference dies; ignored
/// unless the fallback counts now: a weak reference of an earlier fallback session dying
/// while the allocator hook counts must not uncount what the hook counted).
#[pyfunction]
pub fn _cpu_freed(nbytes: i64) {
    if fallback_counts() {
        COUNTERS.freed(nbytes);
    }
}

/// Live CPU storages the counters know: (bytes, count).
#[pyfunction]
pub fn _cpu_live() -> (i64, i64) {
    COUNTERS.live()
}

/// Register the Python side of the CPU source: the path of torch's `libc10.so` (None when
/// absent), `probe() -> bool`, `baseline() -> (pairs, storages)` and `forget()` (resets the
/// dispatch-mode fallback).
#[pyfunction]
pub fn _set_cpu_glue(
    library: Option<String>,
    probe: Py<PyAny>,
    baseline: Py<PyAny>,
    forget: Py<PyAny>,
) {
    set_glue(library, probe, baseline, forget);
}

/// Whether the allocator hook's table holds `address` with `nbytes` bytes.
#[pyfunction]
pub fn _cpu_table_has(address: usize, nbytes: i64) -> bool {
    has(address, nbytes)
}

/// An adopted storage died (called by the weak reference `baseline()` put on it).
#[pyfunction]
pub fn _cpu_adopted_gone(address: usize, nbytes: i64) {
    adopted_gone(address, nbytes);
}

/// How CPU memory is counted now: None (nobody counts), "allocator", or "dispatch: why".
#[pyfunction]
pub fn _cpu_mode() -> Option<String> {
    mode().map(|mode| match mode {
        Mode::Allocator => "allocator".to_string(),
        Mode::Dispatch(why) => format!("dispatch: {why}"),
    })
}

/// libc10's slots for our two functions, found now.
fn slots_now() -> PyResult<got::Library> {
    let library = GLUE
        .get()
        .and_then(|glue| glue.library.clone())
        .ok_or_else(|| PyRuntimeError::new_err("no libc10.so known"))?;
    got::find(Path::new(&library), &NAMES).map_err(PyRuntimeError::new_err)
}

/// libc10's GOT slots for posix_memalign and free, as (name, in RELRO, holds our function),
/// read now (for tests: nothing of ours stays after the last stop).
#[pyfunction]
pub fn _cpu_hook_slots() -> PyResult<Vec<(String, bool, bool)>> {
    Ok(slots_now()?
        .slots
        .iter()
        // SAFETY: slots of a loaded library, found just now.
        .map(|slot| {
            (
                slot.name.to_string(),
                slot.relro,
                unsafe { got::read(slot) } == ours(slot.name),
            )
        })
        .collect())
}

/// libc10's GOT slots for posix_memalign and free, as (name, address, in RELRO): tests check
/// the page protections around them.
#[pyfunction]
pub fn _cpu_hook_slot_addresses() -> PyResult<Vec<(String, usize, bool)>> {
    Ok(slots_now()?
        .slots
        .iter()
        .map(|slot| (slot.name.to_string(), slot.address, slot.relro))
        .collect())
}

/// Start and stop counting CPU memory outside the line profiler (tests, and tools that
/// read the counters): returns the mode as `_cpu_mode` does.
#[pyfunction]
pub fn _cpu_start(py: Python<'_>) -> PyResult<String> {
    start(py)?;
    Ok(_cpu_mode().unwrap_or_default())
}

/// Undo one `_cpu_start`.
#[pyfunction]
pub fn _cpu_stop(py: Python<'_>) {
    stop(py);
}

/// The CPU counters now, in `torch.cuda.memory_stats()` names.
#[pyfunction]
pub fn _cpu_stats() -> Vec<(String, i64)> {
    let mut values = [0i64; 28];
    COUNTERS.read(&mut values);
    let mut out = Vec::new();
    for (i, stat) in table::STATS.iter().enumerate() {
        for (j, field) in table::FIELDS.iter().enumerate() {
            out.push((format!("{stat}.all.{field}"), values[i * 4 + j]));
        }
    }
    out
}
