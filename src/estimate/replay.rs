//! The accounting: the recorded sequence of storage allocations and frees of a fake training
//! step, replayed through an allocator model, gives the allocated bytes after every event,
//! their peak (overall and per phase) and what each category held at the peak.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::allocator::{Allocator, Block, Kind};

/// One recorded event; the recording writes it `[op, id, bytes]`: op 0 allocates storage
/// `id` of `bytes` bytes, 1 frees it, 2 starts phase `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "(u8, u64, u64)")]
pub enum Event {
    /// Storage `id` (an index into the categories) of `bytes` bytes came to life.
    Alloc { id: u64, bytes: u64 },
    /// Storage `id` died.
    Free { id: u64 },
    /// Phase `index` (into the caller's phase names) begins.
    Phase { index: usize },
}

impl TryFrom<(u8, u64, u64)> for Event {
    type Error = String;

    fn try_from((op, id, bytes): (u8, u64, u64)) -> Result<Self, String> {
        match op {
            0 => Ok(Event::Alloc { id, bytes }),
            1 => Ok(Event::Free { id }),
            2 => Ok(Event::Phase { index: id as usize }),
            other => Err(format!(
                "unknown event kind {other} (0 alloc, 1 free, 2 phase)"
            )),
        }
    }
}

/// A fake step's recording, as the estimate's Python side hands it over (once, as JSON).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recording {
    /// Which allocator to model.
    pub device_type: Kind,
    pub events: Vec<Event>,
    /// The category (the caller's index) of each storage id.
    pub categories: Vec<u8>,
    pub n_categories: usize,
    pub n_phases: usize,
}

/// What the replay found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Replay {
    pub peak_allocated: u64,
    /// The phase during which the peak was first reached.
    pub peak_phase: usize,
    /// Bytes per category (the caller's indices) at the peak.
    pub peak_by_category: Vec<u64>,
    /// Peak allocated within each phase.
    pub phase_peaks: Vec<u64>,
    /// Allocated at the end of each phase, per category.
    pub phase_end_by_category: Vec<Vec<u64>>,
    pub peak_reserved: u64,
    pub reserved_end: u64,
    pub segments: u64,
    /// Frees of storages never allocated (ignored; a correct recording has none).
    pub unmatched_frees: u64,
}

