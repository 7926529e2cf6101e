//! One CUDA device's statistics: torch's binding until the allocator's own fields are
//! located (`cuda_direct`), then those fields, checked against the binding when first used,
//! at each `validate` (the engine's enable and disable), at every refresh and on a
//! schedule; the binding again for good after any difference. The source that calls the
//! binding is `cuda::py`'s `CudaSource`; here is its plain bookkeeping: the reader in use
//! and when it is checked next, a binding answer read by name, and the notice of a
//! difference.

use std::time::Instant;

use super::direct::{self as cuda_direct, schedule, Reader};
use crate::sources::layout::Layout;

/// How a CUDA source reads its statistics (for benchmarks and tests).
pub const READER_DIRECT: &str = "allocator memory";
pub const READER_BINDING: &str = "torch._C._cuda_memoryStats";

/// The direct reader in use and when it is checked next.
pub struct Direct {
    pub reader: Reader,
    pub schedule: schedule::Schedule,
    /// `samples` at the last check (a second check within one sample is skipped).
    pub checked_at: u64,
}

impl Direct {
    /// A reader just located, checked every `every` samples (and on `schedule::PERIOD`).
    pub fn new(reader: Reader, every: u32) -> Self {
        Self {
            reader,
            schedule: schedule::Schedule::new(every, schedule::PERIOD, Instant::now()),
            checked_at: 0,
        }
    }
}

/// What a check left: the binding's answer (layout order), and whether the direct reader
/// is still in use.
pub enum Checked {
    Kept(Vec<i64>),
    Dropped(Vec<i64>),
}

/// Samples between scheduled checks (`MEMLAB_RS_CUDA_REVALIDATE_SAMPLES`), or why the
/// variable's value is refused.
pub fn every() -> Result<u32, String> {
    schedule::every_from(std::env::var(schedule::ENV).ok().as_deref())
}

/// A binding answer (`names` and their `found` values) in `layout` order, by name: for an
/// answer of a different shape than the first sample (a memory pool came or went), so that
/// numbers never shift silently. A statistic the answer lacks reads 0.
pub fn by_name(layout: &Layout, names: &[String], found: &[i64]) -> Vec<i64> {
    let mut values = vec![0; layout.len()];
    for (name, &value) in names.iter().zip(found) {
        if let Some(i) = layout.index(name) {
            values[i] = value;
        }
    }
    values
}

/// Give `device`'s direct reader up for good: statistic `at` read `memory` from the
/// allocator's memory and `torch_value` from torch after sample `samples`.
pub fn reject(
    device: usize,
    samples: u64,
    layout: &Layout,
    at: usize,
    memory: i64,
    torch_value: i64,
) {
    let name = layout.names.get(at).map_or("?", String::as_str);
    cuda_direct::reject(
        device,
        format!(
            "memory disagreed with torch after sample {samples}: {name}={memory} in \
             allocator memory, {torch_value} from torch"
        ),
        cuda_direct::notice_text(device, samples, name, memory, torch_value),
    );
}
