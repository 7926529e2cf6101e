//! The CPU trace's Python side: `_cpu_trace_start`, `_cpu_trace_stop` (a snapshot dict in
//! the schema of `torch.cuda.memory._snapshot()`, plus a `"memlab_rs"` key: see
//! TRACE_CONTRACT in the issue), `_cpu_trace_set_tag`, `_cpu_trace_mark` (a position in the
//! entries) and `_cpu_trace_active`.
//!
//! A trace is one user of the CPU source (`lifecycle::start` / `lifecycle::stop`), so the allocator
//! hook is installed while it runs, with or without a line profiler. Starting and stopping
//! run under the sources' lock (`crate::sources::lock`), like every other start and stop of
//! the CPU source: that lock is held across `fork()`, so a child never inherits the source's
//! own lifecycle lock taken by a thread it does not have.
//!
//! Frames are symbolised at the stop, once per interned (code object, line): each is one
//! dict shared by every entry and block that has it (`is`), as in torch's snapshots, and
//! each stack one list shared the same way. `name` is `co_name`, as torch writes it.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict, PyList, PyString, PyTuple};

use std::collections::HashMap;

use super::lifecycle;
use super::stack;
use crate::sources::cpu::record::{self, Action, Recorder};
use crate::sources::cpu::Mode;
use crate::sources::lock::{self, held_here};

/// Run `f` under the sources' lock, waiting for another holder with the GIL released.
fn under_lock<T>(py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    let _held = lock::take(|| py.detach(lock::wait_free)).map_err(|_| busy())?;
    f()
}

fn busy() -> PyErr {
    PyRuntimeError::new_err(
        "the CPU trace cannot start or stop from code that the line profiler runs (a \
         finaliser during a garbage collection, or a callback); do it once that code has \
         returned",
    )
}

/// Start recording CPU allocations and frees, with their Python stacks, keeping the newest
/// `max_entries` entries (a free is two entries, as in torch's history).
///
/// Example:
///     >>> from memlab_rs import _core
///     >>> _core._cpu_trace_start(100_000)
///     >>> _core._cpu_trace_active()
///     True
///     >>> trace = _core._cpu_trace_stop()
///     >>> sorted(trace["memlab_rs"])
///     ['dropped', 'no_stack', 'source', 'start', 'version']
#[pyfunction]
pub fn _cpu_trace_start(py: Python<'_>, max_entries: i64) -> PyResult<()> {
    if max_entries < 1 {
        return Err(PyValueError::new_err(format!(
            "max_entries must be at least 1 (the number of entries the trace keeps), got \
             {max_entries}"
        )));
    }
    if held_here() {
        return Err(busy());
    }
    stack::prepare();
    under_lock(py, || {
        if record::active() {
            return Err(PyRuntimeError::new_err(
                "a CPU trace is already running: stop it with _cpu_trace_stop() before \
                 starting another",
            ));
        }
        if let Mode::Dispatch(why) = lifecycle::start(py)? {
            lifecycle::stop(py);
            return Err(PyRuntimeError::new_err(format!(
                "the CPU trace needs the allocator hook on torch's CPU allocator, which \
                 cannot be used here ({why}); the dispatch-mode fallback sees neither \
                 every allocation nor their stacks"
            )));
        }
        let started = record::start(max_entries as usize);
        if let Err(why) = started {
            lifecycle::stop(py);
            return Err(PyRuntimeError::new_err(format!(
                "the CPU trace could not start: {why}"
            )));
        }
        Ok(())
    })
}

/// Stop the CPU trace and return it as a snapshot dict in torch's schema (`segments`: every
/// CPU allocation alive now; `device_traces[0]`: the entries; `memlab_rs`: what was alive
/// at the start, and how many entries were dropped or have no Python stack).
///
/// Example:
///     >>> import torch
///     >>> from memlab_rs import _core
///     >>> _core._cpu_trace_start(1000)
///     >>> x = torch.empty(1024, 256)
///     >>> trace = _core._cpu_trace_stop()
///     >>> [(e["action"], e["size"]) for e in trace["device_traces"][0] if e["addr"] == x.data_ptr()]
///     [('alloc', 1048576)]
#[pyfunction]
pub fn _cpu_trace_stop(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    if held_here() {
        return Err(busy());
    }
    let stopped = under_lock(py, || {
        let stopped = record::stop();
        if stopped.is_some() {
            lifecycle::stop(py);
        }
        Ok(stopped)
    })?;
    let Some((recorder, live)) = stopped else {
        return Err(PyRuntimeError::new_err(
            "no CPU trace is running: start one with _cpu_trace_start(max_entries)",
        ));
    };
    // Built with no lock held: it allocates, and a collection may run finalisers.
    let snapshot = without_collections(py, || snapshot(py, &recorder, &live));
    drop(recorder); // its code objects, with the GIL
    snapshot
}

