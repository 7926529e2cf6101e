//! The one engine every interpreter hook reports to: which code objects are profiled and by
//! which collectors, the memory sources they sample, and each collector's frames and rows.
//!
//! Several `LineProfiler`s may be enabled at once (the global one behind `@profile` and a
//! user's own). A peak reset by one would hide a peak from another, so every event samples
//! each source in use once and hands the sample to every collector reading that source.
//!
//! The engine holds the profiled code objects and samples sources that read through torch,
//! so it lives in the binding folder; what it records is plain (`crate::line_profiler::frames`)
//! and the result is built from it by pure functions (`crate::line_profiler::report`).
//!
//! # The engine lock
//! The engine is taken under the sources' lock (`crate::sources::lock`: taken with the GIL
//! held and waited for with it released, never twice on one thread, held across `fork()`),
//! the one every start and stop of a memory source runs under, whoever asks. Code the engine
//! runs (a finaliser during a collection, profiled code called from it) that calls the
//! profiler again gets a clear error from `with_engine`; the interpreter hooks drop such
//! events and count them (`try_with_engine`), and the report says how many were dropped.
//! The engine itself sits behind a leaf lock taken only while the sources' lock is held, so
//! it is never waited for and never held at a fork.
//!
//! Other locks in the line profiler are leaves: held only with the GIL, never across a call
//! into Python and never while taking another lock, so no thread can hold one at a fork.
//!
//! # Incidents
//! What the hooks could not do (an event dropped because the engine was busy, an error while
//! handling one, a thread whose tracer was replaced) happens where the engine may not be
//! available, so it is queued here (`report_incident`, `PENDING_DROPS`) and folded into every
//! enabled collector the next time anyone takes the engine. Reports print them as notices.
//! Errors are never raised into the profiled program: `remember` keeps them for the report.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::line_profiler::frames::{Frame, Row, ThreadStack};
use crate::line_profiler::report::Incidents;
use crate::sources::lock;
use crate::sources::source::{Device, Source};

/// A code object a collector profiles.
pub struct Code {
    pub object: Py<PyAny>,
    pub qualname: String,
    /// Its `co_filename`.
    pub filename: String,
    pub first_line: u32,
    /// (start offset, end offset, line) from `co_lines()`, for resumed generators.
    pub offsets: Vec<(i64, i64, u32)>,
    pub rows: BTreeMap<u32, Row>,
}

impl Code {
    fn line_at(&self, offset: i64) -> u32 {
        self.offsets
            .iter()
            .find(|(start, end, _)| (*start..*end).contains(&offset))
            .map_or(self.first_line, |&(_, _, line)| line)
    }
}

/// One `LineProfiler`'s state.
pub struct Collector {
    pub device: Device,
    pub enabled: bool,
    pub codes: Vec<Code>,
    threads: Vec<ThreadStack>,
    /// Each `Delta` statistic summed over every sample taken while the collector was
    /// enabled, whatever device it read then: lines take differences of it.
    cumulative: Vec<i64>,
    /// The highest value of every statistic seen while enabled.
    pub session_peak: Vec<i64>,
    /// The layout of the source last read (names for reports and column checks).
    pub names: Vec<String>,
    /// Events of its code objects dropped because the engine was busy.
    pub dropped: u64,
    /// Errors met while handling its events, and the first of them.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Lines the report prints under the tables (threads that stopped being profiled, ...).
    pub notices: Vec<String>,
    /// The CUDA direct reader's fallback notice for this device when the collector was
    /// enabled: only a newer one happened while it read, and belongs in its report.
    cuda_notice_at_enable: Option<String>,
}

impl Collector {
    /// What its report says about it besides its rows.
    pub fn incidents(&self) -> Incidents<'_> {
        Incidents {
            dropped: self.dropped,
            errors: self.errors,
            first_error: self.first_error.as_deref(),
            notices: &self.notices,
        }
    }
}

