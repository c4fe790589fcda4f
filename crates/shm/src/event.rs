//! Eventfds and the two halves of the wake-up protocol built on them.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

use crate::ring::{Keep, Producer};
use crate::wake::WakeWord;

/// A non-blocking, close-on-exec eventfd: what a side blocks on, and what
/// the other side writes to wake it.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new
        // descriptor that we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Another descriptor for the same eventfd (to hand to the other side).
    pub fn try_clone(&self) -> io::Result<EventFd> {
        self.0.try_clone().map(EventFd)
    }

    /// Wakes whoever waits on this eventfd.
    pub fn signal(&self) -> io::Result<()> {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local buffer to our descriptor.
        let n = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            // EAGAIN: the counter is at its maximum, so it is readable
            // already and the waiter will wake anyway.
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Blocks until signalled or until `timeout` (`None`: for ever) passes,
    /// then resets the counter. Returns whether it was signalled. An
    /// interrupted wait counts as not signalled; callers loop anyway.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let ms = match timeout {
            None => -1,
            // Round up, so that a short timeout still sleeps.
            Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
        };
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(r > 0 && self.drain()?)
    }

    /// Resets the counter; returns whether it was non-zero.
    fn drain(&self) -> io::Result<bool> {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local buffer.
        let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(true)
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl From<OwnedFd> for EventFd {
    /// Adopts an eventfd received from the other side.
    fn from(fd: OwnedFd) -> Self {
        EventFd(fd)
    }
}

impl From<EventFd> for OwnedFd {
    fn from(e: EventFd) -> Self {
        e.0
    }
}

/// An endpoint's two eventfds. Both sides hold both: each blocks on its own
/// and writes the other's.
#[derive(Debug)]
pub struct EventPair {
    /// The application blocks on this one (rx, completion, upcalls).
    pub app: EventFd,
    /// The multiplexer blocks on this one (tx, free).
    pub mux: EventFd,
}

impl EventPair {
    pub fn new() -> io::Result<EventPair> {
        Ok(EventPair {
            app: EventFd::new()?,
            mux: EventFd::new()?,
        })
    }

    pub fn try_clone(&self) -> io::Result<EventPair> {
        Ok(EventPair {
            app: self.app.try_clone()?,
            mux: self.mux.try_clone()?,
        })
    }
}

/// How a [`Sleeper::sleep`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wakeup {
    /// The re-check after announcing the sleep found work: no system call.
    Ready,
    /// The eventfd was signalled (possibly by a stale signal: re-check).
    Signaled,
    TimedOut,
}

/// Points at a [`WakeWord`] in a segment header; the invariant: valid while
/// `_keep` lives.
struct WordRef {
    word: NonNull<WakeWord>,
    _keep: Keep,
}

impl WordRef {
    fn get(&self) -> &WakeWord {
        // SAFETY: valid while `_keep` lives (the invariant above); the word
        // is only accessed through atomics.
        unsafe { self.word.as_ref() }
    }
}

// SAFETY: the word is in memory kept alive by `_keep` and is accessed only
// through atomics, from any thread.
unsafe impl Send for WordRef {}
// SAFETY: as above.
unsafe impl Sync for WordRef {}

/// This side's half of the wake-up protocol: its [`WakeWord`] and its
/// eventfd. One thread at a time may sleep.
pub struct Sleeper {
    word: WordRef,
    event: EventFd,
}

impl Sleeper {
    /// # Safety
    /// `word` must stay valid while `keep` lives.
    pub(crate) unsafe fn new(word: NonNull<WakeWord>, keep: Keep, event: EventFd) -> Sleeper {
        Sleeper {
            word: WordRef { word, _keep: keep },
            event,
        }
    }

    /// Blocks until the other side signals, `timeout` passes, or `ready`
    /// (the re-check: "do my rings have work?") says there is work. Sets the
    /// `SLEEPING` flag, fences, re-checks, blocks, clears the flag: see
    /// [`crate::WakeWord`] for why no wake-up is lost.
    pub fn sleep(
        &self,
        timeout: Option<Duration>,
        ready: impl FnOnce() -> bool,
    ) -> io::Result<Wakeup> {
        let word = self.word.get();
        word.announce_sleep();
        if ready() {
            word.end_sleep();
            return Ok(Wakeup::Ready);
        }
        let signaled = self.event.wait(timeout);
        word.end_sleep();
        Ok(if signaled? {
            Wakeup::Signaled
        } else {
            Wakeup::TimedOut
        })
    }

    /// For a wait over many endpoints at once (one poll or epoll set over
    /// all their eventfds), the first half of [`sleep`](Self::sleep): sets
    /// the `SLEEPING` flag and fences. Then re-check every ring, block only
    /// if none has work, and call [`end_sleep`](Self::end_sleep) on each.
    pub fn announce_sleep(&self) {
        self.word.get().announce_sleep();
    }

    /// Clears the `SLEEPING` flag set by [`announce_sleep`](Self::announce_sleep).
    pub fn end_sleep(&self) {
        self.word.get().end_sleep();
    }

    /// Switches upcalls off (the other side will not signal this side at
    /// all) or back on. Turning them on re-checks with `ready` and signals
    /// our own eventfd if a thread of ours sleeps and there is work, since
    /// signals were skipped while upcalls were off. A signal already on its
    /// way when they are switched off may still arrive.
    pub fn set_upcalls(&self, on: bool, ready: impl FnOnce() -> bool) -> io::Result<()> {
        if self.word.get().set_upcalls(on) && ready() {
            self.event.signal()?;
        }
        Ok(())
    }

    /// Arms U-Net's "receive queue almost full" upcall at `threshold`
    /// entries, or disarms it (`None`).
    pub fn set_almost_full(&self, threshold: Option<u32>) {
        self.word.get().set_almost_full(threshold);
    }

    /// The eventfd, to wait on in one's own poll/epoll set (U-Net's
    /// `select`); follow the same protocol: set the flag with
    /// [`sleep`](Self::sleep) or re-check after waking.
    pub fn event(&self) -> &EventFd {
        &self.event
    }
}

/// The other side's half, seen from this side: its [`WakeWord`] and its
/// eventfd, written only when the word says so.
pub struct Notifier {
    word: WordRef,
    event: EventFd,
    /// Whether the peer's rx ring was at or above its almost-full threshold
    /// at the last [`notify_rx`](Self::notify_rx).
    above: bool,
}

impl Notifier {
    /// # Safety
    /// `word` must stay valid while `keep` lives.
    pub(crate) unsafe fn new(word: NonNull<WakeWord>, keep: Keep, event: EventFd) -> Notifier {
        Notifier {
            word: WordRef { word, _keep: keep },
            event,
            above: false,
        }
    }

    /// After publishing work for the other side: signals it if it sleeps
    /// (Expert's `kick_tx` only when the PCSR says the scan is idle).
    /// Returns whether it signalled.
    pub fn notify_if_sleeping(&self) -> io::Result<bool> {
        let wake = self.word.get().wants_wakeup();
        if wake {
            self.event.signal()?;
        }
        Ok(wake)
    }

    /// After publishing entries on the application's `rx` ring: signals the
    /// application if it sleeps (U-Net's "non-empty" condition) or if `rx`
    /// just filled up to its almost-full threshold, unless its upcalls are
    /// off. Meant to be called once per batch. Returns whether it signalled.
    pub fn notify_rx(&mut self, rx: &Producer) -> io::Result<bool> {
        let wake = self
            .word
            .get()
            .wants_rx_upcall(|| rx.outstanding(), &mut self.above);
        if wake {
            self.event.signal()?;
        }
        Ok(wake)
    }
}
