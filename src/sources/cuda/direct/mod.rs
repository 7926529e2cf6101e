//! Reading the CUDA caching allocator's statistics straight from its memory.
//!
//! `torch._C._cuda_memoryStats(device)` builds a nested dict of 120-odd ints on every
//! call: 10 to 22 us on the H100 machines, which, paid on every line of a block that runs
//! 200 lines per training step, is more than the whole overhead budget. The numbers it
//! returns are plain `int64_t` fields of the allocator's `DeviceStats`, so once we know
//! where those fields live we read them directly (about 0.1 us).
//!
//! # Finding them, without trusting any torch version's struct layout
//! 1. `c10::cuda::CUDACachingAllocator::allocator` (an exported symbol of libc10_cuda)
//!    points at the allocator object; in it, a `std::vector` of one pointer per device
//!    leads to the device's `DeviceCachingAllocator`.
//! 2. In that object we look for the exact values the binding just returned: the
//!    `StatArray`s allocation .. reserved_bytes back to back, then active_bytes ..
//!    requested_bytes back to back a little further on (newer releases keep a map of
//!    per-pool reserved bytes between), then right after them the scalars
//!    `num_alloc_retries` .. `max_split_size` in one of the orders of `tail` (accepted
//!    only when exactly one known order fits every value).
//! 3. Only ranges that `/proc/self/maps` lists as readable are ever read.
//!
//! # Nothing is served stale
//! Every statistic of a sample comes from one of three places:
//! - **located** fields, read from memory at every sample;
//! - **refreshed** ones: `reserved_bytes_by_private_pools.*` (per-pool copies of
//!   `reserved_bytes` that torch keeps in a hash map we do not read) are taken from the
//!   binding at every sample in which any `reserved_bytes` word differs from its value at
//!   the last binding read: a pool's reserved bytes change only when a segment is mapped,
//!   unmapped or freed, or by a reset, and each of those moves `reserved_bytes`. Our own
//!   peak resets are mirrored in the sample (`Source::reset_peaks`), and the checks below
//!   compare these values too, so a change this rule misses ends direct reading;
//! - anything else the binding returns (a counter a future torch adds, or the scalars if
//!   no known order fits): then the direct reader is not used at all and the binding is
//!   read at every sample (`why_not` says which statistics were not located).
//!
//! # Checked against torch, and given up on at the first difference
//! The source (`cuda::py`'s `CudaSource`) checks the reader with `check::compare` (memory, binding,
//! memory again; compared only when the two memory reads agree) when it starts using it,
//! whenever the engine calls `Source::validate` (at `enable()` and `disable()`), at every
//! refresh, and on the `schedule` (every few thousand samples or every second). On any
//! difference, `device` is read through the binding for the rest of the process, and
//! `notice(device)` says which statistic differed, both values and after which sample.
//! Python reads those (`why_not`, `notice`, `checks`) through `cuda::py`.

mod check;
pub mod schedule;
mod tail;

pub use check::{compare, Verdict};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::sources::layout::Layout;

/// Per device, what the search found (so a process pays for it a few times at most), the
/// notice of a fallback, and how the checks went.
#[derive(Default)]
struct DeviceState {
    search: Option<Search>,
    notice: Option<String>,
    checks: Checks,
}

enum Search {
    Found(Arc<DirectStats>),
    Failed { scans: u32, reason: String },
}

/// Checks of a device's direct reader against the binding, over the process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checks {
    /// Checks in which memory and torch could be compared.
    pub compared: u64,
    /// Compared checks that found a difference (each one ends direct reading).
    pub mismatched: u64,
    /// Checks in which memory kept changing, so nothing could be compared.
    pub inconclusive: u64,
}

static DEVICES: Mutex<Option<HashMap<usize, DeviceState>>> = Mutex::new(None);

fn with_device<T>(device: usize, f: impl FnOnce(&mut DeviceState) -> T) -> T {
    let mut guard = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    f(guard
        .get_or_insert_with(HashMap::new)
        .entry(device)
        .or_default())
}

