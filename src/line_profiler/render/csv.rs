//! Records as CSV, exactly as Python's `csv.DictWriter` writes them (the excel dialect with
//! `\n` line endings): a field holding a comma, a quote or a line break is quoted, its
//! quotes doubled; no value is an empty field; numbers as Python's `str()` writes them.

use super::records::{Cell, Table};

/// The records as CSV: a header line, then one line per row. `header_alone`: whether a
/// table without rows still gets its header (a line profile's CSV does; a merged one, whose
/// columns are those of its first record, is empty).
pub fn render(table: &Table, header_alone: bool) -> String {
    if table.rows.is_empty() && !header_alone {
        return String::new();
    }
    let mut out = String::new();
    line(&mut out, table.names.iter().map(|n| field(n)));
    for row in &table.rows {
        line(&mut out, row.iter().map(cell));
    }
    out
}

fn line(out: &mut String, fields: impl Iterator<Item = String>) {
    let fields: Vec<String> = fields.collect();
    out.push_str(&fields.join(","));
    out.push('\n');
}

fn cell(value: &Cell) -> String {
    match value {
        Cell::Int(n) => n.to_string(),
        Cell::Float(x) => python_float(*x),
        Cell::Text(text) => field(text),
        Cell::None => String::new(),
    }
}

/// A text field, quoted where the excel dialect must.
fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// A float as Python's `repr()`: the shortest digits that read back the same, with `.0`
/// on whole numbers, and an exponent (`1e+16`, `1e-05`) outside [1e-4, 1e16).
pub fn python_float(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let magnitude = x.abs();
    if magnitude != 0.0 && !(1e-4..1e16).contains(&magnitude) {
        let text = format!("{x:e}");
        let (digits, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let (sign, exponent) = match exponent.strip_prefix('-') {
            Some(e) => ('-', e),
            None => ('+', exponent),
        };
        return format!("{digits}e{sign}{exponent:0>2}");
    }
    let text = format!("{x}");
    if text.contains('.') {
        text
    } else {
        format!("{text}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted_as_python_quotes_them() {
        let table = Table {
            names: vec!["function".into(), "code".into(), "v".into()],
            rows: vec![
                vec![
                    Cell::Text("f".into()),
                    Cell::Text("x = g(a, \"b\")".into()),
                    Cell::Int(3),
                ],
                vec![
                    Cell::Text("f".into()),
                    Cell::Text(String::new()),
                    Cell::None,
                ],
            ],
        };
        assert_eq!(
            render(&table, true),
            "function,code,v\nf,\"x = g(a, \"\"b\"\")\",3\nf,,\n"
        );
        let empty = Table {
            names: vec!["a".into()],
            rows: vec![],
        };
        assert_eq!(render(&empty, true), "a\n");
        assert_eq!(render(&empty, false), "");
    }

    #[test]
    fn floats_read_as_pythons_repr() {
        assert_eq!(python_float(1572864.5), "1572864.5");
        assert_eq!(python_float(3.0), "3.0");
        assert_eq!(python_float(-0.5), "-0.5");
        assert_eq!(python_float(1.5e16), "1.5e+16");
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(1.25e-5), "1.25e-05");
        assert_eq!(python_float(0.0), "0.0");
    }
}
