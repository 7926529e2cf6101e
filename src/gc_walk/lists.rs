//! The collector's lists, read in place: the whole walk on CPython 3.9-3.11 (no visitor
//! exists there), and the permanent generation of `gc.freeze()` on 3.9-3.13 (no official way
//! to list frozen objects exists anywhere). GIL builds, 64-bit only.
//!
//! # Where the lists are
//! Each tracked object is preceded by a `PyGC_Head` (next, prev) linking it into one of the
//! circular lists whose heads sit in the interpreter's gc state. A freshly tracked object is
//! appended at the tail of generation 0, so a new probe's `next` is that list's head; the
//! other heads follow at fixed offsets (`struct _gc_runtime_state`, the same in 3.9-3.13).
//! Before trusting them we check, every walk: each head's links (`first.prev == head`,
//! `last.next == head`), the `generation0` pointer that follows the three generations, and
//! the `garbage` and `callbacks` fields, which must hold exactly `gc.garbage` and
//! `gc.callbacks`. Every link is also checked as it is followed (`next.prev == node`). Any
//! failed check abandons the walk and the caller uses `gc.get_objects()`.
//!
//! # When reading in place is sound
//! Only when no collection is running (the caller asks `collections::collecting()`): a
//! collection keeps objects in lists of its own whose heads live on its C stack, and a
//! finaliser or weakref callback that asks for a walk runs in the middle of one. And only
//! while no Python code runs, so that nothing is created, freed or relinked under us.
//!
//! # Resuming from the last walk
//! A full walk of a process that imported torch reads about 330,000 objects. So a walk
//! leaves a sentinel at the tail of generation 0 and weak references to what it found; the
//! next one reads only what lies after the sentinel in its generation, plus the younger
//! generations, plus the objects the weak references still reach. This is exact when every
//! object tracked after the sentinel still lies after it, in its list or a younger one.
//! What moves objects between lists (read in `Modules/gcmodule.c` of 3.9-3.12 and
//! `Python/gc.c` of 3.13, which has the 3.12 collector again, not the incremental one):
//! - tracking appends at the tail of generation 0: after the sentinel. Untracking removes.
//! - a collection of generation k (`gc_collect_main`) first appends generations 0..k-1, in
//!   that order, to generation k. `move_unreachable` leaves reachable objects in place and
//!   only ever moves others to the unreachable list or back to the tail of the young list;
//!   the sentinel, referenced from outside every list, is reachable and never moves. The
//!   young list is then appended to generation k+1 (k < 2), and weakrefs with callbacks,
//!   resurrected and uncollectable objects are appended after it. Objects a finaliser makes
//!   meanwhile go to generation 0. Nothing is ever inserted ahead of a node.
//! - so, with the sentinel in generation s when a collection of k starts: s > k leaves it
//!   alone; s = k, or s = 0, keeps every newer object after it (in its list or a younger
//!   one) and leaves it in min(k+1, 2); 1 <= s < k puts generation 0 (newer) ahead of it.
//!   `collections::advance` follows that through every collection our `gc.callbacks` entry
//!   sees (every one outside interpreter shutdown, where walks take the official path); a
//!   sequence that hits the last case is broken.
//! - `gc.freeze()` appends generations 0, 1, 2 in that order to the permanent list, and
//!   `gc.unfreeze()` appends that list to generation 2; neither tells anyone. A sentinel
//!   that was frozen ends in the permanent list or in generation 2, and a sentinel never
//!   comes back to a younger generation, so finding it in generation 0 or 1 where the
//!   simulation says proves that no freeze moved it. In generation 2 nothing proves it: a
//!   freeze then an unfreeze put generations 0 and 1 (all newer than a sentinel in 2) ahead
//!   of it. We tried to detect that by generation 2's first node: the randomized model
//!   (tests/gc_walk_model.py) found a sequence where that node died and the unfreeze brought
//!   back a new object at its address. No official way to learn of a freeze exists, so a
//!   sentinel in generation 2 is not resumed from.
//!
//! So a walk resumes only when the simulation is not broken and the sentinel sits in
//! generation 0 or 1 where expected (in effect: no collection of generation 1 or 2 since the
//! last walk); otherwise it walks in full. On 3.12 and 3.13 a full walk is the interpreter's
//! visitor, with the permanent list read here; on 3.14 (incremental collection moves objects
//! differently) the walk never resumes.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Mutex;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyWeakrefMethods, PyWeakrefReference};

