//! What a post-mortem's figures mean: the free bytes of each pool and stream, and advice
//! computed from them. Nothing here is canned: each piece of advice is given only when the
//! numbers say it applies, and names the bytes it is about.
//!
//! The caching allocator's rules used here (c10/cuda/CUDACachingAllocator.cpp): requests of
//! at most 1 MiB come from the small pool's 2 MiB segments, larger ones from the large pool;
//! a block serves only its own stream and pool; before it raises, the allocator has already
//! searched every free block of the request's pool and stream and released every cached
//! segment that was not split, so whatever free bytes remain sit in split segments. With
//! expandable segments the allocator unmaps the free 2 MiB pages of its segments and maps
//! pages at the end of one segment per stream, so a request needs free pages, not a
//! contiguous free block.

use std::collections::BTreeMap;

use super::result::{Advice, PoolFree, PostMortem, Segment};
use crate::text::size::human_bytes;

/// The granularity expandable segments map and unmap.
pub const PAGE: u64 = 2 << 20;
/// The largest request the small pool serves.
pub const SMALL_SIZE: u64 = 1 << 20;

fn size(bytes: u64) -> String {
    human_bytes(bytes as i128)
}

/// The post-mortem with its pools and advice computed from its facts.
pub fn complete(mut pm: PostMortem) -> PostMortem {
    pm.pools = pools(pm.cuda.as_ref().map_or(&[][..], |c| &c.segments));
    pm.advice = advice(&pm);
    pm
}

/// Free and reserved bytes per (pool, stream, segment type), most free first.
pub fn pools(segments: &[Segment]) -> Vec<PoolFree> {
    let mut by: BTreeMap<(String, i64, String), PoolFree> = BTreeMap::new();
    for s in segments {
        let key = (s.pool.clone(), s.stream, s.segment_type.clone());
        let row = by.entry(key).or_insert_with(|| PoolFree {
            pool: s.pool.clone(),
            stream: s.stream,
            segment_type: s.segment_type.clone(),
            reserved: 0,
            free: 0,
            largest_free: 0,
            segments: 0,
        });
        row.reserved = row.reserved.saturating_add(s.total_size);
        row.segments += 1;
        for &(_, b) in free_blocks(s) {
            row.free = row.free.saturating_add(b);
            row.largest_free = row.largest_free.max(b);
        }
    }
    let mut rows: Vec<PoolFree> = by.into_values().collect();
    rows.sort_by(|a, b| b.free.cmp(&a.free).then(a.stream.cmp(&b.stream)));
    rows
}

fn free_blocks(s: &Segment) -> impl Iterator<Item = &(u64, u64)> {
    s.free_blocks.iter()
}

/// The whole 2 MiB pages inside a free block at `offset` of its segment (segments start on
/// a page: the driver aligns allocations of 2 MiB and more to 2 MiB).
pub fn whole_pages(offset: u64, len: u64) -> u64 {
    let end = offset.saturating_add(len) / PAGE;
    let start = offset.div_ceil(PAGE);
    end.saturating_sub(start)
}

/// The bytes the failing request needed: the tensor's bytes when known, else what the
/// allocator asked of the driver (a whole segment: at least the request).
fn needed(pm: &PostMortem) -> Option<u64> {
    pm.request.bytes.or(pm.request.allocation_bytes)
}

fn segment_type_of(bytes: u64) -> &'static str {
    if bytes <= SMALL_SIZE {
        "small"
    } else {
        "large"
    }
}

