//! The interpreter hooks: how events of profiled code objects reach the engine, and only
//! theirs.
//!
//! - Python 3.12+: `sys.monitoring`, with our own tool id and *local* events on the
//!   profiled code objects only (PY_START, PY_RESUME, LINE, PY_RETURN, PY_YIELD). Code we
//!   do not profile runs at full speed, and coverage tools and debuggers keep their ids.
//!   PY_UNWIND and PY_THROW cannot be local; they are global, which costs a call only when
//!   an exception leaves a frame or is thrown into a generator. Monitoring is per
//!   interpreter, so every thread is covered, including those started before `enable()`.
//! - Python 3.9-3.11: a C-level trace function (`PyEval_SetTrace`), installed on every
//!   existing thread and, through `threading.settrace`, on new ones. For a code object we
//!   do not profile it switches the frame's line events off at the call. The previous
//!   `sys.settrace` tracer of the enabling thread and `threading.settrace` hook come back
//!   at `disable()`.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use pyo3::ffi;
use pyo3::prelude::*;

use super::engine::{try_with_engine, with_engine, Action, Event};

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

/// Python functions that start and stop CPU storage tracking on the calling thread.
static CPU_TRACKING: OnceLock<(Py<PyAny>, Py<PyAny>)> = OnceLock::new();

pub fn set_cpu_tracking(start: Py<PyAny>, stop: Py<PyAny>) {
    let _ = CPU_TRACKING.set((start, stop));
}

/// Errors raised while handling events: kept for the report, never raised into user code.
pub static ERRORS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn remember(error: PyErr) {
    let mut errors = ERRORS.lock().unwrap_or_else(|p| p.into_inner());
    if errors.len() < 8 {
        errors.push(error.to_string());
    }
}

pub fn run_actions(py: Python<'_>, actions: Vec<Action>) {
    let Some((start, stop)) = CPU_TRACKING.get() else {
        return;
    };
    for action in actions {
        let call = match action {
            Action::TrackCpuOnThisThread => start,
            Action::UntrackCpuOnThisThread => stop,
        };
        if let Err(error) = call.call0(py) {
            remember(error);
        }
    }
}

/// Hand one event to the engine. Returns false when the code object is not watched.
fn dispatch(py: Python<'_>, address: usize, event: Event) -> bool {
    let thread = thread_id();
    let outcome = try_with_engine(|engine| engine.on_event(py, address, event, thread));
    match outcome {
        Some(Ok(Some(actions))) => {
            run_actions(py, actions);
            true
        }
        Some(Ok(None)) | None => false,
        Some(Err(error)) => {
            remember(error);
            true
        }
    }
}

/// Make the hooks match the engine: events on for every watched code object, off for the
/// rest, and no hook at all when no profiler is enabled.
pub fn sync(py: Python<'_>) -> PyResult<()> {
    let (wanted, enabled) = with_engine(|engine| (engine.watched_codes(py), engine.any_enabled()));
    if py.version_info() >= (3, 12) {
        monitoring::sync(py, wanted, enabled)
    } else {
        tracing::sync(py, enabled)
    }
}

mod monitoring {
    use super::*;

    const EVENTS: [(&str, &str); 7] = [
        ("PY_START", "on_start"),
        ("PY_RESUME", "on_resume"),
        ("LINE", "on_line"),
        ("PY_RETURN", "on_leave"),
        ("PY_YIELD", "on_leave"),
        ("PY_UNWIND", "on_leave"),
        ("PY_THROW", "on_throw"),
    ];
    const LOCAL: [&str; 5] = ["PY_START", "PY_RESUME", "LINE", "PY_RETURN", "PY_YIELD"];
    const GLOBAL: [&str; 2] = ["PY_UNWIND", "PY_THROW"];

    struct State {
        tool: i64,
        armed: Vec<Py<PyAny>>,
    }

    static STATE: Mutex<Option<State>> = Mutex::new(None);

    fn event_set(events: &Bound<'_, PyAny>, names: &[&str]) -> PyResult<i64> {
        names.iter().try_fold(0, |set, name| {
            Ok(set | events.getattr(*name)?.extract::<i64>()?)
        })
    }

    pub fn sync(py: Python<'_>, wanted: Vec<Py<PyAny>>, enabled: bool) -> PyResult<()> {
        let monitoring = py.import("sys")?.getattr("monitoring")?;
        let events = monitoring.getattr("events")?;
        let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
        if enabled && state.is_none() {
            *state = Some(State {
                tool: claim_tool(py, &monitoring, &events)?,
                armed: Vec::new(),
            });
        }
        let Some(current) = state.as_mut() else {
            return Ok(());
        };
        let tool = current.tool;
        let local = event_set(&events, &LOCAL)?;
        for code in &current.armed {
            if !wanted.iter().any(|w| w.as_ptr() == code.as_ptr()) {
                monitoring.call_method1("set_local_events", (tool, code.bind(py), 0))?;
            }
        }
        for code in &wanted {
            monitoring.call_method1("set_local_events", (tool, code.bind(py), local))?;
        }
        current.armed = wanted;
        if !enabled {
            monitoring.call_method1("set_events", (tool, 0))?;
            for (event, _) in EVENTS {
                let event = events.getattr(event)?;
                monitoring.call_method1("register_callback", (tool, event, py.None()))?;
            }
            monitoring.call_method1("free_tool_id", (tool,))?;
            *state = None;
        }
        Ok(())
    }

