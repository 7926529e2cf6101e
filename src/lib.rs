//! memlab_rs._core: the Rust core of memlab_rs. This file only registers what the
//! capability modules define.

pub mod allocator;
pub mod courtesy;
pub mod doctor;
pub mod estimate;
pub mod gc_walk;
pub mod interrupts;
pub mod line_profiler;
pub mod monitor;
pub mod results;
pub mod sources;
pub mod tensor_report;
pub mod test_memory;
pub mod text;
pub mod trace;
pub mod tracker;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The one source of the version: Cargo.toml (pyproject.toml takes it from there too).
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(text::py::readable_size, m)?)?;
    m.add_function(wrap_pyfunction!(text::py::parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(sources::py::driver_device_memory, m)?)?;
    m.add_function(wrap_pyfunction!(sources::py::driver_available, m)?)?;
    m.add_function(wrap_pyfunction!(gc_walk::tracked_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(gc_walk::_instances_of, m)?)?;
    m.add_function(wrap_pyfunction!(gc_walk::collections::_gc_watch_state, m)?)?;
    let gc_callback = wrap_pyfunction!(gc_walk::collections::_gc_callback, m)?;
    m.add_function(gc_callback.clone())?;
    // Watch collections from now on: a walk must know whether one is running.
    gc_walk::collections::install(m.py(), gc_callback.into_any())?;
    m.add_function(wrap_pyfunction!(results::py::check_result_json, m)?)?;
    m.add_function(wrap_pyfunction!(interrupts::_interrupts, m)?)?;
    use sources::cpu;
    m.add("_CPU_PROBE_BYTES", cpu::PROBE_BYTES)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_allocated, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_freed, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_adopted, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_live, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_set_cpu_glue, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_table_has, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_adopted_gone, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_mode, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_hook_slots, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_hook_slot_addresses, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_start, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_stop, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::_cpu_stats, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::trace::_cpu_trace_start, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::trace::_cpu_trace_stop, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::trace::_cpu_trace_set_tag, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::trace::_cpu_trace_active, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::py::trace::_cpu_trace_mark, m)?)?;
    cpu::py::trace::register_fork_handler(m.py())?;
    m.add_function(wrap_pyfunction!(
        sources::cuda::py::_cuda_direct_why_not,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(sources::cuda::py::_cuda_direct_notice, m)?)?;
    m.add_function(wrap_pyfunction!(sources::cuda::py::_cuda_direct_checks, m)?)?;
    line_profiler::py::register(m)?;
    courtesy::py::register(m)?;
    doctor::py::register(m)?;
    estimate::py::register(m)?;
    monitor::py::register(m)?;
    test_memory::py::register(m)?;
    trace::py::register(m)?;
    tensor_report::py::register(m)?;
    tracker::py::register(m)?;
    Ok(())
}
