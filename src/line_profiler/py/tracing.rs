//! Python 3.9-3.11: a C trace function on every thread, chained in front of the thread's
//! own tracer.
//!
//! `enable()` installs our trace function on every thread (`_PyEval_SetTrace`) and, through
//! `threading.settrace`, on threads started later. Each thread keeps its own tracer (a
//! `sys.settrace` function, coverage's C tracer, pdb): it is read from the thread's state
//! (see `thread_state`) and kept in the `ThreadTracer` object we install as the trace
//! object, which calls it after us for every event. So the thread's tracer goes on working
//! while we profile, and `disable()` gives it back to that thread. A chained tracer may
//! replace itself (coverage installs its C tracer on a thread's first event, pdb removes
//! itself on `continue`, CPython removes a tracer that raised): we see it (below) and chain
//! the new one. A thread started while we are enabled gets the previous `threading.settrace`
//! hook first, then us in front of it. Without a chained tracer, line events are turned off
//! for frames we do not profile. We never touch profile functions (`sys.setprofile`).
//!
//! `sys.settrace()` called by the program on a profiled thread replaces us there. A C audit
//! hook on the "sys.settrace" event (installed once at the first `enable()`, inert while
//! nothing is installed) sees it at the moment it happens: that thread's open lines close
//! with the values of that moment, and the report says "profiling stopped on thread N at
//! <file>:<line>: sys.settrace() replaced the profiler's tracer". The thread is not profiled
//! after that, and `disable()` leaves its new tracer alone. Our own calls to
//! `_PyEval_SetTrace`, and those of a chained tracer while we call it, are told apart by
//! per-thread flags. If the program puts back the object `sys.gettrace()` gave it, that
//! object puts our tracer back in place (or, after `disable()`, the thread's own tracer).
//!
//! When the thread-state layout cannot be verified, the official path: we install ourselves
//! only where official calls show there is no tracer (the enabling thread when
//! `sys.gettrace()` is None, new threads when there was no `threading.settrace` hook), and
//! the report names what was left out.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, Once};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::Borrowed;

use super::actions::run_actions;
use super::dispatch::dispatch;
use super::engine::{remember, report_incident, thread_id, with_engine, Engine, Event, Incident};
use super::thread_state::{self, api, Api, Layout, TraceFn};

const CALL: c_int = 0;
const LINE: c_int = 2;
const RETURN: c_int = 3;

/// Whether we are installed (between the first enable and the last disable): the audit
/// hook and the new-thread hook do nothing otherwise.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The thread states (address, id) where our tracer is in place. A leaf lock.
static INSTALLED: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

/// The `threading.settrace` hook there was before us. A leaf lock (clone or take only).
static THREADING_HOOK: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

thread_local! {
    /// Inside one of our own `_PyEval_SetTrace` calls: its audit event is ours.
    static INSTALLING: Cell<bool> = const { Cell::new(false) };
    /// Inside a call of this thread's chained tracer.
    static CHAINING: Cell<u32> = const { Cell::new(0) };
    /// The chained tracer changed this thread's tracer during that call.
    static CHANGED: Cell<bool> = const { Cell::new(false) };
}

/// The trace object we install on a thread: the tracer the thread had before us (a C
/// function and its object), called after us for every event and given back at
/// `disable()`. It is what `sys.gettrace()` returns on a profiled thread; called as a
/// Python tracer (the program put it back with `sys.settrace`), it puts back the C tracer.
#[pyclass(module = "memlab_rs._core.line_profiler", frozen)]
pub struct ThreadTracer {
    prev_func: Option<TraceFn>,
    prev_obj: Option<Py<PyAny>>,
}

