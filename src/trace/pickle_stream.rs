//! A snapshot pickle into a `Trace` without building the Python objects: `pickle.load` of a
//! 1 GB snapshot makes 4-5 GB of dicts, lists and ints. This is a small pickle machine for
//! what `torch.cuda.memory._dump_snapshot` writes (a dict of lists, dicts, str, int, float,
//! bool, None and tuples, protocols 2-5), whose values are compact: strings are interned ids,
//! and a container is turned into its record as soon as its parent takes it:
//! - a dict with an `"action"` key appended to a list becomes an `Event` in that list's
//!   events (the device's history), leaving nothing behind;
//! - a dict with a `"filename"` key becomes a frame id (and its memo slot that id, so every
//!   later reference to the same frame dict is one id);
//! - the `"frames"` list of a dict becomes a stack id when that dict is taken by its parent.
//!
//! What is left (the segments, the settings, our `memlab_rs` key) is small and converted at the
//! end by `parts`, with the same rules as the dict reader. An opcode outside that set is
//! reported as `NotImplementedError` naming it, and `memlab_rs.trace.load` then falls back to
//! `pickle.load`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, ErrorKind, Read};

use super::error::{bad, ReadError};
use super::model::{Action, Event, Source, Trace, NONE};
use super::parts::{Doc, Parts};
use super::pickle_guard::{self, Refusal};

type Result<T> = std::result::Result<T, ReadError>;

/// One value of the pickle machine: 16 bytes. Containers live in `Stream::slab`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// A non-negative int above `i64::MAX` that fits in 64 bits.
    UInt(u64),
    /// An int beyond 64 bits (the dict reader handles those).
    Big,
    Float(f64),
    /// An interned string (`Stream::names`).
    Str(u32),
    /// A list, tuple or dict in `Stream::slab`.
    Obj(u32),
    /// A frame dict, as its id in the trace.
    Frame(u32),
    /// A frames list, as its stack id in the trace.
    Stack(u32),
    /// A memo slot never written.
    Missing,
    /// A memo slot of an entry already turned into an event.
    Gone,
}

struct ListObj {
    items: Vec<Value>,
    /// The trace entries appended to this list, in order.
    events: Vec<Event>,
    tuple: bool,
    memo: u32,
    /// Handles of this container in existence (on the stack, in containers; the memo's is
    /// not counted, being rewritten when the container becomes a record).
    copies: u32,
}

struct DictObj {
    items: Vec<(Value, Value)>,
    memo: u32,
    copies: u32,
}

enum Slot {
    Free,
    /// A container turned into a record while handles of it were still around (how many).
    Done(Value, u32),
    List(ListObj),
    Dict(DictObj),
}

/// What a container becomes when its parent takes it.
enum Settled {
    Value(Value),
    Event(Event),
}

// The keys read while streaming, interned first so they are known ids.
const K_ACTION: u32 = 0;
const K_ADDR: u32 = 1;
const K_SIZE: u32 = 2;
const K_STREAM: u32 = 3;
const K_TIME_US: u32 = 4;
const K_FRAMES: u32 = 5;
const K_USER_METADATA: u32 = 6;
const K_FILENAME: u32 = 7;
const K_LINE: u32 = 8;
const K_NAME: u32 = 9;
const KEYS: [&str; 10] = [
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "user_metadata",
    "filename",
    "line",
    "name",
];

/// The id bits of a memo slot.
const ID_BITS: u32 = 29;
const ID_MASK: u32 = (1 << ID_BITS) - 1;

/// Not yet computed, in the per-string caches.
const UNSET: u32 = u32::MAX - 1;

fn unsupported(what: String) -> ReadError {
    ReadError::Unsupported(format!(
        "the streaming snapshot reader does not support {what}"
    ))
}

struct Stream {
    trace: Trace,
    names: Vec<Box<str>>,
    name_ids: HashMap<Box<str>, u32>,
    /// Per name id: its action (as `Action as u32 + 1`, 0 unset) and its tag's string id.
    actions: Vec<Option<Action>>,
    tags: Vec<u32>,
    /// The pickle's memo, 4 bytes a slot (`Stream::pack`): it holds every memoised object
    /// of the file, two for most entries.
    memo: Vec<u32>,
    /// Memoised values that are not ids (pickle memoises no ints or floats, but may).
    memo_other: Vec<Value>,
    slab: Vec<Slot>,
    free: Vec<u32>,
    stack: Vec<Value>,
    marks: Vec<usize>,
    scratch: Vec<Settled>,
    frame_ids: Vec<u32>,
}

