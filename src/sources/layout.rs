//! The statistics one memory sample holds: their names (the keys of
//! `torch.cuda.memory_stats()`) and how each turns into a per-line value. The fast reader of
//! `torch._C._cuda_memoryStats(device)`'s nested dict that fills one is `cuda::py`'s.

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