/// What happened in a profiled code object.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// A new frame starts at the function's first line.
    Start,
    /// A suspended frame (generator, coroutine) resumes at this bytecode offset.
    Resume { offset: i64 },
    /// A frame starts or resumes at this line (the trace hook knows it directly).
    EnterAt { line: u32 },
    /// The frame moves to this line.
    Line { line: u32 },
    /// The frame returns, yields or unwinds.
    Leave,
}

/// Work the caller must do after releasing the engine (it runs Python code).
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// The first CPU-profiled frame started on this thread (`thread`, the calling one):
    /// start tracking storages here.
    TrackCpu { thread: u64 },
    /// The last CPU-profiled frame on the calling thread left, or profiling ended for it:
    /// stop tracking storages here.
    UntrackCpuHere,
    /// Profiling ended for another thread still inside a CPU-profiled frame: its tracking
    /// must stop counting at once (only that thread can take it off, later).
    RetireCpu { thread: u64 },
}

/// Something the hooks met outside the engine, for the reports of the enabled collectors.
pub enum Incident {
    Error(String),
    Notice(String),
}

/// Which collector: its slot in the engine's table and that slot's generation when the
/// collector was created. A dropped collector's slot is reused by the next one created, so
/// the table is as long as the most profilers alive at once (not as every profiler ever
/// made: each event walks the table). The generation tells the new collector from the
/// dropped one: whatever still names the dropped one (a drop queued while the engine was
/// busy, a `LineCollector` method racing its own drop) finds nothing, never the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectorId {
    slot: u32,
    generation: u64,
}

/// One entry of the collector table.
struct Slot {
    /// Bumped each time the slot's collector is dropped; never wraps in practice (u64).
    generation: u64,
    collector: Option<Collector>,
}

#[derive(Default)]
pub struct Engine {
    slots: Vec<Slot>,
    /// Slots whose collector was dropped, for the next collector created.
    free: Vec<u32>,
    /// The enabled collectors, in the order they were enabled: all that samples and
    /// incidents visit, so a profiler kept alive but disabled costs an event nothing.
    enabled: Vec<CollectorId>,
    sources: Vec<Source>,
    /// code object address -> (collector, code index) for enabled collectors.
    watched: HashMap<usize, Vec<(CollectorId, u32)>>,
    /// Profiled CPU frames per thread, over all CPU collectors.
    cpu_depth: HashMap<u64, u32>,
}

/// The engine: taken only while the sources' lock is held (a leaf: never contended).
static ENGINE: Mutex<Option<Engine>> = Mutex::new(None);

/// Events dropped because the engine was busy, not yet folded into the collectors.
pub static PENDING_DROPS: AtomicU64 = AtomicU64::new(0);
static PENDING_ANY: AtomicBool = AtomicBool::new(false);
/// A leaf lock: only strings go in and out.
static PENDING: Mutex<Vec<Incident>> = Mutex::new(Vec::new());

/// Queue an incident for every collector enabled now (folded at the next engine entry).
pub fn report_incident(incident: Incident) {
    let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    if pending.len() < 1024 {
        pending.push(incident);
    }
    PENDING_ANY.store(true, Relaxed);
}

/// The first errors met while handling events, for debugging (`_hook_errors()`).
pub static ERRORS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keep an error for the reports of the enabled collectors (never raised into user code).
pub fn remember(error: String) {
    {
        let mut errors = ERRORS.lock().unwrap_or_else(|p| p.into_inner());
        if errors.len() < 8 {
            errors.push(error.clone());
        }
    }
    report_incident(Incident::Error(error));
}

/// The id of the calling thread, as the engine keys its stacks (cheaper than asking Python).
pub fn thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ID: Cell<u64> = const { Cell::new(0) });
    ID.with(|id| {
        if id.get() == 0 {
            id.set(NEXT.fetch_add(1, Relaxed));
        }
        id.get()
    })
}

fn busy_error() -> PyErr {
    PyRuntimeError::new_err(
        "the line profiler is busy on this thread: it was called from code that runs inside \
         the profiler itself (a finaliser during a garbage collection, or a callback); call \
         it again once that code has returned",
    )
}

