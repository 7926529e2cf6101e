//! A merged line profile shown: what a view asks for of it (functions, columns), the cells
//! its text and HTML share (min, median and max as sizes, the rank of the max where the
//! ranks differ; the hits), and its records. `merged_text` and `merged_html` lay them out.

use crate::line_profiler::merge::{spread, Median, MergedLine, MergedLineProfile, Spread};
use crate::line_profiler::view::{indexes, pick_functions, View};
use crate::text::size::{memlab_bytes, memlab_size};

use super::records::{Cell, Table};

/// The part of a merged profile a view shows: its functions (indexes) and columns (names,
/// with their indexes in the profile).
pub struct Shown<'a> {
    pub profile: &'a MergedLineProfile,
    pub functions: Vec<usize>,
    pub columns: Vec<(String, usize)>,
}

/// What `view` shows of `profile`; `every`: the defaults are taken as asked (records),
/// not narrowed to those the profile has (text, HTML).
pub fn shown<'a>(
    profile: &'a MergedLineProfile,
    view: &View,
    every: bool,
) -> Result<Shown<'a>, String> {
    let names = view.pick_columns(&profile.columns, !every)?;
    let at = indexes(&names, &profile.columns);
    let chosen = pick_functions(view.func.as_deref(), &profile.names(), "merged profile")?;
    Ok(Shown {
        profile,
        functions: (0..chosen.len()).filter(|&i| chosen[i]).collect(),
        columns: names.into_iter().zip(at).collect(),
    })
}

/// `merged line profile: ranks 0, 1 of 2`.
pub fn heading(profile: &MergedLineProfile) -> String {
    let ranks: Vec<String> = profile.ranks.iter().map(u32::to_string).collect();
    format!(
        "merged line profile: ranks {} of {}",
        ranks.join(", "),
        profile.world_size
    )
}

/// One column's four cells: min, median, max as sizes, and the rank of the max only
/// where the ranks differ ("-" where they agree); four empty cells when no rank has it.
pub fn spread_cells(found: &Spread) -> [String; 4] {
    match (found.min, found.median, found.max) {
        (Some(min), Some(median), Some(max)) => {
            let median = match median {
                Median::Whole(n) => memlab_bytes(n),
                Median::Half(x) => memlab_size(x),
            };
            let rank = if min == max {
                "-".to_string()
            } else {
                found.max_rank.map_or(String::new(), |r| r.to_string())
            };
            [
                memlab_bytes(min.into()),
                median,
                memlab_bytes(max.into()),
                rank,
            ]
        }
        _ => Default::default(),
    }
}

/// The cells of every shown column on `line`.
pub fn value_cells(shown: &Shown<'_>, line: &MergedLine) -> Vec<String> {
    let mut cells = Vec::new();
    for &(_, index) in &shown.columns {
        let per_rank = MergedLineProfile::per_rank(line, index);
        cells.extend(spread_cells(&spread(&per_rank, &shown.profile.ranks)));
    }
    cells
}

/// The hits of a line across ranks: `3`, or `2-5` where they differ; empty where no rank
/// has the line.
pub fn hits_cell(hits: &[Option<u64>]) -> String {
    let counts: Vec<u64> = hits.iter().flatten().copied().collect();
    match (counts.iter().min(), counts.iter().max()) {
        (Some(low), Some(high)) if low == high => low.to_string(),
        (Some(low), Some(high)) => format!("{low}-{high}"),
        _ => String::new(),
    }
}

/// The records: function, line, code, `hits.min`, `hits.max`, and per column its `min`,
/// `median`, `max`, `max_rank` and `rank<R>` for each rank.
pub fn records(shown: &Shown<'_>) -> Table {
    let profile = shown.profile;
    let mut names: Vec<String> = ["function", "line", "code", "hits.min", "hits.max"]
        .map(String::from)
        .to_vec();
    for (column, _) in &shown.columns {
        for key in ["min", "median", "max", "max_rank"] {
            names.push(format!("{column}.{key}"));
        }
        names.extend(profile.ranks.iter().map(|r| format!("{column}.rank{r}")));
    }
    let mut rows = Vec::new();
    for &f in &shown.functions {
        let function = &profile.functions[f];
        for line in &function.lines {
            let counts: Vec<u64> = line.2.iter().flatten().copied().collect();
            let count = |c: Option<&u64>| c.map_or(Cell::None, |&c| Cell::Int(c.into()));
            let mut row = vec![
                Cell::Text(function.qualname.clone()),
                Cell::Int(line.0.into()),
                Cell::Text(line.1.clone()),
                count(counts.iter().min()),
                count(counts.iter().max()),
            ];
            for &(_, index) in &shown.columns {
                let per_rank = MergedLineProfile::per_rank(line, index);
                let found = spread(&per_rank, &profile.ranks);
                row.push(found.min.into());
                row.push(match found.median {
                    Some(Median::Whole(n)) => Cell::Int(n),
                    Some(Median::Half(x)) => Cell::Float(x),
                    None => Cell::None,
                });
                row.push(found.max.into());
                row.push(found.max_rank.map_or(Cell::None, |r| Cell::Int(r.into())));
                row.extend(per_rank.into_iter().map(Cell::from));
            }
            rows.push(row);
        }
    }
    Table { names, rows }
}

/// Python's whitespace (`str.strip()`), which also counts the separators \x1c-\x1f.
pub fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// `str.rstrip()`.
pub fn python_rstrip(text: &str) -> &str {
    text.trim_end_matches(python_space)
}