#[pymethods]
impl ThreadTracer {
    fn __call__(
        slf: &Bound<'_, Self>,
        frame: &Bound<'_, PyAny>,
        event: &str,
        _arg: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let py = slf.py();
        let Some(api) = api() else { return Ok(None) };
        // SAFETY: GIL held; the calling thread's own state.
        let (tstate, id) = unsafe {
            let tstate = (api.thread_get)();
            (tstate as usize, (api.thread_id)(tstate))
        };
        // We are the thread's trace object, held by the thread state alone: switching the
        // tracer below drops that reference (CPython 3.9-3.11 drop the old object before
        // they take the new one, even when both are us), which would free this object while
        // its own call runs. Keep it alive until the next switch, long after this returns.
        keep_until_next_switch(slf.clone().into_any().unbind());
        let me = slf.get();
        let result = if ACTIVE.load(Relaxed) {
            set_trace(api, tstate, Some(tracer), Some(slf.as_any()))?;
            mark_installed(tstate, id);
            report_incident(Incident::Notice(format!(
                "profiling resumed on thread {} at {}: the profiler's tracer was put back",
                thread_ident(py),
                location(py, api)
            )));
            // SAFETY: GIL held, a live frame, our own object as the trace object.
            (event == "call").then(|| unsafe {
                tracer(slf.as_ptr(), frame.as_ptr(), CALL, std::ptr::null_mut())
            })
        } else {
            let prev_obj = me.prev_obj.as_ref().map(|o| o.bind(py).clone());
            set_trace(api, tstate, me.prev_func, prev_obj.as_ref())?;
            match (event == "call", me.prev_func) {
                // SAFETY: GIL held; the thread's own tracer gets the event it missed.
                (true, Some(prev)) => Some(unsafe {
                    prev(
                        prev_obj
                            .as_ref()
                            .map_or(std::ptr::null_mut(), |o| o.as_ptr()),
                        frame.as_ptr(),
                        CALL,
                        std::ptr::null_mut(),
                    )
                }),
                _ => None,
            }
        };
        match result {
            Some(code) if code != 0 => Err(PyErr::take(py).unwrap_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("the thread's tracer failed")
            })),
            _ => Ok(None),
        }
    }
}

thread_local! {
    /// The trace object a `ThreadTracer::__call__` switched away from (see there).
    static KEPT: std::cell::RefCell<Option<Py<PyAny>>> = const { std::cell::RefCell::new(None) };
}

/// Hold `object` until the next call replaces it (the previous one is released then).
fn keep_until_next_switch(object: Py<PyAny>) {
    let previous = KEPT.with(|kept| kept.borrow_mut().replace(object));
    drop(previous); // outside the borrow: releasing it may run arbitrary code
}

/// `_PyEval_SetTrace(tstate, func, obj)`, marked as ours. `obj` is held by the caller for
/// the whole call (CPython 3.9 releases the old object before it takes the new one).
fn set_trace(
    api: &Api,
    tstate: usize,
    func: Option<TraceFn>,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let was = INSTALLING.with(|flag| flag.replace(true));
    let obj_ptr = obj.map_or(std::ptr::null_mut(), |o| o.as_ptr());
    // SAFETY: GIL held; `tstate` is the calling thread's or was just checked alive, and no
    // Python code ran in between.
    let status = unsafe { (api.set_trace_for)(tstate as *mut c_void, func, obj_ptr) };
    INSTALLING.with(|flag| flag.set(was));
    if status != 0 {
        // SAFETY: GIL held; only raised when an audit hook refused.
        let py = unsafe { Python::assume_attached() };
        return Err(PyErr::take(py).unwrap_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("_PyEval_SetTrace failed")
        }));
    }
    Ok(())
}

fn mark_installed(tstate: usize, id: u64) {
    let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
    if !installed.contains(&(tstate, id)) {
        installed.push((tstate, id));
    }
}

fn is_ours(func: Option<TraceFn>) -> bool {
    func.is_some_and(|f| f as usize == tracer as TraceFn as usize)
}

/// Put our tracer on `tstate` (alive, GIL held) in front of `prev` (its tracer now).
fn install_on(
    py: Python<'_>,
    api: &Api,
    tstate: usize,
    id: u64,
    prev: (Option<TraceFn>, *mut ffi::PyObject),
) -> PyResult<()> {
    // SAFETY: `prev.1` is the thread's trace object, alive while it is installed there.
    let prev_obj = unsafe { Bound::from_borrowed_ptr_or_opt(py, prev.1) };
    if let Some(object) = prev_obj
        .as_ref()
        .filter(|o| o.is_instance_of::<ThreadTracer>())
    {
        // Our own object, put back through Python's trampoline: no need to wrap it.
        set_trace(api, tstate, Some(tracer), Some(object))?;
    } else {
        let prev_func = prev.0.filter(|f| !is_ours(Some(*f)));
        let ours = Bound::new(
            py,
            ThreadTracer {
                prev_func,
                prev_obj: prev_func.and(prev_obj).map(Bound::unbind),
            },
        )?;
        set_trace(api, tstate, Some(tracer), Some(ours.as_any()))?;
    }
    mark_installed(tstate, id);
    Ok(())
}