/// Run `f` on the engine (created on first use), under the sources' lock; while another
/// thread holds it, wait with the GIL released. A call from code the engine itself runs
/// on this thread gets a clear error instead of a deadlock.
pub fn with_engine<T>(py: Python<'_>, f: impl FnOnce(&mut Engine) -> PyResult<T>) -> PyResult<T> {
    let _held = lock::take(|| py.detach(lock::wait_free)).map_err(|_| busy_error())?;
    let mut guard = ENGINE.lock().unwrap_or_else(|p| p.into_inner());
    let engine = guard.get_or_insert_with(Engine::default);
    engine.fold_pending();
    f(engine)
}

/// Like `with_engine` for the interpreter hooks: if the engine is busy (held on this thread,
/// or by another thread that released the GIL) the event is not waited for: None.
pub fn try_with_engine<T>(f: impl FnOnce(&mut Engine) -> T) -> Option<T> {
    let _held = lock::try_take()?;
    let mut guard = ENGINE.lock().unwrap_or_else(|p| p.into_inner());
    let engine = guard.get_or_insert_with(Engine::default);
    if PENDING_ANY.load(Relaxed) || PENDING_DROPS.load(Relaxed) != 0 {
        engine.fold_pending();
    }
    Some(f(engine))
}

/// Before `fork()`: take the sources' lock and keep it across the fork, so that no other
/// thread holds it (or the engine) at that moment. Runs with the GIL; waits for a holder
/// with the GIL released. Nothing when forked from code the engine runs.
pub fn fork_prepare(py: Python<'_>) {
    lock::hold_across_fork(|| py.detach(lock::wait_free));
}

/// After `fork()` in the parent: let the lock go; profiling goes on as before.
pub fn fork_parent() {
    lock::release_after_fork();
}

/// After `fork()` in the child: nothing is enabled, no frame is open, no source is read (the
/// child has only the forking thread and a copy of the allocator it must not trust). Rows
/// recorded before the fork stay; the child is profiled again only if it asks.
pub fn fork_child() {
    if lock::held_across_fork() {
        if let Some(engine) = ENGINE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            engine.reset_after_fork();
        }
        lock::release_after_fork();
    }
    PENDING_DROPS.store(0, Relaxed);
}

impl Engine {
    pub fn create(&mut self, device: Device) -> CollectorId {
        let collector = Collector {
            device,
            enabled: false,
            codes: Vec::new(),
            threads: Vec::new(),
            cumulative: Vec::new(),
            session_peak: Vec::new(),
            names: Vec::new(),
            dropped: 0,
            errors: 0,
            first_error: None,
            notices: Vec::new(),
            cuda_notice_at_enable: None,
        };
        if let Some(slot) = self.free.pop() {
            let entry = &mut self.slots[slot as usize];
            entry.collector = Some(collector);
            return CollectorId {
                slot,
                generation: entry.generation,
            };
        }
        let slot = u32::try_from(self.slots.len()).expect("fewer than 2**32 profilers alive");
        self.slots.push(Slot {
            generation: 0,
            collector: Some(collector),
        });
        CollectorId {
            slot,
            generation: 0,
        }
    }

    /// The collector `id` names, if it was not dropped.
    fn get(&self, id: CollectorId) -> Option<&Collector> {
        live_slot(&self.slots, id)
    }

    fn get_mut(&mut self, id: CollectorId) -> Option<&mut Collector> {
        live_slot_mut(&mut self.slots, id)
    }

    /// Every collector alive, with its id.
    fn live(&self) -> impl Iterator<Item = (CollectorId, &Collector)> {
        self.slots.iter().enumerate().filter_map(|(slot, entry)| {
            let id = CollectorId {
                slot: slot as u32,
                generation: entry.generation,
            };
            entry.collector.as_ref().map(|c| (id, c))
        })
    }

    pub fn collector(&self, id: CollectorId) -> PyResult<&Collector> {
        self.get(id).ok_or_else(dropped_error)
    }

