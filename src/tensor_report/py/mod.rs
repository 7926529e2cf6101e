//! The tensor report's Python face, `_core.tensor_report` (and `_core.merged_tensor_report`,
//! `merged.rs`): the collector's entry point (`collect`), the analyses over a report's JSON
//! text (`with_cuda`, `view`, `sections`, `diff`), and the report checked (`validate`) and
//! rendered (`render`, `diff_text`). A report crosses as the JSON its derive writes, once
//! each way per call; nothing here builds Python data field by field.

mod collect;
mod merged;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde::Deserialize;

use super::analyse::{self, SortBy};
use super::diff as tensor_diff;
use super::render::{diff as diff_render, html, json, text};
use super::result::{CudaAccounting, FreeInReserved, TensorReport};
use crate::allocator::fragmentation;
use crate::gc_walk::facts::{FactReader, TorchHandles};
use crate::results::py::{no_view, submodule};
use crate::results::{from_json, to_json};
use crate::sources::driver;

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let m = submodule(
        parent,
        "tensor_report",
        "The tensor report (MemReporter): the gc walk, and the report checked, viewed, \
         compared and rendered from its JSON text.",
    )?;
    m.add_function(wrap_pyfunction!(collect_report, &m)?)?;
    m.add_function(wrap_pyfunction!(with_cuda, &m)?)?;
    m.add_function(wrap_pyfunction!(view, &m)?)?;
    m.add_function(wrap_pyfunction!(validate, &m)?)?;
    m.add_function(wrap_pyfunction!(render, &m)?)?;
    m.add_function(wrap_pyfunction!(sections, &m)?)?;
    m.add_function(wrap_pyfunction!(diff, &m)?)?;
    m.add_function(wrap_pyfunction!(diff_text, &m)?)?;
    merged::register(parent)
}

/// Walk gc and report every tensor Python can reach: the report's JSON (every device, no
/// view, not verbose) and the CUDA devices it found tensors on.
///
/// `named` is a list of `(tensor, name)` pairs that take precedence over numbering
/// (parameters, buffers, optimizer state); each leaf's `.grad` is named `<name>.grad`.
/// No reference to a tensor outlives the call.
///
/// >>> import json, torch
/// >>> from memlab_rs._core import tensor_report
/// >>> w = torch.zeros(256, 1024)
/// >>> data, cuda = tensor_report.collect([(w, "w")], False)
/// >>> [r["bytes"] for s in json.loads(data)["sections"] for r in s["rows"] if r["name"] == "w"]
/// [1048576]
#[pyfunction]
#[pyo3(name = "collect", signature = (named, pre_collect=false))]
fn collect_report(
    py: Python<'_>,
    named: Vec<(Bound<'_, PyAny>, String)>,
    pre_collect: bool,
) -> PyResult<(String, Vec<String>)> {
    let torch = py.import("torch")?;
    let mut reader = FactReader::new(TorchHandles::new(&torch)?);
    let (facts, stats) = collect::collect_facts(py, &mut reader, named, pre_collect, false)?;
    let report = TensorReport {
        verbose: false,
        sections: analyse::build_sections(facts),
        incomplete: stats.incomplete.clone(),
        walk: stats.walk(),
    };
    Ok((to_json(&report), analyse::cuda_devices(&report)))
}

fn cuda_ordinal(device: &str) -> Option<i32> {
    device.strip_prefix("cuda:")?.parse().ok()
}

/// One CUDA device's figures: (device, allocated, requested, reserved, allocator state).
type Figures = (String, u64, Option<u64>, Option<u64>, Option<String>);

/// The report with the CUDA allocator's figures attached: `figures` lists `(device,
/// allocated, requested, reserved, segments)`, `requested` and `reserved` None where torch
/// has no such figure, `segments` the allocator's state as the fragmentation floor reads it
/// (JSON; None when it could not be read); the driver's view of each device is added when
/// it can be read. A device that holds allocations but no visible tensor gets a section of
/// its own.
#[pyfunction]
fn with_cuda(data: &str, figures: Vec<Figures>) -> PyResult<String> {
    let mut report: TensorReport = from_json(data)?;
    for (device, allocated, requested, reserved, segments) in figures {
        let driver = cuda_ordinal(&device).and_then(driver::device_memory);
        let free_in_reserved = match segments {
            Some(state) => Some(free_in_reserved(&state)?),
            None => None,
        };
        let accounting = CudaAccounting {
            allocated,
            requested,
            reserved,
            driver_used: driver.map(|(used, _)| used),
            driver_total: driver.map(|(_, total)| total),
            free_in_reserved,
            paused_in_regions: cuda_ordinal(&device)
                .map(crate::sources::paused::paused_bytes)
                .filter(|&bytes| bytes > 0),
        };
        analyse::with_cuda(&mut report, &device, accounting);
    }
    Ok(to_json(&report))
}

/// The reserved but unallocated bytes in brief, from the fragmentation floor's analysis of
/// the allocator's state (JSON).
fn free_in_reserved(state: &str) -> PyResult<FreeInReserved> {
    let input: fragmentation::Input = from_json(state)?;
    let f = fragmentation::analyse(&input).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(FreeInReserved {
        free_bytes: f.free_bytes,
        largest_free: f.largest_free.map_or(0, |b| b.size),
        inactive_split_bytes: f.inactive_split_bytes,
        segments: f.segments.len() as u64,
        expandable_reclaimable_bytes: f.expandable.reclaimable_bytes,
    })
}

/// The report keeping the listed devices (all if None), rows ordered by `sort_by` (None,
/// "size" or "name") and cut to the first `top` per device, its text `verbose` or not.
#[pyfunction]
#[pyo3(signature = (data, devices=None, sort_by=None, top=None, verbose=false))]
fn view(
    data: &str,
    devices: Option<Vec<String>>,
    sort_by: Option<&str>,
    top: Option<usize>,
    verbose: bool,
) -> PyResult<String> {
    let order = SortBy::parse(sort_by).map_err(PyValueError::new_err)?;
    let mut report: TensorReport = from_json(data)?;
    analyse::view(&mut report, devices.as_deref(), order, top);
    report.verbose = verbose;
    Ok(to_json(&report))
}

/// A `tensor_report` result's data as its derive reads it (a ValueError naming the field
/// that does not fit), in canonical form.
#[pyfunction]
fn validate(data: &str) -> PyResult<String> {
    Ok(to_json(&from_json::<TensorReport>(data)?))
}

/// The text's view: `verbose` overrides the report's own.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TextView {
    verbose: Option<bool>,
}

