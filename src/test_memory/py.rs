//! Python entry points of the test-memory renderers (the pytest plugin's result).

use pyo3::prelude::*;

use super::render::{text, Measurement, Peak, Row};

/// One measurement as Python passes it: (device, peak bytes, bytes at the call's start,
/// limit bytes or None, rows as (location, bytes, count), notices).
pub type MeasurementTuple = (
    String,
    i64,
    i64,
    Option<i64>,
    Vec<(String, i64, i64)>,
    Vec<String>,
);

fn measurement(m: MeasurementTuple) -> Measurement {
    let (device, peak_bytes, start_bytes, limit_bytes, rows, notices) = m;
    Measurement {
        device,
        peak_bytes,
        start_bytes,
        limit_bytes,
        rows: rows
            .into_iter()
            .map(|(location, bytes, count)| Row {
                location,
                bytes,
                count,
            })
            .collect(),
        notices,
    }
}

/// A test's result as text: its node id, outcome, and each device measured.
#[pyfunction]
pub fn _test_memory_text(
    nodeid: &str,
    outcome: &str,
    measurements: Vec<MeasurementTuple>,
) -> String {
    let measurements: Vec<Measurement> = measurements.into_iter().map(measurement).collect();
    text::render(nodeid, outcome, &measurements)
}

/// The failure message of a test over its limit (`marker` as the test wrote it), with the
/// `top` biggest rows alive at the peak.
#[pyfunction]
pub fn _test_memory_limit_text(m: MeasurementTuple, marker: &str, top: usize) -> String {
    text::limit_exceeded(&measurement(m), marker, top)
}

/// The session's table of one device's highest peaks: (node id, peak bytes, limit bytes or
/// None, outcome), highest first, out of `measured` tests.
#[pyfunction]
pub fn _test_memory_top_table(
    device: &str,
    peaks: Vec<(String, i64, Option<i64>, String)>,
    measured: usize,
) -> String {
    let peaks: Vec<Peak> = peaks
        .into_iter()
        .map(|(nodeid, peak_bytes, limit_bytes, outcome)| Peak {
            nodeid,
            peak_bytes,
            limit_bytes,
            outcome,
        })
        .collect();
    text::top_table(device, &peaks, measured)
}
