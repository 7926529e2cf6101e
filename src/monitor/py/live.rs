//! What the monitor reads at a boundary, in one Rust call each: parameter gradients over the
//! parameter list held once, and the saved storages still held (`saved.rs`), each storage
//! once, the known categories excluded. The parameter and buffer storages and the optimizer
//! state storages are given by the Python side when they change (rarely), so a boundary
//! reads only what can change every step: the gradients and the saved tensors.

use std::collections::HashSet;
use std::sync::Mutex;

use indexmap::IndexMap;
use pyo3::intern;
use pyo3::prelude::*;

use super::saved::{storage, SavedTensorHooks};
use crate::interrupts::Interruptible;

/// The monitor's known tensors on one device.
#[pyclass(module = "memlab_rs._core.monitor", name = "Tensors")]
pub struct MonitorTensors {
    device: i64,
    /// Distinct parameters, with the index of their row (one row per parameter storage).
    params: Vec<(Py<PyAny>, usize)>,
    rows: usize,
    /// Parameters on the monitored device (their gradients live there too).
    on_device: Vec<bool>,
    param_ptrs: HashSet<i64>,
    /// Parameter and buffer storages.
    model_ptrs: HashSet<i64>,
    state_ptrs: HashSet<i64>,
    /// Gradient storages on the device at the last `gradients()` (parameters' excluded).
    grad_ptrs: Mutex<HashSet<i64>>,
}

impl MonitorTensors {
    fn known(&self) -> HashSet<i64> {
        let grads = self.grad_ptrs.lock().unwrap_or_else(|e| e.into_inner());
        let mut known = self.model_ptrs.clone();
        known.extend(grads.iter().copied());
        known.extend(self.state_ptrs.iter().copied());
        known
    }
}

#[pymethods]
impl MonitorTensors {
    /// `device`: -1 for the CPU, else the CUDA index.
    #[new]
    fn new(device: i64) -> Self {
        Self {
            device,
            params: Vec::new(),
            rows: 0,
            on_device: Vec::new(),
            param_ptrs: HashSet::new(),
            model_ptrs: HashSet::new(),
            state_ptrs: HashSet::new(),
            grad_ptrs: Mutex::new(HashSet::new()),
        }
    }

    /// The parameters (each with its row index), the number of rows, and the parameter and
    /// buffer storages on the device.
    fn set_model(
        &mut self,
        py: Python<'_>,
        params: Vec<(Py<PyAny>, usize)>,
        rows: usize,
        param_ptrs: HashSet<i64>,
        buffer_ptrs: HashSet<i64>,
    ) -> PyResult<()> {
        let mut on_device = Vec::with_capacity(params.len());
        for (p, _) in &params {
            let d: i64 = p
                .bind(py)
                .call_method0(intern!(py, "get_device"))?
                .extract()?;
            on_device.push(d == self.device);
        }
        self.on_device = on_device;
        self.params = params;
        self.rows = rows;
        self.model_ptrs = param_ptrs.union(&buffer_ptrs).copied().collect();
        self.param_ptrs = param_ptrs;
        Ok(())
    }

    /// The optimizer state storages (parameters', buffers' and gradients' excluded).
    fn set_state(&mut self, ptrs: HashSet<i64>) {
        self.state_ptrs = ptrs;
    }

    /// Parameter gradients now: (bytes of the distinct gradient storages on the device,
    /// parameters' storages excluded; each row's gradient bytes, any device). Raises only
    /// what interrupts it (a signal handler's exception: see `interrupts`).
    fn gradients(&self, py: Python<'_>) -> PyResult<(i64, Vec<i64>)> {
        let mut per_row = vec![0i64; self.rows];
        let mut row_seen: HashSet<(usize, i64)> = HashSet::new();
        let mut on_device: HashSet<i64> = HashSet::new();
        let mut total = 0;
        let mut interrupts = Interruptible::new();
        for ((p, row), &here) in self.params.iter().zip(&self.on_device) {
            interrupts.check(py)?;
            let grad = p.bind(py).getattr(intern!(py, "grad"));
            let Some(g) = interrupts.item(py, grad)? else {
                continue;
            };
            if g.is_none() {
                continue;
            }
            // A gradient without a storage of its own (sparse, subclass) is skipped.
            let Some((ptr, nbytes)) = storage(py, &g, &mut interrupts)? else {
                continue;
            };
            if row_seen.insert((*row, ptr)) {
                per_row[*row] += nbytes;
            }
            // A gradient lives on its parameter's device (autograd enforces it).
            if here && ptr != 0 && !self.param_ptrs.contains(&ptr) && on_device.insert(ptr) {
                total += nbytes;
            }
        }
        *self.grad_ptrs.lock().unwrap_or_else(|e| e.into_inner()) = on_device;
        Ok((total, per_row))
    }

    /// Parameter, buffer and gradient storages (as of the last `gradients()`).
    fn known_storages(&self) -> HashSet<i64> {
        let grads = self.grad_ptrs.lock().unwrap_or_else(|e| e.into_inner());
        self.model_ptrs.union(&grads).copied().collect()
    }

    /// Bytes of the distinct saved storages still held, known categories excluded.
    fn activations(&self, py: Python<'_>, hooks: &SavedTensorHooks) -> PyResult<i64> {
        Ok(hooks.held_bytes(py, self.device, &self.known())?.0)
    }

    /// The same bytes by the module that saved each storage first, in first-seen order
    /// (`outside` labels those saved outside the model's modules).
    fn activations_by_module(
        &self,
        py: Python<'_>,
        hooks: &SavedTensorHooks,
        outside: &str,
    ) -> PyResult<Vec<(String, i64)>> {
        let (_, groups) = hooks.held_bytes(py, self.device, &self.known())?;
        let mut out: IndexMap<String, i64> = IndexMap::new();
        for (module, nbytes) in groups {
            let name = match module {
                Some(m) => m.bind(py).extract::<String>()?,
                None => outside.to_string(),
            };
            *out.entry(name).or_insert(0) += nbytes;
        }
        Ok(out.into_iter().collect())
    }
}

/// The identities of an optimizer's state values (`optimizer.state`: a dict of dicts), in
/// order: a cheap key, read at every record, that changes when a state tensor is replaced.
#[pyfunction]
pub fn state_ids(state: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let mut ids = Vec::new();
    for per_param in state
        .call_method0(intern!(state.py(), "values"))?
        .try_iter()?
    {
        let per_param = per_param?;
        let values = per_param.call_method0(intern!(state.py(), "values"))?;
        for value in values.try_iter()? {
            ids.push(value?.as_ptr() as usize);
        }
    }
    Ok(ids)
}

/// Each tensor's `data_ptr()` (a cheap key: it changes when a storage is replaced).
#[pyfunction]
pub fn data_ptrs(py: Python<'_>, tensors: Vec<Bound<'_, PyAny>>) -> PyResult<Vec<i64>> {
    tensors
        .iter()
        .map(|t| t.call_method0(intern!(py, "data_ptr"))?.extract())
        .collect()
}