    /// Take a free tool id (the profiler id if nobody uses it) and register our callbacks.
    fn claim_tool(
        py: Python<'_>,
        monitoring: &Bound<'_, PyAny>,
        events: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let mut tool = None;
        for id in [2_i64, 3, 4, 5] {
            let free = monitoring.call_method1("get_tool", (id,))?.is_none();
            if free {
                monitoring.call_method1("use_tool_id", (id, "memlab_rs"))?;
                tool = Some(id);
                break;
            }
        }
        let tool = tool.ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "every sys.monitoring tool id from 2 to 5 is taken by another tool; \
                 disable one of them (sys.monitoring.free_tool_id) to use the line profiler",
            )
        })?;
        let callbacks = py.import("memlab_rs._core")?;
        for (event, callback) in EVENTS {
            let event = events.getattr(event)?;
            let callback = callbacks.getattr(format!("_monitoring_{callback}"))?;
            monitoring.call_method1("register_callback", (tool, event, callback))?;
        }
        monitoring.call_method1("set_events", (tool, event_set(events, &GLOBAL)?))?;
        Ok(tool)
    }
}

/// sys.monitoring PY_START: a profiled function starts.
#[pyfunction]
pub fn _monitoring_on_start(py: Python<'_>, code: &Bound<'_, PyAny>, _offset: i64) {
    dispatch(py, code.as_ptr() as usize, Event::Start);
}

/// sys.monitoring PY_RESUME: a profiled generator or coroutine resumes.
#[pyfunction]
pub fn _monitoring_on_resume(py: Python<'_>, code: &Bound<'_, PyAny>, offset: i64) {
    dispatch(py, code.as_ptr() as usize, Event::Resume { offset });
}

/// sys.monitoring LINE: a profiled frame moves to a line.
#[pyfunction]
pub fn _monitoring_on_line(py: Python<'_>, code: &Bound<'_, PyAny>, line: u32) {
    dispatch(py, code.as_ptr() as usize, Event::Line { line });
}

/// sys.monitoring PY_RETURN, PY_YIELD and PY_UNWIND (global: an exception leaves a frame):
/// a profiled frame leaves the stack.
#[pyfunction]
pub fn _monitoring_on_leave(
    py: Python<'_>,
    code: &Bound<'_, PyAny>,
    _offset: i64,
    _value: &Bound<'_, PyAny>,
) {
    dispatch(py, code.as_ptr() as usize, Event::Leave);
}

/// sys.monitoring PY_THROW (global): an exception is thrown into a suspended generator.
#[pyfunction]
pub fn _monitoring_on_throw(
    py: Python<'_>,
    code: &Bound<'_, PyAny>,
    offset: i64,
    _error: &Bound<'_, PyAny>,
) {
    dispatch(py, code.as_ptr() as usize, Event::Resume { offset });
}

mod tracing {
    use super::*;

    type TraceFn = unsafe extern "C" fn(
        *mut ffi::PyObject,
        *mut ffi::PyObject,
        c_int,
        *mut ffi::PyObject,
    ) -> c_int;

    /// The C API the trace hook needs, looked up at run time: `_PyEval_SetTrace` and the
    /// thread-state iterators are not in the limited API, and an abi3 wheel must still
    /// import on interpreters that drop them.
    struct Api {
        set_trace: unsafe extern "C" fn(Option<TraceFn>, *mut ffi::PyObject),
        set_trace_for:
            unsafe extern "C" fn(*mut c_void, Option<TraceFn>, *mut ffi::PyObject) -> c_int,
        interpreter: unsafe extern "C" fn() -> *mut c_void,
        thread_head: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
        thread_next: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
        frame_code: unsafe extern "C" fn(*mut ffi::PyObject) -> *mut ffi::PyObject,
        frame_line: unsafe extern "C" fn(*mut ffi::PyObject) -> c_int,
    }

