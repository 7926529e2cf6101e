//! One `track()` as an HTML table for Jupyter: the rows that appeared (`+`) and vanished
//! (`-`) with exact bytes, where it was called, the totals, and why it may be incomplete.
//! No scripts; colours from the notebook's theme.

use std::fmt::Write;

use crate::text::escape::escape;
use crate::text::size::human_bytes;
use crate::tracker::diff::DiffRow;

const STYLE: &str = "border-collapse:collapse;font-family:monospace;color:inherit";

/// The table of one `track()`: `rows` (all of them: the log's `detail` flag is for the log),
/// `place` (`file line N: function`), the device's tensor and allocated bytes, and the note.
pub fn render(
    rows: &[DiffRow],
    place: &str,
    tensor_bytes: u64,
    allocated_bytes: u64,
    incomplete: Option<&str>,
) -> String {
    let mut out = format!(
        "<div class=\"memlab-rs\"><table class=\"memlab-report\" style=\"{STYLE}\">\
         <caption style=\"text-align:left;font-weight:bold\">Tensors changed at {}</caption>\
         <tr><th></th><th style=\"text-align:right\">count</th><th>shape</th><th>dtype</th>\
         <th style=\"text-align:right\">bytes</th><th style=\"text-align:right\">size</th>\
         <th>type</th><th>names</th></tr>",
        escape(place)
    );
    for r in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td style=\"text-align:right\">{}</td><td>{}</td><td>{}</td>\
             <td style=\"text-align:right\">{}</td><td style=\"text-align:right\">{}</td>\
             <td>{}</td><td>{}</td></tr>",
            escape(&r.sign.to_string()),
            r.count,
            escape(&r.shape),
            escape(&r.dtype),
            r.bytes,
            escape(&human_bytes(r.bytes as i128)),
            escape(&r.kind),
            escape(&r.names.join(", ")),
        );
    }
    for (label, bytes) in [
        ("Total tensor memory", tensor_bytes),
        ("Total allocated memory", allocated_bytes),
    ] {
        let _ = write!(
            out,
            "<tr><td colspan=\"4\"><b>{label}</b></td><td style=\"text-align:right\">{bytes}</td>\
             <td style=\"text-align:right\">{}</td><td colspan=\"2\"></td></tr>",
            escape(&human_bytes(bytes as i128))
        );
    }
    out.push_str("</table>");
    if let Some(why) = incomplete {
        let _ = write!(out, "<p>Note: {}</p>", escape(why));
    }
    out.push_str("</div>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_totals_and_note() {
        let row = DiffRow {
            sign: '+',
            count: 2,
            kind: "<class 'torch.Tensor'>".into(),
            shape: "(256, 1024)".into(),
            dtype: "torch.float32".into(),
            bytes: 2 << 20,
            names: vec!["a".into(), "b".into()],
        };
        let html = render(
            &[row],
            "x.py line 3: <module>",
            2 << 20,
            3 << 20,
            Some("why"),
        );
        assert!(html.contains("Tensors changed at x.py line 3: &lt;module&gt;"));
        assert!(html.contains("<td>&lt;class &#39;torch.Tensor&#39;&gt;</td><td>a, b</td>"));
        assert!(html.contains(">2097152</td><td style=\"text-align:right\">2.0 MiB</td>"));
        assert!(html.contains(">3145728</td>"));
        assert!(html.ends_with("<p>Note: why</p></div>"));
    }
}
