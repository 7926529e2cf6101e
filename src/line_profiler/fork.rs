//! Fork: a child forked while profiling (DataLoader workers, multiprocessing with "fork")
//! starts clean and is profiled only if it asks.
//!
//! `os.register_at_fork` handlers, registered once when `memlab_rs._core` is imported:
//! - before: the forking thread takes the engine and holds it across the fork, so no other
//!   thread holds it at that moment (the child would inherit it locked forever);
//! - in the parent: the engine is let go, and profiling goes on as before;
//! - in the child: no collector is enabled, no frame is open, no source is read (the child
//!   must not trust its copy of the allocator), and no hook of ours is left: our
//!   `sys.monitoring` tool id and its events are freed (3.12+), our trace function is taken
//!   off the forking thread and its own tracer put back (3.9-3.11). The CPU source's own
//!   handler (in `memlab_rs._sources.cpu_source`) takes its dispatch modes off the forking thread
//!   and forgets its live table.

use std::sync::Once;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::engine;
use super::hooks::{remember, sync};

/// Register the handlers (once per process).
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = (|| {
            let py = module.py();
            let os = py.import("os")?;
            let Ok(register) = os.getattr("register_at_fork") else {
                return Ok(()); // no fork on this platform
            };
            let handlers = PyDict::new(py);
            handlers.set_item("before", module.getattr("_fork_prepare")?)?;
            handlers.set_item("after_in_parent", module.getattr("_fork_parent")?)?;
            handlers.set_item("after_in_child", module.getattr("_fork_child")?)?;
            register.call((), Some(&handlers)).map(drop)
        })();
    });
    result
}

/// Before `fork()`: hold the engine across it.
#[pyfunction]
pub fn _fork_prepare(py: Python<'_>) {
    engine::fork_prepare(py);
}

/// After `fork()`, in the parent.
#[pyfunction]
pub fn _fork_parent() {
    engine::fork_parent();
}

/// After `fork()`, in the child: nothing of ours enabled or installed.
#[pyfunction]
pub fn _fork_child(py: Python<'_>) {
    engine::fork_child();
    if let Err(error) = sync(py) {
        remember(format!("removing the hooks in a forked child: {error}"));
    }
}
