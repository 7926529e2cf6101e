//! The plan as a text table: one row per estimate, the baseline first; sizes in IEC units
//! (the exact bytes are in the result's data); then which choice saves the most, and the
//! notes.

use super::result::{Choice, Plan};
use crate::estimate::result::mode_label;
use crate::text::size::human_bytes;

const HEAD: [&str; 9] = [
    "changed",
    "size",
    "precision",
    "checkpointing",
    "optimizer",
    "peak allocated",
    "peak reserved",
    "vs baseline",
    "fits",
];

pub fn text(plan: &Plan) -> String {
    let mut out = format!("What-if plan: {} on {}", plan.model, plan.device);
    match plan.budget {
        Some(budget) => out.push_str(&format!(
            ", budget {} ({})\n",
            human_bytes(budget.into()),
            plan.budget_source
        )),
        None => out.push_str(", no budget\n"),
    }
    let baseline = plan.rows.first().and_then(|r| r.peak_reserved);
    let searched = plan.rows.iter().any(|r| r.largest_size.is_some());
    let parallel = plan.world_size > 1;
    let mut head: Vec<String> = HEAD.iter().map(|h| h.to_string()).collect();
    head[1] = plan.size_name.clone();
    if parallel {
        head.insert(5, "parallel".into());
    }
    if searched {
        head.push(format!("largest {} that fits", plan.size_name));
    }
    let mut table = vec![head];
    let mut errors = Vec::new();
    for (i, row) in plan.rows.iter().enumerate() {
        let mut cells = vec![
            row.axis.clone(),
            row.size.to_string(),
            row.precision.clone(),
            if row.checkpointing { "on" } else { "off" }.to_string(),
            row.optimizer.clone(),
        ];
        if parallel {
            cells.push(mode(row));
        }
        match (row.peak_allocated, row.peak_reserved) {
            (Some(allocated), Some(reserved)) => {
                cells.push(human_bytes(allocated.into()));
                cells.push(human_bytes(reserved.into()));
                cells.push(versus(i, reserved, baseline));
                cells.push(fits(row, plan.budget));
                if searched {
                    cells.push(largest(row, plan.limit));
                }
            }
            _ => {
                cells.push(format!("no estimate [{}]", errors.len() + 1));
                errors.push(row.error.clone().unwrap_or_default());
            }
        }
        table.push(cells);
    }
    out.push_str(&aligned(&table, if parallel { 6 } else { 5 }));
    match (plan.best.and_then(|b| plan.rows.get(b)), baseline) {
        (Some(row), Some(base)) => {
            let reserved = row.peak_reserved.unwrap_or(base);
            out.push_str(&format!(
                "Saves the most: {} {}: peak reserved {} ({})",
                row.axis,
                setting(row),
                human_bytes(i128::from(reserved) - i128::from(base)),
                percent(reserved, base)
            ));
            if row.largest_size.is_some() {
                out.push_str(&format!(
                    ", largest {} {}",
                    plan.size_name,
                    largest(row, plan.limit)
                ));
            }
            out.push('\n');
        }
        _ => out.push_str("Saves the most: no choice lowers the baseline's peak\n"),
    }
    for (i, error) in errors.iter().enumerate() {
        out.push_str(&format!("[{}] {error}\n", i + 1));
    }
    for note in &plan.notes {
        out.push_str(&format!("Note: {note}\n"));
    }
    out
}

/// The value of the row's axis ("checkpointing on", "AdamW fused", "amp-bf16", "16").
fn setting(row: &Choice) -> String {
    match row.axis.as_str() {
        "size" => row.size.to_string(),
        "precision" => row.precision.clone(),
        "checkpointing" => if row.checkpointing { "on" } else { "off" }.to_string(),
        "parallel" => mode(row),
        _ => row.optimizer.clone(),
    }
}

/// The row's data-parallel mode as the table names it.
fn mode(row: &Choice) -> String {
    row.parallel.as_deref().map_or("-", mode_label).to_string()
}

