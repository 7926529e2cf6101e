//! The tensor report's result (kind `tensor_report`): per device, its rows (one per tensor,
//! or per part of a sparse tensor, each storage charged once), their totals, and the CUDA
//! allocator's and the driver's figures; whether tensors may be missing, and how the walk
//! went. No Python object lives here, so a report never keeps a user's tensor alive. The
//! serde derive is the saved file's `data` and the schema a loaded file is checked against
//! (docs/guide.md, *Saved results*).
//!
//! The merged kind (`merged_tensor_report`, made by `merge.rs`) is here too: the reports of
//! several ranks, tensor by tensor.

use indexmap::IndexMap;
use serde::{Deserialize, Deserializer, Serialize};

use crate::gc_walk::Strategy;
use crate::results::count::{count, counts, opt_count, MAX};
use crate::results::{from_json, DataError};

/// One report: what `MemReporter.collect()` returns and a `tensor_report` file holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorReport {
    /// The default of the text's `verbose` (`name(->owner)` for a shared storage).
    pub verbose: bool,
    pub sections: Vec<DeviceSection>,
    /// Why tensors may be missing (a walk during a garbage collection, frozen objects).
    pub incomplete: Option<String>,
    pub walk: Walk,
}

/// How the gc walk found the tensors, and where its time went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Walk {
    /// A `gc_walk::Strategy`'s name.
    #[serde(deserialize_with = "strategy")]
    pub strategy: String,
    #[serde(deserialize_with = "count")]
    pub tensors: u64,
    pub walk_seconds: f64,
    pub facts_seconds: f64,
}

/// One row of the report, after storages have been deduplicated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub name: String,
    pub device: String,
    /// The sizes; None when a size is symbolic (then `shape_text` holds its str).
    #[serde(rename = "shape")]
    pub dims: Option<Vec<i64>>,
    /// As printed: Python's tuple, `(1,)` for a scalar (pytorch_memlab's).
    pub shape_text: String,
    pub dtype: String,
    #[serde(deserialize_with = "count")]
    pub numel: u64,
    /// Bytes this row is charged: the storage as allocated, or 0 if another row owns it.
    #[serde(deserialize_with = "count")]
    pub bytes: u64,
    /// The storage's own size in bytes, before allocator rounding.
    #[serde(deserialize_with = "count")]
    pub storage_bytes: u64,
    /// Name of the row that owns the storage this tensor shares.
    pub shared_with: Option<String>,
}

/// What the CUDA caching allocator and the driver say about one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaAccounting {
    /// `torch.cuda.memory_allocated(device)`.
    #[serde(deserialize_with = "count")]
    pub allocated: u64,
    /// `requested_bytes.all.current`: what callers asked for before rounding.
    #[serde(deserialize_with = "opt_count")]
    pub requested: Option<u64>,
    /// `torch.cuda.memory_reserved(device)`.
    #[serde(deserialize_with = "opt_count")]
    pub reserved: Option<u64>,
    /// Used and total bytes on the device by every process, from the driver (nvidia-smi's
    /// view); both or neither.
    #[serde(deserialize_with = "opt_count")]
    pub driver_used: Option<u64>,
    #[serde(deserialize_with = "opt_count")]
    pub driver_total: Option<u64>,
    /// Where the reserved but unallocated bytes are (the allocator floor's fragmentation
    /// of the device's segments), when the segments could be read. Left out of the JSON
    /// when absent, so that a report without it has the layout files had before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_in_reserved: Option<FreeInReserved>,
    /// Of `reserved`, the bytes of paused Courtesy regions: no device memory behind them
    /// (so the driver shows that much less). Left out when none.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "opt_count"
    )]
    pub paused_in_regions: Option<u64>,
}

/// The reserved but unallocated bytes of one device, in brief (`memlab_rs.fragmentation`
/// says where each block is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreeInReserved {
    /// Free bytes in the cached segments (inactive blocks).
    #[serde(deserialize_with = "count")]
    pub free_bytes: u64,
    /// The largest of those blocks: the largest request that fits without growing.
    #[serde(deserialize_with = "count")]
    pub largest_free: u64,
    /// Free bytes of segments that also hold live blocks (not returned by empty_cache).
    #[serde(deserialize_with = "count")]
    pub inactive_split_bytes: u64,
    #[serde(deserialize_with = "count")]
    pub segments: u64,
    /// Free bytes expandable segments could give back and map again elsewhere.
    #[serde(deserialize_with = "count")]
    pub expandable_reclaimable_bytes: u64,
}

impl CudaAccounting {
    /// (used, total) from the driver, when both are known.
    pub fn driver_used_total(&self) -> Option<(u64, u64)> {
        self.driver_used.zip(self.driver_total)
    }
}

