//! The one engine every interpreter hook reports to: which code objects are profiled and by
//! which collectors, the memory sources they sample, and each collector's frames and rows.
//!
//! Several `LineProfiler`s may be enabled at once (the global one behind `@profile` and a
//! user's own). A peak reset by one would hide a peak from another, so every event samples
//! each source in use once and hands the sample to every collector reading that source.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use pyo3::prelude::*;

use super::frames::{Frame, Row, ThreadStack};
use super::source::{Device, Source};

/// A code object a collector profiles.
pub struct Code {
    pub object: Py<PyAny>,
    pub qualname: String,
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
    /// Each `Delta` statistic summed over every sample since the collector was created,
    /// whatever device it read then: lines take differences of it.
    cumulative: Vec<i64>,
    /// The highest value of every statistic seen while enabled.
    pub session_peak: Vec<i64>,
    /// The layout of the source last read (names for reports and column checks).
    pub names: Vec<String>,
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
    /// The first CPU-profiled frame started on this thread: start tracking storages here.
    TrackCpuOnThisThread,
    /// The last CPU-profiled frame on this thread left: stop tracking storages here.
    UntrackCpuOnThisThread,
}

#[derive(Default)]
pub struct Engine {
    collectors: Vec<Option<Collector>>,
    sources: Vec<Source>,
    /// code object address -> (collector, code index) for enabled collectors.
    watched: HashMap<usize, Vec<(usize, u32)>>,
    /// Profiled CPU frames per thread, over all CPU collectors.
    cpu_depth: HashMap<u64, u32>,
}

pub static ENGINE: Mutex<Option<Engine>> = Mutex::new(None);

/// Run `f` on the engine (created on first use). Never called re-entrantly: callers do not
/// run Python code while they hold it.
pub fn with_engine<T>(f: impl FnOnce(&mut Engine) -> T) -> T {
    let mut guard = ENGINE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    f(guard.get_or_insert_with(Engine::default))
}

/// Like `with_engine` for the interpreter hooks: if the engine is busy (which would mean
/// another thread released the GIL while holding it) the event is dropped, never waited for.
pub fn try_with_engine<T>(f: impl FnOnce(&mut Engine) -> T) -> Option<T> {
    let mut guard = match ENGINE.try_lock() {
        Ok(guard) => guard,
        Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return None,
    };
    Some(f(guard.get_or_insert_with(Engine::default)))
}

impl Engine {
    pub fn create(&mut self, device: Device) -> usize {
        let collector = Collector {
            device,
            enabled: false,
            codes: Vec::new(),
            threads: Vec::new(),
            cumulative: Vec::new(),
            session_peak: Vec::new(),
            names: Vec::new(),
        };
        self.collectors.push(Some(collector));
        self.collectors.len() - 1
    }

