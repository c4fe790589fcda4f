//! AF_XDP: frames move between the driver and a user-space frame area (the UMEM)
//! through four rings, with no copy at all where the driver supports zero-copy and
//! one copy in the kernel otherwise (the kernel chooses).
//!
//! [`AfXdp::open`] registers the UMEM, maps the fill, completion, rx and tx rings,
//! binds the socket to one queue of the interface, and attaches a small hand-assembled
//! XDP program that decides, frame by frame, between the socket and the kernel stack.
//! With an empty [`Config::steer`] (the default) it redirects *every* frame arriving on
//! that queue to the socket. With addresses ([`AfXdp::open_for`]) it redirects only
//! IPv4 frames to one of them and ARP frames whose target protocol address is one of
//! them, untagged or behind one 802.1Q tag, and passes everything else to Linux, so the
//! host keeps its own traffic (SSH, its own ARP) on a shared interface. Frames too
//! short to hold the field the decision needs are passed. Either way a redirect falls
//! back to the kernel stack if the socket is gone.
//!
//! Where the program runs is [`Config::mode`]: in the driver (native XDP) where
//! the driver has it, except on a veth, where it runs on the skb (generic XDP).
//! A veth's native XDP takes every frame the peer sends as an skb and copies it
//! into a page of its own before the program sees it (its head is never the
//! page-backed one native XDP needs); generic XDP only widens the skb's
//! headroom. Measured over a veth pair, exonet ↔ exonet (1 GB, copy mode): a
//! fifth more throughput in process and a third more through daemons, the
//! same round trips, connection rates and bulk from Linux.
//!
//! A Linux end as a veth comes leaves its segmentation to the veth, which
//! hands 64 KB super-segments across whole. A generic program takes them in
//! several chunks (`BPF_F_XDP_HAS_FRAGS`, from the first such packet on, and
//! the socket bound with `XDP_USE_SG`): the link gathers a TCP super-segment
//! and cuts it into frames of the MTU ([`exonet_wire::tso::Cutter`], counted
//! in `rx_super`);
//! a UDP super-datagram it drops (counted), as only its sender knew where
//! to cut it. A native program makes the veth take segmentation offload
//! from its peer, and Linux cuts both itself. With a native program
//! elsewhere, frames never span chunks, and the socket is bound as always.
//!
//! On a veth, Linux leaves the TCP and UDP checksums of its sockets to the
//! "hardware" (`CHECKSUM_PARTIAL`), and AF_XDP does not say so: a received
//! frame whose checksum field holds just its pseudo-header sum is finished
//! here and passed as good (counted in `rx_csum_completed`).
//!
//! The program stays attached through a BPF link owned by the [`AfXdp`], so it is
//! detached when the link is dropped or the process dies. Traffic on other queues
//! still goes to the kernel: on a multi-queue NIC, steer what exonet owns to the bound
//! queue (or use one queue). An interface that already has an XDP program refuses the
//! attach.
//!
//! Half of the UMEM's chunks circulate between the fill and rx rings (received
//! frames are lent from their chunk and handed back to the fill ring after the
//! callback); the other half between a free list, the tx ring and the completion
//! ring (`send_with` lends a free chunk to be written in place).
//!
//! Needs `CAP_NET_ADMIN`, `CAP_BPF` and `CAP_NET_RAW` (root).

use std::io;
use std::mem::size_of;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use exonet_wire::tso::Cutter;

use crate::bpf::{self, *};
use crate::sys::{self, Mmap};
use crate::vnet;
use crate::{
    sendable, LendScratch, Lent, Link, LinkStats, SynListener, LENT_AT_ONCE, MAX_HEADER_LEN,
    MAX_SUPER_LEN,
};

mod syn;

pub use syn::MAX_SYN_LISTENERS;

/// Headroom the kernel keeps in front of every received frame in a chunk.
const XDP_PACKET_HEADROOM: usize = 256;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;
/// Offsets of `data`, `data_end` and `rx_queue_index` in `struct xdp_md`.
const XDP_MD_DATA: i16 = 0;
const XDP_MD_DATA_END: i16 = 4;
const XDP_MD_RX_QUEUE: i16 = 16;
/// Most addresses [`Config::steer`] takes: the XDP program compares a frame's
/// address with each in turn.
pub const MAX_STEER: usize = 16;

/// UMEM and ring geometry, and which frames go to the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Interface queue to bind.
    pub queue: u32,
    /// UMEM chunks, half for receiving and half for sending.
    pub frames: u32,
    /// Bytes per chunk: a power of two from 2048 to the page size, holding the
    /// largest frame plus 256 bytes of headroom.
    pub frame_size: u32,
    /// Entries of each ring: a power of two, at least `frames / 2`.
    pub ring_size: u32,
    /// exonet's addresses: only IPv4 frames to them and ARP frames asking for or
    /// answering them go to the socket, the rest to Linux. Empty: every frame goes to
    /// the socket. At most [`MAX_STEER`].
    pub steer: Vec<Ipv4Addr>,
    /// Where the XDP program runs.
    pub mode: XdpMode,
}

