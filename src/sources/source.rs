//! Where a line's numbers come from: the torch caching allocator of one CUDA device, or our
//! own count of torch's CPU allocations (`crate::sources::cpu`: the allocator hook, or the
//! dispatch-mode fallback).
//!
//! A sample reads every statistic once. Peaks are "since the last reset", so after each
//! sample the source's peaks are reset to their current values, which is a no-op (and is
//! skipped) when no peak is above its current value.
//!
//! Here is a source's arithmetic (growth between samples, the peaks' reset mirrored in the
//! sample, what it says about its numbers); its reads, which call torch's binding or the CPU
//! source's glue, are `sources::py`'s (`Source::new`, `sample`, `reset_peaks`, `validate`).

pub use super::cuda::stats::{READER_BINDING, READER_DIRECT};

use super::cuda::py::CudaSource;
use super::layout::{Layout, StatKind};
use crate::sources::cpu::{self, Mode};

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
    pub(super) cuda: Option<CudaSource>,
    /// How CPU memory is counted (a CPU source holds one start of the CPU source
    /// (`cpu::py::lifecycle::start`), undone on drop).
    pub(super) cpu: Option<Mode>,
}

impl Source {
    /// A source of `device` reading into `layout` (through `cuda`, or the CPU counters as
    /// `cpu` says), before its first sample. `sources::py`'s `Source::new` starts it.
    pub(super) fn assemble(
        device: Device,
        layout: Layout,
        cuda: Option<CudaSource>,
        cpu: Option<Mode>,
    ) -> Self {
        let n = layout.len();
        Self {
            device,
            layout,
            current: vec![0; n],
            growth: vec![0; n],
            previous: vec![0; n],
            primed: false,
            cuda,
            cpu,
        }
    }

    /// After a read into `current`: how much each `Delta` statistic grew since the sample
    /// before (`sources::py`'s `Source::sample` reads). The first sample after (re)priming
    /// only sets the baseline.
    pub(super) fn account(&mut self) {
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
    }

    /// The layout was just learned (a CUDA source's first real sample): the vectors sized
    /// by it grow, filled with the zeros they would have read.
    pub(super) fn resize_to_current(&mut self) {
        if self.previous.len() != self.current.len() {
            self.growth = vec![0; self.current.len()];
            self.previous = vec![0; self.current.len()];
        }
    }

    /// Set every peak of the sample to its current value, as the reset that follows does at
    /// the source (`sources::py`'s `Source::reset_peaks`); false, changing nothing, when no
    /// peak is above its current value (the reset is skipped then).
    pub(super) fn mirror_peak_reset(&mut self) -> bool {
        let needed = self
            .layout
            .pairs
            .iter()
            .any(|&(peak, current)| self.current[peak] > self.current[current]);
        if !needed {
            return false;
        }
        for &(peak, current) in &self.layout.pairs {
            self.current[peak] = self.current[current];
        }
        true
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
}
