//! Renderers: plain results in, text out; none of them collects or binds to Python (the
//! PyO3 entry points are in `crate::bindings`). One folder per kind of result, one file per
//! format.

pub mod estimate;
pub mod line_report;
pub mod monitor;
pub mod tensor_report;
pub mod test_memory;
pub mod trace;
pub mod tracker;
