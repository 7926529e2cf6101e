//! The merged tensor report (several ranks, tensor by tensor) as text and as HTML: per
//! tensor the min, median and max bytes across ranks and the rank holding the max where the
//! ranks differ; then per device type the totals.

use crate::tensor_report::merge::{records, spread, Median, Spread};
use crate::tensor_report::result::MergedTensorReport;
use crate::text::size::{memlab_bytes, memlab_size};

const HEAD: [&str; 8] = [
    "name", "device", "shape", "dtype", "min", "median", "max", "max rank",
];

/// `merged tensor report: ranks 0, 1 of 2`.
fn heading(merged: &MergedTensorReport) -> String {
    let ranks: Vec<String> = merged.ranks.iter().map(|r| r.to_string()).collect();
    format!(
        "merged tensor report: ranks {} of {}",
        ranks.join(", "),
        merged.world_size
    )
}

/// min, median, max as sizes, and the rank of the max only where the ranks differ.
fn spread_cells(found: Option<Spread>) -> [String; 4] {
    match found {
        None => Default::default(),
        Some(s) => [
            memlab_bytes(s.min as i128),
            memlab_size(s.median.as_f64()),
            memlab_bytes(s.max as i128),
            if s.min == s.max {
                "-".to_owned()
            } else {
                s.max_rank.to_string()
            },
        ],
    }
}

/// The table's rows: one per tensor, then one per device type's totals.
fn table_rows(merged: &MergedTensorReport) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for r in &merged.rows {
        let mut cells = vec![
            r.name.clone(),
            r.device.clone(),
            r.shape.text(),
            r.dtype.clone(),
        ];
        cells.extend(spread_cells(spread(&r.bytes, &merged.ranks)));
        rows.push(cells);
    }
    for (kind, per_rank) in &merged.totals {
        let mut cells = vec![
            format!("total on {kind}"),
            String::new(),
            String::new(),
            String::new(),
        ];
        cells.extend(spread_cells(spread(per_rank, &merged.ranks)));
        rows.push(cells);
    }
    rows
}

/// Python's `str.isspace`: what `rstrip()` removes (the ASCII separators 0x1C-0x1F too).
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn pad(cell: &str, width: usize, left: bool) -> String {
    let fill = " ".repeat(width.saturating_sub(cell.chars().count()));
    if left {
        format!("{cell}{fill}")
    } else {
        format!("{fill}{cell}")
    }
}

/// Aligned columns: the first `left` columns and the last one left-aligned, the others
/// right-aligned; the last column is not padded, each line's end is trimmed.
fn text_table(rows: &[Vec<String>], left: usize) -> String {
    let width = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..width)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i == row.len() - 1 {
                    cell.clone()
                } else {
                    pad(cell, widths[i], i < left)
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end_matches(python_space));
        out.push('\n');
    }
    out
}

/// The merged report as text: the heading, the table, and each device type's totals per
/// rank.
pub fn text(merged: &MergedTensorReport) -> String {
    let mut rows = vec![HEAD.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    rows.extend(table_rows(merged));
    let per: Vec<String> = merged
        .totals
        .iter()
        .map(|(kind, sizes)| {
            let ranks: Vec<String> = merged
                .ranks
                .iter()
                .zip(sizes)
                .map(|(r, b)| format!("rank {r} {}", memlab_bytes(*b as i128)))
                .collect();
            format!("{kind}: {}", ranks.join(", "))
        })
        .collect();
    format!(
        "# {}\n\n{}\nper rank: {}\n",
        heading(merged),
        text_table(&rows, 4),
        per.join("; ")
    )
}

/// Python's `html.escape`: `&`, `<`, `>`, `"` and `'` (as `&#x27;`).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            c => out.push(c),
        }
    }
    out
}

/// The merged report as a self-contained HTML fragment.
pub fn html(merged: &MergedTensorReport) -> String {
    let mut out = format!(
        "<div class=\"memlab-rs-merged\"><p><b>{}</b></p><table><tr>",
        escape(&heading(merged))
    );
    for h in HEAD {
        out.push_str(&format!("<th>{h}</th>"));
    }
    out.push_str("</tr>");
    let right = |cells: [String; 4]| -> String {
        cells
            .iter()
            .map(|c| format!("<td align=\"right\">{c}</td>"))
            .collect()
    };
    for r in &merged.rows {
        out.push_str("<tr>");
        for cell in [&r.name, &r.device, &r.shape.text(), &r.dtype] {
            out.push_str(&format!("<td>{}</td>", escape(cell)));
        }
        out.push_str(&right(spread_cells(spread(&r.bytes, &merged.ranks))));
        out.push_str("</tr>");
    }
    for (kind, per_rank) in &merged.totals {
        out.push_str(&format!(
            "<tr><td colspan=\"4\"><b>total on {}</b></td>",
            escape(kind)
        ));
        out.push_str(&right(spread_cells(spread(per_rank, &merged.ranks))));
        out.push_str("</tr>");
    }
    out.push_str("</table></div>");
    out
}

