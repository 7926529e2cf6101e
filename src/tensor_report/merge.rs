//! Tensor reports of several ranks merged tensor by tensor: each tensor's bytes on each rank
//! (0 where a rank does not hold it), keyed by name and device type, and each device type's
//! totals per rank; then the spread of each across ranks (min, median, max, the rank of the
//! max), which the merged report's text, HTML and records show.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use super::result::{MergedRow, MergedTensorReport, Shape, TensorReport};
use crate::results::count::MAX;
use crate::results::DataError;

/// What `merge_results` hands over: the reports ordered by rank, their ranks, the world.
#[derive(Debug, Deserialize)]
pub struct MergeInput {
    pub ranks: Vec<u64>,
    pub world_size: u64,
    pub reports: Vec<TensorReport>,
}

/// The name shown for a tensor nothing names.
pub const UNNAMED: &str = "(unnamed)";

/// Rows of one tensor are matched by this: its name and device, or, for a tensor nothing
/// names, `(unnamed)` with its device, shape and dtype.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    Named(String, String),
    Unnamed(String, String, String),
}

/// (the name shown, the key rows are matched by) of a report's row, its device given as
/// the caller compares them (the type for a merge, the device itself for a diff). The
/// reporter calls a tensor nothing names after its type and the order it was found in
/// (`Tensor0`, `Parameter3`): numbers that differ between ranks and runs, so those are
/// matched by what they are instead.
pub fn tensor_key(name: &str, device: &str, shape: &str, dtype: &str) -> (String, Key) {
    if is_unnamed(name) {
        let key = Key::Unnamed(device.to_owned(), shape.to_owned(), dtype.to_owned());
        (UNNAMED.to_owned(), key)
    } else {
        (
            name.to_owned(),
            Key::Named(name.to_owned(), device.to_owned()),
        )
    }
}

/// Whether `name` is a number the reporter gave: `(?:\w*Tensor|Parameter|Buffer)\d+(?:\.grad)?`
/// in full. The reporter writes its numbers in ASCII digits, so only those count as one (a
/// user's name ending in another script's digits is a name).
pub fn is_unnamed(name: &str) -> bool {
    let name = name.strip_suffix(".grad").unwrap_or(name);
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    if stem.len() == name.len() {
        return false; // no number
    }
    if stem == "Parameter" || stem == "Buffer" {
        return true;
    }
    match stem.strip_suffix("Tensor") {
        Some(prefix) => prefix.chars().all(|c| c == '_' || c.is_alphanumeric()),
        None => false,
    }
}

/// Python's `str(tuple(dims))`: `()` for a scalar (the report's `shape_text` prints
/// pytorch_memlab's `(1,)` there).
pub fn python_tuple(dims: &[i64]) -> String {
    match dims {
        [one] => format!("({one},)"),
        many => {
            let inner: Vec<String> = many.iter().map(|d| d.to_string()).collect();
            format!("({})", inner.join(", "))
        }
    }
}

impl Shape {
    /// The shape as text: a tuple's, or the symbolic shape's own.
    pub fn text(&self) -> String {
        match self {
            Shape::Dims(dims) => python_tuple(dims),
            Shape::Text(text) => text.clone(),
        }
    }
}

/// The device's type: `cuda` for `cuda:1`.
pub fn device_type(device: &str) -> &str {
    device.split(':').next().unwrap_or(device)
}

fn add(total: &mut u64, bytes: u64, what: impl FnOnce() -> String) -> Result<(), DataError> {
    match total.checked_add(bytes).filter(|&sum| sum <= MAX) {
        Some(sum) => {
            *total = sum;
            Ok(())
        }
        None => Err(DataError {
            path: String::new(),
            message: format!("{} add up to more than 2^63 - 1 bytes", what()),
        }),
    }
}

