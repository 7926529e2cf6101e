//! The doctor room's Python face, `_core.doctor`: each result checked and rendered from its
//! JSON text.

use pyo3::prelude::*;

use crate::results::py::submodule;

pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let _m = submodule(
        parent,
        "doctor",
        "The doctor's results (post-mortem, fragmentation, leaks) checked and rendered from their JSON text.",
    )?;
    Ok(())
}