impl Stream {
    fn new() -> Stream {
        let mut stream = Stream {
            trace: Trace::new(Source::Cuda),
            names: Vec::new(),
            name_ids: HashMap::new(),
            actions: Vec::new(),
            tags: Vec::new(),
            memo: Vec::new(),
            memo_other: Vec::new(),
            slab: Vec::new(),
            free: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            scratch: Vec::new(),
            frame_ids: Vec::new(),
        };
        for key in KEYS {
            stream.name(key);
        }
        stream
    }

    fn name(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.name_ids.get(text) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(text.into());
        self.name_ids.insert(text.into(), id);
        self.actions.push(None);
        self.tags.push(UNSET);
        id
    }

    fn alloc(&mut self, slot: Slot) -> Value {
        match self.free.pop() {
            Some(h) => {
                self.slab[h as usize] = slot;
                Value::Obj(h)
            }
            None => {
                self.slab.push(slot);
                Value::Obj(self.slab.len() as u32 - 1)
            }
        }
    }

    fn new_list(&mut self, items: Vec<Value>, tuple: bool) -> Value {
        self.alloc(Slot::List(ListObj {
            items,
            events: Vec::new(),
            tuple,
            memo: NONE,
            copies: 1,
        }))
    }

    /// A value as it stands now: a handle of a container since turned into a record is
    /// that record.
    fn resolve(&self, v: Value) -> Value {
        if let Value::Obj(h) = v {
            if let Slot::Done(record, _) = self.slab[h as usize] {
                return record;
            }
        }
        v
    }

    /// One handle of container `h` goes away; a record's slot is freed with its last handle.
    fn drop_handle(&mut self, h: u32) {
        match &mut self.slab[h as usize] {
            Slot::Done(_, copies) => {
                *copies = copies.saturating_sub(1);
                if *copies == 0 {
                    self.slab[h as usize] = Slot::Free;
                    self.free.push(h);
                }
            }
            Slot::List(l) => l.copies = l.copies.saturating_sub(1),
            Slot::Dict(d) => d.copies = d.copies.saturating_sub(1),
            Slot::Free => {}
        }
    }

    /// Container `h` has become `record`: its memo slot says so, and its handles read as
    /// the record until the last one goes (`drop_handle`).
    fn retire(&mut self, h: u32, record: Value) -> Result<()> {
        let (memo, copies) = match &self.slab[h as usize] {
            Slot::List(l) => (l.memo, l.copies),
            Slot::Dict(d) => (d.memo, d.copies),
            _ => return Ok(()),
        };
        if memo != NONE {
            self.memo[memo as usize] = self.pack(record)?;
        }
        self.slab[h as usize] = Slot::Done(record, copies);
        Ok(())
    }

    /// A memo slot: a 3-bit kind and a 29-bit id (the id of a string, container, frame or
    /// stack, or an index into `memo_other`).
    fn pack(&mut self, v: Value) -> Result<u32> {
        let (kind, id) = match v {
            Value::Missing => return Ok(0),
            Value::Gone => return Ok(1 << ID_BITS),
            Value::Str(id) => (2, id),
            Value::Obj(h) => (3, h),
            Value::Frame(id) => (4, id),
            Value::Stack(NONE) => (5, ID_MASK),
            Value::Stack(id) => (5, id),
            other => {
                self.memo_other.push(other);
                (6, self.memo_other.len() as u32 - 1)
            }
        };
        if id > ID_MASK || (kind == 5 && id == ID_MASK && v != Value::Stack(NONE)) {
            return Err(unsupported(format!("more than {ID_MASK} distinct objects")));
        }
        Ok(kind << ID_BITS | id)
    }

    fn unpack(&self, slot: u32) -> Value {
        let id = slot & ID_MASK;
        match slot >> ID_BITS {
            0 => Value::Missing,
            1 => Value::Gone,
            2 => Value::Str(id),
            3 => Value::Obj(id),
            4 => Value::Frame(id),
            5 if id == ID_MASK => Value::Stack(NONE),
            5 => Value::Stack(id),
            _ => self.memo_other[id as usize],
        }
    }