use super::chains::{self, object_and_type, NodeSet};
use super::collections::{self, Since};
use super::head::{checked_next, next_of, node_of, GcHead, PREV_MASK};
use super::{visitor, SubtypeCache};

/// `struct gc_generation { PyGC_Head head; int threshold; int count; }` on 64-bit.
const GENERATION_STRIDE: usize = 24;
const GENERATIONS: usize = 3;
/// Offsets from generation 0's head in `struct _gc_runtime_state` (3.9-3.13): the
/// `generation0` pointer, the permanent generation, then `generation_stats[3]` (24 bytes
/// each), `int collecting`, and the `garbage` and `callbacks` lists.
const GENERATION0_POINTER: usize = GENERATIONS * GENERATION_STRIDE;
const PERMANENT: usize = GENERATION0_POINTER + 8;
const GARBAGE: usize = PERMANENT + GENERATION_STRIDE + 3 * 24 + 8;
const CALLBACKS: usize = GARBAGE + 8;

/// Whether a list head's links are sound: its first node points back to it, its last
/// node points on to it.
///
/// SAFETY: `head` must be readable memory holding two words.
unsafe fn head_links_ok(head: usize) -> bool {
    let last = unsafe { (*(head as *const GcHead)).prev } & PREV_MASK;
    unsafe { checked_next(head) }.is_some() && last != 0 && unsafe { next_of(last) } == head
}

/// The collector's list heads, found from a probe and checked (see the module docs).
struct Heads<'py> {
    generations: [usize; GENERATIONS],
    permanent: usize,
    /// A list tracked just now: it lies in generation 0, so a full walk must meet it.
    probe: Bound<'py, PyList>,
}

impl Heads<'_> {
    fn probe_node(&self) -> usize {
        node_of(self.probe.as_ptr())
    }

    /// Every list, the permanent one last.
    fn all(&self) -> [usize; GENERATIONS + 1] {
        let [g0, g1, g2] = self.generations;
        [g0, g1, g2, self.permanent]
    }
}

fn locate(py: Python<'_>) -> Option<Heads<'_>> {
    let gc = py.import("gc").ok()?;
    let garbage = gc.getattr("garbage").ok()?;
    let callbacks = gc.getattr("callbacks").ok()?;
    let probe = PyList::empty(py);
    // SAFETY: the probe is a tracked GC object, so it has a PyGC_Head.
    let head0 = unsafe { next_of(node_of(probe.as_ptr())) };
    let generations: [usize; GENERATIONS] = std::array::from_fn(|g| head0 + g * GENERATION_STRIDE);
    let permanent = head0 + PERMANENT;
    // SAFETY: generation 0's head is a list head (checked first); the words after it lie
    // in the same gc state struct, whose layout the identity checks then confirm.
    let sound = unsafe {
        head_links_ok(head0)
            && *((head0 + GENERATION0_POINTER) as *const usize) == head0
            && *((head0 + GARBAGE) as *const usize) == garbage.as_ptr() as usize
            && *((head0 + CALLBACKS) as *const usize) == callbacks.as_ptr() as usize
            && generations.iter().all(|&head| head_links_ok(head))
            && head_links_ok(permanent)
    };
    sound.then_some(Heads {
        generations,
        permanent,
        probe,
    })
}

/// How a walk of the lists went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walked {
    /// Every list, from end to end.
    Full,
    /// Only what was tracked since the last walk, plus what that walk found.
    SinceLast,
}

/// What a walk leaves for the next one (see "Resuming" in the module docs).
struct Resume {
    base: usize,
    sentinel: Py<PyList>,
    found: Vec<Py<PyWeakrefReference>>,
}

