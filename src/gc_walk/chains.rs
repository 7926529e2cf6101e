//! Following the collector's linked lists fast: many short chains stepped in turn, split
//! between threads.
//!
//! Following one linked list costs a cache miss per object (about 60 ns: 20 ms for a
//! process that imported torch) because each load waits for the one before. So the lists
//! are cut into many short chains, each starting at an object known to be alive and tracked
//! (see `lists::anchor_nodes`) and ending where the next start point or a list head begins,
//! so the chains cover each list exactly once. Chains are stepped in turn, keeping many
//! loads in flight, and split between threads.
//!
//! Reading from other threads is safe: the calling thread holds the GIL and runs no Python
//! code until the walk ends, so no object is created, freed or relinked meanwhile. The type
//! checks run there too: `PyType_IsSubtype` only reads the type's MRO tuple, which nothing
//! can change while the GIL holder waits for the walk.

use pyo3::ffi;

use super::head::{checked_next, HEAD_SIZE};
use super::SubtypeCache;

/// Addresses of the matching objects met on a walk, and whether the probe was met.
pub type Chains = (Vec<usize>, bool);

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
pub fn walk_in_threads(
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
pub fn object_and_type(node: usize) -> (usize, usize) {
    let object = node + HEAD_SIZE;
    // SAFETY: a node in a gc list precedes a live object, whose header holds its type.
    (
        object,
        unsafe { ffi::Py_TYPE(object as *mut ffi::PyObject) } as usize,
    )
}

/// A cheap, well-spread hash of a node address.
fn mix(node: usize) -> usize {
    ((node >> 4) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> 20
}

/// A set of node addresses with a hash cheap enough to run once per object.
pub struct NodeSet {
    slots: Vec<usize>,
    mask: usize,
}

impl NodeSet {
    pub fn with_capacity(n: usize) -> Self {
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
    pub fn insert(&mut self, node: usize) -> bool {
        let i = self.slot(node);
        let new = self.slots[i] != node;
        self.slots[i] = node;
        new
    }

    pub fn contains(&self, node: usize) -> bool {
        self.slots[self.slot(node)] == node
    }
}
