//! The columns of a line report: every statistic a memory source can have, and the check
//! that turns a wrong column name into a clear error before anything runs (or renders).
//!
//! The CUDA catalogue follows the key pattern that `torch.cuda.memory_stats()` documents,
//! built here because asking torch for its keys would initialise CUDA. It is a superset: a
//! torch version may lack a recent key (`num_oom_rejections`), which the report then names.
//! The CPU source counts tensor storages under the same names, in the one pool `all`: its
//! catalogue is the CPU source's own layout (`crate::sources::layout::Layout::cpu`).

use crate::sources::layout::Layout;

/// The columns a report shows unless asked for others (pytorch_memlab's).
pub const DEFAULT: [&str; 2] = ["active_bytes.all.peak", "reserved_bytes.all.peak"];

/// `<statistic>.<pool>.<field>`
const CUDA_STATS: [&str; 9] = [
    "allocated_bytes",
    "active_bytes",
    "requested_bytes",
    "reserved_bytes",
    "inactive_split_bytes",
    "allocation",
    "active",
    "segment",
    "inactive_split",
];
const POOLS: [&str; 3] = ["all", "large_pool", "small_pool"];
const FIELDS: [&str; 4] = ["current", "peak", "allocated", "freed"];
/// `<statistic>.<field>`, no pool.
const OVERSIZE: [&str; 2] = ["oversize_allocations", "oversize_segments"];
const SCALARS: [&str; 7] = [
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
    "num_oom_rejections",
    "max_split_size",
];
/// `reserved_bytes_by_private_pools.<MemPool id>.<pool>.<field>`: one set per private pool.
const PRIVATE_POOLS: &str = "reserved_bytes_by_private_pools.";

/// Every key `torch.cuda.memory_stats()` can have (private pools aside), sorted as torch
/// sorts them.
pub fn cuda_catalogue() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for stat in CUDA_STATS {
        for pool in POOLS {
            for field in FIELDS {
                names.push(format!("{stat}.{pool}.{field}"));
            }
        }
    }
    for stat in OVERSIZE {
        for field in FIELDS {
            names.push(format!("{stat}.{field}"));
        }
    }
    names.extend(SCALARS.iter().map(|s| s.to_string()));
    names.sort();
    names
}

/// The CPU source's columns, in the order it stores them.
pub fn cpu_catalogue() -> Vec<String> {
    Layout::cpu().names
}

/// The columns the source of `device` (`"cpu"` or `"cuda:N"`) can have.
pub fn catalogue(device: &str) -> Vec<String> {
    if device == "cpu" {
        cpu_catalogue()
    } else {
        cuda_catalogue()
    }
}

/// Whether `column` names a private pool's statistic (`reserved_bytes_by_private_pools.<id>.
/// <pool>.<field>`), which no catalogue can list.
fn private_pool(column: &str) -> bool {
    let Some(rest) = column.strip_prefix(PRIVATE_POOLS) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('.').collect();
    matches!(parts.as_slice(), [id, pool, field]
        if !id.is_empty()
            && !id.chars().any(char::is_whitespace)
            && POOLS.contains(pool)
            && FIELDS.contains(field))
}

/// Check `columns` against what the source of `device` has: `known` (the names it reported)
/// when it reported some, else its catalogue. The error names the first unknown column,
/// the closest valid name, and every valid one.
pub fn check(columns: &[String], device: &str, known: &[String]) -> Result<(), String> {
    let catalogue;
    let valid: &[String] = if known.is_empty() {
        catalogue = self::catalogue(device);
        &catalogue
    } else {
        known
    };
    for column in columns {
        if valid.contains(column) || (device != "cpu" && known.is_empty() && private_pool(column)) {
            continue;
        }
        return Err(unknown(column, device, valid));
    }
    Ok(())
}

/// Check `columns` against the columns a saved line profile holds (`saved`), for a result
/// made on `device` (None: not said, read as CUDA).
pub fn check_saved(
    columns: &[String],
    saved: &[String],
    device: Option<&str>,
) -> Result<(), String> {
    let nothing = [String::new()];
    let known = if saved.is_empty() {
        &nothing[..]
    } else {
        saved
    };
    check(columns, device.unwrap_or("cuda:0"), known)
}

