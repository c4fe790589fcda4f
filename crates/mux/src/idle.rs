//! How a run loop waits for work: the Expert OS's interrupt-mitigation
//! trade-off, as NAPI and Linux's busy polling make it. While rounds find
//! work the loop never sleeps; once idle it polls on a while (yielding the
//! CPU between polls), then sleeps until the link or a doorbell wakes it.
//!
//! How long it polls on follows the work: a gap after which work came back
//! within [`RunConfig::idle_spin_max`] widens the spin to cover such gaps,
//! and gaps longer than that narrow it again towards
//! [`RunConfig::idle_spin`]. A wake-up costs tens of microseconds in a VM,
//! and a loop that sleeps just before the answer it is waiting for pays one
//! on every round trip; a loop whose gaps are long gains nothing by
//! spinning and keeps the short spin.

use std::time::{Duration, Instant};

/// How a run loop trades latency against CPU.
#[derive(Clone, Copy, Debug)]
pub struct RunConfig {
    /// Empty polls in a row before the loop reads the clock and starts to
    /// yield; while there is work it never sleeps.
    pub idle_spins: u32,
    /// How long the loop, once idle, keeps polling before it sleeps at
    /// least (as Linux's busy polling), yielding the CPU between polls: an
    /// answer that comes back within it finds the loop awake, not a CPU
    /// that must first be woken (slow in a VM).
    pub idle_spin: Duration,
    /// How long at most, when recent gaps in the work were that short.
    /// Through two daemons with direct send ports, a client's daemon no
    /// longer sees the request go out, and its idle stretch runs from the
    /// SYN-ACK it delivered to the answer: two application wake-ups later.
    /// At a fixed 50 µs it slept through most of them; at 150 µs the
    /// connection rate was higher in 10 of 12 paired runs (by a fifth on
    /// average); at 300 µs the longer spins took CPU the applications
    /// needed (2 CPUs, 4 processes).
    pub idle_spin_max: Duration,
    /// Longest sleep: the latency bound for work nobody signals (an
    /// application that published without a kick, a link without a
    /// descriptor).
    pub latency: Duration,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            idle_spins: 64,
            idle_spin: Duration::from_micros(50),
            idle_spin_max: Duration::from_micros(250),
            latency: Duration::from_millis(1),
        }
    }
}

/// How finely the gaps between work are told apart, up to
/// [`RunConfig::idle_spin_max`].
const GAP_BUCKETS: usize = 32;
/// Every so many gaps, the old ones count half: the window follows the
/// last few hundred.
const HALVE_EVERY: u32 = 256;
/// The window leaves at most one in so many of the recent gaps it could
/// cover uncovered. Their lengths vary within a round of work: the one
/// worth spinning for (the answer's, two wake-ups away) is one of several
/// shorter ones, and a window that followed their decaying maximum fell
/// below it between rounds.
const UNCOVERED: u32 = 64;

/// The waiting half of a run loop (see the [module documentation](self)).
#[derive(Clone, Copy, Debug)]
pub struct Idle {
    spins: u32,
    min: Duration,
    max: Duration,
    /// Empty rounds in a row.
    empty: u32,
    /// When the current idle stretch was first timed (once the cheap
    /// spins ran out); kept through a sleep, so that the work that ends it
    /// tells how long the gap was.
    since: Option<Instant>,
    /// The recent gaps that ended within `max`, by length (each bucket
    /// `max / GAP_BUCKETS` wide), halved every [`HALVE_EVERY`] gaps.
    gaps: [u32; GAP_BUCKETS],
    /// Gaps since the last halving.
    learned: u32,
    /// How long the loop polls on, once idle, before it sleeps.
    window: Duration,
}

impl Idle {
    pub fn new(config: RunConfig) -> Idle {
        let min = config.idle_spin;
        Idle {
            spins: config.idle_spins,
            min,
            max: config.idle_spin_max.max(min),
            empty: 0,
            since: None,
            gaps: [0; GAP_BUCKETS],
            learned: 0,
            window: min,
        }
    }

    /// Whether the loop has run out of cheap spins: each further empty
    /// round yields, and is slow enough for a system call more.
    pub fn yielding(&self) -> bool {
        self.empty >= self.spins
    }