/// Scans per device and process before we settle for the binding (each reads
/// /proc/self/maps, about a millisecond in a process that loaded CUDA).
const MAX_SCANS: u32 = 3;

/// What a look for the allocator's fields gave.
pub enum Located {
    Found(Arc<DirectStats>),
    /// Nothing is allocated yet, so the values cannot be told apart: look again soon.
    NotYet,
    /// Not found (or not wanted): stay with the binding.
    No,
}

/// The located statistics of `device`, searching again if earlier scans allow it.
/// `values` must be what the binding returned just now.
pub fn located(device: usize, device_count: usize, layout: &Layout, values: &[i64]) -> Located {
    if std::env::var("MEMLAB_RS_CUDA_STATS").as_deref() == Ok("binding") {
        return Located::No;
    }
    with_device(device, |state| {
        let scans = match &state.search {
            Some(Search::Found(direct)) => return Located::Found(direct.clone()),
            Some(Search::Failed { scans, .. }) if *scans >= MAX_SCANS => return Located::No,
            Some(Search::Failed { scans, .. }) => *scans,
            None => 0,
        };
        match DirectStats::discover(device, device_count, layout, values) {
            Ok(direct) => {
                let direct = Arc::new(direct);
                state.search = Some(Search::Found(direct.clone()));
                Located::Found(direct)
            }
            Err(reason) if reason == NOT_YET => Located::NotYet,
            Err(reason) => {
                state.search = Some(Search::Failed {
                    scans: scans + 1,
                    reason,
                });
                Located::No
            }
        }
    })
}

/// Read `device` through the binding for the rest of the process, for `reason`.
pub fn give_up(device: usize, reason: String) {
    with_device(device, |state| {
        state.search = Some(Search::Failed {
            scans: MAX_SCANS,
            reason,
        })
    });
}

/// Memory disagreed with torch: give up on `device`, and keep `notice` for the reports.
pub fn reject(device: usize, reason: String, notice: String) {
    give_up(device, reason);
    with_device(device, |state| state.notice = Some(notice));
}

/// Why the statistics of `device` are read through the binding (None if they are not,
/// or nobody looked yet).
pub fn why_not(device: usize) -> Option<String> {
    let guard = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    match guard.as_ref()?.get(&device)?.search.as_ref()? {
        Search::Found(_) => None,
        Search::Failed { reason, .. } => Some(reason.clone()),
    }
}

/// One line for a report's footer when the direct reader of `device` was given up because
/// memory disagreed with torch (numbers sampled before may be wrong); None otherwise.
/// Kept for the rest of the process.
pub fn notice(device: usize) -> Option<String> {
    let guard = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    guard.as_ref()?.get(&device)?.notice.clone()
}

/// How the checks of `device`'s direct reader went in this process.
pub fn checks(device: usize) -> Checks {
    let guard = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    guard
        .as_ref()
        .and_then(|devices| devices.get(&device))
        .map_or_else(Checks::default, |state| state.checks)
}

/// Count one check of `device` and what it found.
pub fn count(device: usize, verdict: &Verdict) {
    with_device(device, |state| {
        let checks = &mut state.checks;
        match verdict {
            Verdict::Agree { .. } => checks.compared += 1,
            Verdict::Differ { .. } => {
                checks.compared += 1;
                checks.mismatched += 1;
            }
            Verdict::Inconclusive { .. } => checks.inconclusive += 1,
        }
    });
}

/// The notice's sentence for a difference found after `sample` samples.
pub fn notice_text(device: usize, sample: u64, name: &str, memory: i64, torch: i64) -> String {
    format!(
        "cuda:{device} statistics read through torch._C._cuda_memoryStats after sample \
         {sample}: allocator memory said {name}={memory}, torch said {torch} (numbers sampled \
         before may be off)"
    )
}

const NOT_YET: &str = "nothing allocated yet";

