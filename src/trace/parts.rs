//! The parts of a snapshot that both readers convert alike: the segments (end and start
//! layouts), the allocator settings, our `memlab_rs` key, and the assembly of each device's
//! trace from its events. The dict reader (`py::load`) walks Python objects, the streaming
//! reader (`pickle_stream`) its own compact values; `Doc` is what they have in common, so the
//! rules live in one place.

use super::error::{bad, ReadError};
use super::model::{Action, Block, BlockState, DeviceTrace, Event, Segment, Source, Trace, NONE};

/// Read access to a snapshot's values, as Python would see them.
pub trait Doc {
    type Node: Clone;
    /// What reading a value may fail with: the streaming reader's own `ReadError`, or the
    /// interpreter's error for the dict reader (a key's `__eq__` may raise anything).
    type Error: From<ReadError>;
    /// The trace being built (stacks and strings are interned into it).
    fn trace(&mut self) -> &mut Trace;
    /// Whether `node` is Python's None.
    fn is_none(&self, node: &Self::Node) -> bool;
    /// Whether `node` is a dict.
    fn is_dict(&self, node: &Self::Node) -> bool;
    /// `node[key]` of a dict (None when missing or when `node` is not a dict).
    fn get(
        &mut self,
        node: &Self::Node,
        key: &'static str,
    ) -> Result<Option<Self::Node>, Self::Error>;
    /// An int, None for Python's None (an error for what is not an int).
    fn int(&mut self, node: &Self::Node) -> Result<Option<i128>, Self::Error>;
    /// `str(node)`.
    fn text(&mut self, node: &Self::Node) -> Result<String, Self::Error>;
    fn truthy(&mut self, node: &Self::Node) -> Result<bool, Self::Error>;
    /// The items of an iterable (None when it is not one).
    fn items(&mut self, node: &Self::Node) -> Result<Option<Vec<Self::Node>>, Self::Error>;
    /// The items of a list only (not a tuple, not a dict).
    fn list_items(&mut self, node: &Self::Node) -> Result<Option<Vec<Self::Node>>, Self::Error>;
    /// The values of a dict.
    fn dict_values(&mut self, node: &Self::Node) -> Result<Option<Vec<Self::Node>>, Self::Error>;
    /// The stack id of a `frames` value (`NONE` for what is not a list of frames).
    fn stack(&mut self, frames: Option<Self::Node>) -> Result<u32, Self::Error>;
}

fn int_at<D: Doc>(
    doc: &mut D,
    node: &D::Node,
    key: &'static str,
) -> Result<Option<i128>, D::Error> {
    match doc.get(node, key)? {
        Some(value) => doc.int(&value),
        None => Ok(None),
    }
}

pub fn u64_at<D: Doc>(doc: &mut D, node: &D::Node, key: &'static str) -> Result<u64, D::Error> {
    Ok(int_at(doc, node, key)?
        .unwrap_or(0)
        .clamp(0, u64::MAX as i128) as u64)
}

fn segment<D: Doc>(doc: &mut D, seg: &D::Node) -> Result<(i32, Segment), D::Error> {
    if !doc.is_dict(seg) {
        return Err(bad("a segment is not a dict").into());
    }
    let device = int_at(doc, seg, "device")?.unwrap_or(0) as i32;
    let address = u64_at(doc, seg, "address")?;
    let total_size = u64_at(doc, seg, "total_size")?;
    let kind = match doc.get(seg, "segment_type")? {
        Some(v) => doc.text(&v)?,
        None => String::new(),
    };
    let expandable = match doc.get(seg, "is_expandable")? {
        Some(v) => doc.truthy(&v)?,
        None => false,
    };
    let mut blocks = Vec::new();
    let mut at = address;
    if let Some(list) = doc.get(seg, "blocks")? {
        let Some(items) = doc.items(&list)? else {
            return Err(bad("'blocks' is not a list").into());
        };
        for b in items {
            if !doc.is_dict(&b) {
                return Err(bad("a block is not a dict").into());
            }
            let size = u64_at(doc, &b, "size")?;
            let requested = int_at(doc, &b, "requested_size")?.map_or(size, |v| v as u64);
            let state = match doc.get(&b, "state")? {
                Some(s) => match doc.text(&s)?.as_str() {
                    "active_allocated" => BlockState::Allocated,
                    "active_pending_free" | "active_awaiting_free" => BlockState::PendingFree,
                    _ => BlockState::Inactive,
                },
                None => BlockState::Inactive,
            };
            // Blocks carry an address in recent torch; older snapshots imply it.
            let block_address = int_at(doc, &b, "address")?.map_or(at, |v| v as u64);
            let frames = doc.get(&b, "frames")?;
            let stack = doc.stack(frames)?;
            blocks.push(Block {
                address: block_address,
                size,
                requested,
                state,
                stack,
            });
            at = block_address + size;
        }
    }
    let small = kind == "small" || (kind.is_empty() && total_size == 2 << 20);
    Ok((
        device,
        Segment {
            address,
            total_size,
            small,
            expandable,
            blocks,
        },
    ))
}

