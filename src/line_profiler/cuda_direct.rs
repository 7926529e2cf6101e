//! Reading the CUDA caching allocator's statistics straight from its memory.
//!
//! `torch._C._cuda_memoryStats(device)` builds a nested dict of 120-odd ints on every
//! call: 10 to 22 us on the H100 machines, which, paid on every line of a block that runs
//! 200 lines per training step, is more than the whole overhead budget. The numbers it
//! returns are plain `int64_t` fields of the allocator's `DeviceStats`, so once we know
//! where those fields live we read them directly (about 0.1 us).
//!
//! Finding them, without trusting any torch version's struct layout:
//! 1. `c10::cuda::CUDACachingAllocator::allocator` (an exported symbol of libc10_cuda)
//!    points at the allocator object; in it, a `std::vector` of one pointer per device
//!    leads to the device's `DeviceCachingAllocator`.
//! 2. In that object we look for the exact values the binding just returned: the
//!    `StatArray`s allocation .. reserved_bytes back to back, then active_bytes ..
//!    requested_bytes back to back a little further on (some versions keep a map between).
//! 3. Only ranges that `/proc/self/maps` lists as readable are ever read.
//!
//! The scalars after the arrays (`num_ooms`, `num_device_alloc`, ...) are not located:
//! they change only when the allocator takes or returns a segment, so whenever the
//! segment counters move the caller reads the binding again, which also re-validates the
//! located fields against torch's own answer. Anything that does not match exactly means
//! we go back to the binding for good.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::layout::Layout;

/// Per device, what the search found, so a process pays for it a few times at most.
enum Search {
    Found(Arc<DirectStats>),
    Failed { scans: u32, reason: String },
}

static SEARCHES: Mutex<Option<HashMap<usize, Search>>> = Mutex::new(None);

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
    let mut guard = SEARCHES.lock().unwrap_or_else(|p| p.into_inner());
    let searches = guard.get_or_insert_with(HashMap::new);
    let scans = match searches.get(&device) {
        Some(Search::Found(direct)) => return Located::Found(direct.clone()),
        Some(Search::Failed { scans, .. }) if *scans >= MAX_SCANS => return Located::No,
        Some(Search::Failed { scans, .. }) => *scans,
        None => 0,
    };
    match DirectStats::discover(device, device_count, layout, values) {
        Ok(direct) => {
            let direct = Arc::new(direct);
            searches.insert(device, Search::Found(direct.clone()));
            Located::Found(direct)
        }
        Err(reason) if reason == NOT_YET => Located::NotYet,
        Err(reason) => {
            searches.insert(
                device,
                Search::Failed {
                    scans: scans + 1,
                    reason,
                },
            );
            Located::No
        }
    }
}

/// Stop using the located statistics of `device`: memory disagreed with torch.
pub fn reject(device: usize, reason: String) {
    let mut guard = SEARCHES.lock().unwrap_or_else(|p| p.into_inner());
    guard.get_or_insert_with(HashMap::new).insert(
        device,
        Search::Failed {
            scans: MAX_SCANS,
            reason,
        },
    );
}

/// Why the statistics of `device` are read through the binding (None if they are not,
/// or nobody looked yet).
pub fn why_not(device: usize) -> Option<String> {
    let guard = SEARCHES.lock().unwrap_or_else(|p| p.into_inner());
    match guard.as_ref()?.get(&device)? {
        Search::Found(_) => None,
        Search::Failed { reason, .. } => Some(reason.clone()),
    }
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
const ARRAY_WORDS: usize = POOLS.len() * FIELDS.len();
const ALLOCATOR_SYMBOL: &[u8] = b"_ZN3c104cuda20CUDACachingAllocator9allocatorE\0";

/// Where each located statistic lives.
pub struct DirectStats {
    /// (layout index, address) of every statistic in the located arrays.
    slots: Vec<(usize, usize)>,
}

impl DirectStats {
    /// Copy the located statistics into `out` (other entries are left as they are).
    pub fn read(&self, out: &mut [i64]) {
        for &(index, address) in &self.slots {
            // SAFETY: `address` was inside a readable mapping of the allocator object,
            // which lives as long as the process; aligned 8-byte loads do not tear.
            out[index] = unsafe { std::ptr::read_volatile(address as *const i64) };
        }
    }

    /// Whether `values` (from the binding) agree with memory on every located statistic.
    pub fn agrees_with(&self, values: &[i64]) -> bool {
        let mut mine = values.to_vec();
        self.read(&mut mine);
        mine == values
    }

    /// Locate `device`'s statistics, given the values the binding returned just now, or
    /// say why they could not be found.
    pub fn discover(
        device: usize,
        device_count: usize,
        layout: &Layout,
        values: &[i64],
    ) -> Result<Self, String> {
        let index_of = |name: String| layout.index(&name);
        let array = |group: &str| -> Option<Vec<(usize, i64)>> {
            let mut out = Vec::with_capacity(ARRAY_WORDS);
            for pool in POOLS {
                for field in FIELDS {
                    let i = index_of(format!("{group}.{pool}.{field}"))?;
                    out.push((i, values[i]));
                }
            }
            Some(out)
        };
        let before: Vec<(usize, i64)> = GROUPS_BEFORE_GAP
            .iter()
            .map(|g| array(g))
            .collect::<Option<Vec<_>>>()
            .ok_or("torch's statistics lack an expected StatArray")?
            .concat();
        let after: Vec<(usize, i64)> = GROUPS_AFTER_GAP
            .iter()
            .filter_map(|g| array(g))
            .collect::<Vec<_>>()
            .concat();
        // All-zero arrays would match any zeroed memory: wait until something is allocated.
        let allocated =
            index_of("allocated_bytes.all.current".into()).ok_or("no allocated_bytes")?;
        if values[allocated] <= 0 {
            return Err(NOT_YET.into());
        }
        let maps = Mappings::read().ok_or("cannot read /proc/self/maps")?;
        let stats_object = device_allocator(&maps, device, device_count)?;
        let window = maps
            .window(stats_object, 16 * 1024)
            .ok_or("the device allocator is not in a readable mapping")?;
        let want_before: Vec<i64> = before.iter().map(|&(_, v)| v).collect();
        let want_after: Vec<i64> = after.iter().map(|&(_, v)| v).collect();
        for start in (0..window.len()).filter(|&s| window[s..].starts_with(&want_before)) {
            let gap_from = start + want_before.len();
            let gap = (0..=128).find(|&g| {
                window
                    .get(gap_from + g..)
                    .is_some_and(|rest| rest.starts_with(&want_after))
            });
            if let Some(gap) = gap {
                let address = |word: usize| stats_object + 8 * word;
                let mut slots = Vec::new();
                for (k, &(index, _)) in before.iter().enumerate() {
                    slots.push((index, address(start + k)));
                }
                for (k, &(index, _)) in after.iter().enumerate() {
                    slots.push((index, address(gap_from + gap + k)));
                }
                return Ok(Self { slots });
            }
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
