//! A snapshot dict (torch's `_snapshot()` schema, or our CPU recorder's, which follows it) into
//! plain records. Frame dicts are interned by identity: torch shares one dict per (code,
//! instruction) across entries, and so does pickle, so a 120,000-entry history touches each
//! distinct frame's fields once.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::model::{
    Action, Block, BlockState, DeviceTrace, Event, IntMap, Segment, Source, Trace, NONE,
};

/// A problem with the dict, named so the user can find it.
fn bad(what: &str) -> PyErr {
    PyValueError::new_err(format!(
        "not a memory snapshot: {what} (expected the dict of torch.cuda.memory._snapshot(), \
         a pickle written by torch.cuda.memory._dump_snapshot, or a memlab_rs trace)"
    ))
}

fn int(item: &Bound<'_, PyDict>, key: &Bound<'_, PyString>) -> PyResult<Option<i128>> {
    match item.get_item(key)? {
        Some(value) if !value.is_none() => match value.extract::<i64>() {
            Ok(v) => Ok(Some(v as i128)),
            Err(_) => Ok(Some(value.extract::<i128>()?)),
        },
        _ => Ok(None),
    }
}

fn u64_of(item: &Bound<'_, PyDict>, key: &Bound<'_, PyString>) -> PyResult<u64> {
    Ok(int(item, key)?.unwrap_or(0).clamp(0, u64::MAX as i128) as u64)
}

struct Loader<'py> {
    py: Python<'py>,
    trace: Trace,
    /// Frame dict identity -> frame id, frames list identity -> stack id (a free entry
    /// shares its allocation's list). The snapshot keeps every object alive meanwhile.
    frames_by_object: IntMap<usize, u32>,
    stacks_by_list: IntMap<usize, u32>,
    scratch: Vec<u32>,
}

impl<'py> Loader<'py> {
    fn stack(&mut self, frames: Option<Bound<'py, PyAny>>) -> PyResult<u32> {
        let Some(frames) = frames else {
            return Ok(NONE);
        };
        let Ok(frames) = frames.cast::<PyList>() else {
            return Ok(NONE);
        };
        let list_key = frames.as_ptr() as usize;
        if let Some(&id) = self.stacks_by_list.get(&list_key) {
            return Ok(id);
        }
        self.scratch.clear();
        for frame in frames.iter() {
            let key = frame.as_ptr() as usize;
            let id = match self.frames_by_object.get(&key) {
                Some(&id) => id,
                None => {
                    let dict = frame
                        .cast::<PyDict>()
                        .map_err(|_| bad("a frame is not a dict"))?;
                    let py = self.py;
                    let get = |k: &Bound<'py, PyString>| dict.get_item(k);
                    let filename = get(intern!(py, "filename"))?
                        .map(|v| v.str().map(|s| s.to_string()))
                        .transpose()?
                        .unwrap_or_default();
                    let name = get(intern!(py, "name"))?
                        .map(|v| v.str().map(|s| s.to_string()))
                        .transpose()?
                        .unwrap_or_default();
                    let line = get(intern!(py, "line"))?
                        .map(|v| v.extract::<i64>())
                        .transpose()?
                        .unwrap_or(0)
                        .clamp(0, u32::MAX as i64) as u32;
                    let id = self.trace.frame(&filename, line, &name);
                    // The snapshot holds every frame dict while we read it, so an identity
                    // stays unique for the whole load.
                    self.frames_by_object.insert(key, id);
                    id
                }
            };
            self.scratch.push(id);
        }
        let scratch = std::mem::take(&mut self.scratch);
        let id = self.trace.stack(&scratch);
        self.scratch = scratch;
        self.stacks_by_list.insert(list_key, id);
        Ok(id)
    }

