//! Where a line's numbers come from: the torch caching allocator of one CUDA device, or our
//! own count of CPU tensor storages (fed by the dispatch mode in `memlab_rs._cpu_source`).
//!
//! A sample reads every statistic once. Peaks are "since the last reset", so after each
//! sample the source's peaks are reset to their current values, which is a no-op (and is
//! skipped) when no peak is above its current value.

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use std::sync::Arc;

use super::cuda_direct::{self, DirectStats};
use super::layout::{flatten_names, read_values, Layout, StatKind};

/// Which memory a source reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(i64),
}

impl Device {
    pub fn name(self) -> String {
        match self {
            Device::Cpu => "cpu".to_string(),
            Device::Cuda(index) => format!("cuda:{index}"),
        }
    }
}

/// One device's latest sample and what changed since the one before.
pub struct Source {
    pub device: Device,
    pub layout: Layout,
    /// The statistics as last read.
    pub current: Vec<i64>,
    /// How much each `Delta` statistic grew since the sample before (0 for the others).
    pub growth: Vec<i64>,
    previous: Vec<i64>,
    primed: bool,
    cuda: Option<CudaCalls>,
}

/// The torch bindings a CUDA sample calls: about 10 us and 2 us on an H100, against 75 us
/// for `torch.cuda.memory_stats()`, which flattens and sorts the same dict in Python.
/// Once found, the statistics are read from the allocator's memory (see `cuda_direct`).
struct CudaCalls {
    stats: Py<PyAny>,
    reset_peaks: Py<PyAny>,
    device_count: Py<PyAny>,
    torch_cuda: Py<PyAny>,
    initialized: bool,
    direct: Option<Arc<DirectStats>>,
    /// Binding samples until the next look for the allocator's fields.
    until_search: u32,
    /// Layout indexes of segment.all.allocated and .freed: when they move, the scalars the
    /// direct reader does not cover may have changed, so the binding is read again.
    segments: Option<(usize, usize)>,
}

/// How a CUDA source reads its statistics (for benchmarks and tests).
pub const READER_DIRECT: &str = "allocator memory";
pub const READER_BINDING: &str = "torch._C._cuda_memoryStats";

impl Source {
    pub fn new(py: Python<'_>, device: Device) -> PyResult<Self> {
        let (layout, cuda) = match device {
            Device::Cpu => (Layout::cpu(), None),
            Device::Cuda(_) => {
                let c = py.import("torch")?.getattr("_C")?;
                let calls = CudaCalls {
                    stats: c.getattr("_cuda_memoryStats")?.unbind(),
                    reset_peaks: c.getattr("_cuda_resetPeakMemoryStats")?.unbind(),
                    device_count: c.getattr("_cuda_getDeviceCount")?.unbind(),
                    torch_cuda: py.import("torch.cuda")?.into_any().unbind(),
                    initialized: false,
                    direct: None,
                    until_search: 0,
                    segments: None,
                };
                // Until CUDA is initialised the allocator holds nothing and the names are
                // unknown: the layout is learned from the first real sample, and every
                // vector sized by it grows then, filled with the zeros it would have read.
                (Layout::default(), Some(calls))
            }
        };
        let n = layout.len();
        Ok(Self {
            device,
            layout,
            current: vec![0; n],
            growth: vec![0; n],
            previous: vec![0; n],
            primed: false,
            cuda,
        })
    }

    /// Read every statistic. The first sample after (re)priming only sets the baseline.
    pub fn sample(&mut self, py: Python<'_>) -> PyResult<()> {
        match self.device {
            Device::Cpu => CPU.read(&mut self.current),
            Device::Cuda(index) => self.read_cuda(py, index)?,
        }
        for i in 0..self.layout.len() {
            let (now, before) = (self.current[i], self.previous[i]);
            self.growth[i] = match self.layout.kinds[i] {
                StatKind::Delta if self.primed => {
                    // A counter that went down was reset by the user: count from zero.
                    if now >= before {
                        now - before
                    } else {
                        now
                    }
                }
                _ => 0,
            };
        }
        self.previous.copy_from_slice(&self.current);
        self.primed = true;
        Ok(())
    }

    /// Set every peak to its current value, so the next sample's peaks cover only what
    /// happens from now on. Skipped when it would change nothing.
    pub fn reset_peaks(&mut self, py: Python<'_>) -> PyResult<()> {
        let needed = self
            .layout
            .pairs
            .iter()
            .any(|&(peak, current)| self.current[peak] > self.current[current]);
        if !needed {
            return Ok(());
        }
        for &(peak, current) in &self.layout.pairs {
            self.current[peak] = self.current[current];
        }
        match (self.device, &self.cuda) {
            (Device::Cpu, _) => CPU.reset_peaks(),
            (Device::Cuda(index), Some(calls)) if calls.initialized => {
                calls.reset_peaks.call1(py, (index,))?;
            }
            _ => {}
        }
        Ok(())
    }

