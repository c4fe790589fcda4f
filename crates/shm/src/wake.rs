//! The wake-up word: how each side tells the other, in shared memory,
//! whether it must be woken (Expert's PCSR, AF_XDP's need_wakeup, U-Net's
//! upcall conditions).
//!
//! The protocol, with the sleeper consuming a ring the waker produces:
//!
//! ```text
//! sleeper                                 waker
//! flags |= SLEEPING                       publish entries (release store)
//! fence(SeqCst)                           fence(SeqCst)
//! if ring non-empty: clear, return        if flags & SLEEPING: ring doorbell
//! block on doorbell (with timeout)
//! flags &= !SLEEPING
//! ```
//!
//! Each side stores, fences, then loads what the other stored; the two
//! SeqCst fences are totally ordered, so whichever comes second sees the
//! other's store: either the sleeper sees the entries and does not block, or
//! the waker sees `SLEEPING` and rings the doorbell. No wake-up is lost, and
//! in the busy case nobody makes a system call.
//!
//! A sleeper may block in `FUTEX_WAIT` on the word's `rung` instead of on
//! its doorbell ([`WakeWord::FUTEX`]): after the fence it reads `rung`
//! (acquire), and the waker that sees it sleeping bumps `rung` (release)
//! before its `FUTEX_WAKE`. A bump after the read makes the wait return at
//! once; a bump before it carries the waker's entries to the re-check.
//!
//! "Work" is anything the sleeper may be waiting for, so the waker is
//! whoever just moved an index: a producer that published entries, and also
//! a consumer that released them (the sleeper may be waiting for ring room,
//! or, on the application's side, for tx buffers that come back on
//! completion). Each side calls the notifier once per batch after moving
//! any index, which costs a fence and a load while the other side is awake.

use crate::sync::{fence, AtomicU32, Ordering};

/// One side's wake-up word, on a cache line of its own in the segment
/// header (`struct exonet_wake` in C). Its flags are written by the side it
/// belongs to and read by the other, `rung` the other way round; as
/// everything in shared memory it is only a hint to the reader: a wrong
/// value costs a spurious or a missed wake-up of the side it belongs to,
/// nothing else.
#[repr(C, align(64))]
pub struct WakeWord {
    /// [`WakeWord::SLEEPING`], [`WakeWord::UPCALLS_OFF`],
    /// [`WakeWord::ALMOST_FULL`], [`WakeWord::RX_ONLY`].
    pub flags: AtomicU32,
    /// The rx "almost full" threshold, in entries (U-Net's second upcall
    /// condition), when [`WakeWord::ALMOST_FULL`] is set.
    pub almost_full: AtomicU32,
    /// Bumped by the waker of a [`WakeWord::FUTEX`] sleeper before its
    /// `FUTEX_WAKE`: the value the sleeper's `FUTEX_WAIT` compares, so that
    /// a wake between its look and its wait is not lost.
    pub rung: AtomicU32,
}

impl WakeWord {
    /// A thread of this side is blocked, or about to block, on its doorbell:
    /// signal it after giving it work (U-Net's "receive queue non-empty"
    /// upcall; the multiplexer's flag is Expert's "transmit scan not
    /// running").
    pub const SLEEPING: u32 = 1 << 0;
    /// Upcalls are switched off: never signal this side. Lets an application
    /// make code atomic with respect to upcalls at the cost of two stores.
    pub const UPCALLS_OFF: u32 = 1 << 1;
    /// Signal this side when its rx ring fills up to `almost_full` entries,
    /// sleeping or not (U-Net's "receive queue almost full" upcall).
    pub const ALMOST_FULL: u32 = 1 << 2;
    /// This side's sleep waits for received frames only, not for room on its
    /// tx ring nor for buffers back on completion: a transmit scan that took
    /// its frames need not signal it (an application waiting for an answer
    /// would otherwise be woken once for its own request's completion and
    /// again for the answer).
    pub const RX_ONLY: u32 = 1 << 3;
    /// With [`WakeWord::SLEEPING`]: the sleeper waits in `FUTEX_WAIT` on
    /// [`rung`](Self::rung), not on its doorbell: bump `rung` and
    /// `FUTEX_WAKE` it instead of ringing.
    pub const FUTEX: u32 = 1 << 4;

