//! Allocated bytes over the recording, downsampled for drawing: each sample is the highest
//! moment of its bucket of events (so the peak is drawn at its exact height), with the bytes
//! of the top locations at that moment stacked under it.

use std::collections::HashMap;

use super::blocks::Sizes;
use super::group::{NO_STACK, UNTRACED};
use super::model::{Action, DeviceTrace, IntMap, NONE};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    pub time_us: Vec<i64>,
    pub total: Vec<u64>,
    /// (location, bytes at each sample), biggest at the peak first, then "other".
    pub layers: Vec<(String, Vec<u64>)>,
    pub peak_index: usize,
    pub peak_bytes: u64,
}

/// `top` are the location keys to draw as layers (the rest is "other"); `locations` maps a
/// stack id to its key.
pub fn timeline(
    device: &DeviceTrace,
    sizes: &Sizes,
    totals: &[u64],
    start_bytes: u64,
    top: &[String],
    locations: &[String],
    max_points: usize,
) -> Timeline {
    let layer_of: HashMap<&str, usize> = top
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i))
        .collect();
    let other = top.len();
    let layer = |key: &str| layer_of.get(key).copied().unwrap_or(other);
    let stack_layer = |stack: u32| {
        if stack == NONE {
            layer(NO_STACK)
        } else {
            layer(&locations[stack as usize])
        }
    };
    let mut current = vec![0u64; top.len() + 1];
    let mut held: IntMap<u64, (usize, u64)> = IntMap::default();
    for u in &sizes.untraced {
        let l = layer(UNTRACED);
        current[l] += u.bytes;
        held.insert(u.addr, (l, u.bytes));
    }
    let events = &device.events;
    let bucket = events.len().div_ceil(max_points.max(1)).max(1);
    let first_time = events.first().map_or(0, |e| e.time_us);
    let mut out = Timeline {
        time_us: vec![first_time],
        total: vec![start_bytes],
        layers: top
            .iter()
            .cloned()
            .chain(std::iter::once("other".to_owned()))
            .map(|k| (k, Vec::new()))
            .collect(),
        peak_index: 0,
        peak_bytes: start_bytes,
    };
    for (l, value) in current.iter().enumerate() {
        out.layers[l].1.push(*value);
    }
    let mut best: Option<(i64, u64, Vec<u64>)> = None;
    for (i, event) in events.iter().enumerate() {
        match event.action {
            Action::Alloc => {
                let l = stack_layer(event.stack);
                current[l] += sizes.bytes[i];
                held.insert(event.addr, (l, sizes.bytes[i]));
            }
            Action::FreeRequested => {
                if let Some((l, bytes)) = held.remove(&event.addr) {
                    current[l] = current[l].saturating_sub(bytes);
                }
            }
            _ => {}
        }
        if best.as_ref().is_none_or(|(_, total, _)| totals[i] > *total) {
            best = Some((event.time_us, totals[i], current.clone()));
        }
        if (i + 1) % bucket == 0 || i + 1 == events.len() {
            if let Some((time, total, layers)) = best.take() {
                if total > out.peak_bytes {
                    out.peak_bytes = total;
                    out.peak_index = out.total.len();
                }
                out.time_us.push(time);
                out.total.push(total);
                for (l, value) in layers.into_iter().enumerate() {
                    out.layers[l].1.push(value);
                }
            }
        }
    }
    out
}