/// The report as `text` (pytorch_memlab's table; the view may say `verbose`), `html` or
/// `json` (neither takes a view).
#[pyfunction]
fn render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let report: TensorReport = from_json(data)?;
    match format {
        "text" => {
            let options: TextView = from_json(view)?;
            Ok(text::render(
                &report,
                options.verbose.unwrap_or(report.verbose),
            ))
        }
        "html" => {
            no_view(view, "a tensor_report's HTML")?;
            Ok(html::render(&report))
        }
        "json" => {
            no_view(view, "a tensor_report's JSON")?;
            Ok(json::render(&report))
        }
        other => Err(PyValueError::new_err(format!(
            "format={other:?}: a tensor_report result renders as text, html or json"
        ))),
    }
}

/// Per-device totals as a JSON list: rows listed and left out, bytes, numel, and on CUDA
/// the allocator's figures with the remainder split into `unseen_tensors` and `rounding`.
#[pyfunction]
fn sections(data: &str) -> PyResult<String> {
    let report: TensorReport = from_json(data)?;
    Ok(to_json(&analyse::totals(&report)))
}

/// What changed from report `a` to report `b` (their JSON): `{"rows": [...], "totals":
/// [...]}`, tensors by name and device (unnamed ones by device, shape and dtype).
#[pyfunction]
fn diff(a: &str, b: &str) -> PyResult<String> {
    let a: TensorReport = from_json(a)?;
    let b: TensorReport = from_json(b)?;
    Ok(to_json(&tensor_diff::diff(&a, &b)))
}

/// A tensor diff's text, from `{"names": [A, B], "rows": [...], "totals": [...]}`.
#[pyfunction]
fn diff_text(diff: &str) -> PyResult<String> {
    let doc: diff_render::DiffDoc = from_json(diff)?;
    Ok(diff_render::text(&doc))
}
