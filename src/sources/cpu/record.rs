//! The CPU trace: while one runs, every CPU allocation and free the allocator hook sees is
//! appended to a ring buffer, each allocation with the Python stack that made it
//! (`py::stack`) and every entry with the tag of the thread that made it. Its Python side,
//! `py::trace`, starts and stops it and turns it into a snapshot in torch's schema.
//!
//! # Cost
//! With no trace running, the hook pays a relaxed load of `ACTIVE` (an allocation two: one
//! more under the table's lock, so that a trace started meanwhile is told). While one
//! runs, an allocation reads its stack (with no lock held), then, under the table's lock,
//! takes the recorder's lock once: the stack is interned (one hash of its (code, offset)
//! pairs; frames and stacks are stored once each, entries hold a stack id) and the entry
//! appended.
//!
//! # Locks
//! The recorder's lock is a leaf taken only while the table's lock is held, and never held
//! across Python code or an allocation through libc10: the order is GIL, table, recorder.
//! `ACTIVE` changes only with both held, so a hook that holds the table's lock sees it
//! agree with the recorder, and replaying `start.live` with the entries gives the table at
//! the stop exactly (when nothing was dropped).
//!
//! # fork
//! Both locks are held across `fork()` (`fork_prepare`, called by the table's handler), so
//! a child never inherits either locked. A child has no trace running: the C handler turns
//! `ACTIVE` off at once and marks the recorder as the parent's, and the Python one
//! (`py::trace::after_fork_in_child`) drops it and releases its use of the CPU source.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::py::stack::{Code, NoStack, Stack};
use super::table::{Entry, Table};

/// A CPU trace is running (read by the hook without a lock; changed only with the table's
/// and the recorder's locks held).
pub static ACTIVE: AtomicBool = AtomicBool::new(false);

/// What an entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc = 0,
    FreeRequested = 1,
    FreeCompleted = 2,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
        }
    }
}

/// One entry of the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub action: Action,
    pub addr: usize,
    pub size: i64,
    pub time_us: i64,
    /// Index into `Recorder::stacks` (0: no stack).
    pub stack: u32,
    /// Index into the tag names (0: no tag).
    pub tag: u32,
}

/// An FxHash-style hasher: stacks are hashed on every traced allocation.
#[derive(Default)]
pub struct FastHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    fn write_u32(&mut self, value: u32) {
        self.add(value as u64);
    }
    fn write_i32(&mut self, value: i32) {
        self.add(value as u32 as u64);
    }
    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }
    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }
}

type Fast = BuildHasherDefault<FastHasher>;

/// Microseconds since the epoch, never going back within one trace: the epoch time at the
/// start plus a monotonic clock since.
struct Clock {
    epoch_us: i64,
    origin: Instant,
    last: i64,
}

impl Clock {
    fn new() -> Self {
        let epoch_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as i64);
        Clock {
            epoch_us,
            origin: Instant::now(),
            last: epoch_us,
        }
    }

    fn now(&mut self) -> i64 {
        let now = self.epoch_us + self.origin.elapsed().as_micros() as i64;
        self.last = self.last.max(now);
        self.last
    }
}

/// A running trace.
pub struct Recorder {
    pub max_entries: usize,
    pub events: VecDeque<Event>,
    /// Entries dropped from the front because `max_entries` was reached.
    pub dropped: u64,
    /// Allocations recorded with no Python stack (dropped ones included).
    pub no_stack: u64,
    /// Interned frames: (code object, instruction offset or line: see `py::stack::line`),
    /// the code object held strongly.
    pub frames: Vec<(Code, i32)>,
    frame_ids: HashMap<(usize, i32), u32, Fast>,
    /// Interned stacks as frame ids, innermost first; `stacks[0]` is the empty stack.
    pub stacks: Vec<Box<[u32]>>,
    stack_ids: HashMap<Box<[(usize, i32)]>, u32, Fast>,
    /// When it started, and the allocations alive then (address, bytes).
    pub start_time_us: i64,
    pub start_live: Vec<(usize, i64)>,
    clock: Clock,
    /// Inherited from the parent by a forked child: not running, dropped by the child's
    /// Python at-fork handler (its code objects need the GIL).
    pub forked: bool,
}

