//! The plain records of an allocation history: events, frames, stacks and block layouts, as
//! read from a snapshot in torch's schema (CUDA) or from our CPU recorder (the same schema).
//! Strings, frames and stacks are interned: an event is a fixed-size record.

use std::collections::HashMap;

/// An index into `Trace::stacks`, or `NONE`.
pub type StackId = u32;
/// An index into `Trace::strings`, or `NONE`.
pub type StrId = u32;
pub const NONE: u32 = u32::MAX;

/// What one history entry records (torch's `TraceEntry` actions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    Other,
}

impl Action {
    pub fn parse(name: &str) -> Action {
        match name {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            _ => Action::Other,
        }
    }
}

/// One history entry. `size` is what the entry says: for CUDA allocations the *requested*
/// size (torch records `orig_size`), not the block the allocator handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub time_us: i64,
    pub stack: StackId,
    pub tag: StrId,
}

/// A Python frame: file, line, function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: StrId,
    pub line: u32,
    pub name: StrId,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out and not freed (counts in `allocated_bytes`).
    Allocated,
    /// Freed by the program, waiting for a stream event before the allocator may reuse it.
    PendingFree,
    Inactive,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested: u64,
    pub state: BlockState,
    pub stack: StackId,
}

/// A segment (one cudaMalloc; for CPU recordings, one allocation) and its blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub address: u64,
    pub total_size: u64,
    /// The small pool (2 MiB segments, blocks split down to 512 bytes).
    pub small: bool,
    pub expandable: bool,
    pub blocks: Vec<Block>,
}

/// Where the history came from (`"cuda"` or `"cpu"` in what crosses to Python).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// torch's CUDA caching allocator.
    Cuda,
    /// memlab_rs's CPU recorder (exact sizes, no cache).
    Cpu,
}

/// One device's history.
#[derive(Clone, Debug, Default)]
pub struct DeviceTrace {
    pub device: i32,
    pub events: Vec<Event>,
    /// The layout when the snapshot was taken.
    pub end: Vec<Segment>,
    /// The layout when recording began, when the recorder kept it.
    pub start: Option<Vec<Segment>>,
    /// Entries the recorder dropped (its ring buffer was full).
    pub dropped: u64,
}

/// The allocator's rounding, from the snapshot's `allocator_settings`.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `max_split_size` (None: unlimited).
    pub max_split_size: Option<u64>,
    pub expandable_segments: bool,
    /// Any `roundup_power2_divisions` set (we model the default 512-byte rounding only).
    pub power2_divisions: bool,
}

/// A whole history: interned strings, frames and stacks, and one trace per device.
#[derive(Clone, Debug)]
pub struct Trace {
    pub source: Source,
    pub strings: Vec<String>,
    pub frames: Vec<Frame>,
    /// Frame ids, innermost first.
    pub stacks: Vec<Vec<u32>>,
    pub devices: Vec<DeviceTrace>,
    pub settings: Settings,
    /// What the recorder or the loader knows to be incomplete.
    pub notices: Vec<String>,
    /// Names of what was alive when recording began, by address (parameters, gradients,
    /// optimizer state: `memlab_rs.start.names`, taken by the Tracer).
    pub start_names: IntMap<u64, StrId>,
    /// The working directory of the recording (`memlab_rs.cwd`), when the Tracer saved it.
    pub cwd: Option<String>,
    string_ids: HashMap<String, StrId>,
    stack_ids: HashMap<Vec<u32>, StackId>,
    frame_ids: HashMap<Frame, u32>,
}

impl Trace {
    pub fn new(source: Source) -> Trace {
        Trace {
            source,
            strings: Vec::new(),
            frames: Vec::new(),
            stacks: Vec::new(),
            devices: Vec::new(),
            settings: Settings::default(),
            notices: Vec::new(),
            start_names: IntMap::default(),
            cwd: None,
            string_ids: HashMap::new(),
            stack_ids: HashMap::new(),
            frame_ids: HashMap::new(),
        }
    }

    pub fn string(&mut self, text: &str) -> StrId {
        if let Some(&id) = self.string_ids.get(text) {
            return id;
        }
        let id = self.strings.len() as StrId;
        self.strings.push(text.to_owned());
        self.string_ids.insert(text.to_owned(), id);
        id
    }

    pub fn frame(&mut self, filename: &str, line: u32, name: &str) -> u32 {
        let frame = Frame {
            filename: self.string(filename),
            line,
            name: self.string(name),
        };
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(frame);
        self.frame_ids.insert(frame, id);
        id
    }

    /// The id of a stack (frame ids, innermost first); the empty stack is `NONE`.
    pub fn stack(&mut self, frames: &[u32]) -> StackId {
        if frames.is_empty() {
            return NONE;
        }
        if let Some(&id) = self.stack_ids.get(frames) {
            return id;
        }
        let id = self.stacks.len() as StackId;
        self.stacks.push(frames.to_vec());
        self.stack_ids.insert(frames.to_vec(), id);
        id
    }

    pub fn text(&self, id: StrId) -> &str {
        if id == NONE {
            ""
        } else {
            &self.strings[id as usize]
        }
    }

    pub fn frames_of(&self, stack: StackId) -> &[u32] {
        if stack == NONE {
            &[]
        } else {
            &self.stacks[stack as usize]
        }
    }
}

/// A hasher for integer keys (addresses, ids, object pointers): one multiply, no SipHash.
/// The keys come from the allocator and the interpreter, not from an adversary.
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl std::hash::Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(5) ^ byte as u64).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }
    fn write_u32(&mut self, value: u32) {
        self.write_u64(value as u64);
    }
    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

/// A map keyed by integers, hashed with `IntHasher`.
pub type IntMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IntHasher>>;