fn versus(i: usize, reserved: u64, baseline: Option<u64>) -> String {
    match baseline {
        Some(base) if i > 0 => percent(reserved, base),
        _ => "-".into(),
    }
}

fn percent(value: u64, base: u64) -> String {
    if base == 0 {
        return "-".into();
    }
    format!("{:+.1}%", (value as f64 / base as f64 - 1.0) * 100.0)
}

/// The largest size that fits; "N+" at the search's limit (a larger one may fit too).
fn largest(row: &Choice, limit: u64) -> String {
    match row.largest_size {
        Some(n) if n >= limit => format!("{n}+"),
        Some(n) => n.to_string(),
        None => "-".into(),
    }
}

fn fits(row: &Choice, budget: Option<u64>) -> String {
    match (row.peak_reserved, budget) {
        (Some(reserved), Some(budget)) if reserved <= budget => "yes".into(),
        (Some(_), Some(_)) => "no".into(),
        _ => "-".into(),
    }
}

/// Columns padded to their widest cell: the first `left` (the settings) left-aligned, the
/// figures right.
fn aligned(table: &[Vec<String>], left: usize) -> String {
    let columns = table.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            table
                .iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in table {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c < left || row.len() <= left + 1 {
                    format!("{cell:<w$}", w = widths[c])
                } else {
                    format!("{cell:>w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str("  ");
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::plan::analyse::complete;
    use crate::estimate::plan::result::tests::{choice, plan};

    #[test]
    fn the_table_says_each_choice_and_the_best() {
        let text = text(&complete(plan()));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "What-if plan: GPT2LMHeadModel on cuda:0, budget 1.0 GiB (given)"
        );
        assert!(lines[1].contains("batch size") && lines[1].contains("largest batch size"));
        assert!(lines[2].starts_with("  baseline"), "{}", lines[2]);
        assert!(lines[2].contains("1000.0 MiB") && lines[2].contains(" yes "));
        assert!(lines[4].contains("+100.0%") && lines[4].contains(" no "));
        assert!(lines[7].contains("no estimate [1]"), "{}", lines[7]);
        assert!(lines[2].ends_with(" 32"), "{}", lines[2]);
        assert_eq!(
            lines[8],
            "Saves the most: checkpointing on: peak reserved -400.0 MiB (-40.0%), \
             largest batch size 32"
        );
        assert_eq!(lines[9], "[1] no repeated blocks");
    }

    #[test]
    fn per_rank_plans_show_the_mode_and_may_pick_it() {
        let mut p = plan();
        p.world_size = 2;
        for row in &mut p.rows {
            row.parallel = Some("ddp".into());
        }
        let mut sharded = choice("parallel", 8, Some(400 << 20));
        sharded.parallel = Some("fsdp2".into());
        p.rows.push(sharded);
        let text = text(&complete(p));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].contains("optimizer  parallel"), "{}", lines[1]);
        assert!(lines[2].contains("AdamW      DDP"), "{}", lines[2]);
        assert!(lines[8].starts_with("  parallel") && lines[8].contains("FSDP2"));
        assert!(
            text.contains("Saves the most: parallel FSDP2: peak reserved -600.0 MiB (-60.0%)"),
            "{text}"
        );
    }

    #[test]
    fn a_size_at_the_search_limit_may_fit_more() {
        let mut p = plan();
        p.limit = 32;
        let text = text(&complete(p));
        assert!(text.lines().nth(2).unwrap().ends_with(" 32+"));
        assert!(text.contains("largest batch size 32+"));
    }

    #[test]
    fn without_a_budget_nothing_is_said_of_fitting() {
        let mut p = plan();
        p.budget = None;
        for row in &mut p.rows {
            row.largest_size = None;
        }
        let text = text(&p);
        assert!(text.lines().next().unwrap().ends_with(", no budget"));
        assert!(!text.contains("largest batch size that fits"));
        assert!(!text.contains(" yes ") && !text.contains(" no  "));
    }
}
