//! A yield's and a restore's report as one message: what moved, how fast, and per device
//! what is still allocated and why (at most five unmovable tensors each). Sizes in
//! pytorch_memlab's form (`readable_size`), times in ms and rates in GB/s to one decimal.

use crate::courtesy::result::{RegionReport, RestoreReport, YieldReport};
use crate::text::size::memlab_size;

fn size(bytes: i64) -> String {
    memlab_size(bytes as f64)
}

/// Bytes per second in GB/s; 0 for a report that took no time.
fn rate(bytes: i64, seconds: f64) -> f64 {
    if seconds == 0.0 {
        0.0
    } else {
        bytes as f64 / seconds / 1e9
    }
}

fn incomplete(report: &YieldReport) -> Option<&str> {
    report.incomplete.as_deref().filter(|s| !s.is_empty())
}

/// The yield's report.
pub fn yield_text(r: &YieldReport) -> String {
    if !r.message.is_empty() {
        return match incomplete(r) {
            Some(why) => format!("{}\n  Incomplete: {why}", r.message),
            None => r.message.clone(),
        };
    }
    let mut lines = vec![format!(
        "Courtesy: moved {} storages, {}, to host memory in {:.1} ms ({:.1} GB/s)",
        r.moved_storages,
        size(r.moved_bytes),
        r.seconds * 1e3,
        rate(r.moved_bytes, r.seconds)
    )];
    let none = Vec::new();
    for (device, allocated) in &r.still_allocated {
        let unmovable = r.unmovable.get(device).unwrap_or(&none);
        let stuck = unmovable
            .iter()
            .fold(0i64, |a, (_, b)| a.saturating_add(*b));
        lines.push(format!(
            "  {device}: {} still allocated: {} that no Python tensor holds (saved for \
             backward, C++ buffers), {} in tensors that cannot move; {} still reserved",
            size(*allocated),
            size(r.invisible_bytes.get(device).copied().unwrap_or(0)),
            size(stuck),
            size(r.reserved.get(device).copied().unwrap_or(0)),
        ));
        for (reason, nbytes) in unmovable.iter().take(5) {
            lines.push(format!("    {}: {reason}", size(*nbytes)));
        }
    }
    if let Some(why) = incomplete(r) {
        lines.push(format!("  Incomplete: {why}"));
    }
    lines.join("\n")
}

/// The restore's report.
pub fn restore_text(r: &RestoreReport) -> String {
    if r.restored_storages == 0 && r.remaining_storages == 0 {
        return "Courtesy: nothing to restore".into();
    }
    format!(
        "Courtesy: restored {} storages, {}, in {:.1} ms ({:.1} GB/s); {} still on the host",
        r.restored_storages,
        size(r.restored_bytes),
        r.seconds * 1e3,
        rate(r.restored_bytes, r.seconds),
        r.remaining_storages
    )
}

