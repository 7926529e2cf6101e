//! Two tensor reports compared tensor by tensor: each tensor's bytes in A and in B (0 where
//! one report does not hold it), keyed by name and device, or for a tensor nothing names by
//! device, shape and dtype; what changed, growth first, largest first; and each device's
//! totals.

use indexmap::IndexMap;
use serde::Serialize;

use super::merge::{python_tuple, tensor_key, Key};
use super::result::TensorReport;

/// One tensor whose bytes changed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    pub name: String,
    pub device: String,
    /// As Python prints the row's shape: its tuple, or the symbolic shape's text.
    pub shape: String,
    pub dtype: String,
    pub a: i128,
    pub b: i128,
    pub change: i128,
}

/// One device's total bytes in A and B (those add: the tensors are held at once).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Total {
    pub device: String,
    pub a: i128,
    pub b: i128,
    pub change: i128,
}

/// What changed from A to B.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorDiff {
    pub rows: Vec<Change>,
    pub totals: Vec<Total>,
}

struct Found {
    name: String,
    bytes: i128,
    shape: String,
    dtype: String,
}

/// Rows by key; the rows of one key add up (the first names, shapes and types it).
fn tensors(report: &TensorReport) -> IndexMap<Key, Found> {
    let mut found: IndexMap<Key, Found> = IndexMap::new();
    for row in report.sections.iter().flat_map(|s| s.rows.iter()) {
        let shape = match &row.dims {
            Some(dims) => python_tuple(dims),
            None => row.shape_text.clone(),
        };
        let (name, key) = tensor_key(&row.name, &row.device, &shape, &row.dtype);
        found
            .entry(key)
            .and_modify(|f| f.bytes += row.bytes as i128)
            .or_insert(Found {
                name,
                bytes: row.bytes as i128,
                shape,
                dtype: row.dtype.clone(),
            });
    }
    found
}

fn device_of(key: &Key) -> &str {
    match key {
        Key::Named(_, device) | Key::Unnamed(device, _, _) => device,
    }
}

/// What changed from `a` to `b`: a tensor found in one report only counts as 0 in the other.
pub fn diff(a: &TensorReport, b: &TensorReport) -> TensorDiff {
    let (rows_a, rows_b) = (tensors(a), tensors(b));
    let keys = rows_a
        .keys()
        .chain(rows_b.keys().filter(|k| !rows_a.contains_key(*k)));
    let mut rows = Vec::new();
    for key in keys {
        let (ra, rb) = (rows_a.get(key), rows_b.get(key));
        let va = ra.map_or(0, |r| r.bytes);
        let vb = rb.map_or(0, |r| r.bytes);
        if va == vb {
            continue;
        }
        // B's name, shape and type where B has the tensor.
        let Some(shown) = rb.or(ra) else { continue };
        rows.push(Change {
            name: shown.name.clone(),
            device: device_of(key).to_owned(),
            shape: shown.shape.clone(),
            dtype: shown.dtype.clone(),
            a: va,
            b: vb,
            change: vb - va,
        });
    }
    // Growth first, largest first; then shrinking, largest first (stable).
    rows.sort_by_key(|r| (r.change < 0, std::cmp::Reverse(r.change.abs())));
    let device_totals = |r: &TensorReport| -> IndexMap<String, i128> {
        r.sections
            .iter()
            .map(|s| (s.device.clone(), s.total_bytes as i128))
            .collect()
    };
    let (totals_a, totals_b) = (device_totals(a), device_totals(b));
    let devices = totals_a
        .keys()
        .chain(totals_b.keys().filter(|d| !totals_a.contains_key(*d)));
    let totals = devices
        .map(|device| {
            let va = totals_a.get(device).copied().unwrap_or(0);
            let vb = totals_b.get(device).copied().unwrap_or(0);
            Total {
                device: device.clone(),
                a: va,
                b: vb,
                change: vb - va,
            }
        })
        .collect();
    TensorDiff { rows, totals }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::from_json;

    fn report(rows: &[(&str, &[i64], u64)]) -> TensorReport {
        let total: u64 = rows.iter().map(|r| r.2).sum();
        let rows: Vec<String> = rows
            .iter()
            .map(|(name, dims, bytes)| {
                format!(
                    r#"{{"name":"{name}","device":"cpu","shape":{dims:?},"shape_text":"","dtype":"torch.float32","numel":0,"bytes":{bytes},"storage_bytes":0,"shared_with":null}}"#
                )
            })
            .collect();
        from_json(&format!(
            r#"{{"verbose":false,"sections":[{{"device":"cpu","total_numel":0,"total_bytes":{total},"total_storage_bytes":0,"omitted_rows":0,"omitted_bytes":0,"cuda":null,"rows":[{}]}}],"incomplete":null,"walk":{{"strategy":"gc.get_objects()","tensors":0,"walk_seconds":0,"facts_seconds":0}}}}"#,
            rows.join(",")
        ))
        .unwrap()
    }

    #[test]
    fn growth_first_and_unnamed_tensors_by_shape() {
        let a = report(&[("w", &[2], 8), ("Tensor0", &[128], 512), ("gone", &[], 4)]);
        let b = report(&[
            ("w", &[2], 8),
            ("Tensor3", &[256], 1024),
            ("Tensor4", &[128], 512),
        ]);
        let d = diff(&a, &b);
        let rows: Vec<_> = d
            .rows
            .iter()
            .map(|r| (r.name.as_str(), r.shape.as_str(), r.change))
            .collect();
        assert_eq!(rows, [("(unnamed)", "(256,)", 1024), ("gone", "()", -4)]);
        assert_eq!(
            (d.totals[0].a, d.totals[0].b, d.totals[0].change),
            (524, 1544, 1020)
        );
    }
}
