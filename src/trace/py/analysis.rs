//! `_core.trace.TraceAnalysis`: a snapshot read and analysed once, answering questions about
//! the result. The analysed report stays here (a snapshot is often hundreds of MB: it never
//! crosses as a document); every answer crosses as the JSON text of a `result` struct, every
//! request with structure (options, keyword groups, a render's view) comes in as JSON text
//! its derive reads. `memlab_rs.trace.TraceResult` wraps it.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::load::from_snapshot;
use crate::results::{from_json, to_json};
use crate::trace::group::{by_keyword, by_line, Locator};
use crate::trace::pickle_stream::from_pickle;
use crate::trace::render::{data, html, text};
use crate::trace::report::{analyse, DeviceReport, Report};
use crate::trace::result::{By, KeywordQuery, Options, View};

#[pyclass(module = "memlab_rs._core.trace", frozen)]
pub struct TraceAnalysis {
    report: Report,
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

    /// The device a view names, else the first one recorded.
    fn viewed(&self, view: &View) -> PyResult<&DeviceReport> {
        match view.device {
            Some(device) => self.device(device),
            None => match self.report.devices.first() {
                Some(first) => Ok(first),
                None => self.device(0),
            },
        }
    }
}

fn locator(options: &str) -> PyResult<Locator> {
    Ok(from_json::<Options>(options)?.into())
}

fn by(by: &str) -> PyResult<By> {
    match by {
        "location" => Ok(By::Location),
        "module" => Ok(By::Module),
        other => Err(PyValueError::new_err(format!(
            "by={other:?}: use 'location' or 'module'"
        ))),
    }
}

#[pymethods]
impl TraceAnalysis {
    /// Analyse `snapshot` (a dict in torch's `_snapshot()` schema) with `options`, the JSON of
    /// `{"exclude": [path parts whose frames are not a location], "paths": "short" or "full",
    /// "cwd": the working directory short paths are relative to, unless the recording saved
    /// its own}`.
    #[new]
    fn new(py: Python<'_>, snapshot: &Bound<'_, PyAny>, options: &str) -> PyResult<Self> {
        let locator = locator(options)?;
        let trace = from_snapshot(py, snapshot)?;
        let report = py.detach(move || analyse(trace, &locator));
        Ok(TraceAnalysis { report })
    }

    /// Analyse the snapshot pickle at `path` without building its Python objects (a
    /// streaming reader: memory stays near the size of the compact records). The file
    /// passes `check_snapshot_pickle` first (a ValueError says why not). Raises
    /// `NotImplementedError` for a checked pickle it does not read (protocols 0-1, plain
    /// data laid out unlike a snapshot): the plain-data unpickler reads those.
    #[staticmethod]
    fn from_pickle(py: Python<'_>, path: String, options: &str) -> PyResult<Self> {
        let locator = locator(options)?;
        let report = py.detach(move || from_pickle(&path).map(|trace| analyse(trace, &locator)))?;
        Ok(TraceAnalysis { report })
    }

    /// `{"source": "cuda" or "cpu", "devices": [{"index", "name"}]}`: the devices with
    /// recorded allocations.
    fn about(&self) -> String {
        to_json(&self.report.about())
    }

    /// The peak figures of one device (`result::Summary`).
    fn summary(&self, device: i32) -> PyResult<String> {
        Ok(to_json(&self.report.summary(self.device(device)?)))
    }

    /// The live set at the peak by `"location"` or by `"module"` (its `phase:module` tag):
    /// `[{"key", "bytes", "cumulative", "median", "count"}]`, biggest first.
    fn rows(&self, device: i32, by: &str) -> PyResult<String> {
        let d = self.device(device)?;
        Ok(match self::by(by)? {
            By::Location => to_json(&d.rows),
            By::Module => to_json(&d.tags),
        })
    }

    /// Why the result may be incomplete: the whole trace's notices, then the device's.
    fn notices(&self, device: i32) -> PyResult<String> {
        Ok(to_json(&self.report.notices(self.device(device)?)))
    }

    /// Keyword groups (`result::KeywordQuery`) over the module rows (or the location rows):
    /// `[[group, bytes]]`, then `Others`.
    fn keywords(&self, device: i32, query: &str) -> PyResult<String> {
        let query: KeywordQuery = from_json(query)?;
        let d = self.device(device)?;
        let rows = match query.by {
            By::Module => &d.tags,
            By::Location => &d.rows,
        };
        Ok(to_json(&by_keyword(rows, &query.groups)))
    }

    /// `[{"filename", "line", "bytes"}]`: bytes alive at the peak that each line allocated,
    /// callees included.
    fn line_peak_live(&self, device: i32) -> PyResult<String> {
        let d = self.device(device)?;
        Ok(to_json(&by_line(&self.report.trace, &d.peak.live)))
    }

    /// The timeline of one device (`result::TimelineView`).
    #[pyo3(signature = (device, top=8, max_points=2000))]
    fn timeline(&self, device: i32, top: usize, max_points: usize) -> PyResult<String> {
        let d = self.device(device)?;
        Ok(to_json(&self.report.timeline(d, top, max_points)))
    }

    /// The report in `format`: `"text"` (the peak tracer's table; the view's `by`:
    /// `"location"` or `"module"`), `"html"`, `"json"`, `"csv"` (the tagging profiler's
    /// `tag,MiB` of the view's `device`) or `"untagged_log"` (the stacks of that device's
    /// `(untagged)` row). `view` is the JSON of `result::View`.
    fn render(&self, format: &str, view: &str) -> PyResult<String> {
        let view: View = from_json(view)?;
        let takes = |by: bool, device: bool| -> PyResult<()> {
            let given = [
                ("by", view.by.is_some() && !by),
                ("device", view.device.is_some() && !device),
            ];
            match given.iter().find(|(_, wrong)| *wrong) {
                Some((name, _)) => Err(PyValueError::new_err(format!(
                    "format={format:?} takes no {name} view option"
                ))),
                None => Ok(()),
            }
        };
        match format {
            "text" => {
                takes(true, false)?;
                Ok(match view.by.unwrap_or_default() {
                    By::Location => text::peak_table(&self.report),
                    By::Module => text::module_table(&self.report),
                })
            }
            "html" => takes(false, false).map(|()| html::render(&self.report)),
            "json" => takes(false, false).map(|()| data::json(&self.report)),
            "csv" => {
                takes(false, true)?;
                Ok(data::tag_csv(self.viewed(&view)?))
            }
            "untagged_log" => {
                takes(false, true)?;
                Ok(data::untagged_log(&self.report, self.viewed(&view)?))
            }
            other => Err(PyValueError::new_err(format!(
                "format={other:?}: a trace renders as text, html, json, csv or untagged_log"
            ))),
        }
    }
}