/// Replay `events` through the `kind` allocator; `categories[id]` is the category of
/// storage `id` (out-of-range ids count under the last category).
pub fn replay(
    kind: Kind,
    events: &[Event],
    categories: &[u8],
    n_categories: usize,
    n_phases: usize,
) -> Replay {
    let n_categories = n_categories.max(1);
    let n_phases = n_phases.max(1);
    let mut allocator = Allocator::new(kind);
    let mut live: HashMap<u64, (Block, usize)> = HashMap::new();
    // Empty storages: torch allocates nothing for them, so their frees free nothing.
    let mut empty: HashSet<u64> = HashSet::new();
    let mut by_category = vec![0u64; n_categories];
    let mut out = Replay {
        peak_by_category: vec![0; n_categories],
        phase_peaks: vec![0; n_phases],
        phase_end_by_category: vec![vec![0; n_categories]; n_phases],
        ..Replay::default()
    };
    let mut allocated = 0u64;
    let mut phase = 0usize;
    let category_of = |id: u64| {
        categories
            .get(id as usize)
            .map_or(n_categories - 1, |&c| (c as usize).min(n_categories - 1))
    };
    for event in events {
        match *event {
            Event::Phase { index } => {
                out.phase_end_by_category[phase] = by_category.clone();
                phase = index.min(n_phases - 1);
                out.phase_peaks[phase] = out.phase_peaks[phase].max(allocated);
            }
            Event::Alloc { id, bytes } => {
                if bytes == 0 {
                    empty.insert(id);
                    continue;
                }
                if live.contains_key(&id) {
                    continue;
                }
                let block = allocator.malloc(bytes);
                let category = category_of(id);
                live.insert(id, (block, category));
                by_category[category] += block.bytes;
                allocated += block.bytes;
                out.phase_peaks[phase] = out.phase_peaks[phase].max(allocated);
                if allocated > out.peak_allocated {
                    out.peak_allocated = allocated;
                    out.peak_phase = phase;
                    out.peak_by_category.clone_from(&by_category);
                }
            }
            Event::Free { id } => match live.remove(&id) {
                Some((block, category)) => {
                    allocator.free(block);
                    by_category[category] -= block.bytes;
                    allocated -= block.bytes;
                }
                None if empty.remove(&id) => {}
                None => out.unmatched_frees += 1,
            },
        }
    }
    out.phase_end_by_category[phase] = by_category;
    out.peak_reserved = allocator.peak_reserved;
    out.reserved_end = allocator.reserved;
    out.segments = allocator.segments;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::from_json;

    #[test]
    fn a_recording_reads_as_the_estimate_writes_it() {
        let r: Recording = from_json(
            r#"{"device_type": "cuda", "events": [[2, 0, 0], [0, 0, 512], [1, 0, 0]],
                "categories": [3], "n_categories": 9, "n_phases": 1}"#,
        )
        .unwrap();
        assert_eq!(r.device_type, Kind::Cuda);
        assert_eq!(
            r.events,
            vec![
                Event::Phase { index: 0 },
                Event::Alloc { id: 0, bytes: 512 },
                Event::Free { id: 0 }
            ]
        );
        let bad_op = r#"{"device_type": "cpu", "events": [[7, 0, 0]], "categories": [],
                         "n_categories": 9, "n_phases": 1}"#;
        let err = from_json::<Recording>(bad_op).unwrap_err().to_string();
        assert!(err.starts_with("events[0]: unknown event kind 7"), "{err}");
        let bad_device = bad_op
            .replace("\"cpu\"", "\"xpu\"")
            .replace("[7, 0, 0]", "");
        let err = from_json::<Recording>(&bad_device).unwrap_err().to_string();
        assert!(
            err.starts_with("device_type: unknown variant `xpu`"),
            "{err}"
        );
    }

    #[test]
    fn peak_and_categories_at_the_peak() {
        let events = [
            Event::Phase { index: 0 },
            Event::Alloc { id: 0, bytes: 1000 },
            Event::Phase { index: 1 },
            Event::Alloc { id: 1, bytes: 100 },
            Event::Alloc { id: 2, bytes: 600 },
            Event::Free { id: 1 },
            Event::Phase { index: 2 },
            Event::Free { id: 2 },
            Event::Free { id: 7 },
        ];
        let r = replay(Kind::Cuda, &events, &[0, 1, 2], 3, 3);
        assert_eq!(r.peak_allocated, 1024 + 512 + 1024);
        assert_eq!(r.peak_phase, 1);
        assert_eq!(r.peak_by_category, vec![1024, 512, 1024]);
        assert_eq!(r.phase_peaks, vec![1024, 2560, 2048]);
        assert_eq!(r.phase_end_by_category[1], vec![1024, 0, 1024]);
        assert_eq!(r.phase_end_by_category[2], vec![1024, 0, 0]);
        assert_eq!(r.unmatched_frees, 1);
        assert_eq!(r.peak_reserved, 2 << 20);

        let cpu = replay(Kind::Cpu, &events, &[0, 1, 2], 3, 3);
        assert_eq!(cpu.peak_allocated, 1700);
        assert_eq!(cpu.peak_reserved, 1700);
    }

    #[test]
    fn empty_storages_and_double_allocs_count_nothing() {
        let events = [
            Event::Alloc { id: 0, bytes: 0 },
            Event::Alloc { id: 1, bytes: 10 },
            Event::Alloc { id: 1, bytes: 10 },
            Event::Free { id: 0 },
        ];
        let r = replay(Kind::Cpu, &events, &[], 1, 1);
        assert_eq!(r.peak_allocated, 10);
        assert_eq!(r.unmatched_frees, 0);
    }
}
