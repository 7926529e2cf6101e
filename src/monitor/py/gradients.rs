//! The intermediate-gradient log's Python side (`_core.monitor.GradientLog` and the
//! `GradientNodeHook` it puts on a backward's nodes): what the log asks torch (which weak
//! references to storages expired, each gradient's device and storage), handed to the
//! books in `monitor::gradients` (whose docs say what the figure is and how it is taken).
//!
//! The hooks never raise into the user's backward: a gradient whose storage cannot be read
//! (sparse, nested, a wrapper subclass) is skipped and the log says it is incomplete. The
//! log's lock is held only while no Python runs (a collection may run finalizers at any
//! call into Python, and a hook may run on autograd's device threads).

use std::collections::HashSet;
use std::sync::Mutex;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::monitor::gradients::{Log, Seen, Watched};

/// The gradients of one backward (and of backwards run inside it) on one device.
#[pyclass(module = "memlab_rs._core.monitor", frozen, weakref)]
pub struct GradientLog {
    device: i64,
    /// `torch.UntypedStorage._expired` and `_free_weak_ref`.
    expired: Py<PyAny>,
    free: Py<PyAny>,
    log: Mutex<Log>,
}

impl GradientLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Give torch's weak references back (outside the lock).
    fn free_all(&self, py: Python<'_>, weak: Vec<usize>) {
        let free = self.free.bind(py);
        for w in weak {
            let _ = free.call1((w,));
        }
    }

    /// A gradient at a node's end, or None (no tensor, another device, no storage; with
    /// `unreadable` set when it is a tensor whose storage cannot be read).
    fn seen(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        leaf: bool,
        watched: &HashSet<i64>,
        unreadable: &mut bool,
    ) -> Option<Seen> {
        if t.is_none() {
            return None;
        }
        let device = t
            .call_method0(intern!(py, "get_device"))
            .and_then(|d| d.extract::<i64>());
        let Ok(device) = device else {
            *unreadable = true; // not a tensor torch can place
            return None;
        };
        let storage = t.call_method0(intern!(py, "untyped_storage"));
        let read =
            |s: &Bound<'_, PyAny>, name| s.call_method0(name).and_then(|v| v.extract::<i64>()).ok();
        let Some((storage, ptr, nbytes)) = storage.ok().and_then(|s| {
            let ptr = read(&s, intern!(py, "data_ptr"))?;
            let nbytes = read(&s, intern!(py, "nbytes"))?;
            Some((s, ptr, nbytes))
        }) else {
            *unreadable = true; // sparse, nested, a wrapper subclass: no storage of its own
            return None;
        };
        if device != self.device || ptr == 0 {
            return None;
        }
        let weak = if watched.contains(&ptr) {
            None
        } else {
            match storage
                .call_method0(intern!(py, "_weak_ref"))
                .and_then(|w| w.extract::<usize>())
            {
                Ok(w) => Some(w),
                Err(_) => {
                    *unreadable = true;
                    return None;
                }
            }
        };
        Some(Seen {
            ptr,
            nbytes,
            weak,
            leaf,
        })
    }

    /// One node's end: `received` and `returned` (with whether each goes to a leaf) are
    /// logged, then what is alive is sampled.
    fn node_end(
        &self,
        py: Python<'_>,
        received: Vec<Bound<'_, PyAny>>,
        returned: Vec<(Bound<'_, PyAny>, bool)>,
    ) {
        // Which watched storages expired (asked outside the lock).
        let Some(watched) = self.lock().watched() else {
            return;
        };
        let expired = self.expired.bind(py);
        let gone: Vec<bool> = watched
            .iter()
            .map(|&(_, _, w)| {
                expired
                    .call1((w,))
                    .and_then(|e| e.is_truthy())
                    .unwrap_or(true)
            })
            .collect();
        let alive: HashSet<i64> = watched
            .iter()
            .zip(&gone)
            .filter(|(_, gone)| !**gone)
            .map(|(&(_, ptr, _), _): (&Watched, _)| ptr)
            .collect();
        let mut unreadable = false;
        let mut seen = Vec::new();
        for t in &received {
            seen.extend(self.seen(py, t, false, &alive, &mut unreadable));
        }
        for (t, leaf) in &returned {
            seen.extend(self.seen(py, t, *leaf, &alive, &mut unreadable));
        }
        let to_free = self.lock().node_end(&watched, &gone, seen, unreadable);
        self.free_all(py, to_free);
    }
}

#[pymethods]
impl GradientLog {
    /// A log of the gradients on `device` (-1: the CPU, else the CUDA index).
    #[new]
    fn new(py: Python<'_>, device: i64) -> PyResult<Self> {
        let storage = py.import("torch")?.getattr("UntypedStorage")?;
        Ok(Self {
            device,
            expired: storage.getattr("_expired")?.unbind(),
            free: storage.getattr("_free_weak_ref")?.unbind(),
            log: Mutex::new(Log::default()),
        })
    }