/// Where the XDP program runs (the attach's `XDP_FLAGS_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XdpMode {
    /// Generic on a veth (see the [module documentation](self)); elsewhere
    /// native, or generic if the driver has no XDP of its own.
    #[default]
    Auto,
    /// In the driver (`XDP_FLAGS_DRV_MODE`): the attach fails where the
    /// driver has no XDP.
    Native,
    /// On the skb, after the driver (`XDP_FLAGS_SKB_MODE`).
    Generic,
}

const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

impl Default for Config {
    /// Queue 0; 4096 chunks of 2048 bytes; rings of 2048 entries; every frame.
    fn default() -> Self {
        Config {
            queue: 0,
            frames: 4096,
            frame_size: 2048,
            ring_size: 2048,
            steer: Vec::new(),
            mode: XdpMode::Auto,
        }
    }
}

/// One mapped AF_XDP ring and this side's copy of the indices.
#[derive(Debug)]
struct Ring {
    map: Mmap,
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    size: u32,
    /// The index this side advances (producer or consumer).
    local: u32,
    /// The other side's index, as last read.
    cached: u32,
}

impl Ring {
    fn open(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        entry: usize,
        pgoff: libc::off_t,
    ) -> io::Result<Ring> {
        let field = |v: u64| usize::try_from(v).map_err(io::Error::other);
        let desc = field(off.desc)?;
        let map = Mmap::shared_at(fd, desc + size as usize * entry, pgoff)?;
        Ok(Ring {
            map,
            producer: field(off.producer)?,
            consumer: field(off.consumer)?,
            flags: field(off.flags)?,
            desc,
            size,
            local: 0,
            cached: 0,
        })
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: the kernel's mmap offsets place the producer, consumer and flags
        // words inside the mapping, 4-byte aligned; both sides access them atomically.
        unsafe { AtomicU32::from_ptr(self.map.as_ptr().add(off).cast()) }
    }

    fn entry(&self, idx: u32, entry: usize) -> *mut u8 {
        let i = (idx & (self.size - 1)) as usize;
        // SAFETY: the mapping holds `size` entries after `desc`.
        unsafe { self.map.as_ptr().add(self.desc + i * entry) }
    }

