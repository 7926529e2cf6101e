//! A post-mortem as text (the stderr summary is its first lines) and as HTML. Every figure
//! is exact bytes with a human size beside it.

use super::result::{PostMortem, Site};
use crate::allocator::fragmentation::render::verdict_text;
use crate::text::escape::escape;
use crate::text::size::{human_bytes, thousands};

/// Rows of each table shown; the saved result keeps more.
const SHOWN: usize = 10;

/// Bytes with thousands separators and a human size. Every count a post-mortem holds is at
/// most i64::MAX (its derive reads them with `count`).
fn exact(bytes: u64) -> String {
    format!(
        "{} B ({})",
        thousands(i64::try_from(bytes).unwrap_or(i64::MAX)),
        human_bytes(bytes as i128)
    )
}

fn heading(pm: &PostMortem) -> String {
    let rank = match (pm.rank, pm.world_size) {
        (Some(r), Some(w)) if w > 1 => format!(" (rank {r} of {w})"),
        _ => String::new(),
    };
    format!("Out of memory on {}{rank}", pm.device)
}

fn request_line(pm: &PostMortem) -> String {
    let r = &pm.request;
    let mut what = match (r.bytes, r.allocation_bytes) {
        (Some(b), Some(a)) if a != b => {
            format!(
                "{} (the allocator asked the driver for {})",
                exact(b),
                exact(a)
            )
        }
        (Some(b), _) => exact(b),
        (None, Some(a)) => format!("a request the allocator needed {} for", exact(a)),
        (None, None) => "an unknown size".to_string(),
    };
    if let Some(s) = r.stream {
        what.push_str(&format!(", stream {s}"));
    }
    if !r.pool.is_empty() && r.pool != "default" {
        what.push_str(&format!(", pool {}", r.pool));
    }
    format!("Asked for: {what}")
}

/// The first lines: what failed, where, and the advice (what stderr shows).
pub fn summary(pm: &PostMortem) -> String {
    let mut lines = vec![heading(pm)];
    if !pm.error.is_empty() {
        lines.push(format!("  {}", pm.error));
    }
    if let Some(f) = pm.stack.last() {
        lines.push(format!("  at {}:{} ({})", f.file, f.line, f.function));
    }
    lines.push(format!("  {}", request_line(pm)));
    if let Some(c) = &pm.cuda {
        let used = c.total.saturating_sub(c.driver_free);
        lines.push(format!(
            "  Device: {} total, {} free; torch reserved {}, allocated {}; {} outside torch",
            human_bytes(c.total as i128),
            human_bytes(c.driver_free as i128),
            human_bytes(c.reserved as i128),
            human_bytes(c.allocated as i128),
            human_bytes(used.saturating_sub(c.reserved) as i128),
        ));
    }
    for a in &pm.advice {
        lines.push(format!("  - {}", a.text));
    }
    lines.join("\n") + "\n"
}

fn sites(title: &str, rows: &[Site], lines: &mut Vec<String>) {
    if rows.is_empty() {
        return;
    }
    lines.push(format!("{title}:"));
    for s in rows.iter().take(SHOWN) {
        lines.push(format!(
            "  {:>22}  {:>6}  {}",
            exact(s.bytes),
            s.count,
            s.location
        ));
    }
    if rows.len() > SHOWN {
        lines.push(format!("  ... {} more", rows.len() - SHOWN));
    }
}

