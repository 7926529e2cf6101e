//! A post-mortem (kind `postmortem`): what was asked for, what the device had, what was
//! alive, and the advice computed from those numbers. Python gathers the facts (`Facts`
//! fields: everything but `pools` and `advice`); `analyse::complete` adds the rest. The
//! serde derive is the saved file's `data` and the schema a loaded file is checked against.

use serde::{Deserialize, Serialize};

use crate::allocator::fragmentation::Fragmentation;
use crate::results::count::{count, opt_count};

/// One out-of-memory error, explained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostMortem {
    /// "cuda:N" or "cpu".
    pub device: String,
    /// The process's rank and the job's world size, in a job of several processes.
    #[serde(default, deserialize_with = "opt_count")]
    pub rank: Option<u64>,
    #[serde(default, deserialize_with = "opt_count")]
    pub world_size: Option<u64>,
    /// The exception's type and first line, when the guard saw it ("" when only the
    /// allocator's observer ran).
    #[serde(default)]
    pub error: String,
    pub request: Request,
    /// The CUDA device's figures at the failing allocation (None on CPU).
    #[serde(default)]
    pub cuda: Option<CudaMemory>,
    /// The process's host memory figures (on CPU).
    #[serde(default)]
    pub host: Option<HostMemory>,
    /// The Python stack of the failing allocation, outermost first.
    #[serde(default)]
    pub stack: Vec<Frame>,
    /// The live tensors of the device, one row per storage, biggest first (at most
    /// `tensor_rows_kept`; the totals cover all).
    #[serde(default)]
    pub tensors: Vec<LiveTensor>,
    #[serde(deserialize_with = "count")]
    pub tensor_bytes: u64,
    #[serde(deserialize_with = "count")]
    pub tensor_count: u64,
    /// What autograd's graphs reachable from the live tensors hold for backward.
    #[serde(default)]
    pub autograd: Option<Autograd>,
    /// With history kept: the live allocations by source line and by module, biggest first.
    #[serde(default)]
    pub by_line: Vec<Site>,
    #[serde(default)]
    pub by_module: Vec<Site>,
    /// Whether an allocation history was kept (by_line and by_module come from it).
    #[serde(default)]
    pub history: bool,
    /// The batch that fits, from the estimate, when the guard knew the model and inputs.
    #[serde(default)]
    pub batch: Option<BatchFit>,
    /// The caching allocator's fragmentation at the failing allocation, with the request's
    /// verdict replayed through torch's malloc path (the allocator floor's analysis).
    #[serde(default)]
    pub fragmentation: Option<Fragmentation>,
    /// What to do, computed from the figures above (analyse).
    #[serde(default)]
    pub advice: Vec<Advice>,
    /// Why a figure may be missing or incomplete.
    #[serde(default)]
    pub notices: Vec<String>,
    /// Seconds the guard spent writing this post-mortem.
    #[serde(default)]
    pub seconds: f64,
}

/// What was asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The bytes of the tensor asked for, when known exactly (the history's OOM entry, or
    /// the CPU allocator's message).
    #[serde(default, deserialize_with = "opt_count")]
    pub bytes: Option<u64>,
    /// The bytes the caching allocator asked of the driver for it (a whole segment).
    #[serde(default, deserialize_with = "opt_count")]
    pub allocation_bytes: Option<u64>,
    /// The CUDA stream (torch's stream id), when known.
    #[serde(default)]
    pub stream: Option<i64>,
    /// "default", or the private pool (CUDA graph, MemPool) that served it.
    #[serde(default)]
    pub pool: String,
    /// Where the figures come from: "observer", "history", "exception".
    #[serde(default)]
    pub source: String,
}

/// A CUDA device's memory at the failing allocation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaMemory {
    #[serde(deserialize_with = "count")]
    pub total: u64,
    /// Free on the device as the driver says (all processes).
    #[serde(deserialize_with = "count")]
    pub driver_free: u64,
    /// torch's caching allocator: reserved (segments) and allocated (live blocks).
    #[serde(deserialize_with = "count")]
    pub reserved: u64,
    #[serde(deserialize_with = "count")]
    pub allocated: u64,
    /// Free bytes of split segments (memory_stats' inactive_split_bytes).
    #[serde(deserialize_with = "count")]
    pub inactive_split: u64,
    /// This process's use of the device as NVML reports it, when it could be read.
    #[serde(default, deserialize_with = "opt_count")]
    pub process_used: Option<u64>,
}

/// The host's memory at a CPU out-of-memory error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostMemory {
    /// The process's address-space limit (RLIMIT_AS), if one is set.
    #[serde(default, deserialize_with = "opt_count")]
    pub address_space_limit: Option<u64>,
    /// The process's address space and resident memory now (Linux).
    #[serde(default, deserialize_with = "opt_count")]
    pub address_space: Option<u64>,
    #[serde(default, deserialize_with = "opt_count")]
    pub resident: Option<u64>,
    /// The machine's available memory (MemAvailable).
    #[serde(default, deserialize_with = "opt_count")]
    pub available: Option<u64>,
}

/// One frame of the failing stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Frame {
    pub file: String,
    pub line: i64,
    pub function: String,
}

/// One live storage of the failing device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveTensor {
    pub name: String,
    pub shape: Vec<i64>,
    pub dtype: String,
    #[serde(deserialize_with = "count")]
    pub bytes: u64,
}

/// What autograd holds for backward in the graphs reachable from live tensors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Autograd {
    /// Bytes of the saved tensors no Python name reaches (each storage once).
    #[serde(deserialize_with = "count")]
    pub saved_bytes: u64,
    #[serde(deserialize_with = "count")]
    pub saved_count: u64,
    #[serde(deserialize_with = "count")]
    pub nodes: u64,
    /// False when the walk stopped at its bound.
    pub complete: bool,
}

/// Live bytes from one source line or module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Site {
    pub location: String,
    #[serde(deserialize_with = "count")]
    pub bytes: u64,
    #[serde(deserialize_with = "count")]
    pub count: u64,
}

/// The largest batch that fits, from the estimate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchFit {
    /// The batch of the failing step.
    #[serde(deserialize_with = "count")]
    pub current: u64,
    /// The largest batch whose estimated peak fits the budget (0: none fits).
    #[serde(deserialize_with = "count")]
    pub fits: u64,
    #[serde(deserialize_with = "count")]
    pub peak_at_fit: u64,
    #[serde(deserialize_with = "count")]
    pub budget: u64,
}

/// One piece of advice, with the bytes it is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Advice {
    /// "fragmentation", "expandable_segments", "max_split_size", "other_streams",
    /// "outside_allocator", "activations", "checkpointing", "batch", "capacity".
    pub kind: String,
    pub text: String,
    #[serde(default, deserialize_with = "opt_count")]
    pub bytes: Option<u64>,
}
