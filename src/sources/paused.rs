//! Reserved but not on the device: bytes that torch's caching allocator counts as reserved
//! on a CUDA device while no device memory is behind them, because they are segments of a
//! paused Courtesy region (`courtesy::region` writes the figure after each pause, resume
//! and freed segment). The tensor report reads it to say why the driver shows less than
//! torch reserves. A floor, so that neither room uses the other.

use std::collections::BTreeMap;
use std::sync::Mutex;

static PAUSED: Mutex<BTreeMap<i32, u64>> = Mutex::new(BTreeMap::new());

/// The paused bytes of every device now (devices not listed have none).
pub fn publish(paused: BTreeMap<i32, u64>) {
    let mut guard = PAUSED.lock().unwrap_or_else(|p| p.into_inner());
    *guard = paused;
}

/// Paused region bytes on CUDA device `device`.
pub fn paused_bytes(device: i32) -> u64 {
    let guard = PAUSED.lock().unwrap_or_else(|p| p.into_inner());
    guard.get(&device).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_figures_published_are_read() {
        publish(BTreeMap::from([(0, 10), (2, 30)]));
        assert_eq!(
            (paused_bytes(0), paused_bytes(1), paused_bytes(2)),
            (10, 0, 30)
        );
        publish(BTreeMap::new());
        assert_eq!(paused_bytes(2), 0);
    }
}
