//! Two tensor reports' diff as text: per device its totals, then what grew and what shrank,
//! largest first. The diff's rows and totals come as `ResultDiff` holds them.

use serde::Deserialize;

use crate::text::size::memlab_size;

/// A tensor diff as `TensorReportDiff` holds it: the two results' names, rows and totals.
#[derive(Debug, Deserialize)]
pub struct DiffDoc {
    pub names: [String; 2],
    pub rows: Vec<DiffRow>,
    pub totals: Vec<DiffTotal>,
}

#[derive(Debug, Deserialize)]
pub struct DiffRow {
    pub name: String,
    pub device: String,
    pub shape: String,
    pub dtype: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    pub change: f64,
}

#[derive(Debug, Deserialize)]
pub struct DiffTotal {
    pub device: String,
    pub a: f64,
    pub b: f64,
    pub change: f64,
}

/// `+1.00M`, `-512.00B`, `0.00B`.
fn signed(n: f64) -> String {
    let sign = if n > 0.0 { "+" } else { "" };
    format!("{sign}{}", memlab_size(n))
}

fn size(n: Option<f64>) -> String {
    n.map_or_else(|| "-".to_owned(), memlab_size)
}

/// What grew and what shrank on each device, largest first, under the device's totals.
pub fn text(diff: &DiffDoc) -> String {
    let [a, b] = &diff.names;
    let mut out = format!("# tensor report diff: {a} -> {b}\n");
    for total in &diff.totals {
        let rows: Vec<&DiffRow> = diff
            .rows
            .iter()
            .filter(|r| r.device == total.device)
            .collect();
        out.push_str(&format!(
            "\n## {}: {} -> {} ({})\n",
            total.device,
            memlab_size(total.a),
            memlab_size(total.b),
            signed(total.change)
        ));
        let grew: Vec<&&DiffRow> = rows.iter().filter(|r| r.change > 0.0).collect();
        let shrank: Vec<&&DiffRow> = rows.iter().filter(|r| r.change < 0.0).collect();
        for (title, part) in [("grew", grew), ("shrank", shrank)] {
            if part.is_empty() {
                continue;
            }
            out.push_str(&format!("{title}:\n"));
            for r in part {
                out.push_str(&format!(
                    "  {:>10}  {}  {} {}  ({} -> {})\n",
                    signed(r.change),
                    r.name,
                    r.shape,
                    r.dtype,
                    size(r.a),
                    size(r.b)
                ));
            }
        }
        if rows.is_empty() {
            out.push_str("no change\n");
        }
    }
    if diff.totals.is_empty() {
        out.push_str("\nnothing to compare\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::from_json;

    #[test]
    fn grew_then_shrank_under_each_device() {
        let diff: DiffDoc = from_json(
            r#"{"names":["a.json","b.json"],"rows":[{"name":"(unnamed)","device":"cpu","shape":"(512, 1021)","dtype":"torch.float32","a":0,"b":2091008,"change":2091008},{"name":"gone","device":"cpu","shape":"()","dtype":"torch.int64","a":8,"b":0,"change":-8}],"totals":[{"device":"cpu","a":8,"b":2091008,"change":2091000},{"device":"meta","a":0,"b":0,"change":0}]}"#,
        )
        .unwrap();
        // What the Python renderer wrote for the same diff.
        assert_eq!(
            text(&diff),
            "# tensor report diff: a.json -> b.json\n\
             \n## cpu: 8.00B -> 1.99M (+1.99M)\n\
             grew:\n      +1.99M  (unnamed)  (512, 1021) torch.float32  (0.00B -> 1.99M)\n\
             shrank:\n      -8.00B  gone  () torch.int64  (8.00B -> 0.00B)\n\
             \n## meta: 0.00B -> 0.00B (0.00B)\nno change\n"
        );
        let none: DiffDoc = from_json(r#"{"names":["A","B"],"rows":[],"totals":[]}"#).unwrap();
        assert_eq!(
            text(&none),
            "# tensor report diff: A -> B\n\nnothing to compare\n"
        );
    }
}
