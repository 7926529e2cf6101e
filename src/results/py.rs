//! What every room's binding shares: a refused document as a Python `ValueError`, and the
//! room's submodule of `_core`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::DataError;

impl From<DataError> for PyErr {
    fn from(e: DataError) -> PyErr {
        PyValueError::new_err(e.to_string())
    }
}

/// `_core.<name>`: a submodule of `parent` (the `_core` extension), also in `sys.modules` as `memlab_rs._core.<name>`
/// so that `import memlab_rs._core.<name>` (and stubtest) find it, as a package's would be.
pub fn submodule<'py>(parent: &Bound<'py, PyModule>, name: &str) -> PyResult<Bound<'py, PyModule>> {
    let py = parent.py();
    let module = PyModule::new(py, name)?;
    parent.add_submodule(&module)?;
    let full = format!("memlab_rs._core.{name}");
    module.setattr("__name__", &full)?;
    let modules = py.import("sys")?.getattr("modules")?;
    modules.cast_into::<PyDict>()?.set_item(full, &module)?;
    Ok(module)
}
