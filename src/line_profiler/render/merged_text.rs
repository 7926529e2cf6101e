//! A merged line profile as text: a heading naming the ranks, then per function a table
//! whose columns are grouped under each statistic (min, median, max, max rank), then the
//! line, the hits and the code; the notices last.

use super::merged::{heading, hits_cell, python_rstrip, value_cells, Shown};

pub fn render(shown: &Shown<'_>) -> String {
    let profile = shown.profile;
    let mut out = format!("# {}\n", heading(profile));
    let mut head: Vec<String> = Vec::new();
    for _ in &shown.columns {
        head.extend(["min", "median", "max", "max rank"].map(String::from));
    }
    head.extend(["line", "hits", "code"].map(String::from));
    let groups: Vec<(&str, usize)> = shown.columns.iter().map(|(c, _)| (c.as_str(), 4)).collect();
    for &f in &shown.functions {
        let function = &profile.functions[f];
        let rows: Vec<Vec<String>> = function
            .lines
            .iter()
            .map(|line| {
                let mut cells = value_cells(shown, line);
                cells.push(line.0.to_string());
                cells.push(hits_cell(&line.2));
                cells.push(line.1.trim_end_matches('\n').to_string());
                cells
            })
            .collect();
        out.push_str(&format!("\n## {}\n\n", function.qualname));
        out.push_str(&table(&[head.clone()], &rows, &groups));
    }
    for notice in &profile.notices {
        out.push_str(notice);
        out.push('\n');
    }
    out
}

fn width(text: &str) -> usize {
    text.chars().count()
}

/// Aligned columns, right-aligned but the last, which is not padded; `groups` label runs
/// of columns from the first on a line above the heads, each (label, number of columns),
/// the last column of a run widened to fit its label.
fn table(heads: &[Vec<String>], rows: &[Vec<String>], groups: &[(&str, usize)]) -> String {
    let every: Vec<&Vec<String>> = heads.iter().chain(rows).collect();
    let mut widths: Vec<usize> = (0..every[0].len())
        .map(|i| every.iter().map(|r| width(&r[i])).max().unwrap_or(0))
        .collect();
    let span = |widths: &[usize], start: usize, count: usize| {
        widths[start..start + count].iter().sum::<usize>() + 2 * (count - 1)
    };
    let mut start = 0;
    for &(label, count) in groups {
        let room = span(&widths, start, count);
        widths[start + count - 1] += width(label).saturating_sub(room);
        start += count;
    }
    let mut out = String::new();
    if !groups.is_empty() {
        let mut labels = Vec::new();
        let mut start = 0;
        for &(label, count) in groups {
            let room = span(&widths, start, count);
            labels.push(format!("{label:<room$}"));
            start += count;
        }
        out.push_str(python_rstrip(&labels.join("  ")));
        out.push('\n');
    }
    for row in every {
        let last = row.len() - 1;
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i == last {
                    cell.clone()
                } else {
                    format!("{cell:>w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(python_rstrip(&cells.join("  ")));
        out.push('\n');
    }
    out
}
