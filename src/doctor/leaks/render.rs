//! The leak check as text: per device, each growing site with its growth per step (exact
//! bytes, thousands separated), its live bytes at the end of each measured step, and the
//! notices.

use super::result::{DeviceLeaks, LeakReport, Site};
use crate::text::size::{human_bytes, thousands};

/// Live bytes shown in full up to this many steps; more show the first and last few.
const SHOWN_STEPS: usize = 8;

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `4,096` for a whole number, `4,096.5` otherwise.
fn per_step(bytes: f64) -> String {
    if bytes.fract() == 0.0 && bytes.abs() < 9.0e18 {
        thousands(bytes as i64)
    } else {
        // Rounded once, then split: 0.96 is "1.0", not "0.0".
        let text = format!("{bytes:.1}");
        let (whole, tenths) = text.split_once('.').unwrap_or((&text, "0"));
        let sign = if whole.starts_with('-') { "-" } else { "" };
        let digits = whole.trim_start_matches('-').parse::<i64>().unwrap_or(0);
        format!("{sign}{}.{tenths}", thousands(digits))
    }
}

fn live_list(live: &[i64]) -> String {
    let show = |values: &[i64]| {
        values
            .iter()
            .map(|&b| human_bytes(b as i128))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if live.len() <= SHOWN_STEPS {
        show(live)
    } else {
        let head = &live[..3];
        let tail = &live[live.len() - 3..];
        format!("{}, ..., {}", show(head), show(tail))
    }
}

fn site(out: &mut String, site: &Site) {
    out.push_str(&format!(
        "  +{} bytes/step  {}\n",
        per_step(site.bytes_per_step),
        site.location
    ));
    out.push_str(&format!(
        "      live at each step's end: {}; {} alive at the end\n",
        live_list(&site.live_bytes),
        plural(site.allocations, "allocation", "allocations"),
    ));
}

fn device(out: &mut String, leaks: &DeviceLeaks, steps: u32) {
    let what = if leaks.device == "cpu" {
        "cpu (CPU tensors)".to_string()
    } else {
        leaks.device.clone()
    };
    if leaks.sites.is_empty() {
        out.push_str(&format!(
            "{what}: no site grew at every step ({} outlived the step that made them)\n",
            plural(leaks.outlived, "allocation", "allocations")
        ));
    } else {
        out.push_str(&format!(
            "{what}: {} grew at every one of the {steps} steps\n",
            plural(leaks.sites.len() as u64, "site", "sites")
        ));
        for s in &leaks.sites {
            site(out, s);
        }
    }
    for notice in &leaks.notices {
        out.push_str(&format!("  notice: {notice}\n"));
    }
}

/// The report as text.
pub fn text(report: &LeakReport) -> String {
    let mut out = format!(
        "Leak check: {} measured after {}\n",
        plural(report.steps as u64, "step", "steps"),
        plural(report.warmup as u64, "warm-up step", "warm-up steps"),
    );
    for leaks in &report.devices {
        device(&mut out, leaks, report.steps);
    }
    out
}

/// The failure message of a test whose sites grew by more than `limit` bytes per call:
/// those sites only, per device.
pub fn limit_text(report: &LeakReport, marker: &str, limit: i64) -> String {
    let mut out = format!(
        "memlab_rs: memory grew by more than {} {} per call over {} calls (after {}), \
         @pytest.mark.{marker}:\n",
        thousands(limit),
        if limit == 1 { "byte" } else { "bytes" },
        report.steps,
        plural(report.warmup as u64, "warm-up call", "warm-up calls"),
    );
    for leaks in &report.devices {
        let over: Vec<&Site> = leaks
            .sites
            .iter()
            .filter(|s| s.bytes_per_step > limit as f64)
            .collect();
        if over.is_empty() {
            continue;
        }
        out.push_str(&format!("{}:\n", leaks.device));
        for s in over {
            site(&mut out, s);
        }
        for notice in &leaks.notices {
            out.push_str(&format!("  notice: {notice}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_per_step_is_exact_bytes_or_one_decimal() {
        assert_eq!(per_step(4096.0), "4,096");
        assert_eq!(per_step(1234567.5), "1,234,567.5");
        assert_eq!(per_step(0.96), "1.0");
        assert_eq!(per_step(-2.5), "-2.5");
    }

    #[test]
    fn long_runs_show_their_first_and_last_steps() {
        let live: Vec<i64> = (1..=10).map(|i| i * 1024).collect();
        assert_eq!(
            live_list(&live),
            "1.0 KiB, 2.0 KiB, 3.0 KiB, ..., 8.0 KiB, 9.0 KiB, 10.0 KiB"
        );
    }
}
