//! The fragmentation result (kind `fragmentation`): plain serde data, what is saved and
//! loaded, and what the CUDA tensor report embeds. Every byte count is exact.

use serde::{Deserialize, Serialize};

use super::input::{Reported, Request, Settings};

/// Schema version of the saved `data`.
pub const VERSION: u32 = 1;

/// Where one device's reserved-but-unallocated bytes are, and optionally whether a request
/// fits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fragmentation {
    pub version: u32,
    /// "cuda:N".
    pub device: String,
    pub settings: Settings,
    /// Sum of the segments' sizes.
    pub reserved_bytes: u64,
    /// Blocks in use by tensors.
    pub allocated_bytes: u64,
    /// Blocks freed by their tensors but still used by another stream.
    pub pending_free_bytes: u64,
    /// Blocks free for reuse: reserved - allocated - pending_free.
    pub free_bytes: u64,
    /// Free bytes in segments split into several blocks, outside expandable segments
    /// (torch's `inactive_split_bytes`): what `empty_cache()` cannot give back.
    pub inactive_split_bytes: u64,
    /// `torch.cuda.memory_stats()`'s own figures, when given.
    pub reported: Reported,
    pub largest_free: Option<FreeBlock>,
    /// One row per (pool, pool id, stream), largest free bytes first.
    pub pools: Vec<PoolRow>,
    /// Every segment, by address.
    pub segments: Vec<SegmentRow>,
    /// Free blocks by size, in power-of-two ranges, smallest first.
    pub free_sizes: Vec<SizeRange>,
    pub expandable: ExpandableView,
    pub request: Option<Verdict>,
    /// Why a figure may be off (a setting the model does not follow, counters that
    /// disagree with the snapshot).
    pub notices: Vec<String>,
}

/// "small" (requests up to 1 MiB, 2 MiB segments) or "large".
pub type PoolName = String;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreeBlock {
    pub address: u64,
    pub size: u64,
    pub pool: PoolName,
    pub pool_id: [u64; 2],
    pub stream: u64,
    pub segment: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolRow {
    pub pool: PoolName,
    pub pool_id: [u64; 2],
    pub stream: u64,
    pub segments: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub pending_free_bytes: u64,
    pub free_bytes: u64,
    pub free_blocks: u64,
    pub largest_free: u64,
    pub inactive_split_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentRow {
    pub address: u64,
    pub size: u64,
    pub pool: PoolName,
    pub pool_id: [u64; 2],
    pub stream: u64,
    pub expandable: bool,
    pub blocks: u64,
    pub allocated_bytes: u64,
    pub pending_free_bytes: u64,
    pub free_bytes: u64,
    pub largest_free: u64,
}

/// Free blocks of `from <= size < to` bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SizeRange {
    pub from: u64,
    pub to: u64,
    pub blocks: u64,
    pub bytes: u64,
}

/// The same blocks seen by the expandable-segments allocator, whose segments are pages
/// (2 MiB in the small pool, 20 MiB in the large) that it unmaps when they are wholly free
/// and maps again wherever a request needs them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpandableView {
    /// Free bytes lying in whole pages (counted from each segment's start): what it could
    /// give back and map again elsewhere.
    pub reclaimable_bytes: u64,
    /// What the blocks in use (allocated and pending) would reserve packed one after the
    /// other, per pool and stream, in whole pages: the least it could reserve for them.
    pub packed_reserved_bytes: u64,
}

/// What happens to one request, as configured and with the two settings that fight
/// fragmentation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    pub request: Request,
    /// The request rounded as the allocator rounds it.
    pub rounded_bytes: u64,
    pub pool: PoolName,
    /// Free bytes in blocks of this pool and stream, and the largest such block.
    pub free_bytes: u64,
    pub largest_free: u64,
    /// True when the free bytes of this pool and stream would hold the request but no
    /// single block does.
    pub fragmented: bool,
    pub configured: Scenario,
    /// With expandable_segments:True (None when it is already on: `configured` is it).
    pub expandable: Option<Scenario>,
    /// With the largest `max_split_size_mb` that would make it fit, else the one that
    /// frees most (an estimate: see `Scenario::estimate`); None when no segment is
    /// big enough for the setting to matter.
    pub max_split: Option<Scenario>,
}

/// One way the allocator could meet the request, with the numbers behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// `PYTORCH_CUDA_ALLOC_CONF` text of this scenario ("" for the configured one).
    pub setting: String,
    pub outcome: Outcome,
    /// The cached block it reuses, when it does.
    pub block: Option<u64>,
    pub block_size: Option<u64>,
    /// Bytes it asks the device for: a new segment, or the pages to map.
    pub device_bytes: u64,
    /// Bytes the allocator gives back before its last try (unsplit cached segments, or
    /// wholly free pages).
    pub released_bytes: u64,
    /// What the device could give when asked (free memory, within the process's limit),
    /// None when unknown.
    pub headroom_bytes: Option<u64>,
    /// True when the figures rest on an assumption about the program's past (the
    /// max_split_size scenario), not only on the snapshot.
    pub estimate: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A cached block fits: the cache does not grow.
    ReusesCachedBlock,
    /// The cache grows by `device_bytes`.
    GrowsCache,
    /// The cache grows after the allocator released `released_bytes`.
    GrowsAfterRelease,
    /// The allocator raises an out-of-memory error.
    OutOfMemory,
    /// It needs `device_bytes` from the device, whose free memory is unknown.
    NeedsDeviceMemory,
}

impl Outcome {
    /// None when unknown.
    pub fn fits(self) -> Option<bool> {
        match self {
            Outcome::OutOfMemory => Some(false),
            Outcome::NeedsDeviceMemory => None,
            _ => Some(true),
        }
    }
}
