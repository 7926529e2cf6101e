//! `LineCollector`: a `LineProfiler`'s handle on the engine (its code objects, its rows and
//! its memory source), and the line profile it builds; collectors dropped while the engine
//! was busy, retired at the next safe point.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::actions::run_actions;
use super::engine::{self, remember, thread_id, try_with_engine, with_engine, Code, CollectorId};
use super::sync::sync_locked;
use crate::line_profiler::columns::catalogue;
use crate::line_profiler::report::{self, ExtraColumns, Recorded, SourceLines};
use crate::results::to_json;
use crate::sources::lock;
use crate::sources::source::Device;

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
#[pyclass(module = "memlab_rs._core.line_profiler")]
pub struct LineCollector {
    id: CollectorId,
}

#[pymethods]
impl LineCollector {
    #[new]
    fn new(py: Python<'_>, device: &str) -> PyResult<Self> {
        let device = parse_device(device)?;
        retire_dropped(py)?; // their slots first: the new collector takes one of them
        Ok(Self {
            id: with_engine(py, |engine| Ok(engine.create(device)))?,
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
        let first_line: u32 = code.getattr("co_firstlineno")?.extract()?;
        let filename: String = code.getattr("co_filename")?.extract()?;
        let mut offsets = Vec::new();
        // Offsets place a resumed generator (sys.monitoring, 3.12+); Python 3.9 has no
        // `co_lines`, and its trace hook gives line numbers directly.
        if code.hasattr("co_lines")? {
            for item in code.call_method0("co_lines")?.try_iter()? {
                let (start, end, line): (i64, i64, Option<u32>) = item?.extract()?;
                if let Some(line) = line {
                    offsets.push((start, end, line));
                }
            }
        }
        let entry = Code {
            object: code.clone().unbind(),
            qualname,
            filename,
            first_line,
            offsets,
            rows: Default::default(),
        };
        let new = with_engine(py, |engine| {
            let (_, new) = engine.add_code(self.id, entry)?;
            if new {
                sync_locked(py, engine)?;
            }
            Ok(new)
        })?;
        Ok(new)
    }

    fn enable(&self, py: Python<'_>) -> PyResult<()> {
        retire_dropped(py)?;
        with_engine(py, |engine| {
            engine.enable(py, self.id)?;
            if let Err(error) = sync_locked(py, engine) {
                // No hook, no profiling: the collector must not say it is enabled.
                let _ = engine.disable(py, self.id, thread_id());
                let _ = sync_locked(py, engine);
                return Err(error);
            }
            Ok(())
        })
    }

    fn disable(&self, py: Python<'_>) -> PyResult<()> {
        retire_dropped(py)?;
        let (actions, synced) = with_engine(py, |engine| {
            let actions = engine.disable(py, self.id, thread_id())?;
            Ok((actions, sync_locked(py, engine)))
        })?;
        run_actions(py, actions);
        synced
    }

    /// Forget every function and every row.
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        retire_dropped(py)?;
        let (actions, synced) = with_engine(py, |engine| {
            let actions = engine.clear(py, self.id, thread_id())?;
            Ok((actions, sync_locked(py, engine)))
        })?;
        run_actions(py, actions);
        synced
    }

    fn set_device(&self, py: Python<'_>, device: &str) -> PyResult<()> {
        retire_dropped(py)?;
        let device = parse_device(device)?;
        with_engine(py, |engine| engine.set_device(py, self.id, device))
    }

    #[getter]
    fn device(&self, py: Python<'_>) -> PyResult<String> {
        with_engine(py, |engine| Ok(engine.collector(self.id)?.device.name()))
    }

    /// How statistics are read while enabled: "allocator memory" (CUDA, located once),
    /// "torch._C._cuda_memoryStats" (CUDA, the binding), "allocator hook" (CPU, our hook on
    /// torch's CPU allocator) or "dispatch mode" (CPU, the fallback).
    #[getter]
    fn stats_reader(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        with_engine(py, |engine| Ok(engine.reader(self.id)))
    }

    #[getter]
    fn enabled(&self, py: Python<'_>) -> PyResult<bool> {
        with_engine(py, |engine| Ok(engine.collector(self.id)?.enabled))
    }

    /// The code objects this collector profiles, in registration order.
    fn codes(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        with_engine(py, |engine| {
            Ok(engine
                .collector(self.id)?
                .codes
                .iter()
                .map(|c| c.object.clone_ref(py))
                .collect())
        })
    }

    /// The statistics this collector's source has (empty before CUDA is initialised).
    fn column_names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        with_engine(py, |engine| Ok(engine.collector(self.id)?.names.clone()))
    }

    /// The highest value of every peak statistic seen while enabled, as (name, value).
    fn session_peaks(&self, py: Python<'_>) -> PyResult<Vec<(String, i64)>> {
        with_engine(py, |engine| {
            let collector = engine.collector(self.id)?;
            Ok(collector
                .names
                .iter()
                .zip(&collector.session_peak)
                .filter(|(name, _)| name.ends_with(".peak"))
                .map(|(name, value)| (name.clone(), *value))
                .collect())
        })
    }

