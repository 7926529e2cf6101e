//! One CUDA device's statistics: torch's binding until the allocator's own fields are
//! located (`cuda_direct`), then those fields, checked against the binding when first used,
//! at each `validate` (the engine's enable and disable), at every refresh and on a
//! schedule; the binding again for good after any difference.

use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::direct::{self as cuda_direct, schedule, Reader, Verdict};
use crate::sources::layout::{flatten_names, read_values, Layout};

/// How a CUDA source reads its statistics (for benchmarks and tests).
pub const READER_DIRECT: &str = "allocator memory";
pub const READER_BINDING: &str = "torch._C._cuda_memoryStats";

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

/// The direct reader in use and when it is checked next.
struct Direct {
    reader: Reader,
    schedule: schedule::Schedule,
    /// `samples` at the last check (a second check within one sample is skipped).
    checked_at: u64,
}

/// What a check left: the binding's answer (layout order), and whether the direct reader
/// is still in use.
enum Checked {
    Kept(Vec<i64>),
    Dropped(Vec<i64>),
}

impl CudaSource {
    pub fn new(py: Python<'_>, index: i64) -> PyResult<Self> {
        let every = schedule::every_from(std::env::var(schedule::ENV).ok().as_deref())
            .map_err(PyValueError::new_err)?;
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
                self.direct = Some(Direct {
                    reader,
                    schedule: schedule::Schedule::new(self.every, schedule::PERIOD, Instant::now()),
                    checked_at: 0,
                });
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
                let name = layout.names.get(at).map_or("?", String::as_str);
                cuda_direct::reject(
                    device,
                    format!(
                        "memory disagreed with torch after sample {}: {name}={memory} in \
                         allocator memory, {torch_value} from torch",
                        self.samples
                    ),
                    cuda_direct::notice_text(device, self.samples, name, memory, torch_value),
                );
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
        values.iter_mut().for_each(|v| *v = 0);
        for (name, value) in names.iter().zip(found) {
            if let Some(i) = layout.index(name) {
                values[i] = value;
            }
        }
    }
    Ok(values)
}
