//! The scalars that follow `requested_bytes` in torch's `DeviceStats`.
//!
//! Read from torch's headers (`c10/cuda/CUDACachingAllocator.h`, later
//! `c10/core/CachingDeviceAllocator.h`), every release from 2.5 on keeps them in this
//! order, all `int64_t` (a `Stat` is four: current, peak, allocated, freed):
//!
//! ```text
//! num_alloc_retries, num_ooms, oversize_allocations (Stat), oversize_segments (Stat),
//! num_sync_all_streams, num_device_alloc, num_device_free, [num_oom_rejections,]
//! max_split_size
//! ```
//!
//! `num_oom_rejections` appears in newer releases only. The binding returns each of them
//! under the same name. An order is accepted only when it is the only known order that
//! fits both the binding's names and, word by word, the values it returned.

/// One piece of a known order.
#[derive(Clone, Copy)]
enum Piece {
    /// One `int64_t` the binding returns under this name.
    Scalar(&'static str),
    /// A `Stat`: `.current`, `.peak`, `.allocated`, `.freed`.
    Stat(&'static str),
    /// One `int64_t` a release may have without returning it: compared when returned.
    Unnamed(&'static str),
}

use Piece::{Scalar, Stat, Unnamed};

const STAT_FIELDS: [&str; 4] = ["current", "peak", "allocated", "freed"];

/// The orders seen in torch releases, each with the releases it was read from.
const ORDERS: [(&str, &[Piece]); 2] = [
    (
        "torch 2.5 and later",
        &[
            Scalar("num_alloc_retries"),
            Scalar("num_ooms"),
            Stat("oversize_allocations"),
            Stat("oversize_segments"),
            Scalar("num_sync_all_streams"),
            Scalar("num_device_alloc"),
            Scalar("num_device_free"),
            Scalar("max_split_size"),
        ],
    ),
    (
        "torch with num_oom_rejections",
        &[
            Scalar("num_alloc_retries"),
            Scalar("num_ooms"),
            Stat("oversize_allocations"),
            Stat("oversize_segments"),
            Scalar("num_sync_all_streams"),
            Scalar("num_device_alloc"),
            Scalar("num_device_free"),
            Unnamed("num_oom_rejections"),
            Scalar("max_split_size"),
        ],
    ),
];

/// The words of one order: (name, whether the binding must return it).
fn words(order: &[Piece]) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for piece in order {
        match *piece {
            Scalar(name) => out.push((name.to_string(), true)),
            Unnamed(name) => out.push((name.to_string(), false)),
            Stat(name) => {
                for field in STAT_FIELDS {
                    out.push((format!("{name}.{field}"), true));
                }
            }
        }
    }
    out
}

/// Every name some known order places after `requested_bytes`.
pub fn known_names() -> Vec<String> {
    let mut names: Vec<String> = ORDERS
        .iter()
        .flat_map(|(_, order)| words(order))
        .map(|(name, _)| name)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Locate the tail in `memory` (the words right after `requested_bytes`), given what the
/// binding returned (`value_of(name)`: None for a name it does not return). Returns each
/// returned name with its word offset in `memory`.
pub fn locate(
    memory: &[i64],
    value_of: impl Fn(&str) -> Option<i64>,
) -> Result<Vec<(String, usize)>, String> {
    let known = known_names();
    let returned: Vec<&String> = known.iter().filter(|n| value_of(n).is_some()).collect();
    let mut fits = Vec::new();
    for (releases, order) in ORDERS {
        let words = words(order);
        // An order must place every scalar the binding returns, and the binding must
        // return every word the order says it does.
        let placed = returned.iter().all(|n| words.iter().any(|(w, _)| w == *n));
        let present = words
            .iter()
            .all(|(w, required)| !required || value_of(w).is_some());
        if !placed || !present || memory.len() < words.len() {
            continue;
        }
        let matches = words
            .iter()
            .zip(memory)
            .all(|((name, _), &word)| value_of(name).is_none_or(|value| value == word));
        if matches {
            let fields = words
                .iter()
                .enumerate()
                .filter(|(_, (name, _))| value_of(name).is_some())
                .map(|(offset, (name, _))| (name.clone(), offset))
                .collect();
            fits.push((releases, fields));
        }
    }
    match fits.len() {
        1 => Ok(fits.pop().expect("one").1),
        0 => Err(format!(
            "the counters after requested_bytes are in no known order (memory there: {:?}; \
             torch: {})",
            &memory[..memory.len().min(20)],
            returned
                .iter()
                .map(|n| format!("{n}={}", value_of(n).unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => Err(format!(
            "the counters after requested_bytes fit more than one order ({})",
            fits.iter().map(|(r, _)| *r).collect::<Vec<_>>().join("; ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A DeviceStats tail as memory holds it, and the binding's answer for it.
    fn release(
        with_rejections: bool,
        rejections_returned: bool,
    ) -> (Vec<i64>, HashMap<String, i64>) {
        let mut memory = vec![2, 1]; // num_alloc_retries, num_ooms
        memory.extend([3, 4, 5, 6]); // oversize_allocations
        memory.extend([7, 8, 9, 10]); // oversize_segments
        memory.extend([11, 12, 13]); // num_sync_all_streams, num_device_alloc, num_device_free
        if with_rejections {
            memory.push(0);
        }
        memory.push(-1); // max_split_size
        memory.extend([0x7f00_1234, 0, 42]); // whatever follows the struct
        let mut binding = HashMap::new();
        for (name, value) in [
            ("num_alloc_retries", 2),
            ("num_ooms", 1),
            ("oversize_allocations.current", 3),
            ("oversize_allocations.peak", 4),
            ("oversize_allocations.allocated", 5),
            ("oversize_allocations.freed", 6),
            ("oversize_segments.current", 7),
            ("oversize_segments.peak", 8),
            ("oversize_segments.allocated", 9),
            ("oversize_segments.freed", 10),
            ("num_sync_all_streams", 11),
            ("num_device_alloc", 12),
            ("num_device_free", 13),
            ("max_split_size", -1),
        ] {
            binding.insert(name.to_string(), value);
        }
        if rejections_returned {
            binding.insert("num_oom_rejections".into(), 0);
        }
        (memory, binding)
    }

    fn offsets(found: &[(String, usize)]) -> HashMap<&str, usize> {
        found.iter().map(|(n, o)| (n.as_str(), *o)).collect()
    }

    #[test]
    fn the_order_without_rejections() {
        let (memory, binding) = release(false, false);
        let found = locate(&memory, |n| binding.get(n).copied()).unwrap();
        assert_eq!(found.len(), 14);
        let at = offsets(&found);
        assert_eq!(at["num_alloc_retries"], 0);
        assert_eq!(at["oversize_segments.freed"], 9);
        assert_eq!(at["num_device_free"], 12);
        assert_eq!(at["max_split_size"], 13);
    }

    #[test]
    fn the_order_with_rejections_returned() {
        let (memory, binding) = release(true, true);
        let found = locate(&memory, |n| binding.get(n).copied()).unwrap();
        let at = offsets(&found);
        assert_eq!(at["num_oom_rejections"], 13);
        assert_eq!(at["max_split_size"], 14);
        assert_eq!(at.len(), 15);
    }

    #[test]
    fn the_order_with_rejections_not_returned() {
        // The struct has the word, the binding does not return it: skipped, not located.
        let (memory, binding) = release(true, false);
        let found = locate(&memory, |n| binding.get(n).copied()).unwrap();
        let at = offsets(&found);
        assert_eq!(at["max_split_size"], 14);
        assert!(!at.contains_key("num_oom_rejections"));
    }

    #[test]
    fn one_wrong_word_rejects_the_location() {
        let (mut memory, binding) = release(false, false);
        memory[1] = 0; // num_ooms differs
        let error = locate(&memory, |n| binding.get(n).copied()).unwrap_err();
        assert!(error.contains("no known order"), "{error}");
        assert!(error.contains("memory there: [2, 0, 3,"), "{error}");
        assert!(error.contains("num_ooms=1"), "{error}");
    }

    #[test]
    fn an_unknown_returned_counter_is_never_guessed() {
        // A name the binding returns is in no known order's place: nothing is located
        // (placing num_oom_rejections where the first order has max_split_size would be
        // a guess).
        let (memory, binding) = release(false, true);
        assert!(locate(&memory, |n| binding.get(n).copied()).is_err());
    }

    #[test]
    fn two_fitting_orders_are_ambiguous() {
        // max_split_size repeated in the word after the struct: both orders fit.
        let (mut memory, binding) = release(false, false);
        memory[14] = -1;
        let error = locate(&memory, |n| binding.get(n).copied()).unwrap_err();
        assert!(error.contains("more than one order"), "{error}");
    }

    #[test]
    fn too_few_readable_words() {
        let (memory, binding) = release(false, false);
        assert!(locate(&memory[..10], |n| binding.get(n).copied()).is_err());
    }
}
