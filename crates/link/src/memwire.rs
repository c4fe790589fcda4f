//! An in-memory Ethernet cable between two links, in one process or across two.
//!
//! The cable is a sealed memfd holding two single-producer single-consumer frame rings,
//! one per direction, and two eventfds, one per receiver. Like a real cable and NIC it
//! never pushes back: a frame sent while the peer's queue is full is lost and counted
//! in the *receiver's* [`LinkStats::rx_dropped`], as a NIC counts missed frames.
//!
//! [`pair`] gives both ends in one process. Across processes, [`cable`] creates the
//! cable and returns one end plus a [`FarEnd`]: three descriptors to pass to the other
//! process (inherited over `fork`/`exec` or sent with `SCM_RIGHTS`), which opens the
//! other end with [`FarEnd::open`].
//!
//! Each end's [`Link::as_raw_fd`] is its eventfd, written by the peer only when the end
//! has announced it may sleep ([`Link::prepare_sleep`]), so a busy
//! cable costs no system calls.
//!
//! The two processes trust each other not to scribble on the rings: indices and
//! lengths read from shared memory are bounds-checked, so a broken peer causes dropped
//! frames or `InvalidData` errors, never out-of-bounds access, but frames are lent
//! straight from shared memory.
//!
//! # Layout (version 1, little-endian, offsets in bytes)
//!
//! | offset | content |
//! |---|---|
//! | 0 | magic `b"exo-wire"`, version u32, slots u32, slot size u32, MTU u32, MAC of end A, MAC of end B |
//! | 64 + 128·r | ring r consumer line: head u32, waiting u32 |
//! | 128 + 128·r | ring r producer line: tail u32, pad, dropped u64 |
//! | 320 + r·slots·slot size | ring r slots: frame length u16, frame |
//!
//! Ring 0 carries frames from end A to end B, ring 1 from B to A. Eventfd r is
//! written to wake the consumer of ring r. Head and tail are free-running counters;
//! the slot count is a power of two.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::sys::{self, Mmap};
use crate::{sendable, Link, LinkStats, MAX_HEADER_LEN};

const MAGIC: [u8; 8] = *b"exo-wire";
const VERSION: u32 = 1;
const CTL_OFF: usize = 64;
const CTL_LEN: usize = 128;
const DATA_OFF: usize = CTL_OFF + 2 * CTL_LEN;
const HEAD: usize = 0;
const WAITING: usize = 4;
const TAIL: usize = 64;
const DROPPED: usize = 72;
/// Bytes before the frame in a slot: its length. Two bytes also put the IP header of
/// an untagged frame on a 16-byte boundary.
const LEN_PREFIX: usize = 2;
const MAX_SLOTS: usize = 1 << 20;
const MAX_MTU: usize = u16::MAX as usize - MAX_HEADER_LEN;

/// Shape of a new cable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Frames each direction can hold before arrivals are dropped; rounded up to a
    /// power of two.
    pub slots: usize,
    /// MTU of both ends.
    pub mtu: usize,
    /// Station addresses of end A (the creator's) and end B.
    pub macs: [[u8; 6]; 2],
}

impl Default for Config {
    /// 1024 slots, MTU 1500, MACs 02:00:00:00:00:01 and 02:00:00:00:00:02.
    fn default() -> Self {
        Config {
            slots: 1024,
            mtu: 1500,
            macs: [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]],
        }
    }
}

/// Both ends of a new cable with the default [`Config`].
pub fn pair() -> io::Result<(MemWire, MemWire)> {
    pair_with(Config::default())
}

/// Both ends of a new cable.
pub fn pair_with(cfg: Config) -> io::Result<(MemWire, MemWire)> {
    let (a, far) = cable(cfg)?;
    Ok((a, far.open()?))
}

