//! One iteration's windows and the categories at its peak.
//!
//! An iteration (from one `record_stats()` to the next) is cut at every backward start and
//! backward end into windows; each window has an exact allocator peak (peaks are reset at
//! its start). The iteration's peak is the highest window peak, and the categories are those
//! of that window, computed at one of its boundaries (when the known tensors are read):
//!
//! - a forward window (ends at a backward start, or at the record when the iteration had no
//!   backward): at its end. `temporary` = peak - allocated at the end.
//! - a backward window: at its start. The excess (peak - allocated at the start) is split
//!   into the parameter gradients created during the window (at most the excess) and
//!   `temporary`, the rest (intermediate gradients and scratch above what backward freed
//!   by then; the intermediate gradients themselves are measured at the graph's nodes,
//!   `gradients.rs`).
//! - an optimizer window (backward end to record): at its start; the excess goes first to
//!   optimizer state created in the window (the first step), the rest is `temporary`.
//!
//! `other` = allocated at the boundary - the known categories. By construction the seven
//! categories sum to the window's peak exactly.
//!
//! A window arrives as the monitor's Python side wrote it (`record.rs`): `[kind, start, end,
//! peak]`, each boundary `[allocated, parameter, buffer, gradient, optimizer_state,
//! activation]`.

use serde::Deserialize;

/// What was live at a window boundary, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "[i64; 6]")]
pub struct Boundary {
    pub allocated: i64,
    pub parameter: i64,
    pub buffer: i64,
    pub gradient: i64,
    pub optimizer_state: i64,
    pub activation: i64,
}

impl From<[i64; 6]> for Boundary {
    fn from(v: [i64; 6]) -> Self {
        Self {
            allocated: v[0],
            parameter: v[1],
            buffer: v[2],
            gradient: v[3],
            optimizer_state: v[4],
            activation: v[5],
        }
    }
}

/// Where a window is in the step: up to a backward start (or the record, without backward),
/// within a backward, or from a backward's end to the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Forward,
    Backward,
    Optimizer,
}

impl Kind {
    /// The name a row's `peak_window` holds.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Forward => "forward",
            Kind::Backward => "backward",
            Kind::Optimizer => "optimizer",
        }
    }
}

/// Bytes by category at a window's peak, in `results::categories::CATEGORIES` order:
/// parameter, buffer, gradient, activation, temporary, optimizer_state, other.
pub type Categories = [i64; 7];

/// One window: its kind, what was live at its start and end, and its peak allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct Window {
    pub kind: Kind,
    pub start: Boundary,
    pub end: Boundary,
    pub peak: i64,
}

/// The categories at the window's peak, and whether the known tensors exceeded what the
/// allocator held at the boundary (then `other` is clamped to 0 and the sum exceeds the
/// peak: storages the allocator did not make were counted; the report says so).
pub fn categorize(w: &Window) -> (Categories, bool) {
    let (b, mut gradient, mut optimizer_state, temporary) = match w.kind {
        Kind::Forward => (
            w.end,
            w.end.gradient,
            w.end.optimizer_state,
            w.peak - w.end.allocated,
        ),
        Kind::Backward => {
            let excess = (w.peak - w.start.allocated).max(0);
            let created = (w.end.gradient - w.start.gradient).clamp(0, excess);
            (
                w.start,
                w.start.gradient + created,
                w.start.optimizer_state,
                excess - created,
            )
        }
        Kind::Optimizer => {
            let excess = (w.peak - w.start.allocated).max(0);
            let created = (w.end.optimizer_state - w.start.optimizer_state).clamp(0, excess);
            (
                w.start,
                w.start.gradient,
                w.start.optimizer_state + created,
                excess - created,
            )
        }
    };
    gradient = gradient.max(0);
    optimizer_state = optimizer_state.max(0);
    let known = b.parameter + b.buffer + b.gradient + b.optimizer_state + b.activation;
    let other = b.allocated - known;
    let categories = [
        b.parameter,
        b.buffer,
        gradient,
        b.activation,
        temporary.max(0),
        optimizer_state,
        other.max(0),
    ];
    (categories, other < 0)
}