fn segments<D: Doc>(doc: &mut D, list: Option<D::Node>) -> Result<Vec<(i32, Segment)>, D::Error> {
    let mut out = Vec::new();
    if let Some(list) = list {
        let Some(items) = doc.items(&list)? else {
            return Err(bad("'segments' is not a list").into());
        };
        for item in items {
            out.push(segment(doc, &item)?);
        }
    }
    Ok(out)
}

/// What our recorders add under the `memlab_rs` key.
struct Extra<N> {
    source: Source,
    start_time: Option<i64>,
    /// The tag our start layout's snapshot entry carries (torch 2.10+), which finds it exactly.
    start_marker: Option<String>,
    start_segments: Option<N>,
    start_live: Option<N>,
    start_names: Option<N>,
    cwd: Option<String>,
    dropped: u64,
    no_stack: u64,
}

fn extra<D: Doc>(doc: &mut D, snapshot: &D::Node) -> Result<Extra<D::Node>, D::Error> {
    let mut out = Extra {
        source: Source::Cuda,
        start_time: None,
        start_marker: None,
        start_segments: None,
        start_live: None,
        start_names: None,
        cwd: None,
        dropped: 0,
        no_stack: 0,
    };
    let Some(ours) = doc.get(snapshot, "memlab_rs")? else {
        return Ok(out);
    };
    if !doc.is_dict(&ours) {
        return Err(bad("'memlab_rs' is not a dict").into());
    }
    if let Some(source) = doc.get(&ours, "source")? {
        if doc.text(&source)? == "cpu" {
            out.source = Source::Cpu;
        }
    }
    out.dropped = u64_at(doc, &ours, "dropped")?;
    if let Some(cwd) = doc.get(&ours, "cwd")? {
        if !doc.is_none(&cwd) {
            out.cwd = Some(doc.text(&cwd)?);
        }
    }
    out.no_stack = u64_at(doc, &ours, "no_stack")?;
    if let Some(start) = doc.get(&ours, "start")? {
        if !doc.is_dict(&start) {
            return Err(bad("'memlab_rs.start' is not a dict").into());
        }
        out.start_time = int_at(doc, &start, "time_us")?.map(|t| t as i64);
        out.start_segments = doc.get(&start, "segments")?;
        if let Some(marker) = doc.get(&start, "marker")? {
            if !doc.is_none(&marker) {
                out.start_marker = Some(doc.text(&marker)?);
            }
        }
        out.start_live = doc.get(&start, "live")?;
        out.start_names = doc.get(&start, "names")?;
    }
    Ok(out)
}

/// `memlab_rs.start.names`: `[address, name]` pairs, the tensors alive when recording
/// began (interned into the trace).
fn start_names<D: Doc>(doc: &mut D, names: &D::Node) -> Result<(), D::Error> {
    let pairs_err = || bad("'memlab_rs.start.names' holds [address, name] pairs");
    let Some(pairs) = doc.items(names)? else {
        return Err(pairs_err().into());
    };
    for pair in pairs {
        let Some(items) = doc.items(&pair).map_err(|_| pairs_err())? else {
            return Err(pairs_err().into());
        };
        let [address, name] = &items[..] else {
            return Err(pairs_err().into());
        };
        let address = match doc.int(address) {
            Ok(Some(n)) if (0..=u64::MAX as i128).contains(&n) => n as u64,
            _ => return Err(pairs_err().into()),
        };
        let name = doc.text(name)?;
        let id = doc.trace().string(&name);
        doc.trace().start_names.entry(address).or_insert(id);
    }
    Ok(())
}

fn settings<D: Doc>(doc: &mut D, snapshot: &D::Node) -> Result<(), D::Error> {
    let Some(s) = doc.get(snapshot, "allocator_settings")? else {
        return Ok(());
    };
    if !doc.is_dict(&s) {
        return Ok(());
    }
    if let Some(v) = doc
        .get(&s, "max_split_size")?
        .and_then(|v| doc.int(&v).ok().flatten())
    {
        if v > 0 && v < u64::MAX as i128 {
            doc.trace().settings.max_split_size = Some(v as u64);
        }
    }
    if let Some(v) = doc.get(&s, "expandable_segments")? {
        doc.trace().settings.expandable_segments = doc.truthy(&v)?;
    }
    if let Some(v) = doc.get(&s, "roundup_power2_divisions")? {
        let above_one = |doc: &mut D, x: &D::Node| {
            doc.int(x)
                .ok()
                .flatten()
                .is_some_and(|n| n > 1 && n <= i64::MAX as i128)
        };
        let many = match doc.dict_values(&v)? {
            Some(values) => Some(values),
            None => doc.list_items(&v)?,
        };
        let any = match many {
            Some(values) => values.iter().any(|x| above_one(doc, x)),
            None => above_one(doc, &v),
        };
        doc.trace().settings.power2_divisions = any;
    }
    Ok(())
}

