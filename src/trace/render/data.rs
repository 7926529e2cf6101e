//! A trace report as data: the tagging profiler's CSV (`tag,MiB`) and its log of the stacks it
//! could not tag, and the report as JSON (through serde, as every result's JSON).

use std::collections::HashMap;

use serde::Serialize;

use crate::results::to_json;
use crate::trace::group::{Row, UNTAGGED, UNTRACED};
use crate::trace::model::Source;
use crate::trace::report::{DeviceReport, Report};

const MIB: f64 = 1048576.0;

/// `tag,MiB`, one row per tag alive at the peak (the tagging profiler's CSV), biggest first.
pub fn tag_csv(device: &DeviceReport) -> String {
    let mut out = String::from("tag,MiB\n");
    for row in &device.tags {
        let tag = if row.key.contains([',', '"', '\n']) {
            format!("\"{}\"", row.key.replace('"', "\"\""))
        } else {
            row.key.clone()
        };
        out.push_str(&format!("{tag},{:.6}\n", row.bytes as f64 / MIB));
    }
    out
}

/// The stacks of the allocations of the module view's `(untagged)` row (neither a recorded
/// tag nor one their frames give), biggest first: they add up to that row.
pub fn untagged_log(report: &Report, device: &DeviceReport) -> String {
    let mut by_stack: HashMap<u32, (u64, u64)> = HashMap::new();
    let live = device.peak.live.iter().enumerate();
    for (_, l) in live.filter(|(i, _)| device.modules.key_of(*i) == UNTAGGED) {
        let entry = by_stack.entry(l.stack).or_default();
        entry.0 += l.bytes;
        entry.1 += 1;
    }
    let mut stacks: Vec<(u32, (u64, u64))> = by_stack.into_iter().collect();
    stacks.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    let mut out = String::new();
    for (stack, (bytes, count)) in stacks {
        out.push_str(&format!(
            "Untagged: {:.6} MiB in {count} allocation(s), allocated at:\n",
            bytes as f64 / MIB
        ));
        let frames = report.trace.frames_of(stack);
        if frames.is_empty() {
            out.push_str("  (no Python stack)\n");
        }
        for &f in frames {
            let frame = report.trace.frames[f as usize];
            out.push_str(&format!(
                "  {}:{} ({})\n",
                report.paths.show(report.trace.text(frame.filename)),
                frame.line,
                report.trace.text(frame.name)
            ));
        }
    }
    out
}

/// One device of the report as JSON.
#[derive(Serialize)]
struct DeviceJson<'a> {
    device: String,
    max_mem: u64,
    total_allocated: u64,
    start_allocated: u64,
    end_allocated: u64,
    peak_time_us: i64,
    locations: &'a [Row],
    modules: &'a [Row],
    notices: Vec<String>,
}

/// The report as JSON.
#[derive(Serialize)]
struct ReportJson<'a> {
    source: Source,
    /// The key of what was alive before recording began.
    untraced: &'static str,
    devices: Vec<DeviceJson<'a>>,
}

/// The whole report: per device the peak figures, the rows by location and by tag, notices.
pub fn json(report: &Report) -> String {
    let devices = report
        .devices
        .iter()
        .map(|d| DeviceJson {
            device: report.device_name(d.device),
            max_mem: d.peak.max_bytes,
            total_allocated: d.peak.total_allocated,
            start_allocated: d.peak.start_bytes,
            end_allocated: d.peak.end_bytes,
            peak_time_us: d.peak.peak_time_us,
            locations: &d.rows,
            modules: &d.tags,
            notices: report.notices(d),
        })
        .collect();
    to_json(&ReportJson {
        source: report.trace.source,
        untraced: UNTRACED,
        devices,
    })
}
