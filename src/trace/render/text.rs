//! The peak tracer's text report, byte for byte in its layout:
//!
//! ```text
//! Max mem: 225.3 MB
//! Total mem allocated: 321.0 MB
//! Mem, Cumulative Mem, Median, Count, Location
//! 64.00 MB  64.00 MB  32.00 MB  2  /path/train.py:42 (step)
//! ```
//! and the module view, in the same style.

use crate::trace::group::Row;
use crate::trace::report::{DeviceReport, Report};

/// The peak tracer's number format: 1024-based units "", KB, MB, GB and four significant
/// digits (`std::fixed` with `4 - leading digits` decimals, so 1000 KB prints no decimals).
pub fn readable(bytes: u64) -> String {
    let units = ["", "KB", "MB", "GB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while unit < 3 && value >= 1024.0 {
        value /= 1024.0;
        unit += 1;
    }
    if bytes == 0 {
        return format!("0.000 {}", units[unit]);
    }
    let leading = value.abs().log10().floor() as i32 + 1;
    let decimals = 4 - leading;
    // C++ treats a negative precision as the default, 6.
    let decimals = if decimals < 0 { 6 } else { decimals as usize };
    format!("{value:.decimals$} {}", units[unit])
}

fn rows(out: &mut String, header: &str, rows: &[Row]) {
    out.push_str(header);
    out.push('\n');
    for row in rows {
        out.push_str(&format!(
            "{}  {}  {}  {}  {}\n",
            readable(row.bytes),
            readable(row.cumulative),
            readable(row.median),
            row.count,
            row.key
        ));
    }
}

fn notices(out: &mut String, report: &Report, device: &DeviceReport) {
    for notice in report.notices(device) {
        out.push_str(&format!("Note: {notice}\n"));
    }
}

/// One section per device (headed `Device: cuda:N` when there are several): `Max mem`,
/// `Total mem allocated` when `total` asks for it, then `header` and the rows `pick` gives.
fn sections(
    report: &Report,
    total: bool,
    header: &str,
    pick: impl Fn(&DeviceReport) -> &[Row],
) -> String {
    let mut out = String::new();
    let several = report.devices.len() > 1;
    for device in &report.devices {
        if several {
            out.push_str(&format!("Device: {}\n", report.device_name(device.device)));
        }
        out.push_str(&format!("Max mem: {}\n", readable(device.peak.max_bytes)));
        if total {
            out.push_str(&format!(
                "Total mem allocated: {}\n",
                readable(device.peak.total_allocated)
            ));
        }
        rows(&mut out, header, pick(device));
        notices(&mut out, report, device);
    }
    if report.devices.is_empty() {
        out.push_str("No allocations were recorded.\n");
        for notice in &report.trace.notices {
            out.push_str(&format!("Note: {notice}\n"));
        }
    }
    out
}

/// `Max mem`, `Total mem allocated` and one row per location alive at the peak. With more
/// than one device, each section starts with `Device: cuda:N`.
pub fn peak_table(report: &Report) -> String {
    sections(
        report,
        true,
        "Mem, Cumulative Mem, Median, Count, Location",
        |d| &d.rows,
    )
}

/// The same live set by module and phase (`phase:module path`).
pub fn module_table(report: &Report) -> String {
    sections(
        report,
        false,
        "Mem, Cumulative Mem, Median, Count, Module",
        |d| &d.tags,
    )
}

#[cfg(test)]
mod tests {
    use super::readable;

    #[test]
    fn numbers_have_four_significant_digits_like_the_peak_tracer() {
        assert_eq!(readable(512), "512.0 ");
        assert_eq!(readable(1024), "1.000 KB");
        assert_eq!(readable(1536), "1.500 KB");
        assert_eq!(readable(10 * 1024 * 1024), "10.00 MB");
        assert_eq!(readable(1000 * 1024), "1000 KB");
        assert_eq!(readable(236294656), "225.3 MB");
        assert_eq!(readable(3 << 30), "3.000 GB");
        assert_eq!(readable(0), "0.000 ");
    }
}
