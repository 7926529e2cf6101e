//! What the analysis reads: one device's segments from `torch.cuda.memory_snapshot()`, the
//! counters of `torch.cuda.memory_stats()` it checks itself against, the allocator's
//! settings (the `PYTORCH_CUDA_ALLOC_CONF` text and the effective `max_split_size`), how
//! much more the device could give, and optionally a request to answer. It arrives as JSON
//! text through serde's derive; `checked` then refuses what no allocator produces (blocks
//! that do not tile their segment, segments that overlap), naming the field.

use serde::{Deserialize, Serialize};

use super::FieldError;
use crate::allocator::caching::{DIVISION_INTERVALS, LARGE_BUFFER};

const MIB: u64 = 1 << 20;

/// One device's allocator state, as Python hands it over.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The CUDA device index analysed; segments of other devices are left out.
    pub device: u32,
    pub segments: Vec<Segment>,
    /// The allocator's settings text (`PYTORCH_CUDA_ALLOC_CONF`'s form), "" for defaults.
    #[serde(default)]
    pub allocator_conf: String,
    /// `memory_stats()["max_split_size"]`: the effective value in bytes, -1 for unlimited
    /// (it wins over the text, which may be stale).
    #[serde(default)]
    pub max_split_size: Option<i64>,
    /// `memory_stats()` counters, to check the snapshot against.
    #[serde(default)]
    pub reported: Reported,
    /// Bytes the device has free now (`torch.cuda.mem_get_info()[0]`); None when unknown.
    #[serde(default)]
    pub device_free_bytes: Option<u64>,
    /// The process's limit (`set_per_process_memory_fraction` times the device's memory);
    /// None when no fraction is set.
    #[serde(default)]
    pub allowed_bytes: Option<u64>,
    #[serde(default)]
    pub request: Option<Request>,
}

/// What `torch.cuda.memory_stats()` says, for the record and the cross-check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reported {
    #[serde(default)]
    pub reserved_bytes: Option<u64>,
    #[serde(default)]
    pub allocated_bytes: Option<u64>,
    #[serde(default)]
    pub inactive_split_bytes: Option<u64>,
}

/// An allocation to try: its size in bytes, the stream it is made on (the snapshot's stream
/// number, 0 for the default stream) and the memory pool (`[0, 0]`: the default pools;
/// a CUDA graph's or `torch.cuda.MemPool`'s id otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub size: u64,
    #[serde(default)]
    pub stream: u64,
    #[serde(default)]
    pub pool_id: [u64; 2],
}

/// One segment (one cudaMalloc, or one mapped range of an expandable segment).
#[derive(Clone, Debug, Deserialize)]
pub struct Segment {
    #[serde(default)]
    pub device: Option<u32>,
    pub address: u64,
    pub total_size: u64,
    #[serde(default)]
    pub stream: u64,
    pub segment_type: SegmentType,
    #[serde(default)]
    pub segment_pool_id: [u64; 2],
    #[serde(default)]
    pub is_expandable: bool,
    pub blocks: Vec<Block>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SegmentType {
    Small,
    Large,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Block {
    /// torch 2.1's snapshot may leave it out: it follows from the segment's address and
    /// the sizes before it.
    #[serde(default)]
    pub address: Option<u64>,
    pub size: u64,
    #[serde(default)]
    pub requested_size: u64,
    pub state: BlockState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum BlockState {
    #[serde(rename = "active_allocated")]
    Allocated,
    /// Freed by its tensor, still in use by another stream (recordStream): not reusable
    /// until its events complete. torch's docstring calls it `active_awaiting_free`.
    #[serde(rename = "active_pending_free", alias = "active_awaiting_free")]
    Pending,
    #[serde(rename = "inactive")]
    Free,
}

/// The allocator settings the model follows, as parsed from the settings text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// Blocks this large or larger are never split; None: unlimited (torch's default).
    pub max_split_size: Option<u64>,
    /// A request of at least `max_split_size` takes a cached block at most this much larger.
    pub max_non_split_rounding: u64,
    pub expandable_segments: bool,
    /// `roundup_power2_divisions`, one value per power-of-two interval from 1 MiB.
    pub roundup_power2_divisions: [u64; DIVISION_INTERVALS],
    /// Settings keys the model does not use (they change nothing it computes, or it cannot
    /// follow them: said in the result's notices).
    pub ignored: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            expandable_segments: false,
            roundup_power2_divisions: [0; DIVISION_INTERVALS],
            ignored: Vec::new(),
        }
    }
}

