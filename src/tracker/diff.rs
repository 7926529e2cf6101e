//! The tensor diff: live tensors grouped by (type, shape, dtype), each storage charged once,
//! and what changed between two calls, group by group.
//!
//! Two byte counts travel together: a storage's own bytes (`nbytes()`, what the log prints,
//! as the original tool does) and what the allocator holds for it (`blocks`: on CUDA rounded
//! up to the caching allocator's 512-byte blocks, on the CPU the same bytes).

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
    /// Its storage; None for tensors without a storage of their own.
    pub storage: Option<Storage>,
}

/// A storage: its identity, its own bytes, and the allocator's bytes for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Storage {
    pub key: usize,
    /// `nbytes()`.
    pub nbytes: u64,
    /// What the allocator holds for it (CUDA: `nbytes` rounded up to 512).
    pub blocks: u64,
}

/// What identifies a group: the original's (type, size, dtype).
pub type GroupKey = (String, String, String);

/// A group's live tensors, the bytes of the storages first seen in it (their own, and the
/// allocator's), its named tensors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Group {
    pub count: u64,
    /// The allocator's bytes (the data's `bytes`, as the tensor report charges them).
    pub bytes: u64,
    /// The storages' own bytes (what the log prints).
    pub storage_bytes: u64,
    pub names: BTreeSet<String>,
}

/// Bytes of every storage seen, each once: their own and the allocator's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub bytes: u64,
    pub storage_bytes: u64,
}

/// Group tensors in the order given (named ones first, so a view of a parameter never
/// takes the parameter's storage); each storage is charged to the first group that shows
/// it. Returns the groups and the totals.
pub fn group(seen: &[Seen]) -> (HashMap<GroupKey, Group>, Totals) {
    let mut groups: HashMap<GroupKey, Group> = HashMap::new();
    let mut charged: HashSet<usize> = HashSet::new();
    let mut total = Totals::default();
    for t in seen {
        let g = groups
            .entry((t.kind.clone(), t.shape.clone(), t.dtype.clone()))
            .or_default();
        g.count += 1;
        if let Some(name) = &t.name {
            g.names.insert(name.clone());
        }
        if let Some(storage) = t.storage {
            if charged.insert(storage.key) {
                g.bytes += storage.blocks;
                g.storage_bytes += storage.nbytes;
                total.bytes += storage.blocks;
                total.storage_bytes += storage.nbytes;
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
    /// Bytes of the storages that appeared (or vanished) with these tensors: the
    /// allocator's (`bytes`) and their own (`storage_bytes`, the log's figure).
    pub bytes: u64,
    pub storage_bytes: u64,
    /// Model names of the tensors that appeared (or vanished).
    pub names: Vec<String>,
}

/// What changed from `before` to `now`: per group, the tensors (and bytes) that appeared,
/// then those that vanished. A group whose count and bytes all grew (or shrank) is one row;
/// one where they moved in opposite directions (a tensor replaced by a view of a larger
/// storage) gets a `+` row for what grew and a `-` row for what shrank.
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
        let row = |sign, (count, bytes, storage_bytes): (u64, u64, u64), names| DiffRow {
            sign,
            count,
            kind: key.0.clone(),
            shape: key.1.clone(),
            dtype: key.2.clone(),
            bytes,
            storage_bytes,
            names,
        };
        let appeared: Vec<String> = new.names.difference(&old.names).cloned().collect();
        let vanished: Vec<String> = old.names.difference(&new.names).cloned().collect();
        let grown = |a: &Group, b: &Group| {
            (
                a.count.saturating_sub(b.count),
                a.bytes.saturating_sub(b.bytes),
                a.storage_bytes.saturating_sub(b.storage_bytes),
            )
        };
        let (up, down) = (grown(new, old), grown(old, new));
        if up != (0, 0, 0) || !appeared.is_empty() {
            plus.push(row('+', up, appeared));
        }
        if down != (0, 0, 0) || !vanished.is_empty() {
            minus.push(row('-', down, vanished));
        }
    }
    let order = |a: &DiffRow, b: &DiffRow| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.storage_bytes.cmp(&a.storage_bytes))
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

    /// A tensor on the CPU: the allocator holds its storage's bytes.
    fn t(shape: &str, name: Option<&str>, storage: Option<(usize, u64)>) -> Seen {
        Seen {
            kind: "<class 'torch.Tensor'>".into(),
            shape: shape.into(),
            dtype: "torch.float32".into(),
            name: name.map(String::from),
            storage: storage.map(|(key, nbytes)| Storage {
                key,
                nbytes,
                blocks: nbytes,
            }),
        }
    }

    /// A tensor on CUDA: the allocator holds 512-byte blocks.
    fn on_cuda(shape: &str, key: usize, nbytes: u64) -> Seen {
        let mut seen = t(shape, None, Some((key, nbytes)));
        seen.storage = seen.storage.map(|s| Storage {
            blocks: nbytes.div_ceil(512) * 512,
            ..s
        });
        seen
    }

    #[test]
    fn views_are_charged_once_and_groups_count_tensors() {
        let seen = [
            t("(4, 4)", Some("w"), Some((1, 64))),
            t("(16,)", None, Some((1, 64))), // a view of w
            t("(4, 4)", None, Some((2, 64))),
        ];
        let (groups, total) = group(&seen);
        assert_eq!(
            total,
            Totals {
                bytes: 128,
                storage_bytes: 128
            }
        );
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
    fn rows_carry_storage_bytes_and_allocator_blocks() {
        // The original's VGG-19 rows: (64, 3, 3, 3) is 6912 bytes in 7168 of blocks, two
        // (64,) are 256 bytes each in a block of 512 each.
        let (now, total) = group(&[
            on_cuda("(64, 3, 3, 3)", 1, 6912),
            on_cuda("(64,)", 2, 256),
            on_cuda("(64,)", 3, 256),
        ]);
        let rows = diff(&HashMap::new(), &now);
        let got: Vec<_> = rows
            .iter()
            .map(|r| (r.count, r.storage_bytes, r.bytes))
            .collect();
        assert_eq!(got, vec![(1, 6912, 7168), (2, 512, 1024)]);
        assert_eq!((total.storage_bytes, total.bytes), (7424, 8192));
    }

    #[test]
    fn bytes_and_blocks_moving_apart_give_a_row_each_way() {
        // Two storages of 513 bytes (a block of 1024 each) replaced by 1000 and 30 bytes
        // (1024 and 512): 4 bytes more of storage, 512 fewer of blocks.
        let (before, _) = group(&[on_cuda("(2,)", 1, 513), on_cuda("(2,)", 2, 513)]);
        let (now, _) = group(&[on_cuda("(2,)", 3, 1000), on_cuda("(2,)", 4, 30)]);
        let rows = diff(&before, &now);
        let got: Vec<_> = rows
            .iter()
            .map(|r| (r.sign, r.count, r.storage_bytes, r.bytes))
            .collect();
        assert_eq!(got, vec![('+', 0, 4, 0), ('-', 0, 0, 512)]);
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
