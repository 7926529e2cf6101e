//! The report as a self-contained HTML table for Jupyter: no scripts, no fetches, colours
//! that follow the notebook's theme.

use std::fmt::Write;

use crate::tensor_report::result::TensorReport;
use crate::text::escape::escape;
use crate::text::size::{human_bytes, memlab_bytes};

/// Inline style: inherits the theme's text colour, uses translucent borders so it reads on
/// light and dark backgrounds alike.
const STYLE: &str = "<style>\
.memlab-report{border-collapse:collapse;font-family:monospace;color:inherit;margin:0.5em 0}\
.memlab-report th,.memlab-report td{padding:2px 10px;border-bottom:1px solid rgba(128,128,128,0.35);text-align:left}\
.memlab-report td.num,.memlab-report th.num{text-align:right}\
.memlab-report caption{text-align:left;font-weight:bold;padding:4px 0}\
.memlab-report tr.shared td{opacity:0.6}\
.memlab-report tfoot td{font-weight:bold}\
</style>";

/// The report as HTML: one table per device, then why the report may be incomplete.
pub fn render(report: &TensorReport) -> String {
    let mut out = String::from("<div class=\"memlab-rs\">");
    out.push_str(STYLE);
    for s in &report.sections {
        let _ = write!(
            out,
            "<table class=\"memlab-report\"><caption>Storage on {}</caption><thead><tr>\
             <th>Element type</th><th class=\"num\">Size</th><th>dtype</th>\
             <th class=\"num\">Used MEM</th><th>Shares storage with</th></tr></thead><tbody>",
            escape(&s.device)
        );
        for r in &s.rows {
            let class = if r.shared_with.is_some() {
                " class=\"shared\""
            } else {
                ""
            };
            let _ = write!(
                out,
                "<tr{class}><td>{}</td><td class=\"num\">{}</td><td>{}</td>\
                 <td class=\"num\" title=\"{} bytes\">{}</td><td>{}</td></tr>",
                escape(&r.name),
                escape(&r.shape_text),
                escape(&r.dtype),
                r.bytes,
                memlab_bytes(r.bytes as i128),
                escape(r.shared_with.as_deref().unwrap_or("")),
            );
        }
        if s.omitted_rows > 0 {
            let _ = write!(
                out,
                "<tr><td>... {} more tensors</td><td></td><td></td><td class=\"num\">{}</td><td></td></tr>",
                s.omitted_rows,
                memlab_bytes(s.omitted_bytes as i128)
            );
        }
        let _ = write!(
            out,
            "</tbody><tfoot><tr><td>Total Tensors: {}</td><td></td><td></td>\
             <td class=\"num\" title=\"{} bytes\">{}</td><td>{}</td></tr>",
            s.total_numel,
            s.total_bytes,
            memlab_bytes(s.total_bytes as i128),
            human_bytes(s.total_bytes as i128)
        );
        if let (Some(cuda), Some(rest)) = (s.cuda, s.remainder()) {
            for (label, bytes) in [
                ("+ tensors Python cannot see", rest.unseen_tensors),
                ("+ allocator rounding", rest.rounding),
                ("= torch.cuda.memory_allocated()", cuda.allocated as i128),
            ] {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td></td><td></td><td class=\"num\">{}</td><td></td></tr>",
                    escape(label),
                    memlab_bytes(bytes)
                );
            }
        }
        out.push_str("</tfoot></table>");
        if let Some(f) = s.cuda.and_then(|c| c.free_in_reserved) {
            let _ = write!(
                out,
                "<p>Free inside reserved segments: {} in {} segments; largest free block {}; \
                 {} in split segments (<code>memlab_rs.fragmentation()</code> says where)</p>",
                human_bytes(f.free_bytes as i128),
                f.segments,
                human_bytes(f.largest_free as i128),
                human_bytes(f.inactive_split_bytes as i128)
            );
        }
    }
    if let Some(why) = &report.incomplete {
        let _ = write!(out, "<p><b>Incomplete:</b> {}</p>", escape(why));
    }
    out.push_str("</div>");
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href='x'>&\""),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;"
        );
    }
}