    fn collector_mut(&mut self, id: CollectorId) -> PyResult<&mut Collector> {
        self.get_mut(id).ok_or_else(dropped_error)
    }

    /// Register a code object; returns its index and whether it is new.
    pub fn add_code(&mut self, id: CollectorId, code: Code) -> PyResult<(u32, bool)> {
        let address = code.object.as_ptr() as usize;
        let collector = self.collector_mut(id)?;
        if let Some(i) = collector
            .codes
            .iter()
            .position(|c| c.object.as_ptr() as usize == address)
        {
            return Ok((i as u32, false));
        }
        collector.codes.push(code);
        let index = collector.codes.len() as u32 - 1;
        if collector.enabled {
            self.watched.entry(address).or_default().push((id, index));
        }
        Ok((index, true))
    }

    /// Start profiling: sample the source once so the first line starts from a baseline.
    pub fn enable(&mut self, py: Python<'_>, id: CollectorId) -> PyResult<()> {
        if self.collector(id)?.enabled {
            return Ok(());
        }
        let device = self.collector(id)?.device;
        self.use_source(py, device)?;
        // A source already in use (another profiler on this device) is checked against
        // torch again; a new one checks itself when it first uses the direct reader.
        let checked = self
            .source_index(device)
            .map_or(Ok(()), |i| self.sources[i].validate(py));
        if let Err(error) = checked.and_then(|()| self.sample_all(py)) {
            // A source that cannot be read must not stay behind and fail every later
            // event of the other profilers.
            self.drop_unused_sources();
            return Err(error);
        }
        let collector = live_slot_mut(&mut self.slots, id).expect("checked above");
        if let Some(source) = self.sources.iter().find(|s| s.device == device) {
            fit_to_source(collector, source);
        }
        collector.enabled = true;
        collector.cuda_notice_at_enable = cuda_notice(device);
        self.enabled.push(id);
        for (index, code) in collector.codes.iter().enumerate() {
            let address = code.object.as_ptr() as usize;
            self.watched
                .entry(address)
                .or_default()
                .push((id, index as u32));
        }
        Ok(())
    }

    /// Stop profiling: lines still open are closed with what they did so far.
    pub fn disable(
        &mut self,
        py: Python<'_>,
        id: CollectorId,
        thread: u64,
    ) -> PyResult<Vec<Action>> {
        if !self.collector(id)?.enabled {
            return Ok(Vec::new());
        }
        let device = self.collector(id)?.device;
        // Checked before the last sample: if memory disagrees, that sample is torch's.
        if let Some(i) = self.source_index(device) {
            self.sources[i].validate(py)?;
        }
        self.sample_all(py)?;
        self.gather_source_notices(id);
        Ok(self.stop_collecting(id, thread))
    }

    /// What disabling does once the last sample is taken, none of which can fail: the
    /// collector's open lines close with the values of the last sample, its watch entries
    /// go, and with them the sources nobody reads. Nothing for a collector not enabled.
    fn stop_collecting(&mut self, id: CollectorId, thread: u64) -> Vec<Action> {
        let Some(collector) = self.get_mut(id).filter(|c| c.enabled) else {
            return Vec::new();
        };
        let device = collector.device;
        collector.enabled = false;
        let stacks = std::mem::take(&mut collector.threads);
        self.enabled.retain(|&enabled| enabled != id);
        let source = self.source_index(device);
        let mut actions = Vec::new();
        for mut stack in stacks {
            while !stack.frames.is_empty() {
                match source {
                    Some(source) => self.pop_frame(id, source, &mut stack),
                    None => drop(stack.frames.pop()),
                }
                if device == Device::Cpu {
                    actions.extend(self.cpu_leave(stack.thread, thread));
                }
            }
        }
        for entries in self.watched.values_mut() {
            entries.retain(|&(collector, _)| collector != id);
        }
        self.watched.retain(|_, entries| !entries.is_empty());
        self.drop_unused_sources();
        actions
    }