    /// The line profile of the functions at `selected` (indexes into `codes()`), each with
    /// its source as (first line, lines) or None, as the JSON text of its data (kind
    /// `line_profile`). Its columns: every statistic the source has, and of `asked`, those it
    /// does not list (a private pool's); `extra`: columns that come from elsewhere
    /// (`peak_live`, from an allocation history), each as one {line: value} map per selected
    /// function.
    #[pyo3(signature = (selected, sources, asked=Vec::new(), extra=None))]
    fn result(
        &self,
        py: Python<'_>,
        selected: Vec<u32>,
        sources: Vec<SourceLines>,
        asked: Vec<String>,
        extra: Option<ExtraColumns>,
    ) -> PyResult<String> {
        let extra = extra.unwrap_or_default();
        if sources.len() != selected.len() {
            return Err(PyValueError::new_err(format!(
                "sources must hold one entry per selected function: {} for {}",
                sources.len(),
                selected.len()
            )));
        }
        let profile = with_engine(py, |engine| {
            engine.gather_source_notices(self.id);
            let collector = engine.collector(self.id)?;
            if let Some(&bad) = selected
                .iter()
                .find(|&&i| i as usize >= collector.codes.len())
            {
                return Err(PyValueError::new_err(format!("no profiled function {bad}")));
            }
            let device = collector.device.name();
            let columns = report::columns(&collector.names, catalogue(&device), &asked, &extra);
            let functions: Vec<(Recorded<'_>, &SourceLines)> = selected
                .iter()
                .zip(&sources)
                .map(|(&i, source)| {
                    let code = &collector.codes[i as usize];
                    let recorded = Recorded {
                        qualname: &code.qualname,
                        filename: &code.filename,
                        rows: &code.rows,
                    };
                    (recorded, source)
                })
                .collect();
            let notices = report::notices(&collector.incidents());
            Ok(report::build(
                &collector.names,
                columns,
                &functions,
                &extra,
                notices,
            ))
        })?;
        Ok(to_json(&profile))
    }
}

/// Collectors dropped while they could not be retired at once (see `Drop`), and whether
/// there are any. A leaf lock.
static DROPPED: std::sync::Mutex<Vec<CollectorId>> = std::sync::Mutex::new(Vec::new());
static DROPPED_ANY: AtomicBool = AtomicBool::new(false);

impl Drop for LineCollector {
    /// A dropped collector is retired at once: disabled, and every hook it needed removed.
    /// Not when the engine is busy: a drop can happen whenever the garbage collector runs,
    /// also while the engine runs Python code on this thread (taking it again would
    /// deadlock) or while another thread holds it (a destructor must not wait). Then the id
    /// is queued, and the next safe point retires it: the next call into a profiler, or the
    /// next interpreter event once the engine is free.
    fn drop(&mut self) {
        // SAFETY: a pyclass is dropped by its type's deallocator, with the GIL held.
        let py = unsafe { Python::assume_attached() };
        let id = self.id;
        let retired = try_with_engine(|engine| {
            let actions = engine.drop_collector(py, id, thread_id());
            (actions, sync_locked(py, engine))
        });
        match retired {
            Some((actions, synced)) => {
                run_actions(py, actions);
                if let Err(error) = synced {
                    remember(format!("removing the hooks of a dropped profiler: {error}"));
                }
            }
            None => {
                DROPPED.lock().unwrap_or_else(|p| p.into_inner()).push(id);
                DROPPED_ANY.store(true, Relaxed);
            }
        }
    }
}

/// Retire the collectors queued by `Drop` (a safe point: the engine is not held here).
fn retire_dropped(py: Python<'_>) -> PyResult<()> {
    if !DROPPED_ANY.swap(false, Relaxed) {
        return Ok(());
    }
    let ids = std::mem::take(&mut *DROPPED.lock().unwrap_or_else(|p| p.into_inner()));
    let retired = with_engine(py, |engine| Ok(retire(py, engine, &ids)));
    finish_retiring(py, ids, retired.ok())
}

/// `retire_dropped` from an interpreter hook: only when the engine is free now (it never
/// waits), never raising.
pub fn retire_dropped_if_free(py: Python<'_>) {
    // A load first: this runs on every event, the swap only when there is work.
    if !DROPPED_ANY.load(Relaxed) || lock::held_here() || !DROPPED_ANY.swap(false, Relaxed) {
        return;
    }
    let ids = std::mem::take(&mut *DROPPED.lock().unwrap_or_else(|p| p.into_inner()));
    let retired = try_with_engine(|engine| retire(py, engine, &ids));
    if let Err(error) = finish_retiring(py, ids, retired) {
        remember(error.to_string());
    }
}

type Retired = (Vec<engine::Action>, PyResult<()>);

fn retire(py: Python<'_>, engine: &mut engine::Engine, ids: &[CollectorId]) -> Retired {
    let mut actions = Vec::new();
    for &id in ids {
        actions.extend(engine.drop_collector(py, id, thread_id()));
    }
    (actions, sync_locked(py, engine))
}

/// Run what retiring left to do, or queue the ids again when the engine was busy.
fn finish_retiring(
    py: Python<'_>,
    ids: Vec<CollectorId>,
    retired: Option<Retired>,
) -> PyResult<()> {
    match retired {
        Some((actions, synced)) => {
            run_actions(py, actions);
            synced
        }
        None => {
            DROPPED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(ids);
            DROPPED_ANY.store(true, Relaxed);
            Ok(())
        }
    }
}

/// Errors met while handling interpreter events (never raised into profiled code).
#[pyfunction]
pub fn _hook_errors() -> Vec<String> {
    engine::ERRORS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Run `callback` with the engine held on this thread (for tests: what the engine's own
/// Python calls, such as a finaliser during a garbage collection, would meet).
#[pyfunction]
pub fn _run_inside_engine(py: Python<'_>, callback: &Bound<'_, PyAny>) -> PyResult<()> {
    with_engine(py, |_| callback.call0().map(drop))
}

/// The engine's collector table as (slots, collectors alive in them), once the drops
/// queued while the engine was busy are retired. For tests: the table is as long as the
/// most profilers alive at once, however many were made and dropped.
#[pyfunction]
pub fn _line_engine_table(py: Python<'_>) -> PyResult<(usize, usize)> {
    retire_dropped(py)?;
    with_engine(py, |engine| Ok(engine.table()))
}
