//! Every object the garbage collector tracks, visited without building a Python list.
//!
//! `gc.get_objects()` increfs and appends every tracked object to a new list: about 19 ms
//! for the 330,000 objects of a process that imported torch, which alone is more than our
//! whole budget for a report. Instead:
//! - CPython 3.12+: `PyUnstable_GC_VisitObjects`, the interpreter's own visitor (not in the
//!   limited API, so it is looked up at run time; abi3 wheels still work everywhere).
//! - CPython 3.9-3.11: the collector's doubly linked generation lists, read in place. A
//!   freshly tracked object sits at the tail of generation 0, so its `_gc_next` is the
//!   generation-0 head; the other heads follow at a fixed stride. Every link is checked
//!   (`next.prev == node`) while walking; on any inconsistency we fall back.
//! - Anything else (other versions, free-threaded builds, PyPy): `gc.get_objects()`.
//!
//! No Python code runs during a walk, so the collector cannot move objects under us.

use std::ffi::{c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// How the last walk found the objects (reported by benchmarks and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Visitor,
    GenerationLists,
    GetObjects,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Visitor => "PyUnstable_GC_VisitObjects",
            Strategy::GenerationLists => "gc generation lists",
            Strategy::GetObjects => "gc.get_objects()",
        }
    }
}

type VisitFn = unsafe extern "C" fn(*mut ffi::PyObject, *mut c_void) -> c_int;
type VisitObjects = unsafe extern "C" fn(VisitFn, *mut c_void);

/// Return the objects whose type `keep` accepts, as new references, and how they were
/// found. `keep` must not call into Python: it may run while the collector's lists are read.
pub fn tracked_objects<'py>(
    py: Python<'py>,
    held: &[*mut ffi::PyObject],
    keep: &mut dyn FnMut(*mut ffi::PyTypeObject) -> bool,
) -> PyResult<(Vec<Bound<'py, PyAny>>, Strategy)> {
    let (minor, free_threaded) = interpreter(py)?;
    let mut found: Vec<*mut ffi::PyObject> = Vec::new();
    let strategy = if !free_threaded && minor >= 12 && visit_with_visitor(keep, &mut found) {
        Strategy::Visitor
    } else if !free_threaded
        && (9..=11).contains(&minor)
        && cfg!(target_pointer_width = "64")
        && walk_generation_lists(py, held, keep, &mut found)
    {
        Strategy::GenerationLists
    } else {
        found.clear();
        let objects = py.import("gc")?.call_method0("get_objects")?;
        let list = objects.cast::<PyList>()?;
        let kept = list.iter().filter(|o| keep(o.get_type_ptr())).collect();
        return Ok((kept, Strategy::GetObjects));
    };
    // SAFETY: every pointer came from the collector's lists a moment ago, under the GIL,
    // with no Python code run since: each is a live object; we take a new reference.
    let kept = found
        .into_iter()
        .map(|ptr| unsafe { Bound::from_borrowed_ptr(py, ptr) })
        .collect();
    Ok((kept, strategy))
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

struct VisitState<'a> {
    keep: &'a mut dyn FnMut(*mut ffi::PyTypeObject) -> bool,
    found: &'a mut Vec<*mut ffi::PyObject>,
}

