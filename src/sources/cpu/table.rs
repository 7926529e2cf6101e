//! The live CPU allocations and their counters: what the allocator hook and the dispatch-mode
//! fallback both feed, and what every CPU reader (the line profiler's source) reads.
//!
//! The counters take the names of `torch.cuda.memory_stats()`: bytes and allocations, each
//! with its current value, its peak since the last reset, and the totals ever allocated and
//! freed. They are atomics so that a sample reads them without taking the table's lock; the
//! writers change them only while holding it, so a free is never counted before the
//! allocation it undoes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// The statistics, in `torch.cuda.memory_stats()` names: four of bytes, three of counts.
pub const STATS: [&str; 7] = [
    "allocated_bytes",
    "active_bytes",
    "reserved_bytes",
    "requested_bytes",
    "allocation",
    "active",
    "segment",
];
/// The fields of each statistic, in the order `Counters::read` fills them.
pub const FIELDS: [&str; 4] = ["current", "peak", "allocated", "freed"];

const CURRENT: usize = 0;
const PEAK: usize = 1;
const ALLOCATED: usize = 2;
const FREED: usize = 3;

/// Bytes and allocation counts: current, peak since the last reset, allocated, freed.
pub struct Counters {
    bytes: [AtomicI64; 4],
    count: [AtomicI64; 4],
}

pub static COUNTERS: Counters = Counters {
    bytes: [const { AtomicI64::new(0) }; 4],
    count: [const { AtomicI64::new(0) }; 4],
};

impl Counters {
    /// A new storage of `nbytes` (the fallback calls it directly: it has no table).
    pub fn allocated(&self, nbytes: i64) {
        bump(&self.bytes, nbytes);
        bump(&self.count, 1);
    }

    /// A storage that existed before tracking started: live from now on, but not counted as
    /// allocated (nothing profiled made it).
    pub fn adopted(&self, nbytes: i64) {
        for (stat, amount) in [(&self.bytes, nbytes), (&self.count, 1)] {
            let now = stat[CURRENT].fetch_add(amount, Relaxed) + amount;
            stat[PEAK].fetch_max(now, Relaxed);
        }
    }

    pub fn freed(&self, nbytes: i64) {
        for (stat, amount) in [(&self.bytes, nbytes), (&self.count, 1)] {
            stat[CURRENT].fetch_sub(amount, Relaxed);
            stat[FREED].fetch_add(amount, Relaxed);
        }
    }

    fn zero(&self) {
        for stat in [&self.bytes, &self.count] {
            for field in stat {
                field.store(0, Relaxed);
            }
        }
    }

    /// Current live bytes and allocations.
    pub fn live(&self) -> (i64, i64) {
        (
            self.bytes[CURRENT].load(Relaxed),
            self.count[CURRENT].load(Relaxed),
        )
    }

    /// Set each peak to its current value.
    pub fn reset_peaks(&self) {
        for stat in [&self.bytes, &self.count] {
            stat[PEAK].store(stat[CURRENT].load(Relaxed), Relaxed);
        }
    }

    /// Fill `out` in `Layout::cpu()` order: four byte statistics, then three counts, each
    /// as current, peak, allocated, freed. (CPU memory has no cache: allocated, active,
    /// reserved and requested bytes are the same number.)
    pub fn read(&self, out: &mut [i64]) {
        let fields = |stat: &[AtomicI64; 4]| {
            [CURRENT, PEAK, ALLOCATED, FREED].map(|field| stat[field].load(Relaxed))
        };
        let (bytes, count) = (fields(&self.bytes), fields(&self.count));
        for (i, chunk) in out.chunks_mut(4).enumerate() {
            chunk.copy_from_slice(if i < 4 { &bytes } else { &count });
        }
    }
}

fn bump(stat: &[AtomicI64; 4], amount: i64) {
    let now = stat[CURRENT].fetch_add(amount, Relaxed) + amount;
    stat[PEAK].fetch_max(now, Relaxed);
    stat[ALLOCATED].fetch_add(amount, Relaxed);
}

/// Hashes an address: a multiply spreads the aligned low bits (no SipHash on the hot path).
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8 | byte as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, value: usize) {
        self.0 = (value as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
}

/// One live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub nbytes: i64,
    /// Alive before tracking started (found by the baseline walk), not seen allocated.
    pub adopted: bool,
    /// The Python stack of its allocation in the CPU trace running now (`record`'s stack id;
    /// 0: allocated before that trace began, or with no Python stack). It fits in the
    /// struct's padding, so it costs the table no memory.
    pub stack: u32,
}

/// Live allocations by address.
pub type Live = HashMap<usize, Entry, BuildHasherDefault<AddressHasher>>;