/// Our trace function. The trace object is the thread's `ThreadTracer`.
///
/// # Safety
/// Called by CPython with the GIL held, a live frame, and our object.
pub unsafe extern "C" fn tracer(
    obj: *mut ffi::PyObject,
    frame: *mut ffi::PyObject,
    what: c_int,
    arg: *mut ffi::PyObject,
) -> c_int {
    // SAFETY: CPython calls the trace function with the GIL held.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: `obj` is the trace object CPython holds for this thread during the call.
    let Some(borrowed) = (unsafe { Borrowed::from_ptr_or_opt(py, obj) }) else {
        return 0;
    };
    let Ok(me) = borrowed.cast::<ThreadTracer>() else {
        return 0;
    };
    if me.get().prev_func.is_none() {
        // Nothing chained: `obj` is not used once the engine has seen the event.
        // SAFETY: GIL held and `frame` is the live frame CPython passed.
        let ours = matches!(what, CALL | LINE | RETURN) && unsafe { handle(py, frame, what) };
        if what == CALL && !ours {
            // Not ours and nobody else traces here: no line events for this frame.
            // SAFETY: a live frame, GIL held.
            let frame = unsafe { Borrowed::from_ptr(py, frame) };
            if frame.setattr("f_trace_lines", false).is_err() {
                // SAFETY: GIL held.
                unsafe { ffi::PyErr_Clear() };
            }
        }
        return 0;
    }
    // An owned reference: our object (and the tracer it chains) stays alive even if the
    // chained tracer replaces us during this call (CPython then lets go of its own).
    let me = me.to_owned();
    let me = me.get();
    // SAFETY: GIL held and `frame` is the live frame CPython passed.
    let ours = matches!(what, CALL | LINE | RETURN) && unsafe { handle(py, frame, what) };
    let Some(prev) = me.prev_func else {
        return 0;
    };
    let prev_obj = me
        .prev_obj
        .as_ref()
        .map_or(std::ptr::null_mut(), |o| o.as_ptr());
    CHAINING.with(|depth| depth.set(depth.get() + 1));
    // SAFETY: the thread's own tracer, called as CPython would have called it.
    let result = unsafe { prev(prev_obj, frame, what, arg) };
    let depth = CHAINING.with(|depth| {
        depth.set(depth.get() - 1);
        depth.get()
    });
    if depth == 0 && CHANGED.with(|changed| changed.replace(false)) {
        rewrap_current(py);
    }
    if what == CALL && ours {
        // The chained tracer may have turned line events off for a frame it ignores.
        keep_trace_lines(py, frame);
    }
    result
}

/// Hand one CALL, LINE or RETURN event to the engine. True when the frame is profiled.
///
/// # Safety
/// GIL held and `frame` a live frame.
unsafe fn handle(py: Python<'_>, frame: *mut ffi::PyObject, what: c_int) -> bool {
    let Some(api) = api() else { return false };
    // SAFETY: the caller's contract.
    let code = unsafe { (api.frame_code)(frame) };
    if code.is_null() {
        unsafe { ffi::PyErr_Clear() };
        return false;
    }
    let address = code as usize;
    // SAFETY: the frame keeps its code object alive; only its address is used.
    unsafe { ffi::Py_DECREF(code) };
    // SAFETY: the caller's contract (a live frame, GIL held).
    let line = || unsafe { (api.frame_line)(frame) }.max(0) as u32;
    let event = match what {
        CALL => Event::EnterAt { line: line() },
        LINE => Event::Line { line: line() },
        _ => Event::Leave,
    };
    dispatch(py, address, event)
}

/// Turn a profiled frame's line events back on if a chained tracer turned them off.
fn keep_trace_lines(py: Python<'_>, frame: *mut ffi::PyObject) {
    // SAFETY: a live frame, GIL held.
    let frame = unsafe { Borrowed::from_ptr(py, frame) };
    let on = frame
        .getattr("f_trace_lines")
        .and_then(|v| v.extract::<bool>());
    if !matches!(on, Ok(true)) && frame.setattr("f_trace_lines", true).is_err() {
        // SAFETY: GIL held.
        unsafe { ffi::PyErr_Clear() };
    }
}