    pub fn collector(&self, id: usize) -> PyResult<&Collector> {
        self.collectors
            .get(id)
            .and_then(Option::as_ref)
            .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("this profiler was dropped"))
    }

    fn collector_mut(&mut self, id: usize) -> PyResult<&mut Collector> {
        self.collectors
            .get_mut(id)
            .and_then(Option::as_mut)
            .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("this profiler was dropped"))
    }

    /// Register a code object; returns its index and whether it is new.
    pub fn add_code(&mut self, id: usize, code: Code) -> PyResult<(u32, bool)> {
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
    pub fn enable(&mut self, py: Python<'_>, id: usize) -> PyResult<()> {
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
        let collector = self
            .collectors
            .get_mut(id)
            .and_then(Option::as_mut)
            .expect("checked above");
        collector.enabled = true;
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
    pub fn disable(&mut self, py: Python<'_>, id: usize, thread: u64) -> PyResult<Vec<Action>> {
        if !self.collector(id)?.enabled {
            return Ok(Vec::new());
        }
        let device = self.collector(id)?.device;
        // Checked before the last sample: if memory disagrees, that sample is torch's.
        if let Some(i) = self.source_index(device) {
            self.sources[i].validate(py)?;
        }
        self.sample_all(py)?;
        let source = self.source_index(device);
        let collector = self.collector_mut(id)?;
        collector.enabled = false;
        let stacks = std::mem::take(&mut collector.threads);
        let mut actions = Vec::new();
        for mut stack in stacks {
            while !stack.frames.is_empty() {
                if let Some(source) = source {
                    self.pop_frame(id, source, &mut stack);
                } else {
                    stack.frames.pop();
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
        Ok(actions)
    }

    /// Forget every function and every row (the profiler stays enabled or not).
    pub fn clear(&mut self, py: Python<'_>, id: usize, thread: u64) -> PyResult<Vec<Action>> {
        let was_enabled = self.collector(id)?.enabled;
        let actions = self.disable(py, id, thread)?;
        let collector = self.collector_mut(id)?;
        collector.codes.clear();
        if was_enabled {
            self.enable(py, id)?;
        }
        Ok(actions)
    }

    pub fn drop_collector(&mut self, py: Python<'_>, id: usize, thread: u64) -> Vec<Action> {
        let actions = self.disable(py, id, thread).unwrap_or_default();
        if let Some(slot) = self.collectors.get_mut(id) {
            *slot = None;
        }
        actions
    }

    /// Point a collector at another device. Its open lines keep what they saw so far; the
    /// new device is read from a fresh baseline.
    pub fn set_device(&mut self, py: Python<'_>, id: usize, device: Device) -> PyResult<()> {
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
    pub fn reader(&self, id: usize) -> Option<&'static str> {
        let device = self.collector(id).ok()?.device;
        Some(self.sources[self.source_index(device)?].reader())
    }

    pub fn any_enabled(&self) -> bool {
        self.collectors.iter().flatten().any(|c| c.enabled)
    }

    /// Code objects some enabled collector watches (the hooks turn events on for these).
    pub fn watched_codes(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        let mut out = Vec::new();
        for entries in self.watched.values() {
            if let Some(&(id, index)) = entries.first() {
                if let Some(Some(collector)) = self.collectors.get(id) {
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
        targets: &[(usize, u32)],
        event: Event,
        thread: u64,
    ) -> PyResult<Vec<Action>> {
        self.sample_all(py)?;
        let mut actions = Vec::new();
        for &(id, code) in targets {
            let Some(Some(collector)) = self.collectors.get(id) else {
                continue;
            };
            let cpu = collector.device == Device::Cpu;
            let Some(source) = self.source_index(collector.device) else {
                continue;
            };
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

    fn apply(&mut self, id: usize, source: usize, code: u32, event: Event, thread: u64) -> Depth {
        let src = &self.sources[source];
        let Some(Some(collector)) = self.collectors.get_mut(id) else {
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

    fn pop_frame(&mut self, id: usize, source: usize, stack: &mut ThreadStack) {
        let src = &self.sources[source];
        if let Some(Some(collector)) = self.collectors.get_mut(id) {
            pop_frame_of(collector, src, stack);
        }
    }

    fn cpu_enter(&mut self, thread: u64) -> Option<Action> {
        let depth = self.cpu_depth.entry(thread).or_insert(0);
        *depth += 1;
        (*depth == 1).then_some(Action::TrackCpuOnThisThread)
    }

    /// One CPU frame left `frame_thread`; only the current thread can change its own
    /// dispatch modes, so only there does the last leave become an action.
    fn cpu_leave(&mut self, frame_thread: u64, current: u64) -> Option<Action> {
        let depth = self.cpu_depth.get_mut(&frame_thread)?;
        *depth = depth.saturating_sub(1);
        if *depth > 0 {
            return None;
        }
        self.cpu_depth.remove(&frame_thread);
        (frame_thread == current).then_some(Action::UntrackCpuOnThisThread)
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
            .collectors
            .iter()
            .flatten()
            .filter(|c| c.enabled)
            .map(|c| c.device)
            .collect();
        // A source coming back into use starts from a fresh baseline: what happened while
        // nobody watched must not be charged to the next line.
        self.sources.retain(|s| used.contains(&s.device));
    }

    /// Sample every source in use and hand each sample to the collectors reading it: their
    /// cumulative counters grow, and every open innermost line sees the peaks.
    fn sample_all(&mut self, py: Python<'_>) -> PyResult<()> {
        for source in &mut self.sources {
            source.sample(py)?;
        }
        for collector in self.collectors.iter_mut().flatten() {
            let Some(source) = self.sources.iter().find(|s| s.device == collector.device) else {
                continue;
            };
            let n = source.layout.len();
            if collector.cumulative.len() < n {
                collector.cumulative.resize(n, 0);
                collector.session_peak.resize(n, 0);
            }
            if collector.names.len() != n {
                collector.names = source.layout.names.clone();
            }
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
