//! Plain records: what the collector learned about each tensor, and the rows analysis makes
//! of them. No Python object lives here, so a report never keeps a user's tensor alive.

/// One row of the report, after storages have been deduplicated.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub name: String,
    pub device: String,
    pub dims: Option<Vec<i64>>,
    pub shape_text: String,
    pub dtype: String,
    pub numel: u64,
    /// Bytes this row is charged: the storage as allocated, or 0 if another row owns it.
    pub bytes: u64,
    /// The storage's own size in bytes, before allocator rounding.
    pub storage_bytes: u64,
    /// Name of the row that owns the storage this tensor shares.
    pub shared_with: Option<String>,
}

/// What the CUDA caching allocator and the driver say about one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaAccounting {
    /// `torch.cuda.memory_allocated(device)`.
    pub allocated: u64,
    /// `requested_bytes.all.current`: what callers asked for before rounding.
    pub requested: Option<u64>,
    /// `torch.cuda.memory_reserved(device)`.
    pub reserved: Option<u64>,
    /// (used, total) on the device by every process, from the driver (nvidia-smi's view).
    pub driver_used_total: Option<(u64, u64)>,
}

/// The rows of one device and their totals.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSection {
    pub device: String,
    pub rows: Vec<Row>,
    /// Rows left out by `top`, and the bytes they are charged.
    pub omitted_rows: usize,
    pub omitted_bytes: u64,
    pub total_numel: u64,
    pub total_bytes: u64,
    /// Sum of `storage_bytes` over counted storages (no rounding).
    pub total_storage_bytes: u64,
    pub cuda: Option<CudaAccounting>,
}

/// The remainder of `memory_allocated` that the listed tensors do not explain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remainder {
    /// Requested bytes no visible tensor accounts for: autograd's saved tensors, C++ buffers.
    pub unseen_tensors: i128,
    /// Rounding of allocator blocks beyond what the listed rows already carry.
    pub rounding: i128,
}

impl DeviceSection {
    /// A section with no rows yet.
    pub fn empty(device: &str) -> Self {
        Self {
            device: device.to_owned(),
            rows: Vec::new(),
            omitted_rows: 0,
            omitted_bytes: 0,
            total_numel: 0,
            total_bytes: 0,
            total_storage_bytes: 0,
            cuda: None,
        }
    }

    /// Split `allocated - total_bytes` into unseen tensors and rounding, when torch reports
    /// requested bytes; the two parts always add up to the whole remainder.
    pub fn remainder(&self) -> Option<Remainder> {
        let cuda = self.cuda?;
        let rest = cuda.allocated as i128 - self.total_bytes as i128;
        Some(match cuda.requested {
            Some(requested) => {
                let unseen = requested as i128 - self.total_storage_bytes as i128;
                Remainder {
                    unseen_tensors: unseen,
                    rounding: rest - unseen,
                }
            }
            None => Remainder {
                unseen_tensors: rest,
                rounding: 0,
            },
        })
    }
}
