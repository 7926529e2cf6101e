//! The PyO3 entry points of the renderers: Python values in, a renderer called, text out.
//! Kept apart from `crate::render`, which knows nothing of Python.

pub mod estimate;
pub mod line_report;
pub mod monitor;
pub mod tensor_report;
pub mod test_memory;
pub mod trace;
pub mod tracker;
