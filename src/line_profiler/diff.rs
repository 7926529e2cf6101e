//! Two line profiles compared line by line (per function, line number and source text):
//! the change of each column and of the hits, growth first, and per column what grew, what
//! shrank, and each function's highest line on either side.

use indexmap::IndexMap;
use serde::Serialize;

use super::result::LineProfile;
use super::view::View;

/// What changed from A to B (`ResultDiff`'s data: `kind`, `names`, `rows`, `totals`).
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct LineDiff {
    pub kind: String,
    /// The two results' names (file paths, or "A" and "B").
    pub names: Vec<String>,
    /// One row per line and column that changed: growth first, largest first; then the
    /// shrinking, largest first.
    pub rows: Vec<ChangedLine>,
    /// One per column compared.
    pub totals: Vec<ColumnTotal>,
}

/// One line whose value of one column changed.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ChangedLine {
    pub function: String,
    pub line: u32,
    pub code: String,
    pub column: String,
    /// The value in A and in B (None: that side has no value for the line).
    pub a: Option<i64>,
    pub b: Option<i64>,
    pub change: i128,
    pub hits_a: Option<u64>,
    pub hits_b: Option<u64>,
}

/// One column's summary.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ColumnTotal {
    pub column: String,
    pub grew: usize,
    pub shrank: usize,
    pub largest_growth: Option<Place>,
    pub largest_shrink: Option<Place>,
    /// The highest value of any line in A and in B (0 at least).
    pub highest_a: i64,
    pub highest_b: i64,
    /// Per function (in report order), its highest line in A and in B: for a `*.peak`
    /// column the function's peak, every moment of it being some line's.
    pub functions: Vec<FunctionHigh>,
}

/// Where a line changed most one way.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Place {
    pub function: String,
    pub line: u32,
    pub change: i128,
}

/// A function's highest line on each side.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct FunctionHigh {
    pub function: String,
    pub a: Option<i64>,
    pub b: Option<i64>,
    pub change: i128,
}

/// (function, line, code as written) -> (hits, values or None); a later duplicate replaces
/// an earlier one in its place.
type Lines<'a> = IndexMap<(&'a str, u32, &'a str), (u64, Option<&'a [i64]>)>;

fn lines(profile: &LineProfile) -> Lines<'_> {
    let mut found = Lines::new();
    for function in &profile.functions {
        for line in &function.lines {
            found.insert(
                (function.qualname.as_str(), line.0, line.1.as_str()),
                (line.2, line.values()),
            );
        }
    }
    found
}

fn value(line: Option<&(u64, Option<&[i64]>)>, index: usize) -> (Option<u64>, Option<i64>) {
    match line {
        None => (None, None),
        Some(&(hits, values)) => (Some(hits), values.map(|v| v[index])),
    }
}

/// Compare `a` and `b` (named `names`) in the columns `view` asks for of those both have:
/// every one for None, the defaults both have (else the first) for the defaults, and
/// otherwise those named, checked.
pub fn diff(
    a: &LineProfile,
    b: &LineProfile,
    names: Vec<String>,
    view: &View,
) -> Result<LineDiff, String> {
    let common: Vec<String> = a
        .columns
        .iter()
        .filter(|c| b.columns.contains(c))
        .cloned()
        .collect();
    let wanted = view.pick_columns(&common, true)?;
    let (lines_a, lines_b) = (lines(a), lines(b));
    let mut keys: Vec<&(&str, u32, &str)> = lines_a.keys().collect();
    keys.extend(lines_b.keys().filter(|k| !lines_a.contains_key(*k)));
    let mut rows = Vec::new();
    let mut totals = Vec::new();
    for column in wanted {
        let ia = a.columns.iter().position(|c| *c == column).unwrap_or(0);
        let ib = b.columns.iter().position(|c| *c == column).unwrap_or(0);
        let mut changed: Vec<ChangedLine> = Vec::new();
        let (mut highest_a, mut highest_b) = (0i64, 0i64);
        for key in &keys {
            let (hits_a, va) = value(lines_a.get(*key), ia);
            let (hits_b, vb) = value(lines_b.get(*key), ib);
            highest_a = highest_a.max(va.unwrap_or(0));
            highest_b = highest_b.max(vb.unwrap_or(0));
            let change = vb.unwrap_or(0) as i128 - va.unwrap_or(0) as i128;
            if change != 0 {
                let &(function, line, code) = *key;
                changed.push(ChangedLine {
                    function: function.to_string(),
                    line,
                    code: code.trim_end_matches('\n').to_string(),
                    column: column.clone(),
                    a: va,
                    b: vb,
                    change,
                    hits_a,
                    hits_b,
                });
            }
        }
        let grew: Vec<&ChangedLine> = changed.iter().filter(|r| r.change > 0).collect();
        let shrank: Vec<&ChangedLine> = changed.iter().filter(|r| r.change < 0).collect();
        // The first of the largest, in line order, as Python's max() and min() pick.
        let largest_growth = grew
            .iter()
            .fold(None::<&&ChangedLine>, |best, r| match best {
                Some(b) if b.change >= r.change => Some(b),
                _ => Some(r),
            })
            .map(|r| place(r));
        let largest_shrink = shrank
            .iter()
            .fold(None::<&&ChangedLine>, |best, r| match best {
                Some(b) if b.change <= r.change => Some(b),
                _ => Some(r),
            })
            .map(|r| place(r));
        totals.push(ColumnTotal {
            grew: grew.len(),
            shrank: shrank.len(),
            largest_growth,
            largest_shrink,
            highest_a,
            highest_b,
            functions: function_highs(&lines_a, &lines_b, ia, ib),
            column,
        });
        // Growth first, largest first; then the shrinking, largest first (stable).
        changed.sort_by_key(|r| (r.change < 0, -r.change.abs()));
        rows.extend(changed);
    }
    Ok(LineDiff {
        kind: "line_profile".into(),
        names,
        rows,
        totals,
    })
}

