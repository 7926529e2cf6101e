//! The Python face of the analysis: `_core.TraceAnalysis(snapshot, exclude)` reads a snapshot
//! dict, analyses it once, and answers questions about the result. `memlab_rs.trace` wraps it.
//! `_trace_timeline_html` draws the offline timeline from the dict `TraceResult.timeline(device)`
//! returns.

use pyo3::exceptions::{PyFileNotFoundError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::group::{by_keyword, by_line, Locator, Row};
use super::load::from_snapshot;
use super::model::Source;
use super::paths::Paths;
use super::pickle_guard::{check_file, Refusal};
use super::pickle_stream::from_pickle;
use super::render::timeline::{check, timeline_html, TimelineView};
use super::render::{data as trace_data, html as trace_html, text as trace_text};
use super::report::{analyse, DeviceReport, Report};

#[pyclass(module = "memlab_rs._core", frozen)]
pub struct TraceAnalysis {
    report: Report,
}

type RowTuple = (String, u64, u64, u64, u64);

fn tuples(rows: &[Row]) -> Vec<RowTuple> {
    rows.iter()
        .map(|r| (r.key.clone(), r.bytes, r.cumulative, r.median, r.count))
        .collect()
}

impl TraceAnalysis {
    fn device(&self, device: i32) -> PyResult<&DeviceReport> {
        self.report.find(device).ok_or_else(|| {
            let have: Vec<i32> = self.report.devices.iter().map(|d| d.device).collect();
            PyValueError::new_err(format!(
                "device {device} has no recorded allocations; the trace has devices {have:?}"
            ))
        })
    }
}

#[pymethods]
impl TraceAnalysis {
    /// Analyse `snapshot` (a dict in torch's `_snapshot()` schema). `exclude`: path prefixes
    /// whose frames are not a location (torch, the standard library, memlab_rs).
    /// `full_paths`: show files as recorded; else shortened (`paths`), relative to `cwd`
    /// unless the recording saved its own working directory.
    #[new]
    #[pyo3(signature = (snapshot, exclude, full_paths=false, cwd=None))]
    fn new(
        py: Python<'_>,
        snapshot: &Bound<'_, PyAny>,
        exclude: Vec<String>,
        full_paths: bool,
        cwd: Option<String>,
    ) -> PyResult<Self> {
        let trace = from_snapshot(py, snapshot)?;
        let locator = locator(exclude, full_paths, cwd);
        let report = py.detach(move || analyse(trace, &locator));
        Ok(TraceAnalysis { report })
    }

    /// Analyse the snapshot pickle at `path` without building its Python objects (a
    /// streaming reader: memory stays near the size of the compact records). The file
    /// passes `check_snapshot_pickle` first (a ValueError says why not). Raises
    /// `NotImplementedError` for a checked pickle it does not read (protocols 0-1, plain
    /// data laid out unlike a snapshot): the plain-data unpickler reads those.
    #[staticmethod]
    #[pyo3(signature = (path, exclude, full_paths=false, cwd=None))]
    fn from_pickle(
        py: Python<'_>,
        path: String,
        exclude: Vec<String>,
        full_paths: bool,
        cwd: Option<String>,
    ) -> PyResult<Self> {
        let locator = locator(exclude, full_paths, cwd);
        let report = py.detach(move || from_pickle(&path).map(|trace| analyse(trace, &locator)))?;
        Ok(TraceAnalysis { report })
    }

    /// "cuda" or "cpu".
    #[getter]
    fn source(&self) -> &'static str {
        match self.report.trace.source {
            Source::Cuda => "cuda",
            Source::Cpu => "cpu",
        }
    }

    /// The devices with recorded allocations.
    #[getter]
    fn devices(&self) -> Vec<i32> {
        self.report.devices.iter().map(|d| d.device).collect()
    }

    fn device_name(&self, device: i32) -> String {
        self.report.device_name(device)
    }

    /// Why the result may be incomplete: the whole trace's notices, then the device's.
    fn notices(&self, device: i32) -> PyResult<Vec<String>> {
        Ok(self.report.notices(self.device(device)?))
    }

    /// The peak figures of one device.
    fn summary<'py>(&self, py: Python<'py>, device: i32) -> PyResult<Bound<'py, PyDict>> {
        let d = self.device(device)?;
        let out = PyDict::new(py);
        out.set_item("max_mem", d.peak.max_bytes)?;
        out.set_item("total_allocated", d.peak.total_allocated)?;
        out.set_item("start_allocated", d.peak.start_bytes)?;
        out.set_item("end_allocated", d.peak.end_bytes)?;
        out.set_item("peak_time_us", d.peak.peak_time_us)?;
        out.set_item("peak_event", d.peak.peak_event)?;
        out.set_item("live_at_peak", d.peak.live.len())?;
        let events = self
            .report
            .trace
            .devices
            .iter()
            .find(|t| t.device == device)
            .map_or(0, |t| t.events.len());
        out.set_item("events", events)?;
        Ok(out)
    }

    /// Rows by location: (location, bytes, cumulative, median, count), biggest first.
    fn rows(&self, device: i32) -> PyResult<Vec<RowTuple>> {
        Ok(tuples(&self.device(device)?.rows))
    }

    /// Rows by tag (`phase:module`), same shape.
    fn module_rows(&self, device: i32) -> PyResult<Vec<RowTuple>> {
        Ok(tuples(&self.device(device)?.tags))
    }

    /// Keyword groups over the module rows (or the location rows), plus `Others` and, with
    /// `expected`, `Untrackable`.
    #[pyo3(signature = (device, groups, expected=None, by_module=true))]
    fn keywords(
        &self,
        device: i32,
        groups: Vec<(String, Vec<String>)>,
        expected: Option<u64>,
        by_module: bool,
    ) -> PyResult<Vec<(String, i128)>> {
        let d = self.device(device)?;
        let rows = if by_module { &d.tags } else { &d.rows };
        Ok(by_keyword(rows, &groups, expected))
    }

    /// {(filename, line): bytes alive at the peak that the line allocated, callees included}.
    fn line_peak_live(
        &self,
        device: i32,
    ) -> PyResult<std::collections::HashMap<(String, u32), u64>> {
        Ok(by_line(&self.report.trace, &self.device(device)?.peak.live))
    }

    /// The peak tracer's text report.
    fn text(&self) -> String {
        trace_text::peak_table(&self.report)
    }

    fn module_text(&self) -> String {
        trace_text::module_table(&self.report)
    }

    fn json(&self) -> String {
        trace_data::json(&self.report)
    }

    fn html(&self) -> String {
        trace_html::render(&self.report)
    }

    fn tag_csv(&self, device: i32) -> PyResult<String> {
        Ok(trace_data::tag_csv(self.device(device)?))
    }

    fn untagged_log(&self, device: i32) -> PyResult<String> {
        Ok(trace_data::untagged_log(&self.report, self.device(device)?))
    }

    /// The timeline of one device as a dict (TimelineView's keys).
    #[pyo3(signature = (device, top=8, max_points=2000))]
    fn timeline<'py>(
        &self,
        py: Python<'py>,
        device: i32,
        top: usize,
        max_points: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = self.device(device)?;
        let t = self.report.timeline(d, top, max_points);
        let out = PyDict::new(py);
        out.set_item("title", self.report.device_name(device))?;
        out.set_item("time_us", t.time_us)?;
        out.set_item("total", t.total)?;
        out.set_item("layers", t.layers)?;
        out.set_item("peak_index", t.peak_index)?;
        out.set_item("peak_bytes", t.peak_bytes)?;
        out.set_item("notices", self.report.notices(d))?;
        Ok(out)
    }
}