/// Run `f` with the cyclic garbage collector paused (and resumed if it was on). A snapshot
/// is a million small containers, none of them garbage: with the collector on, building
/// one ran a collection every few hundred of them, each walking all made so far, which was
/// most of the time a stop took.
fn without_collections<T>(py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    let gc = py.import("gc")?;
    let was_on = gc.call_method0("isenabled")?.is_truthy()?;
    if was_on {
        gc.call_method0("disable")?;
    }
    let result = f();
    if was_on {
        gc.call_method0("enable")?;
    }
    result
}

/// Tag this thread's CPU allocations and frees from now on (`user_metadata` of their
/// entries); "" clears the tag. It holds across traces.
///
/// Example:
///     >>> from memlab_rs import _core
///     >>> _core._cpu_trace_set_tag("forward:encoder.layer.0")
///     >>> _core._cpu_trace_set_tag("")
#[pyfunction]
pub fn _cpu_trace_set_tag(tag: &str) {
    record::set_tag(tag);
}

/// The running CPU trace's position: how many entries it has taken so far, kept and
/// dropped (entry `position - dropped` of the snapshot's list is the next one). Marks where a
/// step ends, for the leak check.
///
/// Example:
///     >>> import torch
///     >>> from memlab_rs import _core
///     >>> _core._cpu_trace_start(1000)
///     >>> before = _core._cpu_trace_mark()
///     >>> x = torch.empty(1024)
///     >>> trace = _core._cpu_trace_stop()
///     >>> trace["device_traces"][0][before]["action"]
///     'alloc'
#[pyfunction]
pub fn _cpu_trace_mark() -> PyResult<u64> {
    record::position().ok_or_else(|| {
        PyRuntimeError::new_err(
            "no CPU trace is running: start one with _cpu_trace_start(max_entries)",
        )
    })
}

/// Whether a CPU trace is running.
///
/// Example:
///     >>> from memlab_rs import _core
///     >>> _core._cpu_trace_active()
///     False
#[pyfunction]
pub fn _cpu_trace_active() -> bool {
    record::active()
}

/// In a forked child (an `os.register_at_fork` handler): the parent's trace does not run
/// here; drop its recorder and its use of the CPU source.
fn after_fork_in_child(py: Python<'_>) {
    if let Some(recorder) = record::take_forked() {
        drop(recorder); // its code objects, with the GIL
        lifecycle::stop_in_forked_child(py);
    }
}

/// Register `after_fork_in_child` (once, when `_core` is imported).
pub fn register_fork_handler(py: Python<'_>) -> PyResult<()> {
    let Ok(register) = py.import("os")?.getattr("register_at_fork") else {
        return Ok(()); // no fork on this platform
    };
    let handler = PyCFunction::new_closure(
        py,
        Some(c"_cpu_trace_after_fork_in_child"),
        None,
        |args: &Bound<'_, PyTuple>, _: Option<&Bound<'_, PyDict>>| {
            after_fork_in_child(args.py());
        },
    )?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("after_in_child", handler)?;
    register.call((), Some(&kwargs)).map(drop)
}