const GROUPS_BEFORE_GAP: [&str; 6] = [
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
];
const GROUPS_AFTER_GAP: [&str; 3] = ["active_bytes", "inactive_split_bytes", "requested_bytes"];
const POOLS: [&str; 3] = ["all", "small_pool", "large_pool"];
const FIELDS: [&str; 4] = ["current", "peak", "allocated", "freed"];
const ALLOCATOR_SYMBOL: &[u8] = b"_ZN3c104cuda20CUDACachingAllocator9allocatorE\0";
/// Statistics refreshed from the binding when reserved bytes move (see the module doc).
const REFRESHED_PREFIX: &str = "reserved_bytes_by_private_pools.";

/// Where each located statistic of one device lives, by name (a source's layout may
/// differ from the one it was found with).
pub struct DirectStats {
    fields: HashMap<String, usize>,
}

/// A source's way of reading `DirectStats`, in its layout's order.
pub struct Reader {
    /// (layout index, address) of every located statistic.
    slots: Vec<(usize, usize)>,
    /// Layout indexes of the located statistics.
    located: Vec<usize>,
    /// Layout indexes of the statistics refreshed from the binding.
    refreshed: Vec<usize>,
    /// Located then refreshed: what a check compares when no refresh is due.
    compared: Vec<usize>,
    /// Layout indexes of reserved_bytes.*, and their values at the last binding read.
    reserved: Vec<usize>,
    seen: Vec<i64>,
}

impl Reader {
    /// Copy the located statistics into `out` (other entries are left as they are).
    pub fn read(&self, out: &mut [i64]) {
        for &(index, address) in &self.slots {
            // SAFETY: `address` was inside a readable mapping of the allocator object,
            // which lives as long as the process; aligned 8-byte loads do not tear.
            out[index] = unsafe { std::ptr::read_volatile(address as *const i64) };
        }
    }

    /// Layout indexes of the statistics read from memory.
    pub fn located(&self) -> &[usize] {
        &self.located
    }

    /// What a check compares with torch: refreshed statistics too, unless they are due
    /// for a refresh (then they may rightly differ).
    pub fn compared(&self, refresh_due: bool) -> &[usize] {
        if refresh_due {
            &self.located
        } else {
            &self.compared
        }
    }

    /// Whether `sample` (just read from memory) needs its refreshed statistics from the
    /// binding: reserved bytes moved since the last binding read.
    pub fn refresh_due(&self, sample: &[i64]) -> bool {
        !self.refreshed.is_empty()
            && self
                .reserved
                .iter()
                .zip(&self.seen)
                .any(|(&i, &seen)| sample[i] != seen)
    }

    /// Take the refreshed statistics from `torch` (a binding answer in layout order) into
    /// `sample`, and remember the reserved bytes that answer had.
    pub fn refresh_from(&mut self, sample: &mut [i64], torch: &[i64]) {
        for &i in &self.refreshed {
            sample[i] = torch[i];
        }
        self.seen = self.reserved.iter().map(|&i| torch[i]).collect();
    }
}

impl DirectStats {
    /// How a source with `layout` reads these statistics, or why it cannot: a statistic of
    /// the layout that is neither located nor refreshed would be served stale.
    pub fn reader(&self, layout: &Layout) -> Result<Reader, String> {
        let (mut slots, mut refreshed, mut missing) = (Vec::new(), Vec::new(), Vec::new());
        for (index, name) in layout.names.iter().enumerate() {
            if let Some(&address) = self.fields.get(name) {
                slots.push((index, address));
            } else if name.starts_with(REFRESHED_PREFIX) {
                refreshed.push(index);
            } else {
                missing.push(name.as_str());
            }
        }
        if !missing.is_empty() {
            return Err(format!(
                "{} not located in allocator memory: the binding is read at every sample \
                 so that none is served stale",
                missing.join(", ")
            ));
        }
        let reserved: Vec<usize> = POOLS
            .iter()
            .flat_map(|pool| FIELDS.map(|field| format!("reserved_bytes.{pool}.{field}")))
            .filter_map(|name| layout.index(&name))
            .collect();
        if !refreshed.is_empty() && reserved.len() != POOLS.len() * FIELDS.len() {
            return Err("per-pool reserved bytes without reserved_bytes to watch".into());
        }
        let located: Vec<usize> = slots.iter().map(|&(index, _)| index).collect();
        let compared = located.iter().chain(&refreshed).copied().collect();
        let seen = vec![0; reserved.len()];
        Ok(Reader {
            slots,
            located,
            refreshed,
            compared,
            reserved,
            seen,
        })
    }

