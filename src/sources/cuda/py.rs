//! One CUDA device's statistics as torch's binding gives them, and the calls that reach it:
//! `CudaSource` reads `torch._C._cuda_memoryStats(device)` (its nested dict read by
//! `flatten_names` and `read_values`) until the direct reader is located, then checks that
//! reader against it (`stats` keeps the reader's bookkeeping, `direct` the reader); and
//! the direct reader's state as `_core` functions for tests and notices.

use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::direct::{self as cuda_direct, Verdict};
use super::stats::{by_name, every, reject, Checked, Direct, READER_BINDING, READER_DIRECT};
use crate::sources::layout::Layout;

/// The torch bindings a CUDA sample calls: about 10 us and 2 us on an H100, against 75 us
/// for `torch.cuda.memory_stats()`, which flattens and sorts the same dict in Python.
pub struct CudaSource {
    index: i64,
    stats: Py<PyAny>,
    reset_peaks: Py<PyAny>,
    device_count: Py<PyAny>,
    torch_cuda: Py<PyAny>,
    initialized: bool,
    direct: Option<Direct>,
    /// Binding samples until the next look for the allocator's fields.
    until_search: u32,
    /// Samples read since this source was created (a notice says after which one the
    /// binding took over).
    samples: u64,
    /// Samples between scheduled checks.
    every: u32,
}

impl CudaSource {
    pub fn new(py: Python<'_>, index: i64) -> PyResult<Self> {
        let every = every().map_err(PyValueError::new_err)?;
        let c = py.import("torch")?.getattr("_C")?;
        Ok(Self {
            index,
            stats: c.getattr("_cuda_memoryStats")?.unbind(),
            reset_peaks: c.getattr("_cuda_resetPeakMemoryStats")?.unbind(),
            device_count: c.getattr("_cuda_getDeviceCount")?.unbind(),
            torch_cuda: py.import("torch.cuda")?.into_any().unbind(),
            initialized: false,
            direct: None,
            until_search: 0,
            samples: 0,
            every,
        })
    }

    pub fn reader(&self) -> &'static str {
        if self.direct.is_some() {
            READER_DIRECT
        } else {
            READER_BINDING
        }
    }

    /// Reset torch's peaks (the caller has mirrored the reset in its sample).
    pub fn reset_peaks(&self, py: Python<'_>) -> PyResult<()> {
        if self.initialized {
            self.reset_peaks.call1(py, (self.index,))?;
        }
        Ok(())
    }

    /// Read every statistic into `current`; `layout` is learned from the first binding
    /// answer (until CUDA is initialised both stay as they are).
    pub fn read(
        &mut self,
        py: Python<'_>,
        layout: &mut Layout,
        current: &mut Vec<i64>,
    ) -> PyResult<()> {
        if !self.initialized {
            // Asking torch for stats before CUDA is up would initialise it: never do that.
            let ready = self
                .torch_cuda
                .getattr(py, "_initialized")?
                .extract::<bool>(py)?;
            if !ready {
                return Ok(());
            }
            self.initialized = true;
        }
        self.samples += 1;
        if let Some(direct) = &mut self.direct {
            direct.reader.read(current);
            let refresh = direct.reader.refresh_due(current);
            if refresh || direct.schedule.tick(Instant::now) {
                match self.check(py, layout, current, refresh)? {
                    Checked::Kept(torch) if refresh => {
                        if let Some(direct) = &mut self.direct {
                            direct.reader.refresh_from(current, &torch);
                        }
                    }
                    Checked::Kept(_) => {}
                    // Memory was wrong: this sample is torch's answer.
                    Checked::Dropped(torch) => *current = torch,
                }
            }
            return Ok(());
        }
        *current = self.binding(py, layout)?;
        if self.until_search == 0 {
            self.search(py, layout, current)?;
        } else {
            self.until_search -= 1;
        }
        Ok(())
    }

    /// Check the direct reader against the binding now (nothing when it is not in use).
    /// `current` is the source's last sample; it is not changed.
    pub fn validate(&mut self, py: Python<'_>, layout: &Layout, current: &[i64]) -> PyResult<()> {
        let Some(direct) = &self.direct else {
            return Ok(());
        };
        if direct.checked_at == self.samples {
            return Ok(()); // checked during the last sample: nothing was read since
        }
        let mut sample = current.to_vec();
        direct.reader.read(&mut sample);
        let refresh = direct.reader.refresh_due(&sample);
        self.check(py, layout, &sample, refresh)?;
        Ok(())
    }

    /// Look for the allocator's fields (`current` is the binding's answer of this sample).
    fn search(&mut self, py: Python<'_>, layout: &Layout, current: &mut [i64]) -> PyResult<()> {
        // Real scans are capped per process; "nothing allocated yet" is cheap and asks
        // again at the next sample.
        self.until_search = 32;
        let count = self.device_count.call0(py)?.extract::<usize>(py)?;
        let Ok(device) = usize::try_from(self.index) else {
            return Ok(());
        };
        if device >= count {
            return Ok(());
        }
        let stats = match cuda_direct::located(device, count, layout, current) {
            cuda_direct::Located::Found(stats) => stats,
            cuda_direct::Located::NotYet => {
                self.until_search = 0;
                return Ok(());
            }
            cuda_direct::Located::No => return Ok(()),
        };
        match stats.reader(layout) {
            Ok(reader) => {
                self.direct = Some(Direct::new(reader, self.every));
                // Found now or by an earlier source: either way, check before first use.
                let mut sample = current.to_vec();
                if let Some(direct) = &self.direct {
                    direct.reader.read(&mut sample);
                }
                if let Checked::Kept(torch) = self.check(py, layout, &sample, true)? {
                    if let Some(direct) = &mut self.direct {
                        // The refreshed statistics are watched from this answer on.
                        direct.reader.refresh_from(current, &torch);
                    }
                }
            }
            Err(reason) => cuda_direct::give_up(device, reason),
        }
        Ok(())
    }

    /// Check the direct reader against the binding; `sample` has the located statistics
    /// just read from memory, and its refreshed ones are compared unless `refresh` (due
    /// for a refresh). Gives the reader up on any difference.
    fn check(
        &mut self,
        py: Python<'_>,
        layout: &Layout,
        sample: &[i64],
        refresh: bool,
    ) -> PyResult<Checked> {
        let Some(direct) = &mut self.direct else {
            return Ok(Checked::Dropped(binding_values(
                py,
                &self.stats,
                self.index,
                layout,
            )?));
        };
        let (stats, index) = (&self.stats, self.index);
        let reader = &direct.reader;
        let verdict = cuda_direct::compare(
            sample,
            reader.located(),
            reader.compared(refresh),
            |out| reader.read(out),
            || binding_values(py, stats, index, layout),
        )?;
        let device = usize::try_from(index).unwrap_or(usize::MAX);
        cuda_direct::count(device, &verdict);
        direct.schedule.checked(Instant::now());
        direct.checked_at = self.samples;
        match verdict {
            Verdict::Agree { torch } | Verdict::Inconclusive { torch } => Ok(Checked::Kept(torch)),
            Verdict::Differ {
                index: at,
                memory,
                torch_value,
                torch,
            } => {
                reject(device, self.samples, layout, at, memory, torch_value);
                self.direct = None;
                Ok(Checked::Dropped(torch))
            }
        }
    }

    fn binding(&self, py: Python<'_>, layout: &mut Layout) -> PyResult<Vec<i64>> {
        if layout.is_empty() {
            let stats = self.stats.call1(py, (self.index,))?;
            let stats = stats.bind(py).cast::<PyDict>()?;
            *layout = Layout::new(flatten_names(stats)?);
            let mut values = vec![0; layout.len()];
            read_values(stats, &mut values);
            return Ok(values);
        }
        binding_values(py, &self.stats, self.index, layout)
    }
}

