//! AF_PACKET with memory-mapped rings: a receive ring and a transmit ring of fixed
//! frames, both on one socket bound to one interface.
//!
//! The receive ring works in one of two [`RxMode`]s. [`RxMode::Blocks`] (the default)
//! is TPACKET_V3: frames packed into blocks, and the kernel hands a block over when it
//! is full or after [`Config::block_timeout_ms`], which bounds the receive latency at
//! low rates (a lone frame waits for the timer). [`RxMode::Frames`] is TPACKET_V2: one
//! slot per frame, handed over (and the socket made readable) as soon as the frame is
//! written: a wake-up per frame instead of per block, for latency. The version is the
//! socket's, so the transmit ring follows it; both versions transmit alike.
//!
//! Receive is zero-copy: frames are lent straight from the ring, and a block (or slot)
//! goes back to the kernel once all its frames have been lent. Transmit writes frames
//! straight into ring slots and kicks the kernel with one `sendto` per batch. The
//! socket ignores frames leaving the interface (`PACKET_IGNORE_OUTGOING`), so it never
//! receives its own or the host's transmissions, and bypasses the qdisc layer when the
//! kernel allows it and the link sends no super-segments.
//!
//! TCP segmentation offload, both ways. A TCP super-segment
//! that arrives whole (Linux over a veth leaves segmentation to a NIC that is not
//! there, and GRO merges) is cut here into frames that fit the MTU
//! ([`exonet_wire::tso::Cutter`]), as that NIC would have sent them; so is a
//! UDP super-datagram (a Linux socket's `UDP_SEGMENT`), into the datagrams of
//! the size its `virtio_net_hdr` gives, which only a socket with those
//! headers on receives (without them it is dropped and counted). And when the
//! interface has TSO on (`ethtool -k`), the link takes super-segments to send
//! ([`Link::max_send_len`]): each goes to the kernel with a `virtio_net_hdr`
//! (`PACKET_VNET_HDR`) that says where to cut, and is cut by the device or by
//! Linux's GSO, or crosses a veth whole; if TSO is turned off meanwhile, Linux
//! cuts them in software. In [`RxMode::Frames`], where a slot
//! holds a frame of the MTU, the kernel also queues a longer frame whole on the
//! socket (`PACKET_COPY_THRESH`), marks its slot, and the link reads it from
//! there with `recv`: a system call per super-segment, and slots stay small.

use std::cell::Cell;
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use exonet_wire::tso::Cutter;

use crate::sys::{self, Mmap};
use crate::vnet::{self, Taken};
use crate::{sendable, Link, LinkStats, MAX_HEADER_LEN, MAX_SUPER_LEN};

/// `TPACKET_ALIGN`: frame headers and data are aligned to this in the rings.
const fn tpacket_align(n: usize) -> usize {
    (n + libc::TPACKET_ALIGNMENT - 1) & !(libc::TPACKET_ALIGNMENT - 1)
}

/// Offset of `block_status` in a V3 block descriptor (likewise the other fields).
const BLOCK_STATUS: usize =
    offset_of!(libc::tpacket_block_desc, hdr) + offset_of!(libc::tpacket_hdr_v1, block_status);
const BLOCK_NUM_PKTS: usize =
    offset_of!(libc::tpacket_block_desc, hdr) + offset_of!(libc::tpacket_hdr_v1, num_pkts);
const BLOCK_FIRST_PKT: usize = offset_of!(libc::tpacket_block_desc, hdr)
    + offset_of!(libc::tpacket_hdr_v1, offset_to_first_pkt);
/// Nominal receive frame size: V3 packs frames of any size into blocks, but the
/// kernel still checks the frame geometry.
const RX_FRAME: usize = 2048;
/// Room a V2 receive slot needs before the network header of a frame: the kernel puts
/// that at `TPACKET_ALIGN(tp_hdrlen + 16)` for link-layer headers of up to 16 bytes,
/// and the link-layer header just before it.
const V2_RX_ROOM: usize = tpacket_align(libc::TPACKET2_HDRLEN + 16);

