//! Intermediate gradients: the gradients a backward passes between the nodes of the graph
//! that never become a leaf's `.grad` (the gradients of non-leaf tensors: of activations,
//! of the loss), what the original per-iteration profiler meant by the line. The figure is
//! the most bytes of them alive at once, each storage once, on the monitored device.
//!
//! How: at the start of a backward the monitor measures, `GradientLog::watch` walks the
//! graph from the backward's roots and puts a post-hook (`GradientNodeHook`) on every node
//! but `AccumulateGrad` (a leaf's); the monitor removes the hooks when the backward
//! returns. torch runs a node's post-hooks when the node has returned, while it still holds
//! the gradients it received, and before it hands what it returned to the nodes that take
//! it. Each hook samples what is alive at that moment: the gradients the node received and
//! returned, and every gradient waiting in a later node's input buffer. The figure is the
//! largest sample; a storage that went to a leaf is left out of every sample, for its whole
//! life (Linear's gradient of `weight.t()` is the weight's `.grad` once transposed back: a
//! weight gradient from the start).
//!
//! Which gradients wait where comes from the graph, not from the storages: the walk knows
//! each node's edges (`next_functions`: the node and input number each returned gradient
//! goes to), so a returned gradient waits at (node, input) until that node has run, and a
//! second gradient for the same input is summed into the first there. A storage is known by
//! its base address, read from the tensor (`data_ptr`, `storage_offset`, sizes and
//! strides): no storage object is ever made. Making one (`untyped_storage()`, or a weak
//! reference through it) keeps torch from summing gradients in place, which changed the very
//! allocations measured: two extra 2 MiB and four 512 KiB blocks per GPT-2 backward on an
//! H100, so measured and unmeasured iterations never matched.
//!
//! Why node hooks and not the allocator: the allocator cannot tell a gradient from the
//! activations backward frees as it goes, so "peak minus start minus parameter gradients"
//! read 0 while megabytes of gradients were alive. A sample is taken per node, so a sum
//! made while two gradients of one tensor are added (both and their sum alive for a moment)
//! is not seen; the received gradients and what they return are. A gradient something else
//! keeps (`retain_grad`, a tensor hook that stores it) counts until its node has run.
//!
//! The hooks never raise into the user's backward: a gradient whose memory cannot be read
//! (sparse, nested, a wrapper subclass) is skipped and the log says it is incomplete. The
//! log's lock is held only while no Python runs (a collection may run finalizers at any
//! call into Python, and a hook may run on autograd's device threads).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// Where a returned gradient goes: a node of the walk (its number) and its input number.
type Input = (usize, i64);

/// One storage's life as a gradient: its bytes (the most its tensors were seen to span)
/// and whether a leaf got it.
struct Slot {
    nbytes: i64,
    leaf: bool,
}

#[derive(Default)]
struct Log {
    slots: Vec<Slot>,
    /// Slots alive now (waiting in an input buffer), by storage base address.
    live: HashMap<i64, usize>,
    /// What waits in each input buffer.
    waiting: HashMap<Input, usize>,
    /// The backward's roots (the first watch's): what they receive is the caller's
    /// (`grad_tensors`, or the ones torch made for a scalar loss), alive until it returns.
    roots: HashSet<usize>,
    /// Those gradients, once seen.
    held: HashSet<usize>,
    /// Whether a watch ran (a later one is a backward inside this one).
    watched: bool,
    /// The slots alive at each node's end.
    samples: Vec<Vec<usize>>,
    incomplete: bool,
    closed: bool,
}

impl Log {
    /// The slot of a storage seen now: the live one at its address, or a new one.
    fn slot(&mut self, memory: Memory) -> usize {
        if let Some(&slot) = self.live.get(&memory.base) {
            let known = &mut self.slots[slot];
            known.nbytes = known.nbytes.max(memory.nbytes);
            return slot;
        }
        self.slots.push(Slot {
            nbytes: memory.nbytes,
            leaf: false,
        });
        let slot = self.slots.len() - 1;
        self.live.insert(memory.base, slot);
        slot
    }