/// One call of the binding, read into a vector in `layout` order.
fn binding_values(
    py: Python<'_>,
    stats: &Py<PyAny>,
    index: i64,
    layout: &Layout,
) -> PyResult<Vec<i64>> {
    let stats = stats.call1(py, (index,))?;
    let stats = stats.bind(py).cast::<PyDict>()?;
    let mut values = vec![0; layout.len()];
    if read_values(stats, &mut values) != layout.len() {
        // A different shape than the first sample (a memory pool came or went): read it by
        // name, so that numbers never shift silently.
        let names = flatten_names(stats)?;
        let mut found = vec![0; names.len()];
        read_values(stats, &mut found);
        values = by_name(layout, &names, &found);
    }
    Ok(values)
}

/// The dotted names of a nested stats dict's leaves, in iteration order.
pub fn flatten_names(stats: &Bound<'_, PyDict>) -> PyResult<Vec<String>> {
    let mut names = Vec::new();
    collect_names(stats, "", &mut names)?;
    Ok(names)
}

fn collect_names(dict: &Bound<'_, PyDict>, prefix: &str, names: &mut Vec<String>) -> PyResult<()> {
    for (key, value) in dict.iter() {
        let name = format!("{prefix}{}", crate::interrupts::text(&key)?);
        match value.cast::<PyDict>() {
            Ok(inner) => collect_names(inner, &format!("{name}."), names)?,
            Err(_) => names.push(name),
        }
    }
    Ok(())
}

/// Write a nested stats dict's leaves into `out` in iteration order. Returns how many
/// leaves there were; the caller compares that with its layout (torch builds the dict in
/// a fixed order, so keys need not be compared on the hot path).
pub fn read_values(dict: &Bound<'_, PyDict>, out: &mut [i64]) -> usize {
    let mut at = 0;
    fill(dict, out, &mut at);
    at
}

fn fill(dict: &Bound<'_, PyDict>, out: &mut [i64], at: &mut usize) {
    for (_, value) in dict.iter() {
        if let Ok(inner) = value.cast::<PyDict>() {
            fill(inner, out, at);
            continue;
        }
        if let Some(slot) = out.get_mut(*at) {
            *slot = value
                .extract::<i64>()
                .or_else(|_| value.extract::<f64>().map(|v| v as i64))
                .unwrap_or(0);
        }
        *at += 1;
    }
}

/// Why CUDA statistics of `device` are read through the binding rather than from the
/// allocator's memory (None when they are not, or nobody looked yet).
#[pyfunction]
pub fn _cuda_direct_why_not(device: usize) -> Option<String> {
    cuda_direct::why_not(device)
}

/// The notice of a fallback for `device`: why the report's numbers for it came through
/// torch's binding after some sample, when memory once disagreed with torch; None when
/// it never did. Kept for the rest of the process.
///
/// >>> from memlab_rs import _core
/// >>> _core._cuda_direct_notice(99) is None
/// True
#[pyfunction]
pub fn _cuda_direct_notice(device: usize) -> Option<String> {
    cuda_direct::notice(device)
}

/// Checks of `device`'s direct reader against torch's binding in this process, as
/// (compared, mismatched, inconclusive). `MEMLAB_RS_CUDA_REVALIDATE_SAMPLES=1` checks at
/// every sample (for tests).
///
/// >>> from memlab_rs import _core
/// >>> _core._cuda_direct_checks(99)
/// (0, 0, 0)
#[pyfunction]
pub fn _cuda_direct_checks(device: usize) -> (u64, u64, u64) {
    let c = cuda_direct::checks(device);
    (c.compared, c.mismatched, c.inconclusive)
}
