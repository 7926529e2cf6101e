//! The tensor diff: live tensors grouped by (type, shape, dtype), each storage charged once,
//! and what changed between two calls, group by group.

use std::collections::{BTreeSet, HashMap, HashSet};

/// One live tensor, as the tracker sees it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Python's `str(type(t))`, e.g. `<class 'torch.Tensor'>`.
    pub kind: String,
    pub shape: String,
    pub dtype: String,
    /// The model's name for it, if it has one.
    pub name: Option<String>,
    /// (storage key, storage bytes); None for tensors without a storage of their own.
    pub storage: Option<(usize, u64)>,
}

/// What identifies a group: the original's (type, size, dtype).
pub type GroupKey = (String, String, String);

/// A group's live tensors, the bytes of the storages first seen in it, its named tensors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Group {
    pub count: u64,
    pub bytes: u64,
    pub names: BTreeSet<String>,
}

/// Group tensors in the order given (named ones first, so a view of a parameter never
/// takes the parameter's storage); each storage is charged to the first group that shows
/// it. Returns the groups and the total bytes.
pub fn group(seen: &[Seen]) -> (HashMap<GroupKey, Group>, u64) {
    let mut groups: HashMap<GroupKey, Group> = HashMap::new();
    let mut charged: HashSet<usize> = HashSet::new();
    let mut total = 0;
    for t in seen {
        let g = groups
            .entry((t.kind.clone(), t.shape.clone(), t.dtype.clone()))
            .or_default();
        g.count += 1;
        if let Some(name) = &t.name {
            g.names.insert(name.clone());
        }
        if let Some((key, bytes)) = t.storage {
            if charged.insert(key) {
                g.bytes += bytes;
                total += bytes;
            }
        }
    }
    (groups, total)
}

/// One line of the diff: `+` for what appeared, `-` for what vanished.
#[derive(Clone, Debug, PartialEq)]
pub struct DiffRow {
    pub sign: char,
    pub count: u64,
    pub kind: String,
    pub shape: String,
    pub dtype: String,
    /// Bytes that appeared (or vanished) with these tensors.
    pub bytes: u64,
    /// Model names of the tensors that appeared (or vanished).
    pub names: Vec<String>,
}

/// What changed from `before` to `now`: per group, the tensors (and bytes) that appeared,
/// then those that vanished. A group whose count and bytes both grew (or shrank) is one row;
/// one where they moved in opposite directions (a tensor replaced by a view of a larger
/// storage) gets a `+` row for the count and a `-` row for the bytes, or the other way round.
/// Rows are ordered: appeared first, largest first, then vanished, largest first.
pub fn diff(before: &HashMap<GroupKey, Group>, now: &HashMap<GroupKey, Group>) -> Vec<DiffRow> {
    let empty = Group::default();
    let keys: BTreeSet<&GroupKey> = before.keys().chain(now.keys()).collect();
    let mut plus = Vec::new();
    let mut minus = Vec::new();
    for key in keys {
        let old = before.get(key).unwrap_or(&empty);
        let new = now.get(key).unwrap_or(&empty);
        if old == new {
            continue;
        }
        let row = |sign, count: u64, bytes: u64, names: Vec<String>| DiffRow {
            sign,
            count,
            kind: key.0.clone(),
            shape: key.1.clone(),
            dtype: key.2.clone(),
            bytes,
            names,
        };
        let appeared: Vec<String> = new.names.difference(&old.names).cloned().collect();
        let vanished: Vec<String> = old.names.difference(&new.names).cloned().collect();
        let up = (
            new.count.saturating_sub(old.count),
            new.bytes.saturating_sub(old.bytes),
        );
        let down = (
            old.count.saturating_sub(new.count),
            old.bytes.saturating_sub(new.bytes),
        );
        if up != (0, 0) || !appeared.is_empty() {
            plus.push(row('+', up.0, up.1, appeared));
        }
        if down != (0, 0) || !vanished.is_empty() {
            minus.push(row('-', down.0, down.1, vanished));
        }
    }
    let order = |a: &DiffRow, b: &DiffRow| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then(a.shape.cmp(&b.shape))
    };
    plus.sort_by(order);
    minus.sort_by(order);
    plus.extend(minus);
    plus
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &str, name: Option<&str>, storage: Option<(usize, u64)>) -> Seen {
        Seen {
            kind: "<class 'torch.Tensor'>".into(),
            shape: shape.into(),
            dtype: "torch.float32".into(),
            name: name.map(String::from),
            storage,
        }
    }

    #[test]
    fn views_are_charged_once_and_groups_count_tensors() {
        let seen = [
            t("(4, 4)", Some("w"), Some((1, 64))),
            t("(16,)", None, Some((1, 64))), // a view of w
            t("(4, 4)", None, Some((2, 64))),
        ];
        let (groups, total) = group(&seen);
        assert_eq!(total, 128);
        let key = |s: &str| {
            (
                "<class 'torch.Tensor'>".to_string(),
                s.to_string(),
                "torch.float32".to_string(),
            )
        };
        assert_eq!(groups[&key("(4, 4)")].count, 2);
        assert_eq!(groups[&key("(4, 4)")].bytes, 128);
        assert_eq!(groups[&key("(16,)")].bytes, 0);
    }

    #[test]
    fn a_group_that_grows_is_one_plus_row_with_the_difference() {
        let (before, _) = group(&[t("(2,)", None, Some((1, 8)))]);
        let (now, _) = group(&[
            t("(2,)", None, Some((1, 8))),
            t("(2,)", Some("b"), Some((2, 8))),
        ]);
        let rows = diff(&before, &now);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].sign, rows[0].count, rows[0].bytes), ('+', 1, 8));
        assert_eq!(rows[0].names, vec!["b".to_string()]);
        let back = diff(&now, &before);
        assert_eq!((back[0].sign, back[0].count, back[0].bytes), ('-', 1, 8));
        assert!(diff(&now, &now).is_empty());
    }
}
