//! The tensor report's collector, the gc walk: every tensor Python can reach, in a useful
//! order, with its name. It reads Python objects, hence its place in `py/`; what leaves it
//! is plain records (`TensorFacts`) and how the walk went (`WalkStats`).
//!
//! Order: the tensors the caller named (the model's parameters and buffers, optimizer
//! state), then every other tensor in gc order. Each parameter's `.grad` follows its
//! parameter, wherever gc happened to list it, so a grad is named after its parameter and
//! charged once.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;

use crate::gc_walk::facts::{FactReader, TensorFacts};
use crate::gc_walk::{self, Strategy};
use crate::tensor_report::result::Walk;

/// How a walk went: where the objects came from, whether it may have missed some, and
/// where the time went.
#[derive(Clone, Debug)]
pub struct WalkStats {
    pub strategy: Strategy,
    pub incomplete: Option<String>,
    pub tensors: usize,
    pub walk_seconds: f64,
    pub facts_seconds: f64,
}

impl WalkStats {
    /// What a report keeps of it (`incomplete` goes beside it).
    pub fn walk(&self) -> Walk {
        Walk {
            strategy: self.strategy.name().to_owned(),
            tensors: self.tensors as u64,
            walk_seconds: self.walk_seconds,
            facts_seconds: self.facts_seconds,
        }
    }
}

/// Walk gc and return facts for every reachable tensor. `named` holds (tensor, name) pairs
/// that take precedence over gc order and numbering. References taken here are dropped on
/// return: only plain records leave this function. `resume`: see `gc_walk::instances`.
pub fn collect_facts<'py>(
    py: Python<'py>,
    reader: &mut FactReader<'py>,
    named: Vec<(Bound<'py, PyAny>, String)>,
    pre_collect: bool,
    resume: bool,
) -> PyResult<(Vec<TensorFacts>, WalkStats)> {
    if pre_collect {
        py.import("gc")?.call_method0("collect")?;
    }
    let mut order: Vec<(Bound<'py, PyAny>, Option<String>)> = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    for (tensor, name) in named {
        if seen.insert(tensor.as_ptr() as usize) {
            order.push((tensor, Some(name)));
        }
    }
    // Tensors are found by their own type (a subtype of TensorBase), never through
    // `__class__`: weak proxies, dead or alive, and lazy modules are never touched.
    let base = reader.handles().tensor_base.as_type_ptr();
    // Objects we hold are alive and tracked: good places to start walking from.
    let held: Vec<*mut ffi::PyObject> = order.iter().map(|(t, _)| t.as_ptr()).collect();
    let started = Instant::now();
    let walk = gc_walk::instances(py, &held, base, resume)?;
    let walk_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    for tensor in walk.objects {
        if seen.insert(tensor.as_ptr() as usize) {
            order.push((tensor, None));
        }
    }

    // Which tensors are some leaf's grad, so that they are listed under that leaf.
    let mut grads: HashMap<usize, Bound<'py, PyAny>> = HashMap::new();
    let mut grad_ptrs: HashSet<usize> = HashSet::new();
    for (tensor, _) in &order {
        reader.check(py)?;
        if let Some(grad) = leaf_grad(reader, tensor)? {
            grad_ptrs.insert(grad.as_ptr() as usize);
            grads.insert(tensor.as_ptr() as usize, grad);
        }
    }

    let mut facts = Vec::with_capacity(order.len());
    let mut numbered = 0usize;
    for (tensor, name) in &order {
        let ptr = tensor.as_ptr() as usize;
        if grad_ptrs.contains(&ptr) && name.is_none() {
            continue; // listed under its parameter
        }
        let name = match name {
            Some(name) => name.clone(),
            None => {
                // Extracted, not `to_string()`: pyo3's Display swallows errors.
                let type_name: String = tensor.get_type().name()?.extract()?;
                numbered += 1;
                format!("{type_name}{}", numbered - 1)
            }
        };
        if let Some(grad) = grads.get(&ptr) {
            reader.read(tensor, name.clone(), &mut facts)?;
            reader.read(grad, format!("{name}.grad"), &mut facts)?;
        } else {
            reader.read(tensor, name, &mut facts)?;
        }
    }
    let stats = WalkStats {
        strategy: walk.strategy,
        incomplete: walk.incomplete,
        tensors: order.len(),
        walk_seconds,
        facts_seconds: started.elapsed().as_secs_f64(),
    };
    Ok((facts, stats))
}

/// `tensor.grad` for leaf tensors that have one. Non-leaf tensors are skipped: reading
/// their `.grad` makes torch warn. Err only for what interrupts the report.
fn leaf_grad<'py>(
    reader: &mut FactReader<'py>,
    tensor: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = tensor.py();
    let is_leaf = tensor
        .getattr(intern!(py, "is_leaf"))
        .and_then(|v| v.extract::<bool>());
    if reader.own(py, is_leaf)? != Some(true) {
        return Ok(None);
    }
    let grad = reader.own(py, tensor.getattr(intern!(py, "grad")))?;
    Ok(grad.filter(|grad| !grad.is_none()))
}
