//! The live set at the peak, grouped: by location (the innermost frame of the user's own
//! code), by module and phase (the tag recorded with each allocation), by keyword, by line.

use std::collections::HashMap;

use super::model::{StackId, Trace, NONE};
use super::paths::Paths;
use super::peak::Live;
use super::result::{LineBytes, Options, Shown};

pub const UNTRACED: &str = "untraced";
pub const NO_STACK: &str = "(no Python stack)";
pub const UNTAGGED: &str = "(untagged)";

/// In `Locator::exclude`: any CPython standard library (`.../lib/python3.N/` outside
/// site-packages), so that snapshots from other machines locate the same way.
pub const STDLIB: &str = "<stdlib>";

fn is_stdlib(filename: &str) -> bool {
    filename.contains("/lib/python3") && !filename.contains("-packages/")
}

/// Which frames are not "the user's": files whose path contains one of these parts (torch,
/// the standard library, memlab_rs by default; `STDLIB` for any standard library) and
/// pseudo-files such as `<frozen importlib._bootstrap>`. `paths`: how files are shown (the
/// reader's choice; a recording's own working directory replaces the reader's).
#[derive(Clone, Debug, Default)]
pub struct Locator {
    pub exclude: Vec<String>,
    pub paths: Paths,
}

impl From<Options> for Locator {
    fn from(options: Options) -> Locator {
        let paths = match options.paths {
            Shown::Full => Paths::Full,
            Shown::Short => Paths::Short { cwd: options.cwd },
        };
        Locator {
            exclude: options.exclude,
            paths,
        }
    }
}

impl Locator {
    fn excluded(&self, filename: &str) -> bool {
        filename.starts_with('<')
            || self.exclude.iter().any(|part| match part.as_str() {
                STDLIB => is_stdlib(filename),
                part => filename.contains(part),
            })
    }

    /// The location of every stack: `path:line (function)` of its innermost frame outside
    /// the excluded files, or of its innermost frame when all are excluded; the path as
    /// `paths` shows it (exclusion reads the full path).
    pub fn locations(&self, trace: &Trace, paths: &Paths) -> Vec<String> {
        let mut by_file: HashMap<u32, bool> = HashMap::new();
        trace
            .stacks
            .iter()
            .map(|frames| {
                let chosen = frames
                    .iter()
                    .copied()
                    .find(|&f| {
                        let file = trace.frames[f as usize].filename;
                        !*by_file
                            .entry(file)
                            .or_insert_with(|| self.excluded(trace.text(file)))
                    })
                    .or_else(|| frames.first().copied());
                match chosen {
                    Some(f) => {
                        let frame = trace.frames[f as usize];
                        format!(
                            "{}:{} ({})",
                            paths.show(trace.text(frame.filename)),
                            frame.line,
                            trace.text(frame.name)
                        )
                    }
                    None => NO_STACK.to_owned(),
                }
            })
            .collect()
    }
}

impl Locator {
    /// A `phase:module` tag for every stack, read from its frames, for allocations that
    /// carry no recorded tag. The phase: `backward` under `Tensor.backward` or
    /// `autograd.backward`/`grad`, `optimizer` inside `torch/optim/`, `forward` inside a
    /// module call; the module: the innermost user frame named `forward`, shown as
    /// `[file:line (forward)]` (frames name no module path). "" when nothing says.
    pub fn frame_tags(&self, trace: &Trace) -> Vec<String> {
        trace
            .stacks
            .iter()
            .map(|frames| {
                let mut phase = "";
                let mut module: Option<String> = None;
                for &f in frames {
                    let frame = trace.frames[f as usize];
                    let file = trace.text(frame.filename);
                    let name = trace.text(frame.name);
                    if module.is_none() && name == "forward" && !self.excluded(file) {
                        let base = file.rsplit('/').next().unwrap_or(file);
                        module = Some(format!("[{base}:{} (forward)]", frame.line));
                    }
                    let here = if (name == "backward" || name == "grad")
                        && (file.ends_with("torch/_tensor.py")
                            || file.ends_with("torch/autograd/__init__.py"))
                    {
                        "backward"
                    } else if file.contains("torch/optim/") {
                        "optimizer"
                    } else if name == "_call_impl" && file.ends_with("torch/nn/modules/module.py") {
                        "forward"
                    } else {
                        ""
                    };
                    // The outermost phase wins: a module called by an optimizer's closure
                    // is still the optimizer step's.
                    if !here.is_empty() {
                        phase = here;
                    }
                }
                match (phase, module) {
                    ("", None) => String::new(),
                    (phase, Some(m)) => format!("{phase}:{m}"),
                    (phase, None) => format!("{phase}:"),
                }
            })
            .collect()
    }
}

/// One row of the peak table (in what crosses to Python, a JSON object of these fields).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Row {
    pub key: String,
    pub bytes: u64,
    pub cumulative: u64,
    /// The middle size (the upper one of an even count), as the peak tracer prints.
    pub median: u64,
    pub count: u64,
}

fn rows_from(groups: HashMap<String, Vec<u64>>) -> Vec<Row> {
    let mut rows: Vec<Row> = groups
        .into_iter()
        .map(|(key, mut sizes)| {
            sizes.sort_unstable();
            Row {
                bytes: sizes.iter().sum(),
                median: sizes[sizes.len() / 2],
                count: sizes.len() as u64,
                cumulative: 0,
                key,
            }
        })
        .collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.key.cmp(&b.key)));
    let mut cumulative = 0;
    for row in &mut rows {
        cumulative += row.bytes;
        row.cumulative = cumulative;
    }
    rows
}

fn location_of(locations: &[String], stack: StackId) -> &str {
    if stack == NONE {
        NO_STACK
    } else {
        &locations[stack as usize]
    }
}

