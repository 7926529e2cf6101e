//! Python entry points of the tracker renderers: the log block and the HTML table, from
//! the rows as Python dicts (a live `track()`'s or a saved result's).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::render::{html as tracker_html, text as tracker_text};
use crate::tracker::diff::DiffRow;

/// Rows as `track()` returns them (sign, count, shape, dtype, bytes, storage_bytes, type,
/// names).
fn parse_rows(rows: Vec<Bound<'_, PyDict>>) -> PyResult<Vec<DiffRow>> {
    let mut parsed = Vec::with_capacity(rows.len());
    for (i, row) in rows.into_iter().enumerate() {
        let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
            row.get_item(k)?
                .ok_or_else(|| PyValueError::new_err(format!("tracker row {i} has no {k:?}")))
        };
        let sign: String = get("sign")?.extract()?;
        let sign = match sign.as_str() {
            "+" => '+',
            "-" => '-',
            _ => {
                return Err(PyValueError::new_err(format!(
                    "tracker row {i}: sign must be \"+\" or \"-\", got {sign:?}"
                )))
            }
        };
        parsed.push(DiffRow {
            sign,
            count: get("count")?.extract()?,
            kind: get("type")?.extract()?,
            shape: get("shape")?.extract()?,
            dtype: get("dtype")?.extract()?,
            bytes: get("bytes")?.extract()?,
            storage_bytes: get("storage_bytes")?.extract()?,
            names: get("names")?.extract()?,
        });
    }
    Ok(parsed)
}

/// The log text of one `track()`: rows (when `detail`), then the `At {place}` line; with
/// the header line first when `stamp` is given (the first call). Rows print their
/// `storage_bytes` (the allocator's `bytes` are in the data and the HTML); `tensor_bytes`
/// is the storages' total.
///
/// >>> from memlab_rs._core import render_tracker_block
/// >>> rows = [dict(sign="+", count=1, shape="(2,)", dtype="torch.float32", bytes=512,
/// ...              storage_bytes=8, type="<class 'torch.Tensor'>", names=[])]
/// >>> print(render_tracker_block(rows, True, "a.py line 3: f", 8, 8, None).strip())
/// + | 1 * Size:(2,)                 | Memory: 0.0000 M | <class 'torch.Tensor'> | torch.float32
/// <BLANKLINE>
/// At a.py line 3: f                                      Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb
#[pyfunction]
#[pyo3(signature = (rows, detail, place, tensor_bytes, allocated_bytes, stamp=None))]
pub fn render_tracker_block(
    rows: Vec<Bound<'_, PyDict>>,
    detail: bool,
    place: &str,
    tensor_bytes: u64,
    allocated_bytes: u64,
    stamp: Option<&str>,
) -> PyResult<String> {
    let parsed = parse_rows(rows)?;
    let mut out = String::new();
    if let Some(stamp) = stamp {
        out.push_str(&tracker_text::header(stamp, tensor_bytes, allocated_bytes));
    }
    out.push_str(&tracker_text::block(
        &parsed,
        detail,
        place,
        tensor_bytes,
        allocated_bytes,
    ));
    Ok(out)
}

/// One `track()` as an HTML table (every row, the place, the totals, the note):
/// `tensor_storage_bytes` and `tensor_bytes` are the storages' own and the allocator's.
#[pyfunction]
#[pyo3(signature = (rows, place, tensor_storage_bytes, tensor_bytes, allocated_bytes, incomplete=None))]
pub fn _tracker_html(
    rows: Vec<Bound<'_, PyDict>>,
    place: &str,
    tensor_storage_bytes: u64,
    tensor_bytes: u64,
    allocated_bytes: u64,
    incomplete: Option<&str>,
) -> PyResult<String> {
    let parsed = parse_rows(rows)?;
    let totals = tracker_html::Totals {
        storage_bytes: tensor_storage_bytes,
        bytes: tensor_bytes,
        allocated_bytes,
    };
    Ok(tracker_html::render(&parsed, place, &totals, incomplete))
}
