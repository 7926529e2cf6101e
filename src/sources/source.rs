//! Where a line's numbers come from: the torch caching allocator of one CUDA device, or our
//! own count of torch's CPU allocations (`crate::sources::cpu`: the allocator hook, or the
//! dispatch-mode fallback).
//!
//! A sample reads every statistic once. Peaks are "since the last reset", so after each
//! sample the source's peaks are reset to their current values, which is a no-op (and is
//! skipped) when no peak is above its current value.

use pyo3::prelude::*;

pub use super::cuda::stats::{READER_BINDING, READER_DIRECT};

use super::layout::{Layout, StatKind};
use crate::sources::cpu::{self, Mode, COUNTERS};

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
    cuda: Option<super::cuda::stats::CudaSource>,
    /// How CPU memory is counted (a CPU source holds one `cpu::start`, undone on drop).
    cpu: Option<Mode>,
}

impl Source {
    pub fn new(py: Python<'_>, device: Device) -> PyResult<Self> {
        let (layout, cuda, cpu) = match device {
            Device::Cpu => (Layout::cpu(), None, Some(cpu::start(py)?)),
            // Until CUDA is initialised the allocator holds nothing and the names are
            // unknown: the layout is learned from the first real sample, and every vector
            // sized by it grows then, filled with the zeros it would have read.
            Device::Cuda(index) => (
                Layout::default(),
                Some(super::cuda::stats::CudaSource::new(py, index)?),
                None,
            ),
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
            cpu,
        })
    }

    /// Read every statistic. The first sample after (re)priming only sets the baseline.
    pub fn sample(&mut self, py: Python<'_>) -> PyResult<()> {
        match &mut self.cuda {
            None => COUNTERS.read(&mut self.current),
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
            None => COUNTERS.reset_peaks(),
            Some(cuda) => cuda.reset_peaks(py)?,
        }
        Ok(())
    }

    /// How this source reads its statistics.
    pub fn reader(&self) -> &'static str {
        match &self.cuda {
            Some(cuda) => cuda.reader(),
            None => match self.cpu {
                Some(Mode::Dispatch(_)) => "dispatch mode",
                _ => "allocator hook",
            },
        }
    }

    /// Whether CPU memory is counted by the dispatch-mode fallback (which needs the engine
    /// to start and stop it per thread).
    pub fn cpu_dispatch(&self) -> bool {
        matches!(self.cpu, Some(Mode::Dispatch(_)))
    }

    /// What a report read from this source must say about its numbers: the CPU fallback and
    /// why it was taken, or the allocator hook replaced by another tool.
    pub fn notice(&self) -> Option<String> {
        match &self.cpu {
            Some(Mode::Dispatch(why)) => Some(format!(
                "CPU memory was counted by the dispatch-mode fallback ({why}): it sees \
                 operator outputs on threads running profiled code only, and misses out=, \
                 resize_, deserialised tensors, other threads' allocations and temporaries \
                 inside operators."
            )),
            Some(Mode::Allocator) if cpu::displaced() => Some(
                "Another tool replaced memlab_rs's hook on torch's CPU allocator while \
                 profiling: CPU allocations after that point are not counted."
                    .to_string(),
            ),
            _ => None,
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

impl Drop for Source {
    fn drop(&mut self) {
        if self.cpu.is_some() {
            // Sources are dropped by the engine, which runs with the GIL held.
            Python::attach(cpu::stop);
        }
    }
}