fn place(row: &ChangedLine) -> Place {
    Place {
        function: row.function.clone(),
        line: row.line,
        change: row.change,
    }
}

fn function_highs(a: &Lines<'_>, b: &Lines<'_>, ia: usize, ib: usize) -> Vec<FunctionHigh> {
    let mut highs: IndexMap<&str, [Option<i64>; 2]> = IndexMap::new();
    for (side, (found, index)) in [(a, ia), (b, ib)].into_iter().enumerate() {
        for (&(function, _, _), line) in found {
            let (_, value) = value(Some(line), index);
            let high = highs.entry(function).or_insert([None, None]);
            if let Some(value) = value {
                if high[side].is_none_or(|h| value > h) {
                    high[side] = Some(value);
                }
            }
        }
    }
    highs
        .into_iter()
        .map(|(function, [a, b])| FunctionHigh {
            function: function.to_string(),
            a,
            b,
            change: b.unwrap_or(0) as i128 - a.unwrap_or(0) as i128,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::from_json;

    fn profile(x: i64, y: i64) -> LineProfile {
        from_json(&format!(
            r#"{{"columns":["a.all.peak","b.all.allocated"],"functions":[{{"qualname":"f","filename":"","lines":[[1,"def f():\n",0,null],[2,"    x\n",1,[{x},{x}]],[3,"    y\n",2,[{y},0]]]}}],"notices":[]}}"#
        ))
        .unwrap()
    }

    #[test]
    fn growth_first_and_totals() {
        let view: View = from_json(r#"{"columns":null}"#).unwrap();
        let d = diff(
            &profile(10, 50),
            &profile(30, 20),
            vec!["A".into(), "B".into()],
            &view,
        )
        .unwrap();
        let shown: Vec<(u32, &str, i128)> = d
            .rows
            .iter()
            .map(|r| (r.line, r.column.as_str(), r.change))
            .collect();
        assert_eq!(
            shown,
            vec![
                (2, "a.all.peak", 20),
                (3, "a.all.peak", -30),
                (2, "b.all.allocated", 20)
            ]
        );
        assert_eq!(d.rows[0].code, "    x");
        let total = &d.totals[0];
        assert_eq!(
            (total.grew, total.shrank, total.highest_a, total.highest_b),
            (1, 1, 50, 30)
        );
        assert_eq!(total.largest_shrink.as_ref().unwrap().line, 3);
        assert_eq!(
            total.functions[0],
            FunctionHigh {
                function: "f".into(),
                a: Some(50),
                b: Some(30),
                change: -20
            }
        );
    }

    #[test]
    fn the_defaults_narrow_to_what_both_have() {
        let view: View =
            from_json(r#"{"columns":["active_bytes.all.peak","reserved_bytes.all.peak"]}"#)
                .unwrap();
        let d = diff(
            &profile(1, 1),
            &profile(1, 1),
            vec!["A".into(), "B".into()],
            &view,
        )
        .unwrap();
        assert_eq!(d.totals[0].column, "a.all.peak");
        let view: View = from_json(r#"{"columns":["nope"],"device":"cpu"}"#).unwrap();
        assert!(diff(&profile(1, 1), &profile(1, 1), vec![], &view)
            .unwrap_err()
            .starts_with("unknown column 'nope' for the CPU source"));
    }
}
