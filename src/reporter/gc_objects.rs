//! Every object the garbage collector tracks, visited without building a Python list.
//!
//! `gc.get_objects()` increfs and appends every tracked object to a new list: about 19 ms
//! for the 330,000 objects of a process that imported torch, which alone is more than our
//! whole budget for a report. Instead:
//! - CPython 3.9-3.13: the collector's generation lists, read in place, by several threads
//!   at once, and from the second walk on only what changed (see `gc_lists`).
//! - CPython 3.14+: `PyUnstable_GC_VisitObjects`, the interpreter's own visitor (not in
//!   the limited API, so it is looked up at run time; abi3 wheels still work everywhere).
//! - Anything else (free-threaded builds, PyPy), or if either fails its checks:
//!   `gc.get_objects()`.
//!
//! No Python code runs during a walk, so the collector cannot move objects under us.

use std::ffi::{c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::gc_lists;

/// How the last walk found the objects (reported by benchmarks and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Visitor,
    GenerationLists,
    SinceLastWalk,
    GetObjects,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Visitor => "PyUnstable_GC_VisitObjects",
            Strategy::GenerationLists => "gc generation lists",
            Strategy::SinceLastWalk => "gc generation lists, since the last walk",
            Strategy::GetObjects => "gc.get_objects()",
        }
    }
}

type VisitFn = unsafe extern "C" fn(*mut ffi::PyObject, *mut c_void) -> c_int;
type VisitObjects = unsafe extern "C" fn(VisitFn, *mut c_void);

/// Every tracked object whose type is `base` or a subtype of it, as new references, and
/// how they were found. `held` lists objects the caller keeps alive (good start points).
pub fn tracked_objects<'py>(
    py: Python<'py>,
    held: &[*mut ffi::PyObject],
    base: *mut ffi::PyTypeObject,
) -> PyResult<(Vec<Bound<'py, PyAny>>, Strategy)> {
    let (minor, free_threaded) = interpreter(py)?;
    let mut found: Vec<*mut ffi::PyObject> = Vec::new();
    let mut types = SubtypeCache::new(base);
    // SAFETY: only ever asked about the types of live objects.
    let mut keep = |kind: *mut ffi::PyTypeObject| unsafe { types.is_subtype(kind) };
    let lists = (!free_threaded && (9..=13).contains(&minor) && cfg!(target_pointer_width = "64"))
        .then(|| gc_lists::walk(py, minor, held, base, &mut found))
        .flatten();
    let strategy = if let Some(walked) = lists {
        match walked {
            gc_lists::Walked::Full => Strategy::GenerationLists,
            gc_lists::Walked::SinceLast => Strategy::SinceLastWalk,
        }
    } else if !free_threaded && minor >= 14 && visit_with_visitor(&mut keep, &mut found) {
        Strategy::Visitor
    } else {
        found.clear();
        let objects = py.import("gc")?.call_method0("get_objects")?;
        let list = objects.cast::<PyList>()?;
        let kept = list.iter().filter(|o| keep(o.get_type_ptr())).collect();
        return Ok((kept, Strategy::GetObjects));
    };
    // SAFETY: every pointer came from the collector's lists a moment ago, under the GIL,
    // with no Python code run since: each is a live object; we take a new reference.
    let kept = found
        .into_iter()
        .map(|ptr| unsafe { Bound::from_borrowed_ptr(py, ptr) })
        .collect();
    Ok((kept, strategy))
}

/// (minor version, free-threaded build) of a CPython interpreter; other implementations
/// answer minor 0 so that only the portable path is used.
fn interpreter(py: Python<'_>) -> PyResult<(u32, bool)> {
    let sys = py.import("sys")?;
    let implementation: String = sys.getattr("implementation")?.getattr("name")?.extract()?;
    if implementation != "cpython" {
        return Ok((0, false));
    }
    let minor: u32 = sys.getattr("version_info")?.getattr("minor")?.extract()?;
    let free_threaded = sys
        .getattr("_is_gil_enabled")
        .and_then(|f| f.call0())
        .and_then(|v| v.extract::<bool>())
        .map(|gil| !gil)
        .unwrap_or(false);
    Ok((minor, free_threaded))
}

struct VisitState<'a> {
    keep: &'a mut dyn FnMut(*mut ffi::PyTypeObject) -> bool,
    found: &'a mut Vec<*mut ffi::PyObject>,
}

unsafe extern "C" fn visit(object: *mut ffi::PyObject, arg: *mut c_void) -> c_int {
    let state = &mut *(arg as *mut VisitState<'_>);
    if (state.keep)(ffi::Py_TYPE(object)) {
        state.found.push(object);
    }
    1 // go on
}

#[cfg(not(unix))]
fn visit_with_visitor(
    _keep: &mut dyn FnMut(*mut ffi::PyTypeObject) -> bool,
    _found: &mut Vec<*mut ffi::PyObject>,
) -> bool {
    false
}

#[cfg(unix)]
fn visit_with_visitor(
    keep: &mut dyn FnMut(*mut ffi::PyTypeObject) -> bool,
    found: &mut Vec<*mut ffi::PyObject>,
) -> bool {
    // SAFETY: the symbol, when present, has this signature in CPython 3.12 and later.
    let visitor: Option<VisitObjects> = unsafe {
        let this = libloading::os::unix::Library::this();
        this.get::<VisitObjects>(b"PyUnstable_GC_VisitObjects\0")
            .ok()
            .map(|symbol| *symbol)
    };
    let Some(visitor) = visitor else {
        return false;
    };
    let mut state = VisitState { keep, found };
    // SAFETY: `state` outlives the call; `visit` only reads object headers.
    unsafe { visitor(visit, &mut state as *mut VisitState<'_> as *mut c_void) };
    true
}

/// Whether `PyType_IsSubtype(type(object), base)`, remembered per type: the walk asks this
/// once per gc object, and a process has only a few thousand types.
pub struct SubtypeCache {
    base: *mut ffi::PyTypeObject,
    slots: Vec<(usize, bool)>,
}

impl SubtypeCache {
    const SIZE: usize = 4096;

    pub fn new(base: *mut ffi::PyTypeObject) -> Self {
        Self {
            base,
            slots: vec![(0, false); Self::SIZE],
        }
    }

    /// # Safety
    /// `kind` must be a live type object.
    pub unsafe fn is_subtype(&mut self, kind: *mut ffi::PyTypeObject) -> bool {
        let key = kind as usize;
        let slot = ((key >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) & (Self::SIZE - 1);
        let (cached, answer) = self.slots[slot];
        if cached == key {
            return answer;
        }
        // SAFETY: both are live type objects.
        let answer = unsafe { ffi::PyType_IsSubtype(kind, self.base) } != 0;
        self.slots[slot] = (key, answer);
        answer
    }
}