    /// Locate `device`'s statistics, given the values the binding returned just now, or
    /// say why they could not be found.
    pub fn discover(
        device: usize,
        device_count: usize,
        layout: &Layout,
        values: &[i64],
    ) -> Result<Self, String> {
        let value_of = |name: &str| layout.index(name).map(|i| values[i]);
        let arrays = |groups: &[&str]| -> Option<Vec<(String, i64)>> {
            let mut out = Vec::new();
            for group in groups {
                for pool in POOLS {
                    for field in FIELDS {
                        let name = format!("{group}.{pool}.{field}");
                        let value = value_of(&name)?;
                        out.push((name, value));
                    }
                }
            }
            Some(out)
        };
        let lacks = "torch's statistics lack an expected StatArray";
        let before = arrays(&GROUPS_BEFORE_GAP).ok_or(lacks)?;
        let after = arrays(&GROUPS_AFTER_GAP).ok_or(lacks)?;
        // All-zero arrays would match any zeroed memory: wait until something is allocated.
        if value_of("allocated_bytes.all.current").ok_or("no allocated_bytes")? <= 0 {
            return Err(NOT_YET.into());
        }
        let maps = Mappings::read().ok_or("cannot read /proc/self/maps")?;
        let stats_object = device_allocator(&maps, device, device_count)?;
        let window = maps
            .window(stats_object, 16 * 1024)
            .ok_or("the device allocator is not in a readable mapping")?;
        let want_before: Vec<i64> = before.iter().map(|(_, v)| *v).collect();
        let want_after: Vec<i64> = after.iter().map(|(_, v)| *v).collect();
        let mut tail_error = None;
        for start in (0..window.len()).filter(|&s| window[s..].starts_with(&want_before)) {
            let gap_from = start + want_before.len();
            let gap = (0..=128).find(|&g| {
                window
                    .get(gap_from + g..)
                    .is_some_and(|rest| rest.starts_with(&want_after))
            });
            let Some(gap) = gap else { continue };
            let after_from = gap_from + gap;
            let tail_from = after_from + want_after.len();
            let tail = match tail::locate(&window[tail_from..], value_of) {
                Ok(tail) => tail,
                Err(error) => {
                    tail_error = Some(error);
                    continue;
                }
            };
            let address = |word: usize| stats_object + 8 * word;
            let mut fields = HashMap::new();
            for (k, (name, _)) in before.into_iter().enumerate() {
                fields.insert(name, address(start + k));
            }
            for (k, (name, _)) in after.into_iter().enumerate() {
                fields.insert(name, address(after_from + k));
            }
            for (name, offset) in tail {
                fields.insert(name, address(tail_from + offset));
            }
            return Ok(Self { fields });
        }
        if let Some(error) = tail_error {
            return Err(format!(
                "the statistic arrays were found in the device allocator at {stats_object:#x}, \
                 but {error}"
            ));
        }
        let longest = (0..window.len())
            .map(|s| {
                window[s..]
                    .iter()
                    .zip(&want_before)
                    .take_while(|(a, b)| a == b)
                    .count()
            })
            .max()
            .unwrap_or(0);
        Err(format!(
            "the statistics are not in the first {} bytes of the device allocator at {:#x} \
             (longest match: {longest} of {} words)",
            window.len() * 8,
            stats_object,
            want_before.len()
        ))
    }
}

