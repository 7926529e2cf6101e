//! Courtesy's regions: memory for torch's caching allocator that the driver maps at
//! addresses we keep, so that a pause gives the physical memory back and a resume puts new
//! memory at the same addresses (every tensor, view, CUDA graph and C++ pointer into it
//! stays valid).
//!
//! torch reaches this file through two C functions it calls as a pluggable allocator
//! (`torch.cuda.MemPool(CUDAPluggableAllocator(<this library>, ...))`):
//! `memlab_rs_region_malloc_<slot>` gives a segment (physical memory created on the device, a
//! virtual range reserved, the one mapped on the other) and `memlab_rs_region_free` takes
//! it back. Both run inside torch's allocator, maybe on an autograd thread: they never
//! panic, never take the GIL, and answer a failure with a null pointer (torch then raises
//! its out-of-memory error).
//!
//! `pause` copies what is live in a tag's segments to pinned host buffers (a chunked
//! pipeline on two streams: each segment's copies are queued, then each segment is unmapped
//! and its physical memory released as soon as its copies are done) and `resume` creates
//! and maps new physical memory segment by segment, queueing each one's copy back as soon
//! as it is mapped. A tag whose host buffers are prepared ahead gets them pinned by a
//! background thread as its segments appear, so the first pause runs at the speed of
//! later ones.
//!
//! One lock (`BOOK`) guards the book; it is a leaf: nothing is called under it that could
//! wait for torch's allocator or the GIL.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use indexmap::IndexMap;

use super::region_book::{
    copy_ranges, padded, Allocation, Book, HostBuffer, TagSettings, TagState,
};
use super::result::RegionReport;
use super::vmm::{self, Context, Failed, Stream};

static BOOK: Mutex<Option<Book>> = Mutex::new(None);

/// Gaps shorter than this between live blocks are copied with them (see `copy_ranges`),
/// unless the caller says otherwise (the benchmarks try others).
pub const JOIN_GAP: u64 = 64 << 10;

fn with_book<T>(f: impl FnOnce(&mut Book) -> T) -> T {
    let mut guard: MutexGuard<'_, Option<Book>> = match BOOK.lock() {
        Ok(guard) => guard,
        // The book is plain data left consistent between statements: a panic elsewhere
        // (caught at the boundary) does not make it wrong.
        Err(poisoned) => poisoned.into_inner(),
    };
    f(guard.get_or_insert_with(Book::default))
}

fn device_name(device: i32) -> String {
    format!("cuda:{device}")
}

/// Set how `tag`'s segments are paused.
pub fn configure(tag: &str, settings: TagSettings) {
    with_book(|b| {
        b.closed.remove(tag); // a tag opened again after close
        b.tags.insert(tag.to_owned(), settings);
    });
}

/// The slot (its allocation function) of `tag`: the one it has, else a free one; None
/// when all `SLOTS` are taken by tags that still have settings.
pub fn slot(tag: &str) -> Option<usize> {
    with_book(|b| {
        if let Some((&slot, _)) = b.slots.iter().find(|(_, t)| t.as_str() == tag) {
            return Some(slot);
        }
        let free = (0..SLOTS).find(|s| !b.slots.contains_key(s))?;
        b.slots.insert(free, tag.to_owned());
        Some(free)
    })
}

pub fn state() -> Vec<TagState> {
    with_book(|b| b.state())
}

/// The tag of the segment holding `address`, if a region's.
pub fn owner(address: u64) -> Option<String> {
    with_book(|b| b.owner(address).map(|a| a.tag.clone()))
}

/// Seconds and bytes the background thread spent pinning host buffers so far, and the
/// frees of addresses no region gave out.
pub fn counters() -> (f64, u64, u64) {
    with_book(|b| (b.prepared_seconds, b.prepared_bytes, b.unknown_frees))
}

/// How many regions can be open at once: each has its own allocation function (torch's
/// pluggable allocator tells a function nothing of the pool it allocates for), so that a
/// segment is booked under its region's tag exactly, whichever thread or CUDA graph
/// capture asked for it.
pub const SLOTS: usize = 16;

