//! What the garbage collector has been doing, learned from `gc.callbacks`.
//!
//! A walk must know two things that CPython offers no other official way to ask:
//! - whether a collection is running right now (a finaliser, a weakref callback or a gc
//!   callback of another tool may be the code asking for the walk). During a collection the
//!   collector keeps objects in lists of its own, on its C stack, linked into nothing we know;
//!   following such a link reads garbage. So a walk then uses `gc.get_objects()`.
//! - where the last walk's sentinel is now, given the collections since: a walk that resumes
//!   from the sentinel is only exact if no collection reordered the lists in a way that can
//!   put a new object ahead of it. The callback follows the sentinel's generation through
//!   each collection it sees (`advance`; the argument is in `lists`' module docs).
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
/// The sentinel's simulated generation (bits 0-1) and `BROKEN` (bit 2), since it was placed.
static SENTINEL: AtomicU8 = AtomicU8::new(0);
/// The callback object we appended to `gc.callbacks`, to find it there again.
static CALLBACK: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

const BROKEN: u8 = 4;
const GENERATION: u8 = 3;

/// What the collections since the sentinel was placed did to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Since {
    /// The generation the sentinel must be in now (0, 1 or 2).
    pub generation: u8,
    /// A collection may have put an object newer than the sentinel ahead of it, or we could
    /// not watch (the callback was missing, the generation was not reported).
    pub broken: bool,
}

/// The sentinel's state after a collection of generation `collected` (None: unknown) starts,
/// given its state before. CPython 3.9-3.13 `gc_collect_main`: generations 0..k-1 are
/// appended, youngest first, to generation k; survivors of k go to k+1 (k < 2). A sentinel
/// in a generation older than k is not touched; one in k, or in 0, keeps every newer object
/// after it and moves on to min(k+1, 2); one in 1..k-1 sees generation 0 land ahead of it.
pub fn advance(state: u8, collected: Option<u8>) -> u8 {
    let s = state & GENERATION;
    match collected {
        _ if state & BROKEN != 0 => state,
        Some(k) if k > 2 => BROKEN,
        None => BROKEN,
        Some(k) if s > k => state,
        Some(k) if s >= 1 && s < k => BROKEN,
        Some(k) => (k + 1).min(2),
    }
}

/// Record a collection's start or stop; called by `_gc_callback` (and by unit tests).
pub fn observe(start: bool, generation: i64) {
    if start {
        DEPTH.fetch_add(1, SeqCst);
        let collected = u8::try_from(generation).ok();
        let _ = SENTINEL.fetch_update(SeqCst, SeqCst, |s| Some(advance(s, collected)));
    } else {
        let _ = DEPTH.fetch_update(SeqCst, SeqCst, |d| Some(d.saturating_sub(1)));
    }
}

/// Whether a collection is running now (as far as the callback has seen).
pub fn collecting() -> bool {
    DEPTH.load(SeqCst) > 0
}

/// Where the sentinel must be, and start afresh with a sentinel at the tail of generation 0.
/// Call it right before the lists are read and right after the new sentinel is placed, with
/// no Python code run in between, so that every later collection is seen by the next walk.
pub fn take_since() -> Since {
    let bits = SENTINEL.swap(0, SeqCst);
    Since {
        generation: bits & GENERATION,
        broken: bits & BROKEN != 0,
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
    SENTINEL.fetch_or(BROKEN, SeqCst);
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
        .unwrap_or(-1); // unknown: assume the worst
    observe(start, generation);
}

/// (collections under way, the sentinel's simulated generation, whether a collection may
/// have put a newer object ahead of it): for tests.
#[pyfunction]
pub fn _gc_watch_state() -> (u32, u8, bool) {
    let bits = SENTINEL.load(SeqCst);
    (DEPTH.load(SeqCst), bits & GENERATION, bits & BROKEN != 0)
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
        let one = Since {
            generation: 1,
            broken: false,
        };
        assert_eq!(take_since(), one);
        observe(true, 2);
        observe(false, 2);
        let two = Since {
            generation: 2,
            broken: false,
        };
        assert_eq!(take_since(), two);
        let zero = Since {
            generation: 0,
            broken: false,
        };
        assert_eq!(take_since(), zero);
        observe(true, -1); // generation not reported
        assert!(take_since().broken);
    }

    #[test]
    fn the_sentinel_follows_the_collections() {
        // From generation 0, any collection keeps newer objects after the sentinel.
        assert_eq!(advance(0, Some(0)), 1);
        assert_eq!(advance(0, Some(1)), 2);
        assert_eq!(advance(0, Some(2)), 2);
        // In generation 1: a collection of 0 leaves it, of 1 takes it on, of 2 breaks it
        // (generation 0 is appended to generation 2 before generation 1).
        assert_eq!(advance(1, Some(0)), 1);
        assert_eq!(advance(1, Some(1)), 2);
        assert_eq!(advance(1, Some(2)), BROKEN);
        // In generation 2 every collection appends after it.
        for k in 0..3 {
            assert_eq!(advance(2, Some(k)), 2);
        }
        // Broken stays broken; unknown generations break.
        assert_eq!(advance(BROKEN, Some(0)), BROKEN);
        assert_eq!(advance(0, None), BROKEN);
        assert_eq!(advance(0, Some(3)), BROKEN);
    }
}
