//! A line report as self-contained HTML: a table per function with its source.

use std::fmt::Write;

use super::html::escape;
use super::line_text::format_value;
use crate::line_profiler::report::LineReport;

const STYLE: &str = "<style>\
.memlab-lines{border-collapse:collapse;font-family:monospace;color:inherit;margin:0.5em 0}\
.memlab-lines th,.memlab-lines td{padding:1px 8px;border-bottom:1px solid rgba(128,128,128,0.3)}\
.memlab-lines td.num,.memlab-lines th.num{text-align:right}\
.memlab-lines td.code{white-space:pre;text-align:left}\
.memlab-lines tr.idle td{opacity:0.55}\
</style>";

pub fn render(report: &LineReport) -> String {
    if report.blocks.is_empty() {
        return "<p>No data collected</p>".to_string();
    }
    let mut out = String::from("<div class=\"memlab-rs\">");
    out.push_str(STYLE);
    for block in &report.blocks {
        let _ = write!(
            out,
            "<h3><span style=\"font-family: monospace\">{}</span></h3>\
             <table class=\"memlab-lines\"><thead><tr>",
            escape(&block.qualname)
        );
        for column in &report.columns {
            let _ = write!(out, "<th class=\"num\">{}</th>", escape(column));
        }
        out.push_str("<th class=\"num\">line</th><th>code</th></tr></thead><tbody>");
        for entry in &block.lines {
            let class = if entry.values.is_some() {
                ""
            } else {
                " class=\"idle\""
            };
            let _ = write!(out, "<tr{class}>");
            for (k, column) in report.columns.iter().enumerate() {
                let cell = entry
                    .values
                    .as_ref()
                    .map(|values| format_value(column, values[k]))
                    .unwrap_or_default();
                let _ = write!(out, "<td class=\"num\">{}</td>", escape(&cell));
            }
            let code = entry.code.trim_end_matches(['\n', '\r']);
            let _ = write!(
                out,
                "<td class=\"num\">{}</td><td class=\"code\">{}</td></tr>",
                entry.line,
                escape(code)
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</div>");
    out
}
