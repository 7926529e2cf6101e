//! The collector's generation lists, read in place (CPython 3.9-3.13, GIL builds).
//!
//! Each tracked object is preceded by a `PyGC_Head` (next, prev) linking it into one of
//! three circular lists whose heads sit in the interpreter's gc state. A freshly tracked
//! object is appended at the tail of generation 0, so a new probe's `next` is that list's
//! head; the other two heads follow at a fixed stride. Every link is checked
//! (`next.prev == node`) as it is followed; any inconsistency abandons the walk, and the
//! caller falls back to `gc.get_objects()`.
//!
//! Following one linked list costs a cache miss per object (about 60 ns: 20 ms for a
//! process that imported torch) because each load waits for the one before. So the lists
//! are cut into many short chains: every module object and module dict, and every object
//! the caller holds, is alive and tracked and starts a chain; a chain ends where the next
//! start point or a list head begins, so the chains cover each list exactly once. Chains
//! are stepped in turn, keeping many loads in flight, and split between threads.
//!
//! The first walk in a process reads everything; later ones read only what was tracked
//! since, plus what the last walk found (see `Resume` for why that is exact).
//!
//! Reading from other threads is safe: the calling thread holds the GIL and runs no
//! Python code until the walk ends, so no object is created, freed or relinked meanwhile.

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::c_void;
use std::sync::Mutex;

use pyo3::types::{PyDict, PyList, PyWeakrefMethods, PyWeakrefReference};

use super::gc_objects::SubtypeCache;

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

/// Whether a list head's links are sound: its first node points back to it, its last
/// node points on to it.
///
/// SAFETY: `head` must be readable memory holding two words.
unsafe fn head_links_ok(head: usize) -> bool {
    let last = (*(head as *const GcHead)).prev & PREV_MASK;
    checked_next(head).is_some() && last != 0 && next_of(last) == head
}

/// SAFETY: as `next_of`; also checks the list's invariant `next.prev == node`.
unsafe fn checked_next(node: usize) -> Option<usize> {
    let next = next_of(node);
    (next != 0 && (*(next as *const GcHead)).prev & PREV_MASK == node).then_some(next)
}

/// How a walk went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walked {
    /// Every list, from end to end.
    Full,
    /// Only what was tracked since the last walk, plus what that walk found.
    SinceLast,
}

/// What a walk leaves for the next one: a sentinel object tracked right after it ended,
/// and weak references to the objects it found.
///
/// Why this is exact: the collector only ever appends to a list's tail (tracking a new
/// object, merging a younger generation into an older one, moving survivors and
/// resurrected objects during a collection, `gc.unfreeze()`), and it never moves an object
/// that something outside the heap references, which the sentinel is (only this static
/// holds it). So every object tracked after the sentinel stays after it, in the
/// sentinel's generation or a younger one, and every object tracked before it was seen by
/// the walk that placed it. `gc.freeze()` moves every list, the sentinel included, into
/// the permanent list; a walk that finds the sentinel there is a full one.
struct Resume {
    base: usize,
    sentinel: Py<PyList>,
    found: Vec<Py<PyWeakrefReference>>,
}

static RESUME: Mutex<Option<Resume>> = Mutex::new(None);

/// Append every tracked object whose type is `base` or a subtype to `found`, and say how;
/// None if the lists could not be walked safely (then `found` is left empty).
pub fn walk(
    py: Python<'_>,
    minor: u32,
    held: &[*mut ffi::PyObject],
    base: *mut ffi::PyTypeObject,
    found: &mut Vec<*mut ffi::PyObject>,
) -> Option<Walked> {
    // A new list is tracked at once, at the tail of generation 0: its next is that head.
    let probe = PyList::empty(py);
    let probe_node = node_of(probe.as_ptr());
    // SAFETY: the probe is a tracked GC object, so it has a PyGC_Head.
    let head0 = unsafe { next_of(probe_node) };
    let heads: Vec<usize> = (0..GENERATIONS)
        .map(|g| head0 + g * GENERATION_STRIDE)
        .collect();
    // SAFETY: each head lies in the collector's state.
    let heads_ok = heads.iter().all(|&head| unsafe { head_links_ok(head) });
    if !heads_ok {
        return None;
    }
    // Frozen objects (gc.freeze) sit in a fourth list, the permanent generation. Its head
    // follows the three generations and the `generation0` pointer on CPython 3.9-3.12;
    // elsewhere we do not know where it is, and leave frozen objects out, as
    // gc.get_objects() does.
    let permanent = (minor <= 12)
        .then_some(head0 + GENERATIONS * GENERATION_STRIDE + std::mem::size_of::<usize>())
        .filter(|&head| unsafe { head_links_ok(head) });
    let lists: Vec<usize> = heads.iter().copied().chain(permanent).collect();
    // With frozen objects and no known permanent head, anchors might lie in a list whose
    // head we would not stop at.
    let blind = permanent.is_none() && frozen_count(py) != 0;
    let mut resume = RESUME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let previous = resume.take().filter(|r| !blind && r.base == base as usize);
    let walked = match previous
        .as_ref()
        .and_then(|r| walk_since(py, r, &heads, permanent, base, found))
    {
        Some(()) => Walked::SinceLast,
        None => {
            found.clear();
            walk_all(py, held, base, &lists, probe_node, blind, found)?;
            Walked::Full
        }
    };
    drop(probe);
    *resume = if blind {
        None
    } else {
        remember(py, base, previous.map(|r| r.sentinel), found)
    };
    Some(walked)
}

