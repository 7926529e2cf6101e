//! Results to JSON text and back, with the path of the field that does not fit.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A document that does not fit a result's shape: where, and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataError {
    /// The field's path (`functions[3].lines[2][0]`), empty for the document itself.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() || self.path == "." {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for DataError {}

/// The JSON text of `value` (compact: it is parsed again, not read).
pub fn to_json<T: Serialize>(value: &T) -> String {
    // Serialising plain structs (string keys, no NaN: see `finite`) cannot fail.
    serde_json::to_string(value).expect("a result serialises to JSON")
}

/// `T` from JSON text, or where and why it does not fit. serde_json bounds nesting at 128
/// levels and refuses numbers out of a field's range, so no document can overflow a stack
/// or wrap an integer.
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T, DataError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| DataError {
        path: e.path().to_string(),
        message: plain(e.inner()),
    })?;
    de.end().map_err(|e| DataError {
        path: String::new(),
        message: plain(&e),
    })?;
    Ok(value)
}

/// serde_json's message without its "at line 1 column 80" (the path says where).
fn plain(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) if e.line() > 0 => text[..at].to_string(),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn floats_come_back_as_they_were_written() {
        // One that serde_json's default parser read one ulp off; then a spread of others.
        let mut values = vec![0.490_833_903_997_554_4_f64, 0.1, 1.0 / 3.0, 1e-300, 6.02e23];
        let mut x = 0.123_456_789_f64;
        for _ in 0..10_000 {
            x = (x * 3.999_999).fract() + 1e-9;
            values.push(x);
            values.push(x * 1e12);
        }
        for v in values {
            let back: f64 = from_json(&to_json(&v)).unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v:?}");
        }
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Line(u32, String, Option<Vec<i64>>);

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Doc {
        name: String,
        lines: Vec<Line>,
    }

    #[test]
    fn a_result_round_trips_through_its_text() {
        let doc = Doc {
            name: "f".into(),
            lines: vec![
                Line(3, "x = 1".into(), Some(vec![-1, 2])),
                Line(4, "".into(), None),
            ],
        };
        let text = to_json(&doc);
        assert_eq!(
            text,
            r#"{"name":"f","lines":[[3,"x = 1",[-1,2]],[4,"",null]]}"#
        );
        assert_eq!(from_json::<Doc>(&text), Ok(doc));
    }

    #[test]
    fn a_misfit_names_its_field() {
        let err =
            from_json::<Doc>(r#"{"name":"f","lines":[[3,"a",null],["x","b",null]]}"#).unwrap_err();
        assert_eq!(err.path, "lines[1][0]");
        assert!(
            err.message
                .starts_with("invalid type: string \"x\", expected u32"),
            "{err}"
        );
        let err = from_json::<Doc>(r#"{"lines":[]}"#).unwrap_err();
        assert_eq!(err.to_string(), "missing field `name`");
    }

    #[test]
    fn deep_nesting_and_huge_numbers_are_errors_not_crashes() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(from_json::<serde_json::Value>(&deep)
            .unwrap_err()
            .message
            .contains("recursion limit"));
        let huge = format!(r#"{{"name":"f","lines":[[{},"a",null]]}}"#, "9".repeat(400));
        assert_eq!(from_json::<Doc>(&huge).unwrap_err().path, "lines[0][0]");
        assert!(from_json::<Doc>(r#"{"name":"f","lines":[]} x"#).is_err());
    }
}
