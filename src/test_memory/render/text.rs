//! A test's memory as text. Byte counts are exact, with thousands separators, and a human
//! form beside them ("1,048,576 bytes (1.0 MiB)"): a limit is checked against the exact
//! number, so the exact number is what the failure shows.

use super::{Measurement, Peak, Row};
use crate::test_memory::result::TestMemory;
use crate::text::size::human_bytes;
pub use crate::text::size::thousands;

/// `1,048,576 bytes (1.0 MiB)`.
pub fn bytes(n: i64) -> String {
    let unit = if n == 1 { "byte" } else { "bytes" };
    format!("{} {unit} ({})", thousands(n), human_bytes(n as i128))
}

/// What the memory is: "CPU tensors" or "cuda:0".
fn what(device: &str) -> String {
    if device == "cpu" {
        "CPU tensors".to_string()
    } else {
        device.to_string()
    }
}

/// The rows alive at the peak (the `top` biggest) and the notices, indented.
fn rows_block(rows: &[Row], top: usize, notices: &[String]) -> String {
    let mut out = String::new();
    if !rows.is_empty() {
        let shown = &rows[..rows.len().min(top)];
        let of = if rows.len() > shown.len() {
            format!("the top {} of {} locations", shown.len(), rows.len())
        } else {
            "every location".to_string()
        };
        out.push_str(&format!(
            "  allocated during the call and alive at its peak, by line ({of}):\n"
        ));
        let width = shown
            .iter()
            .map(|r| thousands(r.bytes).len())
            .max()
            .unwrap_or(0)
            .max("bytes".len());
        out.push_str(&format!("    {:>width$}  allocations  location\n", "bytes"));
        for row in shown {
            out.push_str(&format!(
                "    {:>width$}  {:>11}  {}\n",
                thousands(row.bytes),
                row.count,
                row.location
            ));
        }
    }
    for notice in notices {
        out.push_str(&format!("  note: {notice}\n"));
    }
    out
}

/// The failure of a test whose peak exceeded its limit: the peak, the limit, by how much,
/// and the top `top` rows alive at the peak.
pub fn limit_exceeded(m: &Measurement, marker: &str, top: usize) -> String {
    let limit = m.limit_bytes.unwrap_or(0);
    let mut out = format!(
        "memlab_rs: {} peaked at {} during the test's call, over the limit of {} \
         (@pytest.mark.{marker}) by {}\n",
        what(&m.device),
        bytes(m.peak_bytes),
        bytes(limit),
        bytes(m.peak_bytes - limit),
    );
    out.push_str(&format!(
        "  peak = the highest allocated bytes during the call minus the {} allocated when \
         it began\n",
        thousands(m.start_bytes)
    ));
    out.push_str(&rows_block(&m.rows, top, &m.notices));
    out
}

/// One measurement of a result's text.
fn measurement(m: &Measurement) -> String {
    let limit = match m.limit_bytes {
        Some(limit) if m.peak_bytes > limit => format!("; limit {}: exceeded", bytes(limit)),
        Some(limit) => format!("; limit {}", bytes(limit)),
        None => String::new(),
    };
    let mut out = format!(
        "{}: peak {} above the {} allocated when the call began{limit}\n",
        m.device,
        bytes(m.peak_bytes),
        thousands(m.start_bytes),
    );
    out.push_str(&rows_block(&m.rows, usize::MAX, &m.notices));
    out
}

/// A test's result: its node id and outcome, then each device measured.
pub fn render(result: &TestMemory) -> String {
    let mut out = format!("{}: {}\n", result.nodeid, result.outcome);
    for m in &result.measurements {
        out.push_str(&measurement(m));
    }
    out
}