impl Recorder {
    fn new(max_entries: usize, start_live: Vec<(usize, i64)>) -> Self {
        let mut clock = Clock::new();
        Recorder {
            max_entries,
            events: VecDeque::with_capacity(max_entries.min(1 << 16)),
            dropped: 0,
            no_stack: 0,
            frames: Vec::new(),
            frame_ids: HashMap::default(),
            stacks: vec![Box::new([])],
            stack_ids: HashMap::default(),
            start_time_us: clock.now(),
            start_live,
            clock,
            forked: false,
        }
    }

    fn push(&mut self, event: Event) {
        if self.events.len() >= self.max_entries {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(event);
    }

    /// An allocation made by the stack `stack`, under this thread's tag.
    fn push_alloc(&mut self, addr: usize, size: i64, stack: u32) {
        let (time_us, tag) = (self.clock.now(), current_tag());
        let action = Action::Alloc;
        self.push(Event {
            action,
            addr,
            size,
            time_us,
            stack,
            tag,
        });
    }

    /// A free: two entries, as torch's allocator writes (requested, then completed).
    fn push_free(&mut self, addr: usize, size: i64) {
        let (time_us, tag) = (self.clock.now(), current_tag());
        for action in [Action::FreeRequested, Action::FreeCompleted] {
            self.push(Event {
                action,
                addr,
                size,
                time_us,
                stack: 0,
                tag,
            });
        }
    }

    /// The id of a captured stack, interning it (and its frames) the first time.
    fn intern(&mut self, stack: &Stack) -> u32 {
        let key = stack.frames();
        if key.is_empty() {
            return 0;
        }
        if let Some(&id) = self.stack_ids.get(key) {
            return id;
        }
        let mut ids = Vec::with_capacity(key.len());
        for &(code, at) in key {
            let next = self.frames.len() as u32;
            let id = *self.frame_ids.entry((code, at)).or_insert_with(|| {
                // Ours is a new strong reference: the address stays this object's for as
                // long as the recorder keys on it.
                self.frames.push((stack.own(code), at));
                next
            });
            ids.push(id);
        }
        let id = self.stacks.len() as u32;
        self.stacks.push(ids.into_boxed_slice());
        self.stack_ids.insert(key.into(), id);
        id
    }
}

static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);

/// The recorder, locked. Taken only with the table's lock held (see the module's notes).
pub fn lock() -> MutexGuard<'static, Option<Recorder>> {
    RECORDER.lock().unwrap_or_else(|p| p.into_inner())
}

// --- tags ------------------------------------------------------------------------------

/// Tag names by id (0 is ""), never forgotten: a thread's tag outlives traces.
struct Tags {
    names: Vec<String>,
    ids: HashMap<String, u32>,
}

static TAGS: Mutex<Option<Tags>> = Mutex::new(None);

thread_local! {
    /// This thread's tag for the entries it makes.
    static TAG: Cell<u32> = const { Cell::new(0) };
}

fn current_tag() -> u32 {
    TAG.try_with(Cell::get).unwrap_or(0)
}

/// Set this thread's tag ("" clears it).
pub fn set_tag(tag: &str) {
    let id = if tag.is_empty() {
        0
    } else {
        let mut tags = TAGS.lock().unwrap_or_else(|p| p.into_inner());
        let tags = tags.get_or_insert_with(|| Tags {
            names: vec![String::new()],
            ids: HashMap::new(),
        });
        match tags.ids.get(tag) {
            Some(&id) => id,
            None => {
                let id = tags.names.len() as u32;
                tags.names.push(tag.to_string());
                tags.ids.insert(tag.to_string(), id);
                id
            }
        }
    };
    let _ = TAG.try_with(|current| current.set(id));
}

/// The names of tags `0..n` (for a snapshot).
pub fn tag_names() -> Vec<String> {
    let tags = TAGS.lock().unwrap_or_else(|p| p.into_inner());
    tags.as_ref()
        .map_or_else(|| vec![String::new()], |tags| tags.names.clone())
}

// --- the hook's side ---------------------------------------------------------------------