    fn dict(&self, v: Value) -> Option<&DictObj> {
        match v {
            Value::Obj(h) => match &self.slab[h as usize] {
                Slot::Dict(d) => Some(d),
                _ => None,
            },
            _ => None,
        }
    }

    fn find(items: &[(Value, Value)], key: u32) -> Option<Value> {
        items
            .iter()
            .rev()
            .find(|(k, _)| *k == Value::Str(key))
            .map(|(_, v)| *v)
    }

    fn int_of(&self, v: Value) -> Result<Option<i128>> {
        match v {
            Value::None => Ok(None),
            Value::Bool(b) => Ok(Some(b as i128)),
            Value::Int(i) => Ok(Some(i as i128)),
            Value::UInt(u) => Ok(Some(u as i128)),
            _ => Err(unsupported(format!("{v:?} where an int belongs"))),
        }
    }

    fn text_of(&self, v: Value) -> Result<String> {
        match v {
            Value::Str(id) => Ok(self.names[id as usize].to_string()),
            Value::Int(i) => Ok(i.to_string()),
            Value::UInt(u) => Ok(u.to_string()),
            Value::Bool(true) => Ok("True".into()),
            Value::Bool(false) => Ok("False".into()),
            Value::None => Ok("None".into()),
            _ => Err(unsupported(format!("{v:?} where a string belongs"))),
        }
    }

    fn action(&mut self, v: Value) -> Result<Action> {
        if let Value::Str(id) = v {
            if let Some(action) = self.actions[id as usize] {
                return Ok(action);
            }
            let action = Action::parse(&self.names[id as usize]);
            self.actions[id as usize] = Some(action);
            return Ok(action);
        }
        Ok(Action::parse(&self.text_of(v)?))
    }

    fn tag(&mut self, v: Option<Value>) -> Result<u32> {
        let v = match v {
            None | Some(Value::None) => return Ok(NONE),
            Some(v) => v,
        };
        if let Value::Str(id) = v {
            if self.tags[id as usize] == UNSET {
                let text = &self.names[id as usize];
                self.tags[id as usize] = if text.is_empty() {
                    NONE
                } else {
                    let text = text.to_string();
                    self.trace.string(&text)
                };
            }
            return Ok(self.tags[id as usize]);
        }
        let text = self.text_of(v)?;
        Ok(if text.is_empty() {
            NONE
        } else {
            self.trace.string(&text)
        })
    }

    /// The frame id of frame dict `h` (missing fields as the dict reader reads them).
    fn frame(&mut self, h: u32) -> Result<u32> {
        let Slot::Dict(d) = &self.slab[h as usize] else {
            return Err(bad("a frame is not a dict"));
        };
        let filename = Self::find(&d.items, K_FILENAME);
        let name = Self::find(&d.items, K_NAME);
        let line = Self::find(&d.items, K_LINE);
        let filename = filename.map(|v| self.text_of(v)).transpose()?;
        let name = name.map(|v| self.text_of(v)).transpose()?;
        let line = match line {
            None => 0,
            Some(v) => match v {
                Value::Int(i) => i,
                Value::Bool(b) => b as i64,
                _ => return Err(unsupported(format!("{v:?} as a frame's line"))),
            },
        };
        let id = self.trace.frame(
            filename.as_deref().unwrap_or(""),
            line.clamp(0, u32::MAX as i64) as u32,
            name.as_deref().unwrap_or(""),
        );
        self.retire(h, Value::Frame(id))?;
        Ok(id)
    }

    /// The stack id of a `frames` value, turning a list of frames into its stack.
    fn stack_of(&mut self, frames: Option<Value>) -> Result<u32> {
        let Some(v) = frames else { return Ok(NONE) };
        let h = match self.resolve(v) {
            Value::Stack(id) => return Ok(id),
            Value::Obj(h) => h,
            _ => return Ok(NONE),
        };
        let Slot::List(list) = &mut self.slab[h as usize] else {
            return Ok(NONE);
        };
        if list.tuple {
            return Ok(NONE);
        }
        if !list.events.is_empty() {
            return Err(unsupported("trace entries inside a frames list".into()));
        }
        let items = std::mem::take(&mut list.items);
        let mut ids = std::mem::take(&mut self.frame_ids);
        ids.clear();
        for item in &items {
            let id = match self.resolve(*item) {
                Value::Frame(id) => id,
                Value::Obj(f) if matches!(self.slab[f as usize], Slot::Dict(_)) => self.frame(f)?,
                _ => return Err(bad("a frame is not a dict")),
            };
            if let Value::Obj(f) = item {
                self.drop_handle(*f);
            }
            ids.push(id);
        }
        let id = self.trace.stack(&ids);
        self.frame_ids = ids;
        self.retire(h, Value::Stack(id))?;
        Ok(id)
    }

