//! The gate every snapshot pickle passes before anything reads it: memory snapshots are
//! what people attach to bug reports, so a file may come from anyone.
//!
//! A pickle is a program: GLOBAL/STACK_GLOBAL name any callable, REDUCE calls it, BUILD,
//! INST, OBJ and NEWOBJ construct arbitrary objects, PERSID and EXT reach the unpickler's
//! hooks. `torch.cuda.memory._dump_snapshot` writes none of these: a snapshot is plain data
//! (dicts with string keys, lists, tuples, strings, numbers, bools, None). This scanner walks
//! the opcodes without building anything and refuses, naming the opcode and its byte:
//! - every opcode outside that vocabulary (nothing that constructs objects or calls code);
//! - a memo index beyond what the file can hold (a 6-byte LONG_BINPUT could otherwise make
//!   any reader grow its memo table by gigabytes), a length beyond the bytes left in the file,
//!   an int literal longer than Python converts in linear time;
//! - a structure that expands to more values than `MAX_VALUES_PER_BYTE` per byte of file
//!   (a "billion laughs" of shared lists, which any walk of the result, a JSON export or the
//!   analysis, would pay for in full), and a container changed after it was stored in
//!   another one, which is how a cycle is made; Python's pickler writes neither.
//!
//! A file that passes is read by the streaming reader (`pickle_stream`) or, for what that
//! one does not read (protocols 0 and 1), by Python's unpickler with every global refused
//! (`memlab_rs.trace`), both of which then do work linear in the file's size.

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read};

/// A walk of the loaded snapshot visits at most this many values per byte of file. A
/// torch snapshot with deep stacks and shared frame lists expands about 2-12 times (frames
/// lists of ~30 frames, 3 keys each, referenced by entries of ~100 bytes).
pub const MAX_VALUES_PER_BYTE: u64 = 64;
/// ... plus this many, for small files.
pub const MIN_VALUES: u64 = 1 << 20;
/// The longest decimal int literal (INT, LONG) read: Python's own default limit on
/// int/str conversions, whose cost is quadratic in the digits.
const MAX_DIGITS: u64 = 4300;
/// The longest binary int (LONG1, LONG4) read, in bytes: a snapshot's ints fit in 9.
const MAX_LONG_BYTES: u64 = 1024;

/// Why a file was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// There is no file at the path.
    Missing,
    /// The file could not be read (permission, I/O, memory).
    Io(String),
    /// Not a snapshot pickle memlab_rs reads: what was found, and at which byte.
    Refused { what: String, at: u64 },
    /// The file ends in the middle of the pickle.
    Truncated { at: u64 },
    /// The file is empty.
    Empty,
}

impl Refusal {
    /// The sentence for the user (the path is added by the caller).
    pub fn describe(&self) -> String {
        match self {
            Refusal::Missing => "there is no such file".into(),
            Refusal::Io(e) => format!("reading it failed: {e}"),
            Refusal::Refused { what, at } => format!("at byte {at}, {what}"),
            Refusal::Truncated { at } => {
                format!("it ends at byte {at}, in the middle of the pickle (truncated?)")
            }
            Refusal::Empty => "the file is empty".into(),
        }
    }

    /// The one message for a refused snapshot pickle at `path`.
    pub fn message(&self, path: &str) -> String {
        format!(
            "{path:?} is not a snapshot pickle memlab_rs reads: {}. memlab_rs reads plain \
             data only (dicts, lists, strings, numbers, as torch.cuda.memory._dump_snapshot \
             writes them) and never runs code from a file",
            self.describe()
        )
    }
}

/// What a checked file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// The pickle protocol (0 and 1 have no PROTO opcode).
    pub protocol: u8,
    /// How many values a full walk of the loaded result visits (shared values counted at
    /// each reference).
    pub values: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    Leaf,
    List,
    Dict,
    Tuple,
}

/// A value on the machine's stack. Containers accumulate their expanded weight here while
/// open (on the stack and not yet stored anywhere).
#[derive(Clone, Copy, Debug)]
struct Item {
    kind: Kind,
    weight: u64,
    /// The memo index of this container, `NO_MEMO` if none.
    memo: u32,
    /// Whether the container was stored somewhere (or is a tuple): no more changes.
    sealed: bool,
}

const NO_MEMO: u32 = u32::MAX;

/// A memo slot.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Missing,
    /// A string or a number.
    Leaf(Kind),
    /// A container that can no longer change, with its final weight.
    Sealed(Kind, u64),
    /// A container still open, at this position of the stack.
    Open(u32),
}

