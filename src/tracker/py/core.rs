//! The tensor diff tracker's collector, `TrackerCore`: the shared gc walk (resuming from the
//! last walk, so a call costs what changed) and the tensors' facts, read from Python objects
//! (hence its place in `py/`); then `diff` and a `Track` result, which crosses to Python as
//! its JSON. It keeps plain group counts between calls, never a tensor.

use std::collections::HashMap;
use std::time::Instant;

use indexmap::IndexMap;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::allocator::caching::allocated_bytes;
use crate::gc_walk;
use crate::gc_walk::facts::{FactReader, TorchHandles};
use crate::results::to_json;
use crate::tracker::diff::{self, Group, GroupKey, Seen, Storage};
use crate::tracker::render::text as tracker_text;
use crate::tracker::result::{Row, Track};

/// What `track` keeps between calls: the groups of the last call, and how the walk went.
#[pyclass(module = "memlab_rs._core.tracker")]
pub struct TrackerCore {
    device: String,
    last: HashMap<GroupKey, Group>,
}

#[pymethods]
impl TrackerCore {
    /// A tracker of the tensors on `device` ("cpu", "cuda:0", ...).
    #[new]
    fn new(device: String) -> PyResult<Self> {
        if device.is_empty() {
            return Err(PyValueError::new_err(
                "device must name a device, e.g. \"cuda:0\" or \"cpu\"",
            ));
        }
        Ok(Self {
            device,
            last: HashMap::new(),
        })
    }

    /// Walk, group, diff against the last call: the `tracker` result's JSON (each row's
    /// `bytes` the allocator's, CUDA's 512-byte blocks; `storage_bytes` the storages' own,
    /// what the log prints). `named`:
    /// (tensor, name) pairs from the model, listed first; `place`, `detail` and `stamp` as
    /// the result keeps them; `allocated` the allocator's bytes (None on the CPU: the
    /// tensors' total).
    #[pyo3(signature = (named, place, detail, stamp=None, allocated=None))]
    fn track<'py>(
        &mut self,
        py: Python<'py>,
        named: Vec<(Bound<'py, PyAny>, String)>,
        place: String,
        detail: bool,
        stamp: Option<String>,
        allocated: Option<u64>,
    ) -> PyResult<String> {
        let torch = py.import("torch")?;
        let mut reader = FactReader::new(TorchHandles::new(&torch)?);
        let base = reader.handles().tensor_base.as_type_ptr();
        let held: Vec<*mut pyo3::ffi::PyObject> = named.iter().map(|(t, _)| t.as_ptr()).collect();
        let started = Instant::now();
        let walk = gc_walk::instances(py, &held, base, true)?;
        let walk_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let mut names: HashMap<usize, String> = HashMap::new();
        let mut order: Vec<Bound<'py, PyAny>> = Vec::with_capacity(walk.objects.len());
        for (tensor, name) in named {
            if names.insert(tensor.as_ptr() as usize, name).is_none() {
                order.push(tensor);
            }
        }
        for tensor in walk.objects {
            if !names.contains_key(&(tensor.as_ptr() as usize)) {
                order.push(tensor);
            }
        }
        let mut kinds: HashMap<usize, String> = HashMap::new();
        let mut seen: Vec<Seen> = Vec::with_capacity(order.len());
        let mut facts = Vec::new();
        let mut listed = std::collections::HashSet::new();
        for tensor in &order {
            if !listed.insert(tensor.as_ptr() as usize) {
                continue;
            }
            let kind_ptr = tensor.get_type().as_ptr() as usize;
            let kind = match kinds.get(&kind_ptr) {
                Some(k) => k.clone(),
                None => {
                    // Extracted, not `to_string()`: pyo3's Display swallows errors.
                    let k = crate::interrupts::text(tensor.get_type().as_any())?;
                    kinds.insert(kind_ptr, k.clone());
                    k
                }
            };
            let name = names.get(&(tensor.as_ptr() as usize)).cloned();
            facts.clear();
            reader.read(tensor, String::new(), &mut facts)?;
            let Some(first) = facts.first() else { continue };
            if first.device != self.device {
                continue;
            }
            // A sparse or wrapper tensor's parts all count towards it.
            let storages: Vec<Storage> = facts
                .iter()
                .filter_map(|f| {
                    f.storage.filter(|s| s.has_memory).map(|s| Storage {
                        key: s.key,
                        nbytes: s.nbytes,
                        blocks: allocated_bytes(&self.device, s.nbytes),
                    })
                })
                .collect();
            if storages.is_empty() {
                seen.push(Seen {
                    kind: kind.clone(),
                    shape: first.shape_text.clone(),
                    dtype: first.dtype.clone(),
                    name: name.clone(),
                    storage: None,
                });
            }
            for (i, storage) in storages.into_iter().enumerate() {
                // Only the first part is the tensor; the others add their bytes to its group.
                seen.push(Seen {
                    kind: kind.clone(),
                    shape: first.shape_text.clone(),
                    dtype: first.dtype.clone(),
                    name: if i == 0 { name.clone() } else { None },
                    storage: Some(storage),
                });
            }
        }
        drop(order);
        let (groups, total) = diff::group(&seen);
        let rows = diff::diff(&self.last, &groups);
        let tensors: u64 = groups.values().map(|g| g.count).sum();
        self.last = groups;
        let facts_s = started.elapsed().as_secs_f64();

        let rows = rows
            .into_iter()
            .map(|row| {
                let line = tracker_text::row_line(&row).trim_end().to_owned();
                Row::new(row, line)
            })
            .collect();
        let track = Track {
            rows,
            total_bytes: total.bytes,
            total_storage_bytes: total.storage_bytes,
            allocated_bytes: allocated.unwrap_or(total.bytes),
            tensors,
            place,
            strategy: walk.strategy.name().to_owned(),
            incomplete: walk.incomplete,
            seconds: IndexMap::from([("walk".to_owned(), walk_s), ("facts".to_owned(), facts_s)]),
            detail,
            stamp,
        };
        Ok(to_json(&track))
    }

    /// Forget the last call's groups: the next call lists every tensor as new.
    fn reset(&mut self) {
        self.last.clear();
    }
}
