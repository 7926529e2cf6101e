//! Intermediate gradients: the gradients a backward passes between the nodes of the graph
//! that never become a leaf's `.grad` (the gradients of non-leaf tensors: of activations,
//! of the loss), what the original per-iteration profiler meant by the line. The figure is
//! the most bytes of them alive at once, each storage once, on the monitored device.
//!
//! How: at the start of a backward the monitor measures, `GradientLog::watch` walks the
//! graph from the backward's roots and puts a post-hook (`GradientNodeHook`) on every node
//! but `AccumulateGrad` (a leaf's); the monitor removes the hooks when the backward
//! returns. torch runs a node's post-hooks when the node has returned, while it still holds
//! the gradients it received: the hook logs those and the gradients it returned (weakly,
//! with their storages, and which go to an `AccumulateGrad`), then samples which logged
//! storages are alive: those received and returned here, and every one still waiting for
//! its node. At the end, a storage that went to a leaf is left out of every sample, for its
//! whole life (Linear's gradient of `weight.t()` is the weight's `.grad` once transposed
//! back: a weight gradient from the start), and the figure is the largest sample.
//!
//! Why node hooks and not the allocator: the allocator cannot tell a gradient from the
//! activations backward frees as it goes, so "peak minus start minus parameter gradients"
//! read 0 while megabytes of gradients were alive. A sample is taken per node, so a sum
//! made while two gradients of one tensor are added (both and their sum alive for a moment)
//! is not seen; the saved gradients and what they return are.
//!
//! The hooks never raise into the user's backward: a gradient whose storage cannot be read
//! (sparse, nested, a wrapper subclass) is skipped and the log says it is incomplete.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyWeakrefMethods, PyWeakrefReference};

use super::saved::storage_of;

/// One storage's life as a gradient: its address and bytes, and whether a leaf got it.
struct Slot {
    ptr: i64,
    nbytes: i64,
    leaf: bool,
}

#[derive(Default)]
struct Log {
    /// Each logged gradient tensor (weakly) and its slot.
    entries: Vec<(Py<PyWeakrefReference>, usize)>,
    slots: Vec<Slot>,
    /// The slots alive at each node's end.
    samples: Vec<Vec<usize>>,
    incomplete: bool,
}

/// A gradient seen at a node's end: its storage, and whether it goes to a leaf.
struct Seen {
    tensor: Py<PyWeakrefReference>,
    ptr: i64,
    nbytes: i64,
    leaf: bool,
}

/// The gradients of one backward (and of backwards run inside it) on one device.
#[pyclass(module = "memlab_rs._core", frozen, weakref)]
pub struct GradientLog {
    device: i64,
    /// Locked only while no Python code can run (a hook may run on autograd's device
    /// threads, and a collection may run finalizers at any call into Python).
    log: Mutex<Log>,
}

