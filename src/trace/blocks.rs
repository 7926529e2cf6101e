//! How many bytes each allocation really holds.
//!
//! torch's history records the *requested* size of an allocation, while `allocated_bytes` (and
//! so `max_memory_allocated`) counts the block the caching allocator handed out: the request
//! rounded up to 512 bytes, or a whole cached block when splitting it would leave too little
//! (up to 1 MiB more in the large pool). So the block sizes are replayed: starting from the
//! layout of every segment when recording began (our recorder keeps it), each allocation
//! takes the free block at its address and splits it by the allocator's rule, each completed
//! free merges with free neighbours, segments come and go. The replayed layout is checked
//! against the layout at the end of the snapshot; allocations the replay cannot place
//! (segments older than the history of a snapshot recorded by someone else, expandable
//! segments, non-default rounding) take the rounded request, and the report says how many.
//!
//! CPU recordings need none of this: a CPU allocation's size is its size.

use super::model::{Action, BlockState, DeviceTrace, Event, IntMap, Source, StackId, Trace};
use crate::allocator::caching::{round_size, Layout, SimBlock, State, SMALL_SEGMENT};

/// One allocation alive before the recorded events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Untraced {
    pub addr: u64,
    pub bytes: u64,
    pub stack: StackId,
}

/// Block bytes per event (allocations and free requests; 0 for other actions), the
/// allocations alive before the first event, and what could only be estimated.
#[derive(Clone, Debug, Default)]
pub struct Sizes {
    pub bytes: Vec<u64>,
    pub untraced: Vec<Untraced>,
    /// The start was inferred (no layout at the start of recording).
    pub inferred_start: bool,
    /// Allocations whose block size is the rounded request, not a replayed block.
    pub estimated: usize,
    /// Allocations alive at the end whose replayed size differed from the end layout's
    /// (taken from the end layout; a replay that is right leaves this 0).
    pub corrected: usize,
}

/// The block bytes of every event of `device`.
pub fn block_sizes(trace: &Trace, device: &DeviceTrace) -> Sizes {
    let events = &device.events;
    let mut sizes = Sizes {
        bytes: vec![0; events.len()],
        ..Sizes::default()
    };
    let exact = trace.source == Source::Cpu;
    // Live allocations: address -> bytes.
    let mut live: IntMap<u64, u64> =
        IntMap::with_capacity_and_hasher(events.len() / 2 + 16, Default::default());
    let mut layout = Layout::default();
    let expandable = trace.settings.expandable_segments
        || device.end.iter().any(|s| s.expandable)
        || device.start.iter().flatten().any(|s| s.expandable);
    let replay = !exact && !expandable && !trace.settings.power2_divisions;

    match &device.start {
        Some(start) => {
            for segment in start {
                if replay {
                    layout.segments.insert(segment.address, segment.total_size);
                }
                for block in &segment.blocks {
                    if replay {
                        let state = match block.state {
                            BlockState::Allocated => State::Allocated,
                            BlockState::PendingFree => State::Pending,
                            BlockState::Inactive => State::Free,
                        };
                        layout.blocks.insert(
                            block.address,
                            SimBlock {
                                size: block.size,
                                segment: segment.address,
                                small: segment.small,
                                state,
                            },
                        );
                    }
                    if block.state == BlockState::Allocated {
                        live.insert(block.address, block.size);
                        sizes.untraced.push(Untraced {
                            addr: block.address,
                            bytes: block.size,
                            stack: block.stack,
                        });
                    }
                }
            }
        }
        None => {
            sizes.inferred_start = true;
            sizes.untraced = infer_start(device, exact);
            for u in &sizes.untraced {
                live.insert(u.addr, u.bytes);
            }
        }
    }

    for (i, event) in events.iter().enumerate() {
        match event.action {
            Action::SegmentAlloc if replay => {
                layout.segment_alloc(event.addr, event.size, event.size == SMALL_SEGMENT)
            }
            Action::SegmentFree if replay => layout.segment_free(event.addr, event.size),
            Action::Alloc => {
                let bytes = if exact {
                    event.size
                } else {
                    let placed = if replay {
                        layout.alloc(event.addr, event.size, trace.settings.max_split_size)
                    } else {
                        None
                    };
                    placed.unwrap_or_else(|| {
                        sizes.estimated += 1;
                        round_size(event.size)
                    })
                };
                live.insert(event.addr, bytes);
                sizes.bytes[i] = bytes;
            }
            Action::FreeRequested => {
                sizes.bytes[i] = live.remove(&event.addr).unwrap_or(0);
                if replay {
                    layout.free_requested(event.addr);
                }
            }
            Action::FreeCompleted if replay => layout.free_completed(event.addr),
            _ => {}
        }
    }
    if !exact {
        correct_from_end(device, events, &mut sizes, &live);
    }
    sizes
}

/// Allocations alive at the end take their block size from the end layout, which is exact.
fn correct_from_end(
    device: &DeviceTrace,
    events: &[Event],
    sizes: &mut Sizes,
    live: &IntMap<u64, u64>,
) {
    let mut end: IntMap<u64, u64> = IntMap::default();
    for segment in &device.end {
        for block in &segment.blocks {
            if block.state == BlockState::Allocated {
                end.insert(block.address, block.size);
            }
        }
    }
    // The last allocation at each address still alive at the end.
    let mut last: IntMap<u64, usize> = IntMap::default();
    for (i, e) in events.iter().enumerate() {
        if e.action == Action::Alloc && live.contains_key(&e.addr) {
            last.insert(e.addr, i);
        }
    }
    for (addr, i) in last {
        if let Some(&true_size) = end.get(&addr) {
            if sizes.bytes[i] != true_size {
                sizes.bytes[i] = true_size;
                sizes.corrected += 1;
            }
        }
    }
    // Addresses freed somewhere in the history, gathered once: asking the events per
    // untraced allocation made this O(untraced x events).
    let freed: std::collections::HashSet<u64> = events
        .iter()
        .filter(|e| e.action == Action::FreeRequested)
        .map(|e| e.addr)
        .collect();
    for u in &mut sizes.untraced {
        if let Some(&true_size) = end.get(&u.addr) {
            if !freed.contains(&u.addr) {
                u.bytes = true_size;
            }
        }
    }
}

/// Without a start layout: what was alive before the first event is what the events free
/// without having allocated it, plus what the end layout holds that no event allocated.
fn infer_start(device: &DeviceTrace, exact: bool) -> Vec<Untraced> {
    let mut allocated: IntMap<u64, ()> = IntMap::default();
    let mut untraced = Vec::new();
    let mut seen_free_of_start: IntMap<u64, ()> = IntMap::default();
    for event in &device.events {
        match event.action {
            Action::Alloc => {
                allocated.insert(event.addr, ());
            }
            Action::FreeRequested
                if allocated.remove(&event.addr).is_none()
                    && seen_free_of_start.insert(event.addr, ()).is_none() =>
            {
                let bytes = if exact {
                    event.size
                } else {
                    round_size(event.size)
                };
                untraced.push(Untraced {
                    addr: event.addr,
                    bytes,
                    stack: event.stack,
                });
            }
            _ => {}
        }
    }
    let ever_allocated: std::collections::HashSet<u64> = device
        .events
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.addr)
        .collect();
    for segment in &device.end {
        for block in &segment.blocks {
            if block.state == BlockState::Allocated
                && !ever_allocated.contains(&block.address)
                && !seen_free_of_start.contains_key(&block.address)
            {
                untraced.push(Untraced {
                    addr: block.address,
                    bytes: block.size,
                    stack: block.stack,
                });
            }
        }
    }
    untraced
}
