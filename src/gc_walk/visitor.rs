//! CPython 3.12+: `PyUnstable_GC_VisitObjects`, the interpreter's own way to visit every
//! object in the collector's generations.
//!
//! It is not in the limited API, so it is looked up at run time (an abi3 wheel still imports
//! everywhere). It pauses automatic collection while it runs, holds a reference to each
//! object while our callback looks at it, and our callback only reads the object's type and
//! pushes its address: no Python code runs, nothing is allocated on the Python heap, so no
//! object can be freed or moved before the caller takes its own references.
//!
//! It visits generations 0-2, not the permanent generation of `gc.freeze()` (see
//! `lists::frozen_objects`).

use std::ffi::{c_int, c_void};

use pyo3::ffi;

type VisitFn = unsafe extern "C" fn(*mut ffi::PyObject, *mut c_void) -> c_int;
type VisitObjects = unsafe extern "C" fn(VisitFn, *mut c_void);

struct VisitState<'a> {
    keep: &'a mut dyn FnMut(*mut ffi::PyTypeObject) -> bool,
    found: &'a mut Vec<*mut ffi::PyObject>,
}

unsafe extern "C" fn visit(object: *mut ffi::PyObject, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `VisitState` that `visit_all` passed, alive for the whole call.
    let state = unsafe { &mut *(arg as *mut VisitState<'_>) };
    // SAFETY: the interpreter hands us a live object with a reference held.
    if (state.keep)(unsafe { ffi::Py_TYPE(object) }) {
        state.found.push(object);
    }
    1 // go on
}

fn visitor() -> Option<VisitObjects> {
    #[cfg(unix)]
    {
        // SAFETY: the symbol, when present, has this signature in CPython 3.12 and later.
        unsafe {
            let this = libloading::os::unix::Library::this();
            this.get::<VisitObjects>(b"PyUnstable_GC_VisitObjects\0")
                .ok()
                .map(|symbol| *symbol)
        }
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Push every object in generations 0-2 whose type `keep` accepts; false if this
/// interpreter has no visitor (then nothing was pushed).
///
/// The caller holds the GIL and must not be inside a collection.
pub fn visit_all(
    keep: &mut dyn FnMut(*mut ffi::PyTypeObject) -> bool,
    found: &mut Vec<*mut ffi::PyObject>,
) -> bool {
    let Some(visitor) = visitor() else {
        return false;
    };
    let mut state = VisitState { keep, found };
    // SAFETY: `state` outlives the call; `visit` only reads object headers and pushes to a
    // Rust vector.
    unsafe { visitor(visit, &mut state as *mut VisitState<'_> as *mut c_void) };
    true
}