/// Transmit slots with segmentation offload: each slot holds a super-segment
/// (128 KiB), so fewer than the default 512 (8 MiB of ring).
const SUPER_TX_FRAMES: usize = 64;
/// `PACKET_COPY_THRESH` and `TP_STATUS_COPY` (linux/if_packet.h): a frame too
/// long for its V2 slot is also queued whole on the socket, to be read with
/// `recv`, and its slot says so.
const PACKET_COPY_THRESH: libc::c_int = 7;
const TP_STATUS_COPY: u32 = 1 << 1;
/// The socket's receive buffer for those whole copies (`SO_RCVBUF`).
const COPY_RCVBUF: libc::c_int = 4 << 20;

/// How the kernel hands received frames over (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RxMode {
    /// TPACKET_V3: frames packed into blocks of [`Config::block_size`], each handed
    /// over when full or [`Config::block_timeout_ms`] after its first frame. Fewest
    /// wake-ups and the best throughput; a lone frame waits for the timer (1 ms at
    /// least).
    #[default]
    Blocks,
    /// TPACKET_V2: one slot per frame, handed over as soon as it is written. The
    /// receive ring's memory (`block_size * block_count`) is cut into slots of one
    /// largest frame each; `block_timeout_ms` is unused. The transmit ring is
    /// TPACKET_V2 too.
    Frames,
}

impl RxMode {
    fn version(self) -> libc::c_int {
        (match self {
            RxMode::Blocks => libc::tpacket_versions::TPACKET_V3,
            RxMode::Frames => libc::tpacket_versions::TPACKET_V2,
        }) as libc::c_int
    }

    /// Offset of a frame header's status word in its slot.
    fn status_off(self) -> usize {
        match self {
            RxMode::Blocks => offset_of!(libc::tpacket3_hdr, tp_status),
            RxMode::Frames => offset_of!(libc::tpacket2_hdr, tp_status),
        }
    }

    /// Where a transmit frame's data starts in its slot: after the aligned frame
    /// header (the kernel's `tp_hdrlen - sizeof(struct sockaddr_ll)`).
    fn tx_data_off(self) -> usize {
        tpacket_align(match self {
            RxMode::Blocks => size_of::<libc::tpacket3_hdr>(),
            RxMode::Frames => size_of::<libc::tpacket2_hdr>(),
        })
    }
}

/// Ring geometry and socket options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// How received frames are handed over.
    pub rx_mode: RxMode,
    /// Bytes per receive block: a power of two, at least one page and at least the
    /// largest frame plus its header. In [`RxMode::Frames`], cut into slots.
    pub block_size: usize,
    /// Receive blocks.
    pub block_count: usize,
    /// Longest the kernel keeps a partly filled block before handing it over (ms;
    /// [`RxMode::Blocks`] only).
    pub block_timeout_ms: u32,
    /// Transmit slots (rounded up to fill whole pages).
    pub tx_frames: usize,
    /// Put the interface in promiscuous mode while the socket is open.
    pub promiscuous: bool,
    /// Send straight to the driver, skipping the qdisc layer, if the kernel allows.
    /// Not with super-segments: the bypass drops any frame the device cannot take
    /// whole, and the kernel then hands the slot back to be sent again, so a
    /// super-segment queued after TSO was turned off would block the ring for
    /// good; through the qdisc layer Linux cuts it in software instead.
    pub qdisc_bypass: bool,
    /// Take TCP super-segments to send when the interface has TSO on (see the
    /// [module documentation](self)). The transmit ring then has at most 64
    /// slots, of 128 KiB.
    pub segmentation: bool,
}

impl Default for Config {
    /// Blocks mode, 32 receive blocks of 128 KiB, 1 ms block timeout, 512 transmit
    /// slots, not promiscuous, qdisc bypass on, segmentation offload on.
    fn default() -> Self {
        Config {
            rx_mode: RxMode::Blocks,
            block_size: 1 << 17,
            block_count: 32,
            block_timeout_ms: 1,
            tx_frames: 512,
            promiscuous: false,
            qdisc_bypass: true,
            segmentation: true,
        }
    }
}

