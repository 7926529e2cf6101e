//! A line-profile diff as text: per column, how many lines grew and shrank (and where the
//! most), each function's highest line on either side (its peak, for a `*.peak` column),
//! then what grew and what shrank, largest first.

use super::merged::python_space;
use crate::line_profiler::diff::{ChangedLine, ColumnTotal, LineDiff, Place};
use crate::text::size::memlab_bytes;

pub fn render(diff: &LineDiff) -> String {
    let a = diff.names.first().map_or("A", String::as_str);
    let b = diff.names.get(1).map_or("B", String::as_str);
    let mut out = format!("# line profile diff: {a} -> {b}\n");
    for total in &diff.totals {
        let rows: Vec<&ChangedLine> = diff
            .rows
            .iter()
            .filter(|r| r.column == total.column)
            .collect();
        out.push_str(&format!("\n## {}\n", total_line(total)));
        let grew: Vec<&&ChangedLine> = rows.iter().filter(|r| r.change > 0).collect();
        let shrank: Vec<&&ChangedLine> = rows.iter().filter(|r| r.change < 0).collect();
        for (title, part) in [("grew", grew), ("shrank", shrank)] {
            if !part.is_empty() {
                out.push_str(&format!("{title}:\n"));
                for row in part {
                    out.push_str(&row_line(row));
                }
            }
        }
        if rows.is_empty() {
            out.push_str("no change\n");
        }
    }
    if diff.totals.is_empty() {
        out.push_str("\nnothing to compare\n");
    }
    out
}

/// `+3.00M`, `-1.00K`, `0.00B`.
fn signed(n: i128) -> String {
    let sign = if n > 0 { "+" } else { "" };
    format!("{sign}{}", memlab_bytes(n))
}

fn size(n: Option<i64>) -> String {
    n.map_or("-".to_string(), |n| memlab_bytes(n.into()))
}

/// ` (the most +3.00M at step:8)`: the line that changed most one way.
fn most(place: &Option<Place>) -> String {
    match place {
        None => String::new(),
        Some(p) => format!(
            " (the most {} at {}:{})",
            signed(p.change),
            p.function,
            p.line
        ),
    }
}

fn total_line(total: &ColumnTotal) -> String {
    let lines = if total.grew == 1 { "line" } else { "lines" };
    let mut said = format!(
        "{}: {} {lines} grew{}, {} shrank{}",
        total.column,
        total.grew,
        most(&total.largest_growth),
        total.shrank,
        most(&total.largest_shrink)
    );
    let what = if total.column.ends_with(".peak") {
        "peak of"
    } else {
        "highest line of"
    };
    for f in &total.functions {
        let change = if f.change != 0 {
            format!(" ({})", signed(f.change))
        } else {
            String::new()
        };
        said.push_str(&format!(
            "\n{what} {}: {} -> {}{change}",
            f.function,
            size(f.a),
            size(f.b)
        ));
    }
    said
}

fn row_line(row: &ChangedLine) -> String {
    let sizes = format!("{} -> {}", size(row.a), size(row.b));
    let hits = if row.hits_a != row.hits_b {
        format!(
            "  hits {} -> {}",
            row.hits_a.unwrap_or(0),
            row.hits_b.unwrap_or(0)
        )
    } else {
        String::new()
    };
    format!(
        "  {:>10}  {}:{}  {}  ({sizes}){hits}\n",
        signed(row.change),
        row.function,
        row.line,
        row.code.trim_matches(python_space)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::line_profiler::diff::FunctionHigh;

    #[test]
    fn heading_totals_and_rows() {
        let diff = LineDiff {
            kind: "line_profile".into(),
            names: vec!["a.json".into(), "b.json".into()],
            rows: vec![ChangedLine {
                function: "step".into(),
                line: 8,
                code: "    x = f()".into(),
                column: "active_bytes.all.peak".into(),
                a: Some(1 << 20),
                b: Some(4 << 20),
                change: 3 << 20,
                hits_a: Some(1),
                hits_b: Some(2),
            }],
            totals: vec![ColumnTotal {
                column: "active_bytes.all.peak".into(),
                grew: 1,
                shrank: 0,
                largest_growth: Some(Place {
                    function: "step".into(),
                    line: 8,
                    change: 3 << 20,
                }),
                largest_shrink: None,
                highest_a: 1 << 20,
                highest_b: 4 << 20,
                functions: vec![FunctionHigh {
                    function: "step".into(),
                    a: Some(1 << 20),
                    b: None,
                    change: -(1 << 20),
                }],
            }],
        };
        assert_eq!(
            render(&diff),
            "# line profile diff: a.json -> b.json\n\n\
             ## active_bytes.all.peak: 1 line grew (the most +3.00M at step:8), 0 shrank\n\
             peak of step: 1.00M -> - (-1.00M)\n\
             grew:\n\
             \x20     +3.00M  step:8  x = f()  (1.00M -> 4.00M)  hits 1 -> 2\n"
        );
    }
}
