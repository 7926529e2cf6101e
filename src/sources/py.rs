//! The sources floor's Python side for what is not one source's: the CUDA driver's view
//! (`driver`) as `_core` functions, and a `Source`'s reads that call torch or the CPU
//! source's glue (`source` keeps its arithmetic: growth, peaks, notices).

use pyo3::prelude::*;

use super::cpu::{self, COUNTERS};
use super::cuda::py::CudaSource;
use super::driver;
use super::layout::Layout;
use super::source::{Device, Source};

/// Memory in use on a CUDA device by every process, as the driver (and nvidia-smi) sees it.
///
/// Returns `(used_bytes, total_bytes)`, or None when there is no CUDA driver or the device
/// has no active context yet (this never creates one).
///
/// >>> from memlab_rs._core import driver_device_memory
/// >>> driver_device_memory(0) is None or driver_device_memory(0)[1] > 0
/// True
#[pyfunction]
pub fn driver_device_memory(ordinal: i32) -> Option<(u64, u64)> {
    driver::device_memory(ordinal)
}

/// Whether the CUDA driver library could be loaded on this machine.
///
/// >>> from memlab_rs._core import driver_available
/// >>> isinstance(driver_available(), bool)
/// True
#[pyfunction]
pub fn driver_available() -> bool {
    driver::driver_present()
}

/// A source's reads: torch's binding for CUDA (`CudaSource`), the CPU source's start and
/// stop, which call its torch glue. What a read changes is `source`'s arithmetic.
impl Source {
    pub fn new(py: Python<'_>, device: Device) -> PyResult<Self> {
        let (layout, cuda, cpu) = match device {
            Device::Cpu => (Layout::cpu(), None, Some(cpu::py::lifecycle::start(py)?)),
            // Until CUDA is initialised the allocator holds nothing and the names are
            // unknown: the layout is learned from the first real sample, and every vector
            // sized by it grows then, filled with the zeros it would have read.
            Device::Cuda(index) => (Layout::default(), Some(CudaSource::new(py, index)?), None),
        };
        Ok(Self::assemble(device, layout, cuda, cpu))
    }

    /// Read every statistic. The first sample after (re)priming only sets the baseline.
    pub fn sample(&mut self, py: Python<'_>) -> PyResult<()> {
        match &mut self.cuda {
            None => COUNTERS.read(&mut self.current),
            Some(cuda) => {
                cuda.read(py, &mut self.layout, &mut self.current)?;
                self.resize_to_current();
            }
        }
        self.account();
        Ok(())
    }

    /// Set every peak to its current value, so the next sample's peaks cover only what
    /// happens from now on. Skipped when it would change nothing.
    pub fn reset_peaks(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.mirror_peak_reset() {
            return Ok(());
        }
        match &self.cuda {
            None => COUNTERS.reset_peaks(),
            Some(cuda) => cuda.reset_peaks(py)?,
        }
        Ok(())
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
            Python::attach(cpu::py::lifecycle::stop);
        }
    }
}