/// The receive ring and where we are in it.
#[derive(Debug)]
enum RxRing {
    Blocks(Blocks),
    Frames(Frames),
}

/// A TPACKET_V3 receive ring of `count` blocks of `size` bytes.
#[derive(Debug)]
struct Blocks {
    size: usize,
    count: usize,
    /// The current block, frames left in it and the offset of the next one.
    current: usize,
    left: u32,
    next: usize,
    /// A super-segment of the current block being cut, when the last batch had
    /// no room for all of its segments: where it lies, its length, and the
    /// offset from it to the next frame's header.
    cutting: Option<(Cutter, usize, usize, u32)>,
}

/// A TPACKET_V2 receive ring of `count` slots of `size` bytes, end to end from the
/// start of the mapping (slots fill blocks exactly: both sizes are powers of two).
#[derive(Debug)]
struct Frames {
    size: usize,
    count: usize,
    /// The next slot the kernel fills.
    head: usize,
    /// A frame too long for its slot, read whole from the socket
    /// (`TP_STATUS_COPY`), without its `virtio_net_hdr`.
    copy: Vec<u8>,
    /// A super-segment in `copy`, of this length, being cut, when the last
    /// batch had no room for all of its segments.
    cutting: Option<(Cutter, usize)>,
}

/// An AF_PACKET link bound to one interface (see the [module documentation](self)).
///
/// [`stats`](Link::stats) asks the kernel for its drop counter: one system call.
#[derive(Debug)]
pub struct AfPacket {
    fd: OwnedFd,
    map: Mmap,
    ifname: String,
    mtu: usize,
    mac: [u8; 6],
    /// Also picks the transmit ring's frame header: the version is the socket's.
    mode: RxMode,
    rx: RxRing,
    tx_off: usize,
    tx_frame_size: usize,
    tx_frames: usize,
    tx_head: usize,
    /// Frames were queued but the kernel could not be kicked yet.
    tx_unkicked: bool,
    /// `PACKET_VNET_HDR` is on: super-segments are sent (and every frame in the
    /// rings has a `virtio_net_hdr` in front).
    vnet: bool,
    stats: LinkStats,
    /// Drops the kernel reported (its counter resets on every read).
    kernel_drops: Cell<u64>,
    deferred: Option<io::Error>,
}

impl AfPacket {
    /// Opens a socket on interface `ifname` with the default [`Config`].
    pub fn open(ifname: &str) -> io::Result<AfPacket> {
        Self::with_config(ifname, Config::default())
    }

    /// Opens a socket on interface `ifname`. Needs `CAP_NET_RAW`.
    pub fn with_config(ifname: &str, cfg: Config) -> io::Result<AfPacket> {
        // SAFETY: plain system call, no pointers.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        // Protocol 0: nothing is received until the rings exist and `bind` names the
        // interface.
        // SAFETY: plain system call, no pointers.
        let fd = sys::owned(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })?;
        let raw = fd.as_raw_fd();
        let ifindex = sys::if_index(ifname)?;
        let (mtu, mac) = sys::if_mtu_mac(raw, ifname)?;
        let max_frame = mtu + MAX_HEADER_LEN;
        let mode = cfg.rx_mode;
        // Only where the device (or Linux's GSO before it) will cut them.
        let vnet = cfg.segmentation && sys::if_tso(raw, ifname).unwrap_or(false);