impl Settings {
    /// The settings text parsed as torch's `AcceleratorAllocatorConfig::parseArgs` reads it
    /// (`key:value` pairs separated by commas; `roundup_power2_divisions` either one number
    /// or `[256:4,512:2,>:1]`), with `max_split_size` (bytes, -1 unlimited) from the
    /// counters when known. A value torch would refuse is an error naming the key.
    pub fn parse(conf: &str, max_split_size: Option<i64>) -> Result<Settings, FieldError> {
        let mut s = Settings::default();
        for item in split_top(conf) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (key, value) = item
                .split_once(':')
                .ok_or_else(|| bad(item, "has no ':'"))?;
            let (key, value) = (key.trim(), value.trim());
            match key {
                "max_split_size_mb" => {
                    let mb = number(key, value)?;
                    if mb < LARGE_BUFFER / MIB {
                        return Err(bad(key, "must be at least 20 (torch refuses less)"));
                    }
                    s.max_split_size = Some(mb.saturating_mul(MIB));
                }
                "max_non_split_rounding_mb" => {
                    s.max_non_split_rounding = number(key, value)?.saturating_mul(MIB);
                }
                "expandable_segments" => {
                    s.expandable_segments = match value {
                        "True" | "true" | "1" => true,
                        "False" | "false" | "0" => false,
                        _ => return Err(bad(key, "must be True or False")),
                    };
                }
                "roundup_power2_divisions" => {
                    s.roundup_power2_divisions = divisions(value)?;
                }
                other => s.ignored.push(other.to_string()),
            }
        }
        match max_split_size {
            Some(v) if v > 0 => s.max_split_size = Some(v as u64),
            Some(_) => s.max_split_size = None,
            None => {}
        }
        Ok(s)
    }
}

fn bad(key: &str, what: &str) -> FieldError {
    FieldError {
        path: "allocator_conf".into(),
        message: format!("{key} {what}"),
    }
}

fn number(key: &str, value: &str) -> Result<u64, FieldError> {
    value
        .parse::<u64>()
        .map_err(|_| bad(key, &format!("must be a whole number, got {value:?}")))
}

/// Items separated by commas outside brackets.
fn split_top(conf: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in conf.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&conf[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&conf[start..]);
    out
}

/// torch's parseRoundUpPower2Divisions: one number for every interval, or a list of
/// `boundary_mb:divisions` (the first fills the intervals below it too) and `>:divisions`
/// for every interval after the last boundary.
fn divisions(value: &str) -> Result<[u64; DIVISION_INTERVALS], FieldError> {
    const KEY: &str = "roundup_power2_divisions";
    let mut out = [0u64; DIVISION_INTERVALS];
    let Some(list) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
        let d = number(KEY, value)?;
        if !d.is_power_of_two() {
            return Err(bad(KEY, "must be a power of two"));
        }
        return Ok([d; DIVISION_INTERVALS]);
    };
    let (mut first, mut last) = (true, 0usize);
    for pair in list.split(',') {
        let (boundary, d) = pair
            .split_once(':')
            .ok_or_else(|| bad(KEY, &format!("entry {pair:?} has no ':'")))?;
        let d = number(KEY, d.trim())?;
        if d != 0 && !d.is_power_of_two() {
            return Err(bad(KEY, "divisions must be 0 or a power of two"));
        }
        if boundary.trim() == ">" {
            for slot in out.iter_mut().skip(last + 1) {
                *slot = d;
            }
            continue;
        }
        let b = number(KEY, boundary.trim())?;
        if !b.is_power_of_two() {
            return Err(bad(KEY, "boundaries must be powers of two"));
        }
        let index = (63 - b.leading_zeros() as usize).min(DIVISION_INTERVALS - 1);
        if first {
            for slot in out.iter_mut().take(index) {
                *slot = d;
            }
            first = false;
        }
        out[index] = d;
        last = index;
    }
    Ok(out)
}

/// A block placed: its segment's index, its address, size and state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub segment: usize,
    pub address: u64,
    pub size: u64,
    pub state: BlockState,
}