/// The iteration's peak: which window (the first of the highest), its categories, and
/// whether the categorised window was inexact.
pub fn iteration(windows: &[Window]) -> Option<(usize, Categories, bool)> {
    let mut best: Option<usize> = None;
    for (i, w) in windows.iter().enumerate() {
        if best.is_none_or(|b| w.peak > windows[b].peak) {
            best = Some(i);
        }
    }
    let best = best?;
    let (categories, inexact) = categorize(&windows[best]);
    Some((best, categories, inexact))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win(kind: Kind, start: Boundary, end: Boundary, peak: i64) -> Window {
        Window {
            kind,
            start,
            end,
            peak,
        }
    }

    fn at(allocated: i64, gradient: i64, optimizer_state: i64, activation: i64) -> Boundary {
        Boundary {
            allocated,
            parameter: 100,
            buffer: 10,
            gradient,
            optimizer_state,
            activation,
        }
    }

    #[test]
    fn forward_window_is_read_at_its_end() {
        let w = win(Kind::Forward, at(200, 0, 0, 0), at(600, 0, 0, 300), 650);
        let (c, inexact) = categorize(&w);
        assert_eq!(c, [100, 10, 0, 300, 50, 0, 190]);
        assert_eq!(c.iter().sum::<i64>(), 650);
        assert!(!inexact);
    }

    #[test]
    fn backward_window_splits_gradients_from_intermediates() {
        let w = win(Kind::Backward, at(600, 0, 0, 300), at(300, 100, 0, 0), 750);
        let (c, _) = categorize(&w);
        // excess 150: 100 of gradients created, 50 intermediate
        assert_eq!(c, [100, 10, 100, 300, 50, 0, 190]);
        assert_eq!(c.iter().sum::<i64>(), 750);
    }

    #[test]
    fn gradients_created_beyond_the_excess_are_capped() {
        let w = win(Kind::Backward, at(600, 0, 0, 300), at(300, 100, 0, 0), 640);
        let (c, _) = categorize(&w);
        assert_eq!(c[2], 40);
        assert_eq!(c[4], 0);
        assert_eq!(c.iter().sum::<i64>(), 640);
    }

    #[test]
    fn optimizer_window_counts_new_state_then_scratch() {
        let w = win(
            Kind::Optimizer,
            at(300, 100, 0, 0),
            at(500, 100, 200, 0),
            560,
        );
        let (c, _) = categorize(&w);
        assert_eq!(c, [100, 10, 100, 0, 60, 200, 90]);
        assert_eq!(c.iter().sum::<i64>(), 560);
    }

    #[test]
    fn known_above_allocated_is_flagged() {
        let w = win(Kind::Forward, at(0, 0, 0, 0), at(50, 0, 0, 0), 50);
        assert!(categorize(&w).1);
    }

    #[test]
    fn windows_read_as_the_monitor_writes_them() {
        let windows: Vec<Window> = crate::results::from_json(
            r#"[["forward", [200, 100, 10, 0, 0, 0], [600, 100, 10, 0, 0, 300], 650],
                ["backward", [600, 100, 10, 0, 0, 300], [300, 100, 10, 100, 0, 0], 750]]"#,
        )
        .unwrap();
        assert_eq!(
            windows[0],
            win(Kind::Forward, at(200, 0, 0, 0), at(600, 0, 0, 300), 650)
        );
        assert_eq!(windows[1].kind.name(), "backward");
        let err = crate::results::from_json::<Vec<Window>>(
            r#"[["sideways", [0,0,0,0,0,0], [0,0,0,0,0,0], 0]]"#,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("[0][0]: unknown variant `sideways`"),
            "{err}"
        );
    }

    #[test]
    fn iteration_takes_the_first_highest_window() {
        let f = win(Kind::Forward, at(200, 0, 0, 0), at(600, 0, 0, 300), 750);
        let b = win(Kind::Backward, at(600, 0, 0, 300), at(300, 100, 0, 0), 750);
        let (i, c, _) = iteration(&[f, b]).unwrap();
        assert_eq!(i, 0);
        assert_eq!(c.iter().sum::<i64>(), 750);
        assert!(iteration(&[]).is_none());
    }
}
