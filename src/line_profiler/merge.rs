//! Line profiles of several ranks merged line by line (kind `merged_line_profile`): each
//! column's value on each rank, so that an imbalance (one rank holding the whole optimizer
//! state, say) stands out. The serde derive is the saved file's `data`; `check` adds the
//! rules between fields (distinct ranks, one entry per rank, one value per column).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::result::LineProfile;
use crate::results::DataError;

/// The highest rank a merged result may name (torch.distributed's ranks are C ints).
pub const RANK_MAX: u32 = i32::MAX as u32;

/// Line profiles of several ranks, line by line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedLineProfile {
    /// The columns every rank's profile has, in the first one's order.
    pub columns: Vec<String>,
    /// The ranks merged, in order: the per-rank lists below follow it.
    pub ranks: Vec<u32>,
    pub world_size: u32,
    pub functions: Vec<MergedFunction>,
    /// Every rank's notices, each as `rank R: ...`.
    pub notices: Vec<String>,
}

/// One function of the merged profile: its lines as any rank saw them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedFunction {
    pub qualname: String,
    pub filename: String,
    pub lines: Vec<MergedLine>,
}

/// One source line, saved as `[line, code, hits per rank, values per rank]`: None where a
/// rank's profile does not have the line; a rank's values are None where it never ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedLine(
    pub u32,
    pub String,
    pub Vec<Option<u64>>,
    pub Vec<Option<Vec<i64>>>,
);

/// min, median, max of the ranks' values (None: no value on that rank, left out) and the
/// first rank holding the maximum; all None when no rank has a value.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    pub min: Option<i64>,
    pub median: Option<Median>,
    pub max: Option<i64>,
    pub max_rank: Option<u32>,
}

/// A median: an integer, or halfway between two (`statistics.median` of an even count).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Median {
    Whole(i128),
    Half(f64),
}

impl Median {
    pub fn as_f64(self) -> f64 {
        match self {
            Median::Whole(n) => n as f64,
            Median::Half(x) => x,
        }
    }
}

/// The spread of `values` over `ranks` (as `results.merge.spread` computes it in Python).
pub fn spread(values: &[Option<i64>], ranks: &[u32]) -> Spread {
    let present: Vec<(i64, u32)> = values
        .iter()
        .zip(ranks)
        .filter_map(|(v, &r)| v.map(|v| (v, r)))
        .collect();
    if present.is_empty() {
        return Spread::default();
    }
    let mut numbers: Vec<i64> = present.iter().map(|&(v, _)| v).collect();
    numbers.sort_unstable();
    let n = numbers.len();
    let median = if n % 2 == 1 {
        Median::Whole(numbers[n / 2] as i128)
    } else {
        let sum = numbers[n / 2 - 1] as i128 + numbers[n / 2] as i128;
        if sum % 2 == 0 {
            Median::Whole(sum / 2)
        } else {
            Median::Half(sum as f64 / 2.0)
        }
    };
    let top = numbers[n - 1];
    Spread {
        min: Some(numbers[0]),
        median: Some(median),
        max: Some(top),
        max_rank: present.iter().find(|&&(v, _)| v == top).map(|&(_, r)| r),
    }
}