        // A V3 block holds at least one frame with its header; a V2 slot is one frame
        // with the room before it (and its `virtio_net_hdr`), rounded up so that slots
        // fill blocks exactly.
        let (rx_frame, rx_frames) = match mode {
            RxMode::Blocks => (RX_FRAME, cfg.block_size / RX_FRAME * cfg.block_count),
            RxMode::Frames => {
                let slot = (V2_RX_ROOM + vnet::LEN + max_frame).next_power_of_two();
                (slot, cfg.block_size / slot * cfg.block_count)
            }
        };
        if !cfg.block_size.is_power_of_two()
            || cfg.block_size < page
            || cfg.block_size < mode.tx_data_off() + max_frame
            || cfg.block_size < rx_frame
            || cfg.block_count == 0
            || cfg.tx_frames == 0
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "block size must be a power of two of at least a page and a frame",
            ));
        }
        let (tx_max, tx_want) = if vnet {
            (
                vnet::LEN + MAX_SUPER_LEN,
                cfg.tx_frames.min(SUPER_TX_FRAMES),
            )
        } else {
            (max_frame, cfg.tx_frames)
        };
        let tx_frame_size = (mode.tx_data_off() + tx_max).next_power_of_two();
        let tx_block = tx_frame_size.max(page);
        let per_block = tx_block / tx_frame_size;
        let tx_blocks = tx_want.div_ceil(per_block);
        let tx_frames = tx_blocks * per_block;

        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VERSION, &mode.version())?;
        if vnet {
            // Before the rings: their frame layout depends on it.
            sys::setsockopt(
                raw,
                libc::SOL_PACKET,
                libc::PACKET_VNET_HDR,
                &1 as &libc::c_int,
            )?;
        }
        // Malformed transmit frames are skipped instead of stalling the ring.
        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_LOSS, &1 as &libc::c_int)?;
        sys::setsockopt(
            raw,
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &1 as &libc::c_int,
        )?;
        if mode == RxMode::Frames {
            // Super-segments do not fit a slot: their whole copies wait on the socket.
            sys::setsockopt(
                raw,
                libc::SOL_PACKET,
                PACKET_COPY_THRESH,
                &1 as &libc::c_int,
            )?;
            if sys::setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &COPY_RCVBUF).is_err() {
                let _ = sys::setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, &COPY_RCVBUF);
            }
        }
        if cfg.qdisc_bypass && !vnet {
            // Optional: older kernels and some devices refuse it.
            let _ = sys::setsockopt(
                raw,
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                &1 as &libc::c_int,
            );
        }
        let uint = |v: usize| libc::c_uint::try_from(v).map_err(io::Error::other);
        // V2 takes the leading `tpacket_req` part of the request; the block timeout and
        // the rest only matter to V3.
        let rx_req = libc::tpacket_req3 {
            tp_block_size: uint(cfg.block_size)?,
            tp_block_nr: uint(cfg.block_count)?,
            tp_frame_size: uint(rx_frame)?,
            tp_frame_nr: uint(rx_frames)?,
            tp_retire_blk_tov: cfg.block_timeout_ms,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &rx_req)?;
        let tx_req = libc::tpacket_req3 {
            tp_block_size: uint(tx_block)?,
            tp_block_nr: uint(tx_blocks)?,
            tp_frame_size: uint(tx_frame_size)?,
            tp_frame_nr: uint(tx_frames)?,
            tp_retire_blk_tov: 0,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_TX_RING, &tx_req)?;
        // The kernel maps the receive ring first, then the transmit ring.
        let tx_off = cfg.block_size * cfg.block_count;
        let map = Mmap::shared(raw, tx_off + tx_blocks * tx_block)?;

        if cfg.promiscuous {
            let mreq = libc::packet_mreq {
                mr_ifindex: ifindex,
                mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
                mr_alen: 0,
                mr_address: [0; 8],
            };
            sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)?;
        }
        // SAFETY: `sockaddr_ll` is plain data for which all zeroes is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as libc::c_ushort;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex;
        // SAFETY: passes a live `sockaddr_ll` and its size.
        sys::cvt(unsafe {
            libc::bind(
                raw,
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;

        let rx = match mode {
            RxMode::Blocks => RxRing::Blocks(Blocks {
                size: cfg.block_size,
                count: cfg.block_count,
                current: 0,
                left: 0,
                next: 0,
                cutting: None,
            }),
            RxMode::Frames => RxRing::Frames(Frames {
                size: rx_frame,
                count: rx_frames,
                head: 0,
                copy: vec![0; MAX_SUPER_LEN],
                cutting: None,
            }),
        };
        Ok(AfPacket {
            fd,
            map,
            ifname: ifname.to_string(),
            mtu,
            mac,
            mode,
            rx,
            tx_off,
            tx_frame_size,
            tx_frames,
            tx_head: 0,
            tx_unkicked: false,
            vnet,
            stats: LinkStats::default(),
            kernel_drops: Cell::new(0),
            deferred: None,
        })
    }

    /// The interface the socket is bound to.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Asks the kernel to send the queued frames, without waiting for them.
    fn kick(&mut self) -> io::Result<()> {
        // SAFETY: a zero-length send with no buffer and no address.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        self.tx_unkicked = false;
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Queued frames stay in the ring: kick again on the next call.
                Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR) => self.tx_unkicked = true,
                _ => return Err(e),
            }
        }
        Ok(())
    }
}

