//! When a direct reader in use is checked against torch: every `every` samples or every
//! `period`, whichever comes first.
//!
//! A check costs one binding call (10 to 20 us on an H100) and a sample about 0.75 us, so
//! a check every 4096 samples or every second adds well under 1% to a line event. The
//! clock (about 20 ns per `Instant::now()`) is read only every `CLOCK_EVERY` samples.

use std::time::{Duration, Instant};

/// Samples between checks unless `MEMLAB_RS_CUDA_REVALIDATE_SAMPLES` says otherwise.
pub const DEFAULT_EVERY: u32 = 4096;
/// The longest time between checks while samples keep coming.
pub const PERIOD: Duration = Duration::from_secs(1);
/// How often (in samples) the clock is looked at.
pub const CLOCK_EVERY: u32 = 64;
/// Sets the samples between checks (1 checks every sample: for tests).
pub const ENV: &str = "MEMLAB_RS_CUDA_REVALIDATE_SAMPLES";

/// Counts samples and says when the next check is due.
#[derive(Clone, Debug)]
pub struct Schedule {
    every: u32,
    period: Duration,
    /// Samples since the last check.
    since: u32,
    /// When the last check was made.
    last: Instant,
}

impl Schedule {
    pub fn new(every: u32, period: Duration, now: Instant) -> Self {
        Self {
            every: every.max(1),
            period,
            since: 0,
            last: now,
        }
    }

    /// Count one sample; true when a check is due. `now` is called at most once, and only
    /// on every `CLOCK_EVERY`th sample.
    pub fn tick(&mut self, now: impl FnOnce() -> Instant) -> bool {
        self.since = self.since.saturating_add(1);
        if self.since >= self.every {
            return true;
        }
        self.since % CLOCK_EVERY == 0 && now().saturating_duration_since(self.last) >= self.period
    }

    /// A check was made at `now`: the next one is a full interval away.
    pub fn checked(&mut self, now: Instant) {
        self.since = 0;
        self.last = now;
    }
}

/// The samples between checks, from the value of `ENV` (None: not set).
pub fn every_from(value: Option<&str>) -> Result<u32, String> {
    let Some(text) = value else {
        return Ok(DEFAULT_EVERY);
    };
    match text.trim().parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{ENV}={text:?} is not a number of samples: set it to a whole number >= 1 \
             (1 checks every sample), or unset it for the default of {DEFAULT_EVERY}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> Instant {
        panic!("the clock must not be read here")
    }

    #[test]
    fn due_after_every_samples() {
        let start = Instant::now();
        let mut s = Schedule::new(5, Duration::from_secs(3600), start);
        let due: Vec<bool> = (0..12).map(|_| s.tick(|| start)).collect();
        // Due from the 5th sample on until a check is recorded.
        assert_eq!(&due[..5], &[false, false, false, false, true]);
        assert!(due[5..].iter().all(|&d| d));
        s.checked(start);
        assert!(!s.tick(never));
    }

    #[test]
    fn every_one_checks_every_sample() {
        let start = Instant::now();
        let mut s = Schedule::new(1, PERIOD, start);
        for _ in 0..10 {
            assert!(s.tick(never));
            s.checked(start);
        }
    }

    #[test]
    fn zero_is_treated_as_one() {
        let start = Instant::now();
        let mut s = Schedule::new(0, PERIOD, start);
        assert!(s.tick(never));
    }

    #[test]
    fn clock_read_only_every_clock_every_samples() {
        let start = Instant::now();
        let mut s = Schedule::new(1_000_000, Duration::from_secs(1), start);
        let late = start + Duration::from_secs(5);
        for _ in 1..CLOCK_EVERY {
            assert!(!s.tick(never));
        }
        // The 64th sample looks at the clock: a second has passed, so a check is due.
        assert!(s.tick(|| late));
        s.checked(late);
        for _ in 1..CLOCK_EVERY {
            assert!(!s.tick(never));
        }
        // Less than a period since the last check: not due.
        assert!(!s.tick(|| late + Duration::from_millis(999)));
        for _ in 1..CLOCK_EVERY {
            assert!(!s.tick(never));
        }
        assert!(s.tick(|| late + Duration::from_millis(1000)));
    }

    #[test]
    fn samples_win_when_they_come_first() {
        let start = Instant::now();
        let mut s = Schedule::new(100, Duration::from_secs(3600), start);
        let due = (1..=100).find(|_| s.tick(|| start)).unwrap();
        assert_eq!(due, 100);
    }

    #[test]
    fn a_clock_going_backwards_is_not_a_due_check() {
        let start = Instant::now() + Duration::from_secs(10);
        let mut s = Schedule::new(1_000_000, Duration::from_secs(1), start);
        for _ in 1..CLOCK_EVERY {
            s.tick(never);
        }
        assert!(!s.tick(|| start - Duration::from_secs(5)));
    }

    #[test]
    fn env_values() {
        assert_eq!(every_from(None), Ok(DEFAULT_EVERY));
        assert_eq!(every_from(Some("64")), Ok(64));
        assert_eq!(every_from(Some(" 1 ")), Ok(1));
        for bad in ["0", "-3", "abc", "", "1.5"] {
            let error = every_from(Some(bad)).unwrap_err();
            assert!(error.contains(ENV) && error.contains(">= 1"), "{error}");
        }
    }
}
