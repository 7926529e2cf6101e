//! Python 3.12+: `sys.monitoring`, with a tool id of our own and *local* events on the
//! profiled code objects only (PY_START, PY_RESUME, LINE, PY_RETURN, PY_YIELD). Code we do
//! not profile runs at full speed. PY_UNWIND and PY_THROW cannot be local; they are global,
//! which costs a call only when an exception leaves a frame or is thrown into a generator.
//! Monitoring is per interpreter, so every thread is covered, including those started
//! before `enable()`.
//!
//! The tool id is 3 or 4, which CPython leaves unassigned: 0, 1, 2 and 5 belong to
//! debuggers, coverage, profilers (cProfile takes `PROFILER_ID`) and optimizers, so those
//! keep working alongside. When both are taken, `enable()` says by whom.

use std::sync::Mutex;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use super::dispatch::dispatch;
use super::engine::Event;

/// The tool ids we may take, in order of preference.
const TOOL_IDS: [i64; 2] = [3, 4];

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

/// Touched only with the engine held (see `sync`).
static STATE: Mutex<Option<State>> = Mutex::new(None);

fn event_set(events: &Bound<'_, PyAny>, names: &[&str]) -> PyResult<i64> {
    names.iter().try_fold(0, |set, name| {
        Ok(set | events.getattr(*name)?.extract::<i64>()?)
    })
}

/// Make the events match `wanted`; claim a tool id when `enabled` and give it back when not.
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

/// Take the first free id of `TOOL_IDS` and register our callbacks.
fn claim_tool(
    py: Python<'_>,
    monitoring: &Bound<'_, PyAny>,
    events: &Bound<'_, PyAny>,
) -> PyResult<i64> {
    let mut holders = Vec::new();
    let mut tool = None;
    for id in TOOL_IDS {
        let holder = monitoring.call_method1("get_tool", (id,))?;
        if holder.is_none() {
            monitoring.call_method1("use_tool_id", (id, "memlab_rs"))?;
            tool = Some(id);
            break;
        }
        holders.push(format!("{id} by {}", holder.repr()?.extract::<String>()?));
    }
    let tool = tool.ok_or_else(|| {
        PyRuntimeError::new_err(format!(
            "the line profiler needs sys.monitoring tool id 3 or 4, and both are taken ({}); \
             ids 0-2 and 5 are left to debuggers, coverage, profilers and optimizers. Free \
             one with sys.monitoring.free_tool_id(3) once its tool is done",
            holders.join(", ")
        ))
    })?;
    let callbacks = py.import("memlab_rs._core.line_profiler")?;
    for (event, callback) in EVENTS {
        let event = events.getattr(event)?;
        let callback = callbacks.getattr(format!("_monitoring_{callback}"))?;
        monitoring.call_method1("register_callback", (tool, event, callback))?;
    }
    monitoring.call_method1("set_events", (tool, event_set(events, &GLOBAL)?))?;
    Ok(tool)
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
