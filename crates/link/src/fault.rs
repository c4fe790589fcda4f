//! Fault injection over any link: loss, duplication, reordering, bit corruption and
//! delay, each at a rate, in each direction, reproducible from a seed.
//!
//! Each frame is judged once, in this order: lost (`loss_rate`); else one random bit
//! is flipped (`corrupt_rate`); it is sent twice (`duplicate_rate`, the copy right
//! after the original); it is held for [`Faults::delay`] (`delay_rate`); else it is
//! held back until a later frame has passed it, but never longer than
//! [`Faults::delay`] (`reorder_rate`). Held frames are due against an injectable
//! [`Clock`], so tests run on simulated time; [`Link::poll_timeout`] says when the
//! next one is due.
//!
//! Frames that pass untouched are lent straight through; only held, duplicated or
//! corrupted received frames are copied.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use exonet_wire::rng::SplitMix64;

use crate::{sendable, Clock, Direction, Link, LinkStats, MonotonicClock};

/// Fault rates for one direction; each rate is a probability per frame in `[0, 1]`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Frames lost.
    pub loss_rate: f64,
    /// Frames sent twice.
    pub duplicate_rate: f64,
    /// Frames with one bit flipped.
    pub corrupt_rate: f64,
    /// Frames held back until a later frame has overtaken them.
    pub reorder_rate: f64,
    /// Frames held for [`delay`](Faults::delay).
    pub delay_rate: f64,
    /// How long a delayed frame is held, and the longest a reordered frame waits to be
    /// overtaken (zero: it waits at most until the next call).
    pub delay: Duration,
}

/// What a fault injector did in one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames judged.
    pub frames: u64,
    /// Frames lost.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Frames with a bit flipped.
    pub corrupted: u64,
    /// Frames held back to be overtaken.
    pub reordered: u64,
    /// Frames delayed.
    pub delayed: u64,
}

/// Spare buffers kept for held frames; more are freed.
const SPARE_BUFFERS: usize = 256;

#[derive(Debug)]
struct Held {
    due: Duration,
    /// Released as soon as a later frame passes.
    overtake: bool,
    copies: usize,
    data: Vec<u8>,
}

enum Verdict {
    Drop,
    Hold,
    /// Emit now, `copies` times, after flipping this bit if any.
    Pass {
        copies: usize,
        flip: Option<usize>,
    },
}

/// One direction's faults and the frames it holds.
#[derive(Debug)]
struct Lane {
    cfg: Faults,
    rng: SplitMix64,
    /// In arrival order, so due times never decrease along it.
    held: VecDeque<Held>,
    /// Released frames, to be emitted before anything new.
    ready: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    stats: FaultStats,
}

impl Lane {
    fn new(seed: u64) -> Lane {
        Lane {
            cfg: Faults::default(),
            rng: SplitMix64::new(seed),
            held: VecDeque::new(),
            ready: VecDeque::new(),
            spare: Vec::new(),
            stats: FaultStats::default(),
        }
    }

    fn copy(&mut self, frame: &[u8]) -> Vec<u8> {
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(frame);
        v
    }

    fn recycle(&mut self, v: Vec<u8>) {
        if self.spare.len() < SPARE_BUFFERS {
            self.spare.push(v);
        }
    }

    /// Judges one frame; held frames are copied (and flipped) here.
    fn judge(&mut self, frame: &[u8], now: Duration) -> Verdict {
        let cfg = self.cfg;
        self.stats.frames += 1;
        if self.rng.chance(cfg.loss_rate) {
            self.stats.lost += 1;
            return Verdict::Drop;
        }
        let flip = (self.rng.chance(cfg.corrupt_rate) && !frame.is_empty())
            .then(|| self.rng.below(frame.len() as u64 * 8) as usize);
        let copies = if self.rng.chance(cfg.duplicate_rate) {
            2
        } else {
            1
        };
        self.stats.corrupted += u64::from(flip.is_some());
        self.stats.duplicated += copies as u64 - 1;
        let overtake = if self.rng.chance(cfg.delay_rate) {
            self.stats.delayed += 1;
            false
        } else if self.rng.chance(cfg.reorder_rate) {
            self.stats.reordered += 1;
            true
        } else {
            return Verdict::Pass { copies, flip };
        };
        let mut data = self.copy(frame);
        if let Some(bit) = flip {
            flip_bit(&mut data, bit);
        }
        self.held.push_back(Held {
            due: now + cfg.delay,
            overtake,
            copies,
            data,
        });
        Verdict::Hold
    }

    /// A frame just passed: frames waiting to be overtaken follow it.
    fn overtaken(&mut self) {
        if self.held.iter().any(|h| h.overtake) {
            let held = std::mem::take(&mut self.held);
            for h in held {
                if h.overtake {
                    self.release(h);
                } else {
                    self.held.push_back(h);
                }
            }
        }
    }

    /// Moves frames due by `now` to the ready queue.
    fn release_due(&mut self, now: Duration) {
        while self.held.front().is_some_and(|h| h.due <= now) {
            if let Some(h) = self.held.pop_front() {
                self.release(h);
            }
        }
    }

    fn release(&mut self, h: Held) {
        for _ in 1..h.copies {
            let dup = self.copy(&h.data);
            self.ready.push_back(dup);
        }
        self.ready.push_back(h.data);
    }

    fn timeout(&self, now: Duration) -> Option<Duration> {
        if !self.ready.is_empty() {
            return Some(Duration::ZERO);
        }
        self.held.front().map(|h| h.due.saturating_sub(now))
    }
}