macro_rules! slot_allocators {
    ($($name:ident = $slot:expr),* $(,)?) => {
        $(
            #[no_mangle]
            /// torch's pluggable allocator calls this for a new segment of the pool of the
            /// region in this slot.
            pub extern "C" fn $name(size: isize, device: c_int, _stream: *mut c_void) -> *mut c_void {
                std::panic::catch_unwind(|| segment($slot, size, device))
                    .ok()
                    .flatten()
                    .map_or(std::ptr::null_mut(), |address| address as *mut c_void)
            }
        )*
    };
}

slot_allocators!(
    memlab_rs_region_malloc_0 = 0,
    memlab_rs_region_malloc_1 = 1,
    memlab_rs_region_malloc_2 = 2,
    memlab_rs_region_malloc_3 = 3,
    memlab_rs_region_malloc_4 = 4,
    memlab_rs_region_malloc_5 = 5,
    memlab_rs_region_malloc_6 = 6,
    memlab_rs_region_malloc_7 = 7,
    memlab_rs_region_malloc_8 = 8,
    memlab_rs_region_malloc_9 = 9,
    memlab_rs_region_malloc_10 = 10,
    memlab_rs_region_malloc_11 = 11,
    memlab_rs_region_malloc_12 = 12,
    memlab_rs_region_malloc_13 = 13,
    memlab_rs_region_malloc_14 = 14,
    memlab_rs_region_malloc_15 = 15,
);

#[no_mangle]
/// torch's pluggable allocator calls this when a region's segment is given back.
///
/// # Safety
/// `ptr` is an address `memlab_rs_region_malloc` returned (anything else is counted and
/// left alone).
pub extern "C" fn memlab_rs_region_free(
    ptr: *mut c_void,
    _size: isize,
    _device: c_int,
    _stream: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| free_segment(ptr as u64));
}

fn segment(slot: usize, size: isize, device: c_int) -> Option<u64> {
    let size = u64::try_from(size).ok()?;
    let _context = Context::enter(device).ok()?;
    let granularity = vmm::granularity(device).ok()?;
    let size = padded(size, granularity);
    let handle = vmm::create(device, size).ok()?;
    let address = match vmm::reserve(size, granularity) {
        Ok(address) => address,
        Err(_) => {
            let _ = vmm::release(handle);
            return None;
        }
    };
    if vmm::map(address, size, handle, device).is_err() {
        let _ = vmm::address_free(address, size);
        let _ = vmm::release(handle);
        return None;
    }
    with_book(|b| {
        let tag = b
            .slots
            .get(&slot)
            .cloned()
            .unwrap_or_else(|| "default".into());
        let settings = b.settings(&tag);
        b.allocations.insert(
            address,
            Allocation {
                address,
                size,
                device,
                tag,
                handle: Some(handle),
                host: None,
                saved: Vec::new(),
            },
        );
        if settings.keep_contents && settings.prepare_host {
            b.to_prepare.push_back(address);
            start_preparing(b);
        }
    });
    Some(address)
}

fn free_segment(address: u64) {
    let Some(allocation) = with_book(|b| {
        let found = b.allocations.remove(&address);
        match &found {
            None => b.unknown_frees += 1,
            Some(a) if a.paused() => publish_paused(b),
            Some(_) => {}
        }
        found
    }) else {
        return;
    };
    if let Ok(context) = Context::enter(allocation.device) {
        // Work still queued may use the segment (torch does not wait before giving a
        // pluggable allocator's segment back).
        let _ = context.synchronize();
        if let Some(handle) = allocation.handle {
            let _ = vmm::unmap(address, allocation.size);
            let _ = vmm::release(handle);
        }
        let _ = vmm::address_free(address, allocation.size);
    }
    if let Some(host) = with_book(|b| b.freed(&allocation)) {
        let _ = vmm::free_host(host.address);
    }
}

