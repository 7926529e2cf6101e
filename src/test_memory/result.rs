//! A test's memory, the pytest plugin's result (kind `test_memory`): the test's node id, its
//! outcome, and one measurement per device watched. The serde derive is the saved file's
//! `data` and the schema a loaded file is checked against.

use serde::{Deserialize, Serialize};

/// One test's memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestMemory {
    pub nodeid: String,
    /// `passed`, `failed` or `skipped`.
    pub outcome: String,
    pub measurements: Vec<Measurement>,
}

/// What was alive at the peak from one source location: its bytes and allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    pub location: String,
    pub bytes: i64,
    pub count: i64,
}

/// One device measured over one test's call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measurement {
    /// "cpu" or "cuda:N".
    pub device: String,
    /// The highest allocated bytes during the call minus those allocated when it began.
    pub peak_bytes: i64,
    /// The allocated bytes when the call began.
    pub start_bytes: i64,
    /// The marker's limit, if the test had one for this device.
    #[serde(default)]
    pub limit_bytes: Option<i64>,
    /// What the call allocated that was alive at its peak, by location, biggest first
    /// (only when a limit was set: the tracer runs only then).
    #[serde(default)]
    pub rows: Vec<Row>,
    /// Why the figures may be incomplete.
    #[serde(default)]
    pub notices: Vec<String>,
}
