//! A line report as self-contained HTML for notebooks: per function, a table of its source
//! with one bar per value, scaled to the largest value of that column over the report (as
//! pytorch_memlab draws them), sizes as `1.00M` with the exact bytes on hover.
//!
//! No scripts, no fetches; text takes the notebook's colour and the bars are translucent,
//! so the table reads on light and dark themes alike.

use std::fmt::Write;

use super::text::{format_value, is_byte_column};
use crate::line_profiler::result::LineProfile;
use crate::text::escape::escape;

/// Seaborn's "muted" palette (pytorch_memlab's), as translucent fills.
const COLORS: [&str; 10] = [
    "72,120,208",
    "238,133,74",
    "106,204,100",
    "214,95,95",
    "149,108,180",
    "140,97,60",
    "220,126,192",
    "121,121,121",
    "213,187,103",
    "130,198,226",
];

const STYLE: &str = "<style>\
.memlab-lines{border-collapse:collapse;font-family:monospace;color:inherit;margin:0.3em 0 1em 0}\
.memlab-lines th,.memlab-lines td{padding:1px 8px;border-bottom:1px solid rgba(128,128,128,0.25)}\
.memlab-lines th{text-align:left;font-weight:bold}\
.memlab-lines td.num{text-align:right;min-width:6em}\
.memlab-lines td.line{text-align:right;opacity:0.7}\
.memlab-lines td.code{white-space:pre;text-align:left}\
.memlab-lines tr.idle td.code{opacity:0.6}\
.memlab-rs h3.memlab-func{font-family:monospace;margin:0.6em 0 0.2em 0}\
.memlab-rs .memlab-notes{margin:0.3em 0 1em 0}\
</style>";

pub fn render(report: &LineProfile) -> String {
    let mut out = tables(report);
    if !report.notices.is_empty() {
        out.push_str("<div class=\"memlab-rs\"><div class=\"memlab-notes\"><b>Notes</b><ul>");
        for notice in &report.notices {
            let _ = write!(out, "<li>{}</li>", escape(notice));
        }
        out.push_str("</ul></div></div>");
    }
    out
}

fn tables(report: &LineProfile) -> String {
    if report.functions.is_empty() {
        return "<p>No data collected</p>".to_string();
    }
    let maxima: Vec<i64> = (0..report.columns.len())
        .map(|k| {
            report
                .functions
                .iter()
                .flat_map(|b| &b.lines)
                .filter_map(|e| e.values().map(|v| v[k]))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::from("<div class=\"memlab-rs\">");
    out.push_str(STYLE);
    for block in &report.functions {
        let _ = write!(
            out,
            "<h3 class=\"memlab-func\">{}</h3><table class=\"memlab-lines\"><thead><tr>",
            escape(&block.qualname)
        );
        for column in &report.columns {
            let _ = write!(out, "<th>{}</th>", escape(column));
        }
        out.push_str("<th>line</th><th>code</th></tr></thead><tbody>");
        for entry in &block.lines {
            let idle = if entry.values().is_some() {
                ""
            } else {
                " class=\"idle\""
            };
            let _ = write!(out, "<tr{idle}>");
            for (k, column) in report.columns.iter().enumerate() {
                match entry.values().map(|v| v[k]) {
                    Some(value) => cell(&mut out, column, value, maxima[k], COLORS[k % 10]),
                    None => out.push_str("<td class=\"num\"></td>"),
                }
            }
            let _ = write!(
                out,
                "<td class=\"line\">{}</td><td class=\"code\">{}</td></tr>",
                entry.number(),
                escape(entry.code())
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</div>");
    out
}

fn cell(out: &mut String, column: &str, value: i64, max: i64, color: &str) {
    let share = if max > 0 {
        (value.max(0) as f64 / max as f64 * 100.0).min(100.0)
    } else {
        0.0
    };
    let title = if is_byte_column(column) {
        format!("{value} bytes")
    } else {
        value.to_string()
    };
    let _ = write!(
        out,
        "<td class=\"num\" title=\"{title}\" style=\"background:linear-gradient(90deg,\
         rgba({color},0.45) {share:.1}%,transparent {share:.1}%)\">{}</td>",
        escape(&format_value(column, value))
    );
}
