//! A yield's and a restore's report as one message: what moved, how fast, and per device
//! what is still allocated and why (at most five unmovable tensors each). Sizes in
//! pytorch_memlab's form (`readable_size`), times in ms and rates in GB/s to one decimal.

use crate::courtesy::result::{RestoreReport, YieldReport};
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
}
