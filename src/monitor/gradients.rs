//! Intermediate gradients: the gradients a backward passes between the nodes of the graph
//! that never become a leaf's `.grad` (the gradients of non-leaf tensors: of activations,
//! of the loss), what the original per-iteration profiler meant by the line. The figure is
//! the most bytes of them alive at once, each storage once, on the monitored device.
//!
//! How: at the start of a backward the monitor measures, `py::gradients::GradientLog::watch`
//! walks the graph from the backward's roots and puts a post-hook (`GradientNodeHook`) on
//! every node but `AccumulateGrad` (a leaf's); the monitor removes the hooks when the
//! backward returns. torch runs a node's post-hooks when the node has returned, while it
//! still holds the gradients it received: the hook logs the storages of those and of the
//! gradients it returned (and which go to an `AccumulateGrad`), then samples which logged
//! storages are alive: those received and returned here, and every one still waiting for
//! its node. At the end, a storage that went to a leaf is left out of every sample, for its
//! whole life (Linear's gradient of `weight.t()` is the weight's `.grad` once transposed
//! back: a weight gradient from the start), and the figure is the largest sample.
//!
//! Why node hooks and not the allocator: the allocator cannot tell a gradient from the
//! activations backward frees as it goes, so "peak minus start minus parameter gradients"
//! read 0 while megabytes of gradients were alive. A sample is taken per node, so a sum
//! made while two gradients of one tensor are added (both and their sum alive for a moment)
//! is not seen; the saved gradients and what they return are.
//!
//! Alive means the storage is: the log holds torch's weak reference to each storage
//! (`UntypedStorage._weak_ref`, what `torch.multiprocessing`'s `StorageWeakRef` holds),
//! which expires when the last tensor on it goes, whatever holds that tensor (the engine,
//! a view made in a node, the user). A weak reference to a Python tensor would follow that
//! object, not the memory.
//!
//! This file keeps the log's books, in plain Rust: which storages are watched, what each
//! node's end saw, the samples and their peak. `py/gradients.rs` asks torch (which weak
//! references expired, each gradient's storage) and hands the answers here; it holds the
//! log's lock only while no Python runs.

use std::collections::{HashMap, HashSet};

/// One storage's life as a gradient: its bytes, whether a leaf got it, and torch's weak
/// reference to it while it may be alive (None once it expired).
struct Slot {
    nbytes: i64,
    leaf: bool,
    weak: Option<usize>,
}

/// A gradient at a node's end: its storage's address and bytes, torch's weak reference to
/// the storage (None when the log already watches a storage at that address), and whether
/// it goes to a leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub ptr: i64,
    pub nbytes: i64,
    pub weak: Option<usize>,
    pub leaf: bool,
}

/// A watched storage: its slot, its address, torch's weak reference to it.
pub type Watched = (usize, i64, usize);

/// The books of one backward's gradients (and of backwards run inside it) on one device.
#[derive(Default)]
pub struct Log {
    slots: Vec<Slot>,
    /// Slots whose storage was alive at the last look, by storage address.
    live: HashMap<i64, usize>,
    /// The slots alive at each node's end.
    samples: Vec<Vec<usize>>,
    incomplete: bool,
    closed: bool,
}

impl Log {
    /// The storages watched now (to ask torch which expired), or None once closed.
    pub fn watched(&self) -> Option<Vec<Watched>> {
        if self.closed {
            return None;
        }
        Some(
            self.live
                .iter()
                .filter_map(|(&ptr, &slot)| self.slots[slot].weak.map(|w| (slot, ptr, w)))
                .collect(),
        )
    }