    fn api() -> Option<&'static Api> {
        static API: OnceLock<Option<Api>> = OnceLock::new();
        API.get_or_init(|| {
            #[cfg(unix)]
            {
                let this = libloading::os::unix::Library::this();
                // SAFETY: these symbols have these signatures in CPython 3.9-3.11.
                unsafe {
                    Some(Api {
                        set_trace: *this.get(b"PyEval_SetTrace\0").ok()?,
                        set_trace_for: *this.get(b"_PyEval_SetTrace\0").ok()?,
                        interpreter: *this.get(b"PyInterpreterState_Get\0").ok()?,
                        thread_head: *this.get(b"PyInterpreterState_ThreadHead\0").ok()?,
                        thread_next: *this.get(b"PyThreadState_Next\0").ok()?,
                        frame_code: *this.get(b"PyFrame_GetCode\0").ok()?,
                        frame_line: *this.get(b"PyFrame_GetLineNumber\0").ok()?,
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

    const CALL: c_int = 0;
    const LINE: c_int = 2;
    const RETURN: c_int = 3;

    /// What was there before we installed ourselves, given back at uninstall.
    struct Saved {
        sys_tracer: Py<PyAny>,
        threading_hook: Py<PyAny>,
    }

    static SAVED: Mutex<Option<Saved>> = Mutex::new(None);

    unsafe extern "C" fn tracer(
        _obj: *mut ffi::PyObject,
        frame: *mut ffi::PyObject,
        what: c_int,
        _arg: *mut ffi::PyObject,
    ) -> c_int {
        if !matches!(what, CALL | LINE | RETURN) {
            return 0;
        }
        let Some(api) = api() else { return 0 };
        // SAFETY: CPython calls the trace function with the GIL held and a live frame.
        let py = unsafe { Python::assume_attached() };
        let code = unsafe { (api.frame_code)(frame) };
        if code.is_null() {
            return 0;
        }
        let address = code as usize;
        // SAFETY: the frame keeps its code object alive; we only need its address.
        unsafe { ffi::Py_DECREF(code) };
        let event = match what {
            CALL => Event::EnterAt {
                line: unsafe { (api.frame_line)(frame) }.max(0) as u32,
            },
            LINE => Event::Line {
                line: unsafe { (api.frame_line)(frame) }.max(0) as u32,
            },
            _ => Event::Leave,
        };
        if !dispatch(py, address, event) && what == CALL {
            // Not ours: no line events for this frame (it still gets call and return).
            let frame = unsafe { Bound::from_borrowed_ptr(py, frame) };
            if frame.setattr("f_trace_lines", false).is_err() {
                unsafe { ffi::PyErr_Clear() };
            }
        }
        0
    }

    /// `threading.settrace` hook: the first event of a new thread installs the C tracer
    /// there and is handled as its first call.
    #[pyfunction]
    pub fn _trace_new_thread(
        py: Python<'_>,
        frame: &Bound<'_, PyAny>,
        _event: &Bound<'_, PyAny>,
        _arg: &Bound<'_, PyAny>,
    ) -> Option<Py<PyAny>> {
        let api = api()?;
        let hook = hook_object(py).ok()?;
        // SAFETY: GIL held; installs for the calling thread only.
        unsafe {
            (api.set_trace)(Some(tracer), hook.as_ptr());
            tracer(hook.as_ptr(), frame.as_ptr(), CALL, std::ptr::null_mut());
        }
        None
    }

    fn hook_object(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        py.import("memlab_rs._core")?.getattr("_trace_new_thread")
    }

    pub fn sync(py: Python<'_>, enabled: bool) -> PyResult<()> {
        let api = api().ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "this Python does not export PyEval_SetTrace/_PyEval_SetTrace; the line \
                 profiler needs CPython 3.9-3.11 or sys.monitoring (3.12+)",
            )
        })?;
        let sys = py.import("sys")?;
        let threading = py.import("threading")?;
        let mut saved = SAVED.lock().unwrap_or_else(|p| p.into_inner());
        let hook = hook_object(py)?;
        if enabled && saved.is_none() {
            let threading_hook = match threading.getattr("gettrace") {
                Ok(get) => get.call0()?,
                Err(_) => threading.getattr("_trace_hook")?,
            };
            *saved = Some(Saved {
                sys_tracer: sys.call_method0("gettrace")?.unbind(),
                threading_hook: threading_hook.unbind(),
            });
            threading.call_method1("settrace", (&hook,))?;
            for_each_thread(api, |tstate| unsafe {
                (api.set_trace_for)(tstate, Some(tracer), hook.as_ptr());
            });
        } else if !enabled {
            if let Some(previous) = saved.take() {
                for_each_thread(api, |tstate| unsafe {
                    (api.set_trace_for)(tstate, None, std::ptr::null_mut());
                });
                threading.call_method1("settrace", (previous.threading_hook.bind(py),))?;
                sys.call_method1("settrace", (previous.sys_tracer.bind(py),))?;
            }
        }
        Ok(())
    }

    fn for_each_thread(api: &Api, mut f: impl FnMut(*mut c_void)) {
        // SAFETY: GIL held, so the thread list cannot change while we walk it.
        unsafe {
            let mut tstate = (api.thread_head)((api.interpreter)());
            while !tstate.is_null() {
                f(tstate);
                tstate = (api.thread_next)(tstate);
            }
        }
    }
}

pub use tracing::_trace_new_thread;
