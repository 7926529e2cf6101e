//! How an interpreter event of a profiled code object reaches the engine, and only theirs
//! (the hooks that fire: `monitoring` on 3.12+, `tracing` on 3.9-3.11).
//!
//! An event that finds the engine busy (held on this thread by code the engine runs, or by
//! another thread that released the GIL) is dropped, never waited for, and counted for the
//! report when it belongs to a profiled code object. Errors met while handling events are
//! never raised into the profiled program: they are kept for the report.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, OnceLock};

use pyo3::prelude::*;

use super::actions::run_actions;
use super::engine::{remember, thread_id, try_with_engine, Event, PENDING_DROPS};

/// Addresses of the watched code objects, sorted: lets a dropped event be counted only
/// when it belonged to a profiled function. A leaf lock.
static WATCHED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Say which code objects are watched now (sorted addresses).
pub fn set_watched(addresses: Vec<usize>) {
    *WATCHED.lock().unwrap_or_else(|p| p.into_inner()) = addresses;
}

fn watched(address: usize) -> bool {
    WATCHED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .binary_search(&address)
        .is_ok()
}

/// What runs after each event: retiring the profilers dropped while the engine was busy,
/// once it is free (`collector::retire_dropped_if_free`). Set once, when the room registers:
/// retiring re-arms the hooks (`sync`), which sit above the hooks that call this.
static AFTER_EVENT: OnceLock<fn(Python<'_>)> = OnceLock::new();

pub fn set_after_event(after: fn(Python<'_>)) {
    let _ = AFTER_EVENT.set(after);
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
    if let Some(after) = AFTER_EVENT.get() {
        after(py);
    }
    profiled
}
