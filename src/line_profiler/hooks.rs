//! The interpreter hooks: how events of profiled code objects reach the engine, and only
//! theirs.
//!
//! - Python 3.12+: `sys.monitoring` with a tool id of our own (see `monitoring`).
//! - Python 3.9-3.11: a C trace function chained in front of each thread's own tracer (see
//!   `tracing`).
//!
//! An event that finds the engine busy (held on this thread by code the engine runs, or by
//! another thread that released the GIL) is dropped, never waited for, and counted for the
//! report when it belongs to a profiled code object. Errors met while handling events are
//! never raised into the profiled program: they are kept for the report.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use pyo3::prelude::*;

use super::engine::{
    report_incident, try_with_engine, with_engine, Action, Engine, Event, Incident, PENDING_DROPS,
};
use super::{monitoring, tracing};

/// The id of the calling thread, as the engine keys its stacks (cheaper than asking Python).
pub fn thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ID: Cell<u64> = const { Cell::new(0) });
    ID.with(|id| {
        if id.get() == 0 {
            id.set(NEXT.fetch_add(1, Relaxed));
        }
        id.get()
    })
}

/// The CPU source's Python functions: start(thread) and stop() tracking storages on the
/// calling thread, retire(thread) another thread's tracking.
struct CpuTracking {
    start: Py<PyAny>,
    stop: Py<PyAny>,
    retire: Py<PyAny>,
}

static CPU_TRACKING: OnceLock<CpuTracking> = OnceLock::new();

pub fn set_cpu_tracking(start: Py<PyAny>, stop: Py<PyAny>, retire: Py<PyAny>) {
    let _ = CPU_TRACKING.set(CpuTracking {
        start,
        stop,
        retire,
    });
}

/// The first errors met while handling events, for debugging (`_core._hook_errors()`).
pub static ERRORS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keep an error for the reports of the enabled collectors (never raised into user code).
pub fn remember(error: String) {
    {
        let mut errors = ERRORS.lock().unwrap_or_else(|p| p.into_inner());
        if errors.len() < 8 {
            errors.push(error.clone());
        }
    }
    report_incident(Incident::Error(error));
}

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

/// Addresses of the watched code objects, sorted: lets a dropped event be counted only
/// when it belonged to a profiled function. A leaf lock.
static WATCHED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn watched(address: usize) -> bool {
    WATCHED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .binary_search(&address)
        .is_ok()
}

/// Hand one event to the engine. Returns whether the code object is profiled.
pub fn dispatch(py: Python<'_>, address: usize, event: Event) -> bool {
    let thread = thread_id();
    let outcome = try_with_engine(|engine| engine.on_event(py, address, event, thread));
    let profiled = match outcome {
        Some(Ok(Some(actions))) => {
            run_actions(py, actions);
            true
        }
        Some(Ok(None)) => false,
        Some(Err(error)) => {
            remember(error.to_string());
            true
        }
        None => {
            let profiled = watched(address);
            if profiled {
                PENDING_DROPS.fetch_add(1, Relaxed);
            }
            profiled
        }
    };
    super::retire_dropped_if_free(py);
    profiled
}

/// Make the hooks match the engine: events on for every watched code object, off for the
/// rest, and no hook at all when no profiler is enabled.
pub fn sync(py: Python<'_>) -> PyResult<()> {
    with_engine(py, |engine| sync_locked(py, engine))
}

/// `sync` for a caller that holds the engine already.
pub fn sync_locked(py: Python<'_>, engine: &mut Engine) -> PyResult<()> {
    *WATCHED.lock().unwrap_or_else(|p| p.into_inner()) = engine.watched_addresses();
    let enabled = engine.any_enabled();
    if py.version_info() >= (3, 12) {
        monitoring::sync(py, engine.watched_codes(py), enabled)
    } else if enabled {
        tracing::install(py, engine)
    } else {
        tracing::uninstall(py)
    }
}