/// Every list whose head is in `lists`, from end to end, many chains at a time.
fn walk_all(
    py: Python<'_>,
    held: &[*mut ffi::PyObject],
    base: *mut ffi::PyTypeObject,
    lists: &[usize],
    probe_node: usize,
    blind: bool,
    found: &mut Vec<*mut ffi::PyObject>,
) -> Option<()> {
    let anchors = if blind {
        Vec::new()
    } else {
        anchor_nodes(py, held)
    };
    let mut stops = NodeSet::with_capacity(lists.len() + anchors.len());
    let mut starts: Vec<usize> = Vec::with_capacity(lists.len() + anchors.len());
    for &node in lists.iter().chain(anchors.iter()) {
        if stops.insert(node) {
            starts.push(node);
        }
    }
    let (matches, saw_probe) = walk_in_threads(&starts, &stops, probe_node, base)?;
    if !saw_probe {
        return None;
    }
    let mut types = SubtypeCache::new(base);
    for &anchor in &anchors {
        let (object, kind) = object_and_type(anchor);
        // SAFETY: an anchor is a live object, so its type is a live type.
        if unsafe { types.is_subtype(kind as *mut ffi::PyTypeObject) } {
            found.push(object as *mut ffi::PyObject);
        }
    }
    found.extend(matches.into_iter().map(|o| o as *mut ffi::PyObject));
    Some(())
}

