//! The leak check's result (kind `leaks`): how many steps were warm-up and how many measured,
//! and per device the sites whose live bytes grew at every measured step. The serde derive is
//! the saved file's `data` and the schema a loaded file is checked against.

use serde::{Deserialize, Serialize};

/// A leak check over `steps` measured steps after `warmup` warm-up steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeakReport {
    pub warmup: u32,
    pub steps: u32,
    pub devices: Vec<DeviceLeaks>,
}

/// One device's growing sites.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceLeaks {
    /// "cpu" or "cuda:N".
    pub device: String,
    /// The sites that grew at every measured step, fastest first.
    pub sites: Vec<Site>,
    /// Allocations recorded that outlived the step that made them (the analysis's input).
    pub outlived: u64,
    /// Why the figures may be incomplete, or why the device was not checked.
    #[serde(default)]
    pub notices: Vec<String>,
}

/// A source line whose allocations grow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Site {
    /// `file:line (function)`: the innermost frame of the user's own code.
    pub location: String,
    /// The growth per step: (live bytes at the end of the last step - at the end of the
    /// first) / (steps - 1); exact when every step added the same.
    pub bytes_per_step: f64,
    /// Its allocations' bytes alive at the end of each measured step (warm-up allocations
    /// still alive included).
    pub live_bytes: Vec<i64>,
    /// Its allocations alive at the end of the last step.
    pub allocations: u64,
}
