//! The monitor's saved-tensor hooks, in Rust because torch calls them once per tensor saved
//! for backward (hundreds per training step).
//!
//! `pack` returns a `SavedHeld`: the only object autograd keeps for that saved tensor, so
//! its life is exactly the graph's hold. It owns an `Arc<Slot>`; the hooks keep a `Weak`
//! to the same slot, so "is this saved tensor still held?" is a pointer test with no Python
//! call (`Weak::upgrade`), and the log never keeps a tensor alive.
//!
//! What the slot holds: a leaf (no `grad_fn`) is held as is: it cannot be the output of the
//! node saving it, so no reference cycle through `grad_fn` can form. Anything else may be
//! such an output, so it is held as a detached alias (`t.detach()`, as torch's docs advise).
//! An outer hook pair on top of the stack when the monitor pushes this pair is chained: its
//! pack runs first and its result is held (counted only when it is a tensor).
//!
//! The pair only logs: the monitor pushes it for the iterations it measures and pops it
//! after (`monitor.py`), and finds backward boundaries itself (`_backward_calls.py`).
//!
//! Storages are read at the boundaries, not at pack time, so a storage resized or freed in
//! between (FSDP frees parameter storages after forward) reads as it is at the boundary.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyType};

use crate::interrupts::Interruptible;

struct Slot {
    /// What autograd holds through the `SavedHeld`.
    packed: Py<PyAny>,
    /// The module label on top of the module stack when it was saved (verbose only).
    module: Option<Py<PyAny>>,
    /// The chained pair's unpack, when its pack made `packed`.
    unpack: Option<Py<PyAny>>,
}

/// What autograd holds for one saved tensor while the monitor's hooks are installed.
#[pyclass(module = "memlab_rs._core.monitor", frozen)]
pub struct SavedHeld {
    slot: Arc<Slot>,
}

/// The pack/unpack pair and the log of what it saved.
#[pyclass(module = "memlab_rs._core.monitor", frozen)]
pub struct SavedTensorHooks {
    /// The pair chained under this one, set each time the monitor pushes it.
    outer: RwLock<Option<(Py<PyAny>, Py<PyAny>)>>,
    modules: Option<Py<PyList>>,
    tensor_type: Py<PyType>,
    stopped: AtomicBool,
    /// Locked only around pure Rust work (never while calling Python), so a collection
    /// that runs finalizers inside `pack` cannot deadlock on it.
    saved: Mutex<Vec<(Weak<Slot>, bool)>>,
}

/// (storage address, bytes) of a tensor's storage, the address 0 for one without memory
/// (meta); None when it has no storage of its own (sparse, nested, wrapper subclasses).
/// Err only for what interrupts the caller's loop (a signal handler's exception).
pub fn storage(
    py: Python<'_>,
    t: &Bound<'_, PyAny>,
    interrupts: &mut Interruptible,
) -> PyResult<Option<(i64, i64)>> {
    let read = || -> PyResult<(i64, i64)> {
        let s = t.call_method0(intern!(py, "untyped_storage"))?;
        let read = |name| s.call_method0(name).and_then(|v| v.extract::<i64>());
        Ok((read(intern!(py, "data_ptr"))?, read(intern!(py, "nbytes"))?))
    };
    interrupts.item(py, read())
}

/// (storage address, bytes) of a tensor on device `device` (-1: CPU), None when it is
/// elsewhere, has no memory, or has no storage of its own.
fn storage_of(
    py: Python<'_>,
    t: &Bound<'_, PyAny>,
    device: i64,
    interrupts: &mut Interruptible,
) -> PyResult<Option<(i64, i64)>> {
    let on = t
        .call_method0(intern!(py, "get_device"))
        .and_then(|d| d.extract::<i64>());
    if interrupts.item(py, on)? != Some(device) {
        return Ok(None);
    }
    Ok(storage(py, t, interrupts)?.filter(|&(ptr, _)| ptr != 0))
}

/// (the module label that saved a storage first, or None; the storage's bytes).
pub type ModuleBytes = (Option<Py<PyAny>>, i64);

impl SavedTensorHooks {
    /// The chained pair, if any.
    fn outer_pair(&self, py: Python<'_>) -> Option<(Py<PyAny>, Py<PyAny>)> {
        let outer = self.outer.read().unwrap_or_else(|e| e.into_inner());
        outer
            .as_ref()
            .map(|(p, u)| (p.clone_ref(py), u.clone_ref(py)))
    }

