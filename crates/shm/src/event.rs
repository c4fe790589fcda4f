//! Doorbells and the two halves of the wake-up protocol built on them.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use crate::ring::{Keep, Producer};
use crate::wake::WakeWord;

/// A wake-up channel that neither side can make the other block on: a
/// datagram socketpair, waited on at one end and rung through the other.
///
/// The multiplexer does not trust the application, and both hold the
/// descriptors, so every operation is non-blocking per call
/// (`MSG_DONTWAIT`): whatever the other side does to the shared file
/// status flags (an eventfd's `O_NONBLOCK` can be cleared by anyone holding
/// it, and a write to a full eventfd then blocks) and however many rings it
/// leaves unread (the queue holds a few datagrams, after which ringing is a
/// no-op: the waiter is awake anyway), no call here ever blocks except the
/// waits ([`wait`](Self::wait)), each for at most its timeout.
#[derive(Debug)]
pub struct Doorbell {
    /// Waited on and drained.
    rx: OwnedFd,
    /// Sent on to ring `rx`.
    tx: OwnedFd,
}

impl Doorbell {
    pub fn new() -> io::Result<Doorbell> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
                fds.as_mut_ptr(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both are fresh descriptors owned by nobody else.
        let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Doorbell::of(rx, tx))
    }

    fn of(rx: OwnedFd, tx: OwnedFd) -> Doorbell {
        Doorbell { rx, tx }
    }

    /// Adopts the two ends received from the other side; both must be
    /// datagram sockets (anything else could block or mean something else).
    pub fn from_fds(rx: OwnedFd, tx: OwnedFd) -> io::Result<Doorbell> {
        for fd in [&rx, &tx] {
            let mut ty: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt writes at most `len` bytes into `ty`.
            let r = unsafe {
                libc::getsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_TYPE,
                    (&mut ty as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            if r < 0 || ty != libc::SOCK_DGRAM {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a doorbell end is not a datagram socket",
                ));
            }
        }
        Ok(Doorbell::of(rx, tx))
    }

    /// Both ends, to hand to the other side: (waited on, rung through).
    pub fn fds(&self) -> (BorrowedFd<'_>, BorrowedFd<'_>) {
        (self.rx.as_fd(), self.tx.as_fd())
    }

    /// Other descriptors for the same two ends.
    pub fn try_clone(&self) -> io::Result<Doorbell> {
        Ok(Doorbell::of(self.rx.try_clone()?, self.tx.try_clone()?))
    }

    /// Wakes whoever waits on this doorbell. Never blocks; a full queue or
    /// a vanished peer means there is nobody left to wake.
    pub fn signal(&self) -> io::Result<()> {
        // SAFETY: sends one byte from a live local buffer on our descriptor.
        let n = unsafe {
            libc::send(
                self.tx.as_raw_fd(),
                [1u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::ENOBUFS | libc::ECONNREFUSED | libc::EPIPE) => Ok(()),
                _ => Err(e),
            };
        }
        Ok(())
    }

    /// Blocks until rung or until `timeout` (`None`: for ever) passes, then
    /// drains. Returns whether it was rung. An interrupted wait counts as
    /// not rung; callers loop anyway.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        Ok(self.wait_or_hangup(timeout, None)? == Ring::Rung)
    }

    /// [`wait`](Self::wait), also returning when `hangup` (a socket to the
    /// other side) hangs up: the other side is gone and will never ring.
    pub fn wait_or_hangup(
        &self,
        timeout: Option<Duration>,
        hangup: Option<BorrowedFd<'_>>,
    ) -> io::Result<Ring> {
        let ms = match timeout {
            None => -1,
            // Round up, so that a short timeout still sleeps.
            Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
        };
        let mut fds = [
            libc::pollfd {
                fd: self.rx.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // poll skips a negative descriptor.
                fd: hangup.map_or(-1, |h| h.as_raw_fd()),
                events: libc::POLLRDHUP,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds, for the duration of the call; the
        // hang-up descriptor is borrowed for it.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(Ring::TimedOut)
            } else {
                Err(e)
            };
        }
        if fds[1].revents != 0 {
            return Ok(Ring::HangUp);
        }
        Ok(if fds[0].revents != 0 && self.drain()? {
            Ring::Rung
        } else {
            Ring::TimedOut
        })
    }

    /// Empties the queue (it holds only a few datagrams, so this is
    /// bounded); returns whether anything was in it. The rings are taken a
    /// batch at a time, so the usual one or two cost one system call, not
    /// one each and another to find the queue empty.
    pub fn drain(&self) -> io::Result<bool> {
        let mut any = false;
        loop {
            match self.receive_batch() {
                Ok(n) => {
                    any = true;
                    // A short batch emptied the queue.
                    if n < DRAIN_BATCH {
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(any),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// One `recvmmsg` of up to [`DRAIN_BATCH`] rings, not waiting: how many
    /// it took (at least one).
    fn receive_batch(&self) -> io::Result<usize> {
        let mut bytes = [0u8; DRAIN_BATCH];
        // SAFETY: all-zero iovecs and mmsghdrs are valid (no name, no
        // control); each header points at its iovec and each iovec at one
        // byte of `bytes`, all live for the call, which writes at most
        // DRAIN_BATCH headers and one byte per message.
        let n = unsafe {
            let mut iov: [libc::iovec; DRAIN_BATCH] = std::mem::zeroed();
            let mut msgs: [libc::mmsghdr; DRAIN_BATCH] = std::mem::zeroed();
            for (i, (v, m)) in iov.iter_mut().zip(msgs.iter_mut()).enumerate() {
                v.iov_base = bytes.as_mut_ptr().add(i).cast();
                v.iov_len = 1;
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
            }
            libc::recvmmsg(
                self.rx.as_raw_fd(),
                msgs.as_mut_ptr(),
                DRAIN_BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// Rings taken by one `recvmmsg`.
const DRAIN_BATCH: usize = 16;

/// The longest the application's sleep waits in `FUTEX_WAIT` before it
/// looks whether the other side went away ([`Sleeper::sleep_or_hangup`]).
pub const SLEEP_SLICE: Duration = Duration::from_millis(5);

impl AsFd for Doorbell {
    /// The end to wait on (in one's own poll/epoll set).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

/// An endpoint's two doorbells. Both sides hold both: each waits on its own
/// and rings the other's.
#[derive(Debug)]
pub struct Doorbells {
    /// The application waits on this one (rx, completion, upcalls).
    pub app: Doorbell,
    /// The multiplexer waits on this one (tx, free).
    pub mux: Doorbell,
}

impl Doorbells {
    pub fn new() -> io::Result<Doorbells> {
        Ok(Doorbells {
            app: Doorbell::new()?,
            mux: Doorbell::new()?,
        })
    }

    pub fn try_clone(&self) -> io::Result<Doorbells> {
        Ok(Doorbells {
            app: self.app.try_clone()?,
            mux: self.mux.try_clone()?,
        })
    }
}

/// How a [`Doorbell::wait_or_hangup`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    Rung,
    /// The timeout passed (or a signal interrupted the wait).
    TimedOut,
    /// The hang-up descriptor hung up.
    HangUp,
}

/// How a [`Sleeper::sleep`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wakeup {
    /// The re-check after announcing the sleep found work: no system call.
    Ready,
    /// The doorbell was signalled (possibly by a stale signal: re-check).
    Signaled,
    TimedOut,
    /// The other side is gone ([`Sleeper::sleep_or_hangup`] only).
    HangUp,
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
/// doorbell. One thread at a time may sleep.
pub struct Sleeper {
    word: WordRef,
    bell: Doorbell,
}

impl Sleeper {
    /// # Safety
    /// `word` must stay valid while `keep` lives.
    pub(crate) unsafe fn new(word: NonNull<WakeWord>, keep: Keep, bell: Doorbell) -> Sleeper {
        Sleeper {
            word: WordRef { word, _keep: keep },
            bell,
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
        self.sleep_or_hangup(timeout, None, ready)
    }

    /// Whether this side's sleeps wait for received frames only
    /// ([`crate::WakeWord::RX_ONLY`]): then a transmit scan that took its
    /// frames does not signal it. Set it only while nothing waits for room
    /// on the tx ring or for buffers back on completion; after clearing it,
    /// re-check the rings before sleeping. Returns whether it was set.
    pub fn set_rx_only(&self, on: bool) -> bool {
        self.word.get().set_rx_only(on)
    }

    /// [`sleep`](Self::sleep), also waking with [`Wakeup::HangUp`] when
    /// `hangup` (the control socket) hangs up: the other side is gone. The
    /// application's sleep, which alone waits on its word: in `FUTEX_WAIT`
    /// ([`WakeWord::FUTEX`]), not on the doorbell. The waker's
    /// `FUTEX_WAKE` costs a cross-CPU wake-up about 2 µs less than a
    /// datagram to a sleeping `recvmmsg` (measured here: round trips
    /// between two processes of 12.3–13.0 µs against 17.0), and the wait
    /// times out on a high-resolution timer. It sees the hang-up within a
    /// [`SLEEP_SLICE`] or two, and a ring of the doorbell (an almost-full
    /// upcall while awake) at the end of a slice.
    pub fn sleep_or_hangup(
        &self,
        timeout: Option<Duration>,
        hangup: Option<BorrowedFd<'_>>,
        ready: impl FnOnce() -> bool,
    ) -> io::Result<Wakeup> {
        let word = self.word.get();
        let seen = match hangup {
            Some(_) => word.announce_futex_sleep(),
            None => {
                word.announce_sleep();
                0
            }
        };
        if ready() {
            word.end_sleep();
            return Ok(Wakeup::Ready);
        }
        let ring = match hangup {
            Some(h) => self.futex_sleep(seen, timeout, h),
            None => self.bell.wait_or_hangup(timeout, None),
        };
        word.end_sleep();
        Ok(match ring? {
            Ring::Rung => Wakeup::Signaled,
            Ring::TimedOut => Wakeup::TimedOut,
            Ring::HangUp => Wakeup::HangUp,
        })
    }

    /// The application's sleep: `FUTEX_WAIT` while `rung` holds `seen`, for
    /// `timeout` or a [`SLEEP_SLICE`], whichever is shorter. A futex does
    /// not see the other side go away, so a wait that timed out looks for
    /// the hang-up (in a wait that does not block, which takes a ring of
    /// the doorbell come meanwhile too).
    fn futex_sleep(
        &self,
        seen: u32,
        timeout: Option<Duration>,
        hangup: BorrowedFd<'_>,
    ) -> io::Result<Ring> {
        let slice = timeout.map_or(SLEEP_SLICE, |t| t.min(SLEEP_SLICE));
        if futex_wait(&self.word.get().rung, seen, slice)? {
            return Ok(Ring::Rung);
        }
        self.bell.wait_or_hangup(Some(Duration::ZERO), Some(hangup))
    }

    /// For a wait over many endpoints at once (one poll or epoll set over
    /// all their doorbells), the first half of [`sleep`](Self::sleep): sets
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
    /// our own doorbell if a thread of ours sleeps and there is work, since
    /// signals were skipped while upcalls were off. A signal already on its
    /// way when they are switched off may still arrive.
    pub fn set_upcalls(&self, on: bool, ready: impl FnOnce() -> bool) -> io::Result<()> {
        if self.word.get().set_upcalls(on) && ready() {
            ring(self.word.get(), &self.bell)?;
        }
        Ok(())
    }

    /// Arms U-Net's "receive queue almost full" upcall at `threshold`
    /// entries, or disarms it (`None`).
    pub fn set_almost_full(&self, threshold: Option<u32>) {
        self.word.get().set_almost_full(threshold);
    }

    /// The doorbell, to wait on in one's own poll/epoll set (U-Net's
    /// `select`); follow the same protocol: set the flag with
    /// [`sleep`](Self::sleep) or re-check after waking.
    pub fn doorbell(&self) -> &Doorbell {
        &self.bell
    }
}

/// The other side's half, seen from this side: its [`WakeWord`] and its
/// doorbell, written only when the word says so.
pub struct Notifier {
    word: WordRef,
    bell: Doorbell,
    /// Whether the peer's rx ring was at or above its almost-full threshold
    /// at the last [`notify_rx`](Self::notify_rx).
    above: bool,
}

impl Notifier {
    /// # Safety
    /// `word` must stay valid while `keep` lives.
    pub(crate) unsafe fn new(word: NonNull<WakeWord>, keep: Keep, bell: Doorbell) -> Notifier {
        Notifier {
            word: WordRef { word, _keep: keep },
            bell,
            above: false,
        }
    }

    /// After publishing work for the other side: signals it if it sleeps
    /// (Expert's `kick_tx` only when the PCSR says the scan is idle).
    /// Returns whether it signalled.
    #[inline]
    pub fn notify_if_sleeping(&self) -> io::Result<bool> {
        self.signal_if(self.word.get().wants_wakeup())
    }

    /// After taking the other side's tx entries (room on its tx ring,
    /// completions on its way): signals it if it sleeps, unless its sleep
    /// waits for received frames only ([`crate::WakeWord::RX_ONLY`]).
    /// Returns whether it signalled.
    #[inline]
    pub fn notify_tx_done(&self) -> io::Result<bool> {
        self.signal_if(self.word.get().wants_tx_upcall())
    }

    /// After publishing entries on the application's `rx` ring: signals the
    /// application if it sleeps (U-Net's "non-empty" condition) or if `rx`
    /// just filled up to its almost-full threshold, unless its upcalls are
    /// off. Meant to be called once per batch. Returns whether it signalled.
    pub fn notify_rx(&mut self, rx: &Producer) -> io::Result<bool> {
        self.notify_rx_if(rx, true)
    }

    /// [`notify_rx`](Self::notify_rx) after a batch that may hold only
    /// entries of quiet channels ([`crate::Desc::QUIET`]): unless `eager`,
    /// a sleeping application is not signalled, only one whose rx ring just
    /// filled up to its almost-full threshold.
    pub fn notify_rx_if(&mut self, rx: &Producer, eager: bool) -> io::Result<bool> {
        let wake = self
            .word
            .get()
            .wants_rx_upcall(|| rx.outstanding(), &mut self.above, eager);
        self.signal_if(wake)
    }

    /// Wakes the other side if `wake`; returns `wake`.
    #[inline]
    fn signal_if(&self, wake: bool) -> io::Result<bool> {
        if wake {
            ring(self.word.get(), &self.bell)?;
        }
        Ok(wake)
    }
}

/// Wakes the sleeper that owns `word`, where it sleeps: in `FUTEX_WAIT`
/// ([`WakeWord::FUTEX`]), else on its doorbell `bell`.
fn ring(word: &WakeWord, bell: &Doorbell) -> io::Result<()> {
    if word.ring_futex() {
        futex_wake(&word.rung);
        return Ok(());
    }
    bell.signal()
}

/// `FUTEX_WAIT` on `word`, in shared memory (no `FUTEX_PRIVATE_FLAG`: the
/// other process wakes it through its own mapping), while it holds `seen`,
/// for at most `timeout` (a high-resolution timer). Returns whether it was
/// woken or found the value moved on; false when the time passed or a
/// signal interrupted it.
fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) -> io::Result<bool> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit word and `ts` a live
    // timespec for the call; FUTEX_WAIT reads both and writes neither.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
        )
    };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Ok(true),
        Some(libc::ETIMEDOUT | libc::EINTR) => Ok(false),
        _ => Err(e),
    }
}

/// `FUTEX_WAKE`s every waiter on `word` (the one sleeper, as a rule). It
/// never blocks, and the memory is the other side's to write: a wrong value
/// there costs that side a wake-up, nothing more.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses `word`'s address, of a live word, as a
    // key; it neither reads nor writes memory of ours.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}
