//! A snapshot dict (torch's `_snapshot()` schema, or our CPU recorder's, which follows it) into
//! plain records: the trace's collector, reading the Python objects the snapshot is made of
//! (its schema is torch's, so there is no derive to read it with). Frame dicts are interned
//! by identity: torch shares one dict per (code, instruction) across entries, and so does
//! pickle, so a 120,000-entry history touches each distinct frame's fields once.

use std::collections::HashMap;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::interrupts::text;
use crate::trace::error::bad;
use crate::trace::model::{Action, Event, IntMap, Source, Trace, NONE};
use crate::trace::parts::{Doc, Parts};

/// An int of any size up to i128's, or a ValueError naming what it is (a damaged snapshot's
/// value may be anything: extraction alone would give a TypeError or an OverflowError).
fn int_value(value: &Bound<'_, PyAny>, what: &str) -> PyResult<i128> {
    match value.extract::<i64>() {
        Ok(v) => Ok(v as i128),
        Err(_) => value
            .extract::<i128>()
            .map_err(|_| bad(&format!("{what} is not an integer of at most 38 digits")).into()),
    }
}

fn int(item: &Bound<'_, PyDict>, key: &Bound<'_, PyString>) -> PyResult<Option<i128>> {
    match item.get_item(key)? {
        Some(value) if !value.is_none() => Ok(Some(int_value(
            &value,
            &format!("a trace entry's {key:?}"),
        )?)),
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
                    // `text`, not `to_string()`: pyo3's Display swallows errors.
                    let filename = get(intern!(py, "filename"))?
                        .map(|v| text(&v))
                        .transpose()?
                        .unwrap_or_default();
                    let name = get(intern!(py, "name"))?
                        .map(|v| text(&v))
                        .transpose()?
                        .unwrap_or_default();
                    let line = match get(intern!(py, "line"))? {
                        Some(v) if !v.is_none() => int_value(&v, "a frame's 'line'")?,
                        _ => 0,
                    }
                    .clamp(0, u32::MAX as i128) as u32;
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
                None => return Err(bad("a trace entry has no 'action'").into()),
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

impl<'py> Doc for Loader<'py> {
    type Node = Bound<'py, PyAny>;
    type Error = PyErr;

    fn trace(&mut self) -> &mut Trace {
        &mut self.trace
    }

    fn is_none(&self, node: &Self::Node) -> bool {
        node.is_none()
    }

    fn is_dict(&self, node: &Self::Node) -> bool {
        node.cast::<PyDict>().is_ok()
    }

    fn get(&mut self, node: &Self::Node, key: &'static str) -> PyResult<Option<Self::Node>> {
        match node.cast::<PyDict>() {
            Ok(dict) => dict.get_item(PyString::intern(self.py, key)),
            Err(_) => Ok(None),
        }
    }

    fn int(&mut self, node: &Self::Node) -> PyResult<Option<i128>> {
        if node.is_none() {
            return Ok(None);
        }
        int_value(node, "a number of the snapshot").map(Some)
    }

    fn text(&mut self, node: &Self::Node) -> PyResult<String> {
        Ok(node.str()?.to_cow()?.into_owned())
    }

    fn truthy(&mut self, node: &Self::Node) -> PyResult<bool> {
        node.is_truthy()
    }

    fn items(&mut self, node: &Self::Node) -> PyResult<Option<Vec<Self::Node>>> {
        match node.try_iter() {
            Ok(iter) => Ok(Some(iter.collect::<PyResult<Vec<_>>>()?)),
            Err(_) => Ok(None),
        }
    }

    fn list_items(&mut self, node: &Self::Node) -> PyResult<Option<Vec<Self::Node>>> {
        Ok(node.cast::<PyList>().ok().map(|list| list.iter().collect()))
    }

    fn dict_values(&mut self, node: &Self::Node) -> PyResult<Option<Vec<Self::Node>>> {
        Ok(node
            .cast::<PyDict>()
            .ok()
            .map(|dict| dict.values().iter().collect()))
    }

    fn stack(&mut self, frames: Option<Self::Node>) -> PyResult<u32> {
        Loader::stack(self, frames)
    }
}

/// Read a snapshot dict into a `Trace`.
pub fn from_snapshot(py: Python<'_>, snapshot: &Bound<'_, PyAny>) -> PyResult<Trace> {
    let dict = snapshot
        .cast::<PyDict>()
        .map_err(|_| bad("it is not a dict"))?;
    let Some(traces) = dict.get_item(intern!(py, "device_traces"))? else {
        return Err(bad(
            "it has no 'device_traces': record with torch.cuda.memory._record_memory_history() \
             before taking it",
        )
        .into());
    };
    let mut loader = Loader {
        py,
        trace: Trace::new(Source::Cuda),
        frames_by_object: IntMap::default(),
        stacks_by_list: IntMap::default(),
        scratch: Vec::new(),
    };
    let parts = Parts::read(&mut loader, snapshot)?;
    for (device, entries) in traces
        .try_iter()
        .map_err(|_| bad("'device_traces' is not a list"))?
        .enumerate()
    {
        let events = loader.events(&entries?)?;
        parts.add_device(&mut loader.trace, device as i32, events);
    }
    parts.finish(&mut loader.trace);
    Ok(loader.trace)
}