/// Merge the reports (ordered by rank): rows ordered by spread (max - min) then by size, the
/// tensors only some ranks hold first.
pub fn merge(input: MergeInput) -> Result<MergedTensorReport, DataError> {
    let n = input.reports.len();
    if input.ranks.len() != n {
        return Err(DataError {
            path: "ranks".into(),
            message: format!("{} ranks for {n} reports", input.ranks.len()),
        });
    }
    let mut rows: IndexMap<Key, MergedRow> = IndexMap::new();
    let mut totals: IndexMap<String, Vec<u64>> = IndexMap::new();
    for (i, report) in input.reports.iter().enumerate() {
        for row in report.sections.iter().flat_map(|s| s.rows.iter()) {
            let kind = device_type(&row.device);
            let shape = match &row.dims {
                Some(dims) => Shape::Dims(dims.clone()),
                None => Shape::Text(row.shape_text.clone()),
            };
            let (name, key) = tensor_key(&row.name, kind, &shape.text(), &row.dtype);
            let merged = rows.entry(key).or_insert_with(|| MergedRow {
                name,
                device: kind.to_owned(),
                shape,
                dtype: row.dtype.clone(),
                bytes: vec![0; n],
            });
            add(&mut merged.bytes[i], row.bytes, || {
                format!("the rows of {} on {kind}", merged.name)
            })?;
        }
        for section in &report.sections {
            let kind = device_type(&section.device);
            let total = totals.entry(kind.to_owned()).or_insert_with(|| vec![0; n]);
            add(&mut total[i], section.total_bytes, || {
                format!("the totals on {kind}")
            })?;
        }
    }
    let mut ordered: Vec<MergedRow> = rows.into_values().collect();
    // Stable: ties keep the order the tensors were first found in.
    ordered.sort_by(|a, b| {
        let (a_low, a_high) = low_high(&a.bytes);
        let (b_low, b_high) = low_high(&b.bytes);
        (b_high - b_low)
            .cmp(&(a_high - a_low))
            .then(b_high.cmp(&a_high))
            .then(a.name.cmp(&b.name))
    });
    let merged = MergedTensorReport {
        ranks: input.ranks,
        world_size: input.world_size,
        rows: ordered,
        totals,
    };
    merged.check()?;
    Ok(merged)
}

fn low_high(values: &[u64]) -> (u64, u64) {
    let low = values.iter().copied().min().unwrap_or(0);
    let high = values.iter().copied().max().unwrap_or(0);
    (low, high)
}

/// A median: a whole number, or halfway between two (Python's `statistics.median`, made an
/// int when it is whole).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Median {
    Whole(i128),
    Half(f64),
}

impl Median {
    /// As a float, as `readable_size` takes it.
    pub fn as_f64(self) -> f64 {
        match self {
            Median::Whole(n) => n as f64,
            Median::Half(x) => x,
        }
    }
}

impl Serialize for Median {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Median::Whole(n) => s.serialize_i128(*n),
            Median::Half(x) => s.serialize_f64(*x),
        }
    }
}

/// min, median and max of the ranks' values, and the first rank holding the max.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub min: u64,
    pub median: Median,
    pub max: u64,
    pub max_rank: u64,
}

/// The spread of `values` (one per rank, in `ranks` order); None with no rank.
pub fn spread(values: &[u64], ranks: &[u64]) -> Option<Spread> {
    let max = *values.iter().max()?;
    let min = *values.iter().min()?;
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    let median = if n % 2 == 1 {
        Median::Whole(sorted[n / 2] as i128)
    } else {
        let sum = sorted[n / 2 - 1] as i128 + sorted[n / 2] as i128;
        if sum % 2 == 0 {
            Median::Whole(sum / 2)
        } else {
            // Python: int / int, correctly rounded; an int again when the float is whole.
            let half = sum as f64 / 2.0;
            if half.fract() == 0.0 {
                Median::Whole(half as i128)
            } else {
                Median::Half(half)
            }
        }
    };
    let at = values.iter().position(|&v| v == max)?;
    Some(Spread {
        min,
        median,
        max,
        max_rank: *ranks.get(at)?,
    })
}

/// One merged row as a record: name, device, dtype, shape (text), `min`, `median`, `max`,
/// `max_rank` and `rank<R>` (bytes on each rank), in that order.
#[derive(Debug)]
pub struct Record {
    pub name: String,
    pub device: String,
    pub dtype: String,
    pub shape: String,
    pub spread: Option<Spread>,
    pub per_rank: Vec<(u64, u64)>,
}

impl Serialize for Record {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(8 + self.per_rank.len()))?;
        map.serialize_entry("name", &self.name)?;
        map.serialize_entry("device", &self.device)?;
        map.serialize_entry("dtype", &self.dtype)?;
        map.serialize_entry("shape", &self.shape)?;
        map.serialize_entry("min", &self.spread.map(|s| s.min))?;
        map.serialize_entry("median", &self.spread.map(|s| s.median))?;
        map.serialize_entry("max", &self.spread.map(|s| s.max))?;
        map.serialize_entry("max_rank", &self.spread.map(|s| s.max_rank))?;
        for (rank, bytes) in &self.per_rank {
            map.serialize_entry(&format!("rank{rank}"), bytes)?;
        }
        map.end()
    }
}

