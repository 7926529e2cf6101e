//! Which choice saves the most: the row, other than a smaller size (which always saves, and
//! is the one thing a user usually cannot give up), whose peak reserved is lowest and below
//! the baseline's. Ties go to the earlier row (the order the choices were asked in).

use super::result::Plan;

/// The plan with `best` set.
pub fn complete(mut plan: Plan) -> Plan {
    plan.best = best(&plan);
    plan
}

fn best(plan: &Plan) -> Option<usize> {
    let baseline = plan.rows.first()?.peak_reserved?;
    let mut found: Option<(usize, u64)> = None;
    for (i, row) in plan.rows.iter().enumerate().skip(1) {
        let Some(reserved) = row.peak_reserved else {
            continue;
        };
        if row.axis == "size" || reserved >= baseline {
            continue;
        }
        if found.is_none_or(|(_, lowest)| reserved < lowest) {
            found = Some((i, reserved));
        }
    }
    found.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::plan::result::tests::plan;

    #[test]
    fn the_lowest_peak_that_is_not_a_smaller_size_wins() {
        // The smaller batch (500 MiB) is lower, but it is not a choice of how to train.
        assert_eq!(complete(plan()).best, Some(4)); // checkpointing, 600 MiB
    }

    #[test]
    fn no_choice_below_the_baseline_is_none() {
        let mut p = plan();
        p.rows[3].peak_reserved = Some(1000 << 20);
        p.rows[4].peak_reserved = Some(1200 << 20);
        assert_eq!(complete(p).best, None);
    }

    #[test]
    fn a_baseline_without_an_estimate_has_no_best() {
        let mut p = plan();
        p.rows[0].peak_reserved = None;
        assert_eq!(complete(p).best, None);
    }
}