impl MergedLineProfile {
    /// The rules the derive cannot state.
    pub fn check(&self) -> Result<(), DataError> {
        let refuse = |path: String, message: String| Err(DataError { path, message });
        for (i, &rank) in self.ranks.iter().enumerate() {
            if rank > RANK_MAX {
                return refuse(
                    format!("ranks[{i}]"),
                    format!("must be at most {RANK_MAX}, got {rank}"),
                );
            }
            if self.ranks[..i].contains(&rank) {
                return refuse("ranks".into(), format!("lists rank {rank} twice"));
            }
        }
        if self.world_size == 0 || self.world_size > RANK_MAX + 1 {
            return refuse(
                "world_size".into(),
                format!(
                    "must be from 1 to {}, got {}",
                    RANK_MAX as u64 + 1,
                    self.world_size
                ),
            );
        }
        let (ranks, width) = (self.ranks.len(), self.columns.len());
        for (f, function) in self.functions.iter().enumerate() {
            for (l, MergedLine(ln, _, hits, values)) in function.lines.iter().enumerate() {
                let path = format!("functions[{f}].lines[{l}]");
                if hits.len() != ranks || values.len() != ranks {
                    return refuse(
                        path,
                        format!(
                            "line {ln} of {}: {} hits and {} values for {ranks} ranks",
                            function.qualname,
                            hits.len(),
                            values.len()
                        ),
                    );
                }
                if values.iter().flatten().any(|v| v.len() != width) {
                    return refuse(
                        path,
                        format!(
                            "line {ln} of {}: values for other than {width} columns",
                            function.qualname
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// The qualified names of the functions, in report order.
    pub fn names(&self) -> Vec<&str> {
        self.functions.iter().map(|f| f.qualname.as_str()).collect()
    }

    /// Each rank's value of `column` (by index) on `line`.
    pub fn per_rank(line: &MergedLine, column: usize) -> Vec<Option<i64>> {
        line.3
            .iter()
            .map(|v| v.as_ref().map(|v| v[column]))
            .collect()
    }
}

/// Merge one line profile per rank (ordered by rank, `ranks` theirs) of a job of `world`
/// processes: the columns all of them have; per function (in the order they first
/// appear) each line as any rank saw it, by number and code, in line order.
pub fn merge(
    profiles: &[LineProfile],
    ranks: &[u32],
    world: u32,
) -> Result<MergedLineProfile, String> {
    let first = profiles
        .first()
        .ok_or("merge_results: no line profiles to merge")?;
    let columns: Vec<String> = first
        .columns
        .iter()
        .filter(|c| profiles.iter().all(|p| p.columns.contains(c)))
        .cloned()
        .collect();
    if columns.is_empty() {
        return Err("merge_results: the line profiles have no column in common".into());
    }
    let n = profiles.len();
    let mut functions: Vec<MergedFunction> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    // (function, line, code) -> its place in the function's lines, in first-seen order.
    let mut places: HashMap<(usize, u32, String), usize> = HashMap::new();
    for (i, profile) in profiles.iter().enumerate() {
        let picks: Vec<usize> = columns
            .iter()
            .map(|c| profile.columns.iter().position(|p| p == c).unwrap_or(0))
            .collect();
        for function in &profile.functions {
            let at = *seen.entry(function.qualname.clone()).or_insert_with(|| {
                functions.push(MergedFunction {
                    qualname: function.qualname.clone(),
                    filename: function.filename.clone(),
                    lines: Vec::new(),
                });
                functions.len() - 1
            });
            for line in &function.lines {
                let code = line.code().to_string();
                let lines = &mut functions[at].lines;
                let place = *places.entry((at, line.0, code.clone())).or_insert_with(|| {
                    lines.push(MergedLine(line.0, code, vec![None; n], vec![None; n]));
                    lines.len() - 1
                });
                lines[place].2[i] = Some(line.2);
                lines[place].3[i] = line.values().map(|v| picks.iter().map(|&j| v[j]).collect());
            }
        }
    }
    for function in &mut functions {
        function.lines.sort_by_key(|line| line.0); // stable: first seen first on a tie
    }
    let notices = ranks
        .iter()
        .zip(profiles)
        .flat_map(|(r, p)| {
            p.notices
                .iter()
                .map(move |text| format!("rank {r}: {text}"))
        })
        .collect();
    Ok(MergedLineProfile {
        columns,
        ranks: ranks.to_vec(),
        world_size: world,
        functions,
        notices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{from_json, to_json};

    fn profile(alloc: i64, extra_line: bool, notices: &[&str]) -> LineProfile {
        let mut text = format!(
            r#"{{"columns":["x.all.peak","a.all.allocated"],"functions":[{{"qualname":"grow","filename":"m.py","lines":[[1,"def grow(n):\n",0,null],[2,"    x = zeros(n)\n",1,[9,{alloc}]]"#
        );
        if extra_line {
            text.push_str(r#",[3,"    y = 1\n",1,[0,0]]"#);
        }
        text.push_str(&format!(
            r#"]}}],"notices":{}}}"#,
            serde_json::to_string(notices).unwrap()
        ));
        from_json(&text).unwrap()
    }

    #[test]
    fn lines_of_every_rank_by_number_and_code() {
        let merged = merge(
            &[
                profile(1024, false, &[]),
                profile(2048, true, &["dropped 3"]),
            ],
            &[0, 3],
            4,
        )
        .unwrap();
        assert_eq!(merged.columns, vec!["x.all.peak", "a.all.allocated"]);
        let lines = &merged.functions[0].lines;
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1].1, "    x = zeros(n)");
        assert_eq!(lines[1].2, vec![Some(1), Some(1)]);
        assert_eq!(
            MergedLineProfile::per_rank(&lines[1], 1),
            vec![Some(1024), Some(2048)]
        );
        assert_eq!(lines[2].2, vec![None, Some(1)]);
        assert_eq!(merged.notices, vec!["rank 3: dropped 3"]);
        merged.check().unwrap();
        let back: MergedLineProfile = from_json(&to_json(&merged)).unwrap();
        assert_eq!(back, merged);
    }

    #[test]
    fn no_common_column_and_damaged_merges_are_errors() {
        let mut other = profile(1, false, &[]);
        other.columns = vec!["p".into(), "q".into()];
        assert_eq!(
            merge(&[profile(1, false, &[]), other], &[0, 1], 2).unwrap_err(),
            "merge_results: the line profiles have no column in common"
        );
        let mut merged = merge(&[profile(1, false, &[])], &[0], 1).unwrap();
        merged.ranks = vec![0, 0];
        assert_eq!(
            merged.check().unwrap_err().to_string(),
            "ranks: lists rank 0 twice"
        );
        merged.ranks = vec![1];
        merged.functions[0].lines[1].3[0] = Some(vec![1]);
        assert_eq!(
            merged.check().unwrap_err().to_string(),
            "functions[0].lines[1]: line 2 of grow: values for other than 2 columns"
        );
    }

    #[test]
    fn spread_is_pythons() {
        let s = spread(&[Some(1), None, Some(5), Some(3)], &[0, 1, 2, 3]);
        assert_eq!((s.min, s.max, s.max_rank), (Some(1), Some(5), Some(2)));
        assert_eq!(s.median, Some(Median::Whole(3)));
        let s = spread(&[Some(1), Some(2)], &[0, 1]);
        assert_eq!(s.median, Some(Median::Half(1.5)));
        assert_eq!(spread(&[None], &[0]), Spread::default());
        let s = spread(&[Some(7), Some(7)], &[4, 2]);
        assert_eq!(
            s.max_rank,
            Some(4),
            "the first rank in order holding the max"
        );
    }
}
