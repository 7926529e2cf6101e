//! Per-tensor facts: the few attribute reads on a tensor that a report needs, turned into a
//! plain `TensorFacts` record. Sparse tensors become one record per component.

use std::collections::HashMap;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use crate::interrupts::{text, Interruptible};

/// One storage, identified by the address of its C++ `StorageImpl` (`_cdata`), which is
/// unique while the storage lives, unlike `data_ptr()` (0 for every empty storage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageFacts {
    pub key: usize,
    pub nbytes: u64,
    /// False for storages without real memory: meta and fake tensors (data_ptr 0).
    pub has_memory: bool,
}

/// What the collector learned about one tensor (or one part of a sparse tensor).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorFacts {
    pub name: String,
    pub device: String,
    /// Concrete sizes; None when a size is symbolic (then `shape_text` holds its str).
    pub dims: Option<Vec<i64>>,
    pub shape_text: String,
    pub dtype: String,
    pub numel: u64,
    /// None when the tensor has no storage of its own (a wrapper subclass).
    pub storage: Option<StorageFacts>,
}

/// The torch objects the collector compares against, looked up once per report.
pub struct TorchHandles<'py> {
    pub tensor_base: Bound<'py, PyType>,
    pub strided: Bound<'py, PyAny>,
    pub sparse_coo: Bound<'py, PyAny>,
    /// CSR and BSR: compressed rows.
    pub compressed_rows: Vec<Bound<'py, PyAny>>,
    /// CSC and BSC: compressed columns.
    pub compressed_cols: Vec<Bound<'py, PyAny>>,
}

impl<'py> TorchHandles<'py> {
    pub fn new(torch: &Bound<'py, PyModule>) -> PyResult<Self> {
        let c = torch.getattr("_C")?;
        // Renamed from `_TensorBase` in torch 2.2; both spell the base of every tensor.
        let base = match c.getattr("TensorBase") {
            Ok(base) => base,
            Err(_) => c.getattr("_TensorBase")?,
        };
        let layout = |name: &str| torch.getattr(name);
        Ok(Self {
            tensor_base: base.cast_into::<PyType>()?,
            strided: layout("strided")?,
            sparse_coo: layout("sparse_coo")?,
            compressed_rows: vec![layout("sparse_csr")?, layout("sparse_bsr")?],
            compressed_cols: vec![layout("sparse_csc")?, layout("sparse_bsc")?],
        })
    }
}

/// A wrapper tensor's inner tensors, each with its attribute name.
type Parts<'py> = Vec<(String, Bound<'py, PyAny>)>;

/// Reads tensor facts, caching the strings of dtypes (singletons in torch).
pub struct FactReader<'py> {
    handles: TorchHandles<'py>,
    dtype_names: HashMap<usize, String>,
    /// Which errors are a tensor's own and which interrupt the walk (see `interrupts`).
    interrupts: Interruptible,
}

impl<'py> FactReader<'py> {
    pub fn new(handles: TorchHandles<'py>) -> Self {
        Self {
            handles,
            dtype_names: HashMap::new(),
            interrupts: Interruptible::new(),
        }
    }

