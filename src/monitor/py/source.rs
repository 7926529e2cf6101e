//! The monitor's allocator figures: one sample of allocated and reserved bytes (current and
//! peak since the last reset), then a peak reset, so each window's peak covers that window
//! only. It reuses the line profiler's source (`sources::source::Source`): for CUDA
//! torch's `_cuda_memoryStats` binding or the allocator's own fields checked against it; for
//! the CPU the counters of `crate::sources::cpu` (held started while the source lives).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::sources::source::{Device, Source};

const NAMES: [&str; 4] = [
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
];

/// Counts that tell two iterations' allocations apart beyond their bytes (the monitor's
/// iteration signature, `python/memlab_rs/monitor/`): how many allocations and frees a window made, how
/// many blocks are live at its end, and the bytes requested (before rounding) live then.
/// Those a source does not have are left out.
const COUNTS: [&str; 4] = [
    "allocation.all.allocated",
    "allocation.all.freed",
    "allocation.all.current",
    "requested_bytes.all.current",
];

/// Samples allocated/reserved bytes of one device and resets its peaks after each sample.
#[pyclass(module = "memlab_rs._core.monitor", name = "Source")]
pub struct MonitorSource {
    source: Source,
    /// Indexes of `NAMES` in the source's layout, once it is known.
    indexes: Option<[usize; 4]>,
    /// Indexes of the `COUNTS` the layout has, and whether each is a running total.
    counts: Vec<(usize, bool)>,
    /// The running totals at the previous `read`.
    totals: Vec<i64>,
}

#[pymethods]
impl MonitorSource {
    /// `device` is "cpu" or "cuda:N". CUDA is never initialised here: until torch has done
    /// it, every figure reads 0.
    #[new]
    fn new(py: Python<'_>, device: &str) -> PyResult<Self> {
        let device = match device {
            "cpu" => Device::Cpu,
            other => match other.strip_prefix("cuda:").map(str::parse::<i64>) {
                Some(Ok(index)) if index >= 0 => Device::Cuda(index),
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "MonitorSource: device must be 'cpu' or 'cuda:N', got {other:?}"
                    )))
                }
            },
        };
        Ok(Self {
            source: Source::new(py, device)?,
            indexes: None,
            counts: Vec::new(),
            totals: Vec::new(),
        })
    }

    /// (allocated, peak allocated, reserved, peak reserved) bytes, peaks since the previous
    /// `read`, and the `COUNTS` the source has (allocations and frees since the previous
    /// `read`, live blocks and requested bytes now); then the peaks are reset.
    fn read(&mut self, py: Python<'_>) -> PyResult<(i64, i64, i64, i64, Vec<i64>)> {
        self.source.sample(py)?;
        if self.indexes.is_none() {
            let layout = &self.source.layout;
            let found: Option<Vec<usize>> = NAMES.iter().map(|name| layout.index(name)).collect();
            self.indexes = found.map(|v| [v[0], v[1], v[2], v[3]]);
            if self.indexes.is_some() {
                self.counts = COUNTS
                    .iter()
                    .filter_map(|name| Some((layout.index(name)?, !name.ends_with(".current"))))
                    .collect();
                self.totals = vec![0; self.counts.len()];
            }
        }
        let Some([a, ap, r, rp]) = self.indexes else {
            return Ok((0, 0, 0, 0, Vec::new())); // CUDA not initialised yet: nothing allocated
        };
        let c = &self.source.current;
        let mut counts = Vec::with_capacity(self.counts.len());
        for (&(i, running), total) in self.counts.iter().zip(self.totals.iter_mut()) {
            counts.push(if running { c[i] - *total } else { c[i] });
            *total = c[i];
        }
        let figures = (c[a], c[ap].max(c[a]), c[r], c[rp].max(c[r]), counts);
        self.source.reset_peaks(py)?;
        Ok(figures)
    }

    /// How the figures are read ("torch._C._cuda_memoryStats", "allocator memory",
    /// "allocator hook", "dispatch mode").
    fn reader(&self) -> &'static str {
        self.source.reader()
    }

    /// What a report must say about the figures (the CPU fallback, a displaced hook), if
    /// anything.
    fn notice(&self) -> Option<String> {
        self.source.notice()
    }
}
