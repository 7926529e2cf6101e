//! Loops that hold the GIL and call into Python once per item (the reporter's and the
//! tracker's reads of every tensor, the monitor's of every gradient and saved tensor) stay
//! interruptible: what a Python signal handler raises (Ctrl-C's KeyboardInterrupt, the
//! usual SIGALRM timeout) reaches the caller, at once, never swallowed.
//!
//! The interpreter runs Python signal handlers at its checkpoints only: between bytecodes,
//! and wherever C code calls `PyErr_CheckSignals` (`str()` and `repr()` of any object do).
//! A handler's exception then comes out as the error of whatever call we were making, and a
//! loop that takes a failed read for "unknown" (a tensor that cannot say its size) swallowed
//! it: the caller never saw its timeout, and pyo3's `Display`, which formatted a type name,
//! printed "Exception ignored in: 'Tensor'". So:
//! - `Interruptible::check` between two items runs the handlers of the signals that arrived
//!   meanwhile and returns their exception;
//! - `Interruptible::item` sorts the error of one item's read: it is the item's (None, and
//!   the loop goes on) unless it interrupts: an exception that is not an `Exception`
//!   (KeyboardInterrupt, SystemExit), a MemoryError, or one whose traceback runs through a
//!   Python signal handler installed now;
//! - text comes out of Python strings by extraction, never through `Display` (which swallows).

use pyo3::exceptions::{PyException, PyMemoryError};
use pyo3::intern;
use pyo3::prelude::*;

/// One loop's view of the signal handlers (looked up once, at the first error that needs
/// them, and kept for the rest of the loop).
#[derive(Default)]
pub struct Interruptible {
    handler_codes: Option<Vec<Py<PyAny>>>,
}

impl Interruptible {
    pub fn new() -> Self {
        Self::default()
    }

    /// Between two items: run the handlers of the signals that arrived since the last
    /// checkpoint, as the interpreter would between bytecodes; Err is what one raised. A
    /// load of one flag when none arrived (and nothing at all off the main thread).
    pub fn check(&self, py: Python<'_>) -> PyResult<()> {
        py.check_signals()
    }

    /// The value of one item's read; None when the read failed for a reason of the item's
    /// own (the loop reports it as unknown and goes on); Err when the failure interrupts
    /// the whole loop.
    pub fn item<T>(&mut self, py: Python<'_>, read: PyResult<T>) -> PyResult<Option<T>> {
        match read {
            Ok(value) => Ok(Some(value)),
            Err(error) if self.interrupts(py, &error) => Err(error),
            Err(_) => Ok(None),
        }
    }

    /// Whether `error` is not about the item read: see the module docs.
    pub fn interrupts(&mut self, py: Python<'_>, error: &PyErr) -> bool {
        if !error.is_instance_of::<PyException>(py) || error.is_instance_of::<PyMemoryError>(py) {
            return true;
        }
        let Some(traceback) = error.traceback(py) else {
            return false; // raised by C code alone: no Python handler ran on its way
        };
        let codes = traceback_codes(traceback.into_any());
        if codes.is_empty() {
            return false;
        }
        let handlers = self
            .handler_codes
            .get_or_insert_with(|| handler_codes(py).unwrap_or_default());
        codes
            .iter()
            .any(|code| handlers.iter().any(|handler| handler.bind(py).is(code)))
    }
}

/// `str(object)` as a Rust string. Not `to_string()`: pyo3's `Display` swallows an error,
/// a signal handler's among them, into "Exception ignored in: ..." on stderr.
pub fn text(object: &Bound<'_, PyAny>) -> PyResult<String> {
    object.str()?.extract()
}

/// The code object of every frame a traceback passes through.
fn traceback_codes(traceback: Bound<'_, PyAny>) -> Vec<Bound<'_, PyAny>> {
    let py = traceback.py();
    let mut codes = Vec::new();
    let mut at = Some(traceback);
    // Bounded: a traceback is finite, but nothing here may loop on a corrupt one.
    for _ in 0..10_000 {
        let Some(entry) = at.take().filter(|tb| !tb.is_none()) else {
            break;
        };
        if let Ok(code) = entry
            .getattr(intern!(py, "tb_frame"))
            .and_then(|frame| frame.getattr(intern!(py, "f_code")))
        {
            codes.push(code);
        }
        at = entry.getattr(intern!(py, "tb_next")).ok();
    }
    codes
}

/// The code objects of the Python signal handlers installed now (functions, methods,
/// `functools.partial`s of them, objects with a Python `__call__`).
fn handler_codes(py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
    let signal = py.import("signal")?;
    let mut codes: Vec<Py<PyAny>> = Vec::new();
    for signum in signal.call_method0("valid_signals")?.try_iter()? {
        let handler = signal.call_method1("getsignal", (signum?,))?;
        if let Some(code) = code_of(&handler) {
            if !codes.iter().any(|known| known.bind(py).is(&code)) {
                codes.push(code.unbind());
            }
        }
    }
    Ok(codes)
}

/// The code a Python callable runs first, if it runs Python code.
fn code_of<'py>(callable: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let py = callable.py();
    let mut at = callable.clone();
    // A few steps: a partial of a bound method of an object with a `__call__`, say.
    for _ in 0..8 {
        if !at.is_callable() {
            return None; // SIG_DFL, SIG_IGN, None (a handler not installed from Python)
        }
        if let Ok(code) = at.getattr(intern!(py, "__code__")) {
            return Some(code);
        }
        at = if let Ok(function) = at.getattr(intern!(py, "__func__")) {
            function // a bound method
        } else if let Ok(function) = at.getattr(intern!(py, "func")) {
            function // functools.partial
        } else if at.is_instance_of::<pyo3::types::PyType>() {
            return None; // a class: calling it makes an instance, not a handler's frame
        } else {
            // An object with `__call__`; a builtin's is a slot wrapper without code.
            at.get_type().getattr(intern!(py, "__call__")).ok()?
        };
    }
    None
}

/// For the Python glue that takes a failed read for "unknown" (`except Exception`):
/// whether `error` interrupts instead and must be re-raised (the same sorting as
/// `Interruptible::item`).
#[pyfunction]
pub fn _interrupts(error: Bound<'_, pyo3::exceptions::PyBaseException>) -> bool {
    let py = error.py();
    Interruptible::new().interrupts(py, &PyErr::from_value(error.into_any()))
}