/// Everything of a snapshot but its events, read once before the device traces.
pub struct Parts {
    source: Source,
    start_time: Option<i64>,
    start_marker: Option<String>,
    dropped: u64,
    no_stack: u64,
    end: Vec<(i32, Segment)>,
    start: Option<Vec<(i32, Segment)>>,
}

impl Parts {
    /// Read the settings, the end layout and our `memlab_rs` key of `snapshot` (a dict).
    pub fn read<D: Doc>(doc: &mut D, snapshot: &D::Node) -> Result<Parts, D::Error> {
        let extra = extra(doc, snapshot)?;
        doc.trace().source = extra.source;
        doc.trace().cwd = extra.cwd.clone();
        if let Some(names) = &extra.start_names {
            start_names(doc, names)?;
        }
        settings(doc, snapshot)?;
        let list = doc.get(snapshot, "segments")?;
        let end = segments(doc, list)?;
        let start = match (&extra.start_segments, &extra.start_live) {
            (Some(list), _) => Some(segments(doc, Some(list.clone()))?),
            (None, Some(live)) => {
                let pairs_err = || bad("'memlab_rs.start.live' holds [address, bytes] pairs");
                let Some(pairs) = doc.items(live)? else {
                    return Err(pairs_err().into());
                };
                let mut segments = Vec::new();
                for pair in pairs {
                    let Some(items) = doc.items(&pair).map_err(|_| pairs_err())? else {
                        return Err(pairs_err().into());
                    };
                    let mut numbers = Vec::with_capacity(2);
                    for item in &items {
                        match doc.int(item) {
                            Ok(Some(n)) if (0..=u64::MAX as i128).contains(&n) => {
                                numbers.push(n as u64)
                            }
                            _ => return Err(pairs_err().into()),
                        }
                    }
                    let [address, size] = numbers[..] else {
                        return Err(pairs_err().into());
                    };
                    segments.push((0, cpu_segment(address, size)));
                }
                Some(segments)
            }
            (None, None) => None,
        };
        Ok(Parts {
            source: extra.source,
            start_time: extra.start_time,
            start_marker: extra.start_marker,
            dropped: extra.dropped,
            no_stack: extra.no_stack,
            end,
            start,
        })
    }

    /// Add device `device`'s trace (its events in history order) to `trace`.
    pub fn add_device(&self, trace: &mut Trace, device: i32, mut events: Vec<Event>) {
        let mut start_layout = self.start.as_ref().map(|all| on(all, device));
        if let (Some(t0), Source::Cuda) = (self.start_time, self.source) {
            // Our recording starts at the snapshot entry its start layout left in the history.
            let marker = self.start_marker.as_deref().map(|m| trace.string(m));
            match events.iter().position(|e| {
                e.action == Action::Snapshot
                    && match marker {
                        Some(tag) => e.tag == tag,
                        None => e.time_us >= t0,
                    }
            }) {
                Some(marker) => {
                    events.drain(..=marker);
                }
                None if !events.is_empty()
                    || start_layout.as_ref().is_some_and(|s| !s.is_empty()) =>
                {
                    trace.notices.push(format!(
                        "device {device}: the start of the recording is no longer in the history \
                         (its ring buffer was full): allocations alive before the oldest entry \
                         are inferred; raise max_entries"
                    ));
                    start_layout = None;
                }
                None => {}
            }
        }
        let end_layout = on(&self.end, device);
        if events.is_empty() && end_layout.is_empty() {
            return;
        }
        trace.devices.push(DeviceTrace {
            device,
            events,
            end: end_layout,
            start: start_layout,
            dropped: self.dropped,
        });
    }

    /// The whole trace's notices, once every device is in.
    pub fn finish(&self, trace: &mut Trace) {
        if self.dropped > 0 {
            trace.notices.push(format!(
                "{} oldest entries were dropped by the recorder (max_entries reached)",
                self.dropped
            ));
        }
        if self.no_stack > 0 {
            trace.notices.push(format!(
                "{} entries were made by threads with no Python stack (torch's worker threads)",
                self.no_stack
            ));
        }
    }
}

fn on(all: &[(i32, Segment)], device: i32) -> Vec<Segment> {
    all.iter()
        .filter(|(d, _)| *d == device)
        .map(|(_, s)| s.clone())
        .collect()
}

fn cpu_segment(address: u64, size: u64) -> Segment {
    Segment {
        address,
        total_size: size,
        small: false,
        expandable: false,
        blocks: vec![Block {
            address,
            size,
            requested: size,
            state: BlockState::Allocated,
            stack: NONE,
        }],
    }
}
