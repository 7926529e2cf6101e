//! The leak check's analysis, a pure function: allocations in (each with its stack, bytes, the
//! step that made it and the step that freed it), growing sites out.
//!
//! A site is the innermost frame of the user's own code in an allocation's stack, as
//! `file:line (function)` (`Locator`). Its live bytes at the end of step k are the bytes of
//! its allocations made at or before step k and not freed by its end. Steps are counted from
//! the first warm-up step: what warm-up made and a measured step freed lowers the site's
//! live bytes, so a cache that warm-up filled and that only turns over is steady, not
//! growing. A site grows when its live bytes rise at every measured step (strictly, at each
//! of the `steps - 1` step ends after the first); its growth per step is the rise from the
//! first measured step's end to the last's, divided by `steps - 1`: exact when every step
//! added the same. A steady loop (what a step makes is freed by the next) leaves every site
//! flat, and a site that rises and falls is not growing.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::result::{DeviceLeaks, LeakReport, Site};

/// What the Python side recorded, device by device (`_core.doctor.leaks_analyse`'s input).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    pub warmup: u32,
    /// Measured steps (at least 2: one step has no trend).
    pub steps: u32,
    /// Path parts whose frames are not the user's (torch, memlab_rs); `STDLIB` for the
    /// standard library.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Files under it are shown relative to it.
    #[serde(default)]
    pub cwd: Option<String>,
    pub devices: Vec<Recording>,
}

/// One device's recording.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recording {
    pub device: String,
    /// (filename, line, function).
    #[serde(default)]
    pub frames: Vec<(String, u32, String)>,
    /// Frame ids, innermost first.
    #[serde(default)]
    pub stacks: Vec<Vec<u32>>,
    /// (stack id or None, bytes, step made, step freed or None if alive at the end of the
    /// last step), steps counted from the first warm-up step. Allocations freed in the step
    /// that made them may be left out: they change no step's end.
    #[serde(default)]
    pub allocations: Vec<(Option<u32>, i64, u32, Option<u32>)>,
    #[serde(default)]
    pub notices: Vec<String>,
}

/// In `Input::exclude`: any CPython standard library (`.../lib/python3.N/` outside
/// site-packages).
pub const STDLIB: &str = "<stdlib>";
/// The site of an allocation recorded without a Python stack.
pub const NO_STACK: &str = "(no Python stack)";

/// Which frames are the user's, and how their files are shown.
pub struct Locator<'a> {
    pub exclude: &'a [String],
    pub cwd: Option<&'a str>,
}

impl Locator<'_> {
    fn excluded(&self, filename: &str) -> bool {
        // Frozen modules are the interpreter's own; other pseudo-files (<stdin>, <string>,
        // a doctest) are code the user typed.
        filename.starts_with("<frozen")
            || self.exclude.iter().any(|part| match part.as_str() {
                STDLIB => filename.contains("/lib/python3") && !filename.contains("-packages/"),
                part => filename.contains(part),
            })
    }

    fn show<'p>(&self, path: &'p str) -> &'p str {
        match self.cwd {
            Some(cwd) if !cwd.is_empty() => path
                .strip_prefix(cwd)
                .and_then(|rest| rest.strip_prefix('/'))
                .unwrap_or(path),
            _ => path,
        }
    }

    /// `file:line (function)` of the innermost frame not excluded (of the innermost frame
    /// when all are).
    pub fn location(&self, frames: &[&(String, u32, String)]) -> String {
        let chosen = frames
            .iter()
            .find(|(file, _, _)| !self.excluded(file))
            .or_else(|| frames.first());
        match chosen {
            Some((file, line, name)) => format!("{}:{line} ({name})", self.show(file)),
            None => NO_STACK.to_owned(),
        }
    }
}

/// One key's live bytes at the end of each measured step, and its allocations alive at the
/// end of the last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    pub bytes: Vec<i64>,
    pub alive_at_end: u64,
}

