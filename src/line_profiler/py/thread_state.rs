//! Python 3.9-3.11: the C API the trace hook needs, and reading a thread's own tracer.
//!
//! To give every thread its own tracer back (coverage or pdb on a worker thread), the
//! profiler must know what tracer each thread has when it installs its own. CPython has no
//! API for that: `sys.gettrace()` sees only the calling thread, and only the object, not the
//! C function (coverage's tracer is a C function with its own object). So the two fields
//! `c_tracefunc` and `c_traceobj` of `PyThreadState` are read directly. The struct is part of
//! CPython's public headers (`Include/cpython/pystate.h`) and its layout is fixed within a
//! minor version; the three layouts are written out below. Before any use, once per
//! process, the layout of the running interpreter is checked on a scratch thread state
//! (`PyThreadState_New`, never run, deleted at once):
//! - its `interp` field must be what `PyThreadState_GetInterpreter` returns;
//! - its trace fields must be empty, then read back exactly the function and object that
//!   `_PyEval_SetTrace` (CPython's own setter) stored, then be empty again.
//!
//! Every later read checks the `interp` field of that thread state again. When the check
//! fails (or `MEMLAB_RS_THREAD_STATE=official` asks for it), `layout()` is None and the
//! profiler takes the official path (see `tracing`): it installs itself only where it knows,
//! through official calls, that no tracer is in place.
//!
//! Every function is looked up at run time: `_PyEval_SetTrace` and the thread-state
//! iterators are not in the limited API, and an abi3 wheel must still import on
//! interpreters that drop them.

use std::ffi::{c_char, c_int, c_void};
use std::mem::offset_of;
use std::sync::OnceLock;

use pyo3::ffi;
use pyo3::prelude::*;

/// CPython's `Py_tracefunc`.
pub type TraceFn = unsafe extern "C" fn(
    *mut ffi::PyObject,
    *mut ffi::PyObject,
    c_int,
    *mut ffi::PyObject,
) -> c_int;

/// CPython's `Py_AuditHookFunction`.
pub type AuditFn = unsafe extern "C" fn(*const c_char, *mut ffi::PyObject, *mut c_void) -> c_int;

/// The C API of CPython 3.9-3.11 the trace hook uses.
pub struct Api {
    pub set_trace: unsafe extern "C" fn(Option<TraceFn>, *mut ffi::PyObject),
    pub set_trace_for:
        unsafe extern "C" fn(*mut c_void, Option<TraceFn>, *mut ffi::PyObject) -> c_int,
    pub interpreter: unsafe extern "C" fn() -> *mut c_void,
    pub thread_head: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub thread_next: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub thread_get: unsafe extern "C" fn() -> *mut c_void,
    pub thread_id: unsafe extern "C" fn(*mut c_void) -> u64,
    pub thread_interpreter: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub thread_new: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub thread_clear: unsafe extern "C" fn(*mut c_void),
    pub thread_delete: unsafe extern "C" fn(*mut c_void),
    pub frame_code: unsafe extern "C" fn(*mut ffi::PyObject) -> *mut ffi::PyObject,
    pub frame_line: unsafe extern "C" fn(*mut ffi::PyObject) -> c_int,
    pub current_frame: unsafe extern "C" fn() -> *mut ffi::PyObject,
    pub add_audit_hook: unsafe extern "C" fn(AuditFn, *mut c_void) -> c_int,
}

pub fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(|| {
        #[cfg(unix)]
        {
            let this = libloading::os::unix::Library::this();
            // SAFETY: these symbols have these signatures in CPython 3.9-3.11 (the only
            // versions that call this: 3.12+ uses sys.monitoring).
            unsafe {
                Some(Api {
                    set_trace: *this.get(b"PyEval_SetTrace\0").ok()?,
                    set_trace_for: *this.get(b"_PyEval_SetTrace\0").ok()?,
                    interpreter: *this.get(b"PyInterpreterState_Get\0").ok()?,
                    thread_head: *this.get(b"PyInterpreterState_ThreadHead\0").ok()?,
                    thread_next: *this.get(b"PyThreadState_Next\0").ok()?,
                    thread_get: *this.get(b"PyThreadState_Get\0").ok()?,
                    thread_id: *this.get(b"PyThreadState_GetID\0").ok()?,
                    thread_interpreter: *this.get(b"PyThreadState_GetInterpreter\0").ok()?,
                    thread_new: *this.get(b"PyThreadState_New\0").ok()?,
                    thread_clear: *this.get(b"PyThreadState_Clear\0").ok()?,
                    thread_delete: *this.get(b"PyThreadState_Delete\0").ok()?,
                    frame_code: *this.get(b"PyFrame_GetCode\0").ok()?,
                    frame_line: *this.get(b"PyFrame_GetLineNumber\0").ok()?,
                    current_frame: *this.get(b"PyEval_GetFrame\0").ok()?,
                    add_audit_hook: *this.get(b"PySys_AddAuditHook\0").ok()?,
                })
            }
        }
        #[cfg(not(unix))]
        {
            None
        }
    })
    .as_ref()
}

