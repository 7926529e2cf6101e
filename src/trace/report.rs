//! A trace in, the analysed report out: block sizes, the peak and its live set, the rows by
//! location and by tag, per device. Pure: no Python, no I/O.

use super::blocks::{block_sizes, Sizes};
use super::group::{by_location, by_module, module_groups, Locator, ModuleGroups, Row};
use super::model::{Source, Trace};
use super::paths::Paths;
use super::peak::{peak, running_total, Peak};
use super::timeline::{timeline, Timeline};

pub struct DeviceReport {
    pub device: i32,
    pub peak: Peak,
    pub rows: Vec<Row>,
    /// Which module row each allocation of `peak.live` is in (every module view reads it).
    pub modules: ModuleGroups,
    /// The rows of the module view.
    pub tags: Vec<Row>,
    pub notices: Vec<String>,
    sizes: Sizes,
    totals: Vec<u64>,
}

pub struct Report {
    pub trace: Trace,
    /// The location key of every stack.
    pub locations: Vec<String>,
    /// How files are shown (rows and stacks alike).
    pub paths: Paths,
    pub devices: Vec<DeviceReport>,
}

impl Report {
    pub fn device_name(&self, device: i32) -> String {
        match self.trace.source {
            Source::Cpu => "cpu".to_owned(),
            Source::Cuda => format!("cuda:{device}"),
        }
    }

    /// Why a device's result may be incomplete: the whole trace's notices, then its own.
    pub fn notices(&self, device: &DeviceReport) -> Vec<String> {
        self.trace
            .notices
            .iter()
            .chain(&device.notices)
            .cloned()
            .collect()
    }

    pub fn find(&self, device: i32) -> Option<&DeviceReport> {
        self.devices.iter().find(|d| d.device == device)
    }

    /// The timeline of one device, with the `top` biggest locations at the peak as layers.
    pub fn timeline(&self, device: &DeviceReport, top: usize, max_points: usize) -> Timeline {
        let keys: Vec<String> = device
            .rows
            .iter()
            .take(top)
            .map(|r| r.key.clone())
            .collect();
        let trace_device = self
            .trace
            .devices
            .iter()
            .find(|d| d.device == device.device)
            .expect("a device report comes from a device trace");
        timeline(
            trace_device,
            &device.sizes,
            &device.totals,
            device.peak.start_bytes,
            &keys,
            &self.locations,
            max_points,
        )
    }
}

pub fn analyse(trace: Trace, locator: &Locator) -> Report {
    let paths = locator.paths.clone().recorded_in(trace.cwd.as_deref());
    let locations = locator.locations(&trace, &paths);
    let frame_tags = locator.frame_tags(&trace);
    let mut devices = Vec::new();
    for device in &trace.devices {
        let sizes = block_sizes(&trace, device);
        let (start, totals) = running_total(device, &sizes);
        let peak = peak(device, &sizes, &totals, start);
        let rows = by_location(&peak.live, &locations);
        let modules = module_groups(&trace, &peak.live, &frame_tags);
        let tags = by_module(&peak.live, &modules);
        let mut notices = Vec::new();
        if sizes.inferred_start && trace.source == Source::Cuda {
            notices.push(
                "what was allocated before the first entry is inferred from the entries and the \
                 end layout (record with memlab_rs.trace.Tracer to have it exactly)"
                    .to_owned(),
            );
        }
        if sizes.estimated > 0 {
            notices.push(format!(
                "{} allocations were in segments the history does not describe: their sizes are \
                 the requested sizes rounded to 512 bytes (the allocator may have handed out up \
                 to 1 MiB more)",
                sizes.estimated
            ));
        }
        if sizes.corrected > 0 {
            notices.push(format!(
                "{} replayed block sizes differed from the end layout and were corrected from it",
                sizes.corrected
            ));
        }
        if peak.unmatched_frees > 0 {
            notices.push(format!(
                "{} frees before the peak match no allocation the history holds",
                peak.unmatched_frees
            ));
        }
        devices.push(DeviceReport {
            device: device.device,
            peak,
            rows,
            modules,
            tags,
            notices,
            sizes,
            totals,
        });
    }
    Report {
        trace,
        locations,
        paths,
        devices,
    }
}
