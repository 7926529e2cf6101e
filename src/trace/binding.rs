//! The Python face of the analysis: `_core.TraceAnalysis(snapshot, exclude)` reads a snapshot
//! dict, analyses it once, and answers questions about the result. `memlab_rs.trace` wraps it.

use pyo3::exceptions::{PyFileNotFoundError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::group::{by_keyword, by_line, Locator, Row};
use super::load::from_snapshot;
use super::model::Source;
use super::paths::Paths;
use super::pickle_guard::{check_file, Refusal};
use super::pickle_stream::from_pickle;
use super::report::{analyse, DeviceReport, Report};
use crate::render::trace::{data as trace_data, html as trace_html, text as trace_text};

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
