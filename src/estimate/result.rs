//! The estimate (kind `estimate`): what one training step needs, in bytes, as
//! `MemoryEstimate`'s fields (docs/guide.md defines each). The serde derive is the saved
//! file's `data` (the fields in the order schema 1 files hold them) and the schema a loaded
//! file is checked against; `check` adds the rules between fields.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::results::DataError;

/// One estimate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The model's class name.
    pub model: String,
    /// The device modelled ("cpu", "cuda:0").
    pub device: String,
    pub dtype: Option<String>,
    pub parameters: u64,
    pub buffers: u64,
    pub inputs: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    pub activations: u64,
    pub intermediates_forward: u64,
    pub intermediates_backward: u64,
    pub peak_allocated: u64,
    pub peak_step: u64,
    /// The phase of the peak ("forward 1", "backward 2", ...).
    pub peak_phase: String,
    /// Bytes per category at the peak (`results::categories::CATEGORIES`).
    pub peak_by_category: IndexMap<String, u64>,
    pub phase_peaks: IndexMap<String, u64>,
    pub phase_ends: IndexMap<String, u64>,
    /// The peak of each step, keyed by the step's number (as a string: JSON keys are).
    pub step_peaks: IndexMap<String, u64>,
    pub peak_reserved: u64,
    pub workspaces: u64,
    pub allocations: u64,
    pub seconds: f64,
    pub notes: Vec<String>,
    /// The `torch.autocast` dtype of forward and the loss ("bfloat16", "float16"), if any
    /// (absent from files saved before mixed precision was modelled: none).
    #[serde(default)]
    pub autocast: Option<String>,
    /// Whether the loss was scaled by a GradScaler (absent from older files: no).
    #[serde(default)]
    pub grad_scaler: bool,
    /// The ranks of data parallelism; the figures are one rank's (absent from files saved
    /// before data parallelism was modelled: 1).
    #[serde(default = "one")]
    pub world_size: u64,
    /// The data-parallel mode, "ddp" or "fsdp2" (absent from older files: none).
    #[serde(default)]
    pub parallel: Option<String>,
    /// Bytes of the collectives' buffers at the peak: DDP's gradient buckets, FSDP2's
    /// all-gather and reduce-scatter buffers (absent from older files: 0).
    #[serde(default)]
    pub collective_buffers: u64,
}

fn one() -> u64 {
    1
}

/// The data-parallel modes an estimate models.
pub const PARALLEL_MODES: [&str; 2] = ["ddp", "fsdp2"];

/// A data-parallel mode as the text names it: "DDP", "FSDP2".
pub fn mode_label(mode: &str) -> &str {
    match mode {
        "ddp" => "DDP",
        "fsdp2" => "FSDP2",
        other => other,
    }
}