struct Scanner<R> {
    input: R,
    offset: u64,
    /// The file's length: no table may hold more entries than it has bytes.
    len: u64,
    limit: u64,
    stack: Vec<Item>,
    marks: Vec<usize>,
    memo: Vec<Slot>,
    /// How many memo slots are written (MEMOIZE's index, as Python's unpickler counts).
    memo_count: u32,
    scratch: Vec<u8>,
}

fn leaf(kind: Kind) -> Item {
    Item {
        kind,
        weight: 1,
        memo: NO_MEMO,
        sealed: true,
    }
}

/// Check the pickle at `path`; see the module docs.
pub fn check_file(path: &str) -> Result<Checked, Refusal> {
    let file = File::open(path).map_err(|e| match e.kind() {
        ErrorKind::NotFound => Refusal::Missing,
        _ => Refusal::Io(e.to_string()),
    })?;
    let len = file
        .metadata()
        .map_err(|e| Refusal::Io(e.to_string()))?
        .len();
    check(BufReader::with_capacity(1 << 20, file), len)
}

/// Check a pickle of `len` bytes read from `input`.
pub fn check<R: BufRead>(input: R, len: u64) -> Result<Checked, Refusal> {
    let limit = len
        .saturating_mul(MAX_VALUES_PER_BYTE)
        .saturating_add(MIN_VALUES);
    let mut s = Scanner {
        input,
        offset: 0,
        len,
        limit,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        memo_count: 0,
        scratch: Vec::new(),
    };
    s.run()
}

impl<R: BufRead> Scanner<R> {
    fn refuse<T>(&self, what: impl Into<String>, at: u64) -> Result<T, Refusal> {
        Err(Refusal::Refused {
            what: what.into(),
            at,
        })
    }