    /// Forget every function and every row, and what the report would have said about
    /// them (the profiler stays enabled or not).
    pub fn clear(&mut self, py: Python<'_>, id: CollectorId, thread: u64) -> PyResult<Vec<Action>> {
        let was_enabled = self.collector(id)?.enabled;
        let actions = self.disable(py, id, thread)?;
        let collector = self.collector_mut(id)?;
        collector.codes.clear();
        collector.dropped = 0;
        collector.errors = 0;
        collector.first_error = None;
        collector.notices.clear();
        if was_enabled {
            self.enable(py, id)?;
        }
        Ok(actions)
    }

    /// Profiling ends on `thread` (the calling one) for every collector: its tracer was
    /// replaced. Its open lines close with the values now, and `notice` says so in the report
    /// of every enabled collector.
    pub fn stop_thread(
        &mut self,
        py: Python<'_>,
        thread: u64,
        notice: String,
    ) -> PyResult<Vec<Action>> {
        self.sample_all(py)?;
        let mut actions = Vec::new();
        for id in self.enabled.clone() {
            let Some(collector) = self.get_mut(id) else {
                continue;
            };
            collector.notices.push(notice.clone());
            let device = collector.device;
            let Some(at) = collector.threads.iter().position(|s| s.thread == thread) else {
                continue;
            };
            let mut stack = collector.threads.swap_remove(at);
            while !stack.frames.is_empty() {
                match self.source_index(device) {
                    Some(source) => self.pop_frame(id, source, &mut stack),
                    None => drop(stack.frames.pop()),
                }
                if device == Device::Cpu {
                    actions.extend(self.cpu_leave(thread, thread));
                }
            }
        }
        Ok(actions)
    }

    /// Add `notice` to the report of every enabled collector.
    pub fn notice_enabled(&mut self, notice: String) {
        for &id in &self.enabled {
            if let Some(collector) = live_slot_mut(&mut self.slots, id) {
                if !collector.notices.contains(&notice) {
                    collector.notices.push(notice.clone());
                }
            }
        }
    }

    /// In a forked child: nothing enabled, no frame open, no source read.
    fn reset_after_fork(&mut self) {
        for id in std::mem::take(&mut self.enabled) {
            if let Some(collector) = live_slot_mut(&mut self.slots, id) {
                collector.enabled = false;
                collector.threads.clear();
            }
        }
        self.watched.clear();
        self.sources.clear();
        self.cpu_depth.clear();
    }

    /// Hand the queued incidents to every enabled collector.
    fn fold_pending(&mut self) {
        let dropped = PENDING_DROPS.swap(0, Relaxed);
        let incidents = if PENDING_ANY.swap(false, Relaxed) {
            std::mem::take(&mut *PENDING.lock().unwrap_or_else(|p| p.into_inner()))
        } else {
            Vec::new()
        };
        for &id in &self.enabled {
            let Some(collector) = live_slot_mut(&mut self.slots, id) else {
                continue;
            };
            collector.dropped += dropped;
            for incident in &incidents {
                match incident {
                    Incident::Error(text) => {
                        collector.errors += 1;
                        collector.first_error.get_or_insert_with(|| text.clone());
                    }
                    Incident::Notice(text) => collector.notices.push(text.clone()),
                }
            }
        }
    }

    /// Lines a collector's source wants in its report: the CUDA direct reader's fallback to
    /// the binding, when it happened while this collector read the device; the CPU source's
    /// fallback or a displaced allocator hook. Gathered when a report is built and when the
    /// collector stops reading the source, each line once.
    pub fn gather_source_notices(&mut self, id: CollectorId) {
        let mut lines: Vec<String> = Vec::new();
        if let Ok(collector) = self.collector(id) {
            let notice = cuda_notice(collector.device);
            if notice.is_some() && notice != collector.cuda_notice_at_enable {
                lines.extend(notice);
            }
            if collector.enabled {
                if let Some(source) = self.source_index(collector.device) {
                    lines.extend(self.sources[source].notice());
                }
            }
        }
        if let Ok(collector) = self.collector_mut(id) {
            for line in lines {
                if !collector.notices.contains(&line) {
                    collector.notices.push(line);
                }
            }
        }
    }

