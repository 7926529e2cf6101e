//! Where a line's numbers come from: the torch caching allocator of one CUDA device, or our
//! own count of CPU tensor storages (fed by the dispatch mode in `memlab_rs._cpu_source`).
//!
//! A sample reads every statistic once. Peaks are "since the last reset", so after each
//! sample the source's peaks are reset to their current values, which is a no-op (and is
//! skipped) when no peak is above its current value.

mod cuda;

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use pyo3::prelude::*;

pub use cuda::{READER_BINDING, READER_DIRECT};

use super::layout::{Layout, StatKind};

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
    cuda: Option<cuda::CudaSource>,
}

impl Source {
    pub fn new(py: Python<'_>, device: Device) -> PyResult<Self> {
        let (layout, cuda) = match device {
            Device::Cpu => (Layout::cpu(), None),
            // Until CUDA is initialised the allocator holds nothing and the names are
            // unknown: the layout is learned from the first real sample, and every vector
            // sized by it grows then, filled with the zeros it would have read.
            Device::Cuda(index) => (Layout::default(), Some(cuda::CudaSource::new(py, index)?)),
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
        match &mut self.cuda {
            None => CPU.read(&mut self.current),
            Some(cuda) => {
                cuda.read(py, &mut self.layout, &mut self.current)?;
                if self.previous.len() != self.current.len() {
                    // The layout was just learned.
                    self.growth = vec![0; self.current.len()];
                    self.previous = vec![0; self.current.len()];
                }
            }
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
        match &self.cuda {
            None => CPU.reset_peaks(),
            Some(cuda) => cuda.reset_peaks(py)?,
        }
        Ok(())
    }

    /// How this source reads its statistics.
    pub fn reader(&self) -> &'static str {
        match &self.cuda {
            Some(cuda) => cuda.reader(),
            None => "storage counts",
        }
    }

    /// Check a CUDA source's direct reader against torch's binding now, and read through
    /// the binding for good if they differ (see `cuda_direct`). The engine calls it at
    /// `enable()` and `disable()`; a source checks by itself when it starts using the
    /// reader and on a schedule. It changes no sample; nothing to do for CPU or a source
    /// on the binding.
    pub fn validate(&mut self, py: Python<'_>) -> PyResult<()> {
        match &mut self.cuda {
            Some(cuda) => cuda.validate(py, &self.layout, &self.current),
            None => Ok(()),
        }
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