/// The whole post-mortem as text.
pub fn text(pm: &PostMortem) -> String {
    let mut lines = vec![heading(pm)];
    if !pm.error.is_empty() {
        lines.push(format!("  {}", pm.error));
    }
    lines.push(request_line(pm));
    if !pm.stack.is_empty() {
        lines.push("Where (innermost last):".into());
        for f in pm.stack.iter().rev().take(SHOWN).rev() {
            lines.push(format!("  {}:{} ({})", f.file, f.line, f.function));
        }
    }
    if let Some(c) = &pm.cuda {
        let used = c.total.saturating_sub(c.driver_free);
        lines.push("Device:".into());
        lines.push(format!("  total                 {}", exact(c.total)));
        lines.push(format!("  in use (driver)       {}", exact(used)));
        if let Some(p) = c.process_used {
            lines.push(format!("    this process        {}", exact(p)));
            lines.push(format!(
                "    other processes     {}",
                exact(used.saturating_sub(p))
            ));
        }
        lines.push(format!("  free (driver)         {}", exact(c.driver_free)));
        lines.push(format!("  torch reserved        {}", exact(c.reserved)));
        lines.push(format!("  torch allocated       {}", exact(c.allocated)));
        lines.push(format!(
            "  free in reserved      {}",
            exact(c.reserved.saturating_sub(c.allocated))
        ));
        lines.push(format!(
            "  inactive split        {}",
            exact(c.inactive_split)
        ));
        lines.push(format!(
            "  outside torch         {}",
            exact(used.saturating_sub(c.reserved))
        ));
        if let Some(f) = &pm.fragmentation {
            lines.push(format!(
                "  settings              expandable_segments:{}{}",
                if f.settings.expandable_segments {
                    "True"
                } else {
                    "False"
                },
                f.settings
                    .max_split_size
                    .map(|m| format!(", max_split_size_mb:{}", m >> 20))
                    .unwrap_or_default()
            ));
        }
    }
    if let Some(h) = &pm.host {
        lines.push("Host:".into());
        for (name, v) in [
            ("address-space limit", h.address_space_limit),
            ("address space", h.address_space),
            ("resident", h.resident),
            ("available (machine)", h.available),
        ] {
            if let Some(v) = v {
                lines.push(format!("  {name:<22}{}", exact(v)));
            }
        }
    }
    if let Some(f) = &pm.fragmentation {
        if !f.pools.is_empty() {
            lines.push("Free blocks by pool and stream:".into());
            for p in &f.pools {
                lines.push(format!(
                    "  {} pool {:?}, stream {}: {} segments, reserved {}, free {}, largest \
                     free block {}",
                    p.pool,
                    p.pool_id,
                    p.stream,
                    p.segments,
                    human_bytes(p.reserved_bytes as i128),
                    exact(p.free_bytes),
                    exact(p.largest_free)
                ));
            }
        }
        if let Some(v) = &f.request {
            lines.push("The request replayed through the allocator:".into());
            for l in verdict_text(v).lines() {
                lines.push(format!("  {l}"));
            }
        }
    }
    lines.push(format!(
        "Alive: {} tensors Python can reach, {}",
        pm.tensor_count,
        exact(pm.tensor_bytes)
    ));
    if let Some(c) = &pm.cuda {
        lines.push(format!(
            "  not reachable from Python (saved for backward, C++ buffers): {}",
            exact(c.allocated.saturating_sub(pm.tensor_bytes))
        ));
    }
    for t in pm.tensors.iter().take(SHOWN) {
        lines.push(format!(
            "  {:>22}  {:<12} {:<20} {}",
            exact(t.bytes),
            t.dtype,
            format!("{:?}", t.shape),
            t.name
        ));
    }
    if pm.tensors.len() > SHOWN {
        lines.push(format!("  ... {} more", pm.tensors.len() - SHOWN));
    }
    if let Some(a) = &pm.autograd {
        lines.push(format!(
            "Autograd: {} in {} saved tensors over {} graph nodes{}",
            exact(a.saved_bytes),
            a.saved_count,
            a.nodes,
            if a.complete {
                ""
            } else {
                " (the walk stopped at its bound)"
            }
        ));
    }
    sites("Alive by line (history)", &pm.by_line, &mut lines);
    sites("Alive by module (history)", &pm.by_module, &mut lines);
    if !pm.advice.is_empty() {
        lines.push("Advice:".into());
        for a in &pm.advice {
            lines.push(format!("  - {}", a.text));
        }
    }
    for n in &pm.notices {
        lines.push(format!("Notice: {n}"));
    }
    lines.join("\n") + "\n"
}

/// The post-mortem as an HTML fragment: the text's sections, each a block.
pub fn html(pm: &PostMortem) -> String {
    let mut out = format!(
        "<div class=\"memlab-postmortem\"><h3>{}</h3>",
        escape(&heading(pm))
    );
    if !pm.advice.is_empty() {
        out.push_str("<h4>Advice</h4><ul>");
        for a in &pm.advice {
            out.push_str(&format!("<li>{}</li>", escape(&a.text)));
        }
        out.push_str("</ul>");
    }
    out.push_str(&format!("<pre>{}</pre></div>", escape(&text(pm))));
    out
}