    /// Trace entry `h` as an event (its frames list becomes a stack on the way).
    fn event(&mut self, h: u32) -> Result<Event> {
        let Slot::Dict(d) = &mut self.slab[h as usize] else {
            return Err(bad("a trace entry is not a dict"));
        };
        let items = std::mem::take(&mut d.items);
        let get = |key| Self::find(&items, key);
        let action = self.action(get(K_ACTION).unwrap_or(Value::None))?;
        let tag = self.tag(get(K_USER_METADATA))?;
        let u64_field = |s: &Self, key| -> Result<u64> {
            Ok(get(key)
                .map(|v| s.int_of(v))
                .transpose()?
                .flatten()
                .unwrap_or(0)
                .clamp(0, u64::MAX as i128) as u64)
        };
        let addr = u64_field(self, K_ADDR)?;
        let size = u64_field(self, K_SIZE)?;
        let stream = u64_field(self, K_STREAM)?;
        let time_us = get(K_TIME_US)
            .map(|v| self.int_of(v))
            .transpose()?
            .flatten()
            .unwrap_or(0) as i64;
        let frames = get(K_FRAMES);
        let stack = self.stack_of(frames)?;
        if let Some(Value::Obj(f)) = frames {
            // This entry's handle of the frames list goes with it.
            self.drop_handle(f);
        }
        self.retire(h, Value::Gone)?;
        Ok(Event {
            action,
            addr,
            size,
            stream,
            time_us,
            stack,
            tag,
        })
    }

    /// `v` is taken by a dict or a tuple (or is the whole pickle).
    fn settle_value(&mut self, v: Value) -> Result<Value> {
        match self.settle(v, false)? {
            Settled::Value(v) => Ok(v),
            Settled::Event(_) => Err(bad("a trace entry outside a list")),
        }
    }

    /// `v` is taken by its parent (into a list when `in_list`): records are made now.
    fn settle(&mut self, v: Value, in_list: bool) -> Result<Settled> {
        let Value::Obj(h) = v else {
            return Ok(Settled::Value(v));
        };
        let d = match &self.slab[h as usize] {
            Slot::Done(record, _) => {
                let record = *record;
                self.drop_handle(h);
                return Ok(Settled::Value(record));
            }
            Slot::Dict(d) => d,
            _ => return Ok(Settled::Value(v)),
        };
        if Self::find(&d.items, K_ACTION).is_some() {
            if !in_list {
                return Ok(Settled::Value(v));
            }
            let event = self.event(h)?;
            self.drop_handle(h);
            return Ok(Settled::Event(event));
        }
        if Self::find(&d.items, K_FILENAME).is_some() {
            let id = self.frame(h)?;
            self.drop_handle(h);
            return Ok(Settled::Value(Value::Frame(id)));
        }
        if let Some(frames @ Value::Obj(f)) = Self::find(&d.items, K_FRAMES) {
            let stack = self.stack_of(Some(frames))?;
            if let Slot::Dict(d) = &mut self.slab[h as usize] {
                if let Some(at) = d
                    .items
                    .iter()
                    .rposition(|(k, _)| *k == Value::Str(K_FRAMES))
                {
                    d.items[at].1 = Value::Stack(stack);
                }
            }
            // The dict's handle of the list is replaced by the stack.
            self.drop_handle(f);
        }
        Ok(Settled::Value(v))
    }
}

/// Reads the file and runs the machine.
struct Machine {
    input: BufReader<File>,
    offset: u64,
    buf: Vec<u8>,
    path: String,
    /// The file's length: no memo index reaches it (`pickle_guard` checked that already;
    /// this reader keeps its own bound all the same).
    len: u64,
}

impl Machine {
    fn fail(&self, what: &str) -> ReadError {
        ReadError::Invalid(format!(
            "{:?} is not a snapshot pickle ({what}); write one with \
             torch.cuda.memory._dump_snapshot(path)",
            self.path
        ))
    }

    fn eof(&self, got: u64) -> ReadError {
        let at = self.offset + got;
        if at == 0 {
            self.fail("the file is empty")
        } else {
            self.fail(&format!(
                "it ends at byte {at} in the middle of the pickle: truncated?"
            ))
        }
    }

