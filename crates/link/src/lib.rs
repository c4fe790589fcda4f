//! Links: the one place where Ethernet frames enter and leave exonet.
//!
//! A [`Link`] moves *batches* of frames and never allocates on the fast path: received
//! frames are lent to a callback straight from wherever the link keeps them (a kernel
//! ring, a shared-memory cable), and frames to send are written by a callback straight
//! into the buffer the link lends (a transmit ring slot). The drivers are
//!
//! - [`memwire`]: an in-memory Ethernet cable between two links, in one process or
//!   across two (shared memory and eventfds); the substrate of tests without privileges;
//! - [`tap`]: a Linux TAP device;
//! - [`afpacket`]: an AF_PACKET socket with mmap'ed rings, bound to one interface:
//!   TPACKET_V3 for throughput, or TPACKET_V2 for latency;
//! - [`afxdp`]: an AF_XDP socket on one interface queue, its frames in a user-space
//!   UMEM (zero-copy where the driver supports it), taking every frame or only those
//!   for exonet's IPv4 addresses (the rest stay with Linux).
//!
//! Wrappers compose over any link, as smoltcp's `phy` wrappers compose over any device:
//! [`FaultInjector`] (loss, duplication, reordering, corruption, delay),
//! [`PcapCapture`] (a capture file of both directions), [`Tracer`] (a callback per
//! frame) and [`Segmenter`] (TCP segmentation offload in software). A wrapper sees frames on the side of the chain it sits on: in
//! `PcapCapture<FaultInjector<Tap>>` the capture records what the application sent and
//! received, before transmit faults and after receive faults.
//!
//! ```
//! use exonet_link::{memwire, Link};
//!
//! let (mut a, mut b) = memwire::pair()?;
//! let frame = [0xffu8; 60];
//! assert_eq!(a.send_batch(&[&frame[..], &frame[..]])?, 2);
//! let mut got = Vec::new();
//! b.recv_batch(&mut |f| got.push(f.len()), 32)?;
//! assert_eq!(got, [60, 60]);
//! # Ok::<(), std::io::Error>(())
//! ```

#![warn(missing_docs)]

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::time::Duration;

use exonet_wire::tcp::SynAnswers;

/// What a wrapper link does not change, forwarded to its `inner` link.
/// (Defined before the modules so that they can use it.)
macro_rules! forward_to_inner {
    () => {
        fn mtu(&self) -> usize {
            self.inner.mtu()
        }
        fn max_frame_len(&self) -> usize {
            self.inner.max_frame_len()
        }
        fn max_send_len(&self) -> usize {
            self.inner.max_send_len()
        }
        fn mac(&self) -> [u8; 6] {
            self.inner.mac()
        }
        fn as_raw_fd(&self) -> Option<RawFd> {
            self.inner.as_raw_fd()
        }
        fn stats(&self) -> LinkStats {
            self.inner.stats()
        }
        fn prepare_sleep(&mut self) -> bool {
            self.inner.prepare_sleep()
        }
    };
}

/// `recv_batch` of a link that implements `recv_batch_checked`: the same
/// frames, without the word on their checksums.
macro_rules! recv_batch_from_checked {
    () => {
        fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8]), max: usize) -> io::Result<usize> {
            self.recv_batch_checked(&mut |frame, _| f(frame), max)
        }
    };
}

/// The timing of sends, forwarded to `inner`, for wrappers that hold no
/// frames back.
macro_rules! forward_kicks_to_inner {
    () => {
        fn poll_timeout(&self) -> Option<Duration> {
            self.inner.poll_timeout()
        }
        fn cork(&mut self) {
            self.inner.cork()
        }
        fn uncork(&mut self) -> io::Result<()> {
            self.inner.uncork()
        }
    };
}

pub mod afpacket;
pub mod afxdp;
mod bpf;
mod clock;
pub mod direct;
pub mod fault;
pub mod memwire;
pub mod pcap;
pub mod segment;
mod sys;
pub mod tap;
pub mod tracer;
mod vnet;

pub use clock::{Clock, ManualClock, MonotonicClock, SystemClock};
pub use fault::{FaultInjector, FaultStats, Faults};
pub use pcap::PcapCapture;
pub use segment::Segmenter;
pub use tracer::Tracer;

