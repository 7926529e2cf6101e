//! MemReporter's core: gc walk -> tensor facts -> deduplicated rows -> renderers.

pub mod py;
pub mod records;
pub mod render;
pub mod table;
pub mod walk;

use numpy::IntoPyArray;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::gc_walk;
use crate::gc_walk::facts::{FactReader, TorchHandles};
use crate::sources::driver;
use records::{CudaAccounting, DeviceSection};
use table::SortBy;

/// The result of one report: plain rows per device, no reference to any tensor.
///
/// Build one with `collect_report`, then render it with `text()`, `html()` or `json()`, or
/// read it with `columns()` and `sections()`.
#[pyclass(module = "memlab_rs._core", frozen)]
pub struct ReportTable {
    sections: Vec<DeviceSection>,
    stats: walk::WalkStats,
}

/// Walk gc and build a report of every tensor Python can reach.
///
/// `named` is a list of `(tensor, name)` pairs that take precedence over numbering
/// (parameters, buffers, optimizer state); each leaf's `.grad` is named `<name>.grad`.
///
/// >>> import torch
/// >>> from memlab_rs._core import collect_report
/// >>> w = torch.zeros(256, 1024)
/// >>> table = collect_report([(w, "w")], False)
/// >>> [r for r in table.sections() if r["device"] == "cpu"][0]["total_bytes"] >= 1 << 20
/// True
#[pyfunction]
#[pyo3(signature = (named, pre_collect=false))]
pub fn collect_report(
    py: Python<'_>,
    named: Vec<(Bound<'_, PyAny>, String)>,
    pre_collect: bool,
) -> PyResult<ReportTable> {
    let torch = py.import("torch")?;
    let mut reader = FactReader::new(TorchHandles::new(&torch)?);
    let (facts, stats) = walk::collect_facts(py, &mut reader, named, pre_collect, false)?;
    Ok(ReportTable {
        sections: table::build_sections(facts),
        stats,
    })
}

fn parse_sort(sort_by: Option<&str>) -> PyResult<SortBy> {
    match sort_by {
        None | Some("found") => Ok(SortBy::Found),
        Some("size") => Ok(SortBy::Size),
        Some("name") => Ok(SortBy::Name),
        Some(other) => Err(PyValueError::new_err(format!(
            "sort_by={other:?} is not a known order; use None (the order tensors were found), \
             \"size\" (largest first) or \"name\""
        ))),
    }
}

fn cuda_ordinal(device: &str) -> Option<i32> {
    device.strip_prefix("cuda:")?.parse().ok()
}

#[pymethods]
impl ReportTable {
    /// A copy with CUDA allocator figures attached to `device` (e.g. "cuda:0"); the driver's
    /// view of the device is added when available. Adds an empty section for a device that
    /// holds allocations but no visible tensor.
    #[pyo3(signature = (device, allocated, requested=None, reserved=None))]
    fn with_cuda(
        &self,
        device: &str,
        allocated: u64,
        requested: Option<u64>,
        reserved: Option<u64>,
    ) -> Self {
        let mut sections = self.sections.clone();
        let accounting = CudaAccounting {
            allocated,
            requested,
            reserved,
            driver_used_total: cuda_ordinal(device).and_then(driver::device_memory),
        };
        match sections.iter_mut().find(|s| s.device == device) {
            Some(section) => section.cuda = Some(accounting),
            None => sections.push(DeviceSection {
                cuda: Some(accounting),
                ..DeviceSection::empty(device)
            }),
        }
        Self {
            sections,
            stats: self.stats.clone(),
        }
    }

    /// A copy keeping the listed devices (all if None), rows ordered by `sort_by`
    /// (None, "size" or "name") and cut to the first `top` per device.
    #[pyo3(signature = (devices=None, sort_by=None, top=None))]
    fn view(
        &self,
        devices: Option<Vec<String>>,
        sort_by: Option<&str>,
        top: Option<usize>,
    ) -> PyResult<Self> {
        let order = parse_sort(sort_by)?;
        let mut sections: Vec<DeviceSection> = self
            .sections
            .iter()
            .filter(|s| devices.as_ref().is_none_or(|d| d.contains(&s.device)))
            .cloned()
            .collect();
        table::sort_and_cut(&mut sections, order, top);
        Ok(Self {
            sections,
            stats: self.stats.clone(),
        })
    }

    /// The table as plain data (a saved `tensor_report` result's `data`): `sections` with
    /// their rows, CUDA figures and omitted rows, `incomplete`, and `walk` (how it was found).
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        py::to_data(py, &self.sections, &self.stats)
    }

    /// The table `data()` returned, rebuilt: it renders exactly as the original.
    #[staticmethod]
    fn from_data(data: &Bound<'_, PyDict>) -> PyResult<Self> {
        let (sections, stats) = py::from_data(data)?;
        Ok(Self { sections, stats })
    }

    /// How the gc walk found the objects: the collector's lists (whole, or since the last
    /// walk), the interpreter's visitor, or `gc.get_objects()`.
    #[getter]
    fn walk_strategy(&self) -> &'static str {
        self.stats.strategy.name()
    }

    /// Where the report's time went: `walk_seconds` finding tensors among gc objects,
    /// `facts_seconds` reading them; `tensors` found.
    #[getter]
    fn walk_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("strategy", self.stats.strategy.name())?;
        d.set_item("tensors", self.stats.tensors)?;
        d.set_item("walk_seconds", self.stats.walk_seconds)?;
        d.set_item("facts_seconds", self.stats.facts_seconds)?;
        d.set_item("thread_limit", gc_walk::chains::thread_limit())?;
        d.set_item("incomplete", self.stats.incomplete.as_deref())?;
        Ok(d)
    }

    /// Why the report may miss tensors (None when it does not): a walk made during a
    /// garbage collection, or frozen objects that could not be searched.
    #[getter]
    fn incomplete(&self) -> Option<&str> {
        self.stats.incomplete.as_deref()
    }

    /// The device names, in report order.
    fn devices(&self) -> Vec<String> {
        self.sections.iter().map(|s| s.device.clone()).collect()
    }

    /// pytorch_memlab's text layout; `verbose` shows `name(->owner)` for shared storages.
    #[pyo3(signature = (verbose=false))]
    fn text(&self, verbose: bool) -> String {
        render::text::render(&self.sections, verbose, self.incomplete())
    }

    /// A self-contained HTML table per device.
    fn html(&self) -> String {
        render::html::render(&self.sections, self.incomplete())
    }

    /// The report as a JSON document.
    fn json(&self) -> String {
        render::json::render(&self.sections, self.incomplete())
    }

    /// Per-device totals as dicts.
    fn sections<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for s in &self.sections {
            let d = PyDict::new(py);
            d.set_item("device", &s.device)?;
            d.set_item("rows", s.rows.len())?;
            d.set_item("omitted_rows", s.omitted_rows)?;
            d.set_item("omitted_bytes", s.omitted_bytes)?;
            d.set_item("total_numel", s.total_numel)?;
            d.set_item("total_bytes", s.total_bytes)?;
            d.set_item("total_storage_bytes", s.total_storage_bytes)?;
            if let (Some(cuda), Some(rest)) = (s.cuda, s.remainder()) {
                d.set_item("allocated", cuda.allocated)?;
                d.set_item("requested", cuda.requested)?;
                d.set_item("reserved", cuda.reserved)?;
                d.set_item("unseen_tensors", rest.unseen_tensors)?;
                d.set_item("rounding", rest.rounding)?;
                d.set_item("driver_used_total", cuda.driver_used_total)?;
            }
            list.append(d)?;
        }
        Ok(list)
    }

    /// The rows as columns: lists for text, NumPy int64 arrays for numbers.
    fn columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let rows = self.sections.iter().flat_map(|s| s.rows.iter());
        let (mut name, mut device, mut shape, mut dtype, mut shared) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut numel, mut bytes, mut storage_bytes) = (vec![], vec![], vec![]);
        for r in rows {
            name.push(r.name.clone());
            device.push(r.device.clone());
            shape.push(match &r.dims {
                Some(dims) => PyTuple::new(py, dims)?.into_any(),
                None => r.shape_text.clone().into_pyobject(py)?.into_any(),
            });
            dtype.push(r.dtype.clone());
            shared.push(r.shared_with.clone());
            numel.push(r.numel as i64);
            bytes.push(r.bytes as i64);
            storage_bytes.push(r.storage_bytes as i64);
        }
        let d = PyDict::new(py);
        d.set_item("name", name)?;
        d.set_item("device", device)?;
        d.set_item("shape", shape)?;
        d.set_item("dtype", dtype)?;
        d.set_item("numel", numel.into_pyarray(py))?;
        d.set_item("bytes", bytes.into_pyarray(py))?;
        d.set_item("storage_bytes", storage_bytes.into_pyarray(py))?;
        d.set_item("shared_with", shared)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let rows: usize = self.sections.iter().map(|s| s.rows.len()).sum();
        format!("<ReportTable: {} rows on {:?}>", rows, self.devices())
    }
}
