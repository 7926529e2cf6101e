//! A trace in, the analysed report out: block sizes, the peak and its live set, the rows by
//! location and by tag, per device. Pure: no Python, no I/O.

use super::blocks::{block_sizes, Sizes};
use super::group::{by_location, by_module, module_groups, Locator, ModuleGroups, Row};
use super::model::{Source, Trace};
use super::paths::Paths;
use super::peak::{peak, running_total, Peak};
use super::result::{About, Device, Summary, TimelineView};
use super::timeline::timeline;

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

    /// Where the recording was, and its devices with recorded allocations.
    pub fn about(&self) -> About {
        About {
            source: self.trace.source,
            devices: self
                .devices
                .iter()
                .map(|d| Device {
                    index: d.device,
                    name: self.device_name(d.device),
                })
                .collect(),
        }
    }

    /// The peak figures of one device.
    pub fn summary(&self, device: &DeviceReport) -> Summary {
        let events = self
            .trace
            .devices
            .iter()
            .find(|t| t.device == device.device)
            .map_or(0, |t| t.events.len());
        Summary {
            max_mem: device.peak.max_bytes,
            total_allocated: device.peak.total_allocated,
            start_allocated: device.peak.start_bytes,
            end_allocated: device.peak.end_bytes,
            peak_time_us: device.peak.peak_time_us,
            peak_event: device.peak.peak_event,
            live_at_peak: device.peak.live.len(),
            events,
        }
    }

    /// The timeline of one device, with the `top` biggest locations at the peak as layers,
    /// as the renderers draw it: titled with the device, with its notices.
    pub fn timeline(&self, device: &DeviceReport, top: usize, max_points: usize) -> TimelineView {
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
        let t = timeline(
            trace_device,
            &device.sizes,
            &device.totals,
            device.peak.start_bytes,
            &keys,
            &self.locations,
            max_points,
        );
        TimelineView {
            title: self.device_name(device.device),
            time_us: t.time_us,
            total: t.total,
            layers: t.layers,
            peak_index: t.peak_index,
            peak_bytes: t.peak_bytes,
            notices: self.notices(device),
        }
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