/// The input's segments of its device, checked, sorted by address, with each block's
/// address (given or derived). A block list that does not tile its segment, a block address
/// that disagrees, an empty segment or overlapping segments are errors naming the field.
pub fn checked(input: &Input) -> Result<(Vec<Segment>, Vec<Vec<Placed>>), FieldError> {
    let mut chosen: Vec<(usize, &Segment)> = input
        .segments
        .iter()
        .enumerate()
        .filter(|(_, s)| s.device.is_none_or(|d| d == input.device))
        .collect();
    for (i, seg) in &chosen {
        let here = |field: &str| format!("segments[{i}].{field}");
        if seg.blocks.is_empty() {
            return Err(FieldError {
                path: here("blocks"),
                message: "a segment holds at least one block".into(),
            });
        }
        seg.address.checked_add(seg.total_size).ok_or(FieldError {
            path: here("total_size"),
            message: "address + total_size overflows 64 bits".into(),
        })?;
        let mut at = seg.address;
        for (j, b) in seg.blocks.iter().enumerate() {
            if b.size == 0 {
                return Err(FieldError {
                    path: here(&format!("blocks[{j}].size")),
                    message: "a block has a positive size".into(),
                });
            }
            if let Some(a) = b.address {
                if a != at {
                    return Err(FieldError {
                        path: here(&format!("blocks[{j}].address")),
                        message: format!(
                            "{a:#x}, but the blocks before it end at {at:#x} (blocks tile their segment)"
                        ),
                    });
                }
            }
            at = at.checked_add(b.size).ok_or(FieldError {
                path: here(&format!("blocks[{j}].size")),
                message: "the blocks' sizes overflow 64 bits".into(),
            })?;
        }
        let sum = at - seg.address;
        if sum != seg.total_size {
            return Err(FieldError {
                path: here("total_size"),
                message: format!("{}, but its blocks' sizes sum to {sum}", seg.total_size),
            });
        }
    }
    chosen.sort_by_key(|(_, s)| s.address);
    for pair in chosen.windows(2) {
        let ((_, a), (j, b)) = (pair[0], pair[1]);
        if a.address + a.total_size > b.address {
            return Err(FieldError {
                path: format!("segments[{j}].address"),
                message: format!(
                    "{:#x} lies inside the segment at {:#x} ({} bytes)",
                    b.address, a.address, a.total_size
                ),
            });
        }
    }
    let segments: Vec<Segment> = chosen.iter().map(|(_, s)| (*s).clone()).collect();
    let placed = segments
        .iter()
        .enumerate()
        .map(|(k, seg)| {
            let mut at = seg.address;
            seg.blocks
                .iter()
                .map(|b| {
                    let p = Placed {
                        segment: k,
                        address: at,
                        size: b.size,
                        state: b.state,
                    };
                    at += b.size;
                    p
                })
                .collect()
        })
        .collect();
    if let Some(r) = &input.request {
        if r.size == 0 {
            return Err(FieldError {
                path: "request.size".into(),
                message: "must be a positive number of bytes".into(),
            });
        }
    }
    Ok((segments, placed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_as_torch_reads_them() {
        let s = Settings::parse("expandable_segments:True,max_split_size_mb:128", None).unwrap();
        assert!(s.expandable_segments);
        assert_eq!(s.max_split_size, Some(128 << 20));
        // The counters' effective value wins; -1 is unlimited.
        let s = Settings::parse("max_split_size_mb:128", Some(-1)).unwrap();
        assert_eq!(s.max_split_size, None);
        let s = Settings::parse("roundup_power2_divisions:[256:4,512:2,>:1]", None).unwrap();
        assert_eq!(s.roundup_power2_divisions[0], 4);
        assert_eq!(s.roundup_power2_divisions[8], 4);
        assert_eq!(s.roundup_power2_divisions[9], 2);
        assert_eq!(s.roundup_power2_divisions[10], 1);
        assert_eq!(s.roundup_power2_divisions[15], 1);
        let s = Settings::parse("backend:native, garbage_collection_threshold:0.6", None).unwrap();
        assert_eq!(s.ignored, vec!["backend", "garbage_collection_threshold"]);
        let e = Settings::parse("max_split_size_mb:10", None).unwrap_err();
        assert_eq!(e.path, "allocator_conf");
        assert!(e.message.contains("max_split_size_mb"));
        assert!(Settings::parse("expandable_segments:maybe", None).is_err());
        assert!(Settings::parse("roundup_power2_divisions:3", None).is_err());
    }
}