fn locator(exclude: Vec<String>, full_paths: bool, cwd: Option<String>) -> Locator {
    let paths = if full_paths {
        Paths::Full
    } else {
        Paths::Short { cwd }
    };
    Locator { exclude, paths }
}

/// Check the pickle at `path` before anything reads it (`pickle_guard`): plain data only,
/// every table bounded by the file's size. Returns (protocol, values a full walk visits);
/// raises ValueError naming the opcode or bound and its byte, FileNotFoundError.
#[pyfunction]
pub fn check_snapshot_pickle(py: Python<'_>, path: String) -> PyResult<(u8, u64)> {
    let checked = py.detach(|| check_file(&path));
    match checked {
        Ok(c) => Ok((c.protocol, c.values)),
        Err(Refusal::Missing) => Err(PyFileNotFoundError::new_err(format!(
            "no snapshot file at {path:?}"
        ))),
        Err(refusal) => Err(PyValueError::new_err(refusal.message(&path))),
    }
}

fn view_error(key: &str, what: &str, err: impl std::fmt::Display) -> PyErr {
    PyTypeError::new_err(format!(
        "timeline view['{key}'] must be {what} ({err}); pass the dict report.timeline(device) returns"
    ))
}

fn required<'py>(view: &Bound<'py, PyDict>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    view.get_item(key)?.ok_or_else(|| {
        PyValueError::new_err(format!(
            "timeline view has no '{key}'; it needs title, time_us, total, layers, peak_index, \
             peak_bytes and notices, as report.timeline(device) returns"
        ))
    })
}

