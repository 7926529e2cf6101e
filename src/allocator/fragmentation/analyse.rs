//! The snapshot's segments summed up: reserved minus allocated by pool, stream and segment,
//! free blocks by size, the largest free block, inactive split bytes, and the expandable
//! allocator's view of the same blocks. Pure: an `Input` in, a `Fragmentation` out.

use std::collections::BTreeMap;

use super::input::{BlockState, Input, Placed, Segment};
use super::request::verdict;
use super::result::{
    ExpandableView, Fragmentation, FreeBlock, PoolRow, SegmentRow, SizeRange, VERSION,
};
use super::view::{page, pool_name, whole_pages, View};
use super::FieldError;

/// torch's `inactive_split_bytes` of one segment: free blocks of a segment split into
/// several blocks (expandable segments are left out, as torch leaves them out).
fn inactive_split(seg: &Segment, blocks: &[Placed]) -> u64 {
    if seg.is_expandable || blocks.len() < 2 {
        return 0;
    }
    blocks
        .iter()
        .filter(|b| b.state == BlockState::Free)
        .map(|b| b.size)
        .sum()
}

fn sum_state(blocks: &[Placed], state: BlockState) -> u64 {
    blocks
        .iter()
        .filter(|b| b.state == state)
        .map(|b| b.size)
        .sum()
}

/// The analysis of `input` (and its request's verdict, when it has one); a ValueError-worthy
/// `FieldError` naming the field when the snapshot is damaged.
pub fn analyse(input: &Input) -> Result<Fragmentation, FieldError> {
    let view = View::new(input)?;
    let mut pools: BTreeMap<([u64; 2], String, u64), PoolRow> = BTreeMap::new();
    let mut segments = Vec::with_capacity(view.segments.len());
    let mut ranges: BTreeMap<u32, SizeRange> = BTreeMap::new();
    let mut largest: Option<FreeBlock> = None;
    let mut packed: BTreeMap<([u64; 2], String, u64), (u64, u64)> = BTreeMap::new();
    let (mut allocated, mut pending, mut free, mut split, mut reclaimable) = (0, 0, 0, 0, 0);
    for (seg, blocks) in view.segments.iter().zip(&view.blocks) {
        let pool = pool_name(seg.segment_type);
        let seg_alloc = sum_state(blocks, BlockState::Allocated);
        let seg_pending = sum_state(blocks, BlockState::Pending);
        let seg_free = sum_state(blocks, BlockState::Free);
        let seg_split = inactive_split(seg, blocks);
        let frees: Vec<&Placed> = blocks
            .iter()
            .filter(|b| b.state == BlockState::Free)
            .collect();
        let seg_largest = frees.iter().map(|b| b.size).max().unwrap_or(0);
        let pg = page(seg.segment_type);
        for b in &frees {
            let bucket = 63 - b.size.leading_zeros();
            let r = ranges.entry(bucket).or_insert(SizeRange {
                from: 1 << bucket,
                to: 1u64.checked_shl(bucket + 1).unwrap_or(u64::MAX),
                blocks: 0,
                bytes: 0,
            });
            r.blocks += 1;
            r.bytes += b.size;
            reclaimable += whole_pages(seg.address, b.address, b.size, pg);
            // The largest, the lowest address among equals.
            if largest.as_ref().is_none_or(|l| b.size > l.size) {
                largest = Some(FreeBlock {
                    address: b.address,
                    size: b.size,
                    pool: pool.clone(),
                    pool_id: seg.segment_pool_id,
                    stream: seg.stream,
                    segment: seg.address,
                });
            }
        }
        let key = (seg.segment_pool_id, pool.clone(), seg.stream);
        let row = pools.entry(key.clone()).or_insert(PoolRow {
            pool: pool.clone(),
            pool_id: seg.segment_pool_id,
            stream: seg.stream,
            segments: 0,
            reserved_bytes: 0,
            allocated_bytes: 0,
            pending_free_bytes: 0,
            free_bytes: 0,
            free_blocks: 0,
            largest_free: 0,
            inactive_split_bytes: 0,
        });
        row.segments += 1;
        row.reserved_bytes += seg.total_size;
        row.allocated_bytes += seg_alloc;
        row.pending_free_bytes += seg_pending;
        row.free_bytes += seg_free;
        row.free_blocks += frees.len() as u64;
        row.largest_free = row.largest_free.max(seg_largest);
        row.inactive_split_bytes += seg_split;
        let p = packed.entry(key).or_insert((0, pg));
        p.0 += seg_alloc + seg_pending;
        segments.push(SegmentRow {
            address: seg.address,
            size: seg.total_size,
            pool,
            pool_id: seg.segment_pool_id,
            stream: seg.stream,
            expandable: seg.is_expandable,
            blocks: blocks.len() as u64,
            allocated_bytes: seg_alloc,
            pending_free_bytes: seg_pending,
            free_bytes: seg_free,
            largest_free: seg_largest,
        });
        allocated += seg_alloc;
        pending += seg_pending;
        free += seg_free;
        split += seg_split;
    }
    let mut pools: Vec<PoolRow> = pools.into_values().collect();
    pools.sort_by_key(|p| std::cmp::Reverse(p.free_bytes));
    let packed_reserved_bytes = packed
        .values()
        .map(|(bytes, pg)| bytes.div_ceil(*pg) * pg)
        .sum();
    let mut notices = Vec::new();
    if !view.settings.ignored.is_empty() {
        notices.push(format!(
            "allocator settings not modelled (they do not change which block a request gets): {}",
            view.settings.ignored.join(", ")
        ));
    }
    let r = &input.reported;
    for (what, said, found) in [
        ("reserved", r.reserved_bytes, view.reserved_bytes),
        ("allocated", r.allocated_bytes, allocated),
        ("inactive split", r.inactive_split_bytes, split),
    ] {
        if let Some(said) = said {
            if said != found {
                notices.push(format!(
                    "memory_stats() says {said} {what} bytes, the snapshot {found}: they were read at different moments, or the snapshot leaves out a memory pool"
                ));
            }
        }
    }
    let request = input.request.as_ref().map(|req| verdict(&view, req));
    Ok(Fragmentation {
        version: VERSION,
        device: format!("cuda:{}", input.device),
        settings: view.settings.clone(),
        reserved_bytes: view.reserved_bytes,
        allocated_bytes: allocated,
        pending_free_bytes: pending,
        free_bytes: free,
        inactive_split_bytes: split,
        reported: input.reported.clone(),
        largest_free: largest,
        pools,
        segments,
        free_sizes: ranges.into_values().collect(),
        expandable: ExpandableView {
            reclaimable_bytes: reclaimable,
            packed_reserved_bytes,
        },
        request,
        notices,
    })
}
