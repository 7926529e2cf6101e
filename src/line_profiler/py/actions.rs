//! The work the engine leaves its caller once it is released, because it runs Python code:
//! starting and stopping the CPU source's dispatch-mode tracking on a thread.

use std::sync::OnceLock;

use pyo3::prelude::*;

use super::engine::{remember, Action};

/// The CPU source's Python functions: start(thread) and stop() tracking storages on the
/// calling thread, retire(thread) another thread's tracking.
struct CpuTracking {
    start: Py<PyAny>,
    stop: Py<PyAny>,
    retire: Py<PyAny>,
}

static CPU_TRACKING: OnceLock<CpuTracking> = OnceLock::new();

/// Tell the engine how the CPU source starts (`start(thread)`) and stops (`stop()`) tracking
/// storages on the calling thread, and retires another thread's tracking (`retire(thread)`).
#[pyfunction]
pub fn _set_cpu_tracking(start: Py<PyAny>, stop: Py<PyAny>, retire: Py<PyAny>) {
    let _ = CPU_TRACKING.set(CpuTracking {
        start,
        stop,
        retire,
    });
}

/// Run what the engine left to do; an error is kept for the report, never raised.
pub fn run_actions(py: Python<'_>, actions: Vec<Action>) {
    let Some(cpu) = CPU_TRACKING.get() else {
        return;
    };
    for action in actions {
        let done = match action {
            Action::TrackCpu { thread } => cpu.start.call1(py, (thread,)),
            Action::UntrackCpuHere => cpu.stop.call0(py),
            Action::RetireCpu { thread } => cpu.retire.call1(py, (thread,)),
        };
        if let Err(error) = done {
            remember(error.to_string());
        }
    }
}