fn unknown(column: &str, device: &str, valid: &[String]) -> String {
    let source = if device == "cpu" { "CPU" } else { "CUDA" };
    let why = if device == "cpu" && cuda_catalogue().iter().any(|c| c == column) {
        format!(
            "column {} is a CUDA statistic that the CPU source does not have (it counts \
             tensor storages, in the one pool 'all')",
            repr(column)
        )
    } else {
        let mut why = format!("unknown column {} for the {source} source", repr(column));
        if let Some(close) = closest(column, valid) {
            why.push_str(&format!(" (did you mean {}?)", repr(close)));
        }
        why
    };
    format!(
        "{why}. The columns are keys of torch.cuda.memory_stats(); this source has: {}",
        valid.join(", ")
    )
}

/// A string as Python's `repr()` writes it (`'name'`), for messages that quote a name the
/// way the rest of the API's errors do.
pub fn repr(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// The valid name closest to `word`, as Python's `difflib.get_close_matches(word, valid,
/// n=1)` picks it (the highest ratio of at least 0.6; on a tie, the greatest name).
fn closest<'a>(word: &str, valid: &'a [String]) -> Option<&'a str> {
    let b: Vec<char> = word.chars().collect();
    let matcher = Matcher::new(&b);
    let mut best: Option<(f64, &str)> = None;
    for candidate in valid {
        let a: Vec<char> = candidate.chars().collect();
        let ratio = matcher.ratio(&a);
        if ratio < 0.6 {
            continue;
        }
        let better = match best {
            None => true,
            Some((score, name)) => ratio > score || (ratio == score && candidate.as_str() > name),
        };
        if better {
            best = Some((ratio, candidate));
        }
    }
    best.map(|(_, name)| name)
}

/// `difflib.SequenceMatcher` with `b` fixed (no junk function; its automatic junk
/// heuristic for sequences of 200 items or more), enough for `ratio()`.
struct Matcher<'b> {
    b: &'b [char],
    /// Each item of `b` (popular ones left out) and where it occurs, in order.
    b2j: std::collections::HashMap<char, Vec<usize>>,
}

impl<'b> Matcher<'b> {
    fn new(b: &'b [char]) -> Self {
        let mut b2j: std::collections::HashMap<char, Vec<usize>> = Default::default();
        for (j, &c) in b.iter().enumerate() {
            b2j.entry(c).or_default().push(j);
        }
        let n = b.len();
        if n >= 200 {
            let most = n / 100 + 1;
            b2j.retain(|_, places| places.len() <= most);
        }
        Self { b, b2j }
    }