pub struct Table {
    live: Live,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// The table, locked. Never held while calling Python or the allocator.
pub fn lock() -> MutexGuard<'static, Option<Table>> {
    TABLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Forget every allocation and zero the counters (tracking starts from here).
pub fn reset(table: &mut Option<Table>) {
    *table = Some(Table {
        live: Live::default(),
    });
    COUNTERS.zero();
}

impl Table {
    /// A new allocation at `address`. An address still in the table was freed by a path
    /// we did not see: that allocation is counted freed first, and returned.
    pub fn allocated(&mut self, address: usize, nbytes: i64) -> Option<Entry> {
        self.allocated_from(address, nbytes, 0)
    }

    /// `allocated`, made by the Python stack `stack` of the CPU trace running now.
    pub fn allocated_from(&mut self, address: usize, nbytes: i64, stack: u32) -> Option<Entry> {
        let entry = Entry {
            nbytes,
            adopted: false,
            stack,
        };
        let stale = self.live.insert(address, entry);
        if let Some(stale) = stale {
            COUNTERS.freed(stale.nbytes);
        }
        COUNTERS.allocated(nbytes);
        stale
    }

    /// `address` is being freed; ignored unless we counted it. Returns what it was.
    pub fn freed(&mut self, address: usize) -> Option<Entry> {
        let gone = self.live.remove(&address);
        if let Some(gone) = gone {
            COUNTERS.freed(gone.nbytes);
        }
        gone
    }

    /// An adopted storage's Python object died. Storages torch's CPU allocator made were
    /// already forgotten by `freed`; the others (numpy's memory, `torch.load(mmap=True)`)
    /// never reach the hook and leave here. An allocation made at the address since is not
    /// touched. Returns whether it left.
    pub fn adopted_gone(&mut self, address: usize, nbytes: i64) -> bool {
        let gone = self
            .live
            .get(&address)
            .is_some_and(|entry| entry.adopted && entry.nbytes == nbytes);
        if gone {
            self.live.remove(&address);
            COUNTERS.freed(nbytes);
        }
        gone
    }

    /// A storage alive before tracking started. Already known (made since): nothing to do.
    pub fn adopt(&mut self, address: usize, nbytes: i64) {
        if nbytes > 0 && !self.live.contains_key(&address) {
            let entry = Entry {
                nbytes,
                adopted: true,
                stack: 0,
            };
            self.live.insert(address, entry);
            COUNTERS.adopted(nbytes);
        }
    }

    /// The bytes recorded at `address`, if any.
    pub fn get(&self, address: usize) -> Option<i64> {
        self.live.get(&address).map(|entry| entry.nbytes)
    }

    /// Every live allocation, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (usize, Entry)> + '_ {
        self.live.iter().map(|(&address, &entry)| (address, entry))
    }

    /// Forget every allocation's stack (a CPU trace starts: none of them is its own).
    pub fn clear_stacks(&mut self) {
        for entry in self.live.values_mut() {
            entry.stack = 0;
        }
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Bytes of every live allocation (the counters must agree).
    pub fn live_bytes(&self) -> i64 {
        self.live.values().map(|entry| entry.nbytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A random sequence of allocations, frees (known and unknown addresses, reused
    /// addresses) and adoptions against a plain model: the counters always match.
    #[test]
    fn counters_follow_a_model_of_random_sequences() {
        let mut guard = lock();
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            reset(&mut guard);
            let table = guard.as_mut().unwrap();
            // address -> (bytes, adopted)
            let mut model: HashMap<usize, (i64, bool)> = HashMap::new();
            let (mut allocated, mut freed, mut peak, mut count_allocated) = (0i64, 0i64, 0, 0);
            for _ in 0..500 {
                let address = (next() % 64) as usize * 64;
                let nbytes = (next() % 4096) as i64 + 1;
                match next() % 4 {
                    0 => {
                        table.allocated(address, nbytes);
                        if let Some((stale, _)) = model.insert(address, (nbytes, false)) {
                            freed += stale;
                        }
                        allocated += nbytes;
                        count_allocated += 1;
                    }
                    1 => {
                        table.freed(address);
                        if let Some((gone, _)) = model.remove(&address) {
                            freed += gone;
                        }
                    }
                    2 => {
                        table.adopt(address, nbytes);
                        model.entry(address).or_insert((nbytes, true));
                    }
                    _ => {
                        // The adopted storage's own size, or another one (not it).
                        let size = match model.get(&address) {
                            Some(&(known, true)) if next() % 2 == 0 => known,
                            _ => nbytes,
                        };
                        table.adopted_gone(address, size);
                        if model.get(&address) == Some(&(size, true)) {
                            model.remove(&address);
                            freed += size;
                        }
                    }
                }
                let live: i64 = model.values().map(|(n, _)| n).sum();
                peak = peak.max(live);
                let mut out = [0i64; 28];
                COUNTERS.read(&mut out);
                assert_eq!(out[0], live);
                assert_eq!(out[1], peak);
                assert_eq!(out[2], allocated);
                assert_eq!(out[3], freed);
                assert_eq!(out[16], model.len() as i64);
                assert_eq!(out[18], count_allocated);
                assert_eq!(table.live_bytes(), live);
            }
        }
        *guard = None;
    }
}