    /// One node's end: of `watched` (as `watched()` gave them), those `gone` expired;
    /// `seen` are the gradients the node received and returned. Logs them, samples what is
    /// alive, and returns torch's weak references to give back (expired ones, and those
    /// `seen` brought for a storage already watched).
    pub fn node_end(
        &mut self,
        watched: &[Watched],
        gone: &[bool],
        seen: Vec<Seen>,
        unreadable: bool,
    ) -> Vec<usize> {
        let mut to_free = Vec::new();
        self.incomplete |= unreadable;
        for (&(slot, ptr, _), gone) in watched.iter().zip(gone) {
            if *gone && self.live.get(&ptr) == Some(&slot) {
                self.live.remove(&ptr);
                to_free.extend(self.slots[slot].weak.take());
            }
        }
        let mut sample: HashSet<usize> = self.live.values().copied().collect();
        for s in seen {
            let slot = match self.live.get(&s.ptr) {
                Some(&slot) => {
                    to_free.extend(s.weak); // watched already
                    slot
                }
                None => match s.weak {
                    Some(weak) => {
                        self.slots.push(Slot {
                            nbytes: s.nbytes,
                            leaf: false,
                            weak: Some(weak),
                        });
                        let slot = self.slots.len() - 1;
                        self.live.insert(s.ptr, slot);
                        slot
                    }
                    None => continue, // it expired between the two looks: gone
                },
            };
            self.slots[slot].leaf |= s.leaf;
            sample.insert(slot);
        }
        self.samples.push(sample.into_iter().collect());
        to_free
    }

    /// The most bytes of intermediate gradients alive at once (0 when no node ran).
    pub fn peak(&self) -> i64 {
        self.samples
            .iter()
            .map(|sample| {
                sample
                    .iter()
                    .map(|&s| &self.slots[s])
                    .filter(|slot| !slot.leaf)
                    .fold(0i64, |total, slot| total.saturating_add(slot.nbytes))
            })
            .max()
            .unwrap_or(0)
    }

    /// Log nothing more; the weak references to give back.
    pub fn close(&mut self) -> Vec<usize> {
        self.closed = true;
        self.live.clear();
        self.take_weak()
    }

    /// Every weak reference still held (to give back), forgotten here.
    pub fn take_weak(&mut self) -> Vec<usize> {
        self.slots
            .iter_mut()
            .filter_map(|s| s.weak.take())
            .collect()
    }

    /// A gradient or a node could not be read: the figure may be low.
    pub fn set_incomplete(&mut self) {
        self.incomplete = true;
    }

    pub fn incomplete(&self) -> bool {
        self.incomplete
    }

    /// How many node ends were sampled.
    pub fn samples(&self) -> usize {
        self.samples.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(ptr: i64, nbytes: i64, weak: usize, leaf: bool) -> Seen {
        Seen {
            ptr,
            nbytes,
            weak: Some(weak),
            leaf,
        }
    }

    #[test]
    fn the_peak_is_the_largest_sample_without_what_went_to_leaves() {
        let mut log = Log::default();
        // Node 1 receives the loss's gradient (4 bytes) and returns 400 to its input and
        // 1000 to a leaf.
        let freed = log.node_end(
            &[],
            &[],
            vec![
                seen(1, 4, 11, false),
                seen(2, 400, 12, false),
                seen(3, 1000, 13, true),
            ],
            false,
        );
        assert!(freed.is_empty());
        let watched = log.watched().unwrap();
        assert_eq!(watched.len(), 3);
        // Node 2: the loss's gradient is gone; it receives 400 and returns 400 more.
        let gone: Vec<bool> = watched.iter().map(|&(_, ptr, _)| ptr == 1).collect();
        let freed = log.node_end(
            &watched,
            &gone,
            vec![seen(2, 400, 22, false), seen(4, 400, 14, false)],
            false,
        );
        assert_eq!(freed.len(), 2); // the loss gradient's, and the second look at 2's
        assert!(freed.contains(&11) && freed.contains(&22));
        assert_eq!(log.peak(), 800);
        assert_eq!(log.samples(), 2);
        let mut rest = log.close();
        rest.sort_unstable();
        assert_eq!(rest, vec![12, 13, 14]);
        assert!(log.watched().is_none() && log.take_weak().is_empty());
    }

    #[test]
    fn a_storage_that_went_to_a_leaf_is_left_out_of_every_sample() {
        let mut log = Log::default();
        log.node_end(&[], &[], vec![seen(7, 500, 1, false)], false);
        assert_eq!(log.peak(), 500);
        let watched = log.watched().unwrap();
        log.node_end(&watched, &[false], vec![seen(7, 500, 2, true)], true);
        assert_eq!(log.peak(), 0);
        assert!(log.incomplete());
    }
}
