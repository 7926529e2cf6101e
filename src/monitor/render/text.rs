//! The training monitor's printed block and CSV rows, in the layout of the original
//! per-iteration memory profiler (dotted leaders: the label padded with dots to 35
//! characters, the value right-aligned with dots in 5, then " MB"; indented rows pad to 33
//! after two spaces; MB are decimal megabytes rounded half to even, as Python's `round`).

use crate::monitor::result::MonitorRecord;

/// Bytes to the original's integer MB: `round(bytes / 1e6)`, ties to even.
pub fn mb(bytes: i64) -> i64 {
    (bytes as f64 / 1e6).round_ties_even() as i64
}

/// A sum of byte counts that saturates (a damaged file's huge numbers print as the largest,
/// they do not wrap).
fn total(bytes: impl Iterator<Item = i64>) -> i64 {
    bytes.fold(0, i64::saturating_add)
}

fn line(label: &str, bytes: i64) -> String {
    leader("", label, "", 35, &mb(bytes).to_string(), " MB")
}

fn row(label: &str, bytes: i64) -> String {
    leader("  ", label, "", 33, &mb(bytes).to_string(), " MB")
}

/// `{indent}{label}{suffix}`, dots to `width` characters (after the indent), then `value`
/// right-aligned with dots in 5, then `unit`: what `format!("{:.<w$}{:.>5}")` prints,
/// built directly because the formatter's padding is slow, and a block has hundreds of rows.
fn leader(
    indent: &str,
    label: &str,
    suffix: &str,
    width: usize,
    value: &str,
    unit: &str,
) -> String {
    let chars = label.chars().count() + suffix.chars().count();
    let value_chars = value.chars().count();
    let mut out = String::with_capacity(indent.len() + width.max(chars) + 5 + unit.len() + 8);
    out.push_str(indent);
    out.push_str(label);
    out.push_str(suffix);
    out.extend(std::iter::repeat_n('.', width.saturating_sub(chars)));
    out.extend(std::iter::repeat_n('.', 5usize.saturating_sub(value_chars)));
    out.push_str(value);
    out.push_str(unit);
    out
}

/// What one printed block shows.
#[derive(Clone, Debug, Default)]
pub struct Block {
    pub iteration: i64,
    pub epoch: i64,
    pub peak_cached: i64,
    pub current_cached: i64,
    /// None when the iteration's feature maps were not measured (the monitor's notice says
    /// why): printed as `n/a`, an empty CSV cell.
    pub feature_maps: Option<i64>,
    /// Per module feature maps (verbose only; empty otherwise).
    pub modules: Vec<(String, i64)>,
    /// (parameter name, bytes, its gradient's bytes), one per storage.
    pub weights: Vec<(String, i64, i64)>,
    /// None when the iteration's backward gradients were not measured (with its feature
    /// maps): `n/a`, an empty CSV cell.
    pub intermediate: Option<i64>,
    /// Optimizer state bytes, when an optimizer was given.
    pub optimizer_state: Option<i64>,
    /// Said under the block when the figures may be incomplete.
    pub notice: Option<String>,
}

/// The block without the blank line the original prints before it.
pub fn block(b: &Block) -> String {
    let stars = "*".repeat(43);
    let mut out = vec![
        stars.clone(),
        format!(
            "Memory Usage for Iteration {} of Epoch {}",
            b.iteration, b.epoch
        ),
        stars,
        line("Peak cached", b.peak_cached),
        line("Current cached", b.current_cached),
        match b.feature_maps {
            Some(bytes) => line("Total feature map usage", bytes),
            None => leader("", "Total feature map usage", "", 35, "n/a", ""),
        },
    ];
    out.extend(b.modules.iter().map(|(name, bytes)| row(name, *bytes)));
    out.push(String::new());
    let weights = total(b.weights.iter().map(|w| w.1));
    out.push(line("Total layer weight usage", weights));
    out.extend(b.weights.iter().map(|(name, bytes, _)| row(name, *bytes)));
    out.push(String::new());
    let grads = total(b.weights.iter().map(|w| w.2));
    out.push(line("Total layer weight gradient usage", grads));
    out.extend(
        b.weights
            .iter()
            .map(|(name, _, grad)| leader("  ", name, " grad", 33, &mb(*grad).to_string(), " MB")),
    );
    out.push(match b.intermediate {
        Some(bytes) => line("Intermediate gradients", bytes),
        None => leader("", "Intermediate gradients", "", 35, "n/a", ""),
    });
    if let Some(state) = b.optimizer_state {
        out.push(line("Total optimizer state usage", state));
    }
    if let Some(notice) = &b.notice {
        out.push(format!("Note: {notice}"));
    }
    out.join("\n")
}

/// The CSV header, in the original's column order.
pub fn csv_header(names: &[String]) -> String {
    let mut s = String::from(
        "epoch,iteration,peak_cached,current_cached,total_feature_map_usage,total_weight_usage,",
    );
    for name in names {
        s.push_str(name);
        s.push(',');
    }
    s.push_str("total_layer_weight_gradient_usage,");
    for name in names {
        s.push_str(name);
        s.push_str("_grad,");
    }
    s.push_str("intermediate_gradients\n");
    s
}

