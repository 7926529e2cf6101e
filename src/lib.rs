//! memlab_rs._core: the Rust core of memlab_rs. This file only registers what the
//! capability modules define.

pub mod render;
pub mod reporter;
pub mod size;
pub mod stats;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(size::readable_size, m)?)?;
    m.add_function(wrap_pyfunction!(stats::driver::driver_device_memory, m)?)?;
    m.add_function(wrap_pyfunction!(stats::driver::driver_available, m)?)?;
    m.add_function(wrap_pyfunction!(reporter::collect_report, m)?)?;
    m.add_function(wrap_pyfunction!(reporter::tracked_tensors, m)?)?;
    m.add_class::<reporter::ReportTable>()?;
    Ok(())
}
