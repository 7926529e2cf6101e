//! The MemReporter table in pytorch_memlab's exact layout, then our CUDA accounting.

use std::fmt::Write;

use crate::tensor_report::result::{DeviceSection, TensorReport};
use crate::text::size::{human_bytes, memlab_bytes};

/// pytorch_memlab's rule width.
const RULE: usize = 79;

fn row(out: &mut String, name: &str, size: &str, mem: &str) {
    // pytorch_memlab: '{:<40s}{:>20s}{:>10s}'
    let _ = writeln!(out, "{name:<40}{size:>20}{mem:>10}");
}

fn rule(out: &mut String) {
    out.push_str(&"-".repeat(RULE));
    out.push('\n');
}

/// The report as pytorch_memlab's `MemReporter.report()` prints it. With `verbose`, a row
/// sharing another's storage shows `name(->owner)`. A report that may miss tensors ends
/// with a line that says why (`incomplete`).
pub fn render(report: &TensorReport, verbose: bool) -> String {
    let mut out = String::new();
    row(&mut out, "Element type", "Size", "Used MEM");
    for section in &report.sections {
        rule(&mut out);
        let _ = writeln!(out, "Storage on {}", section.device);
        for r in &section.rows {
            let name = match (&r.shared_with, verbose) {
                (Some(owner), true) => format!("{}(->{owner})", r.name),
                _ => r.name.clone(),
            };
            row(
                &mut out,
                &name,
                &r.shape_text,
                &memlab_bytes(r.bytes as i128),
            );
        }
        if section.omitted_rows > 0 {
            let label = format!("... {} more tensors", section.omitted_rows);
            row(
                &mut out,
                &label,
                "",
                &memlab_bytes(section.omitted_bytes as i128),
            );
        }
        rule(&mut out);
        let _ = writeln!(
            out,
            "Total Tensors: {} \tUsed Memory: {}",
            section.total_numel,
            memlab_bytes(section.total_bytes as i128)
        );
        if let Some(cuda) = section.cuda {
            let _ = writeln!(
                out,
                "The allocated memory on {}: {}",
                section.device,
                memlab_bytes(cuda.allocated as i128)
            );
            if cuda.allocated != section.total_bytes {
                out.push_str(
                    "Memory differs due to the matrix alignment or invisible gradient buffer tensors\n",
                );
            }
            accounting(&mut out, section);
        }
        rule(&mut out);
    }
    if let Some(why) = &report.incomplete {
        let _ = writeln!(out, "Incomplete: {why}");
    }
    out
}

/// The whole of `memory_allocated`, as a sum the reader can check.
fn accounting(out: &mut String, section: &DeviceSection) {
    let (Some(cuda), Some(rest)) = (section.cuda, section.remainder()) else {
        return;
    };
    let size = |n: i128| memlab_bytes(n);
    row(
        out,
        "  tensors listed above",
        "",
        &size(section.total_bytes as i128),
    );
    if cuda.requested.is_some() {
        row(
            out,
            "+ tensors Python cannot see",
            "",
            &size(rest.unseen_tensors),
        );
        row(out, "+ allocator rounding", "", &size(rest.rounding));
    } else {
        row(
            out,
            "+ memory Python cannot see",
            "",
            &size(rest.unseen_tensors),
        );
    }
    let total = format!("= torch.cuda.memory_allocated({})", section.device);
    row(out, &total, "", &size(cuda.allocated as i128));
    if rest.unseen_tensors != 0 {
        out.push_str(
            "  (tensors Python cannot see: autograd's saved activations, C++-held buffers)\n",
        );
    }
    if let Some(reserved) = cuda.reserved {
        let _ = write!(
            out,
            "Reserved by the caching allocator: {}",
            human_bytes(reserved as i128)
        );
        if let Some(paused) = cuda.paused_in_regions {
            let _ = write!(
                out,
                " ({} of it in paused Courtesy regions, with no device memory behind it)",
                human_bytes(paused as i128)
            );
        }
        if let Some((used, total)) = cuda.driver_used_total() {
            let _ = write!(
                out,
                "; in use by all processes (nvidia-smi): {} of {}",
                human_bytes(used as i128),
                human_bytes(total as i128)
            );
        }
        out.push('\n');
    }
    if let Some(f) = cuda.free_in_reserved {
        let _ = writeln!(
            out,
            "Free inside reserved segments: {} in {} segments, the largest free block {} \
             (the largest request that fits without growing the cache); {} of it in split \
             segments (empty_cache() cannot return those); memlab_rs.fragmentation() says where",
            human_bytes(f.free_bytes as i128),
            f.segments,
            human_bytes(f.largest_free as i128),
            human_bytes(f.inactive_split_bytes as i128),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_report::result::CudaAccounting;

    #[test]
    fn paused_regions_are_named_beside_what_torch_reserves() {
        let mut section = DeviceSection::empty("cuda:0");
        section.cuda = Some(CudaAccounting {
            allocated: 1 << 20,
            reserved: Some(8 << 20),
            paused_in_regions: Some(6 << 20),
            ..CudaAccounting::default()
        });
        let mut out = String::new();
        accounting(&mut out, &section);
        let expected = format!(
            "Reserved by the caching allocator: {} ({} of it in paused Courtesy regions, with \
             no device memory behind it)\n",
            human_bytes(8 << 20),
            human_bytes(6 << 20)
        );
        assert!(out.contains(&expected), "{out}");
        section.cuda.as_mut().unwrap().paused_in_regions = None;
        let mut out = String::new();
        accounting(&mut out, &section);
        assert!(!out.contains("paused"), "{out}");
    }
}
