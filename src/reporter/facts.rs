//! Per-tensor facts: the few attribute reads on a tensor that a report needs, turned into a
//! plain `TensorFacts` record. Sparse tensors become one record per component.

use std::collections::HashMap;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use super::records::{StorageFacts, TensorFacts};

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

/// Reads tensor facts, caching the strings of dtypes (singletons in torch).
pub struct FactReader<'py> {
    handles: TorchHandles<'py>,
    dtype_names: HashMap<usize, String>,
}

impl<'py> FactReader<'py> {
    pub fn new(handles: TorchHandles<'py>) -> Self {
        Self {
            handles,
            dtype_names: HashMap::new(),
        }
    }

    pub fn handles(&self) -> &TorchHandles<'py> {
        &self.handles
    }

    /// Facts for `tensor` named `name`, appended to `out`. Never fails: what cannot be read
    /// is reported as unknown rather than aborting the whole report.
    pub fn read(&mut self, tensor: &Bound<'py, PyAny>, name: String, out: &mut Vec<TensorFacts>) {
        let py = tensor.py();
        let layout = tensor.getattr(intern!(py, "layout")).ok();
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
                if let Ok(part) = tensor.call_method0(*method) {
                    out.push(self.read_dense(&part, format!("{name}.{label}")));
                }
            }
        } else if let Some(inner) = wrapped_tensors(tensor) {
            // A wrapper subclass (NestedTensor, DTensor, ...) owns no memory itself: its
            // inner tensors do, and they are reported (and deduplicated) as its parts.
            for (label, part) in inner {
                self.read(&part, format!("{name}.{label}"), out);
            }
        } else {
            out.push(self.read_dense(tensor, name));
        }
    }

    fn read_dense(&mut self, tensor: &Bound<'py, PyAny>, name: String) -> TensorFacts {
        let py = tensor.py();
        let device = tensor
            .getattr(intern!(py, "device"))
            .and_then(|d| d.str().map(|s| s.to_string()))
            .unwrap_or_else(|_| "unknown".to_owned());
        let dtype = self.dtype_name(tensor);
        let shape = tensor.getattr(intern!(py, "shape")).ok();
        let dims: Option<Vec<i64>> = shape.as_ref().and_then(|s| s.extract().ok());
        let shape_text = match (&dims, &shape) {
            (Some(dims), _) => tuple_text(dims),
            // Symbolic sizes: Python's own str of the tuple, as pytorch_memlab prints it.
            (None, Some(shape)) => py
                .get_type::<PyTuple>()
                .call1((shape,))
                .and_then(|t| t.str().map(|s| s.to_string()))
                .unwrap_or_else(|_| "?".to_owned()),
            // A strided nested tensor has no single shape: say how many tensors it nests.
            (None, None) => tensor
                .call_method1(intern!(py, "size"), (0,))
                .and_then(|n| n.extract::<i64>())
                .map_or_else(|_| "?".to_owned(), |n| format!("nested({n})")),
        };
        let numel = match &dims {
            Some(dims) => dims.iter().product::<i64>().max(0) as u64,
            // Nested and symbolic tensors have no plain sizes; ask torch.
            None => tensor
                .call_method0(intern!(py, "numel"))
                .and_then(|n| n.extract::<u64>())
                .unwrap_or(0),
        };
        TensorFacts {
            name,
            device,
            dims,
            shape_text,
            dtype,
            numel,
            storage: storage_facts(tensor),
        }
    }

    fn dtype_name(&mut self, tensor: &Bound<'py, PyAny>) -> String {
        let Ok(dtype) = tensor.getattr(intern!(tensor.py(), "dtype")) else {
            return "unknown".to_owned();
        };
        let key = dtype.as_ptr() as usize;
        if let Some(name) = self.dtype_names.get(&key) {
            return name.clone();
        }
        let name = dtype
            .str()
            .map(|s| s.to_string())
            .unwrap_or_else(|_| "unknown".to_owned());
        self.dtype_names.insert(key, name.clone());
        name
    }
}

/// The inner tensors of a traceable wrapper subclass, from `__tensor_flatten__`; None for
/// tensors that hold their own storage.
fn wrapped_tensors<'py>(tensor: &Bound<'py, PyAny>) -> Option<Vec<(String, Bound<'py, PyAny>)>> {
    let py = tensor.py();
    let flatten = intern!(py, "__tensor_flatten__");
    if !tensor.get_type().hasattr(flatten).unwrap_or(false) {
        return None;
    }
    let (attrs, _context): (Vec<String>, Bound<'py, PyAny>) =
        tensor.call_method0(flatten).ok()?.extract().ok()?;
    let parts = attrs
        .into_iter()
        .filter_map(|attr| tensor.getattr(attr.as_str()).ok().map(|t| (attr, t)))
        .collect();
    Some(parts)
}

/// The storage behind a tensor, or None for tensors without one (wrapper subclasses).
fn storage_facts(tensor: &Bound<'_, PyAny>) -> Option<StorageFacts> {
    let py = tensor.py();
    let storage = tensor.call_method0(intern!(py, "untyped_storage")).ok()?;
    let key = storage
        .getattr(intern!(py, "_cdata"))
        .ok()?
        .extract()
        .ok()?;
    let nbytes = storage
        .call_method0(intern!(py, "nbytes"))
        .ok()?
        .extract()
        .ok()?;
    let data_ptr: usize = storage
        .call_method0(intern!(py, "data_ptr"))
        .and_then(|p| p.extract())
        .unwrap_or(0);
    Some(StorageFacts {
        key,
        nbytes,
        has_memory: data_ptr != 0,
    })
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