/// The objects tracked since the last walk (after its sentinel, in the sentinel's
/// generation and every younger one) and those the last walk found that are still alive.
fn walk_since(
    py: Python<'_>,
    last: &Resume,
    heads: &[usize],
    permanent: Option<usize>,
    base: *mut ffi::PyTypeObject,
    found: &mut Vec<*mut ffi::PyObject>,
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
    // From the sentinel to the end of its list: the head there says which generation.
    let stop = follow(
        sentinel,
        |n| heads.contains(&n) || Some(n) == permanent,
        &mut keep,
    )?;
    let generation = heads.iter().position(|&h| h == stop)?; // None: frozen since
    for &head in &heads[..generation] {
        follow(head, |n| n == head, &mut keep)?;
    }
    // A collection may have moved an object found last time behind the sentinel: list
    // each object once.
    let mut listed = std::collections::HashSet::with_capacity(last.found.len());
    for weak in &last.found {
        if let Some(object) = weak.bind(py).upgrade() {
            listed.insert(object.as_ptr() as usize);
            found.push(object.as_ptr());
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

/// Leave a sentinel right after this walk and weak references to what it found; None if
/// some object takes no weak reference (then the next walk is a full one).
fn remember(
    py: Python<'_>,
    base: *mut ffi::PyTypeObject,
    sentinel: Option<Py<PyList>>,
    found: &[*mut ffi::PyObject],
) -> Option<Resume> {
    let mut weak = Vec::with_capacity(found.len());
    for &object in found {
        // SAFETY: every found object is alive: no Python code has run since the walk.
        let object = unsafe { Bound::from_borrowed_ptr(py, object) };
        weak.push(PyWeakrefReference::new(&object).ok()?.unbind());
    }
    let sentinel = sentinel.unwrap_or_else(|| PyList::empty(py).unbind());
    // Move the sentinel to the tail of generation 0, after everything seen so far.
    // SAFETY: a live list; untracking first, as tracking a tracked object is fatal.
    unsafe {
        ffi::PyObject_GC_UnTrack(sentinel.as_ptr() as *mut c_void);
        ffi::PyObject_GC_Track(sentinel.as_ptr() as *mut c_void);
    }
    Some(Resume {
        base: base as usize,
        sentinel,
        found: weak,
    })
}

/// Addresses of the matching objects met on a walk, and whether the probe was met.
type Chains = (Vec<usize>, bool);

/// Below this many chains a single thread is faster than starting others.
const CHAINS_PER_THREAD: usize = 256;
const MAX_THREADS: usize = 8;

/// How many threads a walk may use: `MEMLAB_RS_WALK_THREADS` if set, else the cores this
/// process may run on, at most `MAX_THREADS`.
pub fn thread_limit() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::env::var("MEMLAB_RS_WALK_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(cores.min(MAX_THREADS))
        .max(1)
}

/// Walk the chains starting at `starts`, split between threads: the objects met (start
/// points excluded) whose type is `base` or a subtype, and whether the probe was met.
fn walk_in_threads(
    starts: &[usize],
    stops: &NodeSet,
    probe_node: usize,
    base: *mut ffi::PyTypeObject,
) -> Option<Chains> {
    // Addresses cross threads as integers; nothing is ever written through them.
    let base = base as usize;
    let threads = (starts.len() / CHAINS_PER_THREAD).clamp(1, thread_limit());
    if threads == 1 {
        return walk_chains(starts.to_vec(), stops, probe_node, base);
    }
    // Deal the start points out by a hash of their address: chain lengths come in
    // patterns (a module's chain is short, its dict's long), which dealing in turn would
    // hand to the same thread.
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); threads];
    for &start in starts {
        groups[mix(start) % threads].push(start);
    }
    let results: Vec<Option<Chains>> = std::thread::scope(|scope| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|group| scope.spawn(move || walk_chains(group, stops, probe_node, base)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    let mut matches = Vec::new();
    let mut saw_probe = false;
    for result in results {
        let (part, probe) = result?;
        matches.extend(part);
        saw_probe |= probe;
    }
    Some((matches, saw_probe))
}

/// Step every chain in turn until each reaches a stop, keeping the objects whose type is
/// `base` or a subtype; None if a link is broken.
///
/// The type checks run on worker threads: `PyType_IsSubtype` only reads the type's MRO
/// tuple, which nothing can change while the GIL holder waits for this walk.
fn walk_chains(
    mut cursors: Vec<usize>,
    stops: &NodeSet,
    probe_node: usize,
    base: usize,
) -> Option<Chains> {
    let mut types = SubtypeCache::new(base as *mut ffi::PyTypeObject);
    let mut matches: Vec<usize> = Vec::new();
    let mut saw_probe = false;
    while !cursors.is_empty() {
        let mut i = 0;
        while i < cursors.len() {
            // SAFETY: every cursor is a node of a gc list, checked link by link.
            let next = unsafe { checked_next(cursors[i]) }?;
            if stops.contains(next) {
                cursors.swap_remove(i);
                continue;
            }
            saw_probe |= next == probe_node;
            let (object, kind) = object_and_type(next);
            // SAFETY: `kind` is the type of a live object. The probe (a list) never matches.
            if unsafe { types.is_subtype(kind as *mut ffi::PyTypeObject) } {
                matches.push(object);
            }
            cursors[i] = next;
            i += 1;
        }
    }
    Some((matches, saw_probe))
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

/// A module or dict that the collector tracks: it sits in a gc list with sound links.
fn is_tracked(object: *mut ffi::PyObject) -> bool {
    let node = node_of(object);
    // SAFETY: modules and dicts always carry a PyGC_Head; `next` is 0 when untracked.
    unsafe {
        let head = &*(node as *const GcHead);
        head.next != 0 && checked_next(node).is_some() && next_of(head.prev & PREV_MASK) == node
    }
}

/// A cheap, well-spread hash of a node address.
fn mix(node: usize) -> usize {
    ((node >> 4) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> 20
}

/// A set of node addresses with a hash cheap enough to run once per object.
struct NodeSet {
    slots: Vec<usize>,
    mask: usize,
}

impl NodeSet {
    fn with_capacity(n: usize) -> Self {
        let size = (n * 2).next_power_of_two().max(16);
        Self {
            slots: vec![0; size],
            mask: size - 1,
        }
    }

    fn slot(&self, node: usize) -> usize {
        let mut i = mix(node) & self.mask;
        while self.slots[i] != 0 && self.slots[i] != node {
            i = (i + 1) & self.mask;
        }
        i
    }

    /// Insert `node`; false if it was there already.
    fn insert(&mut self, node: usize) -> bool {
        let i = self.slot(node);
        let new = self.slots[i] != node;
        self.slots[i] = node;
        new
    }

    fn contains(&self, node: usize) -> bool {
        self.slots[self.slot(node)] == node
    }
}
