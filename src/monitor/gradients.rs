//! Intermediate gradients: the gradients a backward passes between the nodes of the graph
//! that never become a leaf's `.grad` (the gradients of non-leaf tensors: of activations,
//! of the loss), what the original per-iteration profiler meant by the line. The figure is
//! the most bytes of them alive at once, each storage once, on the monitored device.
//!
//! How: at the start of a backward the monitor measures, `GradientLog::watch` walks the
//! graph from the backward's roots and puts a post-hook (`GradientNodeHook`) on every node
//! but `AccumulateGrad` (a leaf's); the monitor removes the hooks when the backward
//! returns. torch runs a node's post-hooks when the node has returned, while it still holds
//! the gradients it received: the hook logs the storages of those and of the gradients it
//! returned (and which go to an `AccumulateGrad`), then samples which logged storages are
//! alive: those received and returned here, and every one still waiting for its node. At the end, a storage that went to a leaf is left out of every sample, for its
//! whole life (Linear's gradient of `weight.t()` is the weight's `.grad` once transposed
//! back: a weight gradient from the start), and the figure is the largest sample.
//!
//! Why node hooks and not the allocator: the allocator cannot tell a gradient from the
//! activations backward frees as it goes, so "peak minus start minus parameter gradients"
//! read 0 while megabytes of gradients were alive. A sample is taken per node, so a sum
//! made while two gradients of one tensor are added (both and their sum alive for a moment)
//! is not seen; the saved gradients and what they return are.
//!
//! Alive means the storage is: the log holds torch's weak reference to each storage
//! (`UntypedStorage._weak_ref`, what `torch.multiprocessing`'s `StorageWeakRef` holds),
//! which expires when the last tensor on it goes, whatever holds that tensor (the engine,
//! a view made in a node, the user). A weak reference to a Python tensor would follow that
//! object, not the memory.
//!
//! The hooks never raise into the user's backward: a gradient whose storage cannot be read
//! (sparse, nested, a wrapper subclass) is skipped and the log says it is incomplete. The
//! log's lock is held only while no Python runs (a collection may run finalizers at any
//! call into Python, and a hook may run on autograd's device threads).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// One storage's life as a gradient: its bytes, whether a leaf got it, and torch's weak
/// reference to it while it may be alive (None once it expired).
struct Slot {
    nbytes: i64,
    leaf: bool,
    weak: Option<usize>,
}

#[derive(Default)]
struct Log {
    slots: Vec<Slot>,
    /// Slots whose storage was alive at the last look, by storage address.
    live: HashMap<i64, usize>,
    /// The slots alive at each node's end.
    samples: Vec<Vec<usize>>,
    incomplete: bool,
    closed: bool,
}

/// A gradient at a node's end: its storage's address and bytes, torch's weak reference to
/// the storage (None when the log already watches a storage at that address), and whether
/// it goes to a leaf.
struct Seen {
    ptr: i64,
    nbytes: i64,
    weak: Option<usize>,
    leaf: bool,
}

/// The gradients of one backward (and of backwards run inside it) on one device.
#[pyclass(module = "memlab_rs._core", frozen, weakref)]
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
        let watched: Vec<(usize, i64, usize)> = {
            let log = self.lock();
            if log.closed {
                return;
            }
            log.live
                .iter()
                .filter_map(|(&ptr, &slot)| log.slots[slot].weak.map(|w| (slot, ptr, w)))
                .collect()
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
            .map(|(&(_, ptr, _), _)| ptr)
            .collect();
        let mut unreadable = false;
        let mut seen = Vec::new();
        for t in &received {
            seen.extend(self.seen(py, t, false, &alive, &mut unreadable));
        }
        for (t, leaf) in &returned {
            seen.extend(self.seen(py, t, *leaf, &alive, &mut unreadable));
        }
        let mut to_free = Vec::new();
        {
            let mut log = self.lock();
            log.incomplete |= unreadable;
            for (&(slot, ptr, _), gone) in watched.iter().zip(&gone) {
                if *gone && log.live.get(&ptr) == Some(&slot) {
                    log.live.remove(&ptr);
                    to_free.extend(log.slots[slot].weak.take());
                }
            }
            let mut sample: HashSet<usize> = log.live.values().copied().collect();
            for s in seen {
                let slot = match log.live.get(&s.ptr) {
                    Some(&slot) => {
                        to_free.extend(s.weak); // watched already
                        slot
                    }
                    None => match s.weak {
                        Some(weak) => {
                            log.slots.push(Slot {
                                nbytes: s.nbytes,
                                leaf: false,
                                weak: Some(weak),
                            });
                            let slot = log.slots.len() - 1;
                            log.live.insert(s.ptr, slot);
                            slot
                        }
                        None => continue, // it expired between the two looks: gone
                    },
                };
                log.slots[slot].leaf |= s.leaf;
                sample.insert(slot);
            }
            log.samples.push(sample.into_iter().collect());
        }
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
        drop(held);
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

    /// Stop logging and give torch's weak references back (the hooks must be off by now;
    /// a hook called later logs nothing).
    fn close(&self, py: Python<'_>) {
        let weak: Vec<usize> = {
            let mut log = self.lock();
            log.closed = true;
            log.live.clear();
            log.slots.iter_mut().filter_map(|s| s.weak.take()).collect()
        };
        self.free_all(py, weak);
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
        let (Ok(returned), Ok(received)) = (
            grad_inputs.cast::<PyTuple>(),
            grad_outputs.cast::<PyTuple>(),
        ) else {
            log.lock().incomplete = true;
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
        let weak: Vec<usize> = log.slots.iter_mut().filter_map(|s| s.weak.take()).collect();
        if !weak.is_empty() {
            Python::attach(|py| self.free_all(py, weak));
        }
    }
}
