//! A line profile (kind `line_profile`): every column the profiler's source had, every
//! profiled function that ran with its source lines (read when the result was made, so a
//! saved file renders without the code), and the notices. The serde derive is the saved
//! file's `data` and the schema a loaded file is checked against (`check` adds the one rule
//! between fields: one value per column).

use serde::{Deserialize, Serialize};

use crate::results::DataError;

/// One line profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineProfile {
    /// The statistics each line's values are, in order (keys of torch.cuda.memory_stats()).
    pub columns: Vec<String>,
    /// Each profiled function that ran, in registration order.
    pub functions: Vec<Function>,
    /// Why the numbers may be incomplete, one line each (empty: nothing to say).
    pub notices: Vec<String>,
}

/// One profiled function and its lines.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Function {
    pub qualname: String,
    /// The file its code came from ("" in files saved before it was recorded).
    #[serde(default)]
    pub filename: String,
    pub lines: Vec<Line>,
}

/// One source line, saved as `[line, code, hits, values or null]`: its number, its text as
/// written (newline included), how often it ran, and one value per column (None for a line
/// that never ran).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line(pub u32, pub String, pub u64, pub Option<Vec<i64>>);

impl Line {
    pub fn number(&self) -> u32 {
        self.0
    }

    /// The source text without its line ending.
    pub fn code(&self) -> &str {
        self.1.trim_end_matches(['\n', '\r'])
    }

    pub fn hits(&self) -> u64 {
        self.2
    }

    pub fn values(&self) -> Option<&[i64]> {
        self.3.as_deref()
    }
}

impl LineProfile {
    /// The rule the derive cannot state: a line that ran has one value per column.
    pub fn check(&self) -> Result<(), DataError> {
        let width = self.columns.len();
        for (f, function) in self.functions.iter().enumerate() {
            for (l, line) in function.lines.iter().enumerate() {
                if let Some(values) = line.values().filter(|v| v.len() != width) {
                    return Err(DataError {
                        path: format!("functions[{f}].lines[{l}][3]"),
                        message: format!(
                            "line {} of {}: {} values for {width} columns",
                            line.number(),
                            function.qualname,
                            values.len()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The qualified names of the functions, in report order.
    pub fn names(&self) -> Vec<&str> {
        self.functions.iter().map(|f| f.qualname.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{from_json, to_json};

    #[test]
    fn saved_data_keeps_its_layout() {
        let text = r#"{"columns":["a.all.peak"],"functions":[{"qualname":"f","filename":"m.py","lines":[[3,"def f():\n",0,null],[4,"    x = 1\n",2,[512]]]}],"notices":[]}"#;
        let profile: LineProfile = from_json(text).unwrap();
        assert_eq!(profile.functions[0].lines[1].code(), "    x = 1");
        assert_eq!(to_json(&profile), text);
        profile.check().unwrap();
    }

    #[test]
    fn a_file_without_filenames_reads_and_a_wrong_width_is_named() {
        let text = r#"{"columns":["a","b"],"functions":[{"qualname":"f","lines":[[3,"x",1,[1]]]}],"notices":[]}"#;
        let profile: LineProfile = from_json(text).unwrap();
        assert_eq!(profile.functions[0].filename, "");
        let error = profile.check().unwrap_err();
        assert_eq!(
            error.to_string(),
            "functions[0].lines[0][3]: line 3 of f: 1 values for 2 columns"
        );
        let error = from_json::<LineProfile>(
            r#"{"columns":[],"functions":[{"qualname":"f","lines":[[-1,"x",1,null]]}],"notices":[]}"#,
        )
        .unwrap_err();
        assert_eq!(error.path, "functions[0].lines[0][0]");
    }
}