/// Advice from the figures, most specific first.
pub fn advice(pm: &PostMortem) -> Vec<Advice> {
    let mut out = Vec::new();
    if let (Some(cuda), Some(need)) = (pm.cuda.as_ref(), needed(pm)) {
        let kind = segment_type_of(need);
        let pool = if pm.request.pool.is_empty() {
            "default"
        } else {
            pm.request.pool.as_str()
        };
        let mine = |s: &&Segment| {
            s.pool == pool
                && s.segment_type == kind
                && pm.request.stream.is_none_or(|st| s.stream == st)
        };
        let own: Vec<&Segment> = cuda.segments.iter().filter(mine).collect();
        let free: u64 = own
            .iter()
            .flat_map(|s| s.free_blocks.iter().map(|b| b.1))
            .sum();
        let largest = own
            .iter()
            .flat_map(|s| s.free_blocks.iter().map(|b| b.1))
            .max()
            .unwrap_or(0);
        let fragmented = free >= need && largest < need;
        if fragmented {
            out.push(Advice {
                kind: "fragmentation".into(),
                text: format!(
                    "Fragmentation: the {kind} pool of this stream had {} free in its \
                     reserved segments, more than the {} asked for, but its largest free \
                     block was {}: no block fitted.",
                    size(free),
                    size(need),
                    size(largest)
                ),
                bytes: Some(free),
            });
        }
        // Expandable segments: the free pages of every segment can be unmapped and mapped
        // again where the request needs them.
        let free_pages: u64 = cuda
            .segments
            .iter()
            .flat_map(|s| s.free_blocks.iter())
            .map(|&(off, len)| whole_pages(off, len))
            .sum::<u64>()
            .saturating_mul(PAGE);
        let reachable = free_pages.saturating_add(cuda.driver_free);
        let need_pages = need.div_ceil(PAGE).saturating_mul(PAGE);
        if fragmented && !cuda.expandable_segments && reachable >= need_pages {
            out.push(Advice {
                kind: "expandable_segments".into(),
                text: format!(
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would have avoided \
                     it: the free 2 MiB pages of the reserved segments ({}) and the \
                     driver's free memory ({}) together hold the {} the request needs, and \
                     expandable segments map pages where they are needed instead of \
                     needing one free block.",
                    size(free_pages),
                    size(cuda.driver_free),
                    size(need_pages)
                ),
                bytes: Some(free_pages),
            });
        }
        // max_split_size: large segments carved by requests smaller than this one.
        if fragmented && !cuda.expandable_segments && kind == "large" {
            let carved: u64 = own
                .iter()
                .filter(|s| {
                    s.total_size >= need
                        && !s.used_blocks.is_empty()
                        && s.used_blocks.iter().all(|&b| b < need)
                })
                .map(|s| s.total_size)
                .sum();
            if carved >= need && cuda.max_split_size.is_none() {
                let mb = need.div_ceil(1 << 20);
                out.push(Advice {
                    kind: "max_split_size".into(),
                    text: format!(
                        "Or PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{mb}: {} of segments \
                         large enough for this request were split by smaller ones; blocks \
                         above {mb} MiB are then kept whole for requests above it.",
                        size(carved)
                    ),
                    bytes: Some(carved),
                });
            }
        }
        // Free memory this stream or pool cannot use.
        let elsewhere: u64 = cuda
            .segments
            .iter()
            .filter(|s| !mine(s))
            .flat_map(|s| s.free_blocks.iter().map(|b| b.1))
            .sum();
        if elsewhere >= need {
            out.push(Advice {
                kind: "other_streams".into(),
                text: format!(
                    "{} are free in segments of other streams or pools, which this request \
                     cannot use: torch.cuda.empty_cache() after synchronizing would return \
                     the unsplit ones to the driver.",
                    size(elsewhere)
                ),
                bytes: Some(elsewhere),
            });
        }
        let used = cuda.total.saturating_sub(cuda.driver_free);
        let outside = used.saturating_sub(cuda.reserved);
        if let Some(process) = cuda.process_used {
            let others = used.saturating_sub(process);
            if others >= need {
                out.push(Advice {
                    kind: "outside_allocator".into(),
                    text: format!(
                        "Other processes use {} of this device, more than the request: \
                         without them it would have fitted.",
                        size(others)
                    ),
                    bytes: Some(others),
                });
            }
        } else if outside >= need && outside > cuda.total / 10 {
            out.push(Advice {
                kind: "outside_allocator".into(),
                text: format!(
                    "{} of the device is used outside torch's caching allocator (other \
                     processes, the CUDA context, libraries' own buffers).",
                    size(outside)
                ),
                bytes: Some(outside),
            });
        }
        if !fragmented {
            out.push(Advice {
                kind: "capacity".into(),
                text: format!(
                    "The device was full: {} of {} in use ({} reserved by torch, of which \
                     {} allocated), {} free, and the request needed {}. Less must be \
                     alive at this point.",
                    size(used),
                    size(cuda.total),
                    size(cuda.reserved),
                    size(cuda.allocated),
                    size(cuda.driver_free),
                    size(need)
                ),
                bytes: Some(need.saturating_sub(cuda.driver_free)),
            });
        }
    }
    activations(pm, &mut out);
    if let Some(b) = &pm.batch {
        let text = if b.fits == 0 {
            format!(
                "No batch fits the budget of {}: even batch 1 needs more (estimate).",
                size(b.budget)
            )
        } else {
            format!(
                "Batch {} fits: its estimated peak is {} of the {} budget (this step ran \
                 batch {}).",
                b.fits,
                size(b.peak_at_fit),
                size(b.budget),
                b.current
            )
        };
        out.push(Advice {
            kind: "batch".into(),
            text,
            bytes: Some(b.peak_at_fit),
        });
    }
    out
}

fn activations(pm: &PostMortem, out: &mut Vec<Advice>) {
    let allocated = pm.cuda.as_ref().map(|c| c.allocated);
    if let Some(a) = pm.autograd.as_ref().filter(|a| a.saved_bytes > 0) {
        let share = allocated
            .filter(|&t| t > 0)
            .map(|t| {
                format!(
                    " ({:.0}% of allocated)",
                    a.saved_bytes as f64 * 100.0 / t as f64
                )
            })
            .unwrap_or_default();
        out.push(Advice {
            kind: "activations".into(),
            text: format!(
                "Autograd holds {} in {} tensors saved for backward{share}: the \
                 activations of the forward pass.",
                size(a.saved_bytes),
                a.saved_count
            ),
            bytes: Some(a.saved_bytes),
        });
    }
    let modules: Vec<_> = pm
        .by_module
        .iter()
        .filter(|m| m.bytes > 0)
        .take(3)
        .collect();
    if !modules.is_empty() && (pm.autograd.is_some() || pm.history) {
        let held: u64 = modules.iter().map(|m| m.bytes).sum();
        let names = modules
            .iter()
            .map(|m| format!("{} ({})", m.location, size(m.bytes)))
            .collect::<Vec<_>>()
            .join(", ");
        out.push(Advice {
            kind: "checkpointing".into(),
            text: format!(
                "The modules holding the most: {names}. Activation checkpointing of them \
                 (torch.utils.checkpoint) would keep only their inputs, freeing up to {} \
                 at this point.",
                size(held)
            ),
            bytes: Some(held),
        });
    }
}