impl Estimate {
    /// The rules the derive cannot state: step numbers as `step_peaks`' keys, a phase of
    /// the peak that names a phase, the activations at the peak among the categories.
    pub fn check(&self) -> Result<(), DataError> {
        let error = |path: &str, message: String| DataError {
            path: path.to_string(),
            message,
        };
        for key in self.step_peaks.keys() {
            let digits =
                !key.is_empty() && key.len() <= 18 && key.bytes().all(|b| b.is_ascii_digit());
            if !digits {
                return Err(error(
                    "step_peaks",
                    format!("must be keyed by step numbers, got {key:?}"),
                ));
            }
        }
        if self.peak_phase.trim().is_empty() {
            return Err(error(
                "peak_phase",
                "must name a phase, got an empty one".into(),
            ));
        }
        if !self.peak_by_category.contains_key("activation") {
            return Err(error("peak_by_category", "has no \"activation\"".into()));
        }
        if self.world_size == 0 {
            return Err(error("world_size", "must be at least 1, got 0".into()));
        }
        match &self.parallel {
            Some(mode) if !PARALLEL_MODES.contains(&mode.as_str()) => {
                return Err(error(
                    "parallel",
                    format!("must be \"ddp\" or \"fsdp2\", got {mode:?}"),
                ));
            }
            None if self.world_size > 1 => {
                return Err(error(
                    "parallel",
                    format!(
                        "is missing: world_size {} needs a data-parallel mode",
                        self.world_size
                    ),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// The estimate read from its JSON text and checked: the derive, then `check`.
    pub fn from_json(text: &str) -> Result<Self, DataError> {
        let estimate: Self = crate::results::from_json(text)?;
        estimate.check()?;
        Ok(estimate)
    }

    /// What the step ran in, when it is not the parameters' own dtype alone: "autocast
    /// bfloat16 with a GradScaler", "float16 parameters", ...
    pub fn precision(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(dtype) = &self.dtype {
            parts.push(format!("{dtype} parameters"));
        }
        if let Some(dtype) = &self.autocast {
            parts.push(format!("torch.autocast({dtype})"));
        }
        if self.grad_scaler {
            parts.push("a GradScaler".to_string());
        }
        if parts.is_empty() {
            None
        } else {
            Some(parts.join(", "))
        }
    }

    /// Whose memory the figures are, under data parallelism: "rank 0 of 2 under FSDP2
    /// (fully_shard per repeated block)".
    pub fn parallelism(&self) -> Option<String> {
        let mode = self.parallel.as_deref()?;
        let how = if mode == "fsdp2" {
            " (fully_shard per repeated block)"
        } else {
            ""
        };
        Some(format!(
            "rank 0 of {} under {}{how}",
            self.world_size,
            mode_label(mode)
        ))
    }

    /// The figures as the modelsize-style lines print them: (what, bytes, what follows).
    pub fn lines(&self) -> Vec<(&'static str, u64, String)> {
        let phase = self.peak_phase.split_whitespace().next().unwrap_or("");
        let mut lines = vec![
            ("params", self.parameters, "M".into()),
            (
                "intermedite variables",
                self.intermediates_forward,
                " M (without backward)".into(),
            ),
            (
                "intermedite variables",
                self.intermediates_backward,
                " M (with backward)".into(),
            ),
            ("gradients", self.gradients, "M".into()),
            ("optimizer state", self.optimizer_state, "M".into()),
            (
                "activations saved for backward",
                self.activations,
                "M".into(),
            ),
            (
                "peak allocated",
                self.peak_allocated,
                format!("M (step {}, {phase})", self.peak_step),
            ),
            ("peak reserved", self.peak_reserved, "M (modelled)".into()),
        ];
        if self.parallel.is_some() {
            lines.insert(
                lines.len() - 2,
                (
                    "collective buffers at the peak",
                    self.collective_buffers,
                    "M".into(),
                ),
            );
        }
        lines
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn estimate() -> Estimate {
        let map = |pairs: &[(&str, u64)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect::<IndexMap<String, u64>>()
        };
        Estimate {
            model: "Linear".into(),
            device: "cpu".into(),
            dtype: None,
            parameters: 4_004_000,
            buffers: 0,
            inputs: 32_000,
            gradients: 4_004_000,
            optimizer_state: 0,
            activations: 32_000,
            intermediates_forward: 32_000,
            intermediates_backward: 4_036_000,
            peak_allocated: 8_072_000,
            peak_step: 1,
            peak_phase: "backward 1".into(),
            peak_by_category: map(&[("parameter", 4_004_000), ("activation", 32_000)]),
            phase_peaks: map(&[("setup", 4_036_000), ("backward 1", 8_072_000)]),
            phase_ends: map(&[("setup", 4_036_000), ("backward 1", 8_040_000)]),
            step_peaks: map(&[("1", 8_072_000)]),
            peak_reserved: 8_072_000,
            workspaces: 0,
            allocations: 5,
            seconds: 0.25,
            notes: vec!["a note".into()],
            autocast: None,
            grad_scaler: false,
            world_size: 1,
            parallel: None,
            collective_buffers: 0,
        }
    }

    fn refused(change: impl FnOnce(&mut Estimate)) -> String {
        let mut e = estimate();
        change(&mut e);
        Estimate::from_json(&crate::results::to_json(&e))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn an_estimate_round_trips_in_the_saved_field_order() {
        let text = crate::results::to_json(&estimate());
        assert!(text
            .starts_with(r#"{"model":"Linear","device":"cpu","dtype":null,"parameters":4004000,"#));
        assert!(text.ends_with(
            r#""notes":["a note"],"autocast":null,"grad_scaler":false,"world_size":1,"parallel":null,"collective_buffers":0}"#
        ));
        assert_eq!(Estimate::from_json(&text), Ok(estimate()));
    }

    #[test]
    fn a_file_saved_before_mixed_precision_loads_without_it() {
        let text = crate::results::to_json(&estimate()).replace(
            r#","autocast":null,"grad_scaler":false,"world_size":1,"parallel":null,"collective_buffers":0"#,
            "",
        );
        assert!(text.ends_with(r#""notes":["a note"]}"#));
        assert_eq!(Estimate::from_json(&text), Ok(estimate()));
        let mut mixed = estimate();
        mixed.autocast = Some("bfloat16".into());
        mixed.grad_scaler = true;
        let text = crate::results::to_json(&mixed);
        assert_eq!(Estimate::from_json(&text), Ok(mixed.clone()));
        assert_eq!(
            mixed.precision().as_deref(),
            Some("torch.autocast(bfloat16), a GradScaler")
        );
        assert_eq!(estimate().precision(), None);
    }

    #[test]
    fn data_parallelism_round_trips_and_its_rules_name_the_field() {
        let mut sharded = estimate();
        sharded.world_size = 2;
        sharded.parallel = Some("fsdp2".into());
        sharded.collective_buffers = 66_304;
        let text = crate::results::to_json(&sharded);
        assert_eq!(Estimate::from_json(&text), Ok(sharded.clone()));
        assert_eq!(
            sharded.parallelism().as_deref(),
            Some("rank 0 of 2 under FSDP2 (fully_shard per repeated block)")
        );
        assert!(sharded.lines().iter().any(|(label, bytes, _)| *label
            == "collective buffers at the peak"
            && *bytes == 66_304));
        assert_eq!(estimate().parallelism(), None);
        assert_eq!(estimate().lines().len(), 8);
        assert_eq!(
            refused(|e| e.world_size = 0),
            "world_size: must be at least 1, got 0"
        );
        assert_eq!(
            refused(|e| {
                e.world_size = 2;
                e.parallel = Some("zero3".into());
            }),
            "parallel: must be \"ddp\" or \"fsdp2\", got \"zero3\""
        );
        assert_eq!(
            refused(|e| e.world_size = 4),
            "parallel: is missing: world_size 4 needs a data-parallel mode"
        );
    }

    #[test]
    fn the_rules_between_fields_name_the_field() {
        assert_eq!(
            refused(|e| {
                e.step_peaks.insert("first".into(), 1);
            }),
            "step_peaks: must be keyed by step numbers, got \"first\""
        );
        assert_eq!(
            refused(|e| {
                e.peak_by_category.shift_remove("activation");
            }),
            "peak_by_category: has no \"activation\""
        );
        assert!(refused(|e| e.peak_phase = " ".into()).starts_with("peak_phase: "));
        let text = crate::results::to_json(&estimate())
            .replace("8072000,\"peak_step\"", "\"lots\",\"peak_step\"");
        assert!(Estimate::from_json(&text)
            .unwrap_err()
            .to_string()
            .starts_with("peak_allocated: invalid type: string \"lots\""));
    }
}