/// Start the background thread that pins host buffers, unless it runs already.
fn start_preparing(b: &mut Book) {
    if b.preparing || b.to_prepare.is_empty() {
        return;
    }
    b.preparing = true;
    let spawned = std::thread::Builder::new()
        .name("memlab-rs-pin".into())
        .spawn(|| {
            // prepare_queued clears the flag itself, under the lock, when the queue is
            // empty; clearing it here too could clear a newer thread's.
            if std::panic::catch_unwind(prepare_queued).is_err() {
                with_book(|b| b.preparing = false);
            }
        });
    if spawned.is_err() {
        b.preparing = false; // the first pause pins them instead
    }
}

/// Pin a host buffer for each queued segment still without one; the thread ends when the
/// queue is empty, so nothing of ours runs while no segment waits.
fn prepare_queued() {
    // A graph may be captured meanwhile on another thread (into this region's pool, too).
    let _ = vmm::relax_capture_mode();
    loop {
        let job = with_book(|b| loop {
            let Some(address) = b.to_prepare.pop_front() else {
                b.preparing = false;
                return None;
            };
            let Some(a) = b.allocations.get(&address) else {
                continue;
            };
            let settings = b.settings(&a.tag);
            let closed = b.closed.contains(&a.tag);
            if a.host.is_some() || closed || !settings.keep_contents || !settings.prepare_host {
                continue;
            }
            let (size, device) = (a.size, a.device);
            return Some((address, size, device, b.take_spare(size)));
        });
        let Some((address, size, device, spare)) = job else {
            return;
        };
        let buffer = match spare {
            Some(buffer) => buffer,
            None => {
                let Ok(_context) = Context::enter(device) else {
                    continue;
                };
                let started = Instant::now();
                let Ok(host) = vmm::host_alloc(size) else {
                    continue;
                };
                let seconds = started.elapsed().as_secs_f64();
                with_book(|b| {
                    b.prepared_seconds += seconds;
                    b.prepared_bytes += size;
                });
                HostBuffer {
                    address: host,
                    size,
                }
            }
        };
        with_book(|b| match b.allocations.get_mut(&address) {
            Some(a) if a.host.is_none() => a.host = Some(buffer),
            _ => b.spare.push(buffer),
        });
    }
}

/// Free the pinned host buffers of `tags`' segments (all when empty) that hold nothing to
/// bring back, and every spare one. Returns the bytes freed.
pub fn release_host(tags: &[String]) -> u64 {
    let buffers: Vec<HostBuffer> = with_book(|b| {
        let mut out: Vec<HostBuffer> = b.spare.drain(..).collect();
        for a in b.allocations.values_mut() {
            if (tags.is_empty() || tags.contains(&a.tag)) && !a.paused() {
                out.extend(a.host.take());
            }
        }
        out
    });
    let mut freed = 0;
    for buffer in buffers {
        if vmm::free_host(buffer.address).is_ok() {
            freed += buffer.size;
        }
    }
    freed
}

/// `tag`'s region closes: its settings and slot go now if it has no segment left, else
/// with its last segment (whose host buffers are then freed, not kept); whether it is gone.
pub fn close(tag: &str) -> bool {
    with_book(|b| b.close(tag))
}

/// Tell the floor how many bytes of each device are paused now (the tensor report reads it).
fn publish_paused(b: &Book) {
    let mut paused = std::collections::BTreeMap::new();
    for a in b.allocations.values().filter(|a| a.paused()) {
        *paused.entry(a.device).or_insert(0) += a.size;
    }
    crate::sources::paused::publish(paused);
}

fn devices_of(book: &Book, tags: &[String], paused: bool) -> Vec<(i32, Vec<u64>)> {
    let mut out: IndexMap<i32, Vec<u64>> = IndexMap::new();
    for a in book.of_tags(tags).filter(|a| a.paused() == paused) {
        out.entry(a.device).or_default().push(a.address);
    }
    out.into_iter().collect()
}