/// The live bytes of each key at the end of each measured step (`warmup..warmup + steps`,
/// counted from the first warm-up step). `allocations`: (key, bytes, step made, step freed).
pub fn live_by_key<K: Ord>(
    warmup: u32,
    steps: u32,
    allocations: impl IntoIterator<Item = (K, i64, u32, Option<u32>)>,
) -> Result<BTreeMap<K, Live>, String> {
    let total = warmup as usize + steps as usize;
    let mut deltas: BTreeMap<K, (Vec<i64>, u64)> = BTreeMap::new();
    for (i, (key, bytes, made, freed)) in allocations.into_iter().enumerate() {
        let made = made as usize;
        if bytes < 0 {
            return Err(format!(
                "allocation {i}: bytes must be 0 or more, got {bytes}"
            ));
        }
        if made >= total {
            return Err(format!(
                "allocation {i}: made in step {made}, but only {total} steps were recorded"
            ));
        }
        let freed = match freed {
            Some(f) if (f as usize) < made => {
                return Err(format!(
                    "allocation {i}: freed in step {f}, before the step that made it ({made})"
                ))
            }
            Some(f) if f as usize >= total => {
                return Err(format!(
                    "allocation {i}: freed in step {f}, but only {total} steps were recorded"
                ))
            }
            other => other.map(|f| f as usize),
        };
        let entry = deltas.entry(key).or_insert_with(|| (vec![0; total + 1], 0));
        entry.0[made] = entry.0[made].saturating_add(bytes);
        match freed {
            Some(f) => entry.0[f] = entry.0[f].saturating_sub(bytes),
            None => entry.1 += 1,
        }
    }
    Ok(deltas
        .into_iter()
        .map(|(key, (delta, alive_at_end))| {
            let mut running = 0i64;
            let ends: Vec<i64> = delta[..total]
                .iter()
                .map(|d| {
                    running = running.saturating_add(*d);
                    running
                })
                .collect();
            let bytes = ends[warmup as usize..].to_vec();
            (
                key,
                Live {
                    bytes,
                    alive_at_end,
                },
            )
        })
        .collect())
}

/// Whether live bytes at the end of each measured step rose at every step.
pub fn grows(live: &[i64]) -> bool {
    live.len() >= 2 && live.windows(2).all(|w| w[1] > w[0])
}

/// The growth per step: from the first measured step's end to the last's.
pub fn bytes_per_step(live: &[i64]) -> f64 {
    match live {
        [first, .., last] => (*last as f64 - *first as f64) / (live.len() - 1) as f64,
        _ => 0.0,
    }
}

/// The report: each device's growing sites, fastest first (then by location).
pub fn analyse(input: &Input) -> Result<LeakReport, String> {
    if input.steps < 2 {
        return Err(format!(
            "steps must be at least 2 (one step shows no trend), got {}",
            input.steps
        ));
    }
    let locator = Locator {
        exclude: &input.exclude,
        cwd: input.cwd.as_deref(),
    };
    let mut devices = Vec::with_capacity(input.devices.len());
    for recording in &input.devices {
        devices.push(
            device(input, recording, &locator)
                .map_err(|e| format!("devices[{}] ({}): {e}", devices.len(), recording.device))?,
        );
    }
    Ok(LeakReport {
        warmup: input.warmup,
        steps: input.steps,
        devices,
    })
}