unsafe extern "C" fn visit(object: *mut ffi::PyObject, arg: *mut c_void) -> c_int {
    let state = &mut *(arg as *mut VisitState<'_>);
    if (state.keep)(ffi::Py_TYPE(object)) {
        state.found.push(object);
    }
    1 // go on
}

fn visit_with_visitor(
    keep: &mut dyn FnMut(*mut ffi::PyTypeObject) -> bool,
    found: &mut Vec<*mut ffi::PyObject>,
) -> bool {
    // SAFETY: the symbol, when present, has this signature in CPython 3.12 and later.
    let visitor: Option<VisitObjects> = unsafe {
        let this = libloading::os::unix::Library::this();
        this.get::<VisitObjects>(b"PyUnstable_GC_VisitObjects\0")
            .ok()
            .map(|symbol| *symbol)
    };
    let Some(visitor) = visitor else {
        return false;
    };
    let mut state = VisitState { keep, found };
    // SAFETY: `state` outlives the call; `visit` only reads object headers.
    unsafe { visitor(visit, &mut state as *mut VisitState<'_> as *mut c_void) };
    true
}

/// `PyGC_Head`: two words just before the object, `_gc_prev` carrying flags in its low bits.
#[repr(C)]
struct GcHead {
    next: usize,
    prev: usize,
}

const PREV_MASK: usize = !0b11;
const HEAD_SIZE: usize = std::mem::size_of::<GcHead>();
/// `struct gc_generation { PyGC_Head head; int threshold; int count; }` on 64-bit.
const GENERATION_STRIDE: usize = 24;
const GENERATIONS: usize = 3;

/// The node before a GC object.
fn node_of(object: *mut ffi::PyObject) -> usize {
    object as usize - HEAD_SIZE
}

/// SAFETY: `node` is a node of a live gc list.
unsafe fn next_of(node: usize) -> usize {
    (*(node as *const GcHead)).next
}

/// SAFETY: as `next_of`; also checks the list's invariant `next.prev == node`.
unsafe fn checked_next(node: usize) -> Option<usize> {
    let next = next_of(node);
    (next != 0 && (*(next as *const GcHead)).prev & PREV_MASK == node).then_some(next)
}

/// Walk the three generation lists as many short chains at once.
///
/// Following one linked list costs a cache miss per object (about 60 ns: 20 ms for a
/// process that imported torch), because each load waits for the one before. Here every
/// module object and module dict, all alive and tracked, starts a chain of its own; each
/// chain stops where the next start point (or a list head) begins, so the chains cover
/// every list exactly once, and stepping them in turn keeps many loads in flight.
fn walk_generation_lists(
    py: Python<'_>,
    held: &[*mut ffi::PyObject],
    keep: &mut dyn FnMut(*mut ffi::PyTypeObject) -> bool,
    found: &mut Vec<*mut ffi::PyObject>,
) -> bool {
    // A new list is tracked at once, at the tail of generation 0: its next is that head.
    let probe = PyList::empty(py);
    let probe_node = node_of(probe.as_ptr());
    // SAFETY: the probe is a tracked GC object, so it has a PyGC_Head.
    let head0 = unsafe { next_of(probe_node) };
    let heads: Vec<usize> = (0..GENERATIONS)
        .map(|g| head0 + g * GENERATION_STRIDE)
        .collect();
    // SAFETY: each head lies in the collector's state; check both of its links.
    let heads_ok = heads.iter().all(|&head| unsafe {
        let last = (*(head as *const GcHead)).prev & PREV_MASK;
        checked_next(head).is_some() && last != 0 && next_of(last) == head
    });
    if !heads_ok {
        return false;
    }
    // Frozen objects (gc.freeze) live in a fourth list whose head we do not stop at: then
    // walk from the three heads only.
    let anchors = if frozen_count(py) == 0 {
        anchor_nodes(py, held)
    } else {
        Vec::new()
    };
    let mut stops = NodeSet::with_capacity(heads.len() + anchors.len());
    for &node in heads.iter().chain(anchors.iter()) {
        stops.insert(node);
    }
    let mut cursors: Vec<usize> = Vec::with_capacity(heads.len() + anchors.len());
    for &node in heads.iter().chain(anchors.iter()) {
        if stops.take_start(node) {
            cursors.push(node);
        }
    }
    // The walk only records each object and its type (the type word shares a cache line
    // with the links just read); deciding about types afterwards keeps that work off the
    // chains' critical path.
    let mut seen: Vec<(usize, usize)> = Vec::with_capacity(1 << 16);
    for &anchor in &anchors {
        seen.push(object_and_type(anchor));
    }
    let mut saw_probe = false;
    while !cursors.is_empty() {
        let mut i = 0;
        while i < cursors.len() {
            // SAFETY: every cursor is a node of a gc list, checked link by link.
            let Some(next) = (unsafe { checked_next(cursors[i]) }) else {
                found.clear();
                return false;
            };
            if stops.contains(next) {
                cursors.swap_remove(i);
                continue;
            }
            saw_probe |= next == probe_node;
            seen.push(object_and_type(next));
            cursors[i] = next;
            i += 1;
        }
    }
    if !saw_probe {
        return false;
    }
    let probe_object = probe.as_ptr() as usize;
    found.extend(
        seen.into_iter()
            .filter(|&(object, kind)| {
                object != probe_object && keep(kind as *mut ffi::PyTypeObject)
            })
            .map(|(object, _)| object as *mut ffi::PyObject),
    );
    true
}

/// The object behind a gc node and its type pointer.
fn object_and_type(node: usize) -> (usize, usize) {
    let object = node + HEAD_SIZE;
    // SAFETY: a node in a gc list precedes a live object, whose header holds its type.
    (
        object,
        unsafe { ffi::Py_TYPE(object as *mut ffi::PyObject) } as usize,
    )
}

fn frozen_count(py: Python<'_>) -> usize {
    py.import("gc")
        .and_then(|gc| gc.call_method0("get_freeze_count"))
        .and_then(|n| n.extract())
        .unwrap_or(usize::MAX)
}

/// Nodes of every module in `sys.modules` and of its dict, and of the tracked GC objects in
/// `held`: all alive for the whole walk, and spread along the lists in the order they were
/// made.
fn anchor_nodes(py: Python<'_>, held: &[*mut ffi::PyObject]) -> Vec<usize> {
    let mut nodes: Vec<usize> = held
        .iter()
        .filter(|&&object| has_gc_head(object) && is_tracked(object))
        .map(|&object| node_of(object))
        .collect();
    let Ok(modules) = py.import("sys").and_then(|sys| sys.getattr("modules")) else {
        return nodes;
    };
    let Ok(modules) = modules.cast_into::<pyo3::types::PyDict>() else {
        return nodes;
    };
    for (_, module) in modules.iter() {
        // An exact type check: entries that are not real modules are left alone.
        if !module.get_type().is(py.get_type::<PyModule>()) {
            continue;
        }
        // SAFETY: a module is alive while sys.modules holds it; PyModule_GetDict returns a
        // borrowed dict that lives as long as the module.
        let dict = unsafe { ffi::PyModule_GetDict(module.as_ptr()) };
        for object in [module.as_ptr(), dict] {
            if !object.is_null() && is_tracked(object) {
                nodes.push(node_of(object));
            }
        }
    }
    nodes
}

/// Whether an object is laid out with a PyGC_Head: a GC type, and not a static type object
/// (those carry the GC flag but no head).
fn has_gc_head(object: *mut ffi::PyObject) -> bool {
    // SAFETY: reading the flags of a live object's type (and of the object, if a type).
    unsafe {
        let flags = ffi::PyType_GetFlags(ffi::Py_TYPE(object));
        if flags & ffi::Py_TPFLAGS_HAVE_GC == 0 {
            return false;
        }
        let is_type = flags & ffi::Py_TPFLAGS_TYPE_SUBCLASS != 0;
        !is_type
            || ffi::PyType_GetFlags(object as *mut ffi::PyTypeObject) & ffi::Py_TPFLAGS_HEAPTYPE
                != 0
    }
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

/// A module or dict that the collector tracks: it sits in a gc list with sound links.
fn is_tracked(object: *mut ffi::PyObject) -> bool {
    let node = node_of(object);
    // SAFETY: modules and dicts always carry a PyGC_Head; `next` is 0 when untracked.
    unsafe {
        let head = &*(node as *const GcHead);
        head.next != 0 && checked_next(node).is_some() && next_of(head.prev & PREV_MASK) == node
    }
}

/// A set of node addresses with a hash cheap enough to run once per object.
struct NodeSet {
    slots: Vec<usize>,
    /// Whether each slot's node has already started a chain (duplicates start once).
    started: Vec<bool>,
    mask: usize,
}

impl NodeSet {
    fn with_capacity(n: usize) -> Self {
        let size = (n * 2).next_power_of_two().max(16);
        Self {
            slots: vec![0; size],
            started: vec![false; size],
            mask: size - 1,
        }
    }

    fn slot(&self, node: usize) -> usize {
        let mut i = (node >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20 & self.mask;
        while self.slots[i] != 0 && self.slots[i] != node {
            i = (i + 1) & self.mask;
        }
        i
    }

    fn insert(&mut self, node: usize) {
        let i = self.slot(node);
        self.slots[i] = node;
    }

    fn contains(&self, node: usize) -> bool {
        self.slots[self.slot(node)] == node
    }

    /// True the first time a node is asked for, so each start point starts one chain.
    fn take_start(&mut self, node: usize) -> bool {
        let i = self.slot(node);
        !std::mem::replace(&mut self.started[i], true)
    }
}