/// Two streams, segments alternating between them: one segment's copies start while the
/// other's last one finishes, so the bus does not idle between copies. (Measured on an
/// H200: four streams, largest copies first, made a GPT-2 state's pause 1 ms slower.)
fn streams(context: &Context) -> Result<[Stream; 2], Failed> {
    Ok([Stream::new(context)?, Stream::new(context)?])
}

fn synchronize(streams: &[Stream]) {
    for stream in streams {
        let _ = stream.synchronize();
    }
}

/// Give back the physical memory of `tags`' mapped segments (all tags when empty), their
/// live ranges `live` (address, length) first copied to pinned host memory where the tag
/// keeps its contents. The caller has made the devices idle.
pub fn pause(tags: &[String], live: &[(u64, u64)], join_gap: u64) -> RegionReport {
    device_by_device(
        ("pause", "pausing"),
        tags,
        false,
        |b, device, addresses, r| pause_device(b, device, addresses, live, join_gap, r),
    )
}

/// Run `each` on the segments of `tags` (all when empty) that are paused or not, device by
/// device, stopping at the first failure (the report says where: "<doing> on cuda:N");
/// then publish the paused bytes. Holds the book throughout, so a segment torch gives back
/// meanwhile waits.
fn device_by_device(
    (action, doing): (&str, &str),
    tags: &[String],
    paused: bool,
    mut each: impl FnMut(&mut Book, i32, &[u64], &mut RegionReport) -> Result<(), Failed>,
) -> RegionReport {
    let started = Instant::now();
    let mut r = RegionReport {
        action: action.into(),
        tags: tags.to_vec(),
        ..RegionReport::default()
    };
    with_book(|b| {
        for (device, addresses) in devices_of(b, tags, paused) {
            if let Err(failed) = each(b, device, &addresses, &mut r) {
                r.error = Some(format!("{doing} on {}: {failed}", device_name(device)));
                break;
            }
        }
        publish_paused(b);
    });
    r.seconds = started.elapsed().as_secs_f64();
    r
}

fn pause_device(
    b: &mut Book,
    device: i32,
    addresses: &[u64],
    live: &[(u64, u64)],
    join_gap: u64,
    r: &mut RegionReport,
) -> Result<(), Failed> {
    let context = Context::enter(device)?;
    context.synchronize()?;
    let streams = streams(&context)?;
    let plan: Vec<(u64, Vec<(u64, u64)>)> = addresses
        .iter()
        .map(|&address| {
            let a = &b.allocations[&address];
            let ranges = if b.settings(&a.tag).keep_contents {
                copy_ranges(live, address, a.size, join_gap)
            } else {
                Vec::new()
            };
            (address, ranges)
        })
        .collect();
    let mut marks = Vec::with_capacity(addresses.len());
    let mut nothing_to_copy = Vec::new();
    for (address, ranges) in plan {
        let size = b.allocations[&address].size;
        if ranges.is_empty() {
            r.discarded_bytes += size as i64;
            nothing_to_copy.push(address);
            continue;
        }
        let stream = &streams[marks.len() % streams.len()];
        if b.allocations[&address].host.is_none() {
            let buffer = match b.take_spare(size) {
                Some(buffer) => buffer,
                None => {
                    let pin = Instant::now();
                    let host = vmm::host_alloc(size);
                    r.pin_seconds += pin.elapsed().as_secs_f64();
                    r.pinned_bytes += size as i64;
                    HostBuffer {
                        address: host.inspect_err(|_| synchronize(&streams))?,
                        size,
                    }
                }
            };
            b.allocations.get_mut(&address).expect("booked").host = Some(buffer);
        }
        let host = b.allocations[&address].host.map_or(0, |h| h.address);
        for &(offset, len) in &ranges {
            // SAFETY: the segment is mapped (not paused) and the device idle; the host
            // buffer is the segment's size and lives in the book until freed, which needs
            // this lock; the stream is waited for before either goes.
            unsafe { stream.copy_to_host(host + offset as usize, address + offset, len) }
                .inspect_err(|_| synchronize(&streams))?;
            r.moved_bytes += len as i64;
        }
        let copied: u64 = ranges.iter().map(|r| r.1).sum();
        r.discarded_bytes += (size - copied) as i64;
        b.allocations.get_mut(&address).expect("booked").saved = ranges;
        marks.push((address, stream.mark()?));
    }
    // While the copies run: the segments with nothing to copy go first (the device was
    // idle when the pause began, so nothing uses them), then each of the others as soon as
    // its copies are done, while the later ones still copy. (Measured on an H200: unmapping
    // overlaps the copies this way; unmapping after all copies took 73% of the bus's speed
    // for a GPT-2 state, this order 91%.)
    for address in nothing_to_copy {
        give_back(b, device, address, r)?;
    }
    for (address, mark) in marks {
        mark.wait()?;
        give_back(b, device, address, r)?;
    }
    Ok(())
}