    pub fn handles(&self) -> &TorchHandles<'py> {
        &self.handles
    }

    /// Between two tensors: run the handlers of signals that arrived meanwhile (their
    /// exception ends the report, see `interrupts`).
    pub fn check(&self, py: Python<'py>) -> PyResult<()> {
        self.interrupts.check(py)
    }

    /// The value of one read of a tensor; None when the tensor cannot answer (it is
    /// reported as unknown); Err when the error interrupts the report (a signal handler's
    /// exception, KeyboardInterrupt: see `interrupts`).
    pub fn own<T>(&mut self, py: Python<'py>, read: PyResult<T>) -> PyResult<Option<T>> {
        self.interrupts.item(py, read)
    }

    /// Facts for `tensor` named `name`, appended to `out`. What the tensor cannot say is
    /// reported as unknown rather than aborting the whole report; Err only for what
    /// interrupts it (checked first, between tensors: signals that arrived meanwhile).
    pub fn read(
        &mut self,
        tensor: &Bound<'py, PyAny>,
        name: String,
        out: &mut Vec<TensorFacts>,
    ) -> PyResult<()> {
        let py = tensor.py();
        self.interrupts.check(py)?;
        let layout = self.own(py, tensor.getattr(intern!(py, "layout")))?;
        let parts: &[(&str, &str)] = match layout {
            Some(l) if l.is(&self.handles.strided) => &[],
            Some(l) if l.is(&self.handles.sparse_coo) => {
                &[("indices", "_indices"), ("values", "_values")]
            }
            Some(l) if self.handles.compressed_rows.iter().any(|r| l.is(r)) => &[
                ("crow_indices", "crow_indices"),
                ("col_indices", "col_indices"),
                ("values", "values"),
            ],
            Some(l) if self.handles.compressed_cols.iter().any(|c| l.is(c)) => &[
                ("ccol_indices", "ccol_indices"),
                ("row_indices", "row_indices"),
                ("values", "values"),
            ],
            _ => &[],
        };
        if !parts.is_empty() {
            for (label, method) in parts {
                if let Some(part) = self.own(py, tensor.call_method0(*method))? {
                    let facts = self.read_dense(&part, format!("{name}.{label}"))?;
                    out.push(facts);
                }
            }
        } else if let Some(inner) = self.wrapped_tensors(tensor)? {
            // A wrapper subclass (NestedTensor, DTensor, ...) owns no memory itself: its
            // inner tensors do, and they are reported (and deduplicated) as its parts.
            for (label, part) in inner {
                self.read(&part, format!("{name}.{label}"), out)?;
            }
        } else {
            let facts = self.read_dense(tensor, name)?;
            out.push(facts);
        }
        Ok(())
    }

    fn read_dense(&mut self, tensor: &Bound<'py, PyAny>, name: String) -> PyResult<TensorFacts> {
        let py = tensor.py();
        let device = self
            .own(
                py,
                tensor.getattr(intern!(py, "device")).and_then(|d| text(&d)),
            )?
            .unwrap_or_else(|| "unknown".to_owned());
        let dtype = self.dtype_name(tensor)?;
        let shape = self.own(py, tensor.getattr(intern!(py, "shape")))?;
        let dims: Option<Vec<i64>> = match &shape {
            Some(shape) => self.own(py, shape.extract())?,
            None => None,
        };
        let shape_text = match (&dims, &shape) {
            (Some(dims), _) => tuple_text(dims),
            // Symbolic sizes: Python's own str of the tuple, as pytorch_memlab prints it.
            (None, Some(shape)) => {
                let as_tuple = py.get_type::<PyTuple>().call1((shape,));
                self.own(py, as_tuple.and_then(|t| text(&t)))?
                    .unwrap_or_else(|| "?".to_owned())
            }
            // A strided nested tensor has no single shape: say how many tensors it nests.
            (None, None) => {
                let size = tensor.call_method1(intern!(py, "size"), (0,));
                self.own(py, size.and_then(|n| n.extract::<i64>()))?
                    .map_or_else(|| "?".to_owned(), |n| format!("nested({n})"))
            }
        };
        let numel = match &dims {
            Some(dims) => dims.iter().product::<i64>().max(0) as u64,
            // Nested and symbolic tensors have no plain sizes; ask torch.
            None => {
                let numel = tensor.call_method0(intern!(py, "numel"));
                self.own(py, numel.and_then(|n| n.extract::<u64>()))?
                    .unwrap_or(0)
            }
        };
        let storage = self.storage_facts(tensor)?;
        Ok(TensorFacts {
            name,
            device,
            dims,
            shape_text,
            dtype,
            numel,
            storage,
        })
    }

    fn dtype_name(&mut self, tensor: &Bound<'py, PyAny>) -> PyResult<String> {
        let py = tensor.py();
        let Some(dtype) = self.own(py, tensor.getattr(intern!(py, "dtype")))? else {
            return Ok("unknown".to_owned());
        };
        let key = dtype.as_ptr() as usize;
        if let Some(name) = self.dtype_names.get(&key) {
            return Ok(name.clone());
        }
        let name = self
            .own(py, text(&dtype))?
            .unwrap_or_else(|| "unknown".to_owned());
        self.dtype_names.insert(key, name.clone());
        Ok(name)
    }

    /// The inner tensors of a traceable wrapper subclass, from `__tensor_flatten__`; None
    /// for tensors that hold their own storage.
    fn wrapped_tensors(&mut self, tensor: &Bound<'py, PyAny>) -> PyResult<Option<Parts<'py>>> {
        let py = tensor.py();
        let flatten = intern!(py, "__tensor_flatten__");
        if self.own(py, tensor.get_type().hasattr(flatten))? != Some(true) {
            return Ok(None);
        }
        let flattened = tensor
            .call_method0(flatten)
            .and_then(|f| f.extract::<(Vec<String>, Bound<'py, PyAny>)>());
        let Some((attrs, _context)) = self.own(py, flattened)? else {
            return Ok(None);
        };
        let mut parts = Vec::with_capacity(attrs.len());
        for attr in attrs {
            if let Some(part) = self.own(py, tensor.getattr(attr.as_str()))? {
                parts.push((attr, part));
            }
        }
        Ok(Some(parts))
    }

    /// The storage behind a tensor, or None for tensors without one (wrapper subclasses).
    fn storage_facts(&mut self, tensor: &Bound<'py, PyAny>) -> PyResult<Option<StorageFacts>> {
        let py = tensor.py();
        let read = || -> PyResult<(usize, u64, Bound<'py, PyAny>)> {
            let storage = tensor.call_method0(intern!(py, "untyped_storage"))?;
            let key = storage.getattr(intern!(py, "_cdata"))?.extract()?;
            let nbytes = storage.call_method0(intern!(py, "nbytes"))?.extract()?;
            Ok((key, nbytes, storage))
        };
        let Some((key, nbytes, storage)) = self.own(py, read())? else {
            return Ok(None);
        };
        let data_ptr = storage
            .call_method0(intern!(py, "data_ptr"))
            .and_then(|p| p.extract::<usize>());
        let data_ptr = self.own(py, data_ptr)?.unwrap_or(0);
        Ok(Some(StorageFacts {
            key,
            nbytes,
            has_memory: data_ptr != 0,
        }))
    }
}

/// Python's `str(tuple(sizes))`, with pytorch_memlab's `(1,)` for a scalar.
pub fn tuple_text(dims: &[i64]) -> String {
    match dims {
        [] => "(1,)".to_owned(),
        [one] => format!("({one},)"),
        many => {
            let inner: Vec<String> = many.iter().map(|d| d.to_string()).collect();
            format!("({})", inner.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tuple_text;

    #[test]
    fn shapes_print_like_python_tuples() {
        assert_eq!(tuple_text(&[]), "(1,)");
        assert_eq!(tuple_text(&[7]), "(7,)");
        assert_eq!(tuple_text(&[512, 1024]), "(512, 1024)");
    }
}