/// The `DeviceCachingAllocator` of `device`: found through the allocator symbol and the
/// one vector in the allocator object whose length is the device count.
fn device_allocator(maps: &Mappings, device: usize, device_count: usize) -> Result<usize, String> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LAZY};
        const RTLD_NOLOAD: i32 = 4;
        // SAFETY: RTLD_NOLOAD only finds the library torch already loaded.
        let library = unsafe { Library::open(Some("libc10_cuda.so"), RTLD_LAZY | RTLD_NOLOAD) };
        let library = library.map_err(|e| format!("libc10_cuda.so is not loaded: {e}"))?;
        // SAFETY: a data symbol; we only take its address.
        let symbol = unsafe { library.get::<*const usize>(ALLOCATOR_SYMBOL) }
            .map_err(|e| format!("no allocator symbol: {e}"))?;
        let slot = *symbol as usize;
        let object = maps
            .word(slot)
            .ok_or("the allocator pointer is unreadable")? as usize;
        let words = maps
            .window(object, 64 * 1024)
            .ok_or_else(|| format!("the allocator object {object:#x} is unreadable"))?;
        let wanted = 8 * device_count as u64;
        for k in 0..words.len().saturating_sub(2) {
            let (begin, end, capacity) =
                (words[k] as u64, words[k + 1] as u64, words[k + 2] as u64);
            if begin == 0 || end.wrapping_sub(begin) != wanted || capacity < end {
                continue;
            }
            let entry = begin as usize + 8 * device;
            if let Some(candidate) = maps.word(entry) {
                if candidate != 0 && maps.contains(candidate as usize, 4096) {
                    return Ok(candidate as usize);
                }
            }
        }
        Err(format!(
            "no vector of {device_count} device allocators in the first {} bytes of the \
             allocator object at {object:#x}",
            words.len() * 8
        ))
    }
    #[cfg(not(unix))]
    {
        let _ = (maps, device, device_count);
        Err("only on Linux".into())
    }
}

/// The readable address ranges of this process.
struct Mappings {
    ranges: Vec<(usize, usize)>,
}