/// Creates a cable: end A, and what another process needs to open end B.
pub fn cable(cfg: Config) -> io::Result<(MemWire, FarEnd)> {
    if cfg.slots == 0 || cfg.slots > MAX_SLOTS || !(68..=MAX_MTU).contains(&cfg.mtu) {
        return Err(invalid("slots must be 1..=2^20 and the MTU 68..=65517"));
    }
    let slots = cfg.slots.next_power_of_two();
    let slot_size = (LEN_PREFIX + cfg.mtu + MAX_HEADER_LEN).next_multiple_of(64);
    let len = DATA_OFF + 2 * slots * slot_size;

    // SAFETY: the name is a NUL-terminated literal.
    let mem = sys::owned(unsafe {
        libc::memfd_create(
            c"exonet-memwire".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    })?;
    let size = libc::off_t::try_from(len).map_err(io::Error::other)?;
    // SAFETY: plain system calls on a descriptor we own.
    sys::cvt(unsafe { libc::ftruncate(mem.as_raw_fd(), size) })?;
    // Sealed so that neither side can shrink the file under the other's mapping
    // (which would turn ring accesses into SIGBUS).
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: as above.
    sys::cvt(unsafe { libc::fcntl(mem.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;

    let map = Mmap::shared(mem.as_raw_fd(), len)?;
    let mut h = [0u8; CTL_OFF];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(slots as u32).to_le_bytes());
    h[16..20].copy_from_slice(&(slot_size as u32).to_le_bytes());
    h[20..24].copy_from_slice(&(cfg.mtu as u32).to_le_bytes());
    h[24..30].copy_from_slice(&cfg.macs[0]);
    h[30..36].copy_from_slice(&cfg.macs[1]);
    // SAFETY: the mapping is at least DATA_OFF bytes long and not yet shared with the
    // peer; the rest of it is zero (ftruncate), which is the initial ring state.
    unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), map.as_ptr(), h.len()) };

    let wake = [sys::eventfd()?, sys::eventfd()?];
    let far = FarEnd {
        mem: mem.try_clone()?,
        wake: [wake[0].try_clone()?, wake[1].try_clone()?],
    };
    let a = MemWire::new(map, 0, wake)?;
    Ok((a, far))
}

/// What opens end B of a cable: the memfd and the two eventfds.
#[derive(Debug)]
pub struct FarEnd {
    mem: OwnedFd,
    wake: [OwnedFd; 2],
}

impl FarEnd {
    /// The descriptors in the order [`from_fds`](FarEnd::from_fds) takes them.
    pub fn into_fds(self) -> [OwnedFd; 3] {
        let [w0, w1] = self.wake;
        [self.mem, w0, w1]
    }

    /// The descriptors another process received, in [`into_fds`](FarEnd::into_fds)
    /// order. They are checked when the end is opened.
    pub fn from_fds(fds: [OwnedFd; 3]) -> FarEnd {
        let [mem, w0, w1] = fds;
        FarEnd {
            mem,
            wake: [w0, w1],
        }
    }

    /// The raw descriptors, e.g. to clear close-on-exec before spawning a child.
    pub fn as_raw_fds(&self) -> [RawFd; 3] {
        [
            self.mem.as_raw_fd(),
            self.wake[0].as_raw_fd(),
            self.wake[1].as_raw_fd(),
        ]
    }

    /// Opens end B. Open each cable's end B once: the rings have one producer and one
    /// consumer per direction.
    pub fn open(self) -> io::Result<MemWire> {
        let fd = self.mem.as_raw_fd();
        // SAFETY: plain system call, no pointers.
        let seals = sys::cvt(unsafe { libc::fcntl(fd, libc::F_GET_SEALS) })?;
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(invalid("memwire memfd is not sealed against shrinking"));
        }
        // SAFETY: `st` is plain data; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a live `stat`.
        sys::cvt(unsafe { libc::fstat(fd, &mut st) })?;
        let len = usize::try_from(st.st_size).map_err(io::Error::other)?;
        if len < DATA_OFF {
            return Err(invalid("memwire memfd too small"));
        }
        let map = Mmap::shared(fd, len)?;
        MemWire::new(map, 1, self.wake)
    }
}

/// One end of a memwire cable (see the [module documentation](self)).
#[derive(Debug)]
pub struct MemWire {
    map: Mmap,
    /// 0 for end A, 1 for end B: the ring this end produces into.
    side: usize,
    slots: u32,
    slot_size: usize,
    mtu: usize,
    mac: [u8; 6],
    /// This end's copies of the counters only it writes.
    rx_head: u32,
    tx_tail: u32,
    /// Readable when this end's receive ring may have frames.
    wake_own: OwnedFd,
    wake_peer: OwnedFd,
    /// Where a frame goes that the full cable will lose.
    scratch: Vec<u8>,
    stats: LinkStats,
}

