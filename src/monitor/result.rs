//! The training monitor's record (kind `monitor`): one row per recorded iteration, what each
//! row's printed block needs besides (the parameter rows, saved once per change as a layout;
//! the gradient bytes per parameter row; the feature maps per module), the device, the print
//! period and the CSV header's names. The serde derive is the saved file's `data` (the field
//! names and their order are those schema 1 files hold) and the schema a loaded file is
//! checked against; `check` adds the rules between fields.

use serde::{Deserialize, Serialize};

use crate::results::{nullable, DataError};

/// A monitor's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonitorRecord {
    /// "cpu" or "cuda:N".
    pub device: String,
    /// Whether the blocks list the feature maps per module.
    pub verbose: bool,
    /// A block is printed (and a CSV row written) every `print_period`-th iteration of an
    /// epoch.
    pub print_period: i64,
    /// The parameter rows in the CSV header (the model's when the monitor began).
    pub csv_names: Vec<String>,
    pub rows: Vec<Row>,
    pub layouts: Vec<Layout>,
    /// One per row.
    pub details: Vec<Details>,
}

/// One recorded iteration, in bytes (docs/guide.md defines each field).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    pub step: i64,
    pub epoch: i64,
    pub iteration: i64,
    pub peak_cached: i64,
    pub current_cached: i64,
    /// None in an iteration that was not measured.
    #[serde(deserialize_with = "nullable")]
    pub feature_maps: Option<i64>,
    /// The step whose saved tensors were measured for this row, None when none was.
    #[serde(deserialize_with = "nullable")]
    pub feature_maps_from: Option<i64>,
    pub weight_usage: i64,
    pub weight_gradient_usage: i64,
    #[serde(deserialize_with = "nullable")]
    pub intermediate_gradients: Option<i64>,
    /// None without an optimizer.
    #[serde(deserialize_with = "nullable")]
    pub optimizer_state_usage: Option<i64>,
    pub peak_allocated: i64,
    /// `forward`, `backward` or `optimizer`: the window of the peak.
    pub peak_window: String,
    pub backward_passes: i64,
    // The categories at the peak (`results::categories::CATEGORIES`), summing to it.
    pub parameter: i64,
    pub buffer: i64,
    pub gradient: i64,
    pub activation: i64,
    pub temporary: i64,
    pub optimizer_state: i64,
    pub other: i64,
    /// Why a figure may be incomplete, printed under the block.
    #[serde(deserialize_with = "nullable")]
    pub notice: Option<String>,
}

impl Row {
    /// The categories at the peak, in report order.
    pub fn categories(&self) -> [i64; 7] {
        [
            self.parameter,
            self.buffer,
            self.gradient,
            self.activation,
            self.temporary,
            self.optimizer_state,
            self.other,
        ]
    }
}

/// The parameter rows (one per parameter storage; tied weights joined by `+`) and their
/// bytes, saved once for every run of rows that share them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub names: Vec<String>,
    pub bytes: Vec<i64>,
}

/// What one row's block prints beside the row's figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Details {
    /// Feature maps per module, `[module, bytes]` (verbose only; empty otherwise).
    pub modules: Vec<(String, i64)>,
    /// The index of the row's layout in `layouts`.
    pub layout: usize,
    /// Gradient bytes per parameter row of that layout.
    pub grads: Vec<i64>,
}