    fn read(&mut self, n: usize) -> Result<&[u8]> {
        self.buf.clear();
        if n <= 1 << 16 {
            self.buf.resize(n, 0);
            match self.input.read_exact(&mut self.buf) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Err(self.eof(0)),
                Err(e) => return Err(self.fail(&format!("reading it failed: {e}"))),
            }
        } else {
            // A long string: grown as it arrives, so a corrupt length cannot ask for memory
            // the file does not hold.
            let got = (&mut self.input)
                .take(n as u64)
                .read_to_end(&mut self.buf)
                .map_err(|e| self.fail(&format!("reading it failed: {e}")))?;
            if got < n {
                return Err(self.eof(got as u64));
            }
        }
        self.offset += n as u64;
        Ok(&self.buf)
    }

    fn byte(&mut self) -> Result<u8> {
        let mut one = [0u8; 1];
        match self.input.read_exact(&mut one) {
            Ok(()) => {
                self.offset += 1;
                Ok(one[0])
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(self.eof(0)),
            Err(e) => Err(self.fail(&format!("reading it failed: {e}"))),
        }
    }

    fn le<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        match self.input.read_exact(&mut out) {
            Ok(()) => {
                self.offset += N as u64;
                Ok(out)
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(self.eof(0)),
            Err(e) => Err(self.fail(&format!("reading it failed: {e}"))),
        }
    }

    fn len(&mut self, n: u64) -> Result<usize> {
        usize::try_from(n).map_err(|_| self.fail("a length beyond this machine's memory"))
    }
}

