//! The line profiler's Python face, `_core.line_profiler`: the collector, which is itself
//! interpreter hooks (so it lives here, in the room's binding folder), and the results'
//! functions.
//!
//! - `collector`: `LineCollector`, a `LineProfiler`'s handle on the `engine` (its code
//!   objects, rows and source), and the line profile it builds;
//! - `engine`: the one engine every hook reports to, under the sources' lock;
//! - the hooks: `monitoring` (3.12+) and `tracing` with `thread_state` (3.9-3.11) hand events
//!   to `dispatch`; `sync` arms them to match the engine; `actions` runs what the engine
//!   leaves to do in Python; `fork` keeps a forked child clean;
//! - `results`: the results checked, viewed, rendered, merged and compared from their JSON.

pub mod actions;
pub mod collector;
pub mod dispatch;
pub mod engine;
pub mod fork;
pub mod monitoring;
pub mod results;
pub mod sync;
pub mod thread_state;
pub mod tracing;

use pyo3::prelude::*;

use crate::results::py::submodule;

/// Create `_core.line_profiler` and the at-fork handlers. `LineReportView` is also put on
/// `_core` itself: `LineRecordsDisplay(view: _core.LineReportView, ...)` is public API.
pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "line_profiler",
        "The line profiler: its collector and interpreter hooks, and its results (line \
         profiles, merged profiles, diffs) checked, viewed and rendered from their JSON text.",
    )?;
    m.add(
        "DEFAULT_COLUMNS",
        pyo3::types::PyTuple::new(parent.py(), results::default_columns())?,
    )?;
    m.add_class::<collector::LineCollector>()?;
    m.add_class::<tracing::ThreadTracer>()?;
    for function in [
        wrap_pyfunction!(results::validate, &m)?,
        wrap_pyfunction!(results::render, &m)?,
        wrap_pyfunction!(results::records, &m)?,
        wrap_pyfunction!(results::merge, &m)?,
        wrap_pyfunction!(results::merged_validate, &m)?,
        wrap_pyfunction!(results::merged_render, &m)?,
        wrap_pyfunction!(results::merged_records, &m)?,
        wrap_pyfunction!(results::diff, &m)?,
        wrap_pyfunction!(results::diff_render, &m)?,
        wrap_pyfunction!(results::catalogue, &m)?,
        wrap_pyfunction!(results::check_columns, &m)?,
        wrap_pyfunction!(actions::_set_cpu_tracking, &m)?,
        wrap_pyfunction!(collector::_hook_errors, &m)?,
        wrap_pyfunction!(collector::_run_inside_engine, &m)?,
        wrap_pyfunction!(collector::_line_engine_table, &m)?,
        wrap_pyfunction!(monitoring::_monitoring_on_start, &m)?,
        wrap_pyfunction!(monitoring::_monitoring_on_resume, &m)?,
        wrap_pyfunction!(monitoring::_monitoring_on_line, &m)?,
        wrap_pyfunction!(monitoring::_monitoring_on_leave, &m)?,
        wrap_pyfunction!(monitoring::_monitoring_on_throw, &m)?,
        wrap_pyfunction!(tracing::_trace_new_thread, &m)?,
        wrap_pyfunction!(fork::_fork_prepare, &m)?,
        wrap_pyfunction!(fork::_fork_parent, &m)?,
        wrap_pyfunction!(fork::_fork_child, &m)?,
    ] {
        m.add_function(function)?;
    }
    parent.add_class::<results::LineReportView>()?;
    dispatch::set_after_event(collector::retire_dropped_if_free);
    fork::register(&m)
}
