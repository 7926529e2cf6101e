//! Courtesy's reports as text (what `str(report)` and the log say). A report in, a string
//! out.

pub mod text;