/// The chained tracer replaced the calling thread's tracer: chain the new one.
fn rewrap_current(py: Python<'_>) {
    let (Some(api), Ok(layout)) = (api(), thread_state::layout(py)) else {
        return;
    };
    // SAFETY: GIL held; the calling thread's own state.
    let (tstate, id) = unsafe {
        let tstate = (api.thread_get)();
        (tstate as usize, (api.thread_id)(tstate))
    };
    // SAFETY: the calling thread's live state, GIL held.
    let Some(now) = (unsafe { layout.trace_of(api, tstate) }) else {
        return;
    };
    if !is_ours(now.0) {
        if let Err(error) = install_on(py, api, tstate, id, now) {
            remember(error.to_string());
        }
    }
}

/// Install the audit hook that sees `sys.settrace()` on profiled threads (once).
fn watch_settrace(api: &Api) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: GIL held; the hook is a plain function that lives as long as the process.
        if unsafe { (api.add_audit_hook)(audit, std::ptr::null_mut()) } != 0 {
            // SAFETY: GIL held.
            unsafe { ffi::PyErr_Clear() };
            remember(
                "sys.settrace() inside profiled code cannot be detected: \
                      PySys_AddAuditHook was refused"
                    .to_string(),
            );
        }
    });
}

/// The audit hook: cheap and inert unless we are installed and the event is sys.settrace.
unsafe extern "C" fn audit(
    event: *const c_char,
    _args: *mut ffi::PyObject,
    _: *mut c_void,
) -> c_int {
    if !ACTIVE.load(Relaxed) {
        return 0;
    }
    // SAFETY: CPython passes the event name as a C string.
    if unsafe { CStr::from_ptr(event) }.to_bytes() != b"sys.settrace" {
        return 0;
    }
    if INSTALLING.with(Cell::get) {
        return 0;
    }
    if CHAINING.with(Cell::get) > 0 {
        CHANGED.with(|changed| changed.set(true));
        return 0;
    }
    // SAFETY: audit hooks run with the GIL held.
    replaced_here(unsafe { Python::assume_attached() });
    0
}

/// The program is replacing the calling thread's tracer: if it is ours, profiling ends on
/// this thread now.
fn replaced_here(py: Python<'_>) {
    let Some(api) = api() else { return };
    // SAFETY: GIL held; the calling thread's own state.
    let (tstate, id) = unsafe {
        let tstate = (api.thread_get)();
        (tstate as usize, (api.thread_id)(tstate))
    };
    if !INSTALLED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&(tstate, id))
    {
        return;
    }
    if bootstrapping_with_our_hook(py, api) {
        return;
    }
    INSTALLED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|&t| t != (tstate, id));
    let notice = format!(
        "profiling stopped on thread {} at {}: sys.settrace() replaced the profiler's tracer",
        thread_ident(py),
        location(py, api)
    );
    match with_engine(py, |engine| {
        engine.stop_thread(py, thread_id(), notice.clone())
    }) {
        Ok(actions) => run_actions(py, actions),
        Err(_) => report_incident(Incident::Notice(notice)),
    }
}

/// Whether the calling thread is starting (`threading`'s bootstrap installs
/// `threading.settrace`'s hook) and that hook is ours: it puts us back in front at once.
/// A thread created just before `enable()` starts this way.
fn bootstrapping_with_our_hook(py: Python<'_>, api: &Api) -> bool {
    // SAFETY: GIL held; a borrowed frame of the calling thread, or null.
    let frame = unsafe { (api.current_frame)() };
    if frame.is_null() {
        return false;
    }
    // SAFETY: `frame` is live; PyFrame_GetCode returns a new reference.
    let Some(code) = (unsafe { Bound::from_owned_ptr_or_opt(py, (api.frame_code)(frame)) }) else {
        return false;
    };
    let check = || -> PyResult<bool> {
        let threading = py.import("threading")?;
        let bootstrap = threading
            .getattr("Thread")?
            .getattr("_bootstrap_inner")?
            .getattr("__code__")?;
        if !code.is(&bootstrap) {
            return Ok(false);
        }
        let hook = threading.getattr("_trace_hook")?;
        Ok(hook.is(&py
            .import("memlab_rs._core.line_profiler")?
            .getattr("_trace_new_thread")?))
    };
    check().unwrap_or(false)
}

fn thread_ident(py: Python<'_>) -> String {
    py.import("threading")
        .and_then(|t| t.call_method0("get_ident"))
        .map_or_else(|_| "?".to_string(), |ident| ident.to_string())
}