    fn needs_wakeup(&self) -> bool {
        self.word(self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// An AF_XDP link on one queue of one interface (see the [module
/// documentation](self)).
#[derive(Debug)]
pub struct AfXdp {
    // Dropped first: detaching the program stops redirection before the socket goes.
    _xdp_link: OwnedFd,
    /// Where the program runs: [`Config::mode`] resolved.
    mode: XdpMode,
    /// The program attached.
    _prog: OwnedFd,
    /// The program that takes packets in several chunks, waiting to replace
    /// `_prog` at the first such packet (see `with_config`).
    frags_prog: Option<OwnedFd>,
    /// Whether it did.
    frags: bool,
    _map: OwnedFd,
    /// The listeners whose SYNs the program answers ([`Link::answer_syns`]).
    syns: OwnedFd,
    answering: Vec<(Ipv4Addr, u16)>,
    /// SYNs answered for listeners no longer in `syns`.
    syns_answered_before: u64,
    fd: OwnedFd,
    rx: Ring,
    tx: Ring,
    fill: Ring,
    comp: Ring,
    umem: Mmap,
    frame_size: usize,
    /// Transmit chunks not in the tx or completion ring.
    free: Vec<u64>,
    ifname: String,
    mtu: usize,
    mac: [u8; 6],
    /// The interface is a veth, whose peer's Linux leaves its TCP and UDP
    /// checksums partial (`CHECKSUM_PARTIAL`), which AF_XDP does not flag:
    /// received frames whose field holds the pseudo-header sum are finished
    /// ([`exonet_wire::checksum::complete_if_partial`]).
    veth: bool,
    /// A packet received in several chunks (`XDP_USE_SG`, with a generic
    /// program: a super-segment Linux left to a veth's segmentation
    /// offload) is gathered here, then cut.
    chain: Chain,
    tx_unkicked: bool,
    /// Sends leave the kick to `uncork` ([`Link::cork`]).
    corked: bool,
    stats: LinkStats,
    deferred: Option<io::Error>,
}

impl AfXdp {
    /// Opens queue 0 of `ifname` with the default [`Config`].
    pub fn open(ifname: &str) -> io::Result<AfXdp> {
        Self::with_config(ifname, Config::default())
    }

    /// Opens queue 0 of `ifname` for the frames of `addrs` (see [`Config::steer`]),
    /// leaving the rest to Linux.
    pub fn open_for(ifname: &str, addrs: &[Ipv4Addr]) -> io::Result<AfXdp> {
        Self::with_config(
            ifname,
            Config {
                steer: addrs.to_vec(),
                ..Config::default()
            },
        )
    }

    /// Opens `cfg.queue` of `ifname`.
    pub fn with_config(ifname: &str, cfg: Config) -> io::Result<AfXdp> {
        if cfg.steer.len() > MAX_STEER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("AF_XDP steers at most {MAX_STEER} addresses"),
            ));
        }
        // SAFETY: plain system call, no pointers.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let ifindex = sys::if_index(ifname)?;
        let ioctl = sys::ioctl_socket()?;
        let (mtu, mac) = sys::if_mtu_mac(ioctl.as_raw_fd(), ifname)?;
        let frame_size = cfg.frame_size as usize;
        if !cfg.frame_size.is_power_of_two()
            || !(2048..=page).contains(&frame_size)
            || XDP_PACKET_HEADROOM + mtu + MAX_HEADER_LEN > frame_size
            || !cfg.ring_size.is_power_of_two()
            || cfg.frames < 2
            || cfg.frames / 2 > cfg.ring_size
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad AF_XDP geometry (chunk size, ring size or MTU)",
            ));
        }
        let umem = Mmap::anonymous(cfg.frames as usize * frame_size)?;

        // SAFETY: plain system call, no pointers.
        let fd = sys::owned(unsafe {
            libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0)
        })?;
        let raw = fd.as_raw_fd();
        let reg = libc::xdp_umem_reg {
            addr: umem.as_ptr() as u64,
            len: umem.len() as u64,
            chunk_size: cfg.frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        sys::setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)?;
        let size = cfg.ring_size as libc::c_int;
        for opt in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
            libc::XDP_TX_RING,
        ] {
            sys::setsockopt(raw, libc::SOL_XDP, opt, &size)?;
        }
        // SAFETY: `xdp_mmap_offsets` is plain data; all zeroes is valid.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into the live `off`.
        sys::cvt(unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut len,
            )
        })?;
        let desc = size_of::<libc::xdp_desc>();
        let pg = |v: u64| libc::off_t::try_from(v).map_err(io::Error::other);
        let rx = Ring::open(raw, &off.rx, cfg.ring_size, desc, libc::XDP_PGOFF_RX_RING)?;
        let tx = Ring::open(raw, &off.tx, cfg.ring_size, desc, libc::XDP_PGOFF_TX_RING)?;
        let mut fill = Ring::open(
            raw,
            &off.fr,
            cfg.ring_size,
            8,
            pg(libc::XDP_UMEM_PGOFF_FILL_RING)?,
        )?;
        let comp = Ring::open(
            raw,
            &off.cr,
            cfg.ring_size,
            8,
            pg(libc::XDP_UMEM_PGOFF_COMPLETION_RING)?,
        )?;

        let half = u64::from(cfg.frames / 2);
        // Every receive chunk starts on the fill ring.
        for i in 0..half {
            // SAFETY: a fill ring entry is 8 bytes; the ring is empty before bind.
            unsafe {
                std::ptr::write(
                    fill.entry(fill.local, 8).cast::<u64>(),
                    i * frame_size as u64,
                )
            };
            fill.local = fill.local.wrapping_add(1);
        }
        fill.word(fill.producer)
            .store(fill.local, Ordering::Release);

        let veth = sys::if_driver(ioctl.as_raw_fd(), ifname)? == "veth";
        // A generic program sees what Linux left whole for a segmentation
        // offload (a veth's peer's super-segments): taken in several chunks,
        // where a socket would otherwise drop them. Kernels before 6.6 refuse
        // the flag, and are bound without it.
        let generic = matches!(
            (cfg.mode, veth),
            (XdpMode::Generic, _) | (XdpMode::Auto, true)
        );
        let bind = |flags: u16| {
            let sxdp = libc::sockaddr_xdp {
                sxdp_family: libc::AF_XDP as u16,
                sxdp_flags: flags,
                sxdp_ifindex: ifindex as u32,
                sxdp_queue_id: cfg.queue,
                sxdp_shared_umem_fd: 0,
            };
            // SAFETY: passes a live `sockaddr_xdp` and its size.
            sys::cvt(unsafe {
                libc::bind(
                    raw,
                    (&sxdp as *const libc::sockaddr_xdp).cast(),
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            })
        };
        let sg = generic && bind(libc::XDP_USE_NEED_WAKEUP | libc::XDP_USE_SG).is_ok();
        if !sg {
            bind(libc::XDP_USE_NEED_WAKEUP)?;
        }

        // The socket must be bound before it can enter the map.
        let map = xskmap(cfg.queue + 1)?;
        let mut socket = (raw as u32).to_ne_bytes();
        map_elem(
            BPF_MAP_UPDATE_ELEM,
            &map,
            &cfg.queue.to_ne_bytes(),
            Some(&mut socket),
        )?;
        let syns = syn_map()?;
        let code = assemble(map.as_raw_fd(), syns.as_raw_fd(), &cfg.steer);
        // The program reads only the first chunk's headers, so it could take
        // packets in several (`BPF_F_XDP_HAS_FRAGS`) as they are. But given
        // such a program, generic XDP copies every packet short of 256 bytes
        // of headroom (an AF_XDP peer's, on a veth) into a page-pool page and
        // a new skb, where without one it only widens the skb's head. So the
        // program without frags comes first, and the one with them takes its
        // place at the first packet in several chunks (`recv_lent`): from a
        // peer that leaves its segmentation to the veth, which the first one
        // takes too, linearized. Measured over a veth, exonet ↔ exonet (1 GB,
        // no offloads, 6 interleaved rounds against frags from the start):
        // 5–20% more throughput, 6–21% less of the sending daemon's CPU per
        // frame, in all six. Linux → exonet with offloads never taking frags
        // ran at 6.2–8.3 Gbit/s against 8.3–11.8; with the switch, as before.
        let prog = load_xdp(&code, false)?;
        let frags_prog = match sg {
            true => load_xdp(&code, true).ok(),
            false => None,
        };
        let attach = |mode: XdpMode| {
            let flags = match mode {
                XdpMode::Generic => XDP_FLAGS_SKB_MODE,
                _ => XDP_FLAGS_DRV_MODE,
            };
            bpf::link_create(&prog, ifindex as u32, BPF_XDP, flags).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("attaching XDP to {ifname} ({mode:?}): {e}"),
                )
            })
        };
        let (xdp_link, mode) = match cfg.mode {
            XdpMode::Auto if veth => (attach(XdpMode::Generic)?, XdpMode::Generic),
            // A driver without XDP refuses the native attach (EOPNOTSUPP).
            XdpMode::Auto => match attach(XdpMode::Native) {
                Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                    (attach(XdpMode::Generic)?, XdpMode::Generic)
                }
                l => (l?, XdpMode::Native),
            },
            m => (attach(m)?, m),
        };

        Ok(AfXdp {
            _xdp_link: xdp_link,
            mode,
            _prog: prog,
            frags_prog,
            frags: false,
            _map: map,
            syns,
            answering: Vec::new(),
            syns_answered_before: 0,
            fd,
            rx,
            tx,
            fill,
            comp,
            umem,
            frame_size,
            free: (half..2 * half).map(|i| i * frame_size as u64).collect(),
            ifname: ifname.to_string(),
            mtu,
            mac,
            veth,
            chain: Chain::default(),
            tx_unkicked: false,
            corked: false,
            stats: LinkStats::default(),
            deferred: None,
        })
    }

    /// The interface the socket is bound to.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Where the XDP program runs.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// Whether the program attached takes packets in several chunks as they
    /// are (`BPF_F_XDP_HAS_FRAGS`): from the first such packet on, where the
    /// program is generic (see `with_config`).
    pub fn takes_frags(&self) -> bool {
        self.frags
    }

    /// A packet came in several chunks: the program that takes them as they
    /// are replaces the one that had them linearized. Should the kernel
    /// refuse, the first one stays, which takes them all the same.
    fn take_frags(&mut self) {
        if let Some(p) = self.frags_prog.take() {
            if bpf::link_update(&self._xdp_link, &p).is_ok() {
                self._prog = p;
                self.frags = true;
            }
        }
    }

    /// Tells the kernel to send what the tx ring holds, without waiting. In copy
    /// mode the kernel sends a bounded batch per call and says `EAGAIN` while more is
    /// left, so this repeats until the ring is drained or the kernel is truly busy.
    fn kick(&mut self) -> io::Result<()> {
        self.tx_unkicked = false;
        for _ in 0..=self.tx.size / 16 {
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
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR)
                    if self.tx.word(self.tx.consumer).load(Ordering::Acquire) != self.tx.local => {}
                Some(libc::EAGAIN | libc::EINTR) => return Ok(()),
                // Busy or out of buffers: the frames wait in the ring; retry soon.
                Some(libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => break,
                _ => return Err(e),
            }
        }
        self.tx_unkicked = true;
        Ok(())
    }

    /// Takes transmitted chunks back from the completion ring.
    fn reclaim(&mut self) {
        let prod = self.comp.word(self.comp.producer).load(Ordering::Acquire);
        let mask = !(self.frame_size as u64 - 1);
        while self.comp.local != prod {
            // SAFETY: entries below the Acquire-loaded producer are written.
            let addr = unsafe { std::ptr::read(self.comp.entry(self.comp.local, 8).cast::<u64>()) };
            self.free.push(addr & mask);
            self.comp.local = self.comp.local.wrapping_add(1);
        }
        self.comp
            .word(self.comp.consumer)
            .store(self.comp.local, Ordering::Release);
    }

    /// How many SYNs the program answered for `ip`:`port` (0 if none is
    /// registered).
    fn syns_answered_for(&self, ip: Ipv4Addr, port: u16) -> u64 {
        let mut entry = [0u8; syn::ENTRY_LEN as usize];
        let key = syn::key(ip, port);
        if map_elem(BPF_MAP_LOOKUP_ELEM, &self.syns, &key, Some(&mut entry)).is_err() {
            return 0;
        }
        let at = syn::E_ANSWERED;
        u64::from_ne_bytes(entry[at..at + 8].try_into().expect("8 bytes"))
    }
}