/// The live set by location; what was alive before recording began is one row, `untraced`.
pub fn by_location(live: &[Live], locations: &[String]) -> Vec<Row> {
    let mut groups: HashMap<String, Vec<u64>> = HashMap::new();
    for l in live {
        let key = if l.untraced {
            UNTRACED
        } else {
            location_of(locations, l.stack)
        };
        groups.entry(key.to_owned()).or_default().push(l.bytes);
    }
    rows_from(groups)
}

/// The phases a `phase:module` tag names (the module tagger's and `frame_tags`').
const PHASES: [&str; 3] = ["forward:", "backward:", "optimizer:"];

/// What an empty module after a phase is shown as: memory of that phase made in no module
/// the trace can name (the model's own code around its submodules, whose path in
/// `named_modules()` is empty; autograd's nodes outside any module's backward; an
/// allocation whose frames show the phase but no user `forward`).
pub const NO_MODULE: &str = "(no module)";

/// The module view's key for a tag: `phase:` alone becomes `phase:(no module)`; any other
/// tag (a module's, a user's own `_set_memory_metadata` text) is kept as it is.
fn module_key(tag: &str) -> String {
    if PHASES.contains(&tag) {
        format!("{tag}{NO_MODULE}")
    } else {
        tag.to_owned()
    }
}

/// Which row of the module view each allocation alive at the peak is in: decided once per
/// device, here, and read by every module view (the rows, their text, CSV, JSON and HTML,
/// the keyword groups, the untagged log), so no two of them can disagree.
#[derive(Clone, Debug, Default)]
pub struct ModuleGroups {
    /// The row keys, in the order first met.
    pub keys: Vec<String>,
    /// For each allocation of the live set (in its order), the index of its key.
    pub of_live: Vec<u32>,
}

impl ModuleGroups {
    /// The key of the `i`th allocation of the live set.
    pub fn key_of(&self, i: usize) -> &str {
        &self.keys[self.of_live[i] as usize]
    }
}

/// Each allocation of the live set gets, in this order: if it was alive before recording
/// began, `untraced:<name>` with the name the Tracer found for it (`Trace::start_names`),
/// else `untraced`; its recorded tag; the tag its frames give (`frame_tags`); else
/// `(untagged)`. Tags pass through `module_key`.
pub fn module_groups(trace: &Trace, live: &[Live], frame_tags: &[String]) -> ModuleGroups {
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut groups = ModuleGroups::default();
    for l in live {
        let from_frames = if l.stack == NONE {
            ""
        } else {
            frame_tags[l.stack as usize].as_str()
        };
        let key = if l.untraced {
            match trace.start_names.get(&l.addr) {
                Some(&name) => format!("{UNTRACED}:{}", trace.text(name)),
                None => UNTRACED.to_owned(),
            }
        } else if l.tag != NONE && !trace.text(l.tag).is_empty() {
            module_key(trace.text(l.tag))
        } else if !from_frames.is_empty() {
            module_key(from_frames)
        } else {
            UNTAGGED.to_owned()
        };
        let next = groups.keys.len() as u32;
        let id = *index.entry(key).or_insert_with_key(|key| {
            groups.keys.push(key.clone());
            next
        });
        groups.of_live.push(id);
    }
    groups
}

/// The live set by module (`phase:module path`), as `groups` assigns it.
pub fn by_module(live: &[Live], groups: &ModuleGroups) -> Vec<Row> {
    let mut sizes: HashMap<String, Vec<u64>> = HashMap::new();
    for (i, l) in live.iter().enumerate() {
        sizes
            .entry(groups.key_of(i).to_owned())
            .or_default()
            .push(l.bytes);
    }
    rows_from(sizes)
}

/// Keyword groups, the tagging profiler's way: each row goes to the first group with a
/// keyword in its key; `Others` takes the rest. (`Untrackable`, what an expected total leaves,
/// is the caller's: only Python knows what the driver reads now.)
pub fn by_keyword(rows: &[Row], groups: &[(String, Vec<String>)]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = groups.iter().map(|(g, _)| (g.clone(), 0)).collect();
    let mut others: u64 = 0;
    for row in rows {
        match groups
            .iter()
            .position(|(_, words)| words.iter().any(|w| row.key.contains(w.as_str())))
        {
            Some(i) => out[i].1 += row.bytes,
            None => others += row.bytes,
        }
    }
    out.push(("Others".to_owned(), others));
    out
}

/// Bytes alive at the peak per source line, counting an allocation under every line of its
/// stack (each line once), as the line profiler counts what a line's callees allocate; by
/// file and line.
pub fn by_line(trace: &Trace, live: &[Live]) -> Vec<LineBytes> {
    let mut per_stack: HashMap<StackId, u64> = HashMap::new();
    for l in live.iter().filter(|l| !l.untraced && l.stack != NONE) {
        *per_stack.entry(l.stack).or_default() += l.bytes;
    }
    let mut out: HashMap<(String, u32), u64> = HashMap::new();
    let mut seen: Vec<(u32, u32)> = Vec::new();
    for (stack, bytes) in per_stack {
        seen.clear();
        for &f in trace.frames_of(stack) {
            let frame = trace.frames[f as usize];
            let key = (frame.filename, frame.line);
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            *out.entry((trace.text(frame.filename).to_owned(), frame.line))
                .or_default() += bytes;
        }
    }
    let mut lines: Vec<LineBytes> = out
        .into_iter()
        .map(|((filename, line), bytes)| LineBytes {
            filename,
            line,
            bytes,
        })
        .collect();
    lines.sort_by(|a, b| (&a.filename, a.line).cmp(&(&b.filename, b.line)));
    lines
}
