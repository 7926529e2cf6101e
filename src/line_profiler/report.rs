//! Analysis: a collector's rows turned into a line profile (the result), one function per
//! profiled code object that ran, with its source, for every column the source has, and
//! the notices that say where the profile may be incomplete.

use std::collections::{BTreeMap, HashMap};

use super::frames::Row;
use super::result::{Function, Line, LineProfile};

/// The source text of a function: its first line number and its lines (with newlines, as
/// `inspect.getsourcelines` gives them). None when the source is not available.
pub type SourceLines = Option<(u32, Vec<String>)>;

/// Columns whose values come from outside the collector: name -> one {line: value} map per
/// selected function (a line that ran and is not in its map shows 0).
pub type ExtraColumns = BTreeMap<String, PerFunction>;

/// One extra column's values: a {line: value} map per selected function.
pub type PerFunction = Vec<HashMap<u32, i64>>;

/// One profiled code object's rows, as the collector recorded them.
pub struct Recorded<'a> {
    pub qualname: &'a str,
    pub filename: &'a str,
    pub rows: &'a BTreeMap<u32, Row>,
}

/// What a collector has to say about itself, besides its rows.
#[derive(Default)]
pub struct Incidents<'a> {
    /// Events of its code objects dropped because the engine was busy.
    pub dropped: u64,
    /// Errors met while handling its events, and the first of them.
    pub errors: u64,
    pub first_error: Option<&'a str>,
    /// The notices collected while it ran (threads whose tracer was replaced, a source's
    /// fallback, ...).
    pub notices: &'a [String],
}

/// The lines a report prints under its tables: events lost, errors met, then the notices.
pub fn notices(incidents: &Incidents<'_>) -> Vec<String> {
    let mut out = Vec::new();
    if incidents.dropped > 0 {
        out.push(format!(
            "{} interpreter events were dropped because the profiler was busy (called from \
             code it runs itself, or held by another thread): the lines they belong to may \
             miss hits or memory",
            incidents.dropped
        ));
    }
    if incidents.errors > 0 {
        out.push(format!(
            "{} error(s) while handling interpreter events; the lines they belong to may be \
             incomplete. The first: {}",
            incidents.errors,
            incidents.first_error.unwrap_or("(unknown)")
        ));
    }
    out.extend(incidents.notices.iter().cloned());
    out
}

/// The report's columns: every statistic the source has (`names`, or `catalogue` when it
/// has reported none yet), then those asked for that it does not list (a private pool's,
/// which no catalogue names), then the extra columns.
pub fn columns(
    names: &[String],
    catalogue: Vec<String>,
    asked: &[String],
    extra: &ExtraColumns,
) -> Vec<String> {
    let mut out = if names.is_empty() {
        catalogue
    } else {
        names.to_vec()
    };
    for column in asked {
        if !out.contains(column) && !extra.contains_key(column) {
            out.push(column.clone());
        }
    }
    out.extend(extra.keys().cloned());
    out
}

/// Build the line profile of `functions` (each with its source) for `columns`, whose values
/// come from the rows (`names`: the statistics a row's values are) or from `extra`. A
/// column neither has reads 0: the source never saw it (CUDA never initialised).
pub fn build(
    names: &[String],
    columns: Vec<String>,
    functions: &[(Recorded<'_>, &SourceLines)],
    extra: &ExtraColumns,
    notices: Vec<String>,
) -> LineProfile {
    // Per report column: Ok(index into the rows' values, if they have it) or Err(its maps).
    let indexes: Vec<Result<Option<usize>, &PerFunction>> = columns
        .iter()
        .map(|c| match extra.get(c) {
            Some(maps) => Err(maps),
            None => Ok(names.iter().position(|name| name == c)),
        })
        .collect();
    let mut out = Vec::new();
    for (position, (code, source)) in functions.iter().enumerate() {
        if code.rows.is_empty() {
            continue;
        }
        let pick = |line: u32| {
            code.rows.get(&line).map(|row| {
                let values = indexes
                    .iter()
                    .map(|k| match k {
                        Ok(k) => k.and_then(|k| row.values.get(k).copied()).unwrap_or(0),
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
        let mut lines: Vec<Line> = Vec::new();
        if let Some((start, text)) = source {
            for (offset, code_line) in text.iter().enumerate() {
                let line = start + offset as u32;
                let found = pick(line);
                let hits = found.as_ref().map_or(0, |f| f.1);
                lines.push(Line(line, code_line.clone(), hits, found.map(|f| f.0)));
            }
        }
        // Lines the source does not cover (no source, or it changed on disk).
        for &line in code.rows.keys() {
            if !lines.iter().any(|entry| entry.0 == line) {
                let (values, hits) = pick(line).unwrap_or_default();
                lines.push(Line(line, String::new(), hits, Some(values)));
            }
        }
        lines.sort_by_key(|entry| entry.0);
        out.push(Function {
            qualname: code.qualname.to_string(),
            filename: code.filename.to_string(),
            lines,
        });
    }
    LineProfile {
        columns,
        functions: out,
        notices,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rows_become_lines_with_their_source() {
        let mut rows = BTreeMap::new();
        rows.insert(
            11,
            Row {
                hits: 2,
                values: vec![5, 7],
            },
        );
        rows.insert(
            20,
            Row {
                hits: 1,
                values: vec![1, 1],
            },
        );
        let source: SourceLines = Some((10, names(&["def f():\n", "    x = 1\n"])));
        let code = Recorded {
            qualname: "f",
            filename: "m.py",
            rows: &rows,
        };
        let mut extra = ExtraColumns::new();
        extra.insert("peak_live".into(), vec![HashMap::from([(11, 64)])]);
        let columns = columns(&names(&["a", "b"]), vec![], &names(&["b", "p.x"]), &extra);
        assert_eq!(columns, names(&["a", "b", "p.x", "peak_live"]));
        let profile = build(
            &names(&["a", "b"]),
            columns,
            &[(code, &source)],
            &extra,
            vec![],
        );
        let lines = &profile.functions[0].lines;
        assert_eq!(lines[0], Line(10, "def f():\n".into(), 0, None));
        assert_eq!(
            lines[1],
            Line(11, "    x = 1\n".into(), 2, Some(vec![5, 7, 0, 64]))
        );
        // A line the source does not cover still shows.
        assert_eq!(lines[2], Line(20, String::new(), 1, Some(vec![1, 1, 0, 0])));
        assert_eq!(profile.functions[0].filename, "m.py");
    }

    #[test]
    fn incidents_come_first() {
        let said = names(&["thread 2 stopped"]);
        let notices = notices(&Incidents {
            dropped: 3,
            errors: 1,
            first_error: Some("boom"),
            notices: &said,
        });
        assert!(notices[0].starts_with("3 interpreter events were dropped"));
        assert!(notices[1].ends_with("The first: boom"));
        assert_eq!(notices[2], "thread 2 stopped");
    }
}