static RESUME: Mutex<Option<Resume>> = Mutex::new(None);
/// Set while a list walk runs: a walk that starts meanwhile (from a finaliser run by an
/// allocation of ours, or from another thread while ours let the GIL go) is told to take
/// the official path, so that two walks never share the resume point.
static WALKING: AtomicBool = AtomicBool::new(false);

fn take_resume() -> Option<Resume> {
    RESUME.lock().unwrap_or_else(|p| p.into_inner()).take()
}

fn store_resume(resume: Option<Resume>) {
    *RESUME.lock().unwrap_or_else(|p| p.into_inner()) = resume;
}

/// Forget the resume point: the next walk is full.
pub fn forget() {
    store_resume(None);
}

/// How a walk that cannot resume reads everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullWalk {
    /// The lists, end to end, many chains at a time (3.9-3.11).
    Lists,
    /// `PyUnstable_GC_VisitObjects`, plus the permanent list (3.12, 3.13).
    Visitor,
}

/// Every tracked object whose type is `base` or a subtype, as new references, and how they
/// were found; None if the lists could not be walked soundly. The caller has checked that
/// no collection is running. `held` lists objects the caller keeps alive.
pub fn walk<'py>(
    py: Python<'py>,
    held: &[*mut ffi::PyObject],
    base: *mut ffi::PyTypeObject,
    full: FullWalk,
) -> Option<(Vec<Bound<'py, PyAny>>, Walked)> {
    if WALKING.swap(true, SeqCst) {
        return None;
    }
    let result = walk_unguarded(py, held, base, full);
    WALKING.store(false, SeqCst);
    result
}

fn walk_unguarded<'py>(
    py: Python<'py>,
    held: &[*mut ffi::PyObject],
    base: *mut ffi::PyTypeObject,
    full: FullWalk,
) -> Option<(Vec<Bound<'py, PyAny>>, Walked)> {
    // Everything that may allocate (and so run a collection and finalisers) comes first.
    let previous = take_resume().filter(|r| r.base == base as usize);
    let sentinel = match &previous {
        Some(r) => r.sentinel.clone_ref(py),
        None => PyList::empty(py).unbind(),
    };
    let heads = locate(py)?;
    let anchors = match full {
        FullWalk::Lists => anchor_nodes(py, held),
        FullWalk::Visitor => Vec::new(),
    };

    // From here until the sentinel is placed again, no Python code runs.
    let since = collections::take_since();
    let mut found: Vec<*mut ffi::PyObject> = Vec::new();
    let mut again: Vec<Bound<'py, PyAny>> = Vec::new();
    let resumed = previous
        .as_ref()
        .filter(|_| !since.broken)
        .and_then(|last| walk_since(py, last, &heads, since, base, &mut found, &mut again));
    let walked = match resumed {
        Some(()) => Walked::SinceLast,
        None => {
            found.clear();
            again.clear();
            match full {
                FullWalk::Lists => walk_all(&heads, &anchors, base, &mut found)?,
                FullWalk::Visitor => walk_visitor(&heads, base, &mut found)?,
            }
            Walked::Full
        }
    };
    // SAFETY: every pointer came from the lists just now, with no Python code run since:
    // each is a live object; we take a new reference (no allocation).
    let mut objects: Vec<Bound<'py, PyAny>> = again;
    objects.extend(
        found
            .into_iter()
            .map(|ptr| unsafe { Bound::from_borrowed_ptr(py, ptr) }),
    );
    // Move the sentinel to the tail of generation 0, after everything seen, and count
    // collections afresh from this point.
    // SAFETY: a live list; untracking first, as tracking a tracked object is fatal.
    unsafe {
        ffi::PyObject_GC_UnTrack(sentinel.as_ptr() as *mut c_void);
        ffi::PyObject_GC_Track(sentinel.as_ptr() as *mut c_void);
    }
    collections::take_since();
    drop(heads);
    store_resume(remember(base, sentinel, &objects));
    Some((objects, walked))
}