/// One CSV row (all values integer MB).
pub fn csv_row(b: &Block) -> String {
    let mut cells = vec![
        Some(b.epoch),
        Some(b.iteration),
        Some(mb(b.peak_cached)),
        Some(mb(b.current_cached)),
        b.feature_maps.map(mb),
        Some(mb(total(b.weights.iter().map(|w| w.1)))),
    ];
    cells.extend(b.weights.iter().map(|w| Some(mb(w.1))));
    cells.push(Some(mb(total(b.weights.iter().map(|w| w.2)))));
    cells.extend(b.weights.iter().map(|w| Some(mb(w.2))));
    cells.push(b.intermediate.map(mb));
    let text: Vec<String> = cells
        .iter()
        .map(|c| c.map(|v| v.to_string()).unwrap_or_default())
        .collect();
    text.join(",") + "\n"
}

/// The block of row `index`: its figures, its parameter rows (from its layout, with their
/// gradient bytes), its feature maps per module when the record is verbose, its notice.
/// None when the record does not hold that row whole (`MonitorRecord::check` says why).
pub fn block_of(record: &MonitorRecord, index: usize) -> Option<Block> {
    let row = record.rows.get(index)?;
    let details = record.details.get(index)?;
    let layout = record.layouts.get(details.layout)?;
    if layout.names.len() != layout.bytes.len() || details.grads.len() != layout.bytes.len() {
        return None;
    }
    let weights = layout
        .names
        .iter()
        .zip(&layout.bytes)
        .zip(&details.grads)
        .map(|((name, bytes), grad)| (name.clone(), *bytes, *grad))
        .collect();
    Some(Block {
        iteration: row.iteration,
        epoch: row.epoch,
        peak_cached: row.peak_cached,
        current_cached: row.current_cached,
        feature_maps: row.feature_maps,
        modules: if record.verbose {
            details.modules.clone()
        } else {
            Vec::new()
        },
        weights,
        intermediate: row.intermediate_gradients,
        optimizer_state: row.optimizer_state_usage,
        notice: row.notice.clone(),
    })
}

/// The CSV file the monitor writes with `csv=True`: the header, then the rows of the
/// printed iterations (every `print_period`-th of each epoch).
pub fn csv_file(record: &MonitorRecord) -> Option<String> {
    let mut out = csv_header(&record.csv_names);
    for (index, row) in record.rows.iter().enumerate() {
        if printed(row.iteration, record.print_period) {
            out.push_str(&csv_row(&block_of(record, index)?));
        }
    }
    Some(out)
}

/// Whether iteration `iteration` of an epoch prints its block (as Python's `%`, so a
/// negative iteration of a strange file reads as the monitor's own code reads it).
pub fn printed(iteration: i64, print_period: i64) -> bool {
    iteration.rem_euclid(print_period.max(1)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaders_match_the_original() {
        assert_eq!(
            line("Peak cached", 857_000_000),
            "Peak cached..........................857 MB"
        );
        assert_eq!(
            row("mf_user_embed.weight", 35_000_000),
            "  mf_user_embed.weight................35 MB"
        );
        assert_eq!(
            line("Total layer weight gradient usage", 127_000_000),
            "Total layer weight gradient usage....127 MB"
        );
        assert_eq!(
            line("Intermediate gradients", 34_000_000),
            "Intermediate gradients................34 MB"
        );
    }

    #[test]
    fn megabytes_round_half_to_even() {
        assert_eq!(mb(500_000), 0);
        assert_eq!(mb(1_500_000), 2);
        assert_eq!(mb(2_500_000), 2);
        assert_eq!(mb(2_500_001), 3);
    }

    #[test]
    fn csv_has_the_original_columns() {
        let names = vec!["a.weight".to_string()];
        assert_eq!(
            csv_header(&names),
            "epoch,iteration,peak_cached,current_cached,total_feature_map_usage,\
             total_weight_usage,a.weight,total_layer_weight_gradient_usage,a.weight_grad,\
             intermediate_gradients\n"
        );
        let b = Block {
            iteration: 2,
            epoch: 1,
            peak_cached: 3_000_000,
            feature_maps: Some(0),
            weights: vec![("a.weight".into(), 2_000_000, 2_000_000)],
            intermediate: Some(0),
            ..Default::default()
        };
        assert_eq!(csv_row(&b), "1,2,3,0,0,2,2,2,2,0\n");
        let unmeasured = Block {
            feature_maps: None,
            ..b.clone()
        };
        assert_eq!(csv_row(&unmeasured), "1,2,3,0,,2,2,2,2,0\n");
        assert!(block(&unmeasured).contains("\nTotal feature map usage..............n/a\n"));
        let no_gradients = Block {
            intermediate: None,
            ..unmeasured
        };
        assert_eq!(csv_row(&no_gradients), "1,2,3,0,,2,2,2,2,\n");
        assert!(block(&no_gradients).ends_with("\nIntermediate gradients...............n/a"));
    }
}
