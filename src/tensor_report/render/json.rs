//! The report as JSON: one object per device, rows as objects with typed fields.

use crate::tensor_report::result::{Row, TensorReport};
use crate::text::escape::string;

fn optional<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "null".to_owned(), |v| v.to_string())
}

fn row(r: &Row) -> String {
    let shape = match &r.dims {
        Some(dims) => {
            let items: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            format!("[{}]", items.join(","))
        }
        None => string(&r.shape_text),
    };
    format!(
        "{{\"name\":{},\"device\":{},\"shape\":{},\"dtype\":{},\"numel\":{},\"bytes\":{},\"storage_bytes\":{},\"shared_with\":{}}}",
        string(&r.name),
        string(&r.device),
        shape,
        string(&r.dtype),
        r.numel,
        r.bytes,
        r.storage_bytes,
        optional(r.shared_with.as_deref().map(string)),
    )
}

/// The report as a JSON document: `{"devices": [...], "incomplete": null | why}`, the
/// CUDA figures with the remainder explained (`MemoryReport.to_json()`).
pub fn render(report: &TensorReport) -> String {
    let devices: Vec<String> = report
        .sections
        .iter()
        .map(|s| {
            let rows: Vec<String> = s.rows.iter().map(row).collect();
            let cuda = match (s.cuda, s.remainder()) {
                (Some(c), Some(rest)) => format!(
                    "{{\"allocated\":{},\"requested\":{},\"reserved\":{},\"unseen_tensors\":{},\"rounding\":{},\"driver_used\":{},\"driver_total\":{}}}",
                    c.allocated,
                    optional(c.requested),
                    optional(c.reserved),
                    rest.unseen_tensors,
                    rest.rounding,
                    optional(c.driver_used_total().map(|(used, _)| used)),
                    optional(c.driver_used_total().map(|(_, total)| total)),
                ),
                _ => "null".to_owned(),
            };
            format!(
                "{{\"device\":{},\"total_numel\":{},\"total_bytes\":{},\"omitted_rows\":{},\"omitted_bytes\":{},\"cuda\":{},\"rows\":[{}]}}",
                string(&s.device),
                s.total_numel,
                s.total_bytes,
                s.omitted_rows,
                s.omitted_bytes,
                cuda,
                rows.join(","),
            )
        })
        .collect();
    format!(
        "{{\"devices\":[{}],\"incomplete\":{}}}",
        devices.join(","),
        optional(report.incomplete.as_deref().map(string))
    )
}

#[cfg(test)]
mod tests {
    use super::string;

    #[test]
    fn escapes_quotes_and_controls() {
        assert_eq!(string("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}
