//! torch's CUDA caching allocator, modelled: how a request is rounded to a block, how a
//! cached block is split or handed out whole, how free neighbours merge
//! (c10/cuda/CUDACachingAllocator.cpp, default settings). The trace replays a recorded
//! history through it to learn each allocation's real block size; the estimate drives it
//! with the allocations of a fake step to predict the counters.

use std::collections::BTreeMap;

pub const MIN_BLOCK: u64 = 512;
pub const SMALL_SIZE: u64 = 1 << 20;
pub const SMALL_SEGMENT: u64 = 2 << 20;

/// Bytes a storage occupies on its device as the allocator sees it.
pub fn allocated_bytes(device: &str, nbytes: u64) -> u64 {
    if device.starts_with("cuda") && nbytes > 0 {
        nbytes.div_ceil(MIN_BLOCK) * MIN_BLOCK
    } else {
        nbytes
    }
}

pub fn round_size(size: u64) -> u64 {
    size.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Allocated,
    Pending,
    Free,
}

#[derive(Clone, Copy, Debug)]
pub struct SimBlock {
    pub size: u64,
    pub segment: u64,
    pub small: bool,
    pub state: State,
}

/// The replayed layout of one device's segments (the estimate drives it too, choosing
/// addresses itself with `best_fit`).
#[derive(Default)]
pub struct Layout {
    pub blocks: BTreeMap<u64, SimBlock>,
    /// Segment start -> size.
    pub segments: BTreeMap<u64, u64>,
}

impl Layout {
    pub fn segment_alloc(&mut self, addr: u64, size: u64, small: bool) {
        self.segments.insert(addr, size);
        self.blocks.insert(
            addr,
            SimBlock {
                size,
                segment: addr,
                small,
                state: State::Free,
            },
        );
    }

    pub fn segment_free(&mut self, addr: u64, size: u64) {
        self.segments.remove(&addr);
        let doomed: Vec<u64> = self
            .blocks
            .range(addr..addr + size)
            .map(|(a, _)| *a)
            .collect();
        for a in doomed {
            self.blocks.remove(&a);
        }
    }

    /// The block the allocator hands out for `requested` bytes at `addr`, or None when the
    /// replay has no free block there.
    pub fn alloc(&mut self, addr: u64, requested: u64, max_split: Option<u64>) -> Option<u64> {
        let size = round_size(requested);
        let block = self.blocks.get_mut(&addr)?;
        if block.state != State::Free || block.size < size {
            return None;
        }
        let remaining = block.size - size;
        let split = if block.small {
            remaining >= MIN_BLOCK
        } else {
            max_split.is_none_or(|m| size < m) && remaining > SMALL_SIZE
        };
        block.state = State::Allocated;
        if !split {
            return Some(block.size);
        }
        block.size = size;
        let rest = SimBlock {
            size: remaining,
            state: State::Free,
            ..*block
        };
        self.blocks.insert(addr + size, rest);
        Some(size)
    }

    /// The free block the caching allocator picks for a request of `size` (rounded) bytes
    /// in one pool: the smallest that fits, the lowest address among equals (its pools are
    /// sets ordered by size, then address).
    pub fn best_fit(&self, size: u64, small: bool) -> Option<u64> {
        self.blocks
            .iter()
            .filter(|(_, b)| b.state == State::Free && b.small == small && b.size >= size)
            .min_by_key(|(addr, b)| (b.size, **addr))
            .map(|(addr, _)| *addr)
    }

    pub fn free_requested(&mut self, addr: u64) {
        if let Some(block) = self.blocks.get_mut(&addr) {
            block.state = State::Pending;
        }
    }

    /// The block at `addr` is free for reuse: merge it with free neighbours in its segment.
    pub fn free_completed(&mut self, addr: u64) {
        let Some(mut block) = self.blocks.get(&addr).copied() else {
            return;
        };
        block.state = State::Free;
        let mut start = addr;
        if let Some((&prev_addr, prev)) = self.blocks.range(..addr).next_back() {
            if prev.state == State::Free
                && prev.segment == block.segment
                && prev_addr + prev.size == addr
            {
                block.size += prev.size;
                start = prev_addr;
                self.blocks.remove(&addr);
            }
        }
        let next_addr = start + block.size;
        if let Some(next) = self.blocks.get(&next_addr).copied() {
            if next.state == State::Free && next.segment == block.segment {
                block.size += next.size;
                self.blocks.remove(&next_addr);
            }
        }
        self.blocks.insert(start, block);
    }
}