    fn eof(&self) -> Refusal {
        if self.offset == 0 {
            Refusal::Empty
        } else {
            Refusal::Truncated { at: self.offset }
        }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], Refusal> {
        let mut out = [0u8; N];
        match self.input.read_exact(&mut out) {
            Ok(()) => {
                self.offset += N as u64;
                Ok(out)
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(self.eof()),
            Err(e) => Err(Refusal::Io(e.to_string())),
        }
    }

    fn byte(&mut self) -> Result<u8, Refusal> {
        Ok(self.bytes::<1>()?[0])
    }

    /// Skip `n` bytes of payload, refusing a length the file cannot hold.
    fn skip(&mut self, n: u64) -> Result<(), Refusal> {
        if n > self.len.saturating_sub(self.offset) {
            // A length running past the end: a cut file (or a bogus length), never read.
            return Err(Refusal::Truncated { at: self.len });
        }
        let got = std::io::copy(&mut (&mut self.input).take(n), &mut std::io::sink())
            .map_err(|e| Refusal::Io(e.to_string()))?;
        self.offset += got;
        if got < n {
            return Err(self.eof());
        }
        Ok(())
    }

    /// A protocol-0 argument: the bytes up to the next newline (without it).
    fn line(&mut self) -> Result<usize, Refusal> {
        self.scratch.clear();
        let left = self.len.saturating_sub(self.offset);
        let got = (&mut self.input)
            .take(left)
            .read_until(b'\n', &mut self.scratch)
            .map_err(|e| Refusal::Io(e.to_string()))?;
        self.offset += got as u64;
        if self.scratch.last() != Some(&b'\n') {
            return Err(self.eof());
        }
        self.scratch.pop();
        Ok(self.scratch.len())
    }

    fn decimal_line(&mut self, at: u64) -> Result<u64, Refusal> {
        self.line()?;
        let text = std::str::from_utf8(&self.scratch).unwrap_or("");
        text.trim()
            .parse::<u64>()
            .or_else(|_| self.refuse("a memo index that is not a number", at))
    }

    fn push(&mut self, item: Item) -> Result<(), Refusal> {
        grow(&mut self.stack)?;
        self.stack.push(item);
        Ok(())
    }

    fn underflow<T>(&self, at: u64) -> Result<T, Refusal> {
        self.refuse("an opcode with too few values on the stack", at)
    }

    fn pop_mark(&mut self, at: u64) -> Result<usize, Refusal> {
        match self.marks.pop() {
            Some(from) if from <= self.stack.len() => Ok(from),
            Some(_) => self.underflow(at),
            None => self.refuse("an opcode that needs a MARK without one", at),
        }
    }

    /// The weight of `item` as it is stored into a container, sealing an open container.
    fn store(&mut self, item: Item, at: u64) -> Result<u64, Refusal> {
        if item.memo == NO_MEMO {
            return Ok(item.weight);
        }
        match self.memo[item.memo as usize] {
            Slot::Sealed(_, w) => Ok(w),
            Slot::Open(pos) => {
                // The container itself (just taken off the stack) or a copy of it above
                // the original, whose weight is the one that grew.
                let open = match self.stack.get(pos as usize) {
                    Some(original) if original.memo == item.memo => *original,
                    _ => item,
                };
                self.memo[item.memo as usize] = Slot::Sealed(open.kind, open.weight);
                Ok(open.weight)
            }
            Slot::Leaf(_) => Ok(1),
            Slot::Missing => self.refuse("a value whose memo entry is missing", at),
        }
    }

    fn is_sealed(&self, item: &Item) -> bool {
        if item.memo == NO_MEMO {
            item.sealed
        } else {
            !matches!(self.memo[item.memo as usize], Slot::Open(_))
        }
    }

    fn add(&self, weight: u64, more: u64, at: u64) -> Result<u64, Refusal> {
        let total = weight.saturating_add(more);
        if total > self.limit {
            return self.refuse(
                format!(
                    "a structure that expands to more than {} values (shared references \
                     nested in each other: a pickle bomb?)",
                    self.limit
                ),
                at,
            );
        }
        Ok(total)
    }

    /// Items `from..` of the stack go into a new container of `kind`.
    fn build(&mut self, kind: Kind, from: usize, at: u64) -> Result<(), Refusal> {
        let items = self.stack.split_off(from);
        if kind == Kind::Dict {
            if items.len() % 2 != 0 {
                return self.refuse("a DICT with an odd number of values", at);
            }
            if items.iter().step_by(2).any(|k| k.kind != Kind::Str) {
                return self.refuse("a dict key that is not a string", at);
            }
        }
        let mut weight = 1;
        for item in items {
            let w = self.store(item, at)?;
            weight = self.add(weight, w, at)?;
        }
        self.push(Item {
            kind,
            weight,
            memo: NO_MEMO,
            sealed: kind == Kind::Tuple,
        })
    }

    /// APPEND(S) and SETITEM(S): items `from..` go into the container just below them.
    fn extend(&mut self, kind: Kind, from: usize, at: u64) -> Result<(), Refusal> {
        let target = from - 1;
        // The container must lie above the innermost MARK, as Python's unpickler checks.
        if self.marks.last().is_some_and(|&m| m > target) {
            return self.underflow(at);
        }
        if self.stack[target].kind != kind {
            let what = if kind == Kind::List {
                "a list"
            } else {
                "a dict"
            };
            return self.refuse(format!("an item added to what is not {what}"), at);
        }
        let items = self.stack.split_off(from);
        if kind == Kind::Dict {
            if items.len() % 2 != 0 {
                return self.underflow(at);
            }
            if items.iter().step_by(2).any(|k| k.kind != Kind::Str) {
                return self.refuse("a dict key that is not a string", at);
            }
        }
        let mut added = 0u64;
        for item in items {
            let w = self.store(item, at)?;
            added = self.add(added, w, at)?;
        }
        // After storing: an item that was the target itself has sealed it (a cycle).
        let t = self.stack[target];
        if self.is_sealed(&t) {
            return self.refuse(
                "a container changed after it was stored elsewhere (a cycle?)",
                at,
            );
        }
        // A copy pushed by GET grows the container it copies, at its place on the stack.
        let canonical = match t.memo {
            NO_MEMO => target,
            memo => match self.memo[memo as usize] {
                Slot::Open(pos) => pos as usize,
                _ => target,
            },
        };
        let weight = self.stack[canonical].weight;
        self.stack[canonical].weight = self.add(weight, added, at)?;
        Ok(())
    }

    fn put(&mut self, index: u64, at: u64) -> Result<(), Refusal> {
        if index >= self.len {
            return self.refuse(
                format!(
                    "memo index {index} in a file of {} bytes (no pickle writer makes one)",
                    self.len
                ),
                at,
            );
        }
        let index = index as usize;
        let Some(&top) = self.stack.last() else {
            return self.underflow(at);
        };
        if index >= self.memo.len() {
            let more = index + 1 - self.memo.len();
            self.memo
                .try_reserve(more)
                .map_err(|_| Refusal::Io("out of memory for the memo table".into()))?;
            self.memo.resize(index + 1, Slot::Missing);
        }
        if !matches!(self.memo[index], Slot::Missing) {
            return self.refuse(format!("memo entry {index} written twice"), at);
        }
        let slot = match top.kind {
            Kind::Str | Kind::Leaf => Slot::Leaf(top.kind),
            _ if top.memo != NO_MEMO => {
                return self.refuse("a container memoised twice", at);
            }
            _ if self.is_sealed(&top) => Slot::Sealed(top.kind, top.weight),
            _ => {
                let pos = self.stack.len() - 1;
                self.stack[pos].memo = index as u32;
                Slot::Open(pos as u32)
            }
        };
        self.memo[index] = slot;
        self.memo_count += 1;
        Ok(())
    }

    fn get(&mut self, index: u64, at: u64) -> Result<(), Refusal> {
        let slot = usize::try_from(index)
            .ok()
            .and_then(|i| self.memo.get(i).copied());
        let item = match slot {
            None | Some(Slot::Missing) => {
                return self.refuse(format!("memo entry {index} read before it is written"), at)
            }
            Some(Slot::Leaf(kind)) => leaf(kind),
            Some(Slot::Sealed(kind, weight)) => Item {
                kind,
                weight,
                memo: NO_MEMO,
                sealed: true,
            },
            Some(Slot::Open(pos)) => self.stack[pos as usize],
        };
        self.push(item)
    }

    /// Values leave the stack unstored (POP, POP_MARK): an open container is final now.
    fn discard(&mut self, from: usize, at: u64) -> Result<(), Refusal> {
        for item in self.stack.split_off(from) {
            self.store(item, at)?;
        }
        Ok(())
    }

    fn run(&mut self) -> Result<Checked, Refusal> {
        let mut protocol = 0u8;
        loop {
            let at = self.offset;
            let op = self.byte()?;
            match op {
                // PROTO
                0x80 => {
                    protocol = self.byte()?;
                    if protocol > 5 {
                        return self.refuse(format!("pickle protocol {protocol}"), at);
                    }
                }
                // FRAME: a length the file must hold
                0x95 => {
                    let n = u64::from_le_bytes(self.bytes::<8>()?);
                    if n > self.len.saturating_sub(self.offset) {
                        return Err(Refusal::Truncated { at: self.len });
                    }
                }
                // STOP
                b'.' => {
                    let Some(root) = self.stack.pop() else {
                        return self.underflow(at);
                    };
                    let values = self.store(root, at)?;
                    return Ok(Checked { protocol, values });
                }
                b'(' => {
                    grow(&mut self.marks)?;
                    self.marks.push(self.stack.len());
                }
                // POP, POP_MARK
                b'0' => {
                    // At a MARK, POP takes the mark (as Python's unpickler does).
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else if self.stack.is_empty() {
                        return self.underflow(at);
                    } else {
                        let from = self.stack.len() - 1;
                        self.discard(from, at)?;
                    }
                }
                b'1' => {
                    let from = self.pop_mark(at)?;
                    self.discard(from, at)?;
                }
                // Leaves.
                b'N' | 0x88 | 0x89 => self.push(leaf(Kind::Leaf))?,
                b'K' => {
                    self.bytes::<1>()?;
                    self.push(leaf(Kind::Leaf))?;
                }
                b'M' => {
                    self.bytes::<2>()?;
                    self.push(leaf(Kind::Leaf))?;
                }
                b'J' => {
                    self.bytes::<4>()?;
                    self.push(leaf(Kind::Leaf))?;
                }
                b'G' => {
                    self.bytes::<8>()?;
                    self.push(leaf(Kind::Leaf))?;
                }
                // INT, LONG: decimal literals
                b'I' | b'L' => {
                    let n = self.line()? as u64;
                    if n > MAX_DIGITS + 2 {
                        return self.refuse(format!("an int literal of {n} digits"), at);
                    }
                    self.push(leaf(Kind::Leaf))?;
                }
                // FLOAT
                b'F' => {
                    self.line()?;
                    self.push(leaf(Kind::Leaf))?;
                }
                // LONG1, LONG4
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        self.byte()? as u64
                    } else {
                        u32::from_le_bytes(self.bytes::<4>()?) as u64
                    };
                    if n > MAX_LONG_BYTES {
                        return self.refuse(format!("an int of {n} bytes"), at);
                    }
                    self.skip(n)?;
                    self.push(leaf(Kind::Leaf))?;
                }
                // Strings: STRING, UNICODE (lines); BINSTRING, SHORT_BINSTRING,
                // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8.
                b'S' | b'V' => {
                    self.line()?;
                    self.push(leaf(Kind::Str))?;
                }
                b'T' | b'X' => {
                    let n = u32::from_le_bytes(self.bytes::<4>()?) as u64;
                    self.skip(n)?;
                    self.push(leaf(Kind::Str))?;
                }
                b'U' | 0x8c => {
                    let n = self.byte()? as u64;
                    self.skip(n)?;
                    self.push(leaf(Kind::Str))?;
                }
                0x8d => {
                    let n = u64::from_le_bytes(self.bytes::<8>()?);
                    self.skip(n)?;
                    self.push(leaf(Kind::Str))?;
                }
                // Bytes: BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8. Plain data, though
                // torch writes none.
                b'B' => {
                    let n = u32::from_le_bytes(self.bytes::<4>()?) as u64;
                    self.skip(n)?;
                    self.push(leaf(Kind::Leaf))?;
                }
                b'C' => {
                    let n = self.byte()? as u64;
                    self.skip(n)?;
                    self.push(leaf(Kind::Leaf))?;
                }
                0x8e | 0x96 => {
                    let n = u64::from_le_bytes(self.bytes::<8>()?);
                    self.skip(n)?;
                    self.push(leaf(Kind::Leaf))?;
                }
                // Containers.
                b']' => self.push(Item {
                    kind: Kind::List,
                    weight: 1,
                    memo: NO_MEMO,
                    sealed: false,
                })?,
                b'}' => self.push(Item {
                    kind: Kind::Dict,
                    weight: 1,
                    memo: NO_MEMO,
                    sealed: false,
                })?,
                b')' => self.push(Item {
                    kind: Kind::Tuple,
                    weight: 1,
                    memo: NO_MEMO,
                    sealed: true,
                })?,
                b'l' | b'd' | b't' => {
                    let from = self.pop_mark(at)?;
                    let kind = match op {
                        b'l' => Kind::List,
                        b'd' => Kind::Dict,
                        _ => Kind::Tuple,
                    };
                    self.build(kind, from, at)?;
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let Some(from) = self.stack.len().checked_sub(n) else {
                        return self.underflow(at);
                    };
                    if self.marks.last().is_some_and(|&m| m > from) {
                        return self.underflow(at);
                    }
                    self.build(Kind::Tuple, from, at)?;
                }
                b'a' | b's' => {
                    let n = if op == b'a' { 1 } else { 2 };
                    let from = match self.stack.len().checked_sub(n) {
                        Some(from) if from > 0 => from,
                        _ => return self.underflow(at),
                    };
                    let kind = if op == b'a' { Kind::List } else { Kind::Dict };
                    self.extend(kind, from, at)?;
                }
                b'e' | b'u' => {
                    let from = self.pop_mark(at)?;
                    if from == 0 {
                        return self.underflow(at);
                    }
                    let kind = if op == b'e' { Kind::List } else { Kind::Dict };
                    self.extend(kind, from, at)?;
                }
                // The memo: PUT, BINPUT, LONG_BINPUT, MEMOIZE; GET, BINGET, LONG_BINGET.
                b'p' => {
                    let index = self.decimal_line(at)?;
                    self.put(index, at)?;
                }
                b'q' => {
                    let index = self.byte()? as u64;
                    self.put(index, at)?;
                }
                b'r' => {
                    let index = u32::from_le_bytes(self.bytes::<4>()?) as u64;
                    self.put(index, at)?;
                }
                0x94 => {
                    let index = self.memo_count as u64;
                    self.put(index, at)?;
                }
                b'g' => {
                    let index = self.decimal_line(at)?;
                    self.get(index, at)?;
                }
                b'h' => {
                    let index = self.byte()? as u64;
                    self.get(index, at)?;
                }
                b'j' => {
                    let index = u32::from_le_bytes(self.bytes::<4>()?) as u64;
                    self.get(index, at)?;
                }
                _ => {
                    return self.refuse(
                        format!(
                            "pickle opcode {} ({op:#04x}), {}",
                            opcode_name(op),
                            why_refused(op)
                        ),
                        at,
                    )
                }
            }
        }
    }
}

