//! A test's memory (the pytest plugin's result): the limit failure, the result's text, and
//! the session's table of the highest peaks. Plain data in, text out.

pub mod text;

pub use super::result::{Measurement, Row};

/// One line of the session table: a test's peak on one device (the plugin's, not a saved
/// result's).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct Peak {
    pub nodeid: String,
    pub peak_bytes: i64,
    pub limit_bytes: Option<i64>,
    pub outcome: String,
}
