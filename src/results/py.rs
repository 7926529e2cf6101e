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

/// `_core.<name>`, documented by `doc`: a submodule of `parent` (the `_core` extension), also in `sys.modules` as `memlab_rs._core.<name>`
/// so that `import memlab_rs._core.<name>` (and stubtest) find it, as a package's would be.
pub fn submodule<'py>(
    parent: &Bound<'py, PyModule>,
    name: &str,
    doc: &str,
) -> PyResult<Bound<'py, PyModule>> {
    let py = parent.py();
    let module = PyModule::new(py, name)?;
    module.setattr("__doc__", doc)?;
    parent.add_submodule(&module)?;
    let full = format!("memlab_rs._core.{name}");
    module.setattr("__name__", &full)?;
    let modules = py.import("sys")?.getattr("modules")?;
    modules.cast_into::<PyDict>()?.set_item(full, &module)?;
    Ok(module)
}

/// A ValueError unless `view` (the JSON of a render's view options) is empty: for a kind
/// whose renderings take no options.
pub fn no_view(view: &str, what: &str) -> PyResult<()> {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(view) {
        Ok(options) if options.is_empty() => Ok(()),
        Ok(options) => {
            let names: Vec<&str> = options.keys().map(String::as_str).collect();
            Err(PyValueError::new_err(format!(
                "{what} takes no view options, got {}",
                names.join(", ")
            )))
        }
        Err(e) => Err(PyValueError::new_err(format!(
            "the view must be a JSON object: {e}"
        ))),
    }
}
