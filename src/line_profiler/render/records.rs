//! A result as records: one row per source line, under named columns, in the order the
//! rows and columns are shown. Python reads them as dicts (`records()`, `to_dataframe()`);
//! the CSV is written from them (`csv`), so both say the same.

use serde::Serialize;

use crate::line_profiler::result::LineProfile;

/// One value of a record.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Cell {
    Int(i128),
    Float(f64),
    Text(String),
    /// No value (a line that never ran, a rank without the line).
    None,
}

impl From<Option<i64>> for Cell {
    fn from(value: Option<i64>) -> Self {
        value.map_or(Cell::None, |v| Cell::Int(v as i128))
    }
}

/// Records: the column names, and one row of cells per record.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Table {
    pub names: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

/// A line profile's records: function, line, hits, code (without its line ending) and
/// each column's value.
pub fn line_profile(profile: &LineProfile) -> Table {
    let mut names: Vec<String> = ["function", "line", "hits", "code"]
        .map(String::from)
        .to_vec();
    names.extend(profile.columns.iter().cloned());
    let mut rows = Vec::new();
    for function in &profile.functions {
        for line in &function.lines {
            let mut row = vec![
                Cell::Text(function.qualname.clone()),
                Cell::Int(line.number().into()),
                Cell::Int(line.hits().into()),
                Cell::Text(line.code().to_string()),
            ];
            match line.values() {
                Some(values) => row.extend(values.iter().map(|&v| Cell::Int(v.into()))),
                None => row.extend(profile.columns.iter().map(|_| Cell::None)),
            }
            rows.push(row);
        }
    }
    Table { names, rows }
}
