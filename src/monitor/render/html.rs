//! The training monitor's memory per iteration by category, as ONE self-contained HTML
//! fragment: an inline SVG of stacked bars (one per recorded iteration, categories bottom to
//! top in `_categories.CATEGORIES` order, each bar as tall as that iteration's peak
//! allocated), a legend, and a table of the exact bytes. No script, no URL, every text
//! escaped.

use std::fmt::Write;

use crate::monitor::result::MonitorRecord;
use crate::results::categories::CATEGORIES;
use crate::text::escape::escape;
use crate::text::size::human_bytes;

/// The record's plot: one bar per recorded iteration (labelled `epoch:iteration`), its
/// categories stacked.
pub fn plot(record: &MonitorRecord) -> String {
    let names: Vec<String> = CATEGORIES.iter().map(|c| c.to_string()).collect();
    let labels: Vec<String> = record
        .rows
        .iter()
        .map(|r| format!("{}:{}", r.epoch, r.iteration))
        .collect();
    let values: Vec<Vec<i64>> = record
        .rows
        .iter()
        .map(|r| r.categories().to_vec())
        .collect();
    let title = format!(
        "memlab_rs monitor \u{2014} {}, peak allocated by category per iteration",
        record.device
    );
    render(&title, &names, &labels, &values)
}

/// Colours per category (parameter, buffer, gradient, activation, temporary,
/// optimizer_state, other), readable on light and dark backgrounds.
const COLOURS: [&str; 7] = [
    "#4e79a7", "#9c755f", "#f28e2b", "#e15759", "#edc948", "#59a14f", "#bab0ac",
];

/// `labels[i]` names iteration i; `values[i]` are its bytes by category (`names` order).
pub fn render(title: &str, names: &[String], labels: &[String], values: &[Vec<i64>]) -> String {
    let (width, height, left, bottom) = (720.0_f64, 260.0_f64, 70.0_f64, 30.0_f64);
    let top = values
        .iter()
        .map(|v| v.iter().fold(0i64, |a, b| a.saturating_add(*b)))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let plot_h = height - bottom - 10.0;
    let n = labels.len().max(1) as f64;
    let slot = (width - left - 10.0) / n;
    let bar = (slot * 0.8).max(1.0);
    let mut s = String::new();
    let _ = write!(
        s,
        "<div class=\"memlab-monitor\" style=\"font-family:monospace;color:inherit\">\
         <div style=\"font-weight:bold\">{}</div>\
         <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         role=\"img\" aria-label=\"memory per iteration by category\">",
        escape(title)
    );
    let _ = write!(
        s,
        "<text x=\"2\" y=\"14\" font-size=\"11\" fill=\"currentColor\">{}</text>\
         <line x1=\"{left}\" y1=\"10\" x2=\"{left}\" y2=\"{}\" stroke=\"currentColor\"/>",
        escape(&human_bytes(top as i128)),
        height - bottom
    );
    for (i, row) in values.iter().enumerate() {
        let x = left + slot * i as f64 + (slot - bar) / 2.0;
        let mut y = height - bottom;
        for (c, &bytes) in row.iter().enumerate() {
            let h = plot_h * bytes.max(0) as f64 / top;
            y -= h;
            let name = names.get(c).map(String::as_str).unwrap_or("?");
            let _ = write!(
                s,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bar:.1}\" height=\"{h:.1}\" \
                 fill=\"{}\"><title>{}: {} {} B</title></rect>",
                COLOURS[c % COLOURS.len()],
                escape(&labels[i]),
                escape(name),
                bytes
            );
        }
        if labels.len() <= 40 || i % (labels.len() / 20).max(1) == 0 {
            let _ = write!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\" \
                 fill=\"currentColor\">{}</text>",
                x + bar / 2.0,
                height - bottom + 14.0,
                escape(&labels[i])
            );
        }
    }
    s.push_str("</svg><div>");
    for (c, name) in names.iter().enumerate() {
        let _ = write!(
            s,
            "<span style=\"margin-right:1em\"><span style=\"display:inline-block;width:10px;\
             height:10px;background:{}\"></span> {}</span>",
            COLOURS[c % COLOURS.len()],
            escape(name)
        );
    }
    s.push_str("</div><table class=\"memlab-report\"><tr><th>iteration</th>");
    for name in names {
        let _ = write!(s, "<th class=\"num\">{}</th>", escape(name));
    }
    s.push_str("<th class=\"num\">peak allocated</th></tr>");
    for (label, row) in labels.iter().zip(values) {
        let _ = write!(s, "<tr><td>{}</td>", escape(label));
        for bytes in row {
            let _ = write!(s, "<td class=\"num\">{bytes}</td>");
        }
        let total = row.iter().fold(0i64, |a, b| a.saturating_add(*b));
        let _ = write!(s, "<td class=\"num\">{total}</td></tr>");
    }
    s.push_str("</table></div>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_loads_nothing() {
        let html = render(
            "<m>",
            &["parameter".into(), "other".into()],
            &["1:1".into()],
            &[vec![10, 20]],
        );
        assert!(html.contains("&lt;m&gt;"));
        assert!(!html.contains("http://") || html.matches("http://").count() == 1);
        assert!(!html.contains("<script"));
        assert!(html.contains("<td class=\"num\">30</td>"));
    }
}