    /// Retire a dropped collector and free its slot for the next one. Its lines close with
    /// a last sample when the source can be read; if not, with the values of the sample
    /// before: either way nothing of it stays behind (no watch entry, no open frame, no
    /// CPU tracking), since a later collector in its slot must not inherit any of it.
    /// Nothing for a collector dropped already.
    pub fn drop_collector(&mut self, py: Python<'_>, id: CollectorId, thread: u64) -> Vec<Action> {
        if self.get(id).is_none() {
            return Vec::new();
        }
        let actions = match self.disable(py, id, thread) {
            Ok(actions) => actions,
            Err(_) => self.stop_collecting(id, thread),
        };
        let entry = &mut self.slots[id.slot as usize];
        entry.collector = None;
        entry.generation += 1;
        self.free.push(id.slot);
        actions
    }

    /// Point a collector at another device. Its open lines keep what they saw so far; the
    /// new device is read from a fresh baseline.
    pub fn set_device(&mut self, py: Python<'_>, id: CollectorId, device: Device) -> PyResult<()> {
        let collector = self.collector(id)?;
        if collector.device == device {
            return Ok(());
        }
        let enabled = collector.enabled;
        if enabled {
            self.sample_all(py)?;
            self.use_source(py, device)?;
        }
        let previous = std::mem::replace(&mut self.collector_mut(id)?.device, device);
        self.drop_unused_sources();
        if enabled {
            if let Err(error) = self.sample_all(py) {
                // Stay on the device that worked rather than break every later event.
                self.collector_mut(id)?.device = previous;
                self.drop_unused_sources();
                return Err(error);
            }
        }
        Ok(())
    }