/// Every list, from end to end, many chains at a time.
fn walk_all(
    heads: &Heads<'_>,
    anchors: &[usize],
    base: *mut ffi::PyTypeObject,
    found: &mut Vec<*mut ffi::PyObject>,
) -> Option<()> {
    let lists = heads.all();
    let mut stops = NodeSet::with_capacity(lists.len() + anchors.len());
    let mut starts: Vec<usize> = Vec::with_capacity(lists.len() + anchors.len());
    for &node in lists.iter().chain(anchors.iter()) {
        if stops.insert(node) {
            starts.push(node);
        }
    }
    let (matches, saw_probe) = chains::walk_in_threads(&starts, &stops, heads.probe_node(), base)?;
    if !saw_probe {
        return None;
    }
    let mut types = SubtypeCache::new(base);
    for &anchor in anchors {
        let (object, kind) = object_and_type(anchor);
        // SAFETY: an anchor is a live object, so its type is a live type.
        if unsafe { types.is_subtype(kind as *mut ffi::PyTypeObject) } {
            found.push(object as *mut ffi::PyObject);
        }
    }
    found.extend(matches.into_iter().map(|o| o as *mut ffi::PyObject));
    Some(())
}

/// Every object in generations 0-2 through the interpreter's visitor, then the permanent
/// list read in place (some versions' visitor skips it, others visit it: listed once).
fn walk_visitor(
    heads: &Heads<'_>,
    base: *mut ffi::PyTypeObject,
    found: &mut Vec<*mut ffi::PyObject>,
) -> Option<()> {
    let mut types = SubtypeCache::new(base);
    // SAFETY: only ever asked about the types of live objects.
    let mut keep = |kind: *mut ffi::PyTypeObject| unsafe { types.is_subtype(kind) };
    if !visitor::visit_all(&mut keep, found) {
        return None;
    }
    let listed: std::collections::HashSet<usize> = found.iter().map(|&o| o as usize).collect();
    let mut types = SubtypeCache::new(base);
    let head = heads.permanent;
    follow(head, |n| n == head, &mut |node| {
        let (object, kind) = object_and_type(node);
        // SAFETY: `kind` is the type of a live object.
        if !listed.contains(&object) && unsafe { types.is_subtype(kind as *mut ffi::PyTypeObject) }
        {
            found.push(object as *mut ffi::PyObject);
        }
    })?;
    Some(())
}

/// The objects tracked since the last walk (after its sentinel, in the sentinel's
/// generation and every younger one) into `found`, and those the last walk found that are
/// still alive into `again`; None if the sentinel is not where `since` says it must be.
fn walk_since<'py>(
    py: Python<'py>,
    last: &Resume,
    heads: &Heads<'_>,
    since: Since,
    base: *mut ffi::PyTypeObject,
    found: &mut Vec<*mut ffi::PyObject>,
    again: &mut Vec<Bound<'py, PyAny>>,
) -> Option<()> {
    let sentinel = node_of(last.sentinel.bind(py).as_ptr());
    // SAFETY: the sentinel is alive (we own it) and a GC object; 0 means untracked.
    if unsafe { next_of(sentinel) } == 0 {
        return None;
    }
    let mut types = SubtypeCache::new(base);
    let mut matches: Vec<usize> = Vec::new();
    let mut keep = |node: usize| {
        let (object, kind) = object_and_type(node);
        // SAFETY: `kind` is the type of a live object.
        if unsafe { types.is_subtype(kind as *mut ffi::PyTypeObject) } {
            matches.push(object);
        }
    };
    let lists = heads.all();
    // From the sentinel to the end of its list: the head there says which list.
    let stop = follow(sentinel, |n| lists.contains(&n), &mut keep)?;
    let generation = heads.generations.iter().position(|&h| h == stop)?;
    if generation != usize::from(since.generation) {
        return None; // frozen, unfrozen or collected in a way we did not follow
    }
    // SAFETY: a list head checked by `locate`.
    if generation == 2 {
        return None; // a freeze and an unfreeze may have put newer objects ahead (module docs)
    }
    for &head in &heads.generations[..generation] {
        follow(head, |n| n == head, &mut keep)?;
    }
    // A collection may have moved an object found last time behind the sentinel: list
    // each object once.
    let mut listed = std::collections::HashSet::with_capacity(last.found.len());
    for weak in &last.found {
        if let Some(object) = weak.bind(py).upgrade() {
            listed.insert(object.as_ptr() as usize);
            again.push(object);
        }
    }
    found.extend(
        matches
            .into_iter()
            .filter(|o| !listed.contains(o))
            .map(|o| o as *mut ffi::PyObject),
    );
    Some(())
}