impl MonitorRecord {
    /// The rules between fields that the derive cannot state: one details per row, a
    /// layout index that names a layout, one name, byte count and gradient count per
    /// parameter row, a print period of at least 1.
    pub fn check(&self) -> Result<(), DataError> {
        let error = |path: String, message: String| DataError { path, message };
        if self.print_period < 1 {
            return Err(error(
                "print_period".into(),
                format!("must be >= 1, got {}", self.print_period),
            ));
        }
        for (i, layout) in self.layouts.iter().enumerate() {
            if layout.names.len() != layout.bytes.len() {
                return Err(error(
                    format!("layouts[{i}]"),
                    format!(
                        "{} names for {} byte counts",
                        layout.names.len(),
                        layout.bytes.len()
                    ),
                ));
            }
        }
        if self.details.len() != self.rows.len() {
            return Err(error(
                "details".into(),
                format!(
                    "{} details for {} rows",
                    self.details.len(),
                    self.rows.len()
                ),
            ));
        }
        for (i, details) in self.details.iter().enumerate() {
            let Some(layout) = self.layouts.get(details.layout) else {
                return Err(error(
                    format!("details[{i}].layout"),
                    format!(
                        "{} is not one of {} layouts",
                        details.layout,
                        self.layouts.len()
                    ),
                ));
            };
            if details.grads.len() != layout.bytes.len() {
                return Err(error(
                    format!("details[{i}].grads"),
                    format!(
                        "{} gradient counts for {} rows",
                        details.grads.len(),
                        layout.bytes.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The record read from its JSON text and checked: the derive, then `check`.
    pub fn from_json(text: &str) -> Result<Self, DataError> {
        let record: Self = crate::results::from_json(text)?;
        record.check()?;
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: i64) -> Row {
        Row {
            step,
            epoch: 1,
            iteration: step,
            peak_cached: 3_000_000,
            current_cached: 2_000_000,
            feature_maps: Some(1),
            feature_maps_from: Some(step),
            weight_usage: 2_000_000,
            weight_gradient_usage: 2_000_000,
            intermediate_gradients: None,
            optimizer_state_usage: None,
            peak_allocated: 10,
            peak_window: "forward".into(),
            backward_passes: 1,
            parameter: 4,
            buffer: 0,
            gradient: 3,
            activation: 1,
            temporary: 1,
            optimizer_state: 0,
            other: 1,
            notice: None,
        }
    }

    fn record() -> MonitorRecord {
        MonitorRecord {
            device: "cpu".into(),
            verbose: false,
            print_period: 1,
            csv_names: vec!["a.weight".into()],
            rows: vec![row(1), row(2)],
            layouts: vec![Layout {
                names: vec!["a.weight".into()],
                bytes: vec![2_000_000],
            }],
            details: vec![
                Details {
                    modules: vec![],
                    layout: 0,
                    grads: vec![2_000_000],
                };
                2
            ],
        }
    }

    fn refused(change: impl FnOnce(&mut MonitorRecord)) -> String {
        let mut r = record();
        change(&mut r);
        MonitorRecord::from_json(&crate::results::to_json(&r))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_record_round_trips_in_the_saved_field_order() {
        let text = crate::results::to_json(&record());
        assert!(text.starts_with(
            r#"{"device":"cpu","verbose":false,"print_period":1,"csv_names":["a.weight"],"rows":[{"step":1,"epoch":1,"iteration":1,"#
        ));
        assert!(text.contains(r#""other":1,"notice":null}"#));
        assert_eq!(MonitorRecord::from_json(&text), Ok(record()));
    }

    #[test]
    fn the_rules_between_fields_name_the_field() {
        assert_eq!(
            refused(|r| r.details[1].grads.clear()),
            "details[1].grads: 0 gradient counts for 1 rows"
        );
        assert_eq!(
            refused(|r| r.details[0].layout = 7),
            "details[0].layout: 7 is not one of 1 layouts"
        );
        assert_eq!(
            refused(|r| {
                r.details.pop();
            }),
            "details: 1 details for 2 rows"
        );
        assert_eq!(
            refused(|r| r.layouts[0].bytes.push(1)),
            "layouts[0]: 1 names for 2 byte counts"
        );
        assert_eq!(
            refused(|r| r.print_period = 0),
            "print_period: must be >= 1, got 0"
        );
        let text = crate::results::to_json(&record()).replacen(r#","notice":null"#, "", 1);
        assert_eq!(
            MonitorRecord::from_json(&text).unwrap_err().to_string(),
            "rows[0]: missing field `notice`"
        );
    }
}