fn flip_bit(frame: &mut [u8], bit: usize) {
    frame[bit / 8] ^= 1 << (bit % 8);
}

/// A link whose frames suffer configurable faults (see the [module
/// documentation](self)). Counters of the link itself come from the inner link;
/// [`fault_stats`](FaultInjector::fault_stats) says what was done to them.
#[derive(Debug)]
pub struct FaultInjector<L, C = MonotonicClock> {
    inner: L,
    clock: C,
    rx: Lane,
    tx: Lane,
    /// Where a corrupted received frame is flipped before it is lent.
    scratch: Vec<u8>,
    /// A failure of the inner link met after frames had moved, for the next call.
    deferred: Option<io::Error>,
}

impl<L: Link> FaultInjector<L> {
    /// No faults yet; decisions drawn from `seed`, delays on the monotonic clock.
    pub fn new(inner: L, seed: u64) -> Self {
        Self::with_clock(inner, seed, MonotonicClock::new())
    }
}

impl<L: Link, C: Clock> FaultInjector<L, C> {
    /// No faults yet; decisions drawn from `seed`, delays measured on `clock`.
    pub fn with_clock(inner: L, seed: u64, clock: C) -> Self {
        FaultInjector {
            inner,
            clock,
            rx: Lane::new(seed),
            // An independent stream, so faults on one side do not shift the other's.
            tx: Lane::new(seed ^ 0x5851_f42d_4c95_7f2d),
            scratch: Vec::new(),
            deferred: None,
        }
    }

    /// Sets the faults of one direction (builder form).
    pub fn with_faults(mut self, dir: Direction, faults: Faults) -> Self {
        self.set_faults(dir, faults);
        self
    }

    /// Sets the faults of one direction from now on; frames already held stay held.
    pub fn set_faults(&mut self, dir: Direction, faults: Faults) {
        self.lane(dir).cfg = faults;
    }

    /// What was done in one direction.
    pub fn fault_stats(&self, dir: Direction) -> FaultStats {
        match dir {
            Direction::Rx => self.rx.stats,
            Direction::Tx => self.tx.stats,
        }
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// The wrapped link; held frames are discarded.
    pub fn into_inner(self) -> L {
        self.inner
    }

    fn lane(&mut self, dir: Direction) -> &mut Lane {
        match dir {
            Direction::Rx => &mut self.rx,
            Direction::Tx => &mut self.tx,
        }
    }
}

impl<L: Link, C: Clock + Send> Link for FaultInjector<L, C> {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8]), max: usize) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let now = self.clock.now();
        self.tx.release_due(now);
        if !self.tx.ready.is_empty() {
            // Delayed transmissions go out even if the caller only ever receives.
            self.send_with(&mut |_| None)?;
        }
        let (lane, scratch) = (&mut self.rx, &mut self.scratch);
        lane.release_due(now);
        let mut n = 0;
        let emit_ready = |lane: &mut Lane, n: &mut usize, f: &mut dyn FnMut(&[u8])| {
            while *n < max {
                let Some(v) = lane.ready.pop_front() else {
                    break;
                };
                f(&v);
                *n += 1;
                lane.recycle(v);
            }
        };
        emit_ready(lane, &mut n, f);
        // Keep pulling while the inner link fills each request: a short count from us
        // must mean the inner link is drained (and armed for a wake-up).
        while n < max {
            let want = max - n;
            let got = self.inner.recv_batch(
                &mut |frame| match lane.judge(frame, now) {
                    Verdict::Drop | Verdict::Hold => {}
                    Verdict::Pass { copies, flip } => {
                        let data = match flip {
                            Some(bit) => {
                                scratch.clear();
                                scratch.extend_from_slice(frame);
                                flip_bit(scratch, bit);
                                &scratch[..]
                            }
                            None => frame,
                        };
                        for _ in 0..copies {
                            if n < max {
                                f(data);
                                n += 1;
                            } else {
                                let v = lane.copy(data);
                                lane.ready.push_back(v);
                            }
                        }
                        lane.overtaken();
                        emit_ready(lane, &mut n, f);
                    }
                },
                want,
            );
            match got {
                Ok(got) if got < want => break,
                Ok(_) => {}
                Err(e) if n > 0 => {
                    self.deferred = Some(e);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        let now = self.clock.now();
        let lane = &mut self.tx;
        lane.release_due(now);
        let (mut taken, mut done) = (0, false);
        self.inner.send_with(&mut |buf| {
            if let Some(v) = lane.ready.pop_front() {
                let len = v.len();
                if let Some(dst) = buf.get_mut(..len) {
                    dst.copy_from_slice(&v);
                }
                lane.recycle(v);
                return Some(len);
            }
            while !done {
                let Some(len) = fill(buf) else {
                    done = true;
                    break;
                };
                taken += 1;
                if !sendable(len, buf.len()) {
                    // The inner link counts it as dropped.
                    return Some(len);
                }
                match lane.judge(&buf[..len], now) {
                    Verdict::Drop | Verdict::Hold => {}
                    Verdict::Pass { copies, flip } => {
                        if let Some(bit) = flip {
                            flip_bit(&mut buf[..len], bit);
                        }
                        for _ in 1..copies {
                            let v = lane.copy(&buf[..len]);
                            lane.ready.push_back(v);
                        }
                        lane.overtaken();
                        return Some(len);
                    }
                }
            }
            None
        })?;
        Ok(taken)
    }

    forward_to_inner!();

    fn poll_timeout(&self) -> Option<Duration> {
        let now = self.clock.now();
        [
            self.rx.timeout(now),
            self.tx.timeout(now),
            self.inner.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}
