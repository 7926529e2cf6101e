//! Models of the allocators whose counters the estimate predicts.
//!
//! CUDA: torch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) with its default
//! settings: requests rounded up to 512 bytes; requests up to 1 MiB served from the small
//! pool (2 MiB segments), larger ones from the large pool (20 MiB segments below 10 MiB,
//! otherwise the request rounded up to 2 MiB); the smallest free block that fits is taken
//! (lowest address among equals) and split when the rest is at least 512 bytes (small pool)
//! or more than 1 MiB (large pool), else handed out whole and counted whole, as
//! `memory_allocated` counts it; freed blocks merge with free neighbours; segments are never
//! given back (nothing calls `empty_cache` inside a step). The block layout itself is the
//! trace's replay (`trace::blocks::Layout`), driven here with addresses we choose.
//!
//! CPU: torch's CPU allocator asks `posix_memalign` for exactly the bytes requested and
//! caches nothing, so an allocation counts its size and nothing is reserved beyond it.

use crate::allocator::caching::{allocation_size, round_size, Layout, ROUND_LARGE, SMALL_SIZE};

/// The segment `cudaMalloc`ed when no cached block fits a request of `size` (rounded) bytes:
/// torch's `get_allocation_size`, as the allocator floor models it.
pub fn segment_size(size: u64) -> u64 {
    allocation_size(size)
}

/// Where the made-up address space ends: 2^62 bytes below it, room for any recording (a
/// subtraction that would pass zero saturates rather than panics).
const TOP_ADDRESS: u64 = 1 << 62;

/// Which allocator the replay models (`"cuda"` or `"cpu"` in a recording).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Cuda,
    Cpu,
}

/// One device's allocator: hands out blocks, counts reserved bytes.
pub struct Allocator {
    kind: Kind,
    layout: Layout,
    next_segment: u64,
    pub reserved: u64,
    pub peak_reserved: u64,
    pub segments: u64,
}

/// A block handed out: where, and how many bytes it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub addr: u64,
    pub bytes: u64,
}

impl Allocator {
    pub fn new(kind: Kind) -> Self {
        Allocator {
            kind,
            layout: Layout::default(),
            // Made-up addresses, each segment below the one before with a gap between: the
            // CUDA driver hands out address space from the top down, and where two free
            // blocks are the same size the caching allocator takes the lower address, so the
            // order matters (on an H200 a rising order put the reserved peaks of ResNet-18 at
            // batch 900 and 1900 and of a VGG-like stack 2-18% off the real ones; a falling
            // one matches them to the MiB).
            next_segment: TOP_ADDRESS,
            reserved: 0,
            peak_reserved: 0,
            segments: 0,
        }
    }

    /// Allocate `requested` bytes (not 0: torch allocates nothing for an empty storage).
    pub fn malloc(&mut self, requested: u64) -> Block {
        if self.kind == Kind::Cpu {
            self.reserved += requested;
            self.peak_reserved = self.peak_reserved.max(self.reserved);
            self.next_segment = self.next_segment.saturating_sub(requested.max(1));
            let addr = self.next_segment;
            return Block {
                addr,
                bytes: requested,
            };
        }
        let size = round_size(requested);
        let small = size <= SMALL_SIZE;
        let addr = match self.layout.best_fit(size, small) {
            Some(addr) => addr,
            None => {
                let segment = segment_size(size);
                self.next_segment = self.next_segment.saturating_sub(segment + ROUND_LARGE);
                let addr = self.next_segment;
                self.layout.segment_alloc(addr, segment, small);
                self.reserved += segment;
                self.segments += 1;
                self.peak_reserved = self.peak_reserved.max(self.reserved);
                addr
            }
        };
        // The block at `addr` is free and fits (best_fit or a fresh segment), so `alloc`
        // places it; the rounded size is the fallback should that ever not hold.
        let bytes = self.layout.alloc(addr, size, None).unwrap_or(size);
        Block { addr, bytes }
    }

    pub fn free(&mut self, block: Block) {
        match self.kind {
            Kind::Cpu => self.reserved -= block.bytes,
            Kind::Cuda => {
                self.layout.free_requested(block.addr);
                self.layout.free_completed(block.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_512_and_splits_small_segments() {
        let mut a = Allocator::new(Kind::Cuda);
        let x = a.malloc(1);
        assert_eq!(x.bytes, 512);
        let y = a.malloc(1000);
        assert_eq!(y.bytes, 1024);
        assert_eq!(y.addr, x.addr + 512);
        assert_eq!(a.reserved, 2 << 20);
    }

    #[test]
    fn large_block_not_split_counts_whole() {
        let mut a = Allocator::new(Kind::Cuda);
        // A 20 MiB segment for 19.5 MiB: the rest (0.5 MiB) is not more than 1 MiB, so the
        // whole segment is handed out and counted.
        let x = a.malloc((19 << 20) + (1 << 19));
        assert_eq!(x.bytes, 20 << 20);
        // 12 MiB gets its own 12 MiB segment.
        let y = a.malloc(12 << 20);
        assert_eq!(y.bytes, 12 << 20);
        assert_eq!(a.reserved, 32 << 20);
        // A 2 MiB request splits a 20 MiB segment: 18 MiB stays free.
        let z = a.malloc(2 << 20);
        assert_eq!(z.bytes, 2 << 20);
        assert_eq!(a.reserved, 52 << 20);
    }

    #[test]
    fn freed_blocks_merge_and_are_reused_best_fit() {
        let mut a = Allocator::new(Kind::Cuda);
        let x = a.malloc(4 << 20);
        let y = a.malloc(4 << 20);
        a.free(x);
        a.free(y);
        // Merged back into one 20 MiB free block: an 8 MiB request reuses it.
        let z = a.malloc(8 << 20);
        assert_eq!(z.addr, x.addr);
        assert_eq!(a.reserved, 20 << 20);
        assert_eq!(segment_size(11 << 20), 12 << 20);
    }

    #[test]
    fn newer_segments_lie_lower_and_win_ties() {
        let mut a = Allocator::new(Kind::Cuda);
        let older = a.malloc(30 << 20);
        let newer = a.malloc(30 << 20);
        assert!(newer.addr < older.addr);
        a.free(older);
        a.free(newer);
        // Two free 30 MiB blocks: the caching allocator takes the lower address, which the
        // driver gave the newer segment.
        assert_eq!(a.malloc(30 << 20).addr, newer.addr);
        assert_eq!(a.reserved, 60 << 20);
    }

    #[test]
    fn cpu_counts_requested_bytes() {
        let mut a = Allocator::new(Kind::Cpu);
        let x = a.malloc(1001);
        assert_eq!(x.bytes, 1001);
        a.free(x);
        assert_eq!(a.reserved, 0);
        assert_eq!(a.peak_reserved, 1001);
    }
}
