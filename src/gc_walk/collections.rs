//! What the garbage collector has been doing, learned from `gc.callbacks`.
//!
//! A walk must know two things that CPython offers no other official way to ask:
//! - whether a collection is running right now (a finaliser, a weakref callback or a gc
//!   callback of another tool may be the code asking for the walk). During a collection the
//!   collector keeps objects in lists of its own, on its C stack, linked into nothing we know;
//!   following such a link reads garbage. So a walk then uses `gc.get_objects()`.
//! - which generations were collected since the last walk: a walk that resumes from a
//!   sentinel is only exact if no collection reordered the lists in a way that can put a new
//!   object ahead of the sentinel (see `lists::Resume`).
//!
//! Our callback is appended to `gc.callbacks` when `memlab_rs._core` is imported, so it has
//! seen every collection that could matter to a walk. It is cheap (a few atomic updates per
//! collection) and raises nothing. If someone removes it (`gc.callbacks.clear()`), the next
//! walk notices, puts it back and, not knowing what happened meanwhile, takes the slow,
//! official path once and forgets any resume point.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering::SeqCst};
use std::sync::Mutex;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// Collections under way: `start` minus `stop` callbacks seen (never below zero).
static DEPTH: AtomicU32 = AtomicU32::new(0);
/// Collections seen since the last in-place walk: `GEN0` and/or `OLDER` bits.
static SINCE: AtomicU8 = AtomicU8::new(0);
/// The callback object we appended to `gc.callbacks`, to find it there again.
static CALLBACK: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

const GEN0: u8 = 1;
const OLDER: u8 = 2;

/// Which collections happened between two in-place walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Since {
    /// At least one collection of generation 0 alone.
    pub gen0: bool,
    /// A collection of generation 1 or 2, or a time we could not watch (the callback was
    /// missing): anything may have been reordered.
    pub older: bool,
}

/// Record a collection's start or stop; called by `_gc_callback` (and by unit tests).
pub fn observe(start: bool, generation: i64) {
    if start {
        DEPTH.fetch_add(1, SeqCst);
        SINCE.fetch_or(if generation == 0 { GEN0 } else { OLDER }, SeqCst);
    } else {
        let _ = DEPTH.fetch_update(SeqCst, SeqCst, |d| Some(d.saturating_sub(1)));
    }
}

/// Whether a collection is running now (as far as the callback has seen).
pub fn collecting() -> bool {
    DEPTH.load(SeqCst) > 0
}

/// What happened since the last call, and start counting afresh. Call it right before the
/// lists are read and right after the new resume point is placed, with no Python code run
/// in between, so that every later collection is seen by the next walk.
pub fn take_since() -> Since {
    let bits = SINCE.swap(0, SeqCst);
    Since {
        gen0: bits & GEN0 != 0,
        older: bits & OLDER != 0,
    }
}

/// Make sure our callback sits in `gc.callbacks`. Returns true if it was there already
/// (so its counts are to be trusted), false if it had to be put (back) there.
pub fn watch(py: Python<'_>) -> PyResult<bool> {
    let callbacks = py.import("gc")?.getattr("callbacks")?;
    let callbacks = callbacks.cast::<PyList>()?;
    let mut ours = CALLBACK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(callback) = ours.as_ref() {
        if callbacks.iter().any(|c| c.is(callback.bind(py))) {
            return Ok(true);
        }
    }
    let callback = match ours.as_ref() {
        Some(callback) => callback.clone_ref(py),
        None => py
            .import("memlab_rs._core")?
            .getattr("_gc_callback")?
            .unbind(),
    };
    callbacks.append(callback.bind(py))?;
    *ours = Some(callback);
    // We did not see what happened while we were not there.
    DEPTH.store(0, SeqCst);
    SINCE.fetch_or(OLDER, SeqCst);
    Ok(false)
}

/// Put the callback in place when the module is imported, given the module's own function
/// (the module is not in `sys.modules` yet at that point).
pub fn install(py: Python<'_>, callback: Bound<'_, PyAny>) -> PyResult<()> {
    let callbacks = py.import("gc")?.getattr("callbacks")?;
    callbacks.cast::<PyList>()?.append(&callback)?;
    *CALLBACK.lock().unwrap_or_else(|p| p.into_inner()) = Some(callback.unbind());
    Ok(())
}

/// The `gc.callbacks` entry: counts collections, never raises, runs no Python code.
#[pyfunction]
pub fn _gc_callback(phase: &Bound<'_, PyAny>, info: &Bound<'_, PyAny>) {
    let py = phase.py();
    let start = phase.eq(intern!(py, "start")).unwrap_or(false);
    let generation = info
        .get_item(intern!(py, "generation"))
        .and_then(|g| g.extract::<i64>())
        .unwrap_or(2); // unknown: assume the worst
    observe(start, generation);
}

/// (collections under way, generation-0 and older collections seen since the last walk):
/// for tests.
#[pyfunction]
pub fn _gc_watch_state() -> (u32, bool, bool) {
    let bits = SINCE.load(SeqCst);
    (DEPTH.load(SeqCst), bits & GEN0 != 0, bits & OLDER != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_never_goes_below_zero_and_since_resets() {
        observe(false, 0); // a stop we never saw start
        assert!(!collecting());
        observe(true, 0);
        assert!(collecting());
        observe(false, 0);
        assert!(!collecting());
        take_since();
        observe(true, 0);
        observe(false, 0);
        assert_eq!(
            take_since(),
            Since {
                gen0: true,
                older: false
            }
        );
        observe(true, 2);
        observe(false, 2);
        assert_eq!(
            take_since(),
            Since {
                gen0: false,
                older: true
            }
        );
        assert_eq!(
            take_since(),
            Since {
                gen0: false,
                older: false
            }
        );
    }
}