impl Mappings {
    fn read() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/self/maps").ok()?;
        let mut ranges = Vec::new();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(span), Some(perms)) = (parts.next(), parts.next()) else {
                continue;
            };
            if !perms.starts_with('r') {
                continue;
            }
            let Some((start, end)) = span.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) else {
                continue;
            };
            // A static object may span two mappings (.data then .bss): merge neighbours.
            match ranges.last_mut() {
                Some((_, last_end)) if *last_end == start => *last_end = end,
                _ => ranges.push((start, end)),
            }
        }
        Some(Self { ranges })
    }

    fn contains(&self, address: usize, len: usize) -> bool {
        self.ranges
            .iter()
            .any(|&(start, end)| address >= start && address.saturating_add(len) <= end)
    }

    fn word(&self, address: usize) -> Option<i64> {
        (address % 8 == 0 && self.contains(address, 8))
            // SAFETY: inside a readable mapping.
            .then(|| unsafe { std::ptr::read_volatile(address as *const i64) })
    }

    /// Up to `len` bytes from `address` as words, clipped to the end of its mapping.
    fn window(&self, address: usize, len: usize) -> Option<Vec<i64>> {
        if address % 8 != 0 {
            return None;
        }
        let &(_, end) = self
            .ranges
            .iter()
            .find(|&&(start, end)| address >= start && address < end)?;
        let len = len.min(end - address) / 8;
        // SAFETY: [address, address + 8 * len) lies in one readable mapping.
        Some(
            (0..len)
                .map(|k| unsafe { std::ptr::read_volatile((address + 8 * k) as *const i64) })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layout with the names given, and DirectStats pointing the located ones at `memory`.
    fn setup(names: &[&str], located: &[(&str, usize)], memory: &[i64]) -> (Layout, DirectStats) {
        let layout = Layout::new(names.iter().map(|n| n.to_string()).collect());
        let base = memory.as_ptr() as usize;
        let fields = located
            .iter()
            .map(|&(name, word)| (name.to_string(), base + 8 * word))
            .collect();
        (layout, DirectStats { fields })
    }

    fn reserved_names() -> Vec<String> {
        POOLS
            .iter()
            .flat_map(|pool| FIELDS.map(|field| format!("reserved_bytes.{pool}.{field}")))
            .collect()
    }

    #[test]
    fn a_reader_reads_in_layout_order() {
        let memory = vec![11, 22, 33];
        let (layout, stats) = setup(
            &["num_ooms", "allocated_bytes.all.current", "max_split_size"],
            &[
                ("allocated_bytes.all.current", 0),
                ("num_ooms", 2),
                ("max_split_size", 1),
            ],
            &memory,
        );
        let reader = stats.reader(&layout).unwrap();
        let mut sample = vec![0; 3];
        reader.read(&mut sample);
        assert_eq!(sample, vec![33, 11, 22]);
        assert_eq!(reader.located(), &[0, 1, 2]);
        assert!(!reader.refresh_due(&sample));
    }

    #[test]
    fn a_statistic_neither_located_nor_refreshed_refuses_the_reader() {
        let memory = vec![1];
        let (layout, stats) = setup(
            &["allocated_bytes.all.current", "num_ooms", "num_new_counter"],
            &[("allocated_bytes.all.current", 0)],
            &memory,
        );
        let error = stats.reader(&layout).err().unwrap();
        assert!(
            error.starts_with("num_ooms, num_new_counter not located"),
            "{error}"
        );
    }

    #[test]
    fn per_pool_reserved_bytes_refresh_when_reserved_bytes_move() {
        let mut names = reserved_names();
        names.push("reserved_bytes_by_private_pools.(1, 0).all.current".into());
        names.push("reserved_bytes_by_private_pools.(1, 0).all.peak".into());
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let memory: Vec<i64> = (0..12).map(|k| 100 + k).collect();
        let located: Vec<(&str, usize)> = name_refs[..12].iter().copied().zip(0..12).collect();
        let (layout, stats) = setup(&name_refs, &located, &memory);
        let mut reader = stats.reader(&layout).unwrap();
        assert_eq!(reader.compared(false).len(), 14);
        assert_eq!(reader.compared(true).len(), 12);

        // The binding's answer: reserved bytes as in memory, the pool's own values.
        let mut torch = memory.clone();
        torch.extend([64, 96]);
        let mut sample = vec![0; 14];
        reader.read(&mut sample);
        assert!(reader.refresh_due(&sample), "nothing seen yet: refresh");
        reader.refresh_from(&mut sample, &torch);
        assert_eq!(sample, torch);
        assert!(!reader.refresh_due(&sample));

        // Reserved bytes move in memory (a segment was freed): due again.
        let mut moved = sample.clone();
        moved[3] += 1; // reserved_bytes.all.freed
        assert!(reader.refresh_due(&moved));
    }

    #[test]
    fn per_pool_statistics_need_reserved_bytes_to_watch() {
        let memory = vec![1];
        let (layout, stats) = setup(
            &[
                "allocated_bytes.all.current",
                "reserved_bytes_by_private_pools.(1, 0).all.current",
            ],
            &[("allocated_bytes.all.current", 0)],
            &memory,
        );
        assert!(stats.reader(&layout).is_err());
    }

    #[test]
    fn notices_and_checks_are_kept_per_device() {
        let device = 1_000_001; // no real device: tests share the process-wide registry
        assert_eq!(notice(device), None);
        assert_eq!(checks(device), Checks::default());
        count(device, &Verdict::Agree { torch: vec![] });
        count(device, &Verdict::Inconclusive { torch: vec![] });
        let differ = Verdict::Differ {
            index: 0,
            memory: 1,
            torch_value: 513,
            torch: vec![],
        };
        count(device, &differ);
        let text = notice_text(device, 5123, "allocated_bytes.all.current", 1, 513);
        reject(device, "memory disagreed".into(), text.clone());
        assert_eq!(
            checks(device),
            Checks {
                compared: 2,
                mismatched: 1,
                inconclusive: 1
            }
        );
        assert_eq!(notice(device), Some(text.clone()));
        assert!(text.contains("after sample 5123"), "{text}");
        assert!(
            text.contains("allocated_bytes.all.current=1, torch said 513"),
            "{text}"
        );
        assert_eq!(why_not(device).as_deref(), Some("memory disagreed"));
        assert_eq!(notice(device + 1), None);
    }
}