impl MemWire {
    /// Validates the header (the peer may have written anything) and takes end `side`.
    fn new(map: Mmap, side: usize, wake: [OwnedFd; 2]) -> io::Result<MemWire> {
        let mut h = [0u8; CTL_OFF];
        // SAFETY: callers checked that the mapping holds at least DATA_OFF bytes.
        unsafe { std::ptr::copy_nonoverlapping(map.as_ptr(), h.as_mut_ptr(), h.len()) };
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) as usize;
        let (slots, slot_size, mtu) = (word(12), word(16), word(20));
        if h[0..8] != MAGIC || word(8) != VERSION as usize {
            return Err(invalid("not a memwire cable of version 1"));
        }
        let fits = slots
            .checked_mul(slot_size)
            .and_then(|b| b.checked_mul(2))
            .and_then(|b| b.checked_add(DATA_OFF))
            .is_some_and(|end| end <= map.len());
        if !slots.is_power_of_two()
            || slots > MAX_SLOTS
            || !(68..=MAX_MTU).contains(&mtu)
            || slot_size < LEN_PREFIX + mtu + MAX_HEADER_LEN
            || !slot_size.is_multiple_of(64)
            || !fits
        {
            return Err(invalid("memwire header is inconsistent"));
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&h[24 + 6 * side..30 + 6 * side]);
        let [w0, w1] = wake;
        // Eventfd r wakes the consumer of ring r; this end consumes ring 1 - side.
        let (wake_own, wake_peer) = if side == 0 { (w1, w0) } else { (w0, w1) };
        let mut w = MemWire {
            map,
            side,
            slots: slots as u32,
            slot_size,
            mtu,
            mac,
            rx_head: 0,
            tx_tail: 0,
            wake_own,
            wake_peer,
            scratch: vec![0; mtu + MAX_HEADER_LEN],
            stats: LinkStats::default(),
        };
        // Resume from where the ring stands (the peer may have sent already).
        w.rx_head = w.ctl(1 - side, HEAD).load(Ordering::Acquire);
        w.tx_tail = w.ctl(side, TAIL).load(Ordering::Acquire);
        Ok(w)
    }

    fn ctl(&self, ring: usize, field: usize) -> &AtomicU32 {
        debug_assert!(ring < 2 && matches!(field, HEAD | WAITING | TAIL));
        // SAFETY: ring control fields lie within the header area the constructor
        // checked, are 4-byte aligned (the mapping is page-aligned), and are only ever
        // accessed atomically, by both processes.
        unsafe {
            AtomicU32::from_ptr(
                self.map
                    .as_ptr()
                    .add(CTL_OFF + CTL_LEN * ring + field)
                    .cast(),
            )
        }
    }

    fn dropped(&self, ring: usize) -> &AtomicU64 {
        // SAFETY: as for `ctl`; the field is 8-byte aligned.
        unsafe {
            AtomicU64::from_ptr(
                self.map
                    .as_ptr()
                    .add(CTL_OFF + CTL_LEN * ring + DROPPED)
                    .cast(),
            )
        }
    }

    /// Start of the slot for counter value `idx` of ring `ring`.
    fn slot(&self, ring: usize, idx: u32) -> *mut u8 {
        let i = (idx & (self.slots - 1)) as usize;
        let off = DATA_OFF + (ring * self.slots as usize + i) * self.slot_size;
        // SAFETY: `i < slots`, and the constructor checked that both rings of `slots`
        // slots of `slot_size` bytes fit in the mapping.
        unsafe { self.map.as_ptr().add(off) }
    }

    /// Announces that this end may sleep: the peer will write our eventfd after its
    /// next send. The fence pairs with the one in `wake_peer_if_waiting`: either the
    /// peer sees the flag, or we see its frames on our next look at the ring.
    fn arm(&self) {
        let waiting = self.ctl(1 - self.side, WAITING);
        // Zero means the peer has consumed the flag and (Acquire) finished signalling,
        // so the eventfd can be reset without losing a wake-up. While the flag is still
        // set, the eventfd was not written since we last reset it.
        if waiting.load(Ordering::Acquire) == 0 {
            sys::eventfd_drain(&self.wake_own);
            waiting.store(1, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
    }

    fn wake_peer_if_waiting(&self) {
        fence(Ordering::SeqCst);
        let waiting = self.ctl(self.side, WAITING);
        if waiting.load(Ordering::Relaxed) != 0 {
            sys::eventfd_signal(&self.wake_peer);
            waiting.store(0, Ordering::Release);
        }
    }
}

impl Link for MemWire {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8]), max: usize) -> io::Result<usize> {
        let ring = 1 - self.side;
        let cap = self.max_frame_len();
        let mut n = 0;
        while n < max {
            let tail = self.ctl(ring, TAIL).load(Ordering::Acquire);
            let avail = tail.wrapping_sub(self.rx_head);
            if avail > self.slots {
                return if n > 0 {
                    Ok(n)
                } else {
                    Err(invalid("memwire peer corrupted its tail"))
                };
            }
            if avail == 0 {
                break;
            }
            let take = (avail as usize).min(max - n);
            for _ in 0..take {
                let slot = self.slot(ring, self.rx_head);
                let mut len = [0u8; LEN_PREFIX];
                // SAFETY: the slot is published (below the Acquire-loaded tail) and
                // holds at least LEN_PREFIX + cap bytes.
                unsafe { std::ptr::copy_nonoverlapping(slot, len.as_mut_ptr(), LEN_PREFIX) };
                let len = usize::from(u16::from_le_bytes(len));
                if sendable(len, cap) {
                    // SAFETY: `len <= cap` bytes after the prefix lie within the slot,
                    // which the producer does not touch until we advance the head.
                    let frame = unsafe { std::slice::from_raw_parts(slot.add(LEN_PREFIX), len) };
                    f(frame);
                    n += 1;
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += len as u64;
                } else {
                    self.stats.rx_dropped += 1;
                }
                self.rx_head = self.rx_head.wrapping_add(1);
            }
            self.ctl(ring, HEAD).store(self.rx_head, Ordering::Release);
        }
        Ok(n)
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        let ring = self.side;
        let cap = self.max_frame_len();
        let mut head = self.ctl(ring, HEAD).load(Ordering::Acquire);
        if self.tx_tail.wrapping_sub(head) > self.slots {
            return Err(invalid("memwire peer corrupted its head"));
        }
        let (mut n, mut sent) = (0, false);
        loop {
            if self.tx_tail.wrapping_sub(head) >= self.slots {
                head = self.ctl(ring, HEAD).load(Ordering::Acquire);
            }
            let full = self.tx_tail.wrapping_sub(head) >= self.slots;
            let slot = self.slot(ring, self.tx_tail);
            let buf = if full {
                &mut self.scratch[..]
            } else {
                // SAFETY: the slot at the tail is free (the consumer is behind it) and
                // holds LEN_PREFIX + cap bytes; only this end writes free slots.
                unsafe { std::slice::from_raw_parts_mut(slot.add(LEN_PREFIX), cap) }
            };
            let Some(len) = fill(buf) else { break };
            n += 1;
            if !sendable(len, cap) {
                self.stats.tx_dropped += 1;
                continue;
            }
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
            if full {
                // Lost on the cable: counted where the peer's stats will find it.
                self.dropped(ring).fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let prefix = (len as u16).to_le_bytes();
            // SAFETY: the free slot holds at least LEN_PREFIX bytes.
            unsafe { std::ptr::copy_nonoverlapping(prefix.as_ptr(), slot, LEN_PREFIX) };
            self.tx_tail = self.tx_tail.wrapping_add(1);
            self.ctl(ring, TAIL).store(self.tx_tail, Ordering::Release);
            sent = true;
        }
        if sent {
            self.wake_peer_if_waiting();
        }
        Ok(n)
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn as_raw_fd(&self) -> Option<RawFd> {
        Some(self.wake_own.as_raw_fd())
    }

    fn stats(&self) -> LinkStats {
        let lost = self.dropped(1 - self.side).load(Ordering::Relaxed);
        LinkStats {
            rx_dropped: self.stats.rx_dropped + lost,
            ..self.stats
        }
    }

    fn prepare_sleep(&mut self) -> bool {
        self.arm();
        // After the fence in `arm`: a frame sent before the peer could see
        // the flag is in the ring now.
        let ring = 1 - self.side;
        self.ctl(ring, TAIL).load(Ordering::Acquire) != self.rx_head
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}