fn tags_named(tags: &[String]) -> String {
    match tags {
        [] => "every region".into(),
        [one] => format!("region '{one}'"),
        many => format!(
            "regions {}",
            many.iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A region's pause or resume: what it gave back or took again, how fast, and per device
/// the driver's used memory before and after and what is still there.
pub fn region_text(r: &RegionReport) -> String {
    let name = tags_named(&r.tags);
    let mut lines = Vec::new();
    if r.segments == 0 && r.error.is_none() {
        let what = if r.action == "pause" {
            "nothing mapped to pause"
        } else {
            "nothing paused to resume"
        };
        lines.push(format!("Courtesy {}: {name}: {what}", r.action));
    } else {
        let (verb, moved) = if r.action == "pause" {
            ("gave back", "copied to host memory")
        } else {
            ("mapped again", "copied back")
        };
        lines.push(format!(
            "Courtesy {}: {name}: {verb} {} in {} segments, {} {moved} in {:.1} ms ({:.1} GB/s)",
            r.action,
            size(r.region_bytes),
            r.segments,
            size(r.moved_bytes),
            r.seconds * 1e3,
            rate(r.moved_bytes, r.seconds),
        ));
        if r.discarded_bytes > 0 {
            lines.push(format!(
                "  not copied: {} (free blocks of the caching allocator, or contents marked \
                 disposable)",
                size(r.discarded_bytes)
            ));
        }
        if r.pinned_bytes > 0 {
            lines.push(format!(
                "  pinned {} of host buffers during the call ({:.1} ms)",
                size(r.pinned_bytes),
                r.pin_seconds * 1e3
            ));
        }
    }
    for (device, used_after) in &r.device_used_after {
        let before = r.device_used_before.get(device).copied().flatten();
        let mut line = format!("  {device}: device memory in use (all processes)");
        match (before, used_after) {
            (Some(b), Some(a)) => line.push_str(&format!(" {} -> {}", size(b), size(*a))),
            _ => line.push_str(" not known (no driver reading)"),
        }
        lines.push(line);
        for (what, nbytes) in r.remaining.get(device).into_iter().flatten() {
            lines.push(format!("    {}: {what}", size(*nbytes)));
        }
    }
    if r.left_paused_bytes > 0 {
        lines.push(format!(
            "  still paused: {} (call resume again when the device has room)",
            size(r.left_paused_bytes)
        ));
    }
    if let Some(error) = &r.error {
        lines.push(format!("  stopped early: {error}"));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_yield_says_what_moved_and_what_stayed() {
        let mut r = YieldReport {
            moved_storages: 3,
            moved_bytes: 4 << 20,
            seconds: 0.002,
            ..Default::default()
        };
        r.still_allocated.insert("cuda:0".into(), 3 << 20);
        r.invisible_bytes.insert("cuda:0".into(), 1 << 20);
        r.reserved.insert("cuda:0".into(), 4 << 20);
        let reasons: Vec<(String, i64)> = (0..7)
            .map(|i| (format!("a sparse tensor ({i},)"), 1 << 18))
            .collect();
        r.unmovable.insert("cuda:0".into(), reasons);
        let text = yield_text(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "Courtesy: moved 3 storages, 4.00M, to host memory in 2.0 ms (2.1 GB/s)"
        );
        assert_eq!(
            lines[1],
            "  cuda:0: 3.00M still allocated: 1.00M that no Python tensor holds (saved for \
             backward, C++ buffers), 1.75M in tensors that cannot move; 4.00M still reserved"
        );
        assert_eq!(lines.len(), 2 + 5); // five reasons at most
        assert_eq!(lines[2], "    256.00K: a sparse tensor (0,)");
        r.incomplete = Some("a collection ran".into());
        assert!(yield_text(&r).ends_with("\n  Incomplete: a collection ran"));
        let nothing = YieldReport {
            message: "Courtesy: no CUDA tensors to move".into(),
            ..Default::default()
        };
        assert_eq!(yield_text(&nothing), "Courtesy: no CUDA tensors to move");
    }

    #[test]
    fn a_restore_says_what_came_back() {
        assert_eq!(
            restore_text(&RestoreReport::default()),
            "Courtesy: nothing to restore"
        );
        let r = RestoreReport {
            restored_storages: 2,
            restored_bytes: 2 << 20,
            seconds: 0.0,
            remaining_storages: 1,
            remaining_bytes: 10,
        };
        assert_eq!(
            restore_text(&r),
            "Courtesy: restored 2 storages, 2.00M, in 0.0 ms (0.0 GB/s); 1 still on the host"
        );
    }

    #[test]
    fn a_region_report_says_what_was_given_back_and_what_remains() {
        let mut r = RegionReport {
            action: "pause".into(),
            tags: vec!["train".into()],
            segments: 3,
            region_bytes: 60 << 20,
            moved_bytes: 40 << 20,
            discarded_bytes: 20 << 20,
            seconds: 0.002,
            ..Default::default()
        };
        r.device_used_before
            .insert("cuda:0".into(), Some(100 << 20));
        r.device_used_after.insert("cuda:0".into(), Some(40 << 20));
        r.remaining
            .insert("cuda:0".into(), vec![("the CUDA context".into(), 30 << 20)]);
        let text = region_text(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "Courtesy pause: region 'train': gave back 60.00M in 3 segments, 40.00M copied to \
             host memory in 2.0 ms (21.0 GB/s)"
        );
        assert!(lines[1].starts_with("  not copied: 20.00M"), "{text}");
        assert_eq!(
            lines[2],
            "  cuda:0: device memory in use (all processes) 100.00M -> 40.00M"
        );
        assert_eq!(lines[3], "    30.00M: the CUDA context");
        let idle = RegionReport {
            action: "resume".into(),
            ..Default::default()
        };
        assert_eq!(
            region_text(&idle),
            "Courtesy resume: every region: nothing paused to resume"
        );
        let stuck = RegionReport {
            action: "resume".into(),
            tags: vec!["a".into(), "b".into()],
            left_paused_bytes: 2 << 20,
            error: Some("cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY".into()),
            ..Default::default()
        };
        let text = region_text(&stuck);
        assert!(
            text.starts_with("Courtesy resume: regions 'a', 'b': mapped again 0.00B"),
            "{text}"
        );
        assert!(text.contains("still paused: 2.00M"), "{text}");
        assert!(text.ends_with("stopped early: cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY"));
    }
}