impl GradientLog {
    /// Log `seen` (received and returned at one node's end), then sample what is alive.
    fn node_end(&self, py: Python<'_>, seen: Vec<Seen>) {
        let mut dropped = Vec::new();
        {
            let mut log = self.lock();
            // Keep the logged tensors still alive. Upgrading runs no Python code, and the
            // reference it lends is given back at once, to an object something else holds.
            for (weak, slot) in std::mem::take(&mut log.entries) {
                if weak.bind(py).upgrade().is_some() {
                    log.entries.push((weak, slot));
                } else {
                    dropped.push(weak);
                }
            }
            // Storage address -> slot, for the slots with a logged tensor alive.
            let mut live: HashMap<i64, usize> = log
                .entries
                .iter()
                .map(|(_, slot)| (log.slots[*slot].ptr, *slot))
                .collect();
            let mut sample: HashSet<usize> = live.values().copied().collect();
            for s in seen {
                let slot = match live.get(&s.ptr) {
                    Some(&slot) => slot,
                    None => {
                        log.slots.push(Slot {
                            ptr: s.ptr,
                            nbytes: s.nbytes,
                            leaf: false,
                        });
                        let slot = log.slots.len() - 1;
                        live.insert(s.ptr, slot);
                        slot
                    }
                };
                log.slots[slot].leaf |= s.leaf;
                sample.insert(slot);
                log.entries.push((s.tensor, slot));
            }
            log.samples.push(sample.into_iter().collect());
        }
        // Dead weak references go outside the lock.
        drop(dropped);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A gradient at a node's end, or None (no tensor, another device, no storage).
    fn seen(&self, py: Python<'_>, t: &Bound<'_, PyAny>, leaf: bool) -> Option<Seen> {
        if t.is_none() {
            return None;
        }
        let (ptr, nbytes) = storage_of(py, t, self.device)?;
        let tensor = PyWeakrefReference::new(t).ok()?.unbind();
        Some(Seen {
            tensor,
            ptr,
            nbytes,
            leaf,
        })
    }

    /// Whether `t` is a tensor that has no storage to read here (it is counted as not seen).
    fn unreadable(py: Python<'_>, t: &Bound<'_, PyAny>) -> bool {
        !t.is_none()
            && t.call_method0(intern!(py, "get_device"))
                .and_then(|d| d.extract::<i64>())
                .is_ok()
            && super::saved::storage(py, t).is_none()
    }
}

#[pymethods]
impl GradientLog {
    /// A log of the gradients on `device` (-1: the CPU, else the CUDA index).
    #[new]
    fn new(device: i64) -> Self {
        Self {
            device,
            log: Mutex::new(Log::default()),
        }
    }

    /// Put a `GradientNodeHook` on every node reachable from `roots` (autograd nodes, None
    /// for a root without one), but on `AccumulateGrad`s; returns the hooks' handles (the
    /// caller removes them when the backward returns).
    fn watch(slf: &Bound<'_, Self>, roots: Vec<Bound<'_, PyAny>>) -> Vec<Py<PyAny>> {
        let py = slf.py();
        let mut handles = Vec::new();
        let mut seen: HashSet<usize> = HashSet::new();
        let mut todo: Vec<Bound<'_, PyAny>> = roots.into_iter().filter(|r| !r.is_none()).collect();
        while let Some(node) = todo.pop() {
            if !seen.insert(node.as_ptr() as usize) || is_leaf_node(&node) {
                continue;
            }
            let Ok(next) = node.getattr(intern!(py, "next_functions")) else {
                slf.get().lock().incomplete = true;
                continue;
            };
            let Ok(next) = next.cast_into::<PyTuple>() else {
                slf.get().lock().incomplete = true;
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
                Err(_) => slf.get().lock().incomplete = true,
            }
        }
        handles
    }

    /// The most bytes of intermediate gradients alive at once (0 when no node ran).
    fn peak(&self) -> i64 {
        let log = self.lock();
        log.samples
            .iter()
            .map(|sample| {
                sample
                    .iter()
                    .map(|&s| &log.slots[s])
                    .filter(|slot| !slot.leaf)
                    .map(|slot| slot.nbytes)
                    .sum::<i64>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Whether a gradient or a node could not be read (the figure may then be low).
    #[getter]
    fn incomplete(&self) -> bool {
        self.lock().incomplete
    }

    /// How many node ends were sampled.
    #[getter]
    fn samples(&self) -> usize {
        self.lock().samples.len()
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
#[pyclass(module = "memlab_rs._core", frozen)]
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
        let mut seen = Vec::new();
        let mut unreadable = false;
        let received = grad_outputs.cast::<PyTuple>().ok();
        let returned = grad_inputs.cast::<PyTuple>().ok();
        for t in received.iter().flat_map(|tuple| tuple.iter()) {
            match log.seen(py, &t, false) {
                Some(s) => seen.push(s),
                None => unreadable |= GradientLog::unreadable(py, &t),
            }
        }
        for (i, t) in returned.iter().flat_map(|tuple| tuple.iter()).enumerate() {
            let leaf = self.to_leaf.get(i).copied().unwrap_or(false);
            match log.seen(py, &t, leaf) {
                Some(s) => seen.push(s),
                None => unreadable |= GradientLog::unreadable(py, &t),
            }
        }
        if unreadable || received.is_none() || returned.is_none() {
            log.lock().incomplete = true;
        }
        log.node_end(py, seen);
    }
}