    /// After a round that did `work`: whether to sleep now (spinning once
    /// otherwise). Once the cheap count has run out, each further empty round
    /// yields the CPU: a thread woken on this CPU (the application this loop
    /// serves, another multiplexer) runs at once instead of waiting out the
    /// spin, which otherwise serializes them (on two CPUs, two daemons' loops
    /// spinning 50 µs each took the connection rate from ~4,700 to ~1,550 a
    /// second); with nothing else to run, the yield returns at once.
    pub fn should_sleep(&mut self, work: usize) -> bool {
        let sleep = self.step(work, Instant::now);
        if !sleep && work == 0 {
            if self.yielding() {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        sleep
    }

    /// [`should_sleep`](Self::should_sleep) on the clock `now`, read only
    /// where the cheap count has run out or an idle stretch ends.
    fn step(&mut self, work: usize, now: impl FnOnce() -> Instant) -> bool {
        if work > 0 {
            if let Some(since) = self.since.take() {
                self.learn(now().saturating_duration_since(since));
            }
            self.empty = 0;
            return false;
        }
        self.empty = self.empty.saturating_add(1);
        if self.empty < self.spins {
            return false;
        }
        let now = now();
        let since = *self.since.get_or_insert(now);
        if now.saturating_duration_since(since) < self.window {
            return false;
        }
        self.empty = 0;
        true
    }

    /// Work came back after an idle stretch of `gap`.
    fn learn(&mut self, gap: Duration) {
        let max = self.max.as_nanos();
        if gap.as_nanos() <= max {
            let b = gap.as_nanos() * GAP_BUCKETS as u128 / (max + 1);
            self.gaps[b as usize] += 1;
        }
        self.learned += 1;
        if self.learned == HALVE_EVERY {
            self.learned = 0;
            for g in &mut self.gaps {
                *g /= 2;
            }
        }
        // The window: the least that covers all but a few of the recent
        // gaps it could cover, as one such gap slept through costs a
        // wake-up on a round trip.
        let mut spare = self.gaps.iter().sum::<u32>() / UNCOVERED;
        let mut k = GAP_BUCKETS;
        while k > 0 && self.gaps[k - 1] <= spare {
            spare -= self.gaps[k - 1];
            k -= 1;
        }
        self.window = (self.max * k as u32 / GAP_BUCKETS as u32).clamp(self.min, self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn config(idle_spins: u32) -> RunConfig {
        RunConfig {
            idle_spins,
            idle_spin: us(50),
            idle_spin_max: us(250),
            latency: us(1000),
        }
    }

    /// An idle loop that reads the clock from its first empty round.
    fn idle() -> Idle {
        Idle::new(config(1))
    }

    /// Runs empty rounds from `t0` (each 1 µs later) until `idle` would
    /// sleep, within `limit` rounds; returns when it would, if it did.
    fn rounds_until_sleep(idle: &mut Idle, t0: Instant, limit: u64) -> Option<Duration> {
        (0..limit).find_map(|i| {
            let t = t0 + us(i);
            idle.step(0, || t).then_some(t - t0)
        })
    }

    /// An idle stretch of `gap` from `t0`, slept through if it is longer
    /// than the window, then ended by work.
    fn gap(idle: &mut Idle, t0: Instant, gap: Duration) {
        let _ = rounds_until_sleep(idle, t0, gap.as_micros() as u64);
        assert!(!idle.step(1, || t0 + gap));
    }

    #[test]
    fn an_idle_loop_polls_its_window_then_sleeps() {
        let mut i = idle();
        let t0 = Instant::now();
        assert_eq!(rounds_until_sleep(&mut i, t0, 1000), Some(us(50)));
        // The gap runs on through the sleep: work 60 µs in widens the
        // window to cover it (to its bucket's top, 250/32 µs wide).
        assert!(!i.step(1, || t0 + us(60)));
        assert_eq!(i.window, Duration::from_nanos(62_500));
    }

    #[test]
    fn the_cheap_spins_read_no_clock_and_teach_nothing() {
        let mut i = Idle::new(config(3));
        let t0 = Instant::now();
        assert!(!i.step(0, || unreachable!("a clock read")));
        assert!(!i.yielding());
        assert!(!i.step(1, || unreachable!("a clock read")));
        assert_eq!(i.window, us(50));
        // The third empty round reads it first: the window runs from there.
        assert_eq!(rounds_until_sleep(&mut i, t0, 1000), Some(us(52)));
    }

    #[test]
    fn gaps_slept_through_widen_the_window_to_cover_them() {
        let mut i = idle();
        let t0 = Instant::now();
        gap(&mut i, t0, us(120));
        assert_eq!(i.window, us(125));
        // The next such gap is caught awake.
        let t1 = t0 + us(1000);
        assert_eq!(rounds_until_sleep(&mut i, t1, 110), None);
        assert!(!i.step(1, || t1 + us(110)));
        assert_eq!(i.window, us(125));
        // Never past the most, and longer gaps do not count.
        gap(&mut i, t1 + us(1000), us(300));
        assert_eq!(i.window, us(125));
        gap(&mut i, t1 + us(2000), us(250));
        assert_eq!(i.window, us(250));
    }

    #[test]
    fn a_few_longer_gaps_among_many_are_slept_through() {
        let mut i = idle();
        let mut t = Instant::now();
        for n in 0..200 {
            t += us(1000);
            gap(&mut i, t, us(if n % 100 == 0 { 240 } else { 80 }));
        }
        // 2 in 200: left to a wake-up each; the window covers the 80 µs.
        assert_eq!(i.window, Duration::from_nanos(85_937));
        for _ in 0..8 {
            t += us(1000);
            gap(&mut i, t, us(240));
        }
        // 10 in 208 are too many to leave.
        assert_eq!(i.window, Duration::from_nanos(242_187));
    }

    #[test]
    fn long_gaps_narrow_it_back_to_the_least() {
        let mut i = idle();
        let mut t = Instant::now();
        gap(&mut i, t, us(200));
        assert_eq!(i.window, Duration::from_nanos(203_125));
        let mut windows = Vec::new();
        for _ in 0..HALVE_EVERY {
            t += us(20_000);
            gap(&mut i, t, us(5_000));
            windows.push(i.window);
        }
        assert!(windows.windows(2).all(|w| w[1] <= w[0]), "{windows:?}");
        assert_eq!(*windows.last().unwrap(), us(50));
        // A short gap among them widens it again.
        gap(&mut i, t + us(20_000), us(90));
        assert_eq!(i.window, Duration::from_nanos(93_750));
    }

    #[test]
    fn a_least_above_the_most_is_the_one_window() {
        let mut i = Idle::new(RunConfig {
            idle_spins: 1,
            idle_spin: us(80),
            idle_spin_max: us(10),
            latency: us(1000),
        });
        let t0 = Instant::now();
        gap(&mut i, t0, us(70));
        assert_eq!(i.window, us(80));
        // A clock that goes back counts as no time.
        assert!(!i.step(0, || t0 + us(5000)));
        assert!(!i.step(1, || t0));
        assert_eq!(i.window, us(80));
    }
}
