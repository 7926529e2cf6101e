//! The tensor diff tracker's renderers: the original's log text, and HTML. A `track()`'s
//! result in, a string out.

pub mod html;
pub mod text;

use super::diff::DiffRow;
use super::result::Track;

fn rows(track: &Track) -> Vec<DiffRow> {
    track.rows.iter().map(|r| r.diff_row()).collect()
}

/// The log block of one `track()`, as the log file has it: the header line first on the
/// first call (`stamp`), the rows when `detail`, the `At ...` line, and a note when the
/// result may be incomplete. Its figures are the storages' own bytes, as the original's.
pub fn log_block(track: &Track) -> String {
    let mut out = String::new();
    if let Some(stamp) = &track.stamp {
        out.push_str(&text::header(
            stamp,
            track.total_storage_bytes,
            track.allocated_bytes,
        ));
    }
    out.push_str(&text::block(
        &rows(track),
        track.detail,
        &track.place,
        track.total_storage_bytes,
        track.allocated_bytes,
    ));
    if let Some(why) = track.incomplete.as_deref().filter(|why| !why.is_empty()) {
        out.push_str(&format!("Note: {why}\n\n"));
    }
    out
}

/// One `track()` as an HTML table: every row (its storages' own bytes beside the
/// allocator's), the place, the totals, the note.
pub fn table(track: &Track) -> String {
    let totals = html::Totals {
        storage_bytes: track.total_storage_bytes,
        bytes: track.total_bytes,
        allocated_bytes: track.allocated_bytes,
    };
    html::render(
        &rows(track),
        &track.place,
        &totals,
        track.incomplete.as_deref(),
    )
}