/// A packet received in several chunks, gathered ([`AfXdp::chain`]).
#[derive(Default)]
struct Chain {
    bytes: Vec<u8>,
    /// Pieces have come, and not the last one yet.
    active: bool,
    /// A piece lay outside the UMEM, or the packet outgrew any super-segment.
    broken: bool,
    /// The gathered super-segment being cut, a receive batch at a time:
    /// its segments may outnumber what the caller takes at once.
    cutter: Option<Cutter>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("len", &self.bytes.len())
            .field("active", &self.active)
            .field("broken", &self.broken)
            .field("cutting", &self.cutter.is_some())
            .finish()
    }
}

impl Chain {
    fn push(&mut self, piece: &[u8]) {
        self.active = true;
        if self.bytes.len() + piece.len() > MAX_SUPER_LEN {
            self.broken = true;
        } else if !self.broken {
            self.bytes.extend_from_slice(piece);
        }
    }

    fn push_broken(&mut self) {
        self.active = true;
        self.broken = true;
    }
}

/// Counts a received frame that fits a chunk, to be lent whole; on a `veth`,
/// first finishes a checksum Linux left partial. Returns whether its checksum
/// is known good (finished here).
fn take_whole(frame: &mut [u8], veth: bool, stats: &mut LinkStats) -> bool {
    let completed = veth && exonet_wire::checksum::complete_if_partial(frame);
    stats.rx_csum_completed += u64::from(completed);
    stats.rx_frames += 1;
    stats.rx_bytes += frame.len() as u64;
    completed
}