/// The rows of one device and their totals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceSection {
    pub device: String,
    #[serde(deserialize_with = "count")]
    pub total_numel: u64,
    #[serde(deserialize_with = "count")]
    pub total_bytes: u64,
    /// Sum of `storage_bytes` over counted storages (no rounding).
    #[serde(deserialize_with = "count")]
    pub total_storage_bytes: u64,
    /// Rows left out by `top`, and the bytes they are charged.
    #[serde(deserialize_with = "count")]
    pub omitted_rows: u64,
    #[serde(deserialize_with = "count")]
    pub omitted_bytes: u64,
    pub cuda: Option<CudaAccounting>,
    pub rows: Vec<Row>,
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
            total_numel: 0,
            total_bytes: 0,
            total_storage_bytes: 0,
            omitted_rows: 0,
            omitted_bytes: 0,
            cuda: None,
            rows: Vec::new(),
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

/// A walk strategy's name, one this memlab_rs knows.
fn strategy<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    match Strategy::from_name(&name) {
        Some(_) => Ok(name),
        None => Err(serde::de::Error::custom(format!(
            "unknown strategy {name:?} (a file from another memlab_rs?)"
        ))),
    }
}

/// The largest rank: torch.distributed's ranks are C ints.
pub const RANK_MAX: u64 = i32::MAX as u64;

/// Tensor reports of several ranks, tensor by tensor (kind `merged_tensor_report`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergedTensorReport {
    /// The ranks merged, in order: every per-rank list below has one entry per rank.
    #[serde(deserialize_with = "ranks")]
    pub ranks: Vec<u64>,
    #[serde(deserialize_with = "world_size")]
    pub world_size: u64,
    /// Ordered by spread across ranks (the imbalance), then by size.
    pub rows: Vec<MergedRow>,
    /// Per device type (`cuda`, `cpu`), each rank's total bytes.
    pub totals: IndexMap<String, Vec<u64>>,
}

/// One tensor across ranks: keyed by name and device type, or for a tensor nothing names
/// (`(unnamed)`), by device type, shape and dtype.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergedRow {
    pub name: String,
    /// The device's type: `cuda` for every rank's own GPU.
    pub device: String,
    pub shape: Shape,
    pub dtype: String,
    /// Bytes on each rank, 0 where a rank does not hold it.
    #[serde(deserialize_with = "counts")]
    pub bytes: Vec<u64>,
}

/// A row's shape: its sizes, or the text of a symbolic one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Shape {
    Dims(Vec<i64>),
    Text(String),
}

impl MergedTensorReport {
    /// The merged report in `text`: its derive, then what the derive cannot say (one rank
    /// once, one entry per rank everywhere, totals that fit an i64).
    pub fn read(text: &str) -> Result<Self, DataError> {
        let merged: Self = from_json(text)?;
        merged.check()?;
        Ok(merged)
    }

    /// The rules between fields; every renderer may index the per-rank lists by rank.
    pub fn check(&self) -> Result<(), DataError> {
        let fault = |path: String, message: String| Err(DataError { path, message });
        let n = self.ranks.len();
        let mut seen = std::collections::HashSet::new();
        if !self.ranks.iter().all(|r| seen.insert(*r)) {
            return fault(
                "ranks".into(),
                format!("lists a rank twice: {:?}", self.ranks),
            );
        }
        for (i, row) in self.rows.iter().enumerate() {
            if row.bytes.len() != n {
                return fault(
                    format!("rows[{i}].bytes"),
                    format!("{} sizes for {n} ranks", row.bytes.len()),
                );
            }
        }
        for (device, sizes) in &self.totals {
            if sizes.len() != n {
                return fault(
                    format!("totals.{device}"),
                    format!("{} sizes for {n} ranks", sizes.len()),
                );
            }
            if let Some(i) = sizes.iter().position(|&b| b > MAX) {
                return fault(
                    format!("totals.{device}[{i}]"),
                    format!("{} is more than 2^63 - 1", sizes[i]),
                );
            }
        }
        Ok(())
    }
}

/// Ranks: 0 to 2^31 - 1 each.
fn ranks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    let ranks = Vec::<u64>::deserialize(d)?;
    match ranks.iter().position(|&r| r > RANK_MAX) {
        Some(i) => Err(serde::de::Error::custom(format!(
            "[{i}]: rank {} is more than 2^31 - 1",
            ranks[i]
        ))),
        None => Ok(ranks),
    }
}