/// Follow the links from `node`, handing every node to `visit`, up to the first node for
/// which `is_stop` holds, which is returned; None if a link is broken.
fn follow(
    mut node: usize,
    is_stop: impl Fn(usize) -> bool,
    visit: &mut impl FnMut(usize),
) -> Option<usize> {
    loop {
        // SAFETY: `node` is in a gc list, checked link by link.
        let next = unsafe { checked_next(node) }?;
        if is_stop(next) {
            return Some(next);
        }
        visit(next);
        node = next;
    }
}

/// The resume point for the next walk; None if some object takes no weak reference (then
/// the next walk is a full one). Creating the weak references may run a collection: that
/// is fine, the collection is counted for the next walk and `objects` keeps them alive.
fn remember(
    base: *mut ffi::PyTypeObject,
    sentinel: Py<PyList>,
    objects: &[Bound<'_, PyAny>],
) -> Option<Resume> {
    let mut weak = Vec::with_capacity(objects.len());
    for object in objects {
        weak.push(PyWeakrefReference::new(object).ok()?.unbind());
    }
    Some(Resume {
        base: base as usize,
        sentinel,
        found: weak,
    })
}

/// The objects frozen by `gc.freeze()` whose type is `base` or a subtype, as new
/// references; None if the permanent list could not be located and checked. Frozen objects
/// never move until `gc.unfreeze()`, which is Python code, so reading the list while no
/// Python code runs is sound (outside a collection, which the caller checks).
pub fn frozen_objects<'py>(
    py: Python<'py>,
    base: *mut ffi::PyTypeObject,
) -> Option<Vec<Bound<'py, PyAny>>> {
    let heads = locate(py)?;
    let mut types = SubtypeCache::new(base);
    let mut found: Vec<usize> = Vec::new();
    let head = heads.permanent;
    follow(head, |n| n == head, &mut |node| {
        let (object, kind) = object_and_type(node);
        // SAFETY: `kind` is the type of a live object.
        if unsafe { types.is_subtype(kind as *mut ffi::PyTypeObject) } {
            found.push(object);
        }
    })?;
    // SAFETY: found just now in the permanent list; no Python code ran since.
    Some(
        found
            .into_iter()
            .map(|o| unsafe { Bound::from_borrowed_ptr(py, o as *mut ffi::PyObject) })
            .collect(),
    )
}

/// Nodes of every module in `sys.modules` and of its dict, and of the tracked GC objects in
/// `held`: all alive for the whole walk, and spread along the lists in the order they were
/// made, so they cut the lists into many short chains.
fn anchor_nodes(py: Python<'_>, held: &[*mut ffi::PyObject]) -> Vec<usize> {
    let mut nodes: Vec<usize> = held
        .iter()
        .filter(|&&object| has_gc_head(object) && is_tracked(object))
        .map(|&object| node_of(object))
        .collect();
    let Ok(modules) = py.import("sys").and_then(|sys| sys.getattr("modules")) else {
        return nodes;
    };
    let Ok(modules) = modules.cast_into::<PyDict>() else {
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

/// A GC object that the collector tracks: it sits in a gc list with sound links.
fn is_tracked(object: *mut ffi::PyObject) -> bool {
    let node = node_of(object);
    // SAFETY: callers pass objects that carry a PyGC_Head; `next` is 0 when untracked.
    unsafe {
        let head = &*(node as *const GcHead);
        head.next != 0 && checked_next(node).is_some() && next_of(head.prev & PREV_MASK) == node
    }
}
