//! A test's memory (the pytest plugin's result): the limit failure, the result's text, and
//! the session's table of the highest peaks. Plain data in, text out.

pub mod text;

/// What was alive at the peak from one source location: its bytes and allocations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub location: String,
    pub bytes: i64,
    pub count: i64,
}

/// One device measured over one test's call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measurement {
    /// "cpu" or "cuda:N".
    pub device: String,
    /// The highest allocated bytes during the call minus those allocated when it began.
    pub peak_bytes: i64,
    /// The allocated bytes when the call began.
    pub start_bytes: i64,
    /// The marker's limit, if the test had one for this device.
    pub limit_bytes: Option<i64>,
    /// What the call allocated that was alive at its peak, by location, biggest first
    /// (only when a limit was set: the tracer runs only then).
    pub rows: Vec<Row>,
    /// Why the figures may be incomplete.
    pub notices: Vec<String>,
}

/// One line of the session table: a test's peak on one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peak {
    pub nodeid: String,
    pub peak_bytes: i64,
    pub limit_bytes: Option<i64>,
    pub outcome: String,
}