    /// One node's end, read: sample what is alive, then move on to what waits after it.
    fn node_end(
        &mut self,
        node: usize,
        received: Vec<(i64, Option<Memory>)>,
        returned: Vec<(Edge, Option<Memory>)>,
    ) {
        // What this node received waited in its input buffer, as what was summed there
        // (maybe a new storage): it is read from the node's inputs, and goes when the node
        // is done.
        for (input, _) in &received {
            self.waiting.remove(&(node, *input));
        }
        let mut sample: HashSet<usize> = self.waiting.values().copied().collect();
        sample.extend(self.held.iter().copied());
        let root = self.roots.contains(&node);
        for memory in received.into_iter().filter_map(|(_, memory)| memory) {
            let slot = self.slot(memory);
            sample.insert(slot);
            if root {
                self.held.insert(slot);
            }
        }
        let mut now_waiting = Vec::new();
        for (edge, memory) in returned {
            let Some(memory) = memory else { continue };
            let slot = self.slot(memory);
            sample.insert(slot);
            match edge {
                Edge::Leaf => self.slots[slot].leaf = true,
                // A second gradient for the same input is summed into the first: one stays.
                Edge::Node(input) => now_waiting.push((input, slot)),
                Edge::Nowhere => {}
            }
        }
        for (input, slot) in now_waiting {
            self.waiting.entry(input).or_insert(slot);
        }
        self.samples.push(sample.into_iter().collect());
        // A storage neither an input buffer nor the caller holds is gone: its address may
        // come back as another.
        let mut alive: HashSet<usize> = self.waiting.values().copied().collect();
        alive.extend(self.held.iter().copied());
        self.live.retain(|_, slot| alive.contains(slot));
    }
}

/// A gradient's memory: its storage's base address and the bytes its tensor spans from it.
#[derive(Clone, Copy)]
struct Memory {
    base: i64,
    nbytes: i64,
}

/// Where a node's returned gradient goes.
#[derive(Clone, Copy)]
enum Edge {
    /// A leaf's `AccumulateGrad`: it becomes a `.grad`.
    Leaf,
    /// A node's input buffer.
    Node(Input),
    /// Nowhere (no gradient flows there).
    Nowhere,
}

/// Numbers the nodes of every walk, so one node's hook and its producers' edges agree.
static NEXT_NODE: AtomicUsize = AtomicUsize::new(0);

/// The gradients of one backward (and of backwards run inside it) on one device.
#[pyclass(module = "memlab_rs._core.monitor", frozen, weakref)]
pub struct GradientLog {
    device: i64,
    log: Mutex<Log>,
}

