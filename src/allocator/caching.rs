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

/// Requests from 1 MiB up to this take a whole `LARGE_BUFFER` segment (kMinLargeAlloc).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// The segment a request between 1 and 10 MiB gets (kLargeBuffer; torch 2.9+ calls it
/// large_segment_size), and the page of an expandable segment of the large pool.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Larger requests get a segment of their size rounded up to this (kRoundLarge).
pub const ROUND_LARGE: u64 = 2 << 20;
/// `roundup_power2_divisions` has one value per power-of-two interval of sizes from 1 MiB
/// (index 0: below 2 MiB) to 64 GiB (index 15: everything above 32 GiB).
pub const DIVISION_INTERVALS: usize = 16;

/// `round_size` with `roundup_power2_divisions` (one value per interval, 0 or 1 for none):
/// torch's `round_size`, which rounds a request of more than `512 * divisions` bytes up to
/// the next of `divisions` equal steps between two powers of two.
pub fn round_size_divided(size: u64, divisions: &[u64; DIVISION_INTERVALS]) -> u64 {
    if size < MIN_BLOCK {
        return MIN_BLOCK;
    }
    let log_size = 63 - u64::from(size.leading_zeros());
    let index = (log_size.saturating_sub(20) as usize).min(DIVISION_INTERVALS - 1);
    let d = divisions[index];
    if d > 1 && size > MIN_BLOCK * d {
        roundup_power2_next_division(size, d)
    } else {
        round_size(size)
    }
}

/// torch's `roundup_power2_next_division`: `size` rounded up to the next of `divisions`
/// equal steps between the powers of two around it (1200 with 4 divisions: 1280).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down + step
    }
}

/// The segment torch's `get_allocation_size` asks cudaMalloc for when no cached block fits a
/// request of `size` (rounded) bytes.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_SEGMENT
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// Whether torch's `should_split` splits a free block of `block` bytes handed out for a
/// request of `size` (rounded) bytes: in the small pool and in expandable segments any
/// remainder of 512 bytes or more; in the large pool a remainder over 1 MiB, and only for a
/// request below `max_split_size`.
pub fn should_split(
    block: u64,
    size: u64,
    small: bool,
    expandable: bool,
    max_split: Option<u64>,
) -> bool {
    let remaining = block - size;
    if small || expandable {
        remaining >= MIN_BLOCK
    } else {
        max_split.is_none_or(|m| size < m) && remaining > SMALL_SIZE
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power2_divisions_round_as_torch_documents() {
        // torch's own example: 1200 bytes with 4 divisions between 1024 and 2048 -> 1280.
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(roundup_power2_next_division(1280, 4), 1280);
        assert_eq!(roundup_power2_next_division(1024, 4), 1024);
        let mut d = [0u64; DIVISION_INTERVALS];
        assert_eq!(round_size_divided(1, &d), 512);
        assert_eq!(round_size_divided(1200, &d), 1536);
        d = [4; DIVISION_INTERVALS];
        // 5 MiB + 1 lies between 4 and 8 MiB: steps of 1 MiB -> 6 MiB.
        assert_eq!(round_size_divided((5 << 20) + 1, &d), 6 << 20);
        // At most 512 * divisions bytes: plain 512-byte rounding.
        assert_eq!(round_size_divided(2000, &d), 2048);
    }

    #[test]
    fn allocation_sizes_follow_the_pools() {
        assert_eq!(allocation_size(512), 2 << 20);
        assert_eq!(allocation_size(1 << 20), 2 << 20);
        assert_eq!(allocation_size((1 << 20) + 512), 20 << 20);
        assert_eq!(allocation_size((10 << 20) - 512), 20 << 20);
        assert_eq!(allocation_size(10 << 20), 10 << 20);
        assert_eq!(allocation_size((30 << 20) + 1), 32 << 20);
    }

    #[test]
    fn splits_follow_the_pool_and_max_split() {
        assert!(should_split(2 << 20, 1 << 20, true, false, None));
        assert!(!should_split(20 << 20, 19 << 20, false, false, None));
        assert!(should_split(20 << 20, 4 << 20, false, false, None));
        assert!(!should_split(
            100 << 20,
            40 << 20,
            false,
            false,
            Some(40 << 20)
        ));
        assert!(should_split(20 << 20, 19 << 20, false, true, None));
    }
}