/// An allocation the hook saw, with the table's lock held: recorded in the trace if one
/// runs (`ACTIVE`, read under that lock, agrees with the recorder). `stack` was read before
/// the lock was taken, if a trace was running then.
pub fn allocated(table: &mut Table, address: usize, nbytes: i64, stack: &Result<Stack, NoStack>) {
    if !ACTIVE.load(Relaxed) {
        table.allocated(address, nbytes);
        return;
    }
    let mut guard = lock();
    let Some(recorder) = guard.as_mut().filter(|r| !r.forked) else {
        table.allocated(address, nbytes);
        return;
    };
    let id = match stack {
        // A stack exists only while its thread holds the GIL (see `py::stack`).
        Ok(stack) => recorder.intern(stack),
        Err(_) => 0,
    };
    if id == 0 {
        recorder.no_stack += 1;
    }
    if let Some(stale) = table.allocated_from(address, nbytes, id) {
        // Freed by a path the hook did not see: the trace says so before the new one.
        recorder.push_free(address, stale.nbytes);
    }
    recorder.push_alloc(address, nbytes, id);
}

/// An allocation left the table (freed through the hook, or an adopted storage died).
pub fn freed(address: usize, gone: Entry) {
    if !ACTIVE.load(Relaxed) {
        return;
    }
    if let Some(recorder) = lock().as_mut().filter(|r| !r.forked) {
        recorder.push_free(address, gone.nbytes);
    }
}

// --- start and stop (called by `py::trace`, with the GIL) ---------------------------------

/// Start recording: the table's allocations now are the trace's `start.live`.
pub fn start(max_entries: usize) -> Result<(), &'static str> {
    let left = {
        let mut table = super::table::lock();
        let Some(table) = table.as_mut() else {
            return Err("the CPU allocator hook is not installed");
        };
        let mut guard = lock();
        if guard.as_ref().is_some_and(|r| !r.forked) {
            return Err("a CPU trace is already running");
        }
        table.clear_stacks();
        let mut live: Vec<(usize, i64)> = table.entries().map(|(a, e)| (a, e.nbytes)).collect();
        live.sort_unstable();
        ACTIVE.store(true, Relaxed);
        guard.replace(Recorder::new(max_entries, live))
    };
    // A recorder a fork left (its Python handler did not run) goes, with the GIL and after
    // the locks: releasing a code object may run a weak reference's callback.
    drop(left);
    Ok(())
}

/// An allocation alive when the trace stopped: (address, bytes, stack id).
pub type LiveAtStop = (usize, i64, u32);

/// Stop recording: the recorder, and the table's allocations now as (address, bytes, stack).
/// Drop the recorder with the GIL and no lock held.
pub fn stop() -> Option<(Recorder, Vec<LiveAtStop>)> {
    let mut table = super::table::lock();
    let mut guard = lock();
    if guard.as_ref().is_none_or(|r| r.forked) {
        return None;
    }
    ACTIVE.store(false, Relaxed);
    let recorder = guard.take()?;
    let mut live: Vec<LiveAtStop> = table
        .as_mut()
        .map(|table| {
            table
                .entries()
                .map(|(a, e)| (a, e.nbytes, e.stack))
                .collect()
        })
        .unwrap_or_default();
    live.sort_unstable();
    Some((recorder, live))
}

/// How many entries the running trace has taken so far, kept and dropped: the position in
/// its entries of whatever comes next (a step's end, for the leak check). None when no
/// trace runs. The recorder's lock alone orders it with the entries: every entry is pushed
/// under it.
pub fn position() -> Option<u64> {
    lock()
        .as_ref()
        .filter(|r| !r.forked)
        .map(|r| r.dropped + r.events.len() as u64)
}

/// Whether a trace is running.
pub fn active() -> bool {
    ACTIVE.load(Relaxed)
}

/// A recorder a forked child inherited (taken by the child's Python at-fork handler).
/// Drop it with the GIL and no lock held.
pub fn take_forked() -> Option<Recorder> {
    let _table = super::table::lock();
    let mut guard = lock();
    if guard.as_ref().is_some_and(|r| r.forked) {
        guard.take()
    } else {
        None
    }
}

// --- fork -----------------------------------------------------------------------------------

thread_local! {
    static FORK_GUARD: RefCell<Option<MutexGuard<'static, Option<Recorder>>>> =
        const { RefCell::new(None) };
}

/// Before `fork()`, with the table's lock held: hold the recorder's too.
pub fn fork_prepare() {
    let guard = lock();
    let _ = FORK_GUARD.try_with(|slot| *slot.borrow_mut() = Some(guard));
}

