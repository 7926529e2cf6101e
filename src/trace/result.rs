//! What crosses between the trace room and Python, as serde data: the fields of a saved trace
//! (kind `trace`) beside its snapshot, the options an analysis is asked with, and what the
//! analysis answers (its devices, each device's figures, keyword groups, bytes per line, the
//! timeline). Each crosses once, as the JSON text its derive writes or reads
//! (`crate::results::{to_json, from_json}`); a document that does not fit is a `DataError`
//! naming the field. The rows (`group::Row`) and the report as JSON (`render::data`) derive
//! theirs where they are made.
//!
//! A trace's data is its snapshot, often hundreds of MB in torch's own schema: it never
//! crosses as one document. The analysis reads it once (`py::load`, `pickle_stream`) and keeps
//! the analysed report on the Rust side; only answers cross.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::model::Source;
use crate::results::DataError;

/// How files are shown in rows and stacks: `"short"` (the peak tracer's way) or `"full"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shown {
    #[default]
    Short,
    Full,
}

/// The fields of a saved trace's `data` beside its `snapshot` (schema 1). The snapshot is
/// torch's `_snapshot()` dict with each `"frames"` list replaced by the index of its stack
/// here, so that a frame shared by a million entries is written once; its schema is torch's,
/// checked by the trace reader that analyses it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    pub source: Source,
    /// The path parts whose frames are not a location.
    pub exclude: Vec<String>,
    /// Files saved before `paths=` existed read as short.
    #[serde(default)]
    pub paths: Shown,
    /// Every distinct frame once (torch's frame objects: `filename`, `line`, `name`, ...).
    pub frames: Vec<Map<String, Value>>,
    /// Every distinct stack once, as indices into `frames`, innermost first.
    pub stacks: Vec<Vec<u32>>,
}

impl Saved {
    /// What the derive cannot say: every stack lists frames that exist.
    pub fn check(&self) -> Result<(), DataError> {
        let frames = self.frames.len();
        for (s, stack) in self.stacks.iter().enumerate() {
            if let Some((i, index)) = stack
                .iter()
                .enumerate()
                .find(|(_, &f)| f as usize >= frames)
            {
                return Err(DataError {
                    path: format!("stacks[{s}][{i}]"),
                    message: format!(
                        "frame {index}, but the trace lists {frames} frames: a stack lists \
                         frame indices (0 to {})",
                        frames as i64 - 1
                    ),
                });
            }
        }
        Ok(())
    }
}

/// How an analysis locates and shows allocations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// Path parts whose frames are not a location (`group::STDLIB` for any standard library).
    pub exclude: Vec<String>,
    #[serde(default)]
    pub paths: Shown,
    /// The reader's working directory, which short paths are relative to unless the
    /// recording saved its own.
    #[serde(default)]
    pub cwd: Option<String>,
}

/// One device with recorded allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// The device index in the snapshot (0 for the CPU).
    pub index: i32,
    /// `"cpu"` or `"cuda:N"`.
    pub name: String,
}

/// What was recorded: where, and on which devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct About {
    pub source: Source,
    pub devices: Vec<Device>,
}

/// The peak figures of one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The highest allocated bytes (what `max_memory_allocated` reports over the region).
    pub max_mem: u64,
    pub total_allocated: u64,
    pub start_allocated: u64,
    pub end_allocated: u64,
    pub peak_time_us: i64,
    /// The history entry after which the peak was reached (None: at the start).
    pub peak_event: Option<usize>,
    pub live_at_peak: usize,
    pub events: usize,
}

/// Which grouping of the live set at the peak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    #[default]
    Location,
    Module,
}

/// A rendering's view options: which grouping the text shows (`by`), which device the CSV
/// and the untagged log are of (`device`, by index; the first recorded when left out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct View {
    #[serde(default)]
    pub by: Option<By>,
    #[serde(default)]
    pub device: Option<i32>,
}

/// The tagging profiler's keyword groups: each row goes to the first group with a keyword in
/// its name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeywordQuery {
    /// (group name, its keywords), in order.
    pub groups: Vec<(String, Vec<String>)>,
    #[serde(default = "module")]
    pub by: By,
}

fn module() -> By {
    By::Module
}

/// A group and its bytes alive at the peak.
pub type Group = (String, u64);

/// The bytes alive at the peak that one line allocated (callees included).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineBytes {
    pub filename: String,
    pub line: u32,
    pub bytes: u64,
}

/// What the timeline renderers draw: made by the analysis (`TraceAnalysis.timeline`), or by
/// hand (any JSON object with these keys; unknown keys are left alone).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineView {
    /// e.g. "cuda:0".
    #[serde(default)]
    pub title: String,
    /// Sample times, microseconds (already downsampled, <= ~2000 points).
    pub time_us: Vec<i64>,
    /// Allocated bytes at each sample (the max within its bucket).
    pub total: Vec<u64>,
    /// Top locations' live bytes at each sample, biggest first; the last layer is "other"
    /// (total minus the named layers).
    pub layers: Vec<(String, Vec<u64>)>,
    /// Index into the samples of the peak.
    pub peak_index: usize,
    /// The exact Max mem.
    pub peak_bytes: u64,
    /// Shown above the plot (e.g. "trace truncated").
    #[serde(default)]
    pub notices: Vec<String>,
}

/// A snapshot pickle that passed the guard (`pickle_guard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckedPickle {
    /// Its pickle protocol (0 for a file without a PROTO opcode).
    pub protocol: u8,
    /// The values a full walk visits, every table bounded by the file's size.
    pub values: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{from_json, to_json};

    #[test]
    fn a_saved_trace_reads_older_files_and_names_a_bad_stack() {
        let text = r#"{"source":"cpu","exclude":["torch/"],"frames":[{"filename":"a.py",
            "line":3,"name":"f"}],"stacks":[[0],[]],"snapshot":{"segments":[]}}"#;
        let saved: Saved = from_json(text).unwrap();
        assert_eq!(saved.paths, Shown::Short);
        assert_eq!(saved.check(), Ok(()));
        let round = to_json(&saved);
        assert!(round.starts_with(r#"{"source":"cpu","exclude":["torch/"],"paths":"short""#));
        let bad = Saved {
            stacks: vec![vec![0], vec![0, 1]],
            ..saved
        };
        let err = bad.check().unwrap_err();
        assert_eq!(err.path, "stacks[1][1]");
        assert!(err.message.contains("(0 to 0)"), "{err}");
        let err = from_json::<Saved>(r#"{"source":"gpu","exclude":[],"frames":[],"stacks":[]}"#)
            .unwrap_err();
        assert_eq!(err.path, "source");
    }

    #[test]
    fn a_hand_made_timeline_view_needs_the_samples_only() {
        let view: TimelineView = from_json(
            r#"{"time_us":[0],"total":[5],"layers":[["a",[5]]],"peak_index":0,
               "peak_bytes":5,"extra":1}"#,
        )
        .unwrap();
        assert_eq!(view.title, "");
        assert_eq!(view.layers, vec![("a".to_owned(), vec![5])]);
        let err = from_json::<TimelineView>(r#"{"time_us":[0],"total":[-1]}"#).unwrap_err();
        assert_eq!(err.path, "total[0]");
    }
}
