//! Finding every live object of a type (tensors, for us) among what the garbage collector
//! tracks: one entry point, `instances`, used by the reporter, Courtesy and the CPU source.
//!
//! `gc.get_objects()` increfs and appends every tracked object to a new list: about 19 ms for
//! the 330,000 objects of a process that imported torch, more than our whole budget for a
//! report. So, by rule:
//! 1. During a collection (a finaliser, a weakref callback or another tool's gc callback
//!    asking for a report), or at interpreter shutdown, or when we cannot tell (our
//!    `gc.callbacks` entry was removed): `gc.get_objects()`. The collector then holds objects
//!    in lists of its own that nothing else may follow; `gc.get_objects()` reads only the
//!    generations, which are consistent, so the objects being collected are not listed, and
//!    the result says so.
//! 2. CPython 3.12+: the interpreter's own visitor, `PyUnstable_GC_VisitObjects`
//!    (`visitor`); on 3.12 and 3.13, callers that walk again and again (the tensor diff
//!    tracker) ask to `resume` from the last walk as on 3.9-3.11, the visitor then serving
//!    the full walks. It leaves out the frozen objects of `gc.freeze()`, as `gc.get_objects()`
//!    does; no official API lists them, so on 3.9-3.13 they are read from the permanent list
//!    in place (`lists::frozen_objects`, checked), on every path, and elsewhere a report says
//!    that frozen objects were not searched.
//! 3. CPython 3.9-3.11 (no visitor): the generation lists read in place, on several threads,
//!    resuming from the last walk only when that is exact (`lists`, `chains`).
//! 4. Anything else (free-threaded builds, PyPy, 32-bit), a failed check, or
//!    `MEMLAB_RS_GC_WALK=get_objects`: `gc.get_objects()`.
//!
//! Every path returns new references and runs no Python code while it reads raw pointers.

pub mod chains;
pub mod collections;
pub mod facts;
pub mod head;
pub mod lists;
pub mod visitor;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyType};

/// How a walk found the objects (reported by benchmarks and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Visitor,
    GenerationLists,
    SinceLastWalk,
    GetObjects,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Visitor => "PyUnstable_GC_VisitObjects",
            Strategy::GenerationLists => "gc generation lists",
            Strategy::SinceLastWalk => "gc generation lists, since the last walk",
            Strategy::GetObjects => "gc.get_objects()",
        }
    }

    /// The strategy `name` names (a saved report's), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Strategy::Visitor,
            Strategy::GenerationLists,
            Strategy::SinceLastWalk,
            Strategy::GetObjects,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }
}

/// What the Python functions return: the objects, the strategy's name, why it may be
/// incomplete.
type Found<'py> = (Vec<Bound<'py, PyAny>>, &'static str, Option<String>);

/// What a walk found.
pub struct Walk<'py> {
    pub objects: Vec<Bound<'py, PyAny>>,
    pub strategy: Strategy,
    /// Why the result may miss objects, when it may (shown in every report made from it).
    pub incomplete: Option<String>,
}