/// After `fork()` in the parent: let it go; the trace goes on.
pub fn fork_parent() {
    let _ = FORK_GUARD.try_with(|slot| drop(slot.borrow_mut().take()));
}

/// After `fork()` in the child: no trace runs here; the parent's recorder waits for the
/// child's Python handler (dropping it needs the GIL).
pub fn fork_child() {
    let _ = FORK_GUARD.try_with(|slot| {
        if let Some(mut guard) = slot.borrow_mut().take() {
            ACTIVE.store(false, Relaxed);
            if let Some(recorder) = guard.as_mut() {
                recorder.forked = true;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_buffer_keeps_the_newest_and_counts_the_rest() {
        let mut recorder = Recorder::new(10, Vec::new());
        for i in 0..30 {
            recorder.push_alloc(i, 1, 0);
        }
        assert_eq!(recorder.events.len(), 10);
        assert_eq!(recorder.dropped, 20);
        let kept: Vec<usize> = recorder.events.iter().map(|e| e.addr).collect();
        assert_eq!(kept, (20..30).collect::<Vec<_>>());
    }

    #[test]
    fn a_free_is_two_entries_at_one_time() {
        let mut recorder = Recorder::new(4, Vec::new());
        recorder.push_free(64, 100);
        let actions: Vec<Action> = recorder.events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [Action::FreeRequested, Action::FreeCompleted]);
        assert_eq!(recorder.events[0].time_us, recorder.events[1].time_us);
        assert!(recorder
            .events
            .iter()
            .all(|e| e.addr == 64 && e.size == 100));
    }

    #[test]
    fn the_clock_never_goes_back_and_starts_near_now() {
        let mut clock = Clock::new();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        let mut last = clock.now();
        assert!((last - wall).abs() < 1_000_000);
        for _ in 0..10_000 {
            let now = clock.now();
            assert!(now >= last);
            last = now;
        }
    }

    /// The hook read `ACTIVE` (off), a trace started, then the hook took the table's
    /// lock: the allocation is the trace's, without a stack (it is not in `start.live`).
    /// A free of a tracked address is recorded; one of an unknown address is not.
    #[test]
    fn an_allocation_begun_before_a_start_is_recorded_by_it() {
        let mut table = super::super::table::lock();
        super::super::table::reset(&mut table);
        table.as_mut().unwrap().adopt(64, 10);
        drop(table);
        start(100).unwrap();
        assert!(active());
        {
            let mut table = super::super::table::lock();
            let table = table.as_mut().unwrap();
            allocated(table, 4096, 100, &Err(NoStack::NotTracing));
            let gone = table.freed(64).unwrap();
            freed(64, gone);
            assert_eq!(table.freed(128), None);
        }
        let (recorder, live) = stop().unwrap();
        assert!(!active());
        assert_eq!(recorder.start_live, [(64, 10)]);
        let entries: Vec<(Action, usize, i64)> = recorder
            .events
            .iter()
            .map(|e| (e.action, e.addr, e.size))
            .collect();
        assert_eq!(
            entries,
            [
                (Action::Alloc, 4096, 100),
                (Action::FreeRequested, 64, 10),
                (Action::FreeCompleted, 64, 10)
            ]
        );
        assert_eq!(recorder.no_stack, 1);
        assert_eq!(live, [(4096, 100, 0)]);
        assert!(stop().is_none());
        *super::super::table::lock() = None;
    }

    #[test]
    fn a_position_counts_kept_and_dropped_entries() {
        let mut recorder = Recorder::new(4, Vec::new());
        for i in 0..6 {
            recorder.push_alloc(i, 1, 0);
        }
        recorder.push_free(0, 1);
        assert_eq!(recorder.dropped + recorder.events.len() as u64, 8);
    }

    #[test]
    fn tags_are_interned_per_thread() {
        set_tag("forward:encoder");
        let id = current_tag();
        set_tag("backward:");
        set_tag("forward:encoder");
        assert_eq!(current_tag(), id);
        assert_eq!(tag_names()[id as usize], "forward:encoder");
        std::thread::spawn(|| assert_eq!(current_tag(), 0))
            .join()
            .unwrap();
        set_tag("");
        assert_eq!(current_tag(), 0);
    }
}