fn byte_list(value: &Bound<'_, PyAny>, key: &str) -> PyResult<Vec<u64>> {
    if value.is_instance_of::<PyString>() {
        return Err(view_error(key, "a list of byte counts", "got a str"));
    }
    value
        .extract::<Vec<u64>>()
        .map_err(|e| view_error(key, "a list of byte counts (ints >= 0)", e))
}

fn view_from_dict(view: &Bound<'_, PyDict>) -> PyResult<TimelineView> {
    let title = match view.get_item("title")? {
        Some(t) => t
            .extract::<String>()
            .map_err(|e| view_error("title", "a str", e))?,
        None => String::new(),
    };
    let time_us = required(view, "time_us")?
        .extract::<Vec<i64>>()
        .map_err(|e| view_error("time_us", "a list of ints (microseconds)", e))?;
    let total = byte_list(&required(view, "total")?, "total")?;
    let mut layers = Vec::new();
    for item in required(view, "layers")?
        .try_iter()
        .map_err(|e| view_error("layers", "a list of (name, byte counts) pairs", e))?
    {
        let item = item?;
        let (name, values): (String, Bound<'_, PyAny>) = match item.extract() {
            Ok(pair) => pair,
            Err(_) => {
                let parts: Vec<Bound<'_, PyAny>> = item
                    .extract()
                    .map_err(|e| view_error("layers", "a list of (name, byte counts) pairs", e))?;
                let [name, values]: [Bound<'_, PyAny>; 2] = parts.try_into().map_err(|_| {
                    view_error(
                        "layers",
                        "a list of (name, byte counts) pairs",
                        "not a pair",
                    )
                })?;
                let name = name
                    .extract::<String>()
                    .map_err(|e| view_error("layers", "pairs whose name is a str", e))?;
                (name, values)
            }
        };
        layers.push((name, byte_list(&values, "layers")?));
    }
    let peak_index = required(view, "peak_index")?
        .extract::<usize>()
        .map_err(|e| view_error("peak_index", "an int >= 0", e))?;
    let peak_bytes = required(view, "peak_bytes")?
        .extract::<u64>()
        .map_err(|e| view_error("peak_bytes", "an int >= 0", e))?;
    let notices = match view.get_item("notices")? {
        Some(n) if !n.is_instance_of::<PyString>() => n
            .extract::<Vec<String>>()
            .map_err(|e| view_error("notices", "a list of str", e))?,
        Some(_) => return Err(view_error("notices", "a list of str", "got a str")),
        None => Vec::new(),
    };
    let view = TimelineView {
        title,
        time_us,
        total,
        layers,
        peak_index,
        peak_bytes,
        notices,
    };
    if let Some(problem) = check(&view) {
        return Err(PyValueError::new_err(format!(
            "timeline view is inconsistent: {problem}"
        )));
    }
    Ok(view)
}

/// The timeline of a trace as one self-contained HTML document (a dict with the keys of
/// `report.timeline(device)` in, the page out).
///
/// >>> from memlab_rs._core import _trace_timeline_html
/// >>> page = _trace_timeline_html({"title": "cpu", "time_us": [0, 1000, 2000],
/// ...     "total": [0, 1 << 20, 0], "layers": [("model.py:3 (f)", [0, 1 << 20, 0])],
/// ...     "peak_index": 1, "peak_bytes": 1 << 20, "notices": []})
/// >>> "peak 1.0 MiB (1048576 bytes)" in page
/// True
#[pyfunction]
pub fn _trace_timeline_html(view: &Bound<'_, PyDict>) -> PyResult<String> {
    Ok(timeline_html(&view_from_dict(view)?))
}
