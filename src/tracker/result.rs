//! What one `track()` found (kind `tracker`): the rows that appeared (`+`) and vanished
//! (`-`), the totals, where it was called, and how the walk went. The serde derive is the
//! saved file's `data` and the schema a loaded file is checked against (docs/guide.md,
//! *Saved results*).
//!
//! Two byte counts travel together: the storages' own bytes (`storage_bytes`, what the log
//! prints) and what the allocator holds for them (`bytes`: CUDA's 512-byte blocks). Files
//! saved before the storages' own bytes were kept lack them: there `bytes` stands for both
//! (`SavedTrack`, `SavedRow`).

use indexmap::IndexMap;
use serde::{Deserialize, Deserializer, Serialize};

use super::diff::DiffRow;
use crate::results::count::{count, opt_count};

/// One `track()`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "SavedTrack")]
pub struct Track {
    pub rows: Vec<Row>,
    /// Bytes the allocator holds for every storage on the device, each once (CUDA: in
    /// 512-byte blocks).
    pub total_bytes: u64,
    /// The own bytes of every storage on the device, each once: the log's "Total Tensor
    /// Used Memory".
    pub total_storage_bytes: u64,
    /// `torch.cuda.memory_allocated(device)`; on the CPU the same as `total_bytes`.
    pub allocated_bytes: u64,
    /// Live tensors on the device.
    pub tensors: u64,
    /// Where `track()` was called: `file line N: function`.
    #[serde(rename = "where")]
    pub place: String,
    /// How the gc walk found them (`..., since the last walk` when it resumed).
    pub strategy: String,
    /// Why the result may miss tensors.
    pub incomplete: Option<String>,
    /// Where the time went: `walk`, `facts`.
    pub seconds: IndexMap<String, f64>,
    /// Whether the log lists the rows (the tracker's `detail`).
    pub detail: bool,
    /// The log's header time stamp, on the first `track()` only.
    pub stamp: Option<String>,
}

/// One `+`/`-` line: tensors of one (type, shape, dtype) that appeared or vanished.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "SavedRow")]
pub struct Row {
    pub sign: char,
    pub count: u64,
    pub shape: String,
    pub dtype: String,
    /// Bytes the allocator holds for the storages that appeared (or vanished) with them,
    /// each storage once: on CUDA each rounded up to 512-byte blocks, on the CPU their own.
    pub bytes: u64,
    /// The storages' own bytes (`nbytes()`), each once: what the log prints.
    pub storage_bytes: u64,
    /// Python's `str(type(t))`, e.g. `<class 'torch.Tensor'>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The model's names of the tensors that appeared (or vanished).
    pub names: Vec<String>,
    /// The row as the log has it.
    pub line: String,
}

impl Row {
    /// The analysis's row, with the log's line for it.
    pub fn new(row: DiffRow, line: String) -> Self {
        Self {
            sign: row.sign,
            count: row.count,
            shape: row.shape,
            dtype: row.dtype,
            bytes: row.bytes,
            storage_bytes: row.storage_bytes,
            kind: row.kind,
            names: row.names,
            line,
        }
    }

    /// The row as the renderers take it.
    pub fn diff_row(&self) -> DiffRow {
        DiffRow {
            sign: self.sign,
            count: self.count,
            kind: self.kind.clone(),
            shape: self.shape.clone(),
            dtype: self.dtype.clone(),
            bytes: self.bytes,
            storage_bytes: self.storage_bytes,
            names: self.names.clone(),
        }
    }
}

/// A `Track` as a file holds it: `total_storage_bytes` may be missing (a file saved before
/// it was kept), then `total_bytes` stands for it.
#[derive(Deserialize)]
struct SavedTrack {
    rows: Vec<Row>,
    #[serde(deserialize_with = "count")]
    total_bytes: u64,
    #[serde(default, deserialize_with = "opt_count")]
    total_storage_bytes: Option<u64>,
    #[serde(deserialize_with = "count")]
    allocated_bytes: u64,
    #[serde(deserialize_with = "count")]
    tensors: u64,
    #[serde(rename = "where")]
    place: String,
    strategy: String,
    incomplete: Option<String>,
    seconds: IndexMap<String, f64>,
    detail: bool,
    stamp: Option<String>,
}

