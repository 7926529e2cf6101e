//! One `track()` as an HTML table for Jupyter: the rows that appeared (`+`) and vanished
//! (`-`) with exact bytes, where it was called, the totals, and why it may be incomplete.
//! No scripts; colours from the notebook's theme.

use std::fmt::Write;

use crate::text::escape::escape;
use crate::text::size::human_bytes;
use crate::tracker::diff::DiffRow;

const STYLE: &str = "border-collapse:collapse;font-family:monospace;color:inherit";

/// The device's totals under a `track()`'s table: the storages' own bytes, the
/// allocator's bytes for them, and what the allocator has handed out in all.
pub struct Totals {
    pub storage_bytes: u64,
    pub bytes: u64,
    pub allocated_bytes: u64,
}

/// Says which byte column is which, under the table.
const BYTES_NOTE: &str = "storage bytes: the tensors' storages, each once (what the log \
    prints, as the original tool counts them); allocator bytes: what the allocator holds for \
    them (CUDA rounds each storage up to 512-byte blocks; on the CPU the same bytes).";

/// The table of one `track()`: `rows` (all of them: the log's `detail` flag is for the log),
/// `place` (`file line N: function`), the device's totals, and the note.
pub fn render(rows: &[DiffRow], place: &str, totals: &Totals, incomplete: Option<&str>) -> String {
    let mut out = format!(
        "<div class=\"memlab-rs\"><table class=\"memlab-report\" style=\"{STYLE}\">\
         <caption style=\"text-align:left;font-weight:bold\">Tensors changed at {}</caption>\
         <tr><th></th><th style=\"text-align:right\">count</th><th>shape</th><th>dtype</th>\
         <th style=\"text-align:right\">storage bytes</th>\
         <th style=\"text-align:right\">size</th>\
         <th style=\"text-align:right\">allocator bytes</th>\
         <th>type</th><th>names</th></tr>",
        escape(place)
    );
    for r in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td style=\"text-align:right\">{}</td><td>{}</td><td>{}</td>\
             <td style=\"text-align:right\">{}</td><td style=\"text-align:right\">{}</td>\
             <td style=\"text-align:right\">{}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.sign.to_string()),
            r.count,
            escape(&r.shape),
            escape(&r.dtype),
            r.storage_bytes,
            escape(&human_bytes(r.storage_bytes as i128)),
            r.bytes,
            escape(&r.kind),
            escape(&r.names.join(", ")),
        );
    }
    let total = |label: &str, storage: Option<u64>, blocks: u64| {
        let (bytes, size) = match storage {
            Some(b) => (b.to_string(), escape(&human_bytes(b as i128))),
            None => (String::new(), String::new()),
        };
        format!(
            "<tr><td colspan=\"4\"><b>{label}</b></td><td style=\"text-align:right\">{bytes}</td>\
             <td style=\"text-align:right\">{size}</td>\
             <td style=\"text-align:right\">{blocks}</td><td colspan=\"2\"></td></tr>"
        )
    };
    out.push_str(&total(
        "Total tensor memory",
        Some(totals.storage_bytes),
        totals.bytes,
    ));
    out.push_str(&total(
        "Total allocated memory",
        None,
        totals.allocated_bytes,
    ));
    out.push_str("</table>");
    let _ = write!(out, "<p>{}</p>", escape(BYTES_NOTE));
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
            storage_bytes: 2 << 20,
            names: vec!["a".into(), "b".into()],
        };
        let totals = Totals {
            storage_bytes: 2 << 20,
            bytes: 2 << 20,
            allocated_bytes: 3 << 20,
        };
        let html = render(&[row], "x.py line 3: <module>", &totals, Some("why"));
        assert!(html.contains("Tensors changed at x.py line 3: &lt;module&gt;"));
        assert!(html.contains("<td>&lt;class &#39;torch.Tensor&#39;&gt;</td><td>a, b</td>"));
        assert!(html.contains(">2097152</td><td style=\"text-align:right\">2.0 MiB</td>"));
        assert!(html.contains(">3145728</td>"));
        assert!(html.ends_with("<p>Note: why</p></div>"));
    }

    #[test]
    fn storage_bytes_and_the_allocators_blocks_side_by_side() {
        let row = DiffRow {
            sign: '+',
            count: 1,
            kind: "<class 'torch.nn.parameter.Parameter'>".into(),
            shape: "(64, 3, 3, 3)".into(),
            dtype: "torch.float32".into(),
            bytes: 7168,
            storage_bytes: 6912,
            names: vec![],
        };
        let totals = Totals {
            storage_bytes: 6912,
            bytes: 7168,
            allocated_bytes: 7168,
        };
        let html = render(&[row], "x.py line 3: f", &totals, None);
        assert!(html.contains("<th style=\"text-align:right\">storage bytes</th>"));
        assert!(html.contains("<th style=\"text-align:right\">allocator bytes</th>"));
        assert!(html.contains(
            ">6912</td><td style=\"text-align:right\">6.8 KiB</td>\
             <td style=\"text-align:right\">7168</td>"
        ));
        assert!(html.contains("512-byte blocks"));
    }
}