    /// How the source of a collector reads its statistics, while it is enabled.
    pub fn reader(&self, id: CollectorId) -> Option<&'static str> {
        let device = self.collector(id).ok()?.device;
        Some(self.sources[self.source_index(device)?].reader())
    }

    /// (slots in the collector table, collectors alive in them).
    pub fn table(&self) -> (usize, usize) {
        (self.slots.len(), self.live().count())
    }

    pub fn any_enabled(&self) -> bool {
        !self.enabled.is_empty()
    }

    /// Addresses of the code objects some enabled collector watches.
    pub fn watched_addresses(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self.watched.keys().copied().collect();
        out.sort_unstable();
        out
    }

    /// Code objects some enabled collector watches (the hooks turn events on for these).
    pub fn watched_codes(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        let mut out = Vec::new();
        for entries in self.watched.values() {
            if let Some(&(id, index)) = entries.first() {
                if let Some(collector) = self.get(id) {
                    out.push(collector.codes[index as usize].object.clone_ref(py));
                }
            }
        }
        out
    }

    /// Handle one interpreter event for the code object at `address` on `thread`; None
    /// when no enabled collector watches it.
    pub fn on_event(
        &mut self,
        py: Python<'_>,
        address: usize,
        event: Event,
        thread: u64,
    ) -> PyResult<Option<Vec<Action>>> {
        // Taken out and put back rather than cloned: no allocation per event.
        let Some(targets) = self.watched.get_mut(&address).map(std::mem::take) else {
            return Ok(None);
        };
        let handled = self.handle(py, &targets, event, thread);
        if let Some(slot) = self.watched.get_mut(&address) {
            *slot = targets;
        }
        handled.map(Some)
    }

    fn handle(
        &mut self,
        py: Python<'_>,
        targets: &[(CollectorId, u32)],
        event: Event,
        thread: u64,
    ) -> PyResult<Vec<Action>> {
        self.sample_all(py)?;
        let mut actions = Vec::new();
        for &(id, code) in targets {
            let Some(collector) = self.get(id) else {
                continue;
            };
            let Some(source) = self.source_index(collector.device) else {
                continue;
            };
            // Only the dispatch-mode fallback is started and stopped per thread.
            let cpu = self.sources[source].cpu_dispatch();
            let pushed = self.apply(id, source, code, event, thread);
            if cpu {
                match pushed {
                    Depth::Pushed => actions.extend(self.cpu_enter(thread)),
                    Depth::Popped(n) => {
                        for _ in 0..n {
                            actions.extend(self.cpu_leave(thread, thread));
                        }
                    }
                    Depth::Same => {}
                }
            }
        }
        Ok(actions)
    }

    fn apply(
        &mut self,
        id: CollectorId,
        source: usize,
        code: u32,
        event: Event,
        thread: u64,
    ) -> Depth {
        let src = &self.sources[source];
        let Some(collector) = live_slot_mut(&mut self.slots, id) else {
            return Depth::Same;
        };
        let stack_at = match collector.threads.iter().position(|s| s.thread == thread) {
            Some(i) => i,
            None => {
                collector.threads.push(ThreadStack {
                    thread,
                    frames: Vec::new(),
                });
                collector.threads.len() - 1
            }
        };
        let entry = &collector.codes[code as usize];
        let start_line = match event {
            Event::Start => Some(entry.first_line),
            Event::Resume { offset } => Some(entry.line_at(offset)),
            Event::EnterAt { line } => Some(line.max(entry.first_line)),
            Event::Line { .. } | Event::Leave => None,
        };
        match (event, start_line) {
            (_, Some(line)) => {
                let frame = Frame::new(code, line, &collector.cumulative);
                collector.threads[stack_at].frames.push(frame);
                Depth::Pushed
            }
            (Event::Line { line }, None) => {
                let stack = &mut collector.threads[stack_at];
                match stack.frames.last_mut() {
                    Some(frame) if frame.code == code => {
                        let rows = &mut collector.codes[code as usize].rows;
                        frame.close_line(
                            &src.layout,
                            &src.current,
                            &collector.cumulative,
                            rows,
                            Some(line),
                        );
                        Depth::Same
                    }
                    _ => {
                        // A frame that was running before the profiler was enabled.
                        let frame = Frame::new(code, line, &collector.cumulative);
                        stack.frames.push(frame);
                        Depth::Pushed
                    }
                }
            }
            _ => {
                // Leave: pop down to the innermost frame of this code (frames above it
                // missed their own leave event, e.g. they began before `enable()`).
                let stack = &collector.threads[stack_at];
                match stack.frames.iter().rposition(|f| f.code == code) {
                    Some(at) => {
                        let n = stack.frames.len() - at;
                        let mut stack = collector.threads.swap_remove(stack_at);
                        for _ in 0..n {
                            pop_frame_of(collector, src, &mut stack);
                        }
                        if !stack.frames.is_empty() {
                            collector.threads.push(stack);
                        }
                        Depth::Popped(n as u32)
                    }
                    None => Depth::Same,
                }
            }
        }
    }

    fn pop_frame(&mut self, id: CollectorId, source: usize, stack: &mut ThreadStack) {
        let src = &self.sources[source];
        if let Some(collector) = live_slot_mut(&mut self.slots, id) {
            pop_frame_of(collector, src, stack);
        }
    }

    fn cpu_enter(&mut self, thread: u64) -> Option<Action> {
        let depth = self.cpu_depth.entry(thread).or_insert(0);
        *depth += 1;
        (*depth == 1).then_some(Action::TrackCpu { thread })
    }

    /// One CPU frame left `frame_thread`. Only a thread can change its own dispatch modes:
    /// the calling thread stops tracking at once, another thread's tracking is retired.
    fn cpu_leave(&mut self, frame_thread: u64, current: u64) -> Option<Action> {
        let depth = self.cpu_depth.get_mut(&frame_thread)?;
        *depth = depth.saturating_sub(1);
        if *depth > 0 {
            return None;
        }
        self.cpu_depth.remove(&frame_thread);
        Some(if frame_thread == current {
            Action::UntrackCpuHere
        } else {
            Action::RetireCpu {
                thread: frame_thread,
            }
        })
    }

    fn source_index(&self, device: Device) -> Option<usize> {
        self.sources.iter().position(|s| s.device == device)
    }

    fn use_source(&mut self, py: Python<'_>, device: Device) -> PyResult<()> {
        if !self.sources.iter().any(|s| s.device == device) {
            self.sources.push(Source::new(py, device)?);
        }
        Ok(())
    }

    fn drop_unused_sources(&mut self) {
        let used: Vec<Device> = self
            .enabled
            .iter()
            .filter_map(|&id| self.get(id))
            .map(|c| c.device)
            .collect();
        // A source coming back into use starts from a fresh baseline: what happened while
        // nobody watched must not be charged to the next line.
        self.sources.retain(|s| used.contains(&s.device));
    }

    /// Sample every source in use and hand each sample to the enabled collectors reading it
    /// (a disabled one has no open line and sees no peak): their
    /// cumulative counters grow, and every open innermost line sees the peaks.
    fn sample_all(&mut self, py: Python<'_>) -> PyResult<()> {
        for source in &mut self.sources {
            source.sample(py)?;
        }
        for &id in &self.enabled {
            let Some(collector) = live_slot_mut(&mut self.slots, id) else {
                continue;
            };
            let Some(source) = self.sources.iter().find(|s| s.device == collector.device) else {
                continue;
            };
            fit_to_source(collector, source);
            for (total, growth) in collector.cumulative.iter_mut().zip(&source.growth) {
                *total += growth;
            }
            for &i in &source.layout.peaks {
                let peak = &mut collector.session_peak[i];
                *peak = (*peak).max(source.current[i]);
            }
            for stack in &mut collector.threads {
                if let Some(frame) = stack.frames.last_mut() {
                    frame.see(&source.layout, &source.current);
                }
            }
        }
        for source in &mut self.sources {
            source.reset_peaks(py)?;
        }
        Ok(())
    }
}

