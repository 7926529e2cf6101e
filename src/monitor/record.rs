//! The record growing one iteration at a time: at each `record_stats()` the monitor's Python
//! side hands over what it read of the iteration (its windows, the figures it counted, the
//! gradient bytes per parameter row, why a figure may be incomplete), once, as JSON text;
//! here the windows become the categories at the peak (`analyse`), the notice is written, and
//! the row and its details join the record. The parameter rows are handed over only when
//! they change (`set_layout`), and saved once per change.
//!
//! The live monitor prints every block from this record, and its result is this record's
//! JSON text: a loaded result renders as the monitor printed.

use serde::Deserialize;

use super::analyse::{iteration, Window};
use super::result::{Details, Layout, MonitorRecord, Row};
use crate::results::categories::CATEGORIES;
use crate::results::DataError;

/// What a record begins with (the monitor's settings).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    pub device: String,
    pub verbose: bool,
    pub print_period: i64,
    pub csv_names: Vec<String>,
}

/// One iteration as the monitor read it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Iteration {
    pub epoch: i64,
    pub iteration: i64,
    pub peak_cached: i64,
    pub current_cached: i64,
    pub feature_maps: Option<i64>,
    /// The step whose saved tensors were measured for this one; None: not measured.
    pub feature_maps_from: Option<i64>,
    pub intermediate_gradients: Option<i64>,
    pub optimizer_state_usage: Option<i64>,
    pub backward_passes: i64,
    /// The iteration's windows, in order (at least one: the record ends one).
    pub windows: Vec<Window>,
    /// Feature maps per module (verbose).
    #[serde(default)]
    pub modules: Vec<(String, i64)>,
    /// Gradient bytes per parameter row of the current layout.
    pub grads: Vec<i64>,
    pub notices: Notices,
}

/// Why the iteration's figures may be incomplete, besides what the analysis finds.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Notices {
    /// The allocator source's own (the CPU fallback, a displaced hook).
    #[serde(default)]
    pub source: Option<String>,
    /// An outer saved-tensor hook pair was chained during the iteration.
    #[serde(default)]
    pub chained: bool,
    /// Some gradients had no storage to read.
    #[serde(default)]
    pub gradients_incomplete: bool,
}

const INEXACT: &str = "Known tensors exceeded the allocator's count at a boundary (storages it \
                       did not allocate): 'other' was clamped to 0.";
const CHAINED: &str = "An outer saved-tensor hook pair was chained: feature maps count what it \
                       returns when that is a tensor on the monitored device.";
const UNMEASURED: &str = "Feature maps were not measured this iteration, nor intermediate \
                          gradients: its allocations differed from those of the last measured \
                          one (activations are counted in 'other'). The next iteration is \
                          measured.";
const GRADIENTS_INCOMPLETE: &str = "Some gradients had no storage to read (sparse, nested or \
                                    subclass tensors): intermediate gradients leave them out.";

/// A monitor's record in the making.
#[derive(Clone, Debug)]
pub struct Recorder {
    record: MonitorRecord,
    /// The parameter rows now, and the index of their layout once a row used them.
    layout: Layout,
    layout_index: Option<usize>,
}

impl Recorder {
    pub fn new(head: Head) -> Self {
        Self {
            record: MonitorRecord {
                device: head.device,
                verbose: head.verbose,
                print_period: head.print_period.max(1),
                csv_names: head.csv_names,
                rows: Vec::new(),
                layouts: Vec::new(),
                details: Vec::new(),
            },
            layout: Layout::default(),
            layout_index: None,
        }
    }

    /// The parameter rows from now on (one name and byte count per parameter storage).
    pub fn set_layout(&mut self, layout: Layout) -> Result<(), DataError> {
        if layout.names.len() != layout.bytes.len() {
            return Err(DataError {
                path: String::new(),
                message: format!(
                    "{} names for {} byte counts",
                    layout.names.len(),
                    layout.bytes.len()
                ),
            });
        }
        if layout != self.layout {
            self.layout = layout;
            self.layout_index = None;
        }
        Ok(())
    }

    /// Add the iteration's row; its step (1, 2, ... over the record).
    pub fn push(&mut self, it: Iteration) -> Result<usize, DataError> {
        let misfit = |path: &str, message: String| DataError {
            path: path.to_string(),
            message,
        };
        if it.grads.len() != self.layout.bytes.len() {
            return Err(misfit(
                "grads",
                format!(
                    "{} gradient counts for {} parameter rows",
                    it.grads.len(),
                    self.layout.bytes.len()
                ),
            ));
        }
        let Some((best, categories, inexact)) = iteration(&it.windows) else {
            return Err(misfit(
                "windows",
                "an iteration has at least one window".into(),
            ));
        };
        let peak = &it.windows[best];
        let mut notes: Vec<&str> = Vec::new();
        if let Some(source) = it.notices.source.as_deref().filter(|s| !s.is_empty()) {
            notes.push(source);
        }
        if inexact {
            notes.push(INEXACT);
        }
        if it.notices.chained {
            notes.push(CHAINED);
        }
        if it.feature_maps_from.is_none() {
            notes.push(UNMEASURED);
        } else if it.notices.gradients_incomplete {
            notes.push(GRADIENTS_INCOMPLETE);
        }
        let layout = match self.layout_index {
            Some(index) => index,
            None => {
                self.record.layouts.push(self.layout.clone());
                let index = self.record.layouts.len() - 1;
                self.layout_index = Some(index);
                index
            }
        };
        let sum = |v: &[i64]| v.iter().fold(0i64, |a, b| a.saturating_add(*b));
        let step = self.record.rows.len() + 1;
        let [parameter, buffer, gradient, activation, temporary, optimizer_state, other] =
            categories;
        debug_assert_eq!(CATEGORIES.len(), categories.len());
        self.record.rows.push(Row {
            step: step as i64,
            epoch: it.epoch,
            iteration: it.iteration,
            peak_cached: it.peak_cached,
            current_cached: it.current_cached,
            feature_maps: it.feature_maps,
            feature_maps_from: it.feature_maps_from,
            weight_usage: sum(&self.layout.bytes),
            weight_gradient_usage: sum(&it.grads),
            intermediate_gradients: it.intermediate_gradients,
            optimizer_state_usage: it.optimizer_state_usage,
            peak_allocated: peak.peak,
            peak_window: peak.kind.name().to_string(),
            backward_passes: it.backward_passes,
            parameter,
            buffer,
            gradient,
            activation,
            temporary,
            optimizer_state,
            other,
            notice: (!notes.is_empty()).then(|| notes.join(" ")),
        });
        self.record.details.push(Details {
            modules: it.modules,
            layout,
            grads: it.grads,
        });
        Ok(step)
    }

