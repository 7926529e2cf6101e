//! CPU memory, counted at torch's CPU allocator: every byte of every CPU storage torch
//! allocates and frees, on any thread, through any path (operators, `out=`, `resize_`,
//! deserialisation, numpy conversion, temporaries inside operators), with the statistics
//! of `torch.cuda.memory_stats()` (see `table`).
//!
//! # The mechanism, and why this one
//! torch's `DefaultCPUAllocator` (c10/core/CPUAllocator.cpp, in `libc10.so`) gets its memory
//! from `c10::alloc_cpu`, which calls `posix_memalign(&p, alignment, nbytes)`, and gives it
//! back through `c10::free_cpu`, which calls `free(p)`. Both are calls from `libc10.so` into
//! the C library, made through `libc10.so`'s GOT. While tracking, its `posix_memalign` and
//! `free` slots point at our two functions (see `got`): an allocation of `nbytes` is
//! recorded under its address, a free of a recorded address undoes it, and everything else
//! (frees of memory we never saw) passes straight through. The size is the storage's
//! `nbytes`, exactly what CUDA's `allocated_bytes` counts for the same tensor.
//!
//! - Exact: it sees the allocator itself, so no path around it exists short of another
//!   allocator (pinned memory, shared memory and `mmap`-loaded storages are not made by the
//!   CPU allocator, and are not counted, as CUDA does not count them either).
//! - Cheap: one uncontended lock and one hash-map update per allocation (about 0.05 us);
//!   nothing at all when not tracking, because the slots are put back. No Python per call,
//!   no walk per profiled call: memory alive before tracking is adopted once, at `start`.
//! - Every thread: the GOT is process-wide, so Python threads, torch's intra-op threads and
//!   C++ threads are all seen.
//!
//! The alternative, torch's own reporting hook (`c10::MemoryReportingInfoBase`, which the
//! profiler uses), is a C++ virtual interface compiled against one torch's headers (our
//! wheel is built once for every torch), is installed per thread through
//! `ThreadLocalDebugInfo` (threads started by the program would each need it, and it
//! replaces the profiler's own when both run), and reports through a mutex-guarded map in
//! torch: slower, per thread, and tied to a torch ABI.
//!
//! # What makes it sound
//! - The slots are found from `libc10.so`'s relocation tables by symbol name, never by
//!   offset; a library without them (a statically linked torch, another platform) gets the
//!   fallback below, and the report says why.
//! - `start` checks the assumption before trusting it: a probe tensor of a known size must
//!   appear in the table at its address and leave it when freed. If not, the hook is taken
//!   out and the fallback used.
//! - What the slot held before is what our functions call (when that is a lazy-binding stub
//!   inside `libc10.so`, the symbol resolved by the dynamic linker instead, so that the stub
//!   never rewrites the slot under us); `stop` writes that function back (never the stub:
//!   a thread calling through a restored stub makes the dynamic linker write the slot, which
//!   could land just after a later start wrote ours; a start whose probe finds a slot
//!   rewritten that way installs again), unless another tool replaced
//!   our function meanwhile (then theirs stays and ours passes calls through). A slot that no
//!   longer holds our function while tracking is seen when a report is built or the profiler
//!   disabled (`displaced`), and
//!   the report says that CPU allocations after that point are not counted.
//! - Storages alive at `start` are adopted by address and size, from one gc walk. A free of
//!   that address undoes one; a storage the CPU allocator did not make (numpy's memory,
//!   `torch.load(mmap=True)`) is never freed through the hook, so a weak reference to each
//!   adopted storage also undoes it when the storage dies, unless the hook already did.
//! - A free is recorded before the memory goes back, so an address reused at once by another
//!   thread is never confused with the old allocation.
//! - fork: the table's lock is held across `fork()` (pthread_atfork), so the child never
//!   inherits it locked; the forking thread's own allocations in that window pass through.
//!
//! # Sessions
//! A session runs from the first `start` (a line profiler's or monitor's CPU source, a CPU
//! trace, the pytest plugin) to the last `stop`; every reader of one session shares its
//! table and counters, and nothing of it may count in the next. The table goes at the last
//! stop and the counters are zeroed at the next first start, but weak references made on
//! the Python side live on: `baseline()`'s (their callbacks uncount adopted storages) and the
//! fallback's live table (its callbacks call `_cpu_freed`). So a first `start` calls
//! `forget()` before anything counts, which drops them all (a dropped weak reference never
//! calls back), and the fallback's calls reach the counters only while the fallback is the
//! session's mode (`fallback_counts`): one of its storages freed during a later session of
//! the hook, which recognises that free by address itself, would have been uncounted twice.
//!
//! # The CPU trace
//! While a CPU trace runs (`py::trace`: `_cpu_trace_start` / `_cpu_trace_stop`), the same
//! two functions also append every allocation and free of a tracked address to a ring buffer
//! (`record`), each allocation with the Python stack that made it (`py::stack`), read before
//! the table's lock is taken. With no trace running, that costs the hook a relaxed load
//! (two for an allocation: one more under the lock).
//!
//! # The fallback
//! Where the hook is impossible, or with `MEMLAB_RS_CPU_SOURCE=dispatch`, the dispatch-mode
//! source of `memlab_rs._sources.cpu_dispatch` feeds the same counters. It sees operator outputs on
//! the threads running profiled code only: it misses `out=`, `resize_`, deserialised
//! tensors, other threads' allocations and temporaries inside operators, and every report
//! made with it says so.
//!
//! # Files
//! Here is the hook itself, with no Python in it: the two functions, writing the slots and
//! putting them back (`hook`, `uninstall`, `release`), the lifecycle lock's state, the
//! counters and the fork handlers; with `got` (the slots), `table` (live storages and
//! counters) and `record` (the trace's ring buffer). What calls Python is `py`'s: `start`
//! and `stop` (`py::lifecycle`: the glue's probe, baseline walk and reset), the stack read
//! from the frames (`py::stack`), the trace's start, stop and snapshot (`py::trace`), and the
//! `_core` functions.