/// The thread states of this interpreter, with their ids (unique for the process's life).
/// The GIL must be held; the list may change as soon as Python code runs again.
pub fn threads(api: &Api) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    // SAFETY: GIL held, so no thread state is created or deleted while we walk the list.
    unsafe {
        let mut tstate = (api.thread_head)((api.interpreter)());
        while !tstate.is_null() {
            out.push((tstate as usize, (api.thread_id)(tstate)));
            tstate = (api.thread_next)(tstate);
        }
    }
    out
}

/// Whether the thread state `tstate` with id `id` is alive now (GIL held): a thread state
/// address may be reused by a later thread, its id never is.
pub fn alive(api: &Api, tstate: usize, id: u64) -> bool {
    // SAFETY: GIL held; only thread states found in the live list are dereferenced.
    unsafe {
        let mut walk = (api.thread_head)((api.interpreter)());
        while !walk.is_null() {
            if walk as usize == tstate {
                return (api.thread_id)(walk) == id;
            }
            walk = (api.thread_next)(walk);
        }
    }
    false
}

/// The thread-state fields read, as byte offsets.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    interp: usize,
    tracefunc: usize,
    traceobj: usize,
}

type Ptr = *mut c_void;

/// `struct _ts` of CPython 3.9, up to `c_traceobj`.
#[repr(C)]
#[allow(dead_code)] // a layout description: only offsets are taken
struct Ts39 {
    prev: Ptr,
    next: Ptr,
    interp: Ptr,
    frame: Ptr,
    recursion_depth: c_int,
    overflowed: c_char,
    recursion_critical: c_char,
    stackcheck_counter: c_int,
    tracing: c_int,
    use_tracing: c_int,
    c_profilefunc: Ptr,
    c_tracefunc: Ptr,
    c_profileobj: Ptr,
    c_traceobj: Ptr,
}

/// `struct _ts` of CPython 3.10, up to `c_traceobj`.
#[repr(C)]
#[allow(dead_code)] // a layout description: only offsets are taken
struct Ts310 {
    prev: Ptr,
    next: Ptr,
    interp: Ptr,
    frame: Ptr,
    recursion_depth: c_int,
    recursion_headroom: c_int,
    stackcheck_counter: c_int,
    tracing: c_int,
    cframe: Ptr,
    c_profilefunc: Ptr,
    c_tracefunc: Ptr,
    c_profileobj: Ptr,
    c_traceobj: Ptr,
}

/// `struct _ts` of CPython 3.11, up to `c_traceobj`.
#[repr(C)]
#[allow(dead_code)] // a layout description: only offsets are taken
struct Ts311 {
    prev: Ptr,
    next: Ptr,
    interp: Ptr,
    initialized: c_int,
    is_static: c_int,
    recursion_remaining: c_int,
    recursion_limit: c_int,
    recursion_headroom: c_int,
    tracing: c_int,
    tracing_what: c_int,
    cframe: Ptr,
    c_profilefunc: Ptr,
    c_tracefunc: Ptr,
    c_profileobj: Ptr,
    c_traceobj: Ptr,
}

macro_rules! layout_of {
    ($ts:ty) => {
        Layout {
            interp: offset_of!($ts, interp),
            tracefunc: offset_of!($ts, c_tracefunc),
            traceobj: offset_of!($ts, c_traceobj),
        }
    };
}

