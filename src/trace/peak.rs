//! The live set at the peak: replay the block sizes and keep the moment allocated bytes were
//! highest (the first such moment), as `max_memory_allocated` sees it.

use super::blocks::Sizes;
use super::model::{Action, DeviceTrace, IntMap, StackId, StrId, NONE};

/// One allocation alive at the peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    pub addr: u64,
    pub bytes: u64,
    pub stack: StackId,
    pub tag: StrId,
    /// Alive before the recording began.
    pub untraced: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Peak {
    /// Allocated bytes before the first event.
    pub start_bytes: u64,
    /// The highest allocated bytes (`Max mem`).
    pub max_bytes: u64,
    /// The event after which the peak was reached (None: at the start).
    pub peak_event: Option<usize>,
    pub peak_time_us: i64,
    /// Bytes alive at the start plus bytes allocated up to the peak (`Total mem allocated`).
    pub total_allocated: u64,
    /// Allocated bytes after the last event.
    pub end_bytes: u64,
    /// Frees of addresses the replay did not hold.
    pub unmatched_frees: usize,
    pub live: Vec<Live>,
}

/// Allocated bytes after each event (the running total the timeline draws).
pub fn running_total(device: &DeviceTrace, sizes: &Sizes) -> (u64, Vec<u64>) {
    let start: u64 = sizes.untraced.iter().map(|u| u.bytes).sum();
    let mut current = start;
    let totals = device
        .events
        .iter()
        .zip(&sizes.bytes)
        .map(|(event, &bytes)| {
            match event.action {
                Action::Alloc => current += bytes,
                Action::FreeRequested => current = current.saturating_sub(bytes),
                _ => {}
            }
            current
        })
        .collect();
    (start, totals)
}

pub fn peak(device: &DeviceTrace, sizes: &Sizes, totals: &[u64], start_bytes: u64) -> Peak {
    let mut out = Peak {
        start_bytes,
        max_bytes: start_bytes,
        end_bytes: totals.last().copied().unwrap_or(start_bytes),
        ..Peak::default()
    };
    for (i, &total) in totals.iter().enumerate() {
        if total > out.max_bytes {
            out.max_bytes = total;
            out.peak_event = Some(i);
        }
    }
    let mut live: IntMap<u64, Live> =
        IntMap::with_capacity_and_hasher(sizes.untraced.len() + 1024, Default::default());
    for u in &sizes.untraced {
        live.insert(
            u.addr,
            Live {
                addr: u.addr,
                bytes: u.bytes,
                stack: u.stack,
                tag: NONE,
                untraced: true,
            },
        );
    }
    let mut allocated = start_bytes;
    let until = out.peak_event.map_or(0, |i| i + 1);
    for (event, &bytes) in device.events[..until].iter().zip(&sizes.bytes) {
        match event.action {
            Action::Alloc => {
                allocated += bytes;
                live.insert(
                    event.addr,
                    Live {
                        addr: event.addr,
                        bytes,
                        stack: event.stack,
                        tag: event.tag,
                        untraced: false,
                    },
                );
            }
            Action::FreeRequested if live.remove(&event.addr).is_none() => {
                out.unmatched_frees += 1;
            }
            _ => {}
        }
    }
    out.total_allocated = allocated;
    out.peak_time_us = out.peak_event.map_or_else(
        || device.events.first().map_or(0, |e| e.time_us),
        |i| device.events[i].time_us,
    );
    let mut live: Vec<Live> = live.into_values().collect();
    live.sort_by_key(|l| l.addr);
    out.live = live;
    out
}