/// The status word at `off` in the mapping, shared with the kernel.
fn status(map: &Mmap, off: usize) -> &AtomicU32 {
    debug_assert!(off.is_multiple_of(4) && off + 4 <= map.len());
    // SAFETY: callers pass the offset of a block or frame status word, which lies in
    // the mapping and is 4-byte aligned (blocks and frames are 16-aligned); the kernel
    // and we only access it as a whole word.
    unsafe { AtomicU32::from_ptr(map.as_ptr().add(off).cast()) }
}

fn read_u32(map: &Mmap, off: usize) -> u32 {
    // SAFETY: as for `status`, for a field the kernel wrote before releasing the
    // block to us (the Acquire load of its status orders this read after it).
    unsafe { std::ptr::read(map.as_ptr().add(off).cast::<u32>()) }
}

impl Blocks {
    /// Gives the current block back to the kernel.
    fn release(&mut self, map: &Mmap) {
        status(map, self.current * self.size + BLOCK_STATUS)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.current = (self.current + 1) % self.count;
        self.left = 0;
    }

    /// Lends up to `max` frames to `f`, from the current block on; returns how many.
    /// Each frame follows `vnet_len` bytes of `virtio_net_hdr`.
    fn recv(
        &mut self,
        map: &Mmap,
        vnet_len: usize,
        mtu: usize,
        stats: &mut LinkStats,
        f: &mut dyn FnMut(&[u8], bool),
        max: usize,
    ) -> usize {
        let hdr_len = size_of::<libc::tpacket3_hdr>();
        let mut n = 0;
        while n < max {
            if let Some((mut c, at, len, next_offset)) = self.cutting.take() {
                // SAFETY: the frame lies in the current block (checked when the
                // cut began), which stays ours until released below.
                let frame = unsafe { frame_mut(map, at, len) };
                n += vnet::cut(&mut c, frame, max - n, stats, f);
                if c.remaining() > 0 {
                    self.cutting = Some((c, at, len, next_offset));
                    break;
                }
                self.step(map, stats, next_offset);
                continue;
            }
            let block = self.current * self.size;
            if self.left == 0 {
                let st = status(map, block + BLOCK_STATUS).load(Ordering::Acquire);
                if st & libc::TP_STATUS_USER == 0 {
                    break;
                }
                self.left = read_u32(map, block + BLOCK_NUM_PKTS);
                self.next = read_u32(map, block + BLOCK_FIRST_PKT) as usize;
                if self.left == 0 {
                    self.release(map);
                    continue;
                }
            }
            // The kernel wrote these offsets; check them anyway rather than trust
            // them with an out-of-bounds read.
            if !self.next.is_multiple_of(4) || self.next + hdr_len > self.size {
                stats.rx_dropped += u64::from(self.left);
                self.release(map);
                continue;
            }
            // SAFETY: the header lies within the block (checked above), is aligned
            // (TPACKET_ALIGNMENT), and the block belongs to us until released.
            let h: libc::tpacket3_hdr =
                unsafe { std::ptr::read(map.as_ptr().add(block + self.next).cast()) };
            let start = self.next + usize::from(h.tp_mac);
            let len = h.tp_snaplen as usize;
            if h.tp_snaplen < h.tp_len
                || start + len > self.size
                || usize::from(h.tp_mac) < hdr_len + vnet_len
            {
                stats.rx_dropped += 1;
            } else {
                let vnet = vnet_at(map, block + start, vnet_len);
                // SAFETY: the frame lies within the block, which stays ours (and
                // unchanged by the kernel) until `release`, after the callback returns.
                let frame = unsafe { frame_mut(map, block + start, len) };
                match vnet::lend(frame, vnet, csum_status(h.tp_status), mtu, stats, f) {
                    Taken::Whole => n += 1,
                    Taken::Dropped => {}
                    Taken::Super(mut c) => {
                        n += vnet::cut(&mut c, frame, max - n, stats, f);
                        if c.remaining() > 0 {
                            self.cutting = Some((c, block + start, len, h.tp_next_offset));
                            break;
                        }
                    }
                }
            }
            self.step(map, stats, h.tp_next_offset);
        }
        n
    }

