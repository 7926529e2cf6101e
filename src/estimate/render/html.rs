//! The estimate as an HTML table for Jupyter: one row per figure, exact bytes beside the
//! readable size; no scripts, colours from the notebook's theme.

use crate::estimate::result::Estimate;
use crate::text::escape::escape;
use crate::text::size::human_bytes;

pub fn render(e: &Estimate) -> String {
    let mut out = String::from(
        "<div class=\"memlab-rs\"><table class=\"memlab-report\" \
         style=\"border-collapse:collapse;font-family:monospace;color:inherit\">",
    );
    out.push_str(&format!(
        "<caption style=\"text-align:left;font-weight:bold\">Memory estimate: {}</caption>\
         <tr><th style=\"text-align:left\">figure</th><th style=\"text-align:right\">bytes</th>\
         <th style=\"text-align:right\">size</th><th style=\"text-align:left\"></th></tr>",
        escape(&e.model)
    ));
    for (label, bytes, suffix) in e.lines() {
        let detail = suffix.trim_start().trim_start_matches('M').trim();
        out.push_str(&format!(
            "<tr><td>{}</td><td style=\"text-align:right\">{bytes}</td>\
             <td style=\"text-align:right\">{}</td><td>{}</td></tr>",
            escape(label),
            escape(&human_bytes(bytes as i128)),
            escape(detail)
        ));
    }
    out.push_str("</table>");
    if let Some(precision) = e.precision() {
        out.push_str(&format!("<p>Precision: {}</p>", escape(&precision)));
    }
    if let Some(parallelism) = e.parallelism() {
        out.push_str(&format!("<p>Per rank: {}</p>", escape(&parallelism)));
    }
    for note in &e.notes {
        out.push_str(&format!("<p>Note: {}</p>", escape(note)));
    }
    out.push_str("</div>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::result::tests::estimate;

    #[test]
    fn escapes_and_lists_bytes() {
        let mut e = estimate();
        e.model = "<m>".into();
        e.notes = vec!["a & b".into()];
        let html = render(&e);
        assert!(html.contains("&lt;m&gt;"));
        assert!(html.contains("<td style=\"text-align:right\">4004000</td>"));
        assert!(html.contains("a &amp; b"));
        assert!(html.contains("<td>(step 1, backward)</td>"));
        assert!(!html.contains("Precision"));
        e.autocast = Some("bfloat16".into());
        assert!(render(&e).contains("<p>Precision: torch.autocast(bfloat16)</p>"));
    }
}