/// "file:line" of the Python code running on the calling thread.
fn location(py: Python<'_>, api: &Api) -> String {
    // SAFETY: GIL held; a borrowed frame of the calling thread, or null.
    let frame = unsafe { (api.current_frame)() };
    if frame.is_null() {
        return "<unknown>".to_string();
    }
    // SAFETY: `frame` is live; PyFrame_GetCode returns a new reference.
    let (code, line) = unsafe {
        let code = Bound::from_owned_ptr_or_opt(py, (api.frame_code)(frame));
        (code, (api.frame_line)(frame))
    };
    let file = code
        .and_then(|c| c.getattr("co_filename").ok())
        .map_or_else(|| "<unknown>".to_string(), |f| f.to_string());
    format!("{file}:{line}")
}

/// `threading.settrace` hook: the first event of a thread started while we are enabled.
/// The thread gets the previous hook (as `threading` would have given it), then us in
/// front of it; this first event goes through both.
#[pyfunction]
pub fn _trace_new_thread(
    py: Python<'_>,
    frame: &Bound<'_, PyAny>,
    event: &Bound<'_, PyAny>,
    arg: &Bound<'_, PyAny>,
) -> PyResult<Option<Py<PyAny>>> {
    let Some(api) = api() else { return Ok(None) };
    let sys = py.import("sys")?;
    let previous = THREADING_HOOK
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|hook| hook.clone_ref(py));
    let give_previous = |hook: &Option<Py<PyAny>>| -> PyResult<()> {
        let was = INSTALLING.with(|flag| flag.replace(true));
        let done = sys.call_method1("settrace", (hook.as_ref().map(|h| h.bind(py)),));
        INSTALLING.with(|flag| flag.set(was));
        done.map(drop)
    };
    let layout = thread_state::layout(py);
    if !ACTIVE.load(Relaxed) || (layout.is_err() && previous.is_some()) {
        // Disabled meanwhile, or the official path with a tracer to give: no profiling here.
        give_previous(&previous)?;
        return match previous {
            Some(hook) => Ok(Some(hook.call1(py, (frame, event, arg))?)),
            None => Ok(None),
        };
    }
    // SAFETY: GIL held; the calling thread's own state.
    let (tstate, id) = unsafe {
        let tstate = (api.thread_get)();
        (tstate as usize, (api.thread_id)(tstate))
    };
    let prev = match layout {
        Ok(layout) => {
            give_previous(&previous)?;
            // SAFETY: the calling thread's live state, GIL held.
            unsafe { layout.trace_of(api, tstate) }.unwrap_or((None, std::ptr::null_mut()))
        }
        Err(_) => (None, std::ptr::null_mut()),
    };
    install_on(py, api, tstate, id, prev)?;
    // The trace object just installed (`sys.gettrace()` reads the calling thread's).
    let ours = sys.call_method0("gettrace")?;
    // SAFETY: GIL held, a live frame, our object (kept alive by `ours`).
    let status = unsafe { tracer(ours.as_ptr(), frame.as_ptr(), CALL, std::ptr::null_mut()) };
    if status != 0 {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("the thread's tracer failed")
        }));
    }
    Ok(None)
}

/// Install on every thread (the first `enable()`); the engine is held.
pub fn install(py: Python<'_>, engine: &mut Engine) -> PyResult<()> {
    if ACTIVE.load(Relaxed) {
        return Ok(());
    }
    let api = api().ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err(
            "this Python does not export PyEval_SetTrace/_PyEval_SetTrace; the line \
             profiler needs CPython 3.9-3.11 or sys.monitoring (3.12+)",
        )
    })?;
    watch_settrace(api);
    let layout = {
        let was = INSTALLING.with(|flag| flag.replace(true));
        let layout = thread_state::layout(py);
        INSTALLING.with(|flag| flag.set(was));
        layout
    };
    let threading = py.import("threading")?;
    let previous = match threading.getattr("gettrace") {
        Ok(get) => get.call0()?,
        Err(_) => threading.getattr("_trace_hook")?,
    };
    let hook = py
        .import("memlab_rs._core.line_profiler")?
        .getattr("_trace_new_thread")?;
    let old = std::mem::replace(
        &mut *THREADING_HOOK.lock().unwrap_or_else(|p| p.into_inner()),
        (!previous.is_none()).then(|| previous.unbind()),
    );
    drop(old);
    threading.call_method1("settrace", (&hook,))?;
    ACTIVE.store(true, Relaxed);
    match layout {
        Ok(layout) => install_everywhere(py, api, &layout, engine),
        Err(why) => install_official(py, api, why, engine),
    }
}