/// Room for one more item, or an error rather than an abort when memory runs out.
fn grow<T>(v: &mut Vec<T>) -> Result<(), Refusal> {
    if v.len() == v.capacity() {
        v.try_reserve(v.len().max(16))
            .map_err(|_| Refusal::Io("out of memory while checking the file".into()))?;
    }
    Ok(())
}

/// The name pickletools gives an opcode.
pub fn opcode_name(op: u8) -> &'static str {
    match op {
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'M' => "BININT2",
        b'L' => "LONG",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8e => "BINBYTES8",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        b'N' => "NONE",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        b'V' => "UNICODE",
        0x8c => "SHORT_BINUNICODE",
        b'X' => "BINUNICODE",
        0x8d => "BINUNICODE8",
        b'F' => "FLOAT",
        b'G' => "BINFLOAT",
        b']' => "EMPTY_LIST",
        b'a' => "APPEND",
        b'e' => "APPENDS",
        b'l' => "LIST",
        b')' => "EMPTY_TUPLE",
        b't' => "TUPLE",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        b'}' => "EMPTY_DICT",
        b'd' => "DICT",
        b's' => "SETITEM",
        b'u' => "SETITEMS",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        b'0' => "POP",
        b'2' => "DUP",
        b'(' => "MARK",
        b'1' => "POP_MARK",
        b'g' => "GET",
        b'h' => "BINGET",
        b'j' => "LONG_BINGET",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        0x94 => "MEMOIZE",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        0x80 => "PROTO",
        b'.' => "STOP",
        0x95 => "FRAME",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        _ => "(not an opcode)",
    }
}