    /// How this source reads its statistics.
    pub fn reader(&self) -> &'static str {
        match &self.cuda {
            Some(calls) if calls.direct.is_some() => READER_DIRECT,
            Some(_) => READER_BINDING,
            None => "storage counts",
        }
    }

    fn read_cuda(&mut self, py: Python<'_>, index: i64) -> PyResult<()> {
        let Some(calls) = self.cuda.as_mut() else {
            return Ok(());
        };
        if !calls.initialized {
            // Asking torch for stats before CUDA is up would initialise it: never do that.
            let ready = calls
                .torch_cuda
                .getattr(py, "_initialized")?
                .extract::<bool>(py)?;
            if !ready {
                return Ok(());
            }
            calls.initialized = true;
        }
        if let Some(direct) = &calls.direct {
            direct.read(&mut self.current);
            let moved = calls.segments.is_none_or(|(allocated, freed)| {
                self.current[allocated] != self.previous[allocated]
                    || self.current[freed] != self.previous[freed]
            });
            if !moved {
                return Ok(());
            }
            // A segment came or went: refresh the scalars from torch, and check that
            // memory still says what torch says (when nothing changed meanwhile).
            let before = self.current.clone();
            let fresh = Self::read_binding(py, calls, index, &mut self.layout)?;
            let mut after = before.clone();
            direct.read(&mut after);
            if after == before && !direct.agrees_with(&fresh) {
                calls.direct = None;
                cuda_direct::reject(index as usize, "memory disagreed with torch".into());
            }
            self.current = fresh;
            return Ok(());
        }
        let values = Self::read_binding(py, calls, index, &mut self.layout)?;
        if self.current.len() != values.len() {
            let n = values.len();
            self.growth = vec![0; n];
            self.previous = vec![0; n];
        }
        self.current = values;
        if calls.until_search == 0 {
            // Real scans are capped per process; "nothing allocated yet" is cheap and
            // asks again at the next sample.
            calls.until_search = 32;
            let count = calls.device_count.call0(py)?.extract::<usize>(py)?;
            let device = usize::try_from(index).unwrap_or(usize::MAX);
            if device < count {
                match cuda_direct::located(device, count, &self.layout, &self.current) {
                    cuda_direct::Located::Found(direct) => calls.direct = Some(direct),
                    cuda_direct::Located::NotYet => calls.until_search = 0,
                    cuda_direct::Located::No => {}
                }
            }
            if calls.direct.is_some() {
                let index_of = |name: &str| self.layout.index(name);
                calls.segments =
                    index_of("segment.all.allocated").zip(index_of("segment.all.freed"));
            }
        } else {
            calls.until_search -= 1;
        }
        Ok(())
    }

    /// One call of the binding, read into a vector in `layout` order (learned on first use).
    fn read_binding(
        py: Python<'_>,
        calls: &CudaCalls,
        index: i64,
        layout: &mut Layout,
    ) -> PyResult<Vec<i64>> {
        let stats = calls.stats.call1(py, (index,))?;
        let stats = stats.bind(py).cast::<PyDict>()?;
        if layout.is_empty() {
            *layout = Layout::new(flatten_names(stats)?);
        }
        let mut values = vec![0; layout.len()];
        if read_values(stats, &mut values) != layout.len() {
            // A different shape than the first sample: read it by name (never seen with
            // any torch release, but numbers must not shift silently if it happens).
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
}

/// Live CPU tensor storages seen by the dispatch mode: bytes and count, each with its
/// current value, its peak since the last reset, and what was ever allocated and freed.
pub struct CpuCounters {
    bytes: [AtomicI64; 4],
    count: [AtomicI64; 4],
}

const CURRENT: usize = 0;
const PEAK: usize = 1;
const ALLOCATED: usize = 2;
const FREED: usize = 3;

pub static CPU: CpuCounters = CpuCounters {
    bytes: [const { AtomicI64::new(0) }; 4],
    count: [const { AtomicI64::new(0) }; 4],
};

impl CpuCounters {
    pub fn allocated(&self, nbytes: i64) {
        bump(&self.bytes, nbytes);
        bump(&self.count, 1);
    }

    /// A storage that existed before tracking started: live from now on, but not counted
    /// as allocated (no line made it).
    pub fn adopted(&self, nbytes: i64) {
        for (stat, amount) in [(&self.bytes, nbytes), (&self.count, 1)] {
            let now = stat[CURRENT].fetch_add(amount, Relaxed) + amount;
            stat[PEAK].fetch_max(now, Relaxed);
        }
    }

    pub fn freed(&self, nbytes: i64) {
        for (stat, amount) in [(&self.bytes, nbytes), (&self.count, 1)] {
            stat[CURRENT].fetch_sub(amount, Relaxed);
            stat[FREED].fetch_add(amount, Relaxed);
        }
    }

    /// Current live bytes and storages (for tests and the tracker's own checks).
    pub fn live(&self) -> (i64, i64) {
        (
            self.bytes[CURRENT].load(Relaxed),
            self.count[CURRENT].load(Relaxed),
        )
    }

    fn reset_peaks(&self) {
        for stat in [&self.bytes, &self.count] {
            stat[PEAK].store(stat[CURRENT].load(Relaxed), Relaxed);
        }
    }

    /// Fill `out` in `Layout::cpu()` order: byte statistics first, then counts.
    fn read(&self, out: &mut [i64]) {
        let fields = |stat: &[AtomicI64; 4]| {
            [CURRENT, PEAK, ALLOCATED, FREED].map(|field| stat[field].load(Relaxed))
        };
        let (bytes, count) = (fields(&self.bytes), fields(&self.count));
        for (i, chunk) in out.chunks_mut(4).enumerate() {
            // allocated/active/reserved/requested bytes, then allocation/active/segment.
            chunk.copy_from_slice(if i < 4 { &bytes } else { &count });
        }
    }
}

fn bump(stat: &[AtomicI64; 4], amount: i64) {
    let now = stat[CURRENT].fetch_add(amount, Relaxed) + amount;
    stat[PEAK].fetch_max(now, Relaxed);
    stat[ALLOCATED].fetch_add(amount, Relaxed);
}