pub mod got;
pub mod py;
pub mod record;
pub mod table;

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, Once};

pub use table::COUNTERS;

/// How CPU memory is being counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// At torch's CPU allocator.
    Allocator,
    /// The dispatch-mode fallback, and why the allocator hook is not used.
    Dispatch(String),
}

/// The slots we wrote and what they held.
struct Installed {
    patched: Vec<(got::Slot, usize)>,
}

/// Who counts: held through a whole `start` or `stop`, Python calls (the probe, the
/// baseline walk) included, so it is only waited for with the GIL released.
struct Lifecycle {
    users: usize,
    installed: Option<Installed>,
}

static LIFECYCLE: Mutex<Lifecycle> = Mutex::new(Lifecycle {
    users: 0,
    installed: None,
});

/// What readers ask at any time: the mode, and the slots that should hold our functions.
/// A leaf lock, never held across anything else.
struct Info {
    mode: Option<Mode>,
    patched: Vec<got::Slot>,
}

static INFO: Mutex<Info> = Mutex::new(Info {
    mode: None,
    patched: Vec::new(),
});

fn info() -> std::sync::MutexGuard<'static, Info> {
    INFO.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// This thread is inside `start` or `stop` (Python code they run must not re-enter).
    static IN_LIFECYCLE: Cell<bool> = const { Cell::new(false) };
}