/// Read the snapshot pickle at `path` into a `Trace`. The file passes `pickle_guard` first:
/// nothing in it constructs objects, and the work below is linear in its size.
pub fn from_pickle(path: &str) -> Result<Trace> {
    let checked = pickle_guard::check_file(path).map_err(|refusal| match refusal {
        Refusal::Missing => ReadError::Missing(format!("no snapshot file at {path:?}")),
        refusal => ReadError::Invalid(refusal.message(path)),
    })?;
    if checked.protocol < 2 {
        // Protocols 0 and 1 (text opcodes): checked, and read by the plain-data unpickler.
        return Err(unsupported(
            "pickles without a PROTO opcode (protocols 0 and 1)".into(),
        ));
    }
    // The guard has just read the file: failing now is a race with whoever changed it.
    let io = |e: std::io::Error| match e.kind() {
        ErrorKind::NotFound => ReadError::Missing(format!("no snapshot file at {path:?}")),
        _ => ReadError::Invalid(format!("{path:?} could not be read: {e}")),
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut m = Machine {
        input: BufReader::with_capacity(1 << 20, file),
        offset: 0,
        buf: Vec::new(),
        path: path.to_owned(),
        len,
    };
    let mut s = Stream::new();
    let first = m.byte()?;
    if first != 0x80 {
        // Protocols 0 and 1 (or not a pickle at all): pickle.load says which.
        return Err(unsupported(
            "pickles without a PROTO opcode (protocols 0 and 1)".into(),
        ));
    }
    let proto = m.byte()?;
    if !(2..=5).contains(&proto) {
        return Err(unsupported(format!("pickle protocol {proto}")));
    }
    let root = run(&mut m, &mut s)?;
    finish(s, root)
}

fn run(m: &mut Machine, s: &mut Stream) -> Result<Value> {
    let underflow = |m: &Machine| m.fail(&format!("its stack runs empty at byte {}", m.offset));
    loop {
        let at = m.offset;
        let op = m.byte()?;
        match op {
            0x80 => {
                m.byte()?;
            }
            0x95 => {
                m.le::<8>()?;
            }
            b'.' => {
                let root = s.stack.pop().ok_or_else(|| underflow(m))?;
                return s.settle_value(root);
            }
            b'(' => s.marks.push(s.stack.len()),
            b'}' => {
                let v = s.alloc(Slot::Dict(DictObj {
                    items: Vec::new(),
                    memo: NONE,
                    copies: 1,
                }));
                s.stack.push(v);
            }
            b']' => {
                let v = s.new_list(Vec::new(), false);
                s.stack.push(v);
            }
            b')' => {
                let v = s.new_list(Vec::new(), true);
                s.stack.push(v);
            }
            b't' | 0x85..=0x87 => {
                let from = if op == b't' {
                    s.marks
                        .pop()
                        .ok_or_else(|| m.fail("TUPLE without a MARK"))?
                } else {
                    let n = (op - 0x84) as usize;
                    s.stack.len().checked_sub(n).ok_or_else(|| underflow(m))?
                };
                if from > s.stack.len() {
                    return Err(underflow(m));
                }
                let raw = s.stack.split_off(from);
                let mut items = Vec::with_capacity(raw.len());
                for v in raw {
                    items.push(s.settle_value(v)?);
                }
                let v = s.new_list(items, true);
                s.stack.push(v);
            }
            b's' | b'u' => {
                let from = if op == b'u' {
                    s.marks
                        .pop()
                        .ok_or_else(|| m.fail("SETITEMS without a MARK"))?
                } else {
                    s.stack.len().checked_sub(2).ok_or_else(|| underflow(m))?
                };
                if from == 0 || from > s.stack.len() || (s.stack.len() - from) % 2 != 0 {
                    return Err(underflow(m));
                }
                let raw = s.stack.split_off(from);
                let target = s.stack[from - 1];
                if s.dict(target).is_none() {
                    return Err(unsupported(format!(
                        "SETITEM(S) on {target:?} at byte {at}"
                    )));
                }
                let mut pairs = Vec::with_capacity(raw.len() / 2);
                for pair in raw.chunks_exact(2) {
                    pairs.push((s.settle_value(pair[0])?, s.settle_value(pair[1])?));
                }
                if let Value::Obj(h) = target {
                    if let Slot::Dict(d) = &mut s.slab[h as usize] {
                        d.items.extend(pairs);
                    }
                }
            }
            b'a' | b'e' => {
                let from = if op == b'e' {
                    s.marks
                        .pop()
                        .ok_or_else(|| m.fail("APPENDS without a MARK"))?
                } else {
                    s.stack.len().checked_sub(1).ok_or_else(|| underflow(m))?
                };
                if from == 0 || from > s.stack.len() {
                    return Err(underflow(m));
                }
                let target = s.stack[from - 1];
                let is_list = matches!(target, Value::Obj(h)
                    if matches!(&s.slab[h as usize], Slot::List(l) if !l.tuple));
                if !is_list {
                    return Err(unsupported(format!("APPEND(S) on {target:?} at byte {at}")));
                }
                let raw = s.stack.split_off(from);
                let mut settled = std::mem::take(&mut s.scratch);
                settled.clear();
                for v in raw {
                    settled.push(s.settle(v, true)?);
                }
                if let Value::Obj(h) = target {
                    if let Slot::List(l) = &mut s.slab[h as usize] {
                        for item in settled.drain(..) {
                            match item {
                                Settled::Value(v) => l.items.push(v),
                                Settled::Event(e) => l.events.push(e),
                            }
                        }
                    }
                }
                s.scratch = settled;
            }
            b'X' | 0x8c | 0x8d => {
                let n = match op {
                    b'X' => u32::from_le_bytes(m.le::<4>()?) as u64,
                    0x8c => m.byte()? as u64,
                    _ => u64::from_le_bytes(m.le::<8>()?),
                };
                let n = m.len(n)?;
                let bytes = m.read(n)?;
                let id = match std::str::from_utf8(bytes) {
                    Ok(text) => s.name(text),
                    Err(_) => {
                        let text = String::from_utf8_lossy(bytes).into_owned();
                        s.name(&text)
                    }
                };
                s.stack.push(Value::Str(id));
            }
            b'J' => {
                let v = i32::from_le_bytes(m.le::<4>()?);
                s.stack.push(Value::Int(v as i64));
            }
            b'K' => {
                let v = m.byte()?;
                s.stack.push(Value::Int(v as i64));
            }
            b'M' => {
                let v = u16::from_le_bytes(m.le::<2>()?);
                s.stack.push(Value::Int(v as i64));
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a {
                    m.byte()? as u64
                } else {
                    u32::from_le_bytes(m.le::<4>()?) as u64
                };
                let n = m.len(n)?;
                let bytes = m.read(n)?;
                s.stack.push(long(bytes));
            }
            b'G' => {
                let v = f64::from_be_bytes(m.le::<8>()?);
                s.stack.push(Value::Float(v));
            }
            0x88 => s.stack.push(Value::Bool(true)),
            0x89 => s.stack.push(Value::Bool(false)),
            b'N' => s.stack.push(Value::None),
            0x94 | b'q' | b'r' => {
                let index = match op {
                    0x94 => s.memo.len(),
                    b'q' => m.byte()? as usize,
                    _ => u32::from_le_bytes(m.le::<4>()?) as usize,
                };
                let top = *s.stack.last().ok_or_else(|| underflow(m))?;
                if index >= s.memo.len() {
                    if index as u64 >= m.len {
                        return Err(m.fail(&format!("memo index {index} at byte {at}")));
                    }
                    s.memo.try_reserve(index + 1 - s.memo.len()).map_err(|_| {
                        ReadError::NoMemory("no memory for the pickle's memo".into())
                    })?;
                    s.memo.resize(index + 1, 0);
                }
                if let Value::Obj(h) = top {
                    let memo = match &mut s.slab[h as usize] {
                        Slot::List(l) => &mut l.memo,
                        Slot::Dict(d) => &mut d.memo,
                        _ => return Err(m.fail(&format!("a stale object at byte {at}"))),
                    };
                    if *memo != NONE && *memo != index as u32 {
                        return Err(unsupported("an object memoised twice".into()));
                    }
                    *memo = index as u32;
                }
                s.memo[index] = s.pack(top)?;
            }
            b'h' | b'j' => {
                let index = if op == b'h' {
                    m.byte()? as usize
                } else {
                    u32::from_le_bytes(m.le::<4>()?) as usize
                };
                let v = match s.memo.get(index).map(|&slot| s.unpack(slot)) {
                    None | Some(Value::Missing) => {
                        return Err(m.fail(&format!("memo entry {index} is missing at byte {at}")))
                    }
                    Some(Value::Gone) => {
                        return Err(unsupported(
                            "a trace entry referenced a second time".to_string(),
                        ))
                    }
                    Some(v) => v,
                };
                if let Value::Obj(h) = v {
                    match &mut s.slab[h as usize] {
                        Slot::List(l) => l.copies += 1,
                        Slot::Dict(d) => d.copies += 1,
                        _ => return Err(m.fail(&format!("memo entry {index} is stale"))),
                    }
                }
                s.stack.push(v);
            }
            _ => {
                return Err(unsupported(format!(
                    "pickle opcode {} ({op:#04x}) at byte {at}",
                    pickle_guard::opcode_name(op)
                )))
            }
        }
    }
}

/// A LONG1/LONG4 payload: little-endian two's complement.
fn long(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Int(0);
    }
    if bytes.len() > 16 {
        return Value::Big;
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
    buf[..bytes.len()].copy_from_slice(bytes);
    let v = i128::from_le_bytes(buf);
    if let Ok(i) = i64::try_from(v) {
        Value::Int(i)
    } else if let Ok(u) = u64::try_from(v) {
        Value::UInt(u)
    } else {
        Value::Big
    }
}

impl Doc for Stream {
    type Node = Value;
    type Error = ReadError;

    fn trace(&mut self) -> &mut Trace {
        &mut self.trace
    }

    fn is_none(&self, node: &Value) -> bool {
        *node == Value::None
    }

    fn is_dict(&self, node: &Value) -> bool {
        self.dict(*node).is_some()
    }

    fn get(&mut self, node: &Value, key: &'static str) -> Result<Option<Value>> {
        let Some(&id) = self.name_ids.get(key) else {
            return Ok(None);
        };
        let found = self.dict(*node).and_then(|d| Self::find(&d.items, id));
        Ok(found.map(|v| self.resolve(v)))
    }

    fn int(&mut self, node: &Value) -> Result<Option<i128>> {
        self.int_of(*node)
    }

    fn text(&mut self, node: &Value) -> Result<String> {
        self.text_of(*node)
    }

    fn truthy(&mut self, node: &Value) -> Result<bool> {
        Ok(match *node {
            Value::None => false,
            Value::Bool(b) => b,
            Value::Int(i) => i != 0,
            Value::UInt(_) | Value::Big | Value::Frame(_) => true,
            Value::Float(f) => f != 0.0,
            Value::Str(id) => !self.names[id as usize].is_empty(),
            Value::Stack(id) => id != NONE,
            Value::Obj(h) => match &self.slab[h as usize] {
                Slot::List(l) => !l.items.is_empty() || !l.events.is_empty(),
                Slot::Dict(d) => !d.items.is_empty(),
                _ => true,
            },
            Value::Missing | Value::Gone => {
                return Err(unsupported("a consumed value read again".into()))
            }
        })
    }

    fn items(&mut self, node: &Value) -> Result<Option<Vec<Value>>> {
        let Value::Obj(h) = *node else {
            return Ok(None);
        };
        let items = match &self.slab[h as usize] {
            Slot::List(l) if l.events.is_empty() => l.items.clone(),
            Slot::List(_) => {
                return Err(unsupported("trace entries outside 'device_traces'".into()))
            }
            Slot::Dict(d) => d.items.iter().map(|(k, _)| *k).collect(),
            _ => return Ok(None),
        };
        Ok(Some(items.into_iter().map(|v| self.resolve(v)).collect()))
    }

    fn list_items(&mut self, node: &Value) -> Result<Option<Vec<Value>>> {
        match *node {
            Value::Obj(h) if matches!(&self.slab[h as usize], Slot::List(l) if !l.tuple) => {
                self.items(node)
            }
            _ => Ok(None),
        }
    }

    fn dict_values(&mut self, node: &Value) -> Result<Option<Vec<Value>>> {
        let values = self
            .dict(*node)
            .map(|d| d.items.iter().map(|(_, v)| *v).collect::<Vec<_>>());
        Ok(values.map(|vs| vs.into_iter().map(|v| self.resolve(v)).collect()))
    }

    fn stack(&mut self, frames: Option<Value>) -> Result<u32> {
        match frames {
            Some(Value::None) | None => Ok(NONE),
            Some(v) => self.stack_of(Some(v)),
        }
    }
}

/// The trace from the machine's result: the parts, then each device's events.
fn finish(mut s: Stream, root: Value) -> Result<Trace> {
    if !s.is_dict(&root) {
        return Err(bad("it is not a dict"));
    }
    let Some(traces) = s.get(&root, "device_traces")? else {
        return Err(bad(
            "it has no 'device_traces': record with torch.cuda.memory._record_memory_history() \
             before taking it",
        ));
    };
    let parts = Parts::read(&mut s, &root)?;
    let Value::Obj(h) = traces else {
        return Err(bad("'device_traces' is not a list"));
    };
    let devices = match &s.slab[h as usize] {
        Slot::List(l) if l.events.is_empty() => l.items.clone(),
        Slot::List(_) => return Err(bad("a device trace is not a list")),
        _ => return Err(bad("'device_traces' is not a list")),
    };
    for (device, list) in devices.into_iter().enumerate() {
        let list = s.resolve(list);
        let Value::Obj(h) = list else {
            return Err(bad("a device trace is not a list"));
        };
        let events = match &mut s.slab[h as usize] {
            Slot::List(l) => {
                if let Some(item) = l.items.first() {
                    return Err(match item {
                        Value::Obj(_) | Value::Frame(_) => bad("a trace entry has no 'action'"),
                        _ => bad("a trace entry is not a dict"),
                    });
                }
                if l.copies > 1 {
                    l.events.clone()
                } else {
                    std::mem::take(&mut l.events)
                }
            }
            _ => return Err(bad("a device trace is not a list")),
        };
        parts.add_device(&mut s.trace, device as i32, events);
    }
    parts.finish(&mut s.trace);
    Ok(s.trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_slots_round_trip() {
        let mut s = Stream::new();
        for v in [
            Value::Missing,
            Value::Gone,
            Value::Str(7),
            Value::Obj(ID_MASK),
            Value::Frame(0),
            Value::Stack(NONE),
            Value::Stack(3),
            Value::Int(-5),
            Value::Float(0.5),
            Value::None,
        ] {
            let slot = s.pack(v).unwrap();
            assert_eq!(s.unpack(slot), v);
        }
        assert!(s.pack(Value::Frame(ID_MASK + 1)).is_err());
    }

    #[test]
    fn long_payloads_decode_as_python_does() {
        assert_eq!(long(&[]), Value::Int(0));
        assert_eq!(long(&[0xff]), Value::Int(-1));
        assert_eq!(long(&[0x80, 0x00]), Value::Int(128));
        // 2**63 needs nine bytes and fits in u64 only.
        assert_eq!(long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]), Value::UInt(1 << 63));
        assert_eq!(long(&[0; 17]), Value::Big);
        assert_eq!(long(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 1]), Value::Big);
    }
}