/// Shortest frame a link accepts for sending: an Ethernet header (no FCS, no padding
/// required; links do not pad).
pub const MIN_FRAME_LEN: usize = 14;
/// Longest link-layer header counted on top of the MTU: Ethernet with one 802.1Q tag.
pub const MAX_HEADER_LEN: usize = 18;
/// Longest TCP super-segment a link with segmentation offload takes
/// ([`Link::max_send_len`]): an IPv4 packet of the largest total length behind
/// the longest link-layer header.
pub const MAX_SUPER_LEN: usize = MAX_HEADER_LEN + 65535;

/// Which way a frame was going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Received from the link.
    Rx,
    /// Sent to the link.
    Tx,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Rx => "rx",
            Direction::Tx => "tx",
        })
    }
}

/// Counters of a link since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames handed to the receive callback.
    pub rx_frames: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// Frames that arrived but were lost before reaching the callback: queue or ring
    /// full, truncated, malformed.
    pub rx_dropped: u64,
    /// Received frames whose TCP or UDP checksum the sending host had left to
    /// hardware, finished by the link (AF_PACKET or AF_XDP, from a veth).
    pub rx_csum_completed: u64,
    /// Received TCP super-segments and UDP super-datagrams (a sender's
    /// segmentation offload that no hardware finished, over a veth) cut into
    /// frames that fit the MTU, each counted in `rx_frames`.
    pub rx_super: u64,
    /// Frames accepted for sending.
    pub tx_frames: u64,
    /// Of those, TCP super-segments (see [`Link::max_send_len`]).
    pub tx_super: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Frames taken from the caller but not sent: shorter than [`MIN_FRAME_LEN`],
    /// longer than the lent buffer, or refused by the device.
    pub tx_dropped: u64,
    /// SYNs answered by the link itself ([`Link::answer_syns`]).
    pub syns_answered: u64,
}

/// A TCP listener whose SYNs a link answers with SYN cookies, below the
/// application ([`Link::answer_syns`]; AF_XDP's XDP program does, see
/// [`afxdp`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynListener {
    /// The listener's address (one of the host's).
    pub ip: Ipv4Addr,
    /// The listener's port.
    pub port: u16,
    /// How its SYNs are answered.
    pub answers: SynAnswers,
}

/// Most frames in one slice of [`Link::recv_lent`].
pub const LENT_AT_ONCE: usize = 64;

/// A frame [`Link::recv_lent`] lends, with its checksum word (see
/// [`Link::recv_batch_checked`]).
pub type Lent<'a> = (&'a [u8], bool);

/// Where [`Link::recv_lent`] copies the frames of a link that cannot lend
/// them in place: kept by the caller from call to call, so that its
/// buffers are allocated once.
#[derive(Debug, Default)]
pub struct LendScratch {
    bytes: Vec<u8>,
    /// Per frame: its offset in `bytes`, its length, its checksum word.
    frames: Vec<(usize, usize, bool)>,
}