    /// Past the current frame, whose header gave `next_offset`.
    fn step(&mut self, map: &Mmap, stats: &mut LinkStats, next_offset: u32) {
        self.left -= 1;
        if self.left == 0 {
            self.release(map);
        } else if next_offset == 0 {
            stats.rx_dropped += u64::from(self.left);
            self.release(map);
        } else {
            self.next += next_offset as usize;
        }
    }
}

/// The `len` bytes at `at` in the ring.
///
/// # Safety
/// The range lies in `map`, in a block or slot that is ours (the kernel does
/// not write it), and no other reference to it lives while this one does.
#[allow(clippy::mut_from_ref)]
unsafe fn frame_mut(map: &Mmap, at: usize, len: usize) -> &mut [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(map.as_ptr().add(at), len) }
}

/// `TP_STATUS_CSUMNOTREADY` (linux/if_packet.h): the sender (this host, over a
/// veth or loopback) left the transport checksum to hardware that is not there.
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
/// `TP_STATUS_CSUM_VALID`: Linux or the device verified the transport checksum
/// (`skb_csum_unnecessary`).
const TP_STATUS_CSUM_VALID: u32 = 1 << 7;

/// What a frame's `tp_status` says of its transport checksum: (left undone
/// by its sender, verified below).
fn csum_status(tp_status: u32) -> (bool, bool) {
    (
        tp_status & TP_STATUS_CSUMNOTREADY != 0,
        tp_status & TP_STATUS_CSUM_VALID != 0,
    )
}

/// The `virtio_net_hdr` the kernel wrote just before the frame at `frame` in
/// the ring, if the socket has them (`vnet_len` > 0; the caller checked that
/// they lie in the same block or slot).
fn vnet_at(map: &Mmap, frame: usize, vnet_len: usize) -> Option<[u8; vnet::LEN]> {
    let at = frame
        .checked_sub(vnet_len)
        .filter(|_| vnet_len == vnet::LEN)?;
    debug_assert!(frame <= map.len());
    // SAFETY: the header lies in the mapping, in the block or slot the kernel
    // handed over with the frame (the caller's check), which it does not write
    // until given back.
    Some(unsafe { std::ptr::read(map.as_ptr().add(at).cast::<[u8; vnet::LEN]>()) })
}

