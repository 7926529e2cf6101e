//! A merged line profile as a self-contained HTML fragment: the heading, then per function a
//! table (each statistic's min, median, max and max rank, the line, the hits, the code),
//! then the notices.

use super::merged::{heading, hits_cell, python_rstrip, value_cells, Shown};
use crate::text::escape::escape;

pub fn render(shown: &Shown<'_>) -> String {
    let profile = shown.profile;
    let mut out = format!(
        "<div class=\"memlab-rs-merged\"><p><b>{}</b></p>",
        escape(&heading(profile))
    );
    for &f in &shown.functions {
        let function = &profile.functions[f];
        out.push_str(&format!(
            "<h4>{}</h4><table><tr>",
            escape(&function.qualname)
        ));
        for (column, _) in &shown.columns {
            out.push_str(&format!("<th colspan=\"4\">{}</th>", escape(column)));
        }
        out.push_str("<th></th><th></th><th></th></tr><tr>");
        for _ in &shown.columns {
            out.push_str("<th>min</th><th>median</th><th>max</th><th>max rank</th>");
        }
        out.push_str("<th>line</th><th>hits</th><th>code</th></tr>");
        for line in &function.lines {
            out.push_str("<tr>");
            for cell in value_cells(shown, line) {
                out.push_str(&format!("<td align=\"right\">{cell}</td>"));
            }
            out.push_str(&format!(
                "<td align=\"right\">{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
                line.0,
                hits_cell(&line.2),
                escape(python_rstrip(&line.1))
            ));
        }
        out.push_str("</table>");
    }
    for notice in &profile.notices {
        out.push_str(&format!("<p>{}</p>", escape(notice)));
    }
    out.push_str("</div>");
    out
}