/// Every tracked object whose type is `base` or a subtype, as new references. `held` lists
/// objects the caller keeps alive (good start points for the list walk). `resume`: on
/// CPython 3.12 and 3.13, read only what changed since the last walk when that is exact
/// (3.9-3.11 always do).
pub fn instances<'py>(
    py: Python<'py>,
    held: &[*mut ffi::PyObject],
    base: *mut ffi::PyTypeObject,
    resume: bool,
) -> PyResult<Walk<'py>> {
    let (minor, free_threaded) = interpreter(py)?;
    let sys = py.import("sys")?;
    let watched = collections::watch(py)?;
    let forced = std::env::var("MEMLAB_RS_GC_WALK").as_deref() == Ok("get_objects");
    let in_place =
        watched && !forced && !free_threaded && cfg!(target_pointer_width = "64") && minor >= 9;
    if collections::collecting() {
        let note = "the report was made during a garbage collection (from a finaliser or a \
                    callback): tensors held only by the objects being collected are not listed";
        return get_objects(py, base, minor, Some(note.to_string()));
    }
    if !in_place || sys.call_method0("is_finalizing")?.is_truthy()? {
        return get_objects(py, base, minor, None);
    }
    if minor >= 12 && !(resume && minor <= 13) {
        let mut types = SubtypeCache::new(base);
        let mut found = Vec::new();
        // SAFETY: only ever asked about the types of live objects.
        let mut keep = |kind: *mut ffi::PyTypeObject| unsafe { types.is_subtype(kind) };
        if !visitor::visit_all(&mut keep, &mut found) {
            return get_objects(py, base, minor, None);
        }
        // SAFETY: visited just now; no Python code ran since, so each is alive.
        let mut objects: Vec<Bound<'py, PyAny>> = found
            .into_iter()
            .map(|ptr| unsafe { Bound::from_borrowed_ptr(py, ptr) })
            .collect();
        let incomplete = match frozen_objects(py, base, minor)? {
            Ok(frozen) => {
                objects.extend(frozen);
                None
            }
            Err(note) => Some(note),
        };
        return Ok(Walk {
            objects,
            strategy: Strategy::Visitor,
            incomplete,
        });
    }
    let full = if minor >= 12 {
        lists::FullWalk::Visitor
    } else {
        lists::FullWalk::Lists
    };
    match lists::walk(py, held, base, full) {
        Some((objects, walked)) => Ok(Walk {
            objects,
            strategy: match (walked, full) {
                (lists::Walked::Full, lists::FullWalk::Lists) => Strategy::GenerationLists,
                (lists::Walked::Full, lists::FullWalk::Visitor) => Strategy::Visitor,
                (lists::Walked::SinceLast, _) => Strategy::SinceLastWalk,
            },
            incomplete: None,
        }),
        None => get_objects(py, base, minor, None),
    }
}

/// The official path, `gc.get_objects()`, plus the frozen objects it leaves out, read from
/// the permanent list when it can be located (3.9-3.13). Collections never touch that list,
/// so it may be read during one too.
fn get_objects<'py>(
    py: Python<'py>,
    base: *mut ffi::PyTypeObject,
    minor: u32,
    note: Option<String>,
) -> PyResult<Walk<'py>> {
    let objects = py.import("gc")?.call_method0("get_objects")?;
    let list = objects.cast::<PyList>()?;
    let mut types = SubtypeCache::new(base);
    // SAFETY: the type of an object in the list, which keeps it alive.
    let mut kept: Vec<Bound<'py, PyAny>> = list
        .iter()
        .filter(|o| unsafe { types.is_subtype(o.get_type_ptr()) })
        .collect();
    let frozen = frozen_objects(py, base, minor)?;
    let incomplete = match (note, frozen) {
        (note, Ok(frozen)) => {
            kept.extend(frozen);
            note
        }
        (Some(a), Err(b)) => Some(format!("{a}; {b}")),
        (None, Err(b)) => Some(b),
    };
    Ok(Walk {
        objects: kept,
        strategy: Strategy::GetObjects,
        incomplete,
    })
}

/// The frozen objects of type `base`, or why they could not be searched (Ok(empty) when
/// nothing is frozen).
fn frozen_objects<'py>(
    py: Python<'py>,
    base: *mut ffi::PyTypeObject,
    minor: u32,
) -> PyResult<Result<Vec<Bound<'py, PyAny>>, String>> {
    let readable = (9..=13).contains(&minor) && cfg!(target_pointer_width = "64");
    if let Some(frozen) = readable.then(|| lists::frozen_objects(py, base)).flatten() {
        return Ok(Ok(frozen));
    }
    Ok(match frozen_note(py)? {
        Some(note) => Err(note),
        None => Ok(Vec::new()),
    })
}

/// A note when objects are frozen and could not be read.
fn frozen_note(py: Python<'_>) -> PyResult<Option<String>> {
    let frozen: usize = py
        .import("gc")?
        .call_method0("get_freeze_count")?
        .extract()?;
    Ok((frozen > 0).then(|| {
        format!(
            "{frozen} objects frozen by gc.freeze() could not be searched: tensors only they \
             hold are not listed"
        )
    }))
}

