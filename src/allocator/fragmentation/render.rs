//! The fragmentation result as text and as an HTML fragment: a result in, a string out.
//! The doctor renders it whole; the CUDA tensor report embeds the same fragment.

use super::result::{Fragmentation, Outcome, PoolRow, Scenario, SegmentRow, Verdict};
use crate::text::escape::escape;
use crate::text::size::human_bytes;

/// Segments listed in full up to this many; beyond it, those with the most free bytes.
const SEGMENTS_SHOWN: usize = 10;

fn b(n: u64) -> String {
    human_bytes(n as i128)
}

/// Exact bytes with the human form: "31457280 bytes (30.0 MiB)".
fn exact(n: u64) -> String {
    format!("{n} bytes ({})", b(n))
}

fn pool_id(id: [u64; 2]) -> String {
    if id == [0, 0] {
        "default".into()
    } else {
        format!("{},{}", id[0], id[1])
    }
}

/// Columns padded to their widest cell, the first left-aligned, the others right-aligned.
fn columns(rows: &[Vec<String>], indent: &str) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::from(indent);
        for (i, cell) in row.iter().enumerate() {
            if i == 0 {
                line.push_str(&format!("{cell:<w$}", w = widths[i]));
            } else {
                line.push_str(&format!("  {cell:>w$}", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn pool_cells(p: &PoolRow) -> Vec<String> {
    vec![
        p.pool.clone(),
        pool_id(p.pool_id),
        p.stream.to_string(),
        p.segments.to_string(),
        b(p.reserved_bytes),
        b(p.allocated_bytes),
        b(p.pending_free_bytes),
        b(p.free_bytes),
        p.free_blocks.to_string(),
        b(p.largest_free),
        b(p.inactive_split_bytes),
    ]
}

const POOL_HEAD: [&str; 11] = [
    "pool",
    "pool id",
    "stream",
    "segments",
    "reserved",
    "allocated",
    "pending free",
    "free",
    "free blocks",
    "largest free",
    "inactive split",
];

fn segment_cells(s: &SegmentRow) -> Vec<String> {
    vec![
        format!("{:#x}", s.address),
        s.pool.clone(),
        s.stream.to_string(),
        b(s.size),
        s.blocks.to_string(),
        b(s.allocated_bytes),
        b(s.free_bytes),
        b(s.largest_free),
        if s.expandable { "yes" } else { "" }.to_string(),
    ]
}

const SEGMENT_HEAD: [&str; 9] = [
    "segment",
    "pool",
    "stream",
    "size",
    "blocks",
    "allocated",
    "free",
    "largest free",
    "expandable",
];

/// The segments shown: all when few, else those with the most free bytes.
fn shown_segments(f: &Fragmentation) -> (Vec<&SegmentRow>, String) {
    let mut rows: Vec<&SegmentRow> = f.segments.iter().collect();
    if rows.len() <= SEGMENTS_SHOWN {
        let title = format!("segments ({})", rows.len());
        return (rows, title);
    }
    rows.sort_by(|a, b| {
        b.free_bytes
            .cmp(&a.free_bytes)
            .then(a.address.cmp(&b.address))
    });
    rows.truncate(SEGMENTS_SHOWN);
    (
        rows,
        format!(
            "segments (the {SEGMENTS_SHOWN} with the most free bytes of {})",
            f.segments.len()
        ),
    )
}

fn settings_line(f: &Fragmentation) -> String {
    let s = &f.settings;
    let split = match s.max_split_size {
        Some(m) => format!("max_split_size {}", b(m)),
        None => "max_split_size unlimited".into(),
    };
    let exp = if s.expandable_segments { "on" } else { "off" };
    format!("{split}, expandable_segments {exp}")
}

/// One scenario in words, with its numbers.
pub fn scenario_text(s: &Scenario) -> String {
    let how = if s.setting.is_empty() {
        "as configured".to_string()
    } else {
        format!("with {}", s.setting)
    };
    let est = if s.estimate { " (estimate)" } else { "" };
    let room = match s.headroom_bytes {
        Some(h) => format!("the device could give {}", b(h)),
        None => "the device's free memory is unknown".into(),
    };
    let body = match s.outcome {
        Outcome::ReusesCachedBlock => match (s.block, s.block_size) {
            (Some(a), Some(size)) => format!("fits in the cached block of {} at {a:#x}", b(size)),
            (_, Some(size)) => format!("fits in a cached block of {}", b(size)),
            _ => "fits in a cached block".into(),
        },
        Outcome::GrowsCache => format!("fits: the cache grows by {} ({room})", b(s.device_bytes)),
        Outcome::GrowsAfterRelease => format!(
            "fits after the allocator gives back {} of cached memory and takes {} ({room})",
            b(s.released_bytes),
            b(s.device_bytes)
        ),
        Outcome::OutOfMemory => format!(
            "out of memory: it needs {} from the device; {room}, and the allocator can give back only {}",
            b(s.device_bytes),
            b(s.released_bytes)
        ),
        Outcome::NeedsDeviceMemory => format!(
            "needs {} from the device after giving back {}; {room}",
            b(s.device_bytes),
            b(s.released_bytes)
        ),
    };
    format!("{how}{est}: {body}")
}

/// The request's verdict as text lines.
pub fn verdict_text(v: &Verdict) -> String {
    let mut out = format!(
        "request of {} on stream {}, {} pool ({}), rounded to {}:\n",
        exact(v.request.size),
        v.request.stream,
        v.pool,
        pool_id(v.request.pool_id),
        b(v.rounded_bytes)
    );
    if v.fragmented {
        out.push_str(&format!(
            "  fragmentation: {} free in this pool and stream, but the largest free block is {}\n",
            b(v.free_bytes),
            b(v.largest_free)
        ));
    } else {
        out.push_str(&format!(
            "  {} free in this pool and stream, largest free block {}\n",
            b(v.free_bytes),
            b(v.largest_free)
        ));
    }
    out.push_str(&format!("  {}\n", scenario_text(&v.configured)));
    for s in v.expandable.iter().chain(v.max_split.iter()) {
        out.push_str(&format!("  {}\n", scenario_text(s)));
    }
    out
}

/// The whole result as text.
pub fn text(f: &Fragmentation) -> String {
    let mut out = format!("Fragmentation of {} ({})\n", f.device, settings_line(f));
    out.push_str(&format!(
        "reserved {} = allocated {} + free in the cache {} + pending free {}\n",
        b(f.reserved_bytes),
        b(f.allocated_bytes),
        b(f.free_bytes),
        b(f.pending_free_bytes)
    ));
    let reported = match f.reported.inactive_split_bytes {
        Some(r) => format!(" (memory_stats: {})", b(r)),
        None => String::new(),
    };
    out.push_str(&format!(
        "inactive split: {}{reported}: free bytes in split segments, which empty_cache() cannot give back\n",
        b(f.inactive_split_bytes)
    ));
    match &f.largest_free {
        Some(l) => out.push_str(&format!(
            "largest free block: {} ({} pool, stream {}, segment {:#x})\n",
            b(l.size),
            l.pool,
            l.stream,
            l.segment
        )),
        None => out.push_str("largest free block: none\n"),
    }
    out.push_str(&format!(
        "with expandable_segments:True: {} of the free bytes lie in whole pages it could unmap and map again; the blocks in use, packed, would reserve {}\n",
        b(f.expandable.reclaimable_bytes),
        b(f.expandable.packed_reserved_bytes)
    ));
    if !f.pools.is_empty() {
        out.push_str("\nby pool and stream:\n");
        let mut rows = vec![POOL_HEAD.iter().map(|s| s.to_string()).collect()];
        rows.extend(f.pools.iter().map(pool_cells));
        out.push_str(&columns(&rows, "  "));
    }
    if !f.free_sizes.is_empty() {
        out.push_str("\nfree blocks by size:\n");
        let mut rows = vec![vec!["size".to_string(), "blocks".into(), "bytes".into()]];
        rows.extend(f.free_sizes.iter().map(|r| {
            vec![
                format!("{} to {}", b(r.from), b(r.to)),
                r.blocks.to_string(),
                b(r.bytes),
            ]
        }));
        out.push_str(&columns(&rows, "  "));
    }
    if !f.segments.is_empty() {
        let (rows_shown, title) = shown_segments(f);
        out.push_str(&format!("\n{title}:\n"));
        let mut rows = vec![SEGMENT_HEAD.iter().map(|s| s.to_string()).collect()];
        rows.extend(rows_shown.into_iter().map(segment_cells));
        out.push_str(&columns(&rows, "  "));
    }
    if let Some(v) = &f.request {
        out.push('\n');
        out.push_str(&verdict_text(v));
    }
    for n in &f.notices {
        out.push_str(&format!("notice: {n}\n"));
    }
    out
}

fn html_table(out: &mut String, caption: &str, head: &[&str], rows: Vec<Vec<String>>) {
    out.push_str(&format!(
        "<table class=\"memlab-fragmentation\"><caption>{}</caption><thead><tr>",
        escape(caption)
    ));
    for h in head {
        out.push_str(&format!("<th>{}</th>", escape(h)));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            out.push_str(&format!("<td>{}</td>", escape(&cell)));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
}

/// The result as an HTML fragment (a `<div>`; embeddable in another report).
pub fn html(f: &Fragmentation) -> String {
    let mut out = String::from("<div class=\"memlab-fragmentation\">");
    out.push_str(&format!(
        "<h4>Fragmentation of {} ({})</h4><ul>",
        escape(&f.device),
        escape(&settings_line(f))
    ));
    for line in text(f).lines().skip(1).take_while(|l| !l.is_empty()) {
        out.push_str(&format!("<li>{}</li>", escape(line)));
    }
    out.push_str("</ul>");
    if !f.pools.is_empty() {
        html_table(
            &mut out,
            "by pool and stream",
            &POOL_HEAD,
            f.pools.iter().map(pool_cells).collect(),
        );
    }
    if !f.free_sizes.is_empty() {
        let rows = f
            .free_sizes
            .iter()
            .map(|r| {
                vec![
                    format!("{} to {}", b(r.from), b(r.to)),
                    r.blocks.to_string(),
                    b(r.bytes),
                ]
            })
            .collect();
        html_table(
            &mut out,
            "free blocks by size",
            &["size", "blocks", "bytes"],
            rows,
        );
    }
    if !f.segments.is_empty() {
        let (rows, title) = shown_segments(f);
        html_table(
            &mut out,
            &title,
            &SEGMENT_HEAD,
            rows.into_iter().map(segment_cells).collect(),
        );
    }
    if let Some(v) = &f.request {
        out.push_str("<ul>");
        for line in verdict_text(v).lines() {
            out.push_str(&format!("<li>{}</li>", escape(line.trim())));
        }
        out.push_str("</ul>");
    }
    for n in &f.notices {
        out.push_str(&format!("<p class=\"notice\">notice: {}</p>", escape(n)));
    }
    out.push_str("</div>");
    out
}

/// The segments as CSV, one row each (exact bytes), for a spreadsheet.
pub fn csv(f: &Fragmentation) -> String {
    let mut out = String::from(
        "address,pool,pool_id,stream,expandable,size,blocks,allocated_bytes,pending_free_bytes,free_bytes,largest_free\n",
    );
    for s in &f.segments {
        out.push_str(&format!(
            "{},{},{}:{},{},{},{},{},{},{},{},{}\n",
            s.address,
            s.pool,
            s.pool_id[0],
            s.pool_id[1],
            s.stream,
            s.expandable,
            s.size,
            s.blocks,
            s.allocated_bytes,
            s.pending_free_bytes,
            s.free_bytes,
            s.largest_free
        ));
    }
    out
}

/// The result's data as indented JSON.
pub fn json(f: &Fragmentation) -> String {
    // Plain structs with string keys serialise without fail.
    serde_json::to_string_pretty(f).expect("a result serialises to JSON")
}