/// A network link that moves batches of Ethernet frames (no preamble, no FCS).
///
/// # Contract
///
/// - **Non-blocking.** No method waits. `recv_batch` returns `Ok(0)` when nothing is
///   there; `send_with` returns early when the link has no room.
/// - **Receive.** [`recv_batch`](Link::recv_batch) calls `f` once per frame, for at
///   most `max` frames, and returns how many. Each frame is lent only for the duration
///   of its call (it may live in a ring the kernel or a peer refills afterwards): copy
///   what must outlive it. [`recv_lent`](Link::recv_lent) lends a slice of frames at
///   once, for the duration of its call.
/// - **Transmit.** [`send_with`](Link::send_with) lends buffers of exactly
///   [`max_frame_len`](Link::max_frame_len) bytes, one at a time, for as long as it has
///   room. `fill` writes the next frame at the front of the buffer and returns its
///   length, or `None` when it has nothing more to send; `fill` is not called again
///   after `None` nor after the link ran out of room. Every `Some` *takes* the frame:
///   it is sent, or dropped and counted in [`LinkStats::tx_dropped`] when its length is
///   below [`MIN_FRAME_LEN`] or beyond the buffer. The return value is the number of
///   frames taken. [`send_batch`](Link::send_batch) is the copying form over slices.
/// - **Errors.** A failure that concerns one frame drops that frame and counts it. A
///   failure of the link itself is returned as `Err` only by a call that moved no
///   frame; met after frames have moved, it ends the call with its count and is
///   returned by the next call.
/// - **Sleeping.** When [`as_raw_fd`](Link::as_raw_fd) is `Some`, it becomes readable
///   (level-triggered) when frames may be received and writable when `send_with` may
///   take frames. Before sleeping on it, call `recv_batch` until it returns fewer than
///   `max`, then [`prepare_sleep`](Link::prepare_sleep), and sleep only if that says
///   nothing arrived meanwhile, for no longer than
///   [`poll_timeout`](Link::poll_timeout): only then is a wake-up guaranteed for the
///   next frame. A caller that busy-polls never calls `prepare_sleep`, and its peer
///   never pays for a wake-up.
pub trait Link: Send {
    /// Lends up to `max` received frames to `f`, in arrival order; returns how many.
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8]), max: usize) -> io::Result<usize>;

    /// [`recv_batch`](Link::recv_batch), telling `f` with each frame whether
    /// its transport checksum (TCP or UDP) is known good: verified below (by
    /// Linux or the device), or computed by the link itself. Whoever gets
    /// the frame then need not verify it again. By default none is.
    fn recv_batch_checked(
        &mut self,
        f: &mut dyn FnMut(&[u8], bool),
        max: usize,
    ) -> io::Result<usize> {
        self.recv_batch(&mut |frame| f(frame, false), max)
    }

    /// Lends up to `max` received frames, with their checksum words (as
    /// [`recv_batch_checked`](Link::recv_batch_checked)), to `f` a slice at a
    /// time (at most [`LENT_AT_ONCE`] frames each): no buffer of a slice is
    /// reused before `f` returns, so that a multiplexer classifies and
    /// delivers a slice where it lies. Returns how many frames were taken
    /// (lent, or dropped by the link), as `recv_batch` does.
    ///
    /// By default the frames are copied into `scratch` as `recv_batch_checked`
    /// lends them; a link whose frames stay put for the length of a batch
    /// lends them in place, and the copy is saved.
    fn recv_lent(
        &mut self,
        scratch: &mut LendScratch,
        max: usize,
        f: &mut dyn FnMut(&[Lent<'_>]),
    ) -> io::Result<usize> {
        let LendScratch { bytes, frames } = scratch;
        bytes.clear();
        frames.clear();
        let taken = self.recv_batch_checked(
            &mut |frame, ok| {
                if frames.len() < max {
                    frames.push((bytes.len(), frame.len(), ok));
                    bytes.extend_from_slice(frame);
                }
            },
            max,
        )?;
        for chunk in frames.chunks(LENT_AT_ONCE) {
            let mut lent = [(&[][..], false); LENT_AT_ONCE];
            for (l, &(at, len, ok)) in lent.iter_mut().zip(chunk) {
                *l = (&bytes[at..at + len], ok);
            }
            f(&lent[..chunk.len()]);
        }
        Ok(taken)
    }

    /// Lends transmit buffers to `fill` until it returns `None` or the link is out of
    /// room; returns how many frames were taken (see the trait contract).
    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize>;

    /// Sends a prefix of `frames` by copying them into the link's buffers; returns how
    /// many were taken (sent or dropped as malformed). The rest did not fit now.
    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        let mut next = frames.iter();
        self.send_with(&mut |buf| {
            let frame = next.next()?;
            // A frame longer than the buffer is reported by its length and dropped.
            if let Some(dst) = buf.get_mut(..frame.len()) {
                dst.copy_from_slice(frame);
            }
            Some(frame.len())
        })
    }

    /// Largest Ethernet payload (IP MTU), as the interface reports it.
    fn mtu(&self) -> usize;

    /// Largest frame: [`mtu`](Link::mtu) plus [`MAX_HEADER_LEN`]. Every frame
    /// received fits it.
    fn max_frame_len(&self) -> usize {
        self.mtu() + MAX_HEADER_LEN
    }

    /// Longest frame [`send_with`](Link::send_with) takes, and the length of every
    /// buffer it lends. Beyond [`max_frame_len`](Link::max_frame_len) only on a
    /// link with TCP segmentation offload: a frame longer than that must carry a
    /// whole TCP/IPv4 packet (a *super-segment*), which goes out cut into segments
    /// that fit the MTU, each with the super-segment's headers, its share of the
    /// data and its own checksums (see [`exonet_wire::tso`]); the super-segment's
    /// own TCP checksum field is ignored.
    fn max_send_len(&self) -> usize {
        self.max_frame_len()
    }

    /// The station address to use as the source of frames sent on this link.
    fn mac(&self) -> [u8; 6];

    /// A descriptor to wait on with poll/epoll, if the link has one.
    fn as_raw_fd(&self) -> Option<RawFd>;

    /// Counters since the link was opened.
    fn stats(&self) -> LinkStats;

    /// Arms the wake-up of [`as_raw_fd`](Link::as_raw_fd) for a caller about to sleep
    /// on it, and returns whether frames may have arrived since the last
    /// `recv_batch` (then receive instead of sleeping). Links whose descriptor is
    /// always armed (kernel sockets) keep the default, which does nothing.
    fn prepare_sleep(&mut self) -> bool {
        false
    }

    /// Holds back the kick a send makes (a system call per call on links that
    /// need one: AF_XDP in copy mode sends only when kicked) until
    /// [`uncork`](Link::uncork), so that frames sent one call at a time go in one
    /// kick. Frames still go into the link's ring at once; a link that runs out
    /// of room while corked says so as usual (then uncork). Links without kicks
    /// keep the default, which does nothing.
    fn cork(&mut self) {}

    /// Ends [`cork`](Link::cork), kicking once if frames wait for it. An error
    /// is the link's own, as from [`send_with`](Link::send_with).
    fn uncork(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Answers the SYNs of `listener` with SYN cookies below the application,
    /// which sees only the ACKs that complete them; registering the same
    /// address and port again replaces the entry. Links that cannot keep the
    /// default, `Unsupported`; wrappers that watch or change frames do not
    /// pass it on, as the answered SYNs would go by them.
    fn answer_syns(&mut self, listener: &SynListener) -> io::Result<()> {
        let _ = listener;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this link does not answer SYNs",
        ))
    }

    /// Stops answering the SYNs to `ip`:`port`, if it did.
    fn stop_answering_syns(&mut self, ip: Ipv4Addr, port: u16) {
        let _ = (ip, port);
    }

    /// Longest a caller may sleep before calling the link again even without any
    /// readiness on [`as_raw_fd`](Link::as_raw_fd); `None` means no limit. Links that
    /// hold frames for later (delay, reordering) say when they are due.
    fn poll_timeout(&self) -> Option<Duration> {
        None
    }
}

