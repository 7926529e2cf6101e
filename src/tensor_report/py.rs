//! The tensor report's sections as plain Python data, and back: what a saved
//! `tensor_report` result holds (docs/guide.md, *Saved results*). Rendering stays in
//! `crate::tensor_report::render`; this only moves the records across the boundary.

use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::gc_walk::Strategy;
use crate::tensor_report::records::{CudaAccounting, DeviceSection, Row};
use crate::tensor_report::walk::WalkStats;

/// `{"sections": [...], "incomplete": why or None, "walk": {...}}`: every field the
/// renderers read, so a table rebuilt by `from_data` renders byte for byte the same.
pub fn to_data<'py>(
    py: Python<'py>,
    sections: &[DeviceSection],
    stats: &WalkStats,
) -> PyResult<Bound<'py, PyDict>> {
    let list = PyList::empty(py);
    for s in sections {
        let d = PyDict::new(py);
        d.set_item("device", &s.device)?;
        d.set_item("total_numel", s.total_numel)?;
        d.set_item("total_bytes", s.total_bytes)?;
        d.set_item("total_storage_bytes", s.total_storage_bytes)?;
        d.set_item("omitted_rows", s.omitted_rows)?;
        d.set_item("omitted_bytes", s.omitted_bytes)?;
        match s.cuda {
            Some(c) => {
                let cuda = PyDict::new(py);
                cuda.set_item("allocated", c.allocated)?;
                cuda.set_item("requested", c.requested)?;
                cuda.set_item("reserved", c.reserved)?;
                cuda.set_item("driver_used", c.driver_used_total.map(|(used, _)| used))?;
                cuda.set_item("driver_total", c.driver_used_total.map(|(_, total)| total))?;
                d.set_item("cuda", cuda)?;
            }
            None => d.set_item("cuda", py.None())?,
        }
        let rows = PyList::empty(py);
        for r in &s.rows {
            let row = PyDict::new(py);
            row.set_item("name", &r.name)?;
            row.set_item("device", &r.device)?;
            row.set_item("shape", r.dims.as_ref())?;
            row.set_item("shape_text", &r.shape_text)?;
            row.set_item("dtype", &r.dtype)?;
            row.set_item("numel", r.numel)?;
            row.set_item("bytes", r.bytes)?;
            row.set_item("storage_bytes", r.storage_bytes)?;
            row.set_item("shared_with", r.shared_with.as_deref())?;
            rows.append(row)?;
        }
        d.set_item("rows", rows)?;
        list.append(d)?;
    }
    let walk = PyDict::new(py);
    walk.set_item("strategy", stats.strategy.name())?;
    walk.set_item("tensors", stats.tensors)?;
    walk.set_item("walk_seconds", stats.walk_seconds)?;
    walk.set_item("facts_seconds", stats.facts_seconds)?;
    let out = PyDict::new(py);
    out.set_item("sections", list)?;
    out.set_item("incomplete", stats.incomplete.as_deref())?;
    out.set_item("walk", walk)?;
    Ok(out)
}

/// The inverse of `to_data`; a `ValueError` naming the section, row and field otherwise.
pub fn from_data(data: &Bound<'_, PyDict>) -> PyResult<(Vec<DeviceSection>, WalkStats)> {
    let mut sections = Vec::new();
    let listed: Bound<'_, PyList> = get(data, "sections", "tensor report")?;
    for (i, item) in listed.iter().enumerate() {
        let at = format!("tensor report section {i}");
        let s = as_dict(&item, &at)?;
        let device: String = get(&s, "device", &at)?;
        let at = format!("{at} ({device})");
        let cuda: Option<Bound<'_, PyDict>> = get(&s, "cuda", &at)?;
        let cuda = match cuda {
            None => None,
            Some(c) => {
                let at = format!("{at}, \"cuda\"");
                let used: Option<u64> = get(&c, "driver_used", &at)?;
                let total: Option<u64> = get(&c, "driver_total", &at)?;
                Some(CudaAccounting {
                    allocated: get(&c, "allocated", &at)?,
                    requested: get(&c, "requested", &at)?,
                    reserved: get(&c, "reserved", &at)?,
                    driver_used_total: used.zip(total),
                })
            }
        };
        let mut rows = Vec::new();
        let listed_rows: Bound<'_, PyList> = get(&s, "rows", &at)?;
        for (j, item) in listed_rows.iter().enumerate() {
            let at = format!("{at}, row {j}");
            let r = as_dict(&item, &at)?;
            rows.push(Row {
                name: get(&r, "name", &at)?,
                device: get(&r, "device", &at)?,
                dims: get(&r, "shape", &at)?,
                shape_text: get(&r, "shape_text", &at)?,
                dtype: get(&r, "dtype", &at)?,
                numel: get(&r, "numel", &at)?,
                bytes: get(&r, "bytes", &at)?,
                storage_bytes: get(&r, "storage_bytes", &at)?,
                shared_with: get(&r, "shared_with", &at)?,
            });
        }
        sections.push(DeviceSection {
            device,
            rows,
            omitted_rows: get(&s, "omitted_rows", &at)?,
            omitted_bytes: get(&s, "omitted_bytes", &at)?,
            total_numel: get(&s, "total_numel", &at)?,
            total_bytes: get(&s, "total_bytes", &at)?,
            total_storage_bytes: get(&s, "total_storage_bytes", &at)?,
            cuda,
        });
    }
    let walk: Bound<'_, PyDict> = get(data, "walk", "tensor report")?;
    let name: String = get(&walk, "strategy", "tensor report walk")?;
    let strategy = Strategy::from_name(&name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "tensor report walk: unknown strategy {name:?} (a file from another memlab_rs?)"
        ))
    })?;
    let stats = WalkStats {
        strategy,
        incomplete: get(data, "incomplete", "tensor report")?,
        tensors: get(&walk, "tensors", "tensor report walk")?,
        walk_seconds: get(&walk, "walk_seconds", "tensor report walk")?,
        facts_seconds: get(&walk, "facts_seconds", "tensor report walk")?,
    };
    Ok((sections, stats))
}

fn as_dict<'py>(item: &Bound<'py, PyAny>, at: &str) -> PyResult<Bound<'py, PyDict>> {
    item.cast::<PyDict>().cloned().map_err(|_| {
        PyValueError::new_err(format!("{at}: expected an object, got {}", type_name(item)))
    })
}

/// `d[key]` as a `T`, or a `ValueError` saying where, which field and what was found.
fn get<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str, at: &str) -> PyResult<T> {
    let value = d
        .get_item(key)?
        .ok_or_else(|| PyValueError::new_err(format!("{at}: no {key:?} field")))?;
    value.extract::<T>().map_err(|_| {
        PyValueError::new_err(format!(
            "{at}: {key:?} has the wrong type ({}: {})",
            type_name(&value),
            short_repr(&value)
        ))
    })
}

/// `repr(value)`, cut to 60 characters: a damaged file may hold a whole list there.
fn short_repr(value: &Bound<'_, PyAny>) -> String {
    // Extracted, not `to_string()`: pyo3's Display swallows errors into stderr.
    let text = value
        .repr()
        .and_then(|r| r.extract::<String>())
        .unwrap_or_else(|_| "?".to_owned());
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}
