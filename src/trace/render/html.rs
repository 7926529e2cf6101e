//! The peak report as HTML for Jupyter: per device the peak figures, the rows by location and
//! by module. Self-contained, like the tensor report's tables.

use crate::text::escape::escape;
use crate::text::size::human_bytes;
use crate::trace::group::{Row, UNTAGGED, UNTRACED};
use crate::trace::report::Report;

const STYLE: &str = "<style>\
.memlab-trace{border-collapse:collapse;font-family:monospace;color:inherit;margin:0.5em 0}\
.memlab-trace th,.memlab-trace td{padding:2px 10px;border-bottom:1px solid rgba(128,128,128,0.35);text-align:left}\
.memlab-trace td.num,.memlab-trace th.num{text-align:right}\
.memlab-trace caption{text-align:left;font-weight:bold;padding:4px 0}\
</style>";

fn table(out: &mut String, caption: &str, key: &str, rows: &[Row]) {
    out.push_str(&format!(
        "<table class=\"memlab-trace\"><caption>{}</caption><thead><tr><th class=\"num\">Mem</th>\
         <th class=\"num\">Cumulative Mem</th><th class=\"num\">Median</th><th class=\"num\">Count</th>\
         <th>{}</th></tr></thead><tbody>",
        escape(caption),
        escape(key)
    ));
    for r in rows {
        out.push_str(&format!(
            "<tr><td class=\"num\" title=\"{} bytes\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td></tr>",
            r.bytes,
            human_bytes(r.bytes as i128),
            human_bytes(r.cumulative as i128),
            human_bytes(r.median as i128),
            r.count,
            escape(&r.key)
        ));
    }
    out.push_str("</tbody></table>");
}

pub fn render(report: &Report) -> String {
    let mut out = String::from("<div class=\"memlab-rs\">");
    out.push_str(STYLE);
    for d in &report.devices {
        let name = report.device_name(d.device);
        out.push_str(&format!(
            "<p><b>{}</b>: Max mem {} ({} bytes), total allocated {}</p>",
            escape(&name),
            human_bytes(d.peak.max_bytes as i128),
            d.peak.max_bytes,
            human_bytes(d.peak.total_allocated as i128)
        ));
        table(
            &mut out,
            &format!("{name}: alive at the peak, by location"),
            "Location",
            &d.rows,
        );
        if d.tags
            .iter()
            .any(|r| r.key != UNTRACED && r.key != UNTAGGED)
        {
            table(&mut out, &format!("{name}: by module"), "Module", &d.tags);
        }
        for notice in report.notices(d) {
            out.push_str(&format!("<p><i>Note: {}</i></p>", escape(&notice)));
        }
    }
    out.push_str("</div>");
    out
}
