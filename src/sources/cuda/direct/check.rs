//! One check of the direct reader against torch's binding.
//!
//! Other threads (autograd's device threads, data loaders, NCCL) may allocate at any time,
//! so memory and the binding are compared only when nothing changed in between: memory is
//! read, then the binding, then memory again, and the values are compared only when both
//! memory reads agree on every located word. If they differ, the last memory read becomes
//! the first of a new try; after `TRIES` tries the check is inconclusive.

/// Tries before a check is called inconclusive.
pub const TRIES: u32 = 3;

/// What a check found. Each carries the binding's last answer (layout order).
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Memory equals torch on every compared statistic.
    Agree { torch: Vec<i64> },
    /// The first compared statistic (layout index) on which they differ, and both values.
    Differ {
        index: usize,
        memory: i64,
        torch_value: i64,
        torch: Vec<i64>,
    },
    /// Memory changed during every try: nothing could be compared.
    Inconclusive { torch: Vec<i64> },
}

/// Check `first` (a sample whose `stable` entries were just read from memory) against the
/// binding. `read_memory` overwrites the located entries of a sample with what memory says
/// now; `read_torch` calls the binding. Entries at `compared` must equal torch's.
pub fn compare<E>(
    first: &[i64],
    stable: &[usize],
    compared: &[usize],
    mut read_memory: impl FnMut(&mut [i64]),
    mut read_torch: impl FnMut() -> Result<Vec<i64>, E>,
) -> Result<Verdict, E> {
    let mut before = first.to_vec();
    let mut after = first.to_vec();
    let mut torch = Vec::new();
    for _ in 0..TRIES {
        torch = read_torch()?;
        read_memory(&mut after);
        if stable.iter().all(|&i| before[i] == after[i]) {
            for &index in compared {
                let memory = before[index];
                let torch_value = torch.get(index).copied();
                if torch_value != Some(memory) {
                    return Ok(Verdict::Differ {
                        index,
                        memory,
                        torch_value: torch_value.unwrap_or(0),
                        torch,
                    });
                }
            }
            return Ok(Verdict::Agree { torch });
        }
        before.copy_from_slice(&after);
    }
    Ok(Verdict::Inconclusive { torch })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    type NoError = std::convert::Infallible;

    #[test]
    fn equal_values_agree_with_one_binding_call() {
        let calls = Cell::new(0);
        let verdict = compare::<NoError>(
            &[1, 2, 3],
            &[0, 1],
            &[0, 1, 2],
            |out| {
                out[0] = 1;
                out[1] = 2;
            },
            || {
                calls.set(calls.get() + 1);
                Ok(vec![1, 2, 3])
            },
        )
        .unwrap();
        assert_eq!(
            verdict,
            Verdict::Agree {
                torch: vec![1, 2, 3]
            }
        );
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn a_stable_difference_names_the_statistic() {
        let verdict = compare::<NoError>(
            &[10, 20, 30],
            &[0, 1, 2],
            &[0, 1, 2],
            |out| out.copy_from_slice(&[10, 20, 30]),
            || Ok(vec![10, 532, 30]),
        )
        .unwrap();
        assert_eq!(
            verdict,
            Verdict::Differ {
                index: 1,
                memory: 20,
                torch_value: 532,
                torch: vec![10, 532, 30]
            }
        );
    }

    #[test]
    fn entries_not_compared_may_differ() {
        // Index 2 is a value refreshed from the binding this very sample: not compared.
        let verdict = compare::<NoError>(
            &[1, 2, 0],
            &[0, 1],
            &[0, 1],
            |out| out[..2].copy_from_slice(&[1, 2]),
            || Ok(vec![1, 2, 99]),
        )
        .unwrap();
        assert_eq!(
            verdict,
            Verdict::Agree {
                torch: vec![1, 2, 99]
            }
        );
    }

    #[test]
    fn memory_moving_between_reads_is_retried_then_compared() {
        // Memory moves during the first try (an allocation on another thread), then holds.
        let reads = Cell::new(0);
        let memory = [[5, 1], [6, 1], [6, 1]];
        let torch_calls = Cell::new(0);
        let verdict = compare::<NoError>(
            &[5, 1],
            &[0, 1],
            &[0, 1],
            |out| {
                out.copy_from_slice(&memory[reads.get() + 1]);
                reads.set(reads.get() + 1);
            },
            || {
                torch_calls.set(torch_calls.get() + 1);
                Ok(vec![6, 1])
            },
        )
        .unwrap();
        assert_eq!(verdict, Verdict::Agree { torch: vec![6, 1] });
        assert_eq!(torch_calls.get(), 2);
    }

    #[test]
    fn a_difference_while_memory_moves_is_not_a_mismatch() {
        // Torch said 7 while memory went 5 -> 6: no conclusion can be drawn from that try.
        let reads = Cell::new(5);
        let verdict = compare::<NoError>(
            &[5],
            &[0],
            &[0],
            |out| {
                reads.set(reads.get() + 1);
                out[0] = reads.get();
            },
            || Ok(vec![7]),
        )
        .unwrap();
        assert_eq!(verdict, Verdict::Inconclusive { torch: vec![7] });
        assert_eq!(reads.get(), 5 + TRIES as i64);
    }

    #[test]
    fn a_short_binding_answer_is_a_difference() {
        let verdict =
            compare::<NoError>(&[1, 2], &[0, 1], &[0, 1], |_| {}, || Ok(vec![1])).unwrap();
        assert!(matches!(
            verdict,
            Verdict::Differ {
                index: 1,
                torch_value: 0,
                ..
            }
        ));
    }

    #[test]
    fn binding_errors_propagate() {
        let result = compare(&[1], &[0], &[0], |_| {}, || Err("no binding"));
        assert_eq!(result, Err("no binding"));
    }
}