/// The trace as a snapshot dict (see TRACE_CONTRACT).
fn snapshot<'py>(
    py: Python<'py>,
    recorder: &Recorder,
    live: &[record::LiveAtStop],
) -> PyResult<Bound<'py, PyDict>> {
    // One dict per (code object, line); frames interned by instruction offset share it.
    let mut by_line: HashMap<(usize, i32), Bound<'py, PyDict>> = HashMap::new();
    let frames = recorder
        .frames
        .iter()
        .map(|(code, at)| {
            // SAFETY: the GIL is held; the recorder holds `code` alive.
            let line = unsafe { stack::line(code.as_ptr(), *at) };
            let key = (code.as_ptr() as usize, line);
            if let Some(frame) = by_line.get(&key) {
                return Ok(frame.clone());
            }
            let code = code.bind(py);
            let frame = PyDict::new(py);
            frame.set_item(
                intern!(py, "filename"),
                code.getattr(intern!(py, "co_filename"))?,
            )?;
            frame.set_item(intern!(py, "line"), line)?;
            frame.set_item(intern!(py, "name"), code.getattr(intern!(py, "co_name"))?)?;
            by_line.insert(key, frame.clone());
            Ok(frame)
        })
        .collect::<PyResult<Vec<_>>>()?;
    // stacks[0] is the empty one: one shared list for every entry without a stack.
    let stacks = recorder
        .stacks
        .iter()
        .map(|ids| PyList::new(py, ids.iter().map(|&id| &frames[id as usize])))
        .collect::<PyResult<Vec<_>>>()?;
    let stack = |id: u32| stacks.get(id as usize).unwrap_or(&stacks[0]);

    let names = record::tag_names();
    let mut tags: Vec<Option<Bound<'py, PyString>>> = vec![None; names.len()];
    let mut tag = |id: u32| -> Bound<'py, PyString> {
        let id = if (id as usize) < names.len() { id } else { 0 } as usize;
        tags[id]
            .get_or_insert_with(|| PyString::new(py, &names[id]))
            .clone()
    };

    let actions = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted]
        .map(|action| PyString::new(py, action.name()));
    let entries = PyList::empty(py);
    for event in &recorder.events {
        let entry = PyDict::new(py);
        entry.set_item(intern!(py, "action"), &actions[event.action as usize])?;
        entry.set_item(intern!(py, "addr"), event.addr)?;
        entry.set_item(intern!(py, "size"), event.size)?;
        entry.set_item(intern!(py, "stream"), 0)?;
        entry.set_item(intern!(py, "time_us"), event.time_us)?;
        entry.set_item(intern!(py, "frames"), stack(event.stack))?;
        entry.set_item(intern!(py, "user_metadata"), tag(event.tag))?;
        entries.append(entry)?;
    }

    let segments = PyList::empty(py);
    for &(address, nbytes, id) in live {
        let block = PyDict::new(py);
        block.set_item(intern!(py, "address"), address)?;
        block.set_item(intern!(py, "size"), nbytes)?;
        block.set_item(intern!(py, "requested_size"), nbytes)?;
        block.set_item(intern!(py, "state"), intern!(py, "active_allocated"))?;
        block.set_item(intern!(py, "frames"), stack(id))?;
        let segment = PyDict::new(py);
        segment.set_item(intern!(py, "device"), 0)?;
        segment.set_item(intern!(py, "address"), address)?;
        for key in [
            intern!(py, "total_size"),
            intern!(py, "allocated_size"),
            intern!(py, "active_size"),
            intern!(py, "requested_size"),
        ] {
            segment.set_item(key, nbytes)?;
        }
        segment.set_item(intern!(py, "stream"), 0)?;
        segment.set_item(intern!(py, "segment_type"), intern!(py, "cpu"))?;
        segment.set_item(intern!(py, "segment_pool_id"), (0, 0))?;
        segment.set_item(intern!(py, "is_expandable"), false)?;
        segment.set_item(intern!(py, "frames"), PyList::empty(py))?;
        segment.set_item(intern!(py, "blocks"), [block])?;
        segments.append(segment)?;
    }

    let start = PyDict::new(py);
    start.set_item("time_us", recorder.start_time_us)?;
    let alive = recorder
        .start_live
        .iter()
        .map(|&(address, nbytes)| PyList::new(py, [address as i128, nbytes as i128]))
        .collect::<PyResult<Vec<_>>>()?;
    start.set_item("live", alive)?;
    let ours = PyDict::new(py);
    ours.set_item("version", 1)?;
    ours.set_item("source", "cpu")?;
    ours.set_item("start", start)?;
    ours.set_item("dropped", recorder.dropped)?;
    ours.set_item("no_stack", recorder.no_stack)?;

    let snapshot = PyDict::new(py);
    snapshot.set_item("segments", segments)?;
    snapshot.set_item("device_traces", [entries])?;
    snapshot.set_item("allocator_settings", PyDict::new(py))?;
    snapshot.set_item("external_annotations", PyList::empty(py))?;
    snapshot.set_item("memlab_rs", ours)?;
    Ok(snapshot)
}