/// One more segment of `size` bytes on `device` given back or mapped again.
fn count_segment(r: &mut RegionReport, device: i32, size: u64) {
    r.segments += 1;
    r.region_bytes += size as i64;
    *r.per_device.entry(device_name(device)).or_default() += size as i64;
}

/// Unmap a segment and release its physical memory; its addresses stay reserved.
fn give_back(b: &mut Book, device: i32, address: u64, r: &mut RegionReport) -> Result<(), Failed> {
    let a = b.allocations.get_mut(&address).expect("booked");
    let Some(handle) = a.handle else {
        return Ok(());
    };
    let started = Instant::now();
    vmm::unmap(address, a.size)?;
    vmm::release(handle)?;
    r.map_seconds += started.elapsed().as_secs_f64();
    a.handle = None;
    count_segment(r, device, a.size);
    Ok(())
}

/// Map new physical memory at every paused segment of `tags` (all when empty) and copy
/// back what their pause kept. A segment the device has no memory for stays paused and
/// the report says so (`error`, `left_paused_bytes`); calling again later resumes the rest.
pub fn resume(tags: &[String]) -> RegionReport {
    let mut r = device_by_device(("resume", "resuming"), tags, true, resume_device);
    let left: u64 = with_book(|b| b.of_tags(tags).filter(|a| a.paused()).map(|a| a.size).sum());
    r.left_paused_bytes = left as i64;
    r
}

fn resume_device(
    b: &mut Book,
    device: i32,
    addresses: &[u64],
    r: &mut RegionReport,
) -> Result<(), Failed> {
    let context = Context::enter(device)?;
    let streams = streams(&context)?;
    let mut outcome = Ok(());
    for (i, &address) in addresses.iter().enumerate() {
        let stream = &streams[i % streams.len()];
        let a = b.allocations.get_mut(&address).expect("booked");
        let mapping = Instant::now();
        let handle = match vmm::create(device, a.size) {
            Ok(handle) => handle,
            Err(failed) => {
                outcome = Err(failed);
                break;
            }
        };
        if let Err(failed) = vmm::map(address, a.size, handle, device) {
            let _ = vmm::release(handle);
            outcome = Err(failed);
            break;
        }
        a.handle = Some(handle);
        r.map_seconds += mapping.elapsed().as_secs_f64();
        count_segment(r, device, a.size);
        let host = a.host.map_or(0, |h| h.address);
        for &(offset, len) in &a.saved {
            // SAFETY: the segment was just mapped; the host buffer holds what the pause
            // copied at these offsets and lives in the book (this lock is held); the
            // stream is waited for below.
            if let Err(failed) =
                unsafe { stream.copy_to_device(address + offset, host + offset as usize, len) }
            {
                outcome = Err(failed);
                break;
            }
            r.moved_bytes += len as i64;
        }
        if outcome.is_err() {
            break;
        }
    }
    // Whatever was queued completes before the report (and torch's next kernel) sees it.
    for stream in &streams {
        stream.synchronize()?;
    }
    for &address in addresses {
        let a = b.allocations.get_mut(&address).expect("booked");
        if !a.paused() {
            a.saved.clear();
        }
    }
    outcome
}