/// The session's table for one device: the tests with the highest peaks, highest first
/// (`peaks` already chosen and ordered), out of `measured` tests.
pub fn top_table(device: &str, peaks: &[Peak], measured: usize) -> String {
    let mut out = format!(
        "{device}: the {} highest peaks of {measured} test{} measured\n",
        peaks.len(),
        if measured == 1 { "" } else { "s" }
    );
    let exact: Vec<String> = peaks.iter().map(|p| thousands(p.peak_bytes)).collect();
    let human: Vec<String> = peaks
        .iter()
        .map(|p| human_bytes(p.peak_bytes as i128))
        .collect();
    let limits: Vec<String> = peaks
        .iter()
        .map(|p| p.limit_bytes.map_or("-".to_string(), thousands))
        .collect();
    let w_exact = exact.iter().map(String::len).max().unwrap_or(0).max(10);
    let w_human = human.iter().map(String::len).max().unwrap_or(0);
    let w_limit = limits.iter().map(String::len).max().unwrap_or(0).max(11);
    let w_outcome = peaks
        .iter()
        .map(|p| p.outcome.len())
        .max()
        .unwrap_or(0)
        .max(7);
    out.push_str(&format!(
        "  {:>w_exact$}  {:>w_human$}  {:>w_limit$}  {:<w_outcome$}  test\n",
        "peak bytes", "", "limit bytes", "outcome"
    ));
    for (i, p) in peaks.iter().enumerate() {
        out.push_str(&format!(
            "  {:>w_exact$}  {:>w_human$}  {:>w_limit$}  {:<w_outcome$}  {}\n",
            exact[i], human[i], limits[i], p.outcome, p.nodeid
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(limit: Option<i64>) -> Measurement {
        Measurement {
            device: "cpu".to_string(),
            peak_bytes: 1_048_576,
            start_bytes: 4_000_000,
            limit_bytes: limit,
            rows: vec![
                Row {
                    location: "test_a.py:6 (test_big)".to_string(),
                    bytes: 1_048_576,
                    count: 1,
                },
                Row {
                    location: "test_a.py:7 (test_big)".to_string(),
                    bytes: 512,
                    count: 2,
                },
            ],
            notices: vec![],
        }
    }

    #[test]
    fn separates_thousands() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_048_576), "1,048,576");
        assert_eq!(thousands(-1_610_612_736), "-1,610,612,736");
    }

    #[test]
    fn limit_failure_shows_peak_limit_and_rows() {
        let text = limit_exceeded(&measured(Some(524_288)), "limit_memory(\"512 KiB\")", 1);
        assert_eq!(
            text,
            concat!(
                "memlab_rs: CPU tensors peaked at 1,048,576 bytes (1.0 MiB) during the test's ",
                "call, over the limit of 524,288 bytes (512.0 KiB) ",
                "(@pytest.mark.limit_memory(\"512 KiB\")) by 524,288 bytes (512.0 KiB)\n",
                "  peak = the highest allocated bytes during the call minus the 4,000,000 ",
                "allocated when it began\n",
                "  allocated during the call and alive at its peak, by line (the top 1 of 2 ",
                "locations):\n",
                "        bytes  allocations  location\n",
                "    1,048,576            1  test_a.py:6 (test_big)\n",
            )
        );
    }

    #[test]
    fn result_text_and_table() {
        let text = render(&TestMemory {
            nodeid: "test_a.py::test_big".into(),
            outcome: "passed".into(),
            measurements: vec![measured(Some(2 << 20))],
        });
        assert!(text.starts_with(
            "test_a.py::test_big: passed\ncpu: peak 1,048,576 bytes (1.0 MiB) above the \
             4,000,000 allocated when the call began; limit 2,097,152 bytes (2.0 MiB)\n"
        ));
        assert!(text.ends_with("          512            2  test_a.py:7 (test_big)\n"));
        let table = top_table(
            "cpu",
            &[
                Peak {
                    nodeid: "t.py::a".to_string(),
                    peak_bytes: 1_048_576,
                    limit_bytes: None,
                    outcome: "passed".to_string(),
                },
                Peak {
                    nodeid: "t.py::b".to_string(),
                    peak_bytes: 0,
                    limit_bytes: Some(1000),
                    outcome: "failed".to_string(),
                },
            ],
            3,
        );
        assert_eq!(
            table,
            concat!(
                "cpu: the 2 highest peaks of 3 tests measured\n",
                "  peak bytes           limit bytes  outcome  test\n",
                "   1,048,576  1.0 MiB            -  passed   t.py::a\n",
                "           0      0 B        1,000  failed   t.py::b\n",
            )
        );
    }
}