/// Every row of a merged report as a record.
pub fn records(merged: &MergedTensorReport) -> Vec<Record> {
    merged
        .rows
        .iter()
        .map(|row| Record {
            name: row.name.clone(),
            device: row.device.clone(),
            dtype: row.dtype.clone(),
            shape: row.shape.text(),
            spread: spread(&row.bytes, &merged.ranks),
            per_rank: merged
                .ranks
                .iter()
                .copied()
                .zip(row.bytes.iter().copied())
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{from_json, to_json};

    #[test]
    fn the_reporters_numbers_are_unnamed() {
        for name in [
            "Tensor0",
            "Parameter3",
            "Buffer12",
            "FakeTensor7",
            "Tensor0.grad",
            "_my_Tensor1",
            "ñTensor4",
            "Tensor0Tensor1",
        ] {
            assert!(is_unnamed(name), "{name}");
        }
        for name in [
            "weight",
            "Tensor",
            "Parameter",
            "MyParameter3",
            "Tensor0.grad.grad",
            "Tensor0x",
            "a.Tensor0",
            "Tensor٣",
            "Tensor 3",
            ".grad",
        ] {
            assert!(!is_unnamed(name), "{name}");
        }
        assert_eq!(
            tensor_key("model.fc.weight", "cpu", "(4, 4)", "torch.float32"),
            (
                "model.fc.weight".to_string(),
                Key::Named("model.fc.weight".into(), "cpu".into())
            )
        );
        let (name, key) = tensor_key("Tensor7", "cpu", "(4, 4)", "torch.float32");
        assert_eq!(name, "(unnamed)");
        assert_eq!(
            key,
            Key::Unnamed("cpu".into(), "(4, 4)".into(), "torch.float32".into())
        );
        assert_eq!(python_tuple(&[]), "()");
        assert_eq!(python_tuple(&[3]), "(3,)");
        assert_eq!(python_tuple(&[3, -1]), "(3, -1)");
    }

    #[test]
    fn spreads_are_pythons() {
        let s = spread(&[1, 5, 3], &[0, 2, 3]).unwrap();
        assert_eq!(
            (s.min, s.median, s.max, s.max_rank),
            (1, Median::Whole(3), 5, 2)
        );
        let s = spread(&[1, 2], &[0, 1]).unwrap();
        assert_eq!(s.median, Median::Half(1.5));
        assert_eq!(to_json(&s.median), "1.5");
        let s = spread(&[4, 4, 2, 6], &[0, 1, 2, 3]).unwrap();
        assert_eq!((s.median, s.max_rank), (Median::Whole(4), 3));
        assert_eq!(spread(&[], &[]), None);
    }

    fn report(rows: &[(&str, &str, &[i64], u64)]) -> TensorReport {
        let text = format!(
            r#"{{"verbose":false,"sections":[{}],"incomplete":null,"walk":{{"strategy":"gc.get_objects()","tensors":0,"walk_seconds":0,"facts_seconds":0}}}}"#,
            rows.iter()
                .map(|(name, device, dims, bytes)| format!(
                    r#"{{"device":"{device}","total_numel":0,"total_bytes":{bytes},"total_storage_bytes":0,"omitted_rows":0,"omitted_bytes":0,"cuda":null,"rows":[{{"name":"{name}","device":"{device}","shape":{dims:?},"shape_text":"","dtype":"torch.float32","numel":0,"bytes":{bytes},"storage_bytes":0,"shared_with":null}}]}}"#
                ))
                .collect::<Vec<_>>()
                .join(",")
        );
        from_json(&text).unwrap()
    }

    #[test]
    fn tensors_are_matched_by_name_or_by_what_they_are() {
        let a = report(&[("w", "cuda:0", &[2], 512), ("Tensor0", "cpu", &[4], 16)]);
        let b = report(&[
            ("w", "cuda:1", &[2], 512),
            ("Tensor5", "cpu", &[4], 16),
            ("Tensor6", "cpu", &[8], 32),
        ]);
        let merged = merge(MergeInput {
            ranks: vec![0, 1],
            world_size: 2,
            reports: vec![a, b],
        })
        .unwrap();
        let rows: Vec<_> = merged
            .rows
            .iter()
            .map(|r| (r.name.as_str(), r.shape.text(), r.bytes.clone()))
            .collect();
        assert_eq!(
            rows,
            [
                ("(unnamed)", "(8,)".to_string(), vec![0, 32]),
                ("w", "(2,)".to_string(), vec![512, 512]),
                ("(unnamed)", "(4,)".to_string(), vec![16, 16]),
            ]
        );
        assert_eq!(merged.totals["cuda"], [512, 512]);
        assert_eq!(merged.totals["cpu"], [16, 48]);
        let records = to_json(&records(&merged));
        assert!(records.starts_with(r#"[{"name":"(unnamed)","device":"cpu","dtype":"torch.float32","shape":"(8,)","min":0,"median":16,"max":32,"max_rank":1,"rank0":0,"rank1":32}"#), "{records}");
    }

    #[test]
    fn sums_past_an_i64_are_an_error_not_a_wrap() {
        let big = MAX;
        let a = report(&[("Tensor0", "cpu", &[1], big), ("Tensor1", "cpu", &[1], big)]);
        let err = merge(MergeInput {
            ranks: vec![0],
            world_size: 1,
            reports: vec![a],
        })
        .unwrap_err();
        assert!(
            err.message.contains("add up to more than 2^63 - 1 bytes"),
            "{err}"
        );
    }
}
