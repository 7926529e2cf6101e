//! The sources floor's Python side for what is not one source's: the CUDA driver's view
//! (`driver`) as `_core` functions, and a `Source`'s reads that call torch or the CPU
//! source's glue (`source` keeps its arithmetic: growth, peaks, notices).

use pyo3::prelude::*;

use super::driver;

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
