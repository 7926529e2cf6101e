//! The line profiler: interpreter hooks (`hooks`) feed per-frame line accounting
//! (`frames`, `engine`) with samples from a memory source (`source`, `layout`); `report`
//! turns the rows into a report that `render::line_text` and `render::line_html` print.

pub mod cuda_direct;
pub mod engine;
pub mod frames;
pub mod hooks;
pub mod layout;
pub mod report;
pub mod source;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use engine::{with_engine, Code};
use hooks::{run_actions, sync, thread_id};
use source::{Device, CPU};

fn parse_device(device: &str) -> PyResult<Device> {
    if device == "cpu" {
        return Ok(Device::Cpu);
    }
    device
        .strip_prefix("cuda:")
        .and_then(|index| index.parse::<i64>().ok())
        .filter(|index| *index >= 0)
        .map(Device::Cuda)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "device {device:?} is not one the line profiler reads: use \"cpu\" or \
                 \"cuda:N\""
            ))
        })
}

/// A line profiler's handle on the engine (the Python `LineProfiler` owns one).
#[pyclass(module = "memlab_rs._core")]
pub struct LineCollector {
    id: usize,
}

#[pymethods]
impl LineCollector {
    #[new]
    fn new(device: &str) -> PyResult<Self> {
        let device = parse_device(device)?;
        Ok(Self {
            id: with_engine(|engine| engine.create(device)),
        })
    }

    /// Profile `code` (a code object) under `qualname`; False if it already was.
    fn add_code(
        &self,
        py: Python<'_>,
        code: &Bound<'_, PyAny>,
        qualname: String,
    ) -> PyResult<bool> {
        retire_dropped(py)?;
        let first_line = code.getattr("co_firstlineno")?.extract::<u32>()?;
        let mut offsets = Vec::new();
        for item in code.call_method0("co_lines")?.try_iter()? {
            let (start, end, line): (i64, i64, Option<u32>) = item?.extract()?;
            if let Some(line) = line {
                offsets.push((start, end, line));
            }
        }
        let entry = Code {
            object: code.clone().unbind(),
            qualname,
            first_line,
            offsets,
            rows: Default::default(),
        };
        let (_, new) = with_engine(|engine| engine.add_code(self.id, entry))?;
        if new {
            sync(py)?;
        }
        Ok(new)
    }

    fn enable(&self, py: Python<'_>) -> PyResult<()> {
        retire_dropped(py)?;
        with_engine(|engine| engine.enable(py, self.id))?;
        sync(py)
    }

    fn disable(&self, py: Python<'_>) -> PyResult<()> {
        retire_dropped(py)?;
        let actions = with_engine(|engine| engine.disable(py, self.id, thread_id()))?;
        run_actions(py, actions);
        sync(py)
    }