impl From<SavedTrack> for Track {
    fn from(saved: SavedTrack) -> Self {
        Self {
            rows: saved.rows,
            total_bytes: saved.total_bytes,
            total_storage_bytes: saved.total_storage_bytes.unwrap_or(saved.total_bytes),
            allocated_bytes: saved.allocated_bytes,
            tensors: saved.tensors,
            place: saved.place,
            strategy: saved.strategy,
            incomplete: saved.incomplete,
            seconds: saved.seconds,
            detail: saved.detail,
            stamp: saved.stamp,
        }
    }
}

/// A `Row` as a file holds it: `storage_bytes` may be missing (a file saved before it was
/// kept), then `bytes` stands for it.
#[derive(Deserialize)]
struct SavedRow {
    #[serde(deserialize_with = "sign")]
    sign: char,
    #[serde(deserialize_with = "count")]
    count: u64,
    shape: String,
    dtype: String,
    #[serde(deserialize_with = "count")]
    bytes: u64,
    #[serde(default, deserialize_with = "opt_count")]
    storage_bytes: Option<u64>,
    #[serde(rename = "type")]
    kind: String,
    names: Vec<String>,
    line: String,
}

impl From<SavedRow> for Row {
    fn from(saved: SavedRow) -> Self {
        Self {
            sign: saved.sign,
            count: saved.count,
            shape: saved.shape,
            dtype: saved.dtype,
            bytes: saved.bytes,
            storage_bytes: saved.storage_bytes.unwrap_or(saved.bytes),
            kind: saved.kind,
            names: saved.names,
            line: saved.line,
        }
    }
}

/// `"+"` or `"-"`.
fn sign<'de, D: Deserializer<'de>>(d: D) -> Result<char, D::Error> {
    let text = String::deserialize(d)?;
    match text.as_str() {
        "+" => Ok('+'),
        "-" => Ok('-'),
        _ => Err(serde::de::Error::custom(format!(
            "a sign is \"+\" or \"-\", got {text:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{from_json, to_json};

    const SAVED: &str = r#"{"rows":[{"sign":"+","count":1,"shape":"(2,)","dtype":"torch.float32","bytes":512,"storage_bytes":8,"type":"<class 'torch.Tensor'>","names":["w"],"line":"+ | 1 * Size:(2,)"}],"total_bytes":512,"total_storage_bytes":8,"allocated_bytes":512,"tensors":1,"where":"a.py line 3: f","strategy":"gc.get_objects()","incomplete":null,"seconds":{"walk":0.5,"facts":0.25},"detail":true,"stamp":null}"#;

    #[test]
    fn the_saved_layout_is_the_one_files_have() {
        let track: Track = from_json(SAVED).unwrap();
        assert_eq!(track.rows[0].sign, '+');
        assert_eq!(track.rows[0].kind, "<class 'torch.Tensor'>");
        assert_eq!(to_json(&track), SAVED);
        assert_eq!(
            Row::new(track.rows[0].diff_row(), track.rows[0].line.clone()),
            track.rows[0]
        );
    }

    #[test]
    fn a_misfit_names_its_field() {
        let err = from_json::<Track>(&SAVED.replace(r#""sign":"+""#, r#""sign":"*""#)).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"rows[0].sign: a sign is "+" or "-", got "*""#
        );
        let err =
            from_json::<Track>(&SAVED.replace(r#""bytes":512"#, r#""bytes":-5"#)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rows[0].bytes: invalid value: integer `-5`, expected u64"
        );
        let err =
            from_json::<Track>(&SAVED.replace(r#""where":"a.py line 3: f","#, "")).unwrap_err();
        assert_eq!(err.to_string(), "missing field `where`");
        let err =
            from_json::<Track>(&SAVED.replace(r#""storage_bytes":8"#, r#""storage_bytes":-1"#))
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "rows[0].storage_bytes: invalid value: integer `-1`, expected u64"
        );
    }

    #[test]
    fn a_file_from_before_storage_bytes_reads_its_bytes_for_both() {
        let old = SAVED
            .replace(r#""storage_bytes":8,"#, "")
            .replace(r#""total_storage_bytes":8,"#, "");
        let track: Track = from_json(&old).unwrap();
        assert_eq!(
            (track.rows[0].bytes, track.rows[0].storage_bytes),
            (512, 512)
        );
        assert_eq!((track.total_bytes, track.total_storage_bytes), (512, 512));
    }
}