fn device(input: &Input, recording: &Recording, locator: &Locator) -> Result<DeviceLeaks, String> {
    let frame = |id: u32| {
        recording
            .frames
            .get(id as usize)
            .ok_or_else(|| format!("frame {id} does not exist"))
    };
    let mut locations: Vec<String> = Vec::with_capacity(recording.stacks.len());
    for stack in &recording.stacks {
        let frames = stack
            .iter()
            .map(|&id| frame(id))
            .collect::<Result<Vec<_>, _>>()?;
        locations.push(locator.location(&frames));
    }
    // Locations as ids, so that the grouping hashes no strings per allocation.
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut names: Vec<&str> = Vec::new();
    let mut site_of_stack = Vec::with_capacity(locations.len());
    for location in &locations {
        let id = *ids.entry(location.as_str()).or_insert_with(|| {
            names.push(location.as_str());
            names.len() - 1
        });
        site_of_stack.push(id);
    }
    let no_stack = names.len();
    let mut keyed = Vec::with_capacity(recording.allocations.len());
    for (i, &(stack, bytes, made, freed)) in recording.allocations.iter().enumerate() {
        let site = match stack {
            None => no_stack,
            Some(s) => *site_of_stack
                .get(s as usize)
                .ok_or_else(|| format!("allocation {i}: stack {s} does not exist"))?,
        };
        keyed.push((site, bytes, made, freed));
    }
    let live = live_by_key(input.warmup, input.steps, keyed)?;
    let outlived = recording
        .allocations
        .iter()
        .filter(|a| a.3.is_none_or(|freed| freed > a.2))
        .count() as u64;
    let mut sites: Vec<Site> = live
        .into_iter()
        .filter(|(_, live)| grows(&live.bytes))
        .map(|(site, live)| Site {
            location: names.get(site).copied().unwrap_or(NO_STACK).to_owned(),
            bytes_per_step: bytes_per_step(&live.bytes),
            live_bytes: live.bytes,
            allocations: live.alive_at_end,
        })
        .collect();
    sites.sort_by(|a, b| {
        b.bytes_per_step
            .total_cmp(&a.bytes_per_step)
            .then_with(|| a.location.cmp(&b.location))
    });
    Ok(DeviceLeaks {
        device: recording.device.clone(),
        sites,
        outlived,
        notices: recording.notices.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(allocations: Vec<(Option<u32>, i64, u32, Option<u32>)>) -> Input {
        Input {
            warmup: 1,
            steps: 4,
            exclude: vec!["/torch/".into(), STDLIB.into()],
            cwd: Some("/home/me/project".into()),
            devices: vec![Recording {
                device: "cpu".into(),
                frames: vec![
                    (
                        "/venv/lib/python3.12/site-packages/torch/x.py".into(),
                        7,
                        "op".into(),
                    ),
                    ("/home/me/project/train.py".into(), 12, "step".into()),
                    ("/home/me/project/train.py".into(), 20, "step".into()),
                    (
                        "/usr/lib/python3.12/functools.py".into(),
                        3,
                        "wrapper".into(),
                    ),
                ],
                stacks: vec![vec![0, 1, 3], vec![2, 3]],
                allocations,
                notices: vec![],
            }],
        }
    }

    #[test]
    fn a_site_that_keeps_what_every_step_makes_grows_by_exactly_that() {
        // Stack 0 keeps 4096 bytes a step; stack 1 makes 100 bytes each step freed by the next.
        let mut allocations = vec![];
        for step in 0..5 {
            allocations.push((Some(0), 4096, step, None));
            let freed = if step < 4 { Some(step + 1) } else { None };
            allocations.push((Some(1), 100, step, freed));
        }
        let report = analyse(&input(allocations)).unwrap();
        let sites = &report.devices[0].sites;
        assert_eq!(sites.len(), 1);
        assert_eq!(sites[0].location, "train.py:12 (step)");
        assert_eq!(sites[0].bytes_per_step, 4096.0);
        assert_eq!(sites[0].live_bytes, [8192, 12288, 16384, 20480]);
        assert_eq!(sites[0].allocations, 5);
    }

    #[test]
    fn a_cache_warm_up_filled_that_turns_over_is_steady() {
        // A window of 2: each step's allocation freed two steps later.
        let allocations = (0..5)
            .map(|s| (Some(1), 64, s, if s + 2 < 5 { Some(s + 2) } else { None }))
            .collect();
        let report = analyse(&input(allocations)).unwrap();
        assert!(report.devices[0].sites.is_empty());
    }

    #[test]
    fn bad_input_names_the_allocation() {
        let error = analyse(&input(vec![(Some(0), 1, 3, Some(2))])).unwrap_err();
        assert!(error.contains("allocation 0: freed in step 2"), "{error}");
        let error = analyse(&input(vec![(Some(9), 1, 0, None)])).unwrap_err();
        assert!(error.contains("stack 9 does not exist"), "{error}");
        let mut one = input(vec![]);
        one.steps = 1;
        assert!(analyse(&one)
            .unwrap_err()
            .contains("steps must be at least 2"));
    }
}
