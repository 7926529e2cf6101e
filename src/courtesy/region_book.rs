//! The book of Courtesy's regions, as plain data (no driver call here, so all of it is
//! tested without a GPU): each segment torch's caching allocator asked a region for
//! (`Allocation`: its address range, device, tag, whether its physical memory is mapped,
//! its pinned host buffer), the settings of each tag, which tag each device's allocations
//! go to now, the spare host buffers, and the ranges a pause copies (`copy_ranges`).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use serde::Serialize;

/// A pinned host buffer (`vmm::host_alloc`): its address and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostBuffer {
    pub address: usize,
    pub size: u64,
}

/// One segment of a region: `size` bytes of virtual addresses from `address`, with
/// physical memory behind them (`handle`) unless paused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub address: u64,
    pub size: u64,
    pub device: i32,
    pub tag: String,
    /// The physical memory mapped at `address`; None while paused.
    pub handle: Option<u64>,
    /// Where its contents wait during a pause (kept for the next pause).
    pub host: Option<HostBuffer>,
    /// (offset, length) of what the last pause copied to `host`, to bring back.
    pub saved: Vec<(u64, u64)>,
}

impl Allocation {
    pub fn paused(&self) -> bool {
        self.handle.is_none()
    }
}

/// How a tag's allocations are paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagSettings {
    /// Copy the live contents to the host on pause (else they are discarded: a KV cache).
    pub keep_contents: bool,
    /// Pin each segment's host buffer when the segment is created (in a background
    /// thread), so that even the first pause only copies.
    pub prepare_host: bool,
}

#[derive(Debug, Default)]
pub struct Book {
    pub allocations: BTreeMap<u64, Allocation>,
    pub tags: HashMap<String, TagSettings>,
    /// Allocation function slot -> the tag whose pool calls it.
    pub slots: HashMap<usize, String>,
    /// Host buffers of segments torch gave back, for the next segment of the same size.
    pub spare: Vec<HostBuffer>,
    /// Segments whose host buffer the background thread is to pin.
    pub to_prepare: VecDeque<u64>,
    pub preparing: bool,
    /// Seconds the background thread spent pinning host buffers, and the bytes.
    pub prepared_seconds: f64,
    pub prepared_bytes: u64,
    /// Frees of addresses this book never gave out (a bug in the wiring if not 0).
    pub unknown_frees: u64,
    /// Tags whose region was closed while torch still held some of their segments.
    pub closed: HashSet<String>,
}

/// What `state()` tells about one tag on one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TagState {
    pub tag: String,
    pub device: i32,
    pub segments: u64,
    /// Bytes with physical memory behind them now.
    pub mapped_bytes: u64,
    /// Bytes whose physical memory is given back (paused).
    pub paused_bytes: u64,
    /// Pinned host bytes held for this tag's segments.
    pub host_bytes: u64,
    /// The virtual ranges (address, size), sorted.
    pub ranges: Vec<(u64, u64)>,
}

impl Book {
    pub fn settings(&self, tag: &str) -> TagSettings {
        self.tags.get(tag).copied().unwrap_or(TagSettings {
            keep_contents: true,
            prepare_host: false,
        })
    }

    /// A spare host buffer of exactly `size` bytes, taken out of the spare list.
    pub fn take_spare(&mut self, size: u64) -> Option<HostBuffer> {
        let at = self.spare.iter().position(|b| b.size == size)?;
        Some(self.spare.swap_remove(at))
    }

    /// A region closes: forget its settings and slot now if it has no segment left, else
    /// when its last segment is freed (`freed`). Whether it is gone.
    pub fn close(&mut self, tag: &str) -> bool {
        if self.allocations.values().any(|a| a.tag == tag) {
            self.closed.insert(tag.to_owned());
            return false;
        }
        self.forget(tag);
        true
    }

    fn forget(&mut self, tag: &str) {
        self.closed.remove(tag);
        self.tags.remove(tag);
        self.slots.retain(|_, t| t != tag);
    }

    /// Torch freed `segment` (already out of `allocations`): where its host buffer goes.
    /// An open region keeps it for its next segment (the spare list); a closed region's
    /// goes back to the driver (returned, to free), and a closed region whose last segment
    /// this was is forgotten.
    pub fn freed(&mut self, segment: &Allocation) -> Option<HostBuffer> {
        let closed = self.closed.contains(&segment.tag);
        if closed && !self.allocations.values().any(|a| a.tag == segment.tag) {
            self.forget(&segment.tag);
        }
        match segment.host {
            Some(host) if !closed => {
                self.spare.push(host);
                None
            }
            host => host,
        }
    }