    /// `2 * M / T`: M the items of the matching blocks, T both lengths.
    fn ratio(&self, a: &[char]) -> f64 {
        let total = a.len() + self.b.len();
        if total == 0 {
            return 1.0;
        }
        let mut matches = 0;
        let mut queue = vec![(0, a.len(), 0, self.b.len())];
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let (i, j, k) = self.longest(a, alo, ahi, blo, bhi);
            if k > 0 {
                matches += k;
                if alo < i && blo < j {
                    queue.push((alo, i, blo, j));
                }
                if i + k < ahi && j + k < bhi {
                    queue.push((i + k, ahi, j + k, bhi));
                }
            }
        }
        2.0 * matches as f64 / total as f64
    }

    /// `find_longest_match(alo, ahi, blo, bhi)` without junk: (i, j, size).
    fn longest(
        &self,
        a: &[char],
        alo: usize,
        ahi: usize,
        blo: usize,
        bhi: usize,
    ) -> (usize, usize, usize) {
        let b = self.b;
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0);
        let mut j2len: std::collections::HashMap<usize, usize> = Default::default();
        for (i, item) in a.iter().enumerate().take(ahi).skip(alo) {
            let mut next: std::collections::HashMap<usize, usize> = Default::default();
            if let Some(places) = self.b2j.get(item) {
                for &j in places {
                    if j < blo {
                        continue;
                    }
                    if j >= bhi {
                        break;
                    }
                    let k = j
                        .checked_sub(1)
                        .and_then(|p| j2len.get(&p))
                        .copied()
                        .unwrap_or(0)
                        + 1;
                    next.insert(j, k);
                    if k > bestsize {
                        besti = i + 1 - k;
                        bestj = j + 1 - k;
                        bestsize = k;
                    }
                }
            }
            j2len = next;
        }
        // Popular items left out of b2j may still extend the match on either side.
        while besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1] {
            besti -= 1;
            bestj -= 1;
            bestsize += 1;
        }
        while besti + bestsize < ahi
            && bestj + bestsize < bhi
            && a[besti + bestsize] == b[bestj + bestsize]
        {
            bestsize += 1;
        }
        (besti, bestj, bestsize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn catalogues() {
        let cuda = cuda_catalogue();
        assert_eq!(cuda.len(), 9 * 3 * 4 + 2 * 4 + 7);
        assert!(cuda.windows(2).all(|w| w[0] < w[1]));
        assert!(cuda.contains(&"active_bytes.all.peak".to_string()));
        assert_eq!(
            &cpu_catalogue()[..2],
            &names(&["allocated_bytes.all.current", "allocated_bytes.all.peak"])[..]
        );
    }

    #[test]
    fn unknown_columns_name_the_closest_and_every_valid_one() {
        let error = check(&names(&["active_bytes.all.peek"]), "cpu", &[]).unwrap_err();
        assert!(
            error.starts_with(
                "unknown column 'active_bytes.all.peek' for the CPU source (did you mean \
                 'active_bytes.all.peak'?). The columns are keys of torch.cuda.memory_stats(); \
                 this source has: allocated_bytes.all.current, "
            ),
            "{error}"
        );
        let error = check(&names(&["active_bytes.large_pool.peak"]), "cpu", &[]).unwrap_err();
        assert!(error.starts_with(
            "column 'active_bytes.large_pool.peak' is a CUDA statistic that the CPU source"
        ));
        let error = check(&names(&["bogus"]), "cuda:0", &names(&["a.all.peak"])).unwrap_err();
        assert_eq!(
            error,
            "unknown column 'bogus' for the CUDA source. The columns are keys of \
             torch.cuda.memory_stats(); this source has: a.all.peak"
        );
        assert!(check(
            &names(&["reserved_bytes_by_private_pools.7_1.all.peak"]),
            "cuda:0",
            &[]
        )
        .is_ok());
        assert!(check(
            &names(&["reserved_bytes_by_private_pools.7 1.all.peak"]),
            "cuda:0",
            &[]
        )
        .is_err());
        assert!(check(
            &names(&["reserved_bytes_by_private_pools.7.all.peak"]),
            "cpu",
            &[]
        )
        .is_err());
        assert!(check_saved(&names(&["x"]), &[], Some("cpu"))
            .unwrap_err()
            .ends_with("has: "));
    }

    #[test]
    fn closest_is_difflibs_choice() {
        // difflib.get_close_matches(w, valid, n=1) on CPython for these.
        let valid = names(&[
            "allocated_bytes.all.peak",
            "active_bytes.all.peak",
            "segment.all.peak",
        ]);
        assert_eq!(
            closest("active_bytes.all.peek", &valid),
            Some("active_bytes.all.peak")
        );
        assert_eq!(
            closest("alocated.all.peak", &valid),
            Some("allocated_bytes.all.peak")
        );
        assert_eq!(closest("zzz", &valid), None);
        // A tie goes to the greatest name: ratio("ab", "ac") == ratio("ab", "ad") == 0.5 < 0.6,
        // ratio("abc", "abd") == ratio("abc", "abe") == 0.667.
        assert_eq!(closest("abc", &names(&["abd", "abe"])), Some("abe"));
    }

    #[test]
    fn repr_quotes_as_python_does() {
        assert_eq!(repr("a.b"), "'a.b'");
        assert_eq!(repr("it's"), "\"it's\"");
        assert_eq!(repr("a'\"b\n"), "'a\\'\"b\\n'");
    }
}