    /// The slots still held, in save order, with whether each counts; forgets the others.
    fn alive(&self) -> Vec<Arc<Slot>> {
        let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(saved.len());
        saved.retain(|(weak, counted)| match weak.upgrade() {
            Some(slot) => {
                if *counted {
                    out.push(slot);
                }
                true
            }
            None => false,
        });
        out
    }

    /// Bytes of the distinct storages held, less `known`; with `by_module`, per module
    /// (each storage under the module that saved it first). Err only for what interrupts
    /// the loop (a signal handler's exception: see `interrupts`).
    pub fn held_bytes(
        &self,
        py: Python<'_>,
        device: i64,
        known: &HashSet<i64>,
    ) -> PyResult<(i64, Vec<ModuleBytes>)> {
        let mut seen: HashMap<i64, usize> = HashMap::new();
        let mut groups: Vec<ModuleBytes> = Vec::new();
        let mut total = 0;
        let mut interrupts = Interruptible::new();
        for slot in self.alive() {
            interrupts.check(py)?;
            let packed = slot.packed.bind(py);
            let Some((ptr, nbytes)) = storage_of(py, packed, device, &mut interrupts)? else {
                continue;
            };
            if known.contains(&ptr) || seen.contains_key(&ptr) {
                continue;
            }
            seen.insert(ptr, groups.len());
            total += nbytes;
            groups.push((slot.module.as_ref().map(|m| m.clone_ref(py)), nbytes));
        }
        Ok((total, groups))
    }
}

#[pymethods]
impl SavedTensorHooks {
    /// `tensor_type` is `torch.Tensor`; `modules` the verbose module stack (a list whose
    /// last item labels the module running now).
    #[new]
    #[pyo3(signature = (tensor_type, modules=None))]
    fn new(tensor_type: Py<PyType>, modules: Option<Py<PyList>>) -> Self {
        Self {
            outer: RwLock::new(None),
            modules,
            tensor_type,
            stopped: AtomicBool::new(false),
            saved: Mutex::new(Vec::new()),
        }
    }

    /// Chain `outer` (a (pack, unpack) pair, or None) under this pair from now on: called
    /// just before the monitor pushes it, with the pair then on top of the stack.
    #[pyo3(signature = (outer=None))]
    fn chain(&self, outer: Option<(Py<PyAny>, Py<PyAny>)>) {
        *self.outer.write().unwrap_or_else(|e| e.into_inner()) = outer;
    }

    /// The pack hook.
    fn pack(&self, py: Python<'_>, t: &Bound<'_, PyAny>) -> PyResult<SavedHeld> {
        let outer = self.outer_pair(py);
        let (packed, counted) = match &outer {
            None => {
                let leaf = t.getattr(intern!(py, "is_leaf"))?.is_truthy()?;
                let packed = if leaf {
                    t.clone()
                } else {
                    t.call_method0(intern!(py, "detach"))?
                };
                (packed.unbind(), true)
            }
            Some((pack, _)) => {
                let packed = pack.bind(py).call1((t,))?;
                let counted = packed.is_instance(self.tensor_type.bind(py))?;
                (packed.unbind(), counted)
            }
        };
        let module = match &self.modules {
            Some(stack) => {
                let stack = stack.bind(py);
                let n = stack.len();
                if n > 0 {
                    Some(stack.get_item(n - 1)?.unbind())
                } else {
                    None
                }
            }
            None => None,
        };
        let unpack = outer.map(|(_, unpack)| unpack);
        let slot = Arc::new(Slot {
            packed,
            module,
            unpack,
        });
        if !self.stopped.load(Ordering::Relaxed) {
            let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
            saved.push((Arc::downgrade(&slot), counted));
        }
        Ok(SavedHeld { slot })
    }

    /// The unpack hook: the chained pair's unpack when the tensor was packed by it.
    fn unpack(&self, py: Python<'_>, held: &Bound<'_, SavedHeld>) -> PyResult<Py<PyAny>> {
        let slot = &held.get().slot;
        let packed = slot.packed.clone_ref(py);
        match &slot.unpack {
            None => Ok(packed),
            Some(unpack) => unpack.call1(py, (packed,)),
        }
    }

    /// Record nothing more and forget the log; the hooks only pass tensors through.
    fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.saved.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// How many saved tensors are still held (those that count and those that do not).
    fn __len__(&self) -> usize {
        let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        saved.retain(|(weak, _)| weak.strong_count() > 0);
        saved.len()
    }
}
