//! Time as the protocol cores see it: a value the caller passes in, never read from a
//! clock inside, so that tests can drive simulated time.

use std::ops::Add;
use std::time::Duration;

/// A point in time: nanoseconds since an epoch the caller chooses (e.g. when its
/// event loop started). Arithmetic saturates instead of wrapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub u64);

impl Time {
    /// The epoch.
    pub const ZERO: Time = Time(0);

    /// `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: u64) -> Time {
        Time(ms.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `n` nanoseconds later (saturating): `+ Duration` without making one.
    pub(crate) const fn after_nanos(self, n: u64) -> Time {
        Time(self.0.saturating_add(n))
    }

    /// How long after `earlier` this is; zero if it is not after it.
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// `d` in nanoseconds, saturating (past 584 years).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The earlier of two deadlines, either of which may be unset: deadlines
/// are combined pairwise with it, not through an iterator over options
/// (several times the instructions, on paths asked after every event).
pub(crate) fn earlier(a: Option<Time>, b: Option<Time>) -> Option<Time> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

impl Add<Duration> for Time {
    type Output = Time;

    fn add(self, d: Duration) -> Time {
        self.after_nanos(nanos(d))
    }
}
