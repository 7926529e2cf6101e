//! Whether a request fits: torch's `DeviceCachingAllocator::malloc` replayed on the snapshot
//! (c10/cuda/CUDACachingAllocator.cpp): round the size, pick the pool, take the smallest
//! free block of that pool and stream (`get_free_block`, with its max_split_size rules),
//! else ask the device for a segment (`alloc_block`: the process's limit, then the device),
//! else release the cached segments that are wholly free (`release_cached_blocks`, after
//! waiting for other streams) and ask again, else out of memory. The same request is then
//! replayed as the expandable-segments allocator would meet it (pages unmapped from free
//! blocks and mapped where the request needs them), and with a `max_split_size_mb` that
//! would have kept big segments whole.

use std::collections::BTreeMap;

use super::input::{BlockState, Request, SegmentType, Settings};
use super::result::{Outcome, Scenario, Verdict};
use super::view::{page, pool_name, whole_pages, View};
use crate::allocator::caching::{
    allocation_size, round_size_divided, Layout, State, LARGE_BUFFER, SMALL_SIZE,
};

const MIB: u64 = 1 << 20;

/// A free block the request could take: (address, size, whether its segment is expandable).
type Free = (u64, u64, bool);

/// The free blocks of the request's pool and stream, with `skip` segments left out.
fn free_blocks(view: &View, req: &Request, t: SegmentType, skip: &[usize]) -> Vec<Free> {
    let mut out = Vec::new();
    for (k, (seg, blocks)) in view.segments.iter().zip(&view.blocks).enumerate() {
        if seg.segment_type != t
            || seg.stream != req.stream
            || seg.segment_pool_id != req.pool_id
            || skip.contains(&k)
        {
            continue;
        }
        for b in blocks.iter().filter(|b| b.state == BlockState::Free) {
            out.push((b.address, b.size, seg.is_expandable));
        }
    }
    out
}

/// torch's `get_free_block`: the smallest block of at least `size` bytes (the lowest
/// address among equals), then its two max_split_size rules, which it checks on that one
/// block only. With expandable segments off, blocks of expandable segments are passed over.
fn best_fit(blocks: &[Free], size: u64, s: &Settings, expandable: bool) -> Option<Free> {
    let found = blocks
        .iter()
        .filter(|(_, b, e)| *b >= size && (expandable || !*e))
        .min_by_key(|(a, b, _)| (*b, *a))
        .copied()?;
    if let Some(m) = s.max_split_size {
        // No oversize block for a request below max_split_size; an oversize request takes
        // a block at most max_non_split_rounding larger.
        if (size < m && found.1 >= m) || (size >= m && found.1 >= size + s.max_non_split_rounding) {
            return None;
        }
    }
    Some(found)
}

/// Whether the device gives `device` bytes, the process's limit checked on `counted`
/// bytes (torch checks its limit on the segment size even where it maps pages), with
/// `reserved` bytes reserved and `released` given back beforehand. None: unknown.
fn device_gives(
    view: &View,
    device: u64,
    counted: u64,
    reserved: u64,
    released: u64,
) -> Option<bool> {
    let reserved_after = reserved.saturating_sub(released);
    if let Some(allowed) = view.allowed_bytes {
        if reserved_after + counted > allowed {
            return Some(false);
        }
    }
    match view.device_free_bytes {
        Some(free) => Some(device <= free + released),
        // Memory the allocator gave back is the device's again, whatever else it holds.
        None if device <= released => Some(true),
        None => None,
    }
}

fn headroom(view: &View) -> Option<u64> {
    let limit = view
        .allowed_bytes
        .map(|a| a.saturating_sub(view.reserved_bytes));
    match (view.device_free_bytes, limit) {
        (Some(f), Some(l)) => Some(f.min(l)),
        (Some(f), None) => Some(f),
        (None, Some(_)) | (None, None) => None,
    }
}

/// Bytes `release_cached_blocks` gives back from segments that are not expandable: those
/// wholly free once other streams are waited for, in the default pools (a CUDA graph's pool
/// is released only once its graphs are gone, which the snapshot does not say).
fn unsplit_free(view: &View, skip: &[usize]) -> u64 {
    view.segments
        .iter()
        .zip(&view.blocks)
        .enumerate()
        .filter(|(k, (seg, blocks))| {
            !seg.is_expandable
                && seg.segment_pool_id == [0, 0]
                && !skip.contains(k)
                && blocks.iter().all(|b| b.state != BlockState::Allocated)
        })
        .map(|(_, (seg, _))| seg.total_size)
        .sum()
}

fn scenario(setting: String, outcome: Outcome, view: &View) -> Scenario {
    Scenario {
        setting,
        outcome,
        block: None,
        block_size: None,
        device_bytes: 0,
        released_bytes: 0,
        headroom_bytes: headroom(view),
        estimate: false,
    }
}

fn reuse(setting: String, block: Free, view: &View, estimate: bool) -> Scenario {
    Scenario {
        block: Some(block.0),
        block_size: Some(block.1),
        estimate,
        ..scenario(setting, Outcome::ReusesCachedBlock, view)
    }
}