fn dropped_error() -> PyErr {
    pyo3::exceptions::PyValueError::new_err("this profiler was dropped")
}

fn live_slot(slots: &[Slot], id: CollectorId) -> Option<&Collector> {
    slots
        .get(id.slot as usize)
        .filter(|entry| entry.generation == id.generation)
        .and_then(|entry| entry.collector.as_ref())
}

/// A free function rather than a method: callers borrow `sources` beside it.
fn live_slot_mut(slots: &mut [Slot], id: CollectorId) -> Option<&mut Collector> {
    slots
        .get_mut(id.slot as usize)
        .filter(|entry| entry.generation == id.generation)
        .and_then(|entry| entry.collector.as_mut())
}

/// Size a collector's counters and names to its source's layout (a CUDA layout grows once
/// CUDA is initialised).
fn fit_to_source(collector: &mut Collector, source: &Source) {
    let n = source.layout.len();
    if collector.cumulative.len() < n {
        collector.cumulative.resize(n, 0);
        collector.session_peak.resize(n, 0);
    }
    if collector.names.len() != n {
        collector.names = source.layout.names.clone();
    }
}

enum Depth {
    Same,
    Pushed,
    Popped(u32),
}

/// Close the innermost frame's line, pop it, and charge its peaks to its caller's line.
fn pop_frame_of(collector: &mut Collector, src: &Source, stack: &mut ThreadStack) {
    let Some(mut frame) = stack.frames.pop() else {
        return;
    };
    let rows = &mut collector.codes[frame.code as usize].rows;
    frame.close_line(&src.layout, &src.current, &collector.cumulative, rows, None);
    if let Some(caller) = stack.frames.last_mut() {
        caller.absorb(&frame);
    }
}

/// The direct reader's fallback notice for a CUDA device (None for the CPU).
fn cuda_notice(device: Device) -> Option<String> {
    match device {
        Device::Cuda(index) => crate::sources::cuda::direct::notice(usize::try_from(index).ok()?),
        Device::Cpu => None,
    }
}