impl AfXdp {
    /// Lends a gathered packet, at most `max` frames of it, and returns how
    /// many frames it lent or dropped; its buffer is kept for the next. A
    /// TCP super-segment is cut into frames of the MTU, each with its
    /// checksums computed (so passed as good), over as many calls as `max`
    /// asks; a frame that fits is lent as any; anything else is dropped and
    /// counted.
    fn lend_chain(
        &mut self,
        chain: &mut Chain,
        max: usize,
        f: &mut dyn FnMut(&[Lent<'_>]),
    ) -> usize {
        let frame = &mut chain.bytes[..];
        let stats = &mut self.stats;
        let n = if let Some(c) = &mut chain.cutter {
            let n = vnet::cut(c, frame, max, stats, &mut |seg, ok| f(&[(seg, ok)]));
            if c.remaining() > 0 {
                return n;
            }
            n
        } else if chain.broken {
            stats.rx_dropped += 1;
            1
        } else if let Some(c) = Cutter::new(frame, self.mtu) {
            stats.rx_super += 1;
            chain.cutter = Some(c);
            return self.lend_chain(chain, max, f);
        } else if !vnet::beyond_mtu(frame, self.mtu) {
            let ok = take_whole(frame, self.veth, stats);
            f(&[(frame, ok)]);
            1
        } else {
            // A UDP super-datagram among them: where to cut it only its
            // sender knew.
            stats.rx_dropped += 1;
            1
        };
        chain.bytes.clear();
        chain.active = false;
        chain.broken = false;
        chain.cutter = None;
        n
    }
}

impl Link for AfXdp {
    recv_batch_from_checked!();

    /// Says good the frames whose checksums were finished or computed here
    /// (a `veth` peer's partial ones, cut super-segments).
    fn recv_batch_checked(
        &mut self,
        f: &mut dyn FnMut(&[u8], bool),
        max: usize,
    ) -> io::Result<usize> {
        self.recv_lent(&mut LendScratch::default(), max, &mut |frames| {
            for &(frame, ok) in frames {
                f(frame, ok);
            }
        })
    }

    /// In place: the kernel refills a chunk only once it is back on the
    /// fill ring, which it sees after the last slice.
    fn recv_lent(
        &mut self,
        _scratch: &mut LendScratch,
        max: usize,
        f: &mut dyn FnMut(&[Lent<'_>]),
    ) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        if self.tx_unkicked {
            self.kick()?;
        }
        // Frames lent or dropped: what `max` bounds. A super-segment being
        // cut goes on first.
        let mut n = 0;
        if self.chain.cutter.is_some() {
            let mut chain = std::mem::take(&mut self.chain);
            n += self.lend_chain(&mut chain, max, f);
            self.chain = chain;
        }
        let prod = self.rx.word(self.rx.producer).load(Ordering::Acquire);
        let avail = prod.wrapping_sub(self.rx.local).min(self.rx.size) as usize;
        let mask = !(self.frame_size as u64 - 1);
        let mut lent = [(&[][..], false); LENT_AT_ONCE];
        let mut k = 0;
        let mut taken = 0;
        while n < max && taken < avail && self.chain.cutter.is_none() {
            // SAFETY: entries below the Acquire-loaded producer are written.
            let d: libc::xdp_desc = unsafe {
                std::ptr::read(
                    self.rx
                        .entry(self.rx.local, size_of::<libc::xdp_desc>())
                        .cast(),
                )
            };
            let (addr, len) = (d.addr as usize, d.len as usize);
            let in_umem = addr
                .checked_add(len)
                .is_some_and(|end| end <= self.umem.len());
            let more = d.options & libc::XDP_PKT_CONTD != 0;
            if more || self.chain.active {
                // A piece of a packet in several chunks: gathered, its chunk
                // given back at once.
                if in_umem {
                    // SAFETY: as for a whole frame below; only read, and copied.
                    let piece =
                        unsafe { std::slice::from_raw_parts(self.umem.as_ptr().add(addr), len) };
                    self.chain.push(piece);
                } else {
                    self.chain.push_broken();
                }
                if !more {
                    self.take_frags();
                    // Its last piece: the frames before it go first.
                    if k > 0 {
                        f(&lent[..k]);
                        k = 0;
                    }
                    let mut chain = std::mem::take(&mut self.chain);
                    n += self.lend_chain(&mut chain, max - n, f);
                    self.chain = chain;
                }
            } else if in_umem {
                // SAFETY: the chunk is ours until the fill ring's producer index
                // is published below, after the last slice's callback, and the
                // kernel does not write it meanwhile; each chunk went to the fill
                // ring once, so no other descriptor names it, and no other
                // reference to it lives.
                let frame =
                    unsafe { std::slice::from_raw_parts_mut(self.umem.as_ptr().add(addr), len) };
                let ok = take_whole(frame, self.veth, &mut self.stats);
                lent[k] = (frame, ok);
                k += 1;
                n += 1;
            } else {
                self.stats.rx_dropped += 1;
                n += 1;
            }
            taken += 1;
            self.rx.local = self.rx.local.wrapping_add(1);
            // The fill ring has room for every receive chunk, so this never overruns.
            // SAFETY: a fill ring entry is 8 bytes and free until published.
            unsafe {
                std::ptr::write(
                    self.fill.entry(self.fill.local, 8).cast::<u64>(),
                    d.addr & mask,
                )
            };
            self.fill.local = self.fill.local.wrapping_add(1);
            if k == LENT_AT_ONCE {
                f(&lent);
                k = 0;
            }
        }
        if k > 0 {
            f(&lent[..k]);
        }
        if taken > 0 {
            self.rx
                .word(self.rx.consumer)
                .store(self.rx.local, Ordering::Release);
            self.fill
                .word(self.fill.producer)
                .store(self.fill.local, Ordering::Release);
        }
        if n < max && self.fill.needs_wakeup() {
            // The driver waits for a nudge before it uses the refilled chunks.
            // SAFETY: a zero-length receive with no buffer and no address.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        Ok(n)
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        self.reclaim();
        let cap = self.max_frame_len();
        let (mut n, mut queued) = (0, false);
        loop {
            if self.tx.local.wrapping_sub(self.tx.cached) >= self.tx.size {
                self.tx.cached = self.tx.word(self.tx.consumer).load(Ordering::Acquire);
                if self.tx.local.wrapping_sub(self.tx.cached) >= self.tx.size {
                    break;
                }
            }
            let Some(&addr) = self.free.last() else { break };
            // SAFETY: a free chunk belongs to no ring, so neither the kernel nor the
            // NIC touches it; `cap` is below the chunk size.
            let buf = unsafe {
                std::slice::from_raw_parts_mut(self.umem.as_ptr().add(addr as usize), cap)
            };
            let Some(len) = fill(buf) else { break };
            n += 1;
            if !sendable(len, cap) {
                self.stats.tx_dropped += 1;
                continue;
            }
            self.free.pop();
            let d = libc::xdp_desc {
                addr,
                len: len as u32,
                options: 0,
            };
            // SAFETY: a tx ring entry is free while below consumer + size.
            unsafe {
                std::ptr::write(
                    self.tx
                        .entry(self.tx.local, size_of::<libc::xdp_desc>())
                        .cast(),
                    d,
                )
            };
            self.tx.local = self.tx.local.wrapping_add(1);
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
            queued = true;
        }
        if queued {
            self.tx
                .word(self.tx.producer)
                .store(self.tx.local, Ordering::Release);
        }
        if (queued || self.tx_unkicked) && self.tx.needs_wakeup() {
            if self.corked {
                self.tx_unkicked = true;
                return Ok(n);
            }
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

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn as_raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn cork(&mut self) {
        self.corked = true;
    }

    fn uncork(&mut self) -> io::Result<()> {
        self.corked = false;
        if self.tx_unkicked {
            self.kick()?;
        }
        Ok(())
    }

    /// Retry soon while frames wait for a kick or chunks for their completion.
    fn poll_timeout(&self) -> Option<Duration> {
        (self.tx_unkicked || self.free.is_empty()).then_some(Duration::from_millis(1))
    }

    fn stats(&self) -> LinkStats {
        // SAFETY: `xdp_statistics` is plain data; all zeroes is valid.
        let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into the live `st`.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut st as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        };
        let kernel = if r == 0 {
            st.rx_dropped + st.rx_ring_full
        } else {
            0
        };
        let answered: u64 = self
            .answering
            .iter()
            .map(|&(ip, port)| self.syns_answered_for(ip, port))
            .sum();
        LinkStats {
            rx_dropped: self.stats.rx_dropped + kernel,
            syns_answered: self.syns_answered_before + answered,
            ..self.stats
        }
    }

    fn answer_syns(&mut self, l: &SynListener) -> io::Result<()> {
        let at = (l.ip, l.port);
        if !self.answering.contains(&at) && self.answering.len() >= MAX_SYN_LISTENERS as usize {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("AF_XDP answers the SYNs of at most {MAX_SYN_LISTENERS} listeners"),
            ));
        }
        // A replaced entry's count would restart: kept.
        self.syns_answered_before += self.syns_answered_for(l.ip, l.port);
        put_syn_listener(&self.syns, l)?;
        if !self.answering.contains(&at) {
            self.answering.push(at);
        }
        Ok(())
    }

    fn stop_answering_syns(&mut self, ip: Ipv4Addr, port: u16) {
        let Some(i) = self.answering.iter().position(|&a| a == (ip, port)) else {
            return;
        };
        self.answering.swap_remove(i);
        self.syns_answered_before += self.syns_answered_for(ip, port);
        // Cannot fail for a key that is in the map.
        let _ = map_elem(BPF_MAP_DELETE_ELEM, &self.syns, &syn::key(ip, port), None);
    }
}

fn xskmap(entries: u32) -> io::Result<OwnedFd> {
    bpf::map_create(BPF_MAP_TYPE_XSKMAP, 4, 4, entries)
}

/// Runs the XDP program a link steering `steer` would attach, with these
/// listeners' SYNs answered, once over `frame` without attaching it
/// (`BPF_PROG_TEST_RUN`): returns the action (`XDP_REDIRECT` for an answered SYN,
/// `XDP_PASS` for the rest, as no socket is in the program's map) and the
/// frame as the program left it. Needs root.
pub fn test_run(
    steer: &[Ipv4Addr],
    listeners: &[SynListener],
    frame: &[u8],
) -> io::Result<(u32, Vec<u8>)> {
    let (map, syns) = (xskmap(1)?, syn_map()?);
    for l in listeners {
        put_syn_listener(&syns, l)?;
    }
    let prog = load_xdp(&assemble(map.as_raw_fd(), syns.as_raw_fd(), steer), false)?;
    let mut out = vec![0u8; frame.len() + 256];
    let (action, len) = bpf::test_run(&prog, frame, &mut out)?;
    out.truncate(len);
    Ok((action, out))
}

fn put_syn_listener(syns: &OwnedFd, l: &SynListener) -> io::Result<()> {
    let mut entry = syn::entry(l);
    let key = syn::key(l.ip, l.port);
    map_elem(BPF_MAP_UPDATE_ELEM, syns, &key, Some(&mut entry))
}

/// The hash map of [`SynListener`]s, by address and port.
fn syn_map() -> io::Result<OwnedFd> {
    bpf::map_create(
        BPF_MAP_TYPE_HASH,
        syn::KEY_LEN,
        syn::ENTRY_LEN,
        MAX_SYN_LISTENERS,
    )
}

/// The XDP program for `xsks` (the XSKMAP) and the addresses to steer.
///
/// The addresses are immediates in a compare chain rather than entries of a BPF map:
/// they are fixed for the life of the link, so there is nothing to update at run time
/// and no second map to create, fill and keep. The chain grows with every address,
/// hence [`MAX_STEER`]; many more addresses would want a hash map.
///
/// Every packet load is aligned to its size once the 2 bytes of `NET_IP_ALIGN` are
/// counted, as the verifier counts them under strict alignment (hence 16-bit loads
/// for the ARP check), so architectures without cheap unaligned access take it too.
fn assemble(xsks: RawFd, syns: RawFd, steer: &[Ipv4Addr]) -> Vec<u64> {
    const ETH_HLEN: i32 = 14;
    let mut a = Asm::default();
    let steering = a.new_label();
    syn::assemble(&mut a, syns, steering);
    a.label(steering);
    let [l3, ipv4, matched, pass, redirect] = [(); 5].map(|()| a.new_label());
    if !steer.is_empty() {
        // r1 = ctx stays for the redirect; r2 = data (moved past a VLAN tag);
        // r3 = data_end; r4 = bound being checked; r5 = field being compared.
        a.op(LDX_W, 2, 1, XDP_MD_DATA, 0);
        a.op(LDX_W, 3, 1, XDP_MD_DATA_END, 0);
        a.need(ETH_HLEN, pass);
        a.op(LDX_H, 5, 2, 12, 0); // EtherType
        a.jump(JNE_K, 5, 0, wire16(0x8100), l3);
        // One 802.1Q tag: read on as if the header started 4 bytes later.
        a.op(ADD_K, 2, 0, 0, 4);
        a.need(ETH_HLEN, pass);
        a.op(LDX_H, 5, 2, 12, 0);
        a.label(l3);
        a.jump(JEQ_K, 5, 0, wire16(0x0800), ipv4);
        a.jump(JNE_K, 5, 0, wire16(0x0806), pass);
        // ARP for IPv4 over Ethernet (ptype 0x0800, hlen 6, plen 4): the target
        // protocol address, 24 bytes in.
        a.need(ETH_HLEN + 28, pass);
        a.op(LDX_H, 5, 2, ETH_HLEN as i16 + 2, 0);
        a.jump(JNE_K, 5, 0, wire16(0x0800), pass);
        a.op(LDX_H, 5, 2, ETH_HLEN as i16 + 4, 0);
        a.jump(JNE_K, 5, 0, wire16(0x0604), pass);
        a.op(LDX_W, 5, 2, ETH_HLEN as i16 + 24, 0);
        a.jump(JA, 0, 0, 0, matched);
        // IPv4: the destination address, 16 bytes into the (option-free part of
        // the) header.
        a.label(ipv4);
        a.need(ETH_HLEN + 20, pass);
        a.op(LDX_W, 5, 2, ETH_HLEN as i16 + 16, 0);
        a.label(matched);
        for addr in steer {
            let imm = u32::from_ne_bytes(addr.octets()) as i32;
            a.jump(JEQ32_K, 5, 0, imm, redirect);
        }
        a.label(pass);
        a.op(MOV_K, 0, 0, 0, XDP_PASS);
        a.op(EXIT, 0, 0, 0, 0);
    }
    // return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
    a.label(redirect);
    a.op(LDX_W, 2, 1, XDP_MD_RX_QUEUE, 0);
    a.ld_map(1, xsks);
    a.op(MOV_K, 3, 0, 0, XDP_PASS); // the fallback action
    a.op(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP);
    a.op(EXIT, 0, 0, 0, 0);
    a.finish()
}

/// Loads an XDP program (see [`bpf::load`]), taking packets in several chunks
/// if `frags`.
fn load_xdp(prog: &[u64], frags: bool) -> io::Result<OwnedFd> {
    const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
    bpf::load(
        prog,
        ProgKind {
            prog_type: BPF_PROG_TYPE_XDP,
            attach_type: BPF_XDP,
            flags: if frags { BPF_F_XDP_HAS_FRAGS } else { 0 },
            name: "exonet_xsk",
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::is_root;

    #[test]
    fn a_chain_is_gathered_until_it_outgrows_a_super_segment() {
        let mut c = Chain::default();
        assert!(!c.active);
        c.push(&[1; 1792]);
        c.push(&[2; 100]);
        assert!(c.active && !c.broken);
        assert_eq!(c.bytes.len(), 1892);
        assert_eq!(c.bytes[1791..1793], [1, 2]);
        while c.bytes.len() + 1792 <= MAX_SUPER_LEN {
            c.push(&[3; 1792]);
        }
        assert!(!c.broken);
        c.push(&[4; 1792]);
        assert!(c.broken);
        let mut d = Chain::default();
        d.push_broken();
        assert!(d.active && d.broken);
    }

    #[test]
    fn too_many_addresses_are_refused_up_front() {
        let cfg = Config {
            steer: vec![Ipv4Addr::new(10, 77, 0, 1); MAX_STEER + 1],
            ..Config::default()
        };
        let e = AfXdp::with_config("lo", cfg).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn the_verifier_takes_every_chain_length() {
        if !is_root() {
            println!("skipped: needs root");
            return;
        }
        let (map, syns) = (xskmap(1).unwrap(), syn_map().unwrap());
        let all: Vec<_> = (1..=MAX_STEER as u8)
            .map(|i| Ipv4Addr::new(10, 77, 0, i))
            .collect();
        for n in 0..=MAX_STEER {
            load_xdp(
                &assemble(map.as_raw_fd(), syns.as_raw_fd(), &all[..n]),
                true,
            )
            .unwrap();
        }
    }

    #[test]
    fn a_refusal_tells_the_verifier_log() {
        if !is_root() {
            println!("skipped: needs root");
            return;
        }
        // Returns without setting r0.
        let e = load_xdp(&[insn(EXIT, 0, 0, 0, 0)], false).unwrap_err();
        assert!(e.to_string().contains("R0 !read_ok"), "{e}");
    }
}