struct LifecycleGuard(MutexGuard<'static, Lifecycle>);

impl Drop for LifecycleGuard {
    fn drop(&mut self) {
        IN_LIFECYCLE.with(|inside| inside.set(false));
    }
}

static TRACKING: AtomicBool = AtomicBool::new(false);
/// The dispatch-mode fallback is what counts now (see `fallback_counts`).
static FALLBACK: AtomicBool = AtomicBool::new(false);
static DISPLACED: AtomicBool = AtomicBool::new(false);
static REAL_MEMALIGN: AtomicUsize = AtomicUsize::new(0);
static REAL_FREE: AtomicUsize = AtomicUsize::new(0);

const NAMES: [&str; 2] = ["posix_memalign", "free"];
/// The size of the probe tensor `start` allocates (odd, so it stands out in the table).
pub const PROBE_BYTES: i64 = 4099;

thread_local! {
    /// This thread holds the table's lock across a fork: its allocations pass through.
    static FORKING: Cell<bool> = const { Cell::new(false) };
}

type Memalign = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;
type Free = unsafe extern "C" fn(*mut c_void);

fn counting() -> bool {
    TRACKING.load(Relaxed) && !FORKING.try_with(Cell::get).unwrap_or(true)
}

/// `libc10.so`'s `posix_memalign`, while tracking.
unsafe extern "C" fn memalign_hook(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    let real = REAL_MEMALIGN.load(Acquire);
    // SAFETY: REAL_MEMALIGN is set (Release) to the slot's previous function or to the
    // resolved `posix_memalign` before our function is written into any slot, and never
    // set to 0 afterwards; both have this signature.
    let rc = if real == 0 {
        libc::posix_memalign(out, align, size)
    } else {
        std::mem::transmute::<usize, Memalign>(real)(out, align, size)
    };
    if rc == 0 && counting() {
        // SAFETY: on success posix_memalign stored the new address at `out`.
        let address = *out as usize;
        // Read before any lock: reading it may run finalisers that free or allocate.
        let stack = if record::ACTIVE.load(Relaxed) {
            py::stack::capture()
        } else {
            Err(py::stack::NoStack::NotTracing)
        };
        if let Some(table) = table::lock().as_mut() {
            // Looks at ACTIVE again, under the lock: a trace started since is told.
            record::allocated(table, address, size as i64, &stack);
        }
        drop(stack); // after the lock: it releases code objects, and the GIL if taken
    }
    rc
}

/// `libc10.so`'s `free`, while tracking (and for ever after through any address of `free`
/// that libc10 took while we were installed: then it only passes through).
unsafe extern "C" fn free_hook(pointer: *mut c_void) {
    if !pointer.is_null() && counting() {
        if let Some(table) = table::lock().as_mut() {
            if let Some(gone) = table.freed(pointer as usize) {
                record::freed(pointer as usize, gone);
            }
        }
    }
    let real = REAL_FREE.load(Acquire);
    // SAFETY: as for REAL_MEMALIGN; the memory is given back only after the table forgot it.
    if real == 0 {
        libc::free(pointer)
    } else {
        std::mem::transmute::<usize, Free>(real)(pointer)
    }
}

fn ours(name: &str) -> usize {
    match name {
        "posix_memalign" => memalign_hook as Memalign as usize,
        _ => free_hook as Free as usize,
    }
}

fn release(mut life: LifecycleGuard) {
    life.0.users = life.0.users.saturating_sub(1);
    if life.0.users > 0 {
        return;
    }
    FALLBACK.store(false, Relaxed);
    {
        let mut info = info();
        info.mode = None;
        info.patched.clear();
    }
    if let Some(installed) = life.0.installed.take() {
        uninstall(installed);
    }
}

/// Whether the dispatch-mode fallback counts now: what it reports (`_cpu_allocated`,
/// `_cpu_adopted`, `_cpu_freed`) reaches the counters only then. Its weak references'
/// callbacks outside its own session, in no session or in the allocator hook's, are stale.
pub fn fallback_counts() -> bool {
    FALLBACK.load(Relaxed)
}

/// How CPU memory is counted now (None when nobody counts).
pub fn mode() -> Option<Mode> {
    info().mode.clone()
}

/// Write our functions into libc10's slots (no Python).
fn hook(library: Option<&str>) -> Result<Installed, String> {
    if std::env::var("MEMLAB_RS_CPU_SOURCE").is_ok_and(|v| v == "dispatch") {
        return Err("MEMLAB_RS_CPU_SOURCE=dispatch".to_string());
    }
    let library =
        library.ok_or("torch's libc10.so was not found next to torch (a static build?)")?;
    let found = got::find(Path::new(library), &NAMES)?;
    for name in NAMES {
        if !found.slots.iter().any(|slot| slot.name == name) {
            return Err(format!(
                "libc10.so does not call {name} through its GOT (its allocator is built in?)"
            ));
        }
    }
    for name in NAMES {
        let real = if name == NAMES[0] {
            &REAL_MEMALIGN
        } else {
            &REAL_FREE
        };
        for slot in found.slots.iter().filter(|slot| slot.name == name) {
            // SAFETY: a slot of a loaded library, found just now.
            let value = unsafe { got::read(slot) };
            if value == ours(name) {
                continue; // ours from an earlier start that could not be put back
            }
            let value = if value == 0 || found.contains(value) {
                got::resolve(name) // a lazy-binding stub: the symbol it would bind
            } else {
                value
            };
            if value != 0 {
                real.store(value, std::sync::atomic::Ordering::Release);
                break;
            }
        }
        if real.load(Acquire) == 0 {
            return Err(format!("{name} could not be resolved"));
        }
    }
    {
        let mut table = table::lock();
        table::reset(&mut table);
    }
    register_fork_handlers();
    DISPLACED.store(false, Relaxed);
    TRACKING.store(true, Relaxed);
    let mut patched = Vec::new();
    for slot in &found.slots {
        // SAFETY: as above; our functions have the slot's signature.
        let mut before = unsafe { got::read(slot) };
        if before == ours(slot.name) {
            continue;
        }
        if before == 0 || found.contains(before) {
            // A lazy-binding stub: what we put back later is the function it binds, never
            // the stub, so no later call goes through the dynamic linker's resolver, which
            // would write the slot under a later start of ours.
            before = if slot.name == NAMES[0] {
                REAL_MEMALIGN.load(Acquire)
            } else {
                REAL_FREE.load(Acquire)
            };
        }
        // SAFETY: the slot is an aligned GOT word of a loaded library; the value is our
        // function with the same C signature as the symbol.
        if let Err(error) = unsafe { got::write(slot, ours(slot.name)) } {
            uninstall(Installed { patched });
            return Err(error);
        }
        patched.push((*slot, before));
    }
    Ok(Installed { patched })
}

fn uninstall(installed: Installed) {
    TRACKING.store(false, Relaxed);
    for (slot, before) in installed.patched {
        // SAFETY: our own slot; put back only what we replaced, and only while ours is
        // there: a tool that replaced us meanwhile keeps its function.
        unsafe {
            if got::read(&slot) == ours(slot.name) {
                let _ = got::write(&slot, before);
            }
        }
    }
    *table::lock() = None;
}

/// Whether a slot we wrote no longer holds our function (another tool replaced it) while
/// tracking. Remembered: a later check stays true until the next `start`.
pub fn displaced() -> bool {
    if DISPLACED.load(Relaxed) {
        return true;
    }
    // SAFETY: slots of a loaded library, found at install.
    let gone = info()
        .patched
        .iter()
        .any(|slot| unsafe { got::read(slot) } != ours(slot.name));
    if gone {
        DISPLACED.store(true, Relaxed);
    }
    gone
}

/// An adopted storage's Python object died (its weak reference's callback).
pub fn adopted_gone(address: usize, nbytes: i64) {
    if let Some(table) = table::lock().as_mut() {
        if table.adopted_gone(address, nbytes) {
            let gone = table::Entry {
                nbytes,
                adopted: true,
                stack: 0,
            };
            record::freed(address, gone);
        }
    }
}

/// Whether the table holds `address` with `nbytes` (the probe's check, and tests').
pub fn has(address: usize, nbytes: i64) -> bool {
    table::lock()
        .as_ref()
        .is_some_and(|table| table.get(address) == Some(nbytes))
}

fn register_fork_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: plain functions with the signature pthread_atfork wants.
        unsafe {
            libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        }
    });
}

thread_local! {
    static FORK_GUARD: std::cell::RefCell<Option<std::sync::MutexGuard<'static, Option<table::Table>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Before fork: the table's lock, then the CPU trace's (the order every thread takes them).
extern "C" fn fork_prepare() {
    let guard = table::lock();
    let _ = FORKING.try_with(|forking| forking.set(true));
    let _ = FORK_GUARD.try_with(|slot| *slot.borrow_mut() = Some(guard));
    record::fork_prepare();
}

extern "C" fn fork_parent() {
    record::fork_parent();
    fork_done();
}

/// In the child: no CPU trace runs there (see `record`).
extern "C" fn fork_child() {
    record::fork_child();
    fork_done();
}

/// After fork, in the parent and in the child (the same thread in both).
fn fork_done() {
    let _ = FORK_GUARD.try_with(|slot| drop(slot.borrow_mut().take()));
    let _ = FORKING.try_with(|forking| forking.set(false));
}
