//! Analysis: a collector's rows turned into a line report, one block per function with
//! its source, for the columns the user asked for, and the notices that say where the
//! report may be incomplete.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::engine::Collector;

/// One source line of a profiled function and, if it ran, its values.
#[derive(Clone, Debug)]
pub struct LineEntry {
    pub line: u32,
    pub code: String,
    /// None for a line that never ran; otherwise one value per report column.
    pub values: Option<Vec<i64>>,
    pub hits: u64,
}

/// One profiled function's lines.
#[derive(Clone, Debug)]
pub struct FunctionBlock {
    pub qualname: String,
    pub lines: Vec<LineEntry>,
}

/// The source text of a function: its first line number and its lines (with newlines, as
/// `inspect.getsourcelines` gives them). None when the source is not available.
pub type Source = Option<(u32, Vec<String>)>;

/// Columns whose values come from outside the collector: name -> one {line: value} map per
/// selected function (a line that ran and is not in its map shows 0).
pub type ExtraColumns = HashMap<String, Vec<HashMap<u32, i64>>>;

/// The selected columns of the selected functions that ran.
#[derive(Clone, Debug)]
pub struct LineReport {
    pub columns: Vec<String>,
    pub blocks: Vec<FunctionBlock>,
    /// Why the numbers may be incomplete, one line each (empty: nothing to say). Renderers
    /// print them under the tables.
    pub notices: Vec<String>,
}

/// What a collector's report must say about itself: events it lost, errors met while
/// handling them, and the notices collected while it ran (threads whose tracer was
/// replaced, a source's fallback, ...).
pub fn notices(collector: &Collector) -> Vec<String> {
    let mut out = Vec::new();
    if collector.dropped > 0 {
        out.push(format!(
            "{} interpreter events were dropped because the profiler was busy (called from \
             code it runs itself, or held by another thread): the lines they belong to may \
             miss hits or memory",
            collector.dropped
        ));
    }
    if collector.errors > 0 {
        out.push(format!(
            "{} error(s) while handling interpreter events; the lines they belong to may be \
             incomplete. The first: {}",
            collector.errors,
            collector.first_error.as_deref().unwrap_or("(unknown)")
        ));
    }
    out.extend(collector.notices.iter().cloned());
    out
}

/// Check `columns` against the statistics the collector's source has.
pub fn column_indexes(names: &[String], columns: &[String], device: &str) -> PyResult<Vec<usize>> {
    columns
        .iter()
        .map(|column| {
            names.iter().position(|name| name == column).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "unknown column {column:?}: the columns are the keys of \
                     torch.cuda.memory_stats() that the {device} source has: {}",
                    names.join(", ")
                ))
            })
        })
        .collect()
}

/// Build the report for the functions at `selected` (code indexes, in registration order).
pub fn build(
    collector: &Collector,
    columns: &[String],
    selected: &[u32],
    sources: &[Source],
    extra: &ExtraColumns,
) -> PyResult<LineReport> {
    let ran: Vec<u32> = selected
        .iter()
        .copied()
        .filter(|&i| !collector.codes[i as usize].rows.is_empty())
        .collect();
    if ran.is_empty() {
        return Ok(LineReport {
            columns: columns.to_vec(),
            blocks: Vec::new(),
            notices: notices(collector),
        });
    }
    let device = collector.device.name();
    // No names yet: the CUDA source never saw CUDA initialised, so every value read zero.
    let own: Vec<String> = columns
        .iter()
        .filter(|c| !extra.contains_key(*c))
        .cloned()
        .collect();
    let own_indexes = if collector.names.is_empty() {
        vec![usize::MAX; own.len()]
    } else {
        column_indexes(&collector.names, &own, &device)?
    };
    // Per report column: Ok(index into the collector's values) or Err(its extra maps).
    let mut own_iter = own_indexes.into_iter();
    let indexes: Vec<Result<usize, &Vec<HashMap<u32, i64>>>> = columns
        .iter()
        .map(|c| match extra.get(c) {
            Some(maps) => Err(maps),
            None => Ok(own_iter.next().unwrap_or(usize::MAX)),
        })
        .collect();
    let mut blocks = Vec::new();
    for (position, (i, source)) in selected.iter().zip(sources).enumerate() {
        let code = &collector.codes[*i as usize];
        if code.rows.is_empty() {
            continue;
        }
        let pick = |line: u32| {
            code.rows.get(&line).map(|row| {
                let values = indexes
                    .iter()
                    .map(|k| match k {
                        Ok(k) => row.values.get(*k).copied().unwrap_or(0),
                        Err(maps) => maps
                            .get(position)
                            .and_then(|m| m.get(&line))
                            .copied()
                            .unwrap_or(0),
                    })
                    .collect();
                (values, row.hits)
            })
        };
        let mut lines: Vec<LineEntry> = Vec::new();
        if let Some((start, text)) = source {
            for (offset, code_line) in text.iter().enumerate() {
                let line = start + offset as u32;
                let found = pick(line);
                lines.push(LineEntry {
                    line,
                    code: code_line.clone(),
                    hits: found.as_ref().map_or(0, |f| f.1),
                    values: found.map(|f| f.0),
                });
            }
        }
        // Lines the source does not cover (no source, or it changed on disk).
        for &line in code.rows.keys() {
            if !lines.iter().any(|entry| entry.line == line) {
                let (values, hits) = pick(line).unwrap_or_default();
                lines.push(LineEntry {
                    line,
                    code: String::new(),
                    values: Some(values),
                    hits,
                });
            }
        }
        lines.sort_by_key(|entry| entry.line);
        blocks.push(FunctionBlock {
            qualname: code.qualname.clone(),
            lines,
        });
    }
    Ok(LineReport {
        columns: columns.to_vec(),
        blocks,
        notices: notices(collector),
    })
}
