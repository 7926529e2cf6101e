//! The statistics one memory sample holds: their names (the keys of
//! `torch.cuda.memory_stats()`), how each turns into a per-line value, and a fast reader for
//! `torch._C._cuda_memoryStats(device)`'s nested dict.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// How a statistic becomes the value of one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatKind {
    /// The value when the line ended (`*.current`, `max_split_size`).
    Current,
    /// The highest value while the line ran, called functions included (`*.peak`).
    Peak,
    /// How much the counter grew while the line ran (`*.allocated`, `*.freed`, `num_ooms`).
    Delta,
}

/// Counters without a `.allocated`/`.freed` suffix that only ever grow.
const COUNTERS: [&str; 5] = [
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
];

/// The names and kinds of a source's statistics, in the order a sample stores them.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub names: Vec<String>,
    pub kinds: Vec<StatKind>,
    /// Indexes of the peak statistics.
    pub peaks: Vec<usize>,
    /// (peak, current) index pairs: a peak reset is a no-op when every pair is equal.
    pub pairs: Vec<(usize, usize)>,
}

impl Layout {
    pub fn new(names: Vec<String>) -> Self {
        let kinds: Vec<StatKind> = names.iter().map(|name| kind_of(name)).collect();
        let peaks = (0..names.len())
            .filter(|&i| kinds[i] == StatKind::Peak)
            .collect();
        let pairs = peaks_with_currents(&names);
        Self {
            names,
            kinds,
            peaks,
            pairs,
        }
    }

    /// The CPU source's statistics: CUDA's names for the counts it can know.
    pub fn cpu() -> Self {
        let mut names = Vec::new();
        for stat in CPU_STATS {
            for field in ["current", "peak", "allocated", "freed"] {
                names.push(format!("{stat}.all.{field}"));
            }
        }
        Self::new(names)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|known| known == name)
    }
}

/// CPU statistics, each derived from the bytes or the count of live storages.
pub use crate::sources::cpu::table::STATS as CPU_STATS;

fn kind_of(name: &str) -> StatKind {
    if name.ends_with(".peak") {
        StatKind::Peak
    } else if name.ends_with(".allocated") || name.ends_with(".freed") || COUNTERS.contains(&name) {
        StatKind::Delta
    } else {
        StatKind::Current
    }
}

fn peaks_with_currents(names: &[String]) -> Vec<(usize, usize)> {
    names
        .iter()
        .enumerate()
        .filter_map(|(i, name)| {
            let stem = name.strip_suffix(".peak")?;
            let current = format!("{stem}.current");
            names.iter().position(|n| *n == current).map(|j| (i, j))
        })
        .collect()
}

/// The dotted names of a nested stats dict's leaves, in iteration order.
pub fn flatten_names(stats: &Bound<'_, PyDict>) -> PyResult<Vec<String>> {
    let mut names = Vec::new();
    collect_names(stats, "", &mut names)?;
    Ok(names)
}

fn collect_names(dict: &Bound<'_, PyDict>, prefix: &str, names: &mut Vec<String>) -> PyResult<()> {
    for (key, value) in dict.iter() {
        let name = format!("{prefix}{}", crate::interrupts::text(&key)?);
        match value.cast::<PyDict>() {
            Ok(inner) => collect_names(inner, &format!("{name}."), names)?,
            Err(_) => names.push(name),
        }
    }
    Ok(())
}

/// Write a nested stats dict's leaves into `out` in iteration order. Returns how many
/// leaves there were; the caller compares that with its layout (torch builds the dict in
/// a fixed order, so keys need not be compared on the hot path).
pub fn read_values(dict: &Bound<'_, PyDict>, out: &mut [i64]) -> usize {
    let mut at = 0;
    fill(dict, out, &mut at);
    at
}

fn fill(dict: &Bound<'_, PyDict>, out: &mut [i64], at: &mut usize) {
    for (_, value) in dict.iter() {
        if let Ok(inner) = value.cast::<PyDict>() {
            fill(inner, out, at);
            continue;
        }
        if let Some(slot) = out.get_mut(*at) {
            *slot = value
                .extract::<i64>()
                .or_else(|_| value.extract::<f64>().map(|v| v as i64))
                .unwrap_or(0);
        }
        *at += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_suffix() {
        let layout = Layout::new(
            [
                "active_bytes.all.current",
                "active_bytes.all.peak",
                "active_bytes.all.allocated",
                "num_ooms",
                "max_split_size",
            ]
            .map(String::from)
            .to_vec(),
        );
        use StatKind::*;
        assert_eq!(layout.kinds, vec![Current, Peak, Delta, Delta, Current]);
        assert_eq!(layout.peaks, vec![1]);
        assert_eq!(layout.pairs, vec![(1, 0)]);
    }

    #[test]
    fn cpu_layout_has_every_field_of_its_stats() {
        let layout = Layout::cpu();
        assert_eq!(layout.len(), CPU_STATS.len() * 4);
        assert!(layout.index("active_bytes.all.peak").is_some());
        assert!(layout.index("active_bytes.large_pool.peak").is_none());
    }
}
