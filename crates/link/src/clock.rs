//! Time sources for wrappers that hold or stamp frames, injectable so tests can run on
//! simulated time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of the current time, as a duration since the clock's own epoch.
pub trait Clock {
    /// Now. Must never go backwards for [`FaultInjector`](crate::FaultInjector) delays
    /// to be kept.
    fn now(&self) -> Duration;
}

/// Wall-clock time since the Unix epoch: what capture files record.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// Monotonic time since the clock was created: what delays are measured against.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock(Instant);

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// Simulated time that moves only when told; clones share the same time, so a test
/// keeps one handle and gives another to the wrapper.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(nanos(d), Ordering::Relaxed);
    }

    /// Sets the time (callers keep it monotonic).
    pub fn set(&self, t: Duration) {
        self.0.store(nanos(t), Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