fn install_everywhere(
    py: Python<'_>,
    api: &Api,
    layout: &Layout,
    engine: &mut Engine,
) -> PyResult<()> {
    let mut unreadable = 0;
    for (tstate, id) in thread_state::threads(api) {
        if !thread_state::alive(api, tstate, id) {
            continue; // ended while we installed on another thread
        }
        // SAFETY: alive was just checked with the GIL held, and no Python code ran since.
        match unsafe { layout.trace_of(api, tstate) } {
            Some(now) if is_ours(now.0) => mark_installed(tstate, id),
            Some(now) => install_on(py, api, tstate, id, now)?,
            None => unreadable += 1,
        }
    }
    if unreadable > 0 {
        engine.notice_enabled(format!(
            "{unreadable} thread(s) were not profiled: their thread state did not pass the \
             layout check"
        ));
    }
    Ok(())
}

fn install_official(py: Python<'_>, api: &Api, why: &str, engine: &mut Engine) -> PyResult<()> {
    // SAFETY: GIL held; the calling thread's own state.
    let (tstate, id) = unsafe {
        let tstate = (api.thread_get)();
        (tstate as usize, (api.thread_id)(tstate))
    };
    let own = py.import("sys")?.call_method0("gettrace")?;
    if own.is_none() {
        install_on(py, api, tstate, id, (None, std::ptr::null_mut()))?;
    }
    let others = thread_state::threads(api).len() - 1;
    let this_one = if own.is_none() {
        String::new()
    } else {
        ", and this one (it has a tracer of its own)".to_string()
    };
    engine.notice_enabled(format!(
        "some threads were not profiled, because other threads' tracers cannot be read here \
         ({why}): the {others} other thread(s) running when profiling started{this_one}; \
         threads started later are profiled unless threading.settrace gives them a tracer"
    ));
    Ok(())
}

/// Give every thread its own tracer back (the last `disable()`); the engine is held.
pub fn uninstall(py: Python<'_>) -> PyResult<()> {
    if !ACTIVE.swap(false, Relaxed) {
        return Ok(());
    }
    let Some(api) = api() else { return Ok(()) };
    let threading = py.import("threading")?;
    let previous = THREADING_HOOK
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let current = match threading.getattr("gettrace") {
        Ok(get) => get.call0()?,
        Err(_) => threading.getattr("_trace_hook")?,
    };
    let hook = py
        .import("memlab_rs._core.line_profiler")?
        .getattr("_trace_new_thread")?;
    if current.is(&hook) {
        // Only ours is taken back: a hook set by someone else since stays.
        threading.call_method1("settrace", (previous.as_ref().map(|h| h.bind(py)),))?;
    }
    drop(previous);
    let installed = std::mem::take(&mut *INSTALLED.lock().unwrap_or_else(|p| p.into_inner()));
    let layout = thread_state::layout(py);
    let mut first_error = None;
    for (tstate, id) in installed {
        if !thread_state::alive(api, tstate, id) {
            continue;
        }
        let restored = match &layout {
            // SAFETY: alive was just checked with the GIL held, and no Python code ran since.
            Ok(layout) => match unsafe { layout.trace_of(api, tstate) } {
                Some((func, obj)) if is_ours(func) => {
                    // SAFETY: our tracer's object: the ThreadTracer we installed.
                    match unsafe { Bound::from_borrowed_ptr_or_opt(py, obj) } {
                        Some(obj) => restore(py, api, tstate, &obj),
                        None => set_trace(api, tstate, None, None),
                    }
                }
                _ => Ok(()), // replaced by someone else: theirs stays
            },
            // The official path only installs where there was no tracer.
            Err(_) => set_trace(api, tstate, None, None),
        };
        if let Err(error) = restored {
            first_error.get_or_insert(error);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Put back on `tstate` the tracer our `ThreadTracer` `obj` chained.
fn restore(py: Python<'_>, api: &Api, tstate: usize, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    let Ok(ours) = obj.cast::<ThreadTracer>() else {
        return set_trace(api, tstate, None, None);
    };
    let ours = ours.get();
    // Held across the call: releasing our object may release the last other reference.
    let prev_obj = ours.prev_obj.as_ref().map(|o| o.bind(py).clone());
    set_trace(api, tstate, ours.prev_func, prev_obj.as_ref())
}
