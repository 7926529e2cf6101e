//! What a yield and a restore report (`YieldReport`, `RestoreReport` in Python: dataclasses
//! of the public API). They are not saved kinds: they cross to Rust once, as the JSON text
//! of the dataclass's fields, to be rendered (`render::text`). The field names are the
//! dataclasses'; the per-device maps keep the order the devices were reported in.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// What a `yield_memory()` moved, and what stayed on the GPU and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct YieldReport {
    pub moved_storages: i64,
    pub moved_bytes: i64,
    pub seconds: f64,
    /// Per device: allocated bytes after the yield (all of it unmoved).
    pub still_allocated: IndexMap<String, i64>,
    /// Per device: (why, bytes) of each tensor Python sees that could not move.
    pub unmovable: IndexMap<String, Vec<(String, i64)>>,
    /// Per device: allocated bytes no visible tensor accounts for.
    pub invisible_bytes: IndexMap<String, i64>,
    /// Per device: what the caching allocator still reserves after `empty_cache()`.
    pub reserved: IndexMap<String, i64>,
    /// Per device: memory in use on the device by every process (the driver's), if known.
    pub device_used: IndexMap<String, Option<i64>>,
    /// Said instead of the figures when there was nothing to move.
    pub message: String,
    /// Why the walk that found the tensors may have missed some.
    pub incomplete: Option<String>,
}

/// What a `restore()` brought back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreReport {
    pub restored_storages: i64,
    pub restored_bytes: i64,
    pub seconds: f64,
    pub remaining_storages: i64,
    pub remaining_bytes: i64,
}

/// What a region's `pause` or `resume` did (`RegionReport` in Python). The driver's part
/// (segments, bytes, seconds) is written by `region`; the device's view before and after
/// and what remains on the device by the Python side, which knows torch's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionReport {
    /// "pause" or "resume".
    pub action: String,
    /// The tags asked for (empty: every region).
    pub tags: Vec<String>,
    /// Segments whose physical memory was given back (pause) or mapped again (resume).
    pub segments: i64,
    /// Their bytes.
    pub region_bytes: i64,
    /// Bytes copied to the host (pause) or back (resume).
    pub moved_bytes: i64,
    /// Region bytes a pause did not copy: the caching allocator's free blocks, and all of
    /// a region whose contents are disposable.
    pub discarded_bytes: i64,
    pub seconds: f64,
    /// Seconds this call spent pinning host buffers (0 when they were ready), and bytes.
    pub pin_seconds: f64,
    pub pinned_bytes: i64,
    /// Seconds in the driver's unmap and release (pause) or create and map (resume).
    pub map_seconds: f64,
    /// Per device: region bytes given back or mapped again.
    pub per_device: IndexMap<String, i64>,
    /// Bytes a resume could not map (they stay paused).
    pub left_paused_bytes: i64,
    /// Per device: memory in use on the device by every process, before and after.
    #[serde(default)]
    pub device_used_before: IndexMap<String, Option<i64>>,
    #[serde(default)]
    pub device_used_after: IndexMap<String, Option<i64>>,
    /// Per device: (what, bytes) still on the device after the call.
    #[serde(default)]
    pub remaining: IndexMap<String, Vec<(String, i64)>>,
    /// What went wrong, if the call stopped early (what was done is in the figures).
    pub error: Option<String>,
}
