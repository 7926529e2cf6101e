//! The estimate as an HTML table for Jupyter: one row per figure, exact bytes beside the
//! readable size; no scripts, colours from the notebook's theme.

use super::text::Line;
use crate::text::escape::escape;
use crate::text::size::human_bytes;

pub fn render(model: &str, lines: &[Line], notes: &[String]) -> String {
    let mut out = String::from(
        "<div class=\"memlab-rs\"><table class=\"memlab-report\" \
         style=\"border-collapse:collapse;font-family:monospace;color:inherit\">",
    );
    out.push_str(&format!(
        "<caption style=\"text-align:left;font-weight:bold\">Memory estimate: {}</caption>\
         <tr><th style=\"text-align:left\">figure</th><th style=\"text-align:right\">bytes</th>\
         <th style=\"text-align:right\">size</th><th style=\"text-align:left\"></th></tr>",
        escape(model)
    ));
    for (label, bytes, suffix) in lines {
        let detail = suffix.trim_start().trim_start_matches('M').trim();
        out.push_str(&format!(
            "<tr><td>{}</td><td style=\"text-align:right\">{bytes}</td>\
             <td style=\"text-align:right\">{}</td><td>{}</td></tr>",
            escape(label),
            escape(&human_bytes(*bytes as i128)),
            escape(detail)
        ));
    }
    out.push_str("</table>");
    for note in notes {
        out.push_str(&format!("<p>Note: {}</p>", escape(note)));
    }
    out.push_str("</div>");
    out
}

/// The HTML of an estimate (see `render`).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_lists_bytes() {
        let lines = vec![("params".to_owned(), 2048, "M".to_owned())];
        let html = render("<m>", &lines, &["a & b".to_owned()]);
        assert!(html.contains("&lt;m&gt;"));
        assert!(html.contains("<td style=\"text-align:right\">2048</td>"));
        assert!(html.contains("a &amp; b"));
    }
}
