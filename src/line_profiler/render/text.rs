//! A line report as pytorch_memlab prints it: a `## qualname` block per function, a table
//! whose header is the dotted column names split over three rows (pandas' `to_string` of
//! a three-level column index: a label is left out where it repeats the one to its left),
//! then the values, the line number and the source line. Lines that never ran are blank.
//! A report that may be incomplete ends with its notices (nothing when there are none, so
//! the text is pytorch_memlab's).

use crate::line_profiler::result::LineProfile;
use crate::text::size::memlab_bytes;

/// Whether a column holds bytes (formatted as sizes) rather than counts.
pub fn is_byte_column(column: &str) -> bool {
    column.split('.').next().unwrap_or("").contains("byte")
}

/// Format one value of `column`.
pub fn format_value(column: &str, value: i64) -> String {
    if is_byte_column(column) {
        memlab_bytes(value as i128)
    } else {
        value.to_string()
    }
}

struct Column {
    header: [String; 3],
    cells: Vec<String>,
    left: bool,
}

pub fn render(report: &LineProfile) -> String {
    let mut out = tables(report);
    if !report.notices.is_empty() {
        out.push_str("\nNotes:\n");
        for notice in &report.notices {
            out.push_str("- ");
            out.push_str(notice);
            out.push('\n');
        }
    }
    out
}

fn tables(report: &LineProfile) -> String {
    if report.functions.is_empty() {
        return "No data collected\n".to_string();
    }
    let parts: Vec<[String; 3]> = report
        .columns
        .iter()
        .map(|c| {
            let mut split = c.splitn(3, '.').map(String::from);
            [(); 3].map(|_| split.next().unwrap_or_default())
        })
        .collect();
    let blocks: Vec<String> = report
        .functions
        .iter()
        .map(|block| {
            let mut columns: Vec<Column> = parts
                .iter()
                .enumerate()
                .map(|(k, header)| Column {
                    header: header.clone(),
                    cells: block
                        .lines
                        .iter()
                        .map(|entry| match entry.values() {
                            Some(values) => format_value(&report.columns[k], values[k]),
                            None => String::new(),
                        })
                        .collect(),
                    left: false,
                })
                .collect();
            columns.push(Column {
                header: ["line".into(), String::new(), String::new()],
                cells: block.lines.iter().map(|e| e.number().to_string()).collect(),
                left: false,
            });
            // pytorch_memlab pads code to the longest raw line (newline included) so that
            // pandas, which right-aligns, shows it left-aligned.
            let width = block.lines.iter().map(|e| e.1.chars().count()).max();
            let width = width.unwrap_or(0).max(4);
            columns.push(Column {
                header: ["code".into(), String::new(), String::new()],
                cells: block.lines.iter().map(|e| e.code().to_string()).collect(),
                left: true,
            });
            let code_width = width;
            format!("## {}\n\n{}\n", block.qualname, table(&columns, code_width))
        })
        .collect();
    blocks.join("\n\n")
}

fn table(columns: &[Column], code_width: usize) -> String {
    // Sparsify the header as pandas does: a label shows where its prefix changes.
    let shown: Vec<[String; 3]> = columns
        .iter()
        .enumerate()
        .map(|(i, column)| {
            [0, 1, 2].map(|level| {
                let repeats = i > 0
                    && (0..=level).all(|l| columns[i - 1].header[l] == column.header[l])
                    && !column.left
                    && !columns[i - 1].left;
                if repeats {
                    String::new()
                } else {
                    column.header[level].clone()
                }
            })
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .zip(&shown)
        .map(|(column, labels)| {
            if column.left {
                return code_width;
            }
            let cells = column.cells.iter().map(|c| c.chars().count());
            let labels = labels.iter().map(|l| l.chars().count());
            cells.chain(labels).max().unwrap_or(0)
        })
        .collect();
    let pad = |text: &str, width: usize, left: bool| {
        if left {
            format!("{text:<width$}")
        } else {
            format!("{text:>width$}")
        }
    };
    let mut rows: Vec<String> = Vec::new();
    for level in 0..3 {
        let cells: Vec<String> = columns
            .iter()
            .zip(&shown)
            .zip(&widths)
            .map(|((column, labels), &w)| pad(&labels[level], w, column.left))
            .collect();
        rows.push(cells.join(" "));
    }
    let n = columns.first().map_or(0, |c| c.cells.len());
    for r in 0..n {
        let cells: Vec<String> = columns
            .iter()
            .zip(&widths)
            .map(|(column, &w)| pad(&column.cells[r], w, column.left))
            .collect();
        rows.push(cells.join(" "));
    }
    rows.join("\n")
}
