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