    /// The record so far.
    pub fn record(&self) -> &MonitorRecord {
        &self.record
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{from_json, to_json};

    fn recorder() -> Recorder {
        let head: Head = from_json(
            r#"{"device": "cpu", "verbose": false, "print_period": 1, "csv_names": ["w"]}"#,
        )
        .unwrap();
        let mut r = Recorder::new(head);
        r.set_layout(Layout {
            names: vec!["w".into()],
            bytes: vec![100],
        })
        .unwrap();
        r
    }

    fn iteration(json_notices: &str, feature_maps_from: &str) -> Iteration {
        from_json(&format!(
            r#"{{"epoch": 1, "iteration": 1, "peak_cached": 0, "current_cached": 0,
                "feature_maps": 300, "feature_maps_from": {feature_maps_from},
                "intermediate_gradients": 50, "optimizer_state_usage": null,
                "backward_passes": 1,
                "windows": [["forward", [200, 100, 10, 0, 0, 0], [600, 100, 10, 0, 0, 300], 650],
                            ["backward", [600, 100, 10, 0, 0, 300], [300, 100, 10, 100, 0, 0], 750],
                            ["forward", [300, 100, 10, 100, 0, 0], [300, 100, 10, 100, 0, 0], 300]],
                "grads": [100], "notices": {json_notices}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_row_from_the_windows_peak() {
        let mut r = recorder();
        assert_eq!(r.push(iteration("{}", "1")).unwrap(), 1);
        let row = &r.record().rows[0];
        assert_eq!(row.peak_allocated, 750);
        assert_eq!(row.peak_window, "backward");
        assert_eq!(row.categories(), [100, 10, 100, 300, 50, 0, 190]);
        assert_eq!((row.weight_usage, row.weight_gradient_usage), (100, 100));
        assert_eq!(row.notice, None);
        assert_eq!(r.record().details[0].layout, 0);
    }

    #[test]
    fn notices_in_the_monitors_order() {
        let mut r = recorder();
        r.push(iteration(
            r#"{"source": "CPU fallback.", "chained": true, "gradients_incomplete": true}"#,
            "null",
        ))
        .unwrap();
        let notice = r.record().rows[0].notice.clone().unwrap();
        assert!(notice.starts_with("CPU fallback. An outer saved-tensor hook pair"));
        assert!(notice.ends_with("The next iteration is measured."));
        r.push(iteration(
            r#"{"source": "", "gradients_incomplete": true}"#,
            "2",
        ))
        .unwrap();
        assert!(r.record().rows[1]
            .notice
            .as_deref()
            .unwrap()
            .starts_with("Some gradients had no storage"));
    }

    #[test]
    fn layouts_are_saved_once_per_change() {
        let mut r = recorder();
        r.push(iteration("{}", "1")).unwrap();
        r.set_layout(Layout {
            names: vec!["w".into()],
            bytes: vec![100],
        })
        .unwrap(); // the same rows: the same layout
        r.push(iteration("{}", "2")).unwrap();
        r.set_layout(Layout {
            names: vec!["w".into()],
            bytes: vec![200],
        })
        .unwrap();
        let mut it = iteration("{}", "3");
        it.grads = vec![200];
        r.push(it).unwrap();
        let layouts: Vec<usize> = r.record().details.iter().map(|d| d.layout).collect();
        assert_eq!(layouts, vec![0, 0, 1]);
        assert_eq!(r.record().rows[2].weight_usage, 200);
        let saved = to_json(r.record());
        assert_eq!(MonitorRecord::from_json(&saved).as_ref(), Ok(r.record()));
    }

    #[test]
    fn what_does_not_fit_the_rows_is_refused() {
        let mut r = recorder();
        let mut it = iteration("{}", "1");
        it.grads = vec![1, 2];
        assert_eq!(
            r.push(it).unwrap_err().to_string(),
            "grads: 2 gradient counts for 1 parameter rows"
        );
        let mut it = iteration("{}", "1");
        it.windows.clear();
        assert!(r.push(it).is_err());
        assert!(r
            .set_layout(Layout {
                names: vec![],
                bytes: vec![1]
            })
            .is_err());
        assert!(r.record().rows.is_empty());
    }
}