/// The verdict on `req`: as configured, with expandable segments, with max_split_size.
pub fn verdict(view: &View, req: &Request) -> Verdict {
    let s = &view.settings;
    let size = round_size_divided(req.size, &s.roundup_power2_divisions);
    let t = if size <= SMALL_SIZE {
        SegmentType::Small
    } else {
        SegmentType::Large
    };
    let frees = free_blocks(view, req, t, &[]);
    let free_bytes: u64 = frees.iter().map(|f| f.1).sum();
    let largest_free = frees.iter().map(|f| f.1).max().unwrap_or(0);
    let configured = if s.expandable_segments {
        expandable(view, req, size, t, false)
    } else {
        caching(view, req, size, t)
    };
    let expandable_case = (!s.expandable_segments).then(|| expandable(view, req, size, t, true));
    let max_split = if s.expandable_segments || t == SegmentType::Small {
        None
    } else {
        max_split(view, req, size)
    };
    Verdict {
        request: req.clone(),
        rounded_bytes: size,
        pool: pool_name(t),
        free_bytes,
        largest_free,
        fragmented: free_bytes >= size && largest_free < size,
        configured,
        expandable: expandable_case,
        max_split,
    }
}

/// The default allocator: a cached block, else a new segment, else release and retry.
fn caching(view: &View, req: &Request, size: u64, t: SegmentType) -> Scenario {
    let s = &view.settings;
    let frees = free_blocks(view, req, t, &[]);
    if let Some(block) = best_fit(&frees, size, s, false) {
        return reuse(String::new(), block, view, false);
    }
    let segment = allocation_size(size);
    grow_or_release(
        String::new(),
        view,
        segment,
        segment,
        view.reserved_bytes,
        unsplit_free(view, &[]),
        false,
    )
}

fn grow_or_release(
    setting: String,
    view: &View,
    device: u64,
    counted: u64,
    reserved: u64,
    released: u64,
    estimate: bool,
) -> Scenario {
    let base = Scenario {
        device_bytes: device,
        estimate,
        ..scenario(setting, Outcome::GrowsCache, view)
    };
    if device_gives(view, device, counted, reserved, 0) == Some(true) {
        return base;
    }
    let outcome = match device_gives(view, device, counted, reserved, released) {
        Some(true) => Outcome::GrowsAfterRelease,
        Some(false) => Outcome::OutOfMemory,
        None => Outcome::NeedsDeviceMemory,
    };
    Scenario {
        outcome,
        released_bytes: released,
        ..base
    }
}

/// The expandable-segments allocator. `hypothetical`: the snapshot was taken without it,
/// so every segment is read as an expandable one laid out as it is (pages counted from
/// its start), and no segment has a free tail to extend (the conservative reading).
fn expandable(
    view: &View,
    req: &Request,
    size: u64,
    t: SegmentType,
    hypothetical: bool,
) -> Scenario {
    let setting = if hypothetical {
        "expandable_segments:True".to_string()
    } else {
        String::new()
    };
    let mut settings = view.settings.clone();
    settings.expandable_segments = true;
    let frees = free_blocks(view, req, t, &[]);
    if let Some(block) = best_fit(&frees, size, &settings, true) {
        return reuse(setting, block, view, false);
    }
    let pg = page(t);
    // The free tail of the lowest expandable segment of this pool and stream: what torch's
    // find_expandable_block extends first.
    let tail = view
        .segments
        .iter()
        .zip(&view.blocks)
        .find(|(seg, _)| {
            seg.is_expandable
                && seg.segment_type == t
                && seg.stream == req.stream
                && seg.segment_pool_id == req.pool_id
        })
        .and_then(|(seg, blocks)| {
            let last = blocks.last()?;
            (last.state == BlockState::Free).then_some((seg.address, *last))
        });
    let tail_bytes = tail.map_or(0, |(_, b)| b.size);
    let pages = |tail_bytes: u64| size.saturating_sub(tail_bytes).div_ceil(pg) * pg;
    let counted = allocation_size(size);
    let before = Scenario {
        device_bytes: pages(tail_bytes),
        ..scenario(setting.clone(), Outcome::GrowsCache, view)
    };
    if device_gives(view, pages(tail_bytes), counted, view.reserved_bytes, 0) == Some(true) {
        return before;
    }
    // release_cached_blocks: whole free pages of expandable segments unmapped (free blocks,
    // and pending ones once their streams are waited for), wholly free ordinary segments
    // released.
    let mut released = 0;
    let mut tail_unmapped = 0;
    for (seg, blocks) in view.segments.iter().zip(&view.blocks) {
        if seg.segment_pool_id != [0, 0] {
            continue;
        }
        if seg.is_expandable || hypothetical {
            let spg = page(seg.segment_type);
            for b in blocks.iter().filter(|b| b.state != BlockState::Allocated) {
                let w = whole_pages(seg.address, b.address, b.size, spg);
                released += w;
                if tail.is_some_and(|(a, tb)| a == seg.address && tb.address == b.address) {
                    tail_unmapped = w;
                }
            }
        } else if blocks.iter().all(|b| b.state != BlockState::Allocated) {
            released += seg.total_size;
        }
    }
    let device = pages(tail_bytes - tail_unmapped);
    let outcome = match device_gives(view, device, counted, view.reserved_bytes, released) {
        Some(true) => Outcome::GrowsAfterRelease,
        Some(false) => Outcome::OutOfMemory,
        None => Outcome::NeedsDeviceMemory,
    };
    Scenario {
        outcome,
        device_bytes: device,
        released_bytes: released,
        ..before
    }
}

