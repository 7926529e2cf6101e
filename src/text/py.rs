//! The text floor's Python side: `readable_size` and `parse_size` as `_core` functions, the
//! Python values they take (ints, floats, strings, NumPy scalars, `torch.SymInt`) sorted
//! here so that `size` stays plain Rust.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

use super::size::{memlab_size, parse_bytes, SIZE_FORMS};
use crate::interrupts::text;

/// Format a byte count exactly as pytorch_memlab's `readable_size` does.
///
/// Integers and floats (and anything with `__float__`, such as NumPy scalars) give
/// `'4.00M'`-style strings, NaN gives `''`, and a symbolic size (`torch.SymInt`) gives its
/// `str()` so that tracing with symbolic shapes does not force a guard.
///
/// >>> from memlab_rs import readable_size
/// >>> readable_size(4 * 1024 * 1024)
/// '4.00M'
#[pyfunction]
pub fn readable_size(num_bytes: &Bound<'_, PyAny>) -> PyResult<String> {
    if num_bytes.is_instance_of::<PyInt>() || num_bytes.is_instance_of::<PyFloat>() {
        return Ok(memlab_size(num_bytes.extract::<f64>()?));
    }
    // Extracted, not `to_string()`: pyo3's Display swallows errors (a signal handler's).
    let type_name: String = num_bytes.get_type().name()?.extract()?;
    if type_name.starts_with("Sym") {
        return text(num_bytes);
    }
    match num_bytes.extract::<f64>() {
        Ok(value) => Ok(memlab_size(value)),
        Err(_) => Err(PyTypeError::new_err(format!(
            "readable_size() expects a number of bytes (an int or a float), got {type_name}; \
             pass e.g. tensor.untyped_storage().nbytes()"
        ))),
    }
}

/// The number of bytes in a size: a string such as `"512 MB"` (512,000,000), `"1.5GiB"`
/// (1,610,612,736), `"16M"` (16 MiB, as `readable_size` writes it) or `"1048576"` (a bare
/// number is bytes), parsed exactly, or an int of bytes (or any integer, such as
/// `numpy.int64`). Units are B, KB, MB, GB, TB, PB, EB (powers of 1000) and KiB, MiB, GiB,
/// TiB, PiB, EiB with K, M, G, T, P, E (powers of 1024), in any case, with or without a
/// space: every size memlab_rs takes (pytest limits, `memlab-rs diff --fail-over`, budgets)
/// means the same.
///
/// A malformed size raises ValueError (empty, negative, an unknown unit, not a whole number
/// of bytes, more than 2**64 - 1); a value that is neither a string nor an int (a float, a
/// bool, None), TypeError. Only the bare letters, `readable_size`'s rounded form, are taken
/// to the nearest byte (`"1.01K"` is 1034 bytes).
///
/// >>> from memlab_rs import parse_size, readable_size
/// >>> parse_size("512 MB"), parse_size("1.5GiB"), parse_size("16M")
/// (512000000, 1610612736, 16777216)
/// >>> parse_size(readable_size(4 << 20))
/// 4194304
/// >>> parse_size(4096)
/// 4096
#[pyfunction]
pub fn parse_size(size: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(text) = size.cast::<PyString>() {
        // Lossy: a lone surrogate is then simply not a number or a unit, not an encoding error.
        let text = text.to_string_lossy();
        let text = text.as_ref();
        return parse_bytes(text).map_err(|why| {
            PyValueError::new_err(format!("{text:?} is not a size: {why}; give {SIZE_FORMS}"))
        });
    }
    let type_name: String = size.get_type().name()?.extract()?;
    let integer = if size.is_instance_of::<PyBool>() || size.is_instance_of::<PyFloat>() {
        None
    } else {
        // An int, or anything with __index__ (numpy.int64 from arithmetic on shapes).
        let index = size.py().import("operator")?.getattr("index")?;
        index
            .call1((size,))
            .ok()
            .filter(|n| n.is_instance_of::<PyInt>())
    };
    let Some(n) = integer else {
        let hint = if size.is_instance_of::<PyFloat>() {
            " (round a computed size with int())"
        } else {
            ""
        };
        return Err(PyTypeError::new_err(format!(
            "a size must be a string or an int of bytes, not {type_name} ({}); give \
             {SIZE_FORMS}{hint}",
            size.repr()?.extract::<String>()?
        )));
    };
    match n.extract::<i128>() {
        Ok(n) if n < 0 => Err(PyValueError::new_err(format!(
            "{n} is not a size: a size cannot be negative"
        ))),
        Ok(n) => u64::try_from(n).map_err(|_| {
            PyValueError::new_err(format!("{n} is not a size: more than {} bytes", u64::MAX))
        }),
        // Beyond i128: say how big rather than print hundreds of digits.
        Err(_) if n.lt(0)? => Err(PyValueError::new_err(
            "a negative int is not a size: a size cannot be negative",
        )),
        Err(_) => Err(PyValueError::new_err(format!(
            "an int of {} bits is not a size: more than {} bytes",
            n.call_method0("bit_length")?.extract::<u64>()?,
            u64::MAX
        ))),
    }
}