    fn segment(&mut self, item: &Bound<'py, PyAny>) -> PyResult<(i32, Segment)> {
        let py = self.py;
        let seg = item
            .cast::<PyDict>()
            .map_err(|_| bad("a segment is not a dict"))?;
        let device = int(seg, intern!(py, "device"))?.unwrap_or(0) as i32;
        let address = u64_of(seg, intern!(py, "address"))?;
        let total_size = u64_of(seg, intern!(py, "total_size"))?;
        let kind = seg
            .get_item(intern!(py, "segment_type"))?
            .map(|v| v.str().map(|s| s.to_string()))
            .transpose()?
            .unwrap_or_default();
        let expandable = seg
            .get_item(intern!(py, "is_expandable"))?
            .map(|v| v.is_truthy())
            .transpose()?
            .unwrap_or(false);
        let mut blocks = Vec::new();
        let mut at = address;
        if let Some(list) = seg.get_item(intern!(py, "blocks"))? {
            for block in list.try_iter()? {
                let block = block?;
                let b = block
                    .cast::<PyDict>()
                    .map_err(|_| bad("a block is not a dict"))?;
                let size = u64_of(b, intern!(py, "size"))?;
                let requested = int(b, intern!(py, "requested_size"))?.map_or(size, |v| v as u64);
                let state = match b.get_item(intern!(py, "state"))? {
                    Some(s) => match s.str()?.to_cow()?.as_ref() {
                        "active_allocated" => BlockState::Allocated,
                        "active_pending_free" | "active_awaiting_free" => BlockState::PendingFree,
                        _ => BlockState::Inactive,
                    },
                    None => BlockState::Inactive,
                };
                // Blocks carry an address in recent torch; older snapshots imply it.
                let block_address = int(b, intern!(py, "address"))?.map_or(at, |v| v as u64);
                let stack = self.stack(b.get_item(intern!(py, "frames"))?)?;
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

    fn segments(&mut self, list: Option<Bound<'py, PyAny>>) -> PyResult<Vec<(i32, Segment)>> {
        let mut out = Vec::new();
        if let Some(list) = list {
            for item in list
                .try_iter()
                .map_err(|_| bad("'segments' is not a list"))?
            {
                out.push(self.segment(&item?)?);
            }
        }
        Ok(out)
    }

    fn events(&mut self, entries: &Bound<'py, PyAny>) -> PyResult<Vec<Event>> {
        let py = self.py;
        let mut events = Vec::new();
        // Strings by identity first (pickle and torch share them), by text otherwise. The
        // entries hold every string for the whole load, so an identity stays unique.
        let mut actions: IntMap<usize, Action> = IntMap::default();
        let mut tags: IntMap<usize, u32> = IntMap::default();
        let mut tag_texts: HashMap<String, u32> = HashMap::new();
        for entry in entries
            .try_iter()
            .map_err(|_| bad("a device trace is not a list"))?
        {
            let entry = entry?;
            let e = entry
                .cast::<PyDict>()
                .map_err(|_| bad("a trace entry is not a dict"))?;
            let action = match e.get_item(intern!(py, "action"))? {
                Some(a) => match actions.get(&(a.as_ptr() as usize)) {
                    Some(&action) => action,
                    None => {
                        let action = Action::parse(&a.str()?.to_cow()?);
                        actions.insert(a.as_ptr() as usize, action);
                        action
                    }
                },
                None => return Err(bad("a trace entry has no 'action'")),
            };
            let tag = match e.get_item(intern!(py, "user_metadata"))? {
                Some(t) if !t.is_none() => match tags.get(&(t.as_ptr() as usize)) {
                    Some(&id) => id,
                    None => {
                        let text = t.str()?.to_cow()?.into_owned();
                        let id = if text.is_empty() {
                            NONE
                        } else if let Some(&id) = tag_texts.get(&text) {
                            id
                        } else {
                            let id = self.trace.string(&text);
                            tag_texts.insert(text, id);
                            id
                        };
                        tags.insert(t.as_ptr() as usize, id);
                        id
                    }
                },
                _ => NONE,
            };
            events.push(Event {
                action,
                addr: u64_of(e, intern!(py, "addr"))?,
                size: u64_of(e, intern!(py, "size"))?,
                stream: u64_of(e, intern!(py, "stream"))?,
                time_us: int(e, intern!(py, "time_us"))?.unwrap_or(0) as i64,
                stack: self.stack(e.get_item(intern!(py, "frames"))?)?,
                tag,
            });
        }
        Ok(events)
    }
}

/// What our recorders add under the `memlab_rs` key.
struct Extra<'py> {
    source: Source,
    start_time: Option<i64>,
    /// The tag our start layout's snapshot entry carries (torch 2.10+), which finds it exactly.
    start_marker: Option<String>,
    start_segments: Option<Bound<'py, PyAny>>,
    start_live: Option<Bound<'py, PyAny>>,
    dropped: u64,
    no_stack: u64,
}

fn extra<'py>(py: Python<'py>, snapshot: &Bound<'py, PyDict>) -> PyResult<Extra<'py>> {
    let mut out = Extra {
        source: Source::Cuda,
        start_time: None,
        start_marker: None,
        start_segments: None,
        start_live: None,
        dropped: 0,
        no_stack: 0,
    };
    let Some(ours) = snapshot.get_item(intern!(py, "memlab_rs"))? else {
        return Ok(out);
    };
    let ours = ours
        .cast::<PyDict>()
        .map_err(|_| bad("'memlab_rs' is not a dict"))?;
    if let Some(source) = ours.get_item(intern!(py, "source"))? {
        if source.str()?.to_cow()? == "cpu" {
            out.source = Source::Cpu;
        }
    }
    out.dropped = u64_of(ours, intern!(py, "dropped"))?;
    out.no_stack = u64_of(ours, intern!(py, "no_stack"))?;
    if let Some(start) = ours.get_item(intern!(py, "start"))? {
        let start = start
            .cast::<PyDict>()
            .map_err(|_| bad("'memlab_rs.start' is not a dict"))?;
        out.start_time = int(start, intern!(py, "time_us"))?.map(|t| t as i64);
        out.start_segments = start.get_item(intern!(py, "segments"))?;
        if let Some(marker) = start.get_item(intern!(py, "marker"))? {
            if !marker.is_none() {
                out.start_marker = Some(marker.str()?.to_cow()?.into_owned());
            }
        }
        out.start_live = start.get_item(intern!(py, "live"))?;
    }
    Ok(out)
}

fn settings(py: Python<'_>, snapshot: &Bound<'_, PyDict>, trace: &mut Trace) -> PyResult<()> {
    let Some(s) = snapshot.get_item(intern!(py, "allocator_settings"))? else {
        return Ok(());
    };
    let Ok(s) = s.cast::<PyDict>() else {
        return Ok(());
    };
    if let Some(v) = int(s, intern!(py, "max_split_size")).ok().flatten() {
        if v > 0 && v < u64::MAX as i128 {
            trace.settings.max_split_size = Some(v as u64);
        }
    }
    if let Some(v) = s.get_item(intern!(py, "expandable_segments"))? {
        trace.settings.expandable_segments = v.is_truthy()?;
    }
    if let Some(v) = s.get_item(intern!(py, "roundup_power2_divisions"))? {
        let any = if let Ok(d) = v.cast::<PyDict>() {
            d.values()
                .iter()
                .any(|x| x.extract::<i64>().is_ok_and(|n| n > 1))
        } else if let Ok(list) = v.cast::<PyList>() {
            list.iter().any(|x| x.extract::<i64>().is_ok_and(|n| n > 1))
        } else {
            v.extract::<i64>().is_ok_and(|n| n > 1)
        };
        trace.settings.power2_divisions = any;
    }
    Ok(())
}

/// Read a snapshot dict into a `Trace`.
pub fn from_snapshot(py: Python<'_>, snapshot: &Bound<'_, PyAny>) -> PyResult<Trace> {
    let snapshot = snapshot
        .cast::<PyDict>()
        .map_err(|_| bad("it is not a dict"))?;
    let Some(traces) = snapshot.get_item(intern!(py, "device_traces"))? else {
        return Err(bad(
            "it has no 'device_traces': record with torch.cuda.memory._record_memory_history() \
             before taking it",
        ));
    };
    let extra = extra(py, snapshot)?;
    let mut loader = Loader {
        py,
        trace: Trace::new(extra.source),
        frames_by_object: IntMap::default(),
        stacks_by_list: IntMap::default(),
        scratch: Vec::new(),
    };
    settings(py, snapshot, &mut loader.trace)?;
    let end = loader.segments(snapshot.get_item(intern!(py, "segments"))?)?;
    let start = match (&extra.start_segments, &extra.start_live) {
        (Some(list), _) => Some(loader.segments(Some(list.clone()))?),
        (None, Some(live)) => {
            let mut segments = Vec::new();
            for pair in live.try_iter()? {
                let pair: Vec<u64> = pair?
                    .extract()
                    .map_err(|_| bad("'memlab_rs.start.live' holds [address, bytes] pairs"))?;
                let [address, size] = pair[..] else {
                    return Err(bad("'memlab_rs.start.live' holds [address, bytes] pairs"));
                };
                segments.push((0, cpu_segment(address, size)));
            }
            Some(segments)
        }
        (None, None) => None,
    };
    for (device, entries) in traces
        .try_iter()
        .map_err(|_| bad("'device_traces' is not a list"))?
        .enumerate()
    {
        let mut events = loader.events(&entries?)?;
        let device = device as i32;
        let mut start_layout = start.as_ref().map(|all| on(all, device));
        if let (Some(t0), Source::Cuda) = (extra.start_time, extra.source) {
            // Our recording starts at the snapshot entry its start layout left in the history.
            let marker = extra
                .start_marker
                .as_deref()
                .map(|m| loader.trace.string(m));
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
                    loader.trace.notices.push(format!(
                        "device {device}: the start of the recording is no longer in the history \
                         (its ring buffer was full): allocations alive before the oldest entry \
                         are inferred; raise max_entries"
                    ));
                    start_layout = None;
                }
                None => {}
            }
        }
        let end_layout = on(&end, device);
        if events.is_empty() && end_layout.is_empty() {
            continue;
        }
        loader.trace.devices.push(DeviceTrace {
            device,
            events,
            end: end_layout,
            start: start_layout,
            dropped: extra.dropped,
        });
    }
    if extra.dropped > 0 {
        loader.trace.notices.push(format!(
            "{} oldest entries were dropped by the recorder (max_entries reached)",
            extra.dropped
        ));
    }
    if extra.no_stack > 0 {
        loader.trace.notices.push(format!(
            "{} entries were made by threads with no Python stack (torch's worker threads)",
            extra.no_stack
        ));
    }
    Ok(loader.trace)
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
