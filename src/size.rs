//! Byte sizes as text: pytorch_memlab's compact form ("4.00M") and a human form ("4.0 MiB").
//!
//! pytorch_memlab formats sizes with `'{:.2f}'.format(calmsize.size(n))`: the largest
//! 1024-based unit that fits the absolute value, two decimals, no space. We reproduce that
//! exactly, including its quirks (`1024.00K` for 1048575 bytes, `infP`), because users diff
//! our output against theirs.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt};

const UNITS: [(f64, &str); 6] = [
    (1125899906842624.0, "P"),
    (1099511627776.0, "T"),
    (1073741824.0, "G"),
    (1048576.0, "M"),
    (1024.0, "K"),
    (1.0, "B"),
];

/// pytorch_memlab's size string for a number of bytes ("" for NaN).
pub fn memlab_size(num_bytes: f64) -> String {
    if num_bytes.is_nan() {
        return String::new();
    }
    let magnitude = num_bytes.abs();
    let (factor, unit) = UNITS
        .iter()
        .find(|(factor, _)| magnitude >= *factor)
        .copied()
        .unwrap_or((1.0, "B"));
    let sign = if num_bytes >= 0.0 { 1.0 } else { -1.0 };
    // Rust and Python both round the exact binary value half-to-even here.
    format!("{:.2}{}", magnitude / factor * sign, unit)
}

/// `memlab_size` for byte counts we hold as integers.
pub fn memlab_bytes(num_bytes: i128) -> String {
    // `as f64` rounds to nearest like Python's int -> float, and dividing by a power of two
    // is exact, so this equals Python's `int / int` true division.
    memlab_size(num_bytes as f64)
}

/// A human form with IEC units ("4.0 MiB"), for HTML and summaries.
pub fn human_bytes(num_bytes: i128) -> String {
    let text = bytesize::ByteSize(num_bytes.unsigned_abs() as u64)
        .display()
        .iec()
        .to_string();
    if num_bytes < 0 {
        format!("-{text}")
    } else {
        text
    }
}

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
    let type_name = num_bytes.get_type().name()?.to_string();
    if type_name.starts_with("Sym") {
        return Ok(num_bytes.str()?.to_string());
    }
    match num_bytes.extract::<f64>() {
        Ok(value) => Ok(memlab_size(value)),
        Err(_) => Err(PyTypeError::new_err(format!(
            "readable_size() expects a number of bytes (an int or a float), got {type_name}; \
             pass e.g. tensor.untyped_storage().nbytes()"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_pytorch_memlab_strings() {
        assert_eq!(memlab_size(0.0), "0.00B");
        assert_eq!(memlab_size(512.0), "512.00B");
        assert_eq!(memlab_size(1024.0), "1.00K");
        assert_eq!(memlab_size(1048575.0), "1024.00K");
        assert_eq!(memlab_size(4194304.0), "4.00M");
        assert_eq!(memlab_size(-2048.0), "-2.00K");
        assert_eq!(memlab_size(f64::NAN), "");
        assert_eq!(memlab_size(1152.0), "1.12K"); // 1.125: a tie, rounded half to even
        assert_eq!(memlab_bytes(1 << 60), "1024.00P");
    }

    #[test]
    fn human_form_uses_iec_units() {
        assert_eq!(human_bytes(4 * 1024 * 1024), "4.0 MiB");
        assert_eq!(human_bytes(-1536), "-1.5 KiB");
    }
}