fn why_refused(op: u8) -> &'static str {
    match op {
        b'c' | 0x93 | b'R' | b'b' | 0x81 | 0x92 | b'o' | b'i' | 0x82..=0x84 => {
            "which imports or calls code"
        }
        b'P' | b'Q' | 0x97 | 0x98 => "which reads objects from outside the file",
        0x8f..=0x91 => "a set, which no memory snapshot holds",
        b'2' => "which no pickle writer emits",
        _ => "which is not pickle data",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(bytes: &[u8]) -> Result<Checked, Refusal> {
        check(bytes, bytes.len() as u64)
    }

    fn refused(bytes: &[u8]) -> String {
        match checked(bytes) {
            Err(Refusal::Refused { what, .. }) => what,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn plain_data_passes_with_its_expanded_size() {
        // {"a": [1, 2]} at protocol 2: PROTO 2, }, q0, X "a", q1, ], q2, (, K1, K2, e, s, .
        let p = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02(K\x01K\x02es.";
        assert_eq!(
            checked(p),
            Ok(Checked {
                protocol: 2,
                values: 5
            })
        );
    }

    #[test]
    fn code_is_refused_by_name() {
        // GLOBAL os system, then REDUCE
        let p = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85R.";
        let what = refused(p);
        assert!(what.contains("GLOBAL"), "{what}");
        assert!(what.contains("imports or calls code"), "{what}");
    }

    #[test]
    fn a_far_memo_index_is_refused_before_any_table_grows() {
        let mut p = b"\x80\x04]".to_vec();
        p.extend_from_slice(b"r\xff\xff\x0f\x00.");
        assert!(refused(&p).contains("memo index 1048575"));
    }

    #[test]
    fn a_length_beyond_the_file_is_refused() {
        let p = b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7fabc.";
        assert_eq!(checked(p), Err(Refusal::Truncated { at: 15 }));
    }

    #[test]
    fn billion_laughs_is_refused() {
        // l0 = [None]; then l(i) = [l(i-1), l(i-1)] by reference, 60 levels.
        let mut p = b"\x80\x04]\x94N\x61".to_vec();
        for i in 0u32..60 {
            p.extend_from_slice(b"]\x94(");
            p.push(b'j');
            p.extend_from_slice(&i.to_le_bytes());
            p.push(b'j');
            p.extend_from_slice(&i.to_le_bytes());
            p.push(b'e');
        }
        p.push(b'.');
        assert!(refused(&p).contains("pickle bomb"));
    }

    #[test]
    fn a_cycle_is_refused() {
        // l = []; l.append(l)
        let p = b"\x80\x04]\x94h\x00a.";
        assert!(refused(p).contains("cycle"));
    }

    #[test]
    fn truncated_and_empty_files_say_so() {
        assert_eq!(checked(b""), Err(Refusal::Empty));
        assert_eq!(checked(b"\x80\x04]"), Err(Refusal::Truncated { at: 3 }));
    }

    #[test]
    fn non_string_keys_and_sets_are_refused() {
        assert!(refused(b"\x80\x04}K\x01K\x02s.").contains("not a string"));
        assert!(refused(b"\x80\x04\x8f.").contains("EMPTY_SET"));
    }
}