    /// The allocation whose range holds `address`.
    pub fn owner(&self, address: u64) -> Option<&Allocation> {
        let (_, a) = self.allocations.range(..=address).next_back()?;
        (address < a.address + a.size).then_some(a)
    }

    /// The allocations of `tags` (all tags when empty), by address.
    pub fn of_tags<'a>(&'a self, tags: &'a [String]) -> impl Iterator<Item = &'a Allocation> {
        self.allocations
            .values()
            .filter(move |a| tags.is_empty() || tags.contains(&a.tag))
    }

    /// Per (tag, device): segments, mapped and paused bytes, host bytes, ranges.
    pub fn state(&self) -> Vec<TagState> {
        let mut out: BTreeMap<(String, i32), TagState> = BTreeMap::new();
        for a in self.allocations.values() {
            let s = out
                .entry((a.tag.clone(), a.device))
                .or_insert_with(|| TagState {
                    tag: a.tag.clone(),
                    device: a.device,
                    ..TagState::default()
                });
            s.segments += 1;
            if a.paused() {
                s.paused_bytes += a.size;
            } else {
                s.mapped_bytes += a.size;
            }
            s.host_bytes += a.host.map_or(0, |h| h.size);
            s.ranges.push((a.address, a.size));
        }
        out.into_values().collect()
    }
}