/// With `max_split_size_mb:X`, a request below X never takes (and so never splits) a
/// block of X or more. Read from the snapshot: a large segment of X or more that is split
/// among blocks all below X would have stayed whole for the big allocation it was made
/// for, and been released when that was freed; its blocks would have lived in segments of
/// their own (replayed here through the caching model, packed in address order). An
/// estimate: it assumes the program's past, not only its present. The largest X that makes
/// the request fit wins; else the one that releases most.
fn max_split(view: &View, req: &Request, size: u64) -> Option<Scenario> {
    let eligible: Vec<(usize, u64, u64)> = view
        .segments
        .iter()
        .zip(&view.blocks)
        .enumerate()
        .filter(|(_, (seg, blocks))| {
            seg.segment_type == SegmentType::Large
                && !seg.is_expandable
                && seg.total_size > LARGE_BUFFER
                && blocks.len() > 1
        })
        .filter_map(|(k, (seg, blocks))| {
            let live = blocks
                .iter()
                .filter(|b| b.state != BlockState::Free)
                .map(|b| b.size)
                .max()?;
            Some((k, seg.total_size, live))
        })
        .collect();
    let mut candidates: Vec<u64> = eligible
        .iter()
        .map(|(_, total, _)| total / MIB)
        .filter(|mb| *mb > LARGE_BUFFER / MIB)
        .collect();
    candidates.sort_unstable_by(|a, b| b.cmp(a));
    candidates.dedup();
    let mut best: Option<(Scenario, i128)> = None;
    for mb in candidates {
        let x = mb * MIB;
        let affected: Vec<usize> = eligible
            .iter()
            .filter(|(_, total, live)| *total >= x && *live < x)
            .map(|(k, _, _)| *k)
            .collect();
        if affected.is_empty() {
            continue;
        }
        let scenario = with_max_split(view, req, size, x, &affected);
        if scenario.outcome.fits() == Some(true) {
            return Some(scenario);
        }
        let gain = scenario.released_bytes as i128 - scenario.device_bytes as i128;
        if best.as_ref().is_none_or(|(_, g)| gain > *g) {
            best = Some((scenario, gain));
        }
    }
    best.map(|(s, _)| s)
}

fn with_max_split(view: &View, req: &Request, size: u64, x: u64, affected: &[usize]) -> Scenario {
    let setting = format!("max_split_size_mb:{}", x / MIB);
    let mut settings = view.settings.clone();
    settings.max_split_size = Some(x);
    // The affected segments' blocks in use, replayed per stream into fresh segments.
    let mut layouts: BTreeMap<u64, Layout> = BTreeMap::new();
    let mut next_addr = 1u64 << 60; // addresses of the replay's own, apart from the device's
    for &k in affected {
        let seg = &view.segments[k];
        let layout = layouts.entry(seg.stream).or_default();
        for b in view.blocks[k]
            .iter()
            .filter(|b| b.state != BlockState::Free)
        {
            let addr = match layout.best_fit(b.size, false) {
                Some(a) if layout.blocks[&a].size < x => a,
                _ => {
                    let a = next_addr;
                    let segment = allocation_size(b.size);
                    next_addr += segment;
                    layout.segment_alloc(a, segment, false);
                    a
                }
            };
            layout.alloc(addr, b.size, Some(x));
        }
    }
    let extra: u64 = layouts.values().flat_map(|l| l.segments.values()).sum();
    let mut frees = free_blocks(view, req, SegmentType::Large, affected);
    if let Some(l) = layouts.get(&req.stream) {
        if req.pool_id == [0, 0] {
            frees.extend(
                l.blocks
                    .iter()
                    .filter(|(_, b)| b.state == State::Free)
                    .map(|(a, b)| (*a, b.size, false)),
            );
        }
    }
    if let Some(block) = best_fit(&frees, size, &settings, false) {
        let mut s = reuse(setting, block, view, true);
        // A block of the replay has no address on the device.
        if block.0 >= 1 << 60 {
            s.block = None;
        }
        return s;
    }
    let released = unsplit_free(view, affected)
        + affected
            .iter()
            .map(|&k| view.segments[k].total_size)
            .sum::<u64>();
    let segment = allocation_size(size);
    // The replay's segments take device memory the snapshot's affected ones gave back.
    let mut s = grow_or_release(
        setting,
        view,
        segment + extra,
        segment,
        view.reserved_bytes + extra,
        released,
        true,
    );
    s.device_bytes = segment;
    s
}
