//! What one `track()` found (kind `tracker`): the rows that appeared (`+`) and vanished
//! (`-`), the totals, where it was called, and how the walk went. The serde derive is the
//! saved file's `data` and the schema a loaded file is checked against (docs/guide.md,
//! *Saved results*).

use indexmap::IndexMap;
use serde::{Deserialize, Deserializer, Serialize};

use super::diff::DiffRow;
use crate::results::count::count;

/// One `track()`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Track {
    pub rows: Vec<Row>,
    /// Bytes of every storage on the device, each once.
    #[serde(deserialize_with = "count")]
    pub total_bytes: u64,
    /// `torch.cuda.memory_allocated(device)`; on the CPU the same as `total_bytes`.
    #[serde(deserialize_with = "count")]
    pub allocated_bytes: u64,
    /// Live tensors on the device.
    #[serde(deserialize_with = "count")]
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
pub struct Row {
    #[serde(deserialize_with = "sign")]
    pub sign: char,
    #[serde(deserialize_with = "count")]
    pub count: u64,
    pub shape: String,
    pub dtype: String,
    /// Bytes of the storages that appeared (or vanished) with them, each storage once.
    #[serde(deserialize_with = "count")]
    pub bytes: u64,
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
            names: self.names.clone(),
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

    const SAVED: &str = r#"{"rows":[{"sign":"+","count":1,"shape":"(2,)","dtype":"torch.float32","bytes":8,"type":"<class 'torch.Tensor'>","names":["w"],"line":"+ | 1 * Size:(2,)"}],"total_bytes":8,"allocated_bytes":8,"tensors":1,"where":"a.py line 3: f","strategy":"gc.get_objects()","incomplete":null,"seconds":{"walk":0.5,"facts":0.25},"detail":true,"stamp":null}"#;

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
        let err = from_json::<Track>(&SAVED.replace(r#""bytes":8"#, r#""bytes":-5"#)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rows[0].bytes: invalid value: integer `-5`, expected u64"
        );
        let err =
            from_json::<Track>(&SAVED.replace(r#""where":"a.py line 3: f","#, "")).unwrap_err();
        assert_eq!(err.to_string(), "missing field `where`");
    }
}