/// The (offset, length) ranges of the allocation `[start, start + size)` that a pause
/// copies: the parts of `live` (address, length; any order, may overlap or reach outside)
/// inside it, sorted and merged, and joined across gaps shorter than `join_gap`. One copy
/// has a fixed cost (a few microseconds, what 64-256 KiB take on a 55 GB/s bus), so
/// copying a short gap with its neighbours can be faster than two copies; the small pool's
/// 2 MiB segments hold hundreds of small blocks. (On a GPT-2 training state, gaps of 0 to
/// 256 KiB gave the same bytes and times within 0.5%: its live blocks lie in runs.)
pub fn copy_ranges(live: &[(u64, u64)], start: u64, size: u64, join_gap: u64) -> Vec<(u64, u64)> {
    let end = start.saturating_add(size);
    let mut parts: Vec<(u64, u64)> = live
        .iter()
        .filter_map(|&(address, len)| {
            let lo = address.max(start);
            let hi = address.saturating_add(len).min(end);
            (lo < hi).then(|| (lo - start, hi - start))
        })
        .collect();
    parts.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(parts.len());
    for (lo, hi) in parts {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(join_gap) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged.into_iter().map(|(lo, hi)| (lo, hi - lo)).collect()
}

/// `size` rounded up to a multiple of `granularity` (at least one granule).
pub fn padded(size: u64, granularity: u64) -> u64 {
    let g = granularity.max(1);
    size.max(1).div_ceil(g) * g
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(address: u64, size: u64, tag: &str, mapped: bool) -> Allocation {
        Allocation {
            address,
            size,
            device: 0,
            tag: tag.into(),
            handle: mapped.then_some(7),
            host: None,
            saved: vec![],
        }
    }

    #[test]
    fn copy_ranges_clips_sorts_merges_and_joins_short_gaps() {
        let live = [
            (150, 10),
            (100, 20),
            (110, 5),
            (90, 20),
            (400, 50),
            (190, 5),
        ];
        // Allocation [100, 300): 90..110 clipped to 100..110; 100..120 and 110..115 merge;
        // 150..160 is 30 bytes after 120 and 190..195 30 after 160: joined with gap 30,
        // kept apart with gap 29.
        assert_eq!(
            copy_ranges(&live, 100, 200, 0),
            vec![(0, 20), (50, 10), (90, 5)]
        );
        assert_eq!(
            copy_ranges(&live, 100, 200, 29),
            vec![(0, 20), (50, 10), (90, 5)]
        );
        assert_eq!(copy_ranges(&live, 100, 200, 30), vec![(0, 95)]);
        assert_eq!(copy_ranges(&live, 100, 200, 1000), vec![(0, 95)]);
        assert_eq!(copy_ranges(&[], 100, 200, 1000), vec![]);
        assert_eq!(
            copy_ranges(&[(u64::MAX - 5, 10)], u64::MAX - 8, 8, 0),
            vec![(3, 5)]
        );
    }

    #[test]
    fn every_live_byte_inside_is_copied_and_nothing_outside() {
        // A small exhaustive check over random-ish layouts.
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..500 {
            let start = next() % 64;
            let size = 1 + next() % 64;
            let live: Vec<(u64, u64)> = (0..(next() % 6))
                .map(|_| (next() % 140, next() % 20))
                .collect();
            let gap = next() % 8;
            let ranges = copy_ranges(&live, start, size, gap);
            let covered = |x: u64| {
                ranges
                    .iter()
                    .any(|&(o, l)| x >= start + o && x < start + o + l)
            };
            for x in 0..200 {
                let is_live = live.iter().any(|&(a, l)| x >= a && x < a + l);
                let inside = x >= start && x < start + size;
                if is_live && inside {
                    assert!(covered(x), "{live:?} {start} {size} {ranges:?} misses {x}");
                }
                if !inside {
                    assert!(!covered(x), "{ranges:?} reaches outside at {x}");
                }
            }
            for pair in ranges.windows(2) {
                assert!(
                    pair[0].0 + pair[0].1 + gap < pair[1].0,
                    "{ranges:?} not joined"
                );
            }
        }
    }

    #[test]
    fn padded_rounds_up_to_the_granularity() {
        assert_eq!(padded(1, 2 << 20), 2 << 20);
        assert_eq!(padded(2 << 20, 2 << 20), 2 << 20);
        assert_eq!(padded((2 << 20) + 1, 2 << 20), 4 << 20);
        assert_eq!(padded(0, 0), 1);
    }

    #[test]
    fn owner_finds_the_segment_holding_an_address() {
        let mut book = Book::default();
        for (address, tag) in [(1000, "a"), (3000, "b")] {
            book.allocations
                .insert(address, allocation(address, 1000, tag, true));
        }
        assert_eq!(book.owner(1500).map(|a| a.address), Some(1000));
        assert_eq!(book.owner(1999).map(|a| a.address), Some(1000));
        assert_eq!(book.owner(2000), None);
        assert_eq!(book.owner(999), None);
        assert_eq!(book.owner(3999).map(|a| a.tag.as_str()), Some("b"));
    }

    #[test]
    fn state_sums_per_tag_and_device() {
        let mut book = Book::default();
        book.allocations.insert(0, allocation(0, 10, "a", true));
        book.allocations.insert(10, allocation(10, 20, "a", false));
        let mut other = allocation(40, 5, "b", true);
        other.host = Some(HostBuffer {
            address: 1,
            size: 5,
        });
        book.allocations.insert(40, other);
        let state = book.state();
        assert_eq!(state.len(), 2);
        assert_eq!((state[0].mapped_bytes, state[0].paused_bytes), (10, 20));
        assert_eq!(state[0].ranges, vec![(0, 10), (10, 20)]);
        assert_eq!((state[1].tag.as_str(), state[1].host_bytes), ("b", 5));
        let tags = ["a".to_string()];
        assert_eq!(book.of_tags(&tags).count(), 2);
        assert_eq!(book.of_tags(&[]).count(), 3);
    }

    #[test]
    fn a_closed_region_is_forgotten_with_its_last_segment_and_its_buffers_freed() {
        let mut book = Book::default();
        let settings = TagSettings {
            keep_contents: true,
            prepare_host: true,
        };
        for tag in ["a", "b"] {
            book.tags.insert(tag.into(), settings);
        }
        book.slots.insert(0, "a".into());
        book.slots.insert(1, "b".into());
        let host = HostBuffer {
            address: 9,
            size: 10,
        };
        for (address, tag) in [(0, "a"), (10, "a"), (20, "b")] {
            let mut segment = allocation(address, 10, tag, true);
            segment.host = Some(host);
            book.allocations.insert(address, segment);
        }
        assert!(book.close("empty-tag"));
        assert!(!book.close("a")); // torch still holds two of its segments
        assert!(book.tags.contains_key("a"));
        // An open region's freed segment leaves its buffer for the next one.
        let b = book.allocations.remove(&20).unwrap();
        assert_eq!(book.freed(&b), None);
        assert_eq!(book.spare, vec![host]);
        // A closed region's buffers go back; with its last segment it is forgotten.
        let first = book.allocations.remove(&0).unwrap();
        assert_eq!(book.freed(&first), Some(host));
        assert!(book.tags.contains_key("a"));
        let last = book.allocations.remove(&10).unwrap();
        assert_eq!(book.freed(&last), Some(host));
        assert!(!book.tags.contains_key("a") && !book.closed.contains("a"));
        assert_eq!(book.slots.get(&0), None);
        assert_eq!(book.slots.get(&1).map(String::as_str), Some("b"));
    }

    #[test]
    fn spare_buffers_are_taken_by_exact_size() {
        let mut book = Book::default();
        book.spare.push(HostBuffer {
            address: 1,
            size: 10,
        });
        book.spare.push(HostBuffer {
            address: 2,
            size: 20,
        });
        assert_eq!(book.take_spare(15), None);
        assert_eq!(book.take_spare(20).map(|b| b.address), Some(2));
        assert_eq!(book.spare.len(), 1);
    }
}
