//! The CPU source's lifecycle, which calls its torch glue: `start` (the first installs the
//! hook, checks it with a probe tensor and adopts the storages alive then, from one gc
//! walk) and `stop`, under the lifecycle lock, waited for with the GIL released. The glue
//! (`Glue`) is what `memlab_rs._sources.cpu_source` registers. Writing the slots, the
//! counting and putting everything back are the plain hook's (`cpu`: `hook`, `uninstall`,
//! `release`).

use std::cell::Cell;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{OnceLock, TryLockError};

use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::prelude::*;

use crate::sources::cpu::{
    got, hook, info, ours, release, table, uninstall, Installed, LifecycleGuard, Mode, FALLBACK,
    IN_LIFECYCLE, LIFECYCLE,
};

/// The Python side: torch's CPU allocator library, a probe, the live storages, and the
/// fallback's reset (registered by `memlab_rs._sources.cpu_source`).
pub(super) struct Glue {
    pub(super) library: Option<String>,
    probe: Py<PyAny>,
    baseline: Py<PyAny>,
    forget: Py<PyAny>,
}

/// The Python module that hands the CPU source its torch glue when imported.
const GLUE_MODULE: &str = "memlab_rs._sources.cpu_source";

pub(super) static GLUE: OnceLock<Glue> = OnceLock::new();

/// Take the lifecycle lock; while another thread holds it, wait with the GIL released.
fn lifecycle(py: Python<'_>) -> PyResult<LifecycleGuard> {
    if IN_LIFECYCLE.with(Cell::get) {
        return Err(PyRuntimeError::new_err(
            "CPU memory tracking cannot start or stop from code that starting it runs (a \
             finaliser during its walk over live tensors); do it once that code has returned",
        ));
    }
    let guard = loop {
        match LIFECYCLE.try_lock() {
            Ok(guard) => break guard,
            Err(TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => py.detach(|| drop(LIFECYCLE.lock())),
        }
    };
    IN_LIFECYCLE.with(|inside| inside.set(true));
    Ok(LifecycleGuard(guard))
}

/// Register the Python side (once, by `memlab_rs._sources.cpu_source`).
pub fn set_glue(library: Option<String>, probe: Py<PyAny>, baseline: Py<PyAny>, forget: Py<PyAny>) {
    let _ = GLUE.set(Glue {
        library,
        probe,
        baseline,
        forget,
    });
}

/// Start counting CPU memory (a reader starts using it). The first start installs the hook
/// (or picks the fallback), zeroes the counters and adopts the storages alive now; later
/// ones share it. Every successful `start` is paired with one `stop`.
pub fn start(py: Python<'_>) -> PyResult<Mode> {
    let mut life = lifecycle(py)?;
    if life.0.users > 0 {
        if let Some(mode) = info().mode.clone() {
            life.0.users += 1;
            return Ok(mode);
        }
    }
    // The glue registers itself when its module is imported; `import memlab_rs` is lazy, so
    // the first reader (a monitor, a report) may come before any module that imports it.
    if GLUE.get().is_none() {
        py.import(GLUE_MODULE)?;
    }
    let glue = GLUE.get().ok_or_else(|| {
        PyRuntimeError::new_err(format!(
            "{GLUE_MODULE} was imported but gave the CPU source no torch glue"
        ))
    })?;
    // An earlier session's Python side goes before anything counts: the fallback's live
    // table and both kinds of weak references (see "Sessions" in `cpu`'s notes).
    glue.forget.call0(py)?;
    let mode = match install(py, glue)? {
        Ok(installed) => {
            // The hook counts from here; what was alive already is adopted once.
            if let Err(error) = adopt_baseline(py, glue) {
                uninstall(installed);
                return Err(error);
            }
            info().patched = installed.patched.iter().map(|(slot, _)| *slot).collect();
            life.0.installed = Some(installed);
            Mode::Allocator
        }
        Err(why) => {
            let mut table = table::lock();
            table::reset(&mut table);
            *table = None;
            Mode::Dispatch(why)
        }
    };
    life.0.users = 1;
    FALLBACK.store(matches!(mode, Mode::Dispatch(_)), Relaxed);
    info().mode = Some(mode.clone());
    Ok(mode)
}

/// Stop counting for one reader; the last one takes the hook out.
pub fn stop(py: Python<'_>) {
    let Ok(life) = lifecycle(py) else {
        return; // called from inside a start: that start has not counted this user yet
    };
    release(life);
}

/// `stop` in a forked child, which must never wait: a lifecycle lock held at the fork
/// belongs to a thread the child does not have (then this user is never released there).
pub fn stop_in_forked_child(_py: Python<'_>) {
    match LIFECYCLE.try_lock() {
        Ok(guard) => release(LifecycleGuard(guard)),
        Err(TryLockError::Poisoned(poisoned)) => release(LifecycleGuard(poisoned.into_inner())),
        Err(TryLockError::WouldBlock) => {}
    }
}

/// Install the hook and check it with the probe. Ok(Err(why)): the hook cannot be used
/// here (the fallback counts, and says why); Err: the probe raised something that is not an
/// error of the probe (KeyboardInterrupt, SystemExit), the caller's to see.
fn install(py: Python<'_>, glue: &Glue) -> PyResult<Result<Installed, String>> {
    let mut attempts = 0;
    let (installed, probed) = loop {
        let installed = match hook(glue.library.as_deref()) {
            Ok(installed) => installed,
            Err(why) => return Ok(Err(why)),
        };
        let probed = glue.probe.call0(py).and_then(|ok| ok.extract::<bool>(py));
        attempts += 1;
        // A thread that entered a lazy-binding stub before our write finishes binding after
        // it, and writes the slot back: only once, since we never put a stub back. Again.
        // SAFETY: slots of a loaded library, found by `hook`.
        let lost = installed
            .patched
            .iter()
            .any(|(slot, _)| unsafe { got::read(slot) } != ours(slot.name));
        if matches!(probed, Ok(false)) && lost && attempts < 3 {
            uninstall(installed);
            continue;
        }
        break (installed, probed);
    };
    if !matches!(probed, Ok(true)) {
        uninstall(installed);
        return match probed {
            Err(error) if !error.is_instance_of::<PyException>(py) => Err(error),
            Err(error) => Ok(Err(format!("the probe allocation failed: {error}"))),
            _ => Ok(Err(
                "a probe tensor allocated by torch did not reach libc10's posix_memalign"
                    .to_string(),
            )),
        };
    }
    {
        let mut table = table::lock();
        table::reset(&mut table);
    }
    Ok(Ok(installed))
}

/// Adopt the storages alive now (one walk): `baseline()` returns the (address, bytes) pairs
/// and the storages themselves, held until they are in the table so none is freed between.
fn adopt_baseline(py: Python<'_>, glue: &Glue) -> PyResult<()> {
    let (pairs, _alive): (Vec<(usize, i64)>, Py<PyAny>) = glue.baseline.call0(py)?.extract(py)?;
    let mut table = table::lock();
    if let Some(table) = table.as_mut() {
        for (address, nbytes) in pairs {
            table.adopt(address, nbytes);
        }
    }
    Ok(())
}