impl Frames {
    /// Lends up to `max` frames to `f`, from slot `head` on, each slot given back to
    /// the kernel once its frame has been lent (or dropped); returns how many. A
    /// frame too long for its slot is read whole from socket `fd`, behind
    /// `vnet_len` bytes of `virtio_net_hdr`.
    #[allow(clippy::too_many_arguments)]
    fn recv(
        &mut self,
        map: &Mmap,
        fd: RawFd,
        vnet_len: usize,
        mtu: usize,
        stats: &mut LinkStats,
        f: &mut dyn FnMut(&[u8], bool),
        max: usize,
    ) -> usize {
        let hdr_len = size_of::<libc::tpacket2_hdr>();
        let mut n = 0;
        while n < max {
            if let Some((mut c, len)) = self.cutting.take() {
                n += vnet::cut(&mut c, &mut self.copy[..len], max - n, stats, f);
                if c.remaining() > 0 {
                    self.cutting = Some((c, len));
                    break;
                }
                continue;
            }
            let slot = self.head * self.size;
            let st = status(map, slot + RxMode::Frames.status_off());
            if st.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the slot lies in the receive ring (`head < count`, and the
            // slots fill the ring), is aligned (TPACKET_ALIGNMENT), and belongs to us
            // until its status goes back to the kernel.
            let h: libc::tpacket2_hdr = unsafe { std::ptr::read(map.as_ptr().add(slot).cast()) };
            // The kernel wrote the offset and lengths; check them against the slot.
            let start = usize::from(h.tp_mac);
            let len = h.tp_snaplen as usize;
            let mut copied = None;
            if h.tp_status & TP_STATUS_COPY != 0 {
                // The slot holds the front of a longer frame, which waits whole on
                // the socket, in the order of the slots.
                copied = recv_copy(fd, &mut self.copy, vnet_len);
                if copied.is_none() {
                    stats.rx_dropped += 1;
                }
            } else if h.tp_snaplen < h.tp_len
                || start < hdr_len + vnet_len
                || start + len > self.size
            {
                stats.rx_dropped += 1;
            } else {
                let vnet = vnet_at(map, slot + start, vnet_len);
                // SAFETY: the frame lies within the slot (checked above), which stays
                // ours (and unchanged by the kernel) until released below, after the
                // callback.
                let frame = unsafe { frame_mut(map, slot + start, len) };
                match vnet::lend(frame, vnet, csum_status(h.tp_status), mtu, stats, f) {
                    Taken::Whole => n += 1,
                    Taken::Dropped => {}
                    // Cut from a copy, so that the slot can go back now.
                    Taken::Super(c) => {
                        self.copy[..len].copy_from_slice(frame);
                        self.cutting = Some((c, len));
                    }
                }
            }
            st.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.head = (self.head + 1) % self.count;
            if let Some((len, vnet)) = copied {
                let frame = &mut self.copy[..len];
                let vnet = (vnet_len > 0).then_some(vnet);
                match vnet::lend(frame, vnet, csum_status(h.tp_status), mtu, stats, f) {
                    Taken::Whole => n += 1,
                    Taken::Dropped => {}
                    Taken::Super(c) => self.cutting = Some((c, len)),
                }
            }
        }
        n
    }
}

/// Reads the next frame queued whole on packet socket `fd` into the front of
/// `buf`, its `vnet_len` bytes of `virtio_net_hdr` put aside; returns its
/// length and that header, or `None` if there was none or it did not fit.
fn recv_copy(fd: RawFd, buf: &mut [u8], vnet_len: usize) -> Option<(usize, [u8; vnet::LEN])> {
    let mut vnet = [0u8; vnet::LEN];
    let mut iov = [
        libc::iovec {
            iov_base: vnet.as_mut_ptr().cast(),
            iov_len: vnet_len,
        },
        libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        },
    ];
    // SAFETY: `msghdr` is plain data for which all zeroes is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: the kernel writes at most each iovec's length into its live buffer.
    let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    let total = usize::try_from(r).ok()?;
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return None;
    }
    Some((total.checked_sub(vnet_len)?, vnet))
}

impl Link for AfPacket {
    recv_batch_from_checked!();

