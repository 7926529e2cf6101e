//! The plan as data: the serde derive is the saved file's `data` and the schema a loaded
//! file is checked against; `check` adds the rules between fields.

use serde::{Deserialize, Serialize};

use crate::results::DataError;

/// The axes a row may change; the first row is the baseline, which changes none.
pub const AXES: [&str; 6] = [
    "baseline",
    "size",
    "precision",
    "checkpointing",
    "optimizer",
    "parallel",
];

/// One what-if plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The model's class name.
    pub model: String,
    /// The device modelled ("cuda:0", "cpu").
    pub device: String,
    /// What `make_inputs`' argument is: "batch size", "sequence length", ...
    pub size_name: String,
    /// The bytes a step may reserve; None: no budget (nothing said about fitting).
    pub budget: Option<u64>,
    /// Where the budget comes from ("given", "cuda:0's free memory and torch's reserved").
    pub budget_source: String,
    /// The largest size the search tried: a row's `largest_size` equal to it may fit more.
    pub limit: u64,
    /// The baseline first, then each choice changed alone.
    pub rows: Vec<Choice>,
    /// The index in `rows` of the choice (not a smaller size) that lowers the peak
    /// reserved the most; None when none lowers it. Set by `analyse::complete`.
    #[serde(default)]
    pub best: Option<usize>,
    pub notes: Vec<String>,
    /// The ranks of data parallelism: the peaks are one rank's (absent from files saved
    /// before data parallelism was planned: 1).
    #[serde(default = "one")]
    pub world_size: u64,
}

fn one() -> u64 {
    1
}

/// One row: the settings of one estimate and what it found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// Which setting differs from the baseline (one of `AXES`).
    pub axis: String,
    pub size: u64,
    /// "as given (float32)", "bf16", "amp-bf16", "amp-fp16 + GradScaler", ...
    pub precision: String,
    pub checkpointing: bool,
    pub optimizer: String,
    /// The estimate's figures; None when it could not be made (`error` says why).
    pub peak_allocated: Option<u64>,
    pub peak_reserved: Option<u64>,
    /// The largest size whose step fits the budget (0: none does); None without a budget,
    /// without the search, or when the estimate failed.
    pub largest_size: Option<u64>,
    /// Why this row has no estimate (a FakeStepError's message, a model without repeated
    /// blocks to checkpoint, ...).
    pub error: Option<String>,
    /// The data-parallel mode, "ddp" or "fsdp2" (absent from older files: none).
    #[serde(default)]
    pub parallel: Option<String>,
}

impl Plan {
    /// The plan read from its JSON text and checked: the derive, then `check`.
    pub fn from_json(text: &str) -> Result<Self, DataError> {
        let plan: Self = crate::results::from_json(text)?;
        plan.check()?;
        Ok(plan)
    }

    /// The rules the derive cannot state: one baseline, first; known axes; a row has
    /// figures or an error; `best` names a row.
    pub fn check(&self) -> Result<(), DataError> {
        let error = |path: String, message: String| DataError { path, message };
        match self.rows.first() {
            Some(first) if first.axis == "baseline" => {}
            _ => return Err(error("rows".into(), "must start with the baseline".into())),
        }
        for (i, row) in self.rows.iter().enumerate() {
            if !AXES.contains(&row.axis.as_str()) {
                return Err(error(
                    format!("rows[{i}].axis"),
                    format!("must be one of {AXES:?}, got {:?}", row.axis),
                ));
            }
            if i > 0 && row.axis == "baseline" {
                return Err(error(
                    format!("rows[{i}].axis"),
                    "only the first row is the baseline".into(),
                ));
            }
            if let Some(mode) = &row.parallel {
                if !crate::estimate::result::PARALLEL_MODES.contains(&mode.as_str()) {
                    return Err(error(
                        format!("rows[{i}].parallel"),
                        format!("must be \"ddp\" or \"fsdp2\", got {mode:?}"),
                    ));
                }
            } else if self.world_size > 1 {
                return Err(error(
                    format!("rows[{i}].parallel"),
                    format!(
                        "is missing: world_size {} needs a data-parallel mode",
                        self.world_size
                    ),
                ));
            }
            let figures = row.peak_allocated.is_some() && row.peak_reserved.is_some();
            if figures == row.error.is_some() {
                return Err(error(
                    format!("rows[{i}]"),
                    "must have both peaks or an error, not both or neither".into(),
                ));
            }
        }
        if let Some(best) = self.best {
            if best == 0 || best >= self.rows.len() {
                return Err(error(
                    "best".into(),
                    format!("must name a row after the baseline, got {best}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    pub fn choice(axis: &str, size: u64, reserved: Option<u64>) -> Choice {
        Choice {
            axis: axis.into(),
            size,
            precision: "as given (float32)".into(),
            checkpointing: false,
            optimizer: "AdamW".into(),
            peak_allocated: reserved.map(|r| r - r / 10),
            peak_reserved: reserved,
            largest_size: reserved.map(|_| 32),
            error: reserved.is_none().then(|| "no repeated blocks".to_string()),
            parallel: None,
        }
    }

    pub fn plan() -> Plan {
        let mut ckpt = choice("checkpointing", 8, Some(600 << 20));
        ckpt.checkpointing = true;
        let mut amp = choice("precision", 8, Some(700 << 20));
        amp.precision = "amp-bf16".into();
        Plan {
            model: "GPT2LMHeadModel".into(),
            device: "cuda:0".into(),
            size_name: "batch size".into(),
            budget: Some(1 << 30),
            budget_source: "given".into(),
            limit: 64,
            rows: vec![
                choice("baseline", 8, Some(1000 << 20)),
                choice("size", 4, Some(500 << 20)),
                choice("size", 16, Some(2000 << 20)),
                amp,
                ckpt,
                choice("optimizer", 8, None),
            ],
            best: None,
            notes: vec![],
            world_size: 1,
        }
    }

    #[test]
    fn a_sound_plan_passes_and_round_trips() {
        let p = plan();
        let text = crate::results::to_json(&p);
        assert_eq!(Plan::from_json(&text).unwrap(), p);
    }

    #[test]
    fn the_rules_between_fields_are_checked() {
        let refused = |change: fn(&mut Plan)| {
            let mut p = plan();
            change(&mut p);
            Plan::from_json(&crate::results::to_json(&p))
                .unwrap_err()
                .path
        };
        assert_eq!(refused(|p| p.rows.clear()), "rows");
        assert_eq!(
            refused(|p| p.rows[1].axis = "colour".into()),
            "rows[1].axis"
        );
        assert_eq!(
            refused(|p| p.rows[2].axis = "baseline".into()),
            "rows[2].axis"
        );
        assert_eq!(refused(|p| p.rows[1].error = Some("x".into())), "rows[1]");
        assert_eq!(refused(|p| p.rows[5].error = None), "rows[5]");
        assert_eq!(refused(|p| p.best = Some(0)), "best");
        assert_eq!(refused(|p| p.best = Some(6)), "best");
        assert_eq!(refused(|p| p.world_size = 2), "rows[0].parallel");
        assert_eq!(
            refused(|p| p.rows[1].parallel = Some("zero".into())),
            "rows[1].parallel"
        );
    }
}
