//! The hooks made to match the engine: events on for every watched code object, off for the
//! rest, and no hook at all when no profiler is enabled (`sys.monitoring` on 3.12+, the C
//! trace function on 3.9-3.11).

use pyo3::prelude::*;

use super::dispatch::set_watched;
use super::engine::{with_engine, Engine};
use super::{monitoring, tracing};

/// Make the hooks match the engine.
pub fn sync(py: Python<'_>) -> PyResult<()> {
    with_engine(py, |engine| sync_locked(py, engine))
}

/// `sync` for a caller that holds the engine already.
pub fn sync_locked(py: Python<'_>, engine: &mut Engine) -> PyResult<()> {
    set_watched(engine.watched_addresses());
    let enabled = engine.any_enabled();
    if py.version_info() >= (3, 12) {
        monitoring::sync(py, engine.watched_codes(py), enabled)
    } else if enabled {
        tracing::install(py, engine)
    } else {
        tracing::uninstall(py)
    }
}