    fn recv_batch_checked(
        &mut self,
        f: &mut dyn FnMut(&[u8], bool),
        max: usize,
    ) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        if self.tx_unkicked {
            self.kick()?;
        }
        let vnet_len = vnet::len(self.vnet);
        Ok(match &mut self.rx {
            RxRing::Blocks(b) => b.recv(&self.map, vnet_len, self.mtu, &mut self.stats, f, max),
            RxRing::Frames(r) => {
                let fd = self.fd.as_raw_fd();
                r.recv(&self.map, fd, vnet_len, self.mtu, &mut self.stats, f, max)
            }
        })
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let cap = self.max_send_len();
        let (status_off, vnet_off) = (self.mode.status_off(), self.mode.tx_data_off());
        let vnet_len = vnet::len(self.vnet);
        let data_off = vnet_off + vnet_len;
        let mut n = 0;
        let mut queued = self.tx_unkicked;
        loop {
            let slot = self.tx_off + self.tx_head * self.tx_frame_size;
            let st = status(&self.map, slot + status_off);
            // Anything but AVAILABLE means the kernel still owns the slot: the ring is
            // full up to here.
            if st.load(Ordering::Acquire) != libc::TP_STATUS_AVAILABLE {
                break;
            }
            // SAFETY: the slot is available, so the kernel does not read it, and its
            // data area of `cap` bytes lies within the slot.
            let buf = unsafe {
                std::slice::from_raw_parts_mut(self.map.as_ptr().add(slot + data_off), cap)
            };
            let Some(len) = fill(buf) else { break };
            n += 1;
            if !sendable(len, cap) {
                self.stats.tx_dropped += 1;
                continue;
            }
            // The kernel accepts frames beyond MTU + header only if VLAN-tagged or
            // super-segments, and would drop others silently (PACKET_LOSS): count
            // them here instead.
            let long = vnet::beyond_mtu(&buf[..len], self.mtu);
            let vnet = match (long, self.vnet) {
                (false, vnet) => vnet.then_some([0; vnet::LEN]),
                (true, true) => vnet::super_segment(&mut buf[..len], self.mtu),
                (true, false) => None,
            };
            if long && vnet.is_none() {
                self.stats.tx_dropped += 1;
                continue;
            }
            if let Some(v) = vnet {
                // SAFETY: the slot is ours (AVAILABLE), and its header area ends
                // `vnet::LEN` bytes before the lent buffer, which lies in the slot.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        v.as_ptr(),
                        self.map.as_ptr().add(slot + vnet_off),
                        vnet::LEN,
                    )
                };
                self.stats.tx_super += u64::from(long);
            }
            // The kernel reads the `virtio_net_hdr` as part of the frame.
            let tp_len = (len + vnet_len) as u32;
            let hdr = self.map.as_ptr().wrapping_add(slot);
            // SAFETY: the slot's header is ours while its status is AVAILABLE; raw
            // field writes avoid making a reference to memory the kernel shares.
            unsafe {
                match self.mode {
                    RxMode::Blocks => {
                        let h = hdr.cast::<libc::tpacket3_hdr>();
                        (*h).tp_len = tp_len;
                        (*h).tp_snaplen = tp_len;
                        (*h).tp_next_offset = 0;
                    }
                    RxMode::Frames => {
                        let h = hdr.cast::<libc::tpacket2_hdr>();
                        (*h).tp_len = tp_len;
                        (*h).tp_snaplen = tp_len;
                    }
                }
            }
            st.store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
            self.tx_head = (self.tx_head + 1) % self.tx_frames;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
            queued = true;
        }
        if queued {
            if let Err(e) = self.kick() {
                if n == 0 {
                    return Err(e);
                }
                self.deferred = Some(e);
            }
        }
        Ok(n)
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn max_send_len(&self) -> usize {
        if self.vnet {
            MAX_SUPER_LEN
        } else {
            self.max_frame_len()
        }
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn as_raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    /// Frames the kernel could not take yet are retried soon, by any call.
    fn poll_timeout(&self) -> Option<Duration> {
        self.tx_unkicked.then_some(Duration::from_millis(1))
    }

    fn stats(&self) -> LinkStats {
        // A V2 socket writes only the leading `tpacket_stats` part: both counters.
        let mut st = libc::tpacket_stats_v3 {
            tp_packets: 0,
            tp_drops: 0,
            tp_freeze_q_cnt: 0,
        };
        let mut len = size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into the live `st`.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        };
        if r == 0 {
            self.kernel_drops
                .set(self.kernel_drops.get() + u64::from(st.tp_drops));
        }
        LinkStats {
            rx_dropped: self.stats.rx_dropped + self.kernel_drops.get(),
            ..self.stats
        }
    }
}