    /// Forget every function and every row.
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        retire_dropped(py)?;
        let actions = with_engine(|engine| engine.clear(py, self.id, thread_id()))?;
        run_actions(py, actions);
        sync(py)
    }

    fn set_device(&self, py: Python<'_>, device: &str) -> PyResult<()> {
        retire_dropped(py)?;
        let device = parse_device(device)?;
        with_engine(|engine| engine.set_device(py, self.id, device))
    }

    #[getter]
    fn device(&self) -> PyResult<String> {
        with_engine(|engine| Ok(engine.collector(self.id)?.device.name()))
    }

    /// How statistics are read while enabled: "allocator memory" (CUDA, located once),
    /// "torch._C._cuda_memoryStats" (CUDA, the binding) or "storage counts" (CPU).
    #[getter]
    fn stats_reader(&self) -> Option<&'static str> {
        with_engine(|engine| engine.reader(self.id))
    }

    #[getter]
    fn enabled(&self) -> PyResult<bool> {
        with_engine(|engine| Ok(engine.collector(self.id)?.enabled))
    }

    /// The code objects this collector profiles, in registration order.
    fn codes(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        with_engine(|engine| {
            Ok(engine
                .collector(self.id)?
                .codes
                .iter()
                .map(|c| c.object.clone_ref(py))
                .collect())
        })
    }

    /// The statistics this collector's source has (empty before CUDA is initialised).
    fn column_names(&self) -> PyResult<Vec<String>> {
        with_engine(|engine| Ok(engine.collector(self.id)?.names.clone()))
    }

    /// The highest value of every peak statistic seen while enabled.
    fn session_peaks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let pairs = with_engine(|engine| {
            let collector = engine.collector(self.id)?;
            Ok::<_, PyErr>(
                collector
                    .names
                    .iter()
                    .zip(&collector.session_peak)
                    .filter(|(name, _)| name.ends_with(".peak"))
                    .map(|(name, value)| (name.clone(), *value))
                    .collect::<Vec<_>>(),
            )
        })?;
        let out = PyDict::new(py);
        for (name, value) in pairs {
            out.set_item(name, value)?;
        }
        Ok(out)
    }

    /// Build a report of the functions at `selected` (indexes into `codes()`), each with
    /// its source as (first line, lines) or None.
    fn report(
        &self,
        columns: Vec<String>,
        selected: Vec<u32>,
        sources: Vec<report::Source>,
    ) -> PyResult<crate::render::line::LineReportView> {
        with_engine(|engine| {
            let collector = engine.collector(self.id)?;
            if let Some(&bad) = selected
                .iter()
                .find(|&&i| i as usize >= collector.codes.len())
            {
                return Err(PyValueError::new_err(format!("no profiled function {bad}")));
            }
            report::build(collector, &columns, &selected, &sources)
        })
        .map(crate::render::line::LineReportView::from)
    }
}

/// Collectors dropped since the last call into the engine. A drop can happen whenever the
/// garbage collector runs, also while the engine or the hooks are busy calling Python on
/// this thread, so it only queues the id; the next call from Python does the work.
static DROPPED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

impl Drop for LineCollector {
    fn drop(&mut self) {
        DROPPED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.id);
    }
}

/// Retire the collectors queued by `Drop` (never called with a lock held).
fn retire_dropped(py: Python<'_>) -> PyResult<()> {
    let ids = std::mem::take(&mut *DROPPED.lock().unwrap_or_else(|p| p.into_inner()));
    if ids.is_empty() {
        return Ok(());
    }
    for id in ids {
        let actions = with_engine(|engine| engine.drop_collector(py, id, thread_id()));
        run_actions(py, actions);
    }
    sync(py)
}

/// Count a new CPU storage of `nbytes` (called by the CPU dispatch mode).
#[pyfunction]
pub fn _cpu_allocated(nbytes: i64) {
    CPU.allocated(nbytes);
}

/// Count a CPU storage that existed before tracking started (live, not allocated).
#[pyfunction]
pub fn _cpu_adopted(nbytes: i64) {
    CPU.adopted(nbytes);
}

/// Count a freed CPU storage of `nbytes` (called when its weak reference dies).
#[pyfunction]
pub fn _cpu_freed(nbytes: i64) {
    CPU.freed(nbytes);
}

/// Live CPU storages the tracker knows: (bytes, count).
#[pyfunction]
pub fn _cpu_live() -> (i64, i64) {
    CPU.live()
}

/// Tell the core how to start and stop CPU storage tracking on the calling thread.
#[pyfunction]
pub fn _set_cpu_tracking(start: Py<PyAny>, stop: Py<PyAny>) {
    hooks::set_cpu_tracking(start, stop);
}

/// Errors met while handling interpreter events (never raised into profiled code).
#[pyfunction]
pub fn _hook_errors() -> Vec<String> {
    hooks::ERRORS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Why CUDA statistics of `device` are read through the binding rather than from the
/// allocator's memory (None when they are not, or nobody looked yet).
#[pyfunction]
pub fn _cuda_direct_why_not(device: usize) -> Option<String> {
    cuda_direct::why_not(device)
}
