//! The results floor's Python side: what every room's binding shares (a refused document as
//! a Python `ValueError`, the room's submodule of `_core`) and `check_result_json`, the
//! check of a result file's text (`check`) for Python.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::check::check;
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

/// Check a result file's JSON text (UTF-8 bytes) before parsing it: a ValueError saying
/// what no result holds (nesting past 64 levels, a number of more than 32 characters, NaN,
/// Infinity, an infinite float) and at which byte.
#[pyfunction]
pub fn check_result_json(py: Python<'_>, text: &[u8]) -> PyResult<()> {
    // `text` borrows an immutable `bytes` object the caller holds for the whole call, so
    // it is read without the GIL (a 100 MB trace result takes about 0.1 s).
    py.detach(|| check(text))
        .map_err(|refusal| PyValueError::new_err(refusal.describe()))
}