/// A CSV field as Python's `csv` module writes it (QUOTE_MINIMAL): quoted, its quotes
/// doubled, when it holds the delimiter, a quote or a line break.
fn csv_field(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}

fn or_empty<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(String::new, |v| v.to_string())
}

/// The records (`merge::records`: name, device, dtype, shape, min, median, max, max_rank,
/// then `rank<R>` per rank) as CSV with a header line, `\n` line ends: what
/// `MergedTensorReport.to_csv()` writes and `memlab-rs merge --format csv` prints.
pub fn csv(merged: &MergedTensorReport) -> String {
    let mut head: Vec<String> = [
        "name", "device", "dtype", "shape", "min", "median", "max", "max_rank",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect();
    head.extend(merged.ranks.iter().map(|r| format!("rank{r}")));
    let rows = records(merged);
    if rows.is_empty() {
        return String::new(); // as write_csv: no records, no header
    }
    let mut out = head.join(",");
    out.push('\n');
    for r in rows {
        let median = r.spread.map(|s| match s.median {
            Median::Whole(n) => n.to_string(),
            // A half: below 2^53 (above, every float is whole), where Rust's shortest
            // round-trip text is Python's repr.
            Median::Half(x) => x.to_string(),
        });
        let mut cells = vec![
            csv_field(&r.name),
            csv_field(&r.device),
            csv_field(&r.dtype),
            csv_field(&r.shape),
            or_empty(r.spread.map(|s| s.min)),
            median.unwrap_or_default(),
            or_empty(r.spread.map(|s| s.max)),
            or_empty(r.spread.map(|s| s.max_rank)),
        ];
        cells.extend(r.per_rank.iter().map(|(_, bytes)| bytes.to_string()));
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged() -> MergedTensorReport {
        MergedTensorReport::read(
            r#"{"ranks":[0,1],"world_size":2,"rows":[{"name":"only<1>","device":"cpu","shape":[512,1021],"dtype":"torch.float32","bytes":[0,2091008]},{"name":"w","device":"cpu","shape":[],"dtype":"torch.float32","bytes":[4,4]}],"totals":{"cpu":[4,2091012]}}"#,
        )
        .unwrap()
    }

    #[test]
    fn text_aligns_as_the_python_table_did() {
        assert_eq!(
            text(&merged()),
            "# merged tensor report: ranks 0, 1 of 2\n\n\
             name          device  shape        dtype            min    median    max  max rank\n\
             only<1>       cpu     (512, 1021)  torch.float32  0.00B  1021.00K  1.99M  1\n\
             w             cpu     ()           torch.float32  4.00B     4.00B  4.00B  -\n\
             total on cpu                                      4.00B  1021.00K  1.99M  1\n\
             \nper rank: cpu: rank 0 4.00B, rank 1 1.99M\n"
        );
    }

    #[test]
    fn csv_is_what_pythons_csv_module_writes() {
        assert_eq!(
            csv(&merged()),
            "name,device,dtype,shape,min,median,max,max_rank,rank0,rank1\n\
             only<1>,cpu,torch.float32,\"(512, 1021)\",0,1045504,2091008,1,0,2091008\n\
             w,cpu,torch.float32,(),4,4,4,0,4,4\n"
        );
        assert_eq!(csv_field("a\"b,c"), "\"a\"\"b,c\"");
        assert_eq!(csv_field("a\rb"), "\"a\rb\"");
        let odd = MergedTensorReport::read(
            r#"{"ranks":[0,1],"world_size":2,"rows":[{"name":"w","device":"cpu","shape":[2,2],"dtype":"torch.float32","bytes":[1,2]}],"totals":{}}"#,
        )
        .unwrap();
        assert!(csv(&odd).ends_with("\nw,cpu,torch.float32,\"(2, 2)\",1,1.5,2,1,1,2\n"));
    }

    #[test]
    fn html_escapes_as_python_does() {
        // What the Python renderer wrote for the same data.
        assert_eq!(
            html(&merged()),
            r#"<div class="memlab-rs-merged"><p><b>merged tensor report: ranks 0, 1 of 2</b></p><table><tr><th>name</th><th>device</th><th>shape</th><th>dtype</th><th>min</th><th>median</th><th>max</th><th>max rank</th></tr><tr><td>only&lt;1&gt;</td><td>cpu</td><td>(512, 1021)</td><td>torch.float32</td><td align="right">0.00B</td><td align="right">1021.00K</td><td align="right">1.99M</td><td align="right">1</td></tr><tr><td>w</td><td>cpu</td><td>()</td><td>torch.float32</td><td align="right">4.00B</td><td align="right">4.00B</td><td align="right">4.00B</td><td align="right">-</td></tr><tr><td colspan="4"><b>total on cpu</b></td><td align="right">4.00B</td><td align="right">1021.00K</td><td align="right">1.99M</td><td align="right">1</td></tr></table></div>"#
        );
        assert_eq!(escape("a'b"), "a&#x27;b");
    }
}