impl GradientLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A gradient's memory, or None (no tensor, another device, nothing allocated); with
    /// `unreadable` set when it is a tensor whose memory cannot be read. Reads only the
    /// tensor's own fields: a storage object would change what torch allocates (module doc).
    fn memory(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        unreadable: &mut bool,
    ) -> Option<Memory> {
        if t.is_none() {
            return None;
        }
        let int = |name: &Bound<'_, pyo3::types::PyString>| {
            t.call_method0(name).and_then(|v| v.extract::<i64>()).ok()
        };
        let ints = |name: &Bound<'_, pyo3::types::PyString>| {
            t.call_method0(name)
                .and_then(|v| v.extract::<Vec<i64>>())
                .ok()
        };
        let Some(device) = int(intern!(py, "get_device")) else {
            *unreadable = true; // not a tensor torch can place
            return None;
        };
        if device != self.device {
            return None;
        }
        let facts = (|| {
            let ptr = int(intern!(py, "data_ptr"))?;
            let offset = int(intern!(py, "storage_offset"))?;
            let item = int(intern!(py, "element_size"))?;
            let sizes = ints(intern!(py, "size"))?;
            let strides = ints(intern!(py, "stride"))?;
            Some((ptr, offset, item, sizes, strides))
        })();
        let Some((ptr, offset, item, sizes, strides)) = facts else {
            *unreadable = true; // sparse, nested, a wrapper subclass: no strided memory
            return None;
        };
        if ptr == 0 || sizes.contains(&0) {
            return None;
        }
        // The elements it reaches: one past the farthest, each dimension at its last index.
        let mut last = 0i64;
        for (&size, &stride) in sizes.iter().zip(&strides) {
            last = last.saturating_add((size - 1).saturating_mul(stride.max(0)));
        }
        let span = last.saturating_add(1).saturating_mul(item);
        let before = offset.saturating_mul(item);
        Some(Memory {
            base: ptr - before,
            nbytes: before.saturating_add(span),
        })
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
        // A node's Python object is torch's only while something holds it (torch makes a
        // new one at the next look once it is gone, maybe at a freed one's address): every
        // node seen is held until the walk ends, so one address is one node, one number.
        let mut numbers: HashMap<usize, usize> = HashMap::new();
        let mut number = |node: &Bound<'_, PyAny>| {
            *numbers
                .entry(node.as_ptr() as usize)
                .or_insert_with(|| NEXT_NODE.fetch_add(1, Ordering::Relaxed))
        };
        let mut seen: HashSet<usize> = HashSet::new();
        let mut held: Vec<Bound<'_, PyAny>> = Vec::new();
        let mut todo: Vec<Bound<'_, PyAny>> = roots.into_iter().filter(|r| !r.is_none()).collect();
        {
            // A backward inside this one (reentrant checkpointing) starts from what a node
            // of ours received: those wait in its input buffer, counted there.
            let roots: HashSet<usize> = todo.iter().map(&mut number).collect();
            let mut log = slf.get().lock();
            if !log.watched {
                log.watched = true;
                log.roots = roots;
            }
        }
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
            let mut edges = Vec::with_capacity(next.len());
            for edge in next.iter() {
                // (function, input number); the function is None where no gradient flows.
                let function = edge.get_item(0).ok().filter(|f| !f.is_none());
                let input = edge.get_item(1).and_then(|i| i.extract::<i64>()).ok();
                edges.push(match (&function, input) {
                    (Some(f), _) if is_leaf_node(f) => Edge::Leaf,
                    (Some(f), Some(input)) => Edge::Node((number(f), input)),
                    _ => Edge::Nowhere,
                });
                if let Some(function) = function {
                    held.push(function.clone());
                    todo.push(function);
                }
            }
            let hook = GradientNodeHook {
                log: slf.clone().unbind(),
                node: number(&node),
                edges,
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

    /// Stop logging (the hooks must be off by now; a hook called later logs nothing).
    fn close(&self) {
        let mut log = self.lock();
        log.closed = true;
        log.live.clear();
        log.waiting.clear();
        log.held.clear();
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
#[pyclass(module = "memlab_rs._core.monitor", frozen)]
pub struct GradientNodeHook {
    log: Py<GradientLog>,
    /// This node's number in the walk.
    node: usize,
    /// Per gradient returned: where it goes.
    edges: Vec<Edge>,
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
        // Read every tensor before the lock: reading calls into Python.
        let mut unreadable = false;
        let received: Vec<(i64, Option<Memory>)> = received
            .iter()
            .enumerate()
            .map(|(i, t)| (i as i64, log.memory(py, &t, &mut unreadable)))
            .collect();
        let returned: Vec<(Edge, Option<Memory>)> = returned
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let edge = self.edges.get(i).copied().unwrap_or(Edge::Nowhere);
                (edge, log.memory(py, &t, &mut unreadable))
            })
            .collect();
        let mut state = log.lock();
        state.incomplete |= unreadable;
        if !state.closed {
            state.node_end(self.node, received, returned);
        }
    }
}