/// Every method forwarded, so that wrappers over a `Box<dyn Link>` or a `&mut` borrow
/// keep the inner link's own provided methods.
macro_rules! forward_link {
    () => {
        fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8]), max: usize) -> io::Result<usize> {
            (**self).recv_batch(f, max)
        }
        fn recv_batch_checked(
            &mut self,
            f: &mut dyn FnMut(&[u8], bool),
            max: usize,
        ) -> io::Result<usize> {
            (**self).recv_batch_checked(f, max)
        }
        fn recv_lent(
            &mut self,
            scratch: &mut LendScratch,
            max: usize,
            f: &mut dyn FnMut(&[Lent<'_>]),
        ) -> io::Result<usize> {
            (**self).recv_lent(scratch, max, f)
        }
        fn send_with(
            &mut self,
            fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        ) -> io::Result<usize> {
            (**self).send_with(fill)
        }
        fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
            (**self).send_batch(frames)
        }
        fn mtu(&self) -> usize {
            (**self).mtu()
        }
        fn max_frame_len(&self) -> usize {
            (**self).max_frame_len()
        }
        fn max_send_len(&self) -> usize {
            (**self).max_send_len()
        }
        fn mac(&self) -> [u8; 6] {
            (**self).mac()
        }
        fn as_raw_fd(&self) -> Option<RawFd> {
            (**self).as_raw_fd()
        }
        fn stats(&self) -> LinkStats {
            (**self).stats()
        }
        fn poll_timeout(&self) -> Option<Duration> {
            (**self).poll_timeout()
        }
        fn prepare_sleep(&mut self) -> bool {
            (**self).prepare_sleep()
        }
        fn cork(&mut self) {
            (**self).cork()
        }
        fn uncork(&mut self) -> io::Result<()> {
            (**self).uncork()
        }
        fn answer_syns(&mut self, listener: &SynListener) -> io::Result<()> {
            (**self).answer_syns(listener)
        }
        fn stop_answering_syns(&mut self, ip: Ipv4Addr, port: u16) {
            (**self).stop_answering_syns(ip, port)
        }
    };
}

impl<L: Link + ?Sized> Link for &mut L {
    forward_link!();
}

impl<L: Link + ?Sized> Link for Box<L> {
    forward_link!();
}

/// Whether a length returned by a `send_with` fill can be sent from a buffer of
/// `cap` bytes.
fn sendable(len: usize, cap: usize) -> bool {
    (MIN_FRAME_LEN..=cap).contains(&len)
}