/// A world size: 1 to 2^31.
fn world_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let size = u64::deserialize(d)?;
    if size == 0 || size > RANK_MAX + 1 {
        return Err(serde::de::Error::custom(format!(
            "a world size is 1 to 2^31, got {size}"
        )));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::to_json;

    fn report() -> TensorReport {
        TensorReport {
            verbose: false,
            sections: vec![DeviceSection {
                cuda: Some(CudaAccounting {
                    free_in_reserved: None,
                    paused_in_regions: None,
                    allocated: 4096,
                    requested: Some(1000),
                    reserved: None,
                    driver_used: Some(1),
                    driver_total: Some(2),
                }),
                rows: vec![Row {
                    name: "w".into(),
                    device: "cuda:0".into(),
                    dims: Some(vec![250]),
                    shape_text: "(250,)".into(),
                    dtype: "torch.float32".into(),
                    numel: 250,
                    bytes: 1024,
                    storage_bytes: 1000,
                    shared_with: None,
                }],
                total_numel: 250,
                total_bytes: 1024,
                total_storage_bytes: 1000,
                ..DeviceSection::empty("cuda:0")
            }],
            incomplete: None,
            walk: Walk {
                strategy: "gc.get_objects()".into(),
                tensors: 1,
                walk_seconds: 0.5,
                facts_seconds: 0.25,
            },
        }
    }

    #[test]
    fn the_saved_layout_is_the_one_files_have() {
        let text = to_json(&report());
        assert!(text.starts_with(
            r#"{"verbose":false,"sections":[{"device":"cuda:0","total_numel":250,"total_bytes":1024,"total_storage_bytes":1000,"omitted_rows":0,"omitted_bytes":0,"cuda":{"allocated":4096,"requested":1000,"reserved":null,"driver_used":1,"driver_total":2},"rows":[{"name":"w","device":"cuda:0","shape":[250],"shape_text":"(250,)","dtype":"torch.float32","numel":250,"bytes":1024,"storage_bytes":1000,"shared_with":null}]}],"incomplete":null,"walk":{"strategy":"gc.get_objects()","#
        ));
        assert_eq!(from_json::<TensorReport>(&text), Ok(report()));
    }

    #[test]
    fn the_remainder_adds_up() {
        let rest = report().sections[0].remainder().unwrap();
        assert_eq!((rest.unseen_tensors, rest.rounding), (0, 3072));
    }

    #[test]
    fn an_unknown_strategy_is_named() {
        let text = to_json(&report()).replace("gc.get_objects()", "telepathy");
        let err = from_json::<TensorReport>(&text).unwrap_err();
        assert_eq!(err.path, "walk.strategy");
        assert!(
            err.message.starts_with("unknown strategy \"telepathy\""),
            "{err}"
        );
    }
}

#[cfg(test)]
mod merged_tests {
    use super::*;

    const GOOD: &str = r#"{"ranks":[0,1],"world_size":2,"rows":[{"name":"w","device":"cpu","shape":[2,2],"dtype":"torch.float32","bytes":[16,0]},{"name":"s","device":"cuda","shape":"(s0,)","dtype":"torch.float32","bytes":[0,512]}],"totals":{"cpu":[16,0],"cuda":[0,512]}}"#;

    #[test]
    fn a_merged_report_reads_and_writes_its_layout() {
        let merged = MergedTensorReport::read(GOOD).unwrap();
        assert_eq!(merged.rows[0].shape, Shape::Dims(vec![2, 2]));
        assert_eq!(merged.rows[1].shape, Shape::Text("(s0,)".into()));
        assert_eq!(crate::results::to_json(&merged), GOOD);
    }

    #[test]
    fn the_rules_between_fields_name_the_field() {
        let twice = GOOD.replace(r#""ranks":[0,1]"#, r#""ranks":[1,1]"#);
        let err = MergedTensorReport::read(&twice).unwrap_err();
        assert_eq!(err.to_string(), "ranks: lists a rank twice: [1, 1]");
        let short = GOOD.replace("[16,0]}", "[16]}");
        let err = MergedTensorReport::read(&short).unwrap_err();
        assert_eq!(err.to_string(), "rows[0].bytes: 1 sizes for 2 ranks");
        let total = GOOD.replace(r#""cuda":[0,512]}"#, r#""cuda":[0]}"#);
        let err = MergedTensorReport::read(&total).unwrap_err();
        assert_eq!(err.to_string(), "totals.cuda: 1 sizes for 2 ranks");
        let big = GOOD.replace(r#""cpu":[16,0]"#, r#""cpu":[16,9223372036854775808]"#);
        assert_eq!(
            MergedTensorReport::read(&big).unwrap_err().path,
            "totals.cpu[1]"
        );
        let world = GOOD.replace(r#""world_size":2"#, r#""world_size":0"#);
        assert_eq!(
            MergedTensorReport::read(&world).unwrap_err().path,
            "world_size"
        );
        let rank = GOOD.replace(r#""ranks":[0,1]"#, r#""ranks":[0,2147483648]"#);
        assert_eq!(MergedTensorReport::read(&rank).unwrap_err().path, "ranks");
    }
}
