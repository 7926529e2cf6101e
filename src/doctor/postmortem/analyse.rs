//! What a post-mortem's figures mean: advice computed from them. Nothing here is canned:
//! each piece is given only when the numbers say it applies, and names the bytes it is
//! about. Whether the request was a victim of fragmentation, and whether expandable
//! segments or a `max_split_size_mb` would have let it fit, is the allocator floor's
//! verdict (`allocator::fragmentation`: torch's malloc path replayed on the snapshot taken
//! at the failing allocation); this module turns it and the other figures into advice.

use super::result::{Advice, PostMortem};
use crate::allocator::fragmentation::result::{Outcome, Scenario};
use crate::text::size::human_bytes;

fn size(bytes: u64) -> String {
    human_bytes(bytes as i128)
}

/// The post-mortem with its advice computed from its facts.
pub fn complete(mut pm: PostMortem) -> PostMortem {
    pm.advice = advice(&pm);
    pm
}

fn fits(s: &Option<Scenario>) -> Option<&Scenario> {
    s.as_ref().filter(|s| s.outcome.fits() == Some(true))
}

/// Advice from the figures, most specific first.
pub fn advice(pm: &PostMortem) -> Vec<Advice> {
    let mut out = Vec::new();
    let verdict = pm.fragmentation.as_ref().and_then(|f| f.request.as_ref());
    if let (Some(cuda), Some(v)) = (pm.cuda.as_ref(), verdict) {
        let need = v.rounded_bytes;
        if v.fragmented {
            out.push(Advice {
                kind: "fragmentation".into(),
                text: format!(
                    "Fragmentation: the {} pool of this stream had {} free in its reserved \
                     segments, more than the {} asked for, but its largest free block was \
                     {}: no block fitted.",
                    v.pool,
                    size(v.free_bytes),
                    size(need),
                    size(v.largest_free)
                ),
                bytes: Some(v.free_bytes),
            });
        }
        if let Some(s) = fits(&v.expandable) {
            out.push(Advice {
                kind: "expandable_segments".into(),
                text: format!(
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would have let it fit: \
                     the allocator could give back {} of wholly free pages of its segments \
                     and map the {} the request needs where it needs them.",
                    size(s.released_bytes),
                    size(s.device_bytes)
                ),
                bytes: Some(s.released_bytes),
            });
        }
        if let Some(s) = fits(&v.max_split) {
            out.push(Advice {
                kind: "max_split_size".into(),
                text: format!(
                    "PYTORCH_CUDA_ALLOC_CONF={} would {}let it fit: blocks above that size are \
                     kept whole for requests above it{}.",
                    s.setting,
                    if v.expandable.is_some() && fits(&v.expandable).is_some() {
                        "also "
                    } else {
                        ""
                    },
                    if s.estimate {
                        " (an estimate: it assumes the program allocated what it allocated \
                         before with the setting on)"
                    } else {
                        ""
                    }
                ),
                bytes: None,
            });
        }
        // Free memory this stream or pool cannot use.
        let frag = pm
            .fragmentation
            .as_ref()
            .expect("the verdict is the fragmentation's");
        let elsewhere: u64 = frag
            .pools
            .iter()
            .filter(|p| p.stream != v.request.stream || p.pool_id != v.request.pool_id)
            .map(|p| p.free_bytes)
            .sum();
        if elsewhere >= need {
            out.push(Advice {
                kind: "other_streams".into(),
                text: format!(
                    "{} are free in segments of other streams or pools, which this request \
                     cannot use: torch.cuda.empty_cache() after synchronizing would return \
                     the unsplit ones to the driver.",
                    size(elsewhere)
                ),
                bytes: Some(elsewhere),
            });
        }
        let used = cuda.total.saturating_sub(cuda.driver_free);
        let outside = used.saturating_sub(cuda.reserved);
        if let Some(process) = cuda.process_used {
            let others = used.saturating_sub(process);
            if others >= need {
                out.push(Advice {
                    kind: "outside_allocator".into(),
                    text: format!(
                        "Other processes use {} of this device, more than the request: \
                         without them it would have fitted.",
                        size(others)
                    ),
                    bytes: Some(others),
                });
            }
        } else if outside >= need && outside > cuda.total / 10 {
            out.push(Advice {
                kind: "outside_allocator".into(),
                text: format!(
                    "{} of the device is used outside torch's caching allocator (other \
                     processes, the CUDA context, libraries' own buffers).",
                    size(outside)
                ),
                bytes: Some(outside),
            });
        }
        if !v.fragmented && v.configured.outcome == Outcome::OutOfMemory {
            out.push(Advice {
                kind: "capacity".into(),
                text: format!(
                    "The device was full: {} of {} in use ({} reserved by torch, of which \
                     {} allocated), {} free, and the request needed {}. Less must be \
                     alive at this point.",
                    size(used),
                    size(cuda.total),
                    size(cuda.reserved),
                    size(cuda.allocated),
                    size(cuda.driver_free),
                    size(need)
                ),
                bytes: Some(need.saturating_sub(cuda.driver_free)),
            });
        }
    }
    activations(pm, &mut out);
    if let Some(b) = &pm.batch {
        let text = if b.fits == 0 {
            format!(
                "No batch fits the budget of {}: even batch 1 needs more (estimate).",
                size(b.budget)
            )
        } else {
            format!(
                "Batch {} fits: its estimated peak is {} of the {} budget (this step ran \
                 batch {}).",
                b.fits,
                size(b.peak_at_fit),
                size(b.budget),
                b.current
            )
        };
        out.push(Advice {
            kind: "batch".into(),
            text,
            bytes: Some(b.peak_at_fit),
        });
    }
    out
}

fn activations(pm: &PostMortem, out: &mut Vec<Advice>) {
    let allocated = pm.cuda.as_ref().map(|c| c.allocated);
    if let Some(a) = pm.autograd.as_ref().filter(|a| a.saved_bytes > 0) {
        let share = allocated
            .filter(|&t| t > 0)
            .map(|t| {
                format!(
                    " ({:.0}% of allocated)",
                    a.saved_bytes as f64 * 100.0 / t as f64
                )
            })
            .unwrap_or_default();
        out.push(Advice {
            kind: "activations".into(),
            text: format!(
                "Autograd holds {} in {} tensors saved for backward{share}: the \
                 activations of the forward pass.",
                size(a.saved_bytes),
                a.saved_count
            ),
            bytes: Some(a.saved_bytes),
        });
    }
    let modules: Vec<_> = pm
        .by_module
        .iter()
        .filter(|m| m.bytes > 0)
        .take(3)
        .collect();
    if !modules.is_empty() && (pm.autograd.is_some() || pm.history) {
        let held: u64 = modules.iter().map(|m| m.bytes).sum();
        let names = modules
            .iter()
            .map(|m| format!("{} ({})", m.location, size(m.bytes)))
            .collect::<Vec<_>>()
            .join(", ");
        out.push(Advice {
            kind: "checkpointing".into(),
            text: format!(
                "The modules holding the most: {names}. Activation checkpointing of them \
                 (torch.utils.checkpoint) would keep only their inputs, freeing up to {} \
                 at this point.",
                size(held)
            ),
            bytes: Some(held),
        });
    }
}