    /// Sleeper, before the re-check: announce the sleep, then fence.
    pub(crate) fn announce_sleep(&self) {
        self.flags.fetch_or(Self::SLEEPING, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Sleeper, before the re-check of a sleep in `FUTEX_WAIT`: announces
    /// the sleep, fences, then takes the value of `rung` to wait on. A wake
    /// that bumps `rung` after the look ends the wait at once; one that
    /// bumped it before was seen by the look (acquire: it follows the bump's
    /// release), and so was what that waker had published, which the
    /// re-check then finds.
    pub(crate) fn announce_futex_sleep(&self) -> u32 {
        self.flags
            .fetch_or(Self::SLEEPING | Self::FUTEX, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.rung.load(Ordering::Acquire)
    }

    /// Sleeper, when awake again.
    pub(crate) fn end_sleep(&self) {
        self.flags
            .fetch_and(!(Self::SLEEPING | Self::FUTEX), Ordering::Relaxed);
    }

    /// Waker, having decided to signal: whether the sleeper waits in
    /// `FUTEX_WAIT`; if so, `rung` is bumped for it.
    pub(crate) fn ring_futex(&self) -> bool {
        if self.flags.load(Ordering::Relaxed) & Self::FUTEX == 0 {
            return false;
        }
        self.rung.fetch_add(1, Ordering::Release);
        true
    }

    /// Waker, after publishing work: must the owner of this word be
    /// signalled because it sleeps?
    #[inline]
    pub(crate) fn wants_wakeup(&self) -> bool {
        self.sleeps_without(Self::UPCALLS_OFF)
    }

    /// Waker, after taking the owner's tx entries (room on its tx ring,
    /// buffers on its completion ring): must it be signalled, because it
    /// sleeps and waits for more than received frames?
    #[inline]
    pub(crate) fn wants_tx_upcall(&self) -> bool {
        self.sleeps_without(Self::UPCALLS_OFF | Self::RX_ONLY)
    }

    /// Fences, then whether the owner sleeps with none of the flags `off`.
    #[inline]
    fn sleeps_without(&self, off: u32) -> bool {
        fence(Ordering::SeqCst);
        self.flags.load(Ordering::Relaxed) & (Self::SLEEPING | off) == Self::SLEEPING
    }

    /// Owner: sets or clears [`WakeWord::RX_ONLY`]; clearing it fences, so
    /// that a re-check of the rings after it cannot miss a transmit scan
    /// that did not signal.
    /// Returns whether it was set.
    pub(crate) fn set_rx_only(&self, on: bool) -> bool {
        if on {
            self.flags.fetch_or(Self::RX_ONLY, Ordering::Relaxed) & Self::RX_ONLY != 0
        } else {
            let was = self.flags.fetch_and(!Self::RX_ONLY, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            was & Self::RX_ONLY != 0
        }
    }

    /// Waker, after publishing rx entries: must the owner be signalled,
    /// because it sleeps (and some entry is `eager`, not on a quiet
    /// channel) or because its rx ring just crossed the almost-full
    /// threshold? `outstanding` counts the rx entries not yet consumed; it is
    /// only asked for when the threshold is armed. `above` is the waker's
    /// private memory of the last crossing, so that a ring that stays full
    /// is signalled once, not on every batch.
    pub(crate) fn wants_rx_upcall(
        &self,
        outstanding: impl FnOnce() -> u32,
        above: &mut bool,
        eager: bool,
    ) -> bool {
        fence(Ordering::SeqCst);
        let flags = self.flags.load(Ordering::Relaxed);
        if flags & Self::UPCALLS_OFF != 0 {
            return false;
        }
        let mut crossed = false;
        if flags & Self::ALMOST_FULL != 0 {
            let now_above = outstanding() >= self.almost_full.load(Ordering::Relaxed);
            crossed = now_above && !*above;
            *above = now_above;
        }
        crossed || (eager && flags & Self::SLEEPING != 0)
    }

    /// Switches upcalls on (then fences) or off. Returns whether, after
    /// switching them on, a thread of this side is asleep: the caller must
    /// then re-check its rings and ring its own doorbell if they have work,
    /// since the waker skipped any signal while upcalls were off.
    pub(crate) fn set_upcalls(&self, on: bool) -> bool {
        if !on {
            self.flags.fetch_or(Self::UPCALLS_OFF, Ordering::Relaxed);
            return false;
        }
        self.flags.fetch_and(!Self::UPCALLS_OFF, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.flags.load(Ordering::Relaxed) & Self::SLEEPING != 0
    }

    /// Arms (`Some(threshold)`) or disarms the almost-full upcall.
    pub(crate) fn set_almost_full(&self, threshold: Option<u32>) {
        match threshold {
            Some(t) => {
                self.almost_full.store(t, Ordering::Relaxed);
                self.flags.fetch_or(Self::ALMOST_FULL, Ordering::Relaxed);
            }
            None => {
                self.flags.fetch_and(!Self::ALMOST_FULL, Ordering::Relaxed);
            }
        }
    }
}