impl Layout {
    fn for_minor(minor: u8) -> Option<Self> {
        match minor {
            9 => Some(layout_of!(Ts39)),
            10 => Some(layout_of!(Ts310)),
            11 => Some(layout_of!(Ts311)),
            _ => None,
        }
    }

    /// # Safety
    /// `tstate` is a live thread state of this interpreter and the GIL is held.
    unsafe fn field(&self, tstate: usize, offset: usize) -> Ptr {
        // SAFETY: the caller's contract; `offset` lies inside the struct prefix above.
        unsafe { *((tstate as *const u8).add(offset) as *const Ptr) }
    }

    /// The trace function and object of a live thread state `tstate` (GIL held), or None
    /// when its `interp` field is not what the official getter says.
    ///
    /// # Safety
    /// `tstate` is a live thread state of this interpreter and the GIL is held.
    pub unsafe fn trace_of(
        &self,
        api: &Api,
        tstate: usize,
    ) -> Option<(Option<TraceFn>, *mut ffi::PyObject)> {
        // SAFETY: the caller's contract; the layout was verified by `verify`.
        unsafe {
            if self.field(tstate, self.interp) != (api.thread_interpreter)(tstate as Ptr) {
                return None;
            }
            let func = self.field(tstate, self.tracefunc);
            let func = (!func.is_null()).then(|| std::mem::transmute::<Ptr, TraceFn>(func));
            Some((func, self.field(tstate, self.traceobj).cast()))
        }
    }
}

unsafe extern "C" fn probe(
    _obj: *mut ffi::PyObject,
    _frame: *mut ffi::PyObject,
    _what: c_int,
    _arg: *mut ffi::PyObject,
) -> c_int {
    0
}

/// The verified layout of this interpreter's thread states, or why there is none. The
/// first call runs the check; the caller marks it as its own `_PyEval_SetTrace` calls (the
/// audit event the probe raises is not a replacement of anyone's tracer).
pub fn layout(py: Python<'_>) -> Result<Layout, &'static str> {
    static LAYOUT: OnceLock<Result<Layout, &'static str>> = OnceLock::new();
    *LAYOUT.get_or_init(|| {
        if std::env::var("MEMLAB_RS_THREAD_STATE").as_deref() == Ok("official") {
            return Err("MEMLAB_RS_THREAD_STATE=official asks for the official path");
        }
        let api = api().ok_or("this Python does not export the thread-state API")?;
        let version = py.version_info();
        let layout = (version.major == 3)
            .then(|| Layout::for_minor(version.minor))
            .flatten()
            .ok_or("no known thread-state layout for this Python version")?;
        verify(py, api, layout).map(|()| layout)
    })
}

fn verify(py: Python<'_>, api: &Api, layout: Layout) -> Result<(), &'static str> {
    let marker = pyo3::types::PyList::empty(py);
    // SAFETY: GIL held. The scratch thread state is created, used only through CPython's
    // setters and the reads checked here, and deleted before any other code runs; it is
    // never made current, so it never runs code.
    unsafe {
        let tstate = (api.thread_new)((api.interpreter)());
        if tstate.is_null() {
            ffi::PyErr_Clear();
            return Err("PyThreadState_New failed");
        }
        let at = tstate as usize;
        let check = || -> Result<(), &'static str> {
            let empty = layout.trace_of(api, at).ok_or("interp field mismatch")?;
            if empty.0.is_some() || !empty.1.is_null() {
                return Err("a new thread state has a tracer");
            }
            if (api.set_trace_for)(tstate, Some(probe), marker.as_ptr()) != 0 {
                ffi::PyErr_Clear();
                return Err("_PyEval_SetTrace refused the probe");
            }
            let set = layout.trace_of(api, at).ok_or("interp field mismatch")?;
            let func_ok = set.0.map(|f| f as usize) == Some(probe as TraceFn as usize);
            (api.set_trace_for)(tstate, None, std::ptr::null_mut());
            if !func_ok || set.1 != marker.as_ptr() {
                return Err("the trace fields are not where this layout says");
            }
            let cleared = layout.trace_of(api, at).ok_or("interp field mismatch")?;
            if cleared.0.is_some() || !cleared.1.is_null() {
                return Err("the trace fields did not clear");
            }
            Ok(())
        };
        let result = check();
        (api.thread_clear)(tstate);
        (api.thread_delete)(tstate);
        result
    }
}