    /// Put a `GradientNodeHook` on every node reachable from `roots` (autograd nodes, None
    /// for a root without one), but on `AccumulateGrad`s; returns the hooks' handles (the
    /// caller removes them when the backward returns).
    fn watch(slf: &Bound<'_, Self>, roots: Vec<Bound<'_, PyAny>>) -> Vec<Py<PyAny>> {
        let py = slf.py();
        let mut handles = Vec::new();
        // A node's Python object is torch's only while something holds it (torch makes a
        // new one at the next look once it is gone, maybe at a freed one's address): every
        // node seen is held until the walk ends, so one address is one node.
        let mut seen: HashSet<usize> = HashSet::new();
        let mut held: Vec<Bound<'_, PyAny>> = Vec::new();
        let mut todo: Vec<Bound<'_, PyAny>> = roots.into_iter().filter(|r| !r.is_none()).collect();
        while let Some(node) = todo.pop() {
            if !seen.insert(node.as_ptr() as usize) {
                continue;
            }
            held.push(node.clone());
            if is_leaf_node(&node) {
                continue;
            }
            let Ok(next) = node.getattr(intern!(py, "next_functions")) else {
                slf.get().lock().set_incomplete();
                continue;
            };
            let Ok(next) = next.cast_into::<PyTuple>() else {
                slf.get().lock().set_incomplete();
                continue;
            };
            let mut to_leaf = Vec::with_capacity(next.len());
            for edge in next.iter() {
                // (function, input number); the function is None where no gradient flows.
                let function = edge.get_item(0).ok().filter(|f| !f.is_none());
                to_leaf.push(function.as_ref().is_some_and(is_leaf_node));
                if let Some(function) = function {
                    todo.push(function);
                }
            }
            let hook = GradientNodeHook {
                log: slf.clone().unbind(),
                to_leaf,
            };
            match node.call_method1(intern!(py, "register_hook"), (hook,)) {
                Ok(handle) => handles.push(handle.unbind()),
                Err(_) => slf.get().lock().set_incomplete(),
            }
        }
        drop(held);
        handles
    }

    /// The most bytes of intermediate gradients alive at once (0 when no node ran).
    fn peak(&self) -> i64 {
        self.lock().peak()
    }

    /// Stop logging and give torch's weak references back (the hooks must be off by now;
    /// a hook called later logs nothing).
    fn close(&self, py: Python<'_>) {
        let weak = self.lock().close();
        self.free_all(py, weak);
    }

    /// Whether a gradient or a node could not be read (the figure may then be low).
    #[getter]
    fn incomplete(&self) -> bool {
        self.lock().incomplete()
    }

    /// How many node ends were sampled.
    #[getter]
    fn samples(&self) -> usize {
        self.lock().samples()
    }
}

/// Whether `node` is a leaf's gradient accumulator.
fn is_leaf_node(node: &Bound<'_, PyAny>) -> bool {
    node.get_type()
        .name()
        .is_ok_and(|name| name == "AccumulateGrad")
}

/// The post-hook on one node: torch calls it with (the gradients the node returned, the
/// gradients it received) when the node has returned.
#[pyclass(module = "memlab_rs._core.monitor", frozen)]
pub struct GradientNodeHook {
    log: Py<GradientLog>,
    /// Per gradient returned: whether it goes to a leaf's `AccumulateGrad`.
    to_leaf: Vec<bool>,
}

#[pymethods]
impl GradientNodeHook {
    fn __call__(
        &self,
        py: Python<'_>,
        grad_inputs: &Bound<'_, PyAny>,
        grad_outputs: &Bound<'_, PyAny>,
    ) {
        let log = self.log.get();
        let (Ok(returned), Ok(received)) = (
            grad_inputs.cast::<PyTuple>(),
            grad_outputs.cast::<PyTuple>(),
        ) else {
            log.lock().set_incomplete();
            return;
        };
        let returned = returned
            .iter()
            .enumerate()
            .map(|(i, t)| (t, self.to_leaf.get(i).copied().unwrap_or(false)))
            .collect();
        log.node_end(py, received.iter().collect(), returned);
    }
}

impl Drop for GradientLog {
    /// Give back what `close` did not (a log dropped without it).
    fn drop(&mut self) {
        let log = self.log.get_mut().unwrap_or_else(|e| e.into_inner());
        let weak = log.take_weak();
        if !weak.is_empty() {
            Python::attach(|py| self.free_all(py, weak));
        }
    }
}