/// (minor version, free-threaded build) of a CPython interpreter; other implementations
/// answer minor 0 so that only the portable path is used.
fn interpreter(py: Python<'_>) -> PyResult<(u32, bool)> {
    let sys = py.import("sys")?;
    let implementation: String = sys.getattr("implementation")?.getattr("name")?.extract()?;
    if implementation != "cpython" {
        return Ok((0, false));
    }
    let minor: u32 = sys.getattr("version_info")?.getattr("minor")?.extract()?;
    let free_threaded = sys
        .getattr("_is_gil_enabled")
        .and_then(|f| f.call0())
        .and_then(|v| v.extract::<bool>())
        .map(|gil| !gil)
        .unwrap_or(false);
    Ok((minor, free_threaded))
}

/// Whether `PyType_IsSubtype(type(object), base)`, remembered per type: the walk asks this
/// once per gc object, and a process has only a few thousand types.
pub struct SubtypeCache {
    base: *mut ffi::PyTypeObject,
    slots: Vec<(usize, bool)>,
}

impl SubtypeCache {
    const SIZE: usize = 4096;

    pub fn new(base: *mut ffi::PyTypeObject) -> Self {
        Self {
            base,
            slots: vec![(0, false); Self::SIZE],
        }
    }

    /// # Safety
    /// `kind` must be a live type object.
    pub unsafe fn is_subtype(&mut self, kind: *mut ffi::PyTypeObject) -> bool {
        let key = kind as usize;
        let slot = ((key >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) & (Self::SIZE - 1);
        let (cached, answer) = self.slots[slot];
        if cached == key {
            return answer;
        }
        // SAFETY: both are live type objects.
        let answer = unsafe { ffi::PyType_IsSubtype(kind, self.base) } != 0;
        self.slots[slot] = (key, answer);
        answer
    }
}

/// Every tensor the gc walk finds, how it found them, and why the result may be incomplete
/// (None when it is not). `held` are objects the caller keeps alive (start points).
///
/// >>> import torch
/// >>> from memlab_rs._core import tracked_tensors
/// >>> x = torch.zeros(3)
/// >>> found, strategy, incomplete = tracked_tensors([x])
/// >>> any(t is x for t in found)
/// True
#[pyfunction]
#[pyo3(signature = (held=Vec::new(), resume=false))]
pub fn tracked_tensors<'py>(
    py: Python<'py>,
    held: Vec<Bound<'py, PyAny>>,
    resume: bool,
) -> PyResult<Found<'py>> {
    let base = py.import("torch")?.getattr("_C")?.getattr("TensorBase")?;
    let base = base.cast_into::<PyType>()?;
    walk_for(py, &base, held, resume)
}

/// Every live instance of `cls` (or of a subclass) the collector tracks, found the way
/// `tracked_tensors` finds tensors: the walk itself, testable without torch.
///
/// >>> from memlab_rs._core import _instances_of
/// >>> class Node: pass
/// >>> keep = [Node() for _ in range(3)]
/// >>> found, strategy, incomplete = _instances_of(Node)
/// >>> sorted(map(id, found)) == sorted(map(id, keep))
/// True
#[pyfunction]
#[pyo3(signature = (cls, held=Vec::new(), resume=false))]
pub fn _instances_of<'py>(
    py: Python<'py>,
    cls: Bound<'py, PyType>,
    held: Vec<Bound<'py, PyAny>>,
    resume: bool,
) -> PyResult<Found<'py>> {
    walk_for(py, &cls, held, resume)
}

fn walk_for<'py>(
    py: Python<'py>,
    base: &Bound<'py, PyType>,
    held: Vec<Bound<'py, PyAny>>,
    resume: bool,
) -> PyResult<Found<'py>> {
    let held: Vec<*mut ffi::PyObject> = held.iter().map(|o| o.as_ptr()).collect();
    let walk = instances(py, &held, base.as_type_ptr(), resume)?;
    Ok((walk.objects, walk.strategy.name(), walk.incomplete))
}

#[cfg(test)]
mod tests {
    use super::Strategy;

    #[test]
    fn strategies_are_found_by_their_saved_names() {
        for s in [
            Strategy::Visitor,
            Strategy::GenerationLists,
            Strategy::SinceLastWalk,
            Strategy::GetObjects,
        ] {
            assert_eq!(Strategy::from_name(s.name()), Some(s));
        }
        assert_eq!(Strategy::from_name("telepathy"), None);
    }
}
