//! The state behind a [`Stack`](super::Stack): the endpoint's rings, the protocol
//! cores and the sockets' queues. Everything here runs under the stack's lock.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex, MutexGuard};

use exonet_shm::control::{DirectPort, HandlerSpec, HostInfo, PROTO_UDP};
use exonet_shm::{
    Consumer, Desc, Frames, IdMap, Notifier, Producer, SegmentConfig, Sleeper, INLINE_MAX,
};
use exonet_wire::ipv4::protocol;
use exonet_wire::{checksum, IcmpRepr, Ipv4Packet, Ipv4Repr};

use super::{Multiplexer, StackConfig, Window};
use crate::arp::{ArpCache, ArpStats, Lookup};
use crate::frag::fragment;
use crate::icmp::{Icmp, IcmpErrorKind, IcmpEvent, IcmpStats, UnreachCode};
use crate::ipv4_rx::{IfAddr, Ipv4Datagram, Ipv4Rx, Ipv4Stats};
use crate::reasm::{ReasmStats, Reassembler};
use crate::time::{earlier, Time};
use crate::udp::UdpStats;

mod send_area;
mod tcp;

use send_area::SendArea;

pub use tcp::TcpSocketStats;
pub(crate) use tcp::{TcpSock, TcpTable};

const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;
const UDP_LEN: usize = 8;
/// RFC 768 and RFC 791: a UDP payload fills at most a 65535-byte datagram.
pub(crate) const MAX_UDP_PAYLOAD: usize = 65535 - IP_LEN - UDP_LEN;
/// RFC 1191 §6.3: a path MTU learned from an ICMP error is forgotten after ten
/// minutes, in case the path grew.
const PMTU_LIFETIME: Duration = Duration::from_secs(600);

/// Counters of the socket layer (the cores' own are beside them in [`StackStats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketStats {
    /// Frames on a channel no socket of ours has (it was closed meanwhile).
    pub no_socket: u64,
    /// Datagrams dropped because their socket's queue was full.
    pub queue_full: u64,
    /// Datagrams to a connected socket from another peer.
    pub not_peer: u64,
    /// Datagrams whose UDP checksum failed when read (verified in the copy).
    pub bad_checksum: u64,
    /// ICMP errors given to a socket (as its pending error).
    pub icmp_errors: u64,
    /// ICMP errors no socket of ours could take.
    pub icmp_errors_unclaimed: u64,
    /// Path MTUs lowered by "fragmentation needed".
    pub pmtu_updates: u64,
}

/// What was sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxStats {
    /// Datagrams sent (or held for ARP).
    pub datagrams: u64,
    /// Frames put on the tx ring.
    pub frames: u64,
    /// Of those, inline in the ring.
    pub inline: u64,
    /// Of those, TCP segments whose data the multiplexer read from the send
    /// area (a chain: the headers inline, the data where it lies).
    pub referenced: u64,
    /// Datagrams sent in fragments.
    pub fragmented: u64,
    /// Frames the multiplexer refused (template check or link).
    pub rejected: u64,
    /// TCP segments written to the direct send port instead of the ring
    /// (not in `frames`).
    pub direct: u64,
    /// Writes the direct send port refused; the segment then went on the
    /// ring. One that is not a passing refusal closes the port.
    pub direct_failed: u64,
    /// Segments that could have gone to the direct send port but went on
    /// the ring, behind frames still in it (a pure ACK, say).
    pub direct_behind: u64,
}

/// Every counter of a [`Stack`](super::Stack).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackStats {
    pub ipv4: Ipv4Stats,
    pub reasm: ReasmStats,
    pub icmp: IcmpStats,
    /// `received`/`delivered`/`bad_length` of UDP input (checksums are counted in
    /// [`SocketStats::bad_checksum`], when the datagram is read).
    pub udp: UdpStats,
    pub arp: ArpStats,
    pub sockets: SocketStats,
    pub tx: TxStats,
    /// TCP input and the connections' sockets.
    pub tcp: TcpSocketStats,
    /// Bytes held by the reassembler now.
    pub reasm_bytes: usize,
    /// Datagrams queued in sockets now.
    pub queued: usize,
}

/// Where a queued datagram's bytes are.
pub(crate) enum Body {
    /// In a receive buffer of the segment, held until read.
    Segment { buffer: u32, start: u32, len: u32 },
    /// Copied from an inline ring slot.
    Inline {
        bytes: [u8; INLINE_MAX],
        start: u8,
        len: u8,
    },
    /// Reassembled (or an ICMP payload): shared with the view the input
    /// checks read, instead of copied for the queue.
    Owned { data: Arc<Vec<u8>>, start: usize },
}

/// A datagram waiting in a socket's queue.
pub(crate) struct Datagram {
    pub from: SocketAddrV4,
    pub body: Body,
    /// The pseudo-header and UDP header sum, to verify against the payload's sum
    /// when it is copied out; `None` if there is nothing to verify.
    pub check: Option<u16>,
    /// ICMP echo: the sequence number.
    pub seq: u16,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Udp,
    /// ICMP echo; the local port is the identifier.
    Echo,
    /// A TCP listener or connection (its state in [`Sock::tcp`]).
    Tcp,
}

pub(crate) struct Sock {
    pub kind: Kind,
    pub channel: u32,
    pub local: SocketAddrV4,
    pub peer: Option<SocketAddrV4>,
    pub queue: VecDeque<Datagram>,
    /// An asynchronous error (from ICMP), returned by the next call.
    pub error: Option<io::ErrorKind>,
    pub nonblocking: bool,
    pub read_timeout: Option<Duration>,
    pub write_timeout: Option<Duration>,
    pub broadcast: bool,
    pub ttl: u8,
    /// A TCP socket's listener or connection.
    pub tcp: Option<TcpSock>,
    /// Handles on the socket (`try_clone` makes more); it closes when the
    /// last goes. One from the start: the handle of the call that made it
    /// (for a connection a listener accepted, `accept`'s).
    pub handles: u32,
}

impl Sock {
    fn new(kind: Kind, channel: u32, local: SocketAddrV4) -> Sock {
        Sock {
            kind,
            channel,
            local,
            peer: None,
            queue: VecDeque::new(),
            error: None,
            nonblocking: false,
            read_timeout: None,
            write_timeout: None,
            broadcast: false,
            ttl: 64,
            tcp: None,
            handles: 1,
        }
    }

    pub fn readable(&self) -> bool {
        if self.error.is_some() {
            return true;
        }
        match self.tcp.as_ref() {
            Some(TcpSock::Listener(l)) => !l.ready.is_empty(),
            Some(TcpSock::Conn(c)) => c.readable(),
            None => !self.queue.is_empty(),
        }
    }
}

/// TCP segmentation offload on the multiplexer's link ([`HostInfo::max_send`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tso {
    /// The longest TCP super-segment (header and data) a frame carries.
    space: usize,
    /// The TCP length of each segment the link cuts one into: its MTU less
    /// the IPv4 header.
    cut: usize,
}

impl Tso {
    fn of(info: &HostInfo) -> Option<Tso> {
        let (mtu, max_send) = (info.mtu as usize, info.max_send as usize);
        // Both lengths count the link's header with room for an 802.1Q tag.
        let packet = max_send
            .checked_sub(ETH_LEN + 4)?
            .min(usize::from(u16::MAX));
        let link_mtu = mtu.checked_sub(ETH_LEN + 4)?;
        (max_send > mtu).then(|| Tso {
            space: packet - IP_LEN,
            cut: link_mtu.saturating_sub(IP_LEN),
        })
    }
}

pub(crate) struct Inner {
    /// Locked after `Inner` when both are (control requests from socket calls);
    /// alone when a thread drives an in-process multiplexer.
    pub mux: Arc<Mutex<Box<dyn Multiplexer>>>,
    in_process: bool,
    pub endpoint: u32,
    pub info: HostInfo,
    free: Producer,
    rx: Consumer,
    tx: Producer,
    completion: Consumer,
    frames: Frames,
    /// The segment's part the application's handlers may use.
    pub window: Option<Window>,
    kick: Notifier,
    /// The endpoint's direct send port ([`Multiplexer::open_direct`]), if
    /// the multiplexer gave one.
    direct: Option<Direct>,
    /// Send buffers not in flight.
    tx_pool: Vec<u32>,
    /// TCP send buffers the multiplexer reads in place.
    send_area: SendArea,
    /// Receive buffers taken off the free ring, to give back.
    to_free: Vec<u32>,
    /// How many receive buffers the endpoint has: what bounds a TCP window.
    rx_buffers: usize,
    /// Largest datagram sent whole.
    mtu: usize,
    /// TCP segmentation offload, if the link has it: the largest TCP
    /// super-segment, and the TCP length of the segments the link cuts it
    /// into (its MTU's, whatever `mtu` is).
    tso: Option<Tso>,
    ipv4: Ipv4Rx,
    reasm: Reassembler,
    icmp: Icmp,
    arp: ArpCache<Held>,
    pmtu: HashMap<Ipv4Addr, (usize, Time)>,
    sockets: Vec<Option<Sock>>,
    by_channel: IdMap<usize>,
    socket_queue: usize,
    ident: u16,
    /// When the cores' time began, on the monotonic clock (nanoseconds).
    epoch: u64,
    inline: [u8; INLINE_MAX],
    socket_stats: SocketStats,
    udp_stats: UdpStats,
    tx_stats: TxStats,
    /// A thread sleeps on the doorbell.
    pub sleeping: bool,
    /// Threads waiting for the sleeper to wake them.
    pub followers: usize,
    /// A send found the tx ring or the send buffers full.
    tx_blocked: bool,
    /// A connection holds data back until the multiplexer takes its earlier
    /// frames (TCP autocorking): a sleep must wait for that too.
    tx_corked: bool,
    /// The time of the last pump: what sends go by (a neighbour's or a path
    /// MTU's age needs no fresher clock).
    pub clock: Time,
    tcp: TcpTable,
    /// How long closed connections get to finish when the stack goes.
    linger: Duration,
    /// See [`StackConfig::lazy_bind`](super::StackConfig::lazy_bind).
    lazy_bind: Duration,
}

/// A frame held while its neighbour resolves (its Ethernet destination still
/// zero), with the channel it is to go on.
struct Held {
    channel: u32,
    frame: Vec<u8>,
}

/// The direct send port, and a token bucket that keeps what is written
/// there within what the kernel passes: a frame the bucket cannot pay for
/// goes on the ring instead of being dropped past the port.
pub(crate) struct Direct {
    pub port: std::fs::File,
    /// Bytes a second and the most tokens held: half the kernel's burst,
    /// as the two buckets' clocks differ.
    rate: u64,
    burst: u64,
    tokens: u64,
    last: Time,
}

impl Direct {
    fn new(p: DirectPort) -> Direct {
        Direct {
            port: p.fd.into(),
            rate: p.bytes_per_sec,
            burst: p.burst / 2,
            tokens: p.burst / 2,
            last: Time::ZERO,
        }
    }

    /// Takes `len` bytes' tokens at `now` if there are that many.
    pub fn take(&mut self, len: usize, now: Time) -> bool {
        let ns = now.0.saturating_sub(self.last.0);
        self.last = self.last.max(now);
        let earned = (u128::from(ns) * u128::from(self.rate) / 1_000_000_000) as u64;
        self.tokens = self.tokens.saturating_add(earned).min(self.burst);
        let len = len as u64;
        if self.tokens < len {
            return false;
        }
        self.tokens -= len;
        true
    }
}

/// Why a send did not happen now.
pub(crate) enum SendError {
    /// No send buffer or ring slot: wait for completions.
    Full,
    /// The neighbour is being resolved and the caller would rather wait than
    /// have the datagram held.
    Unresolved,
    Fatal(io::Error),
}

impl From<io::Error> for SendError {
    fn from(e: io::Error) -> Self {
        SendError::Fatal(e)
    }
}

/// The size of the segment's frame buffers.
const FRAME_SIZE: usize = 2048;

fn ring_error(e: impl std::fmt::Debug) -> io::Error {
    io::Error::other(format!("endpoint ring: {e:?}"))
}

impl Inner {
    pub fn new(
        mux: Arc<Mutex<Box<dyn Multiplexer>>>,
        info: HostInfo,
        config: &StackConfig,
    ) -> io::Result<(Inner, Sleeper)> {
        let frames = config.frames.clamp(8, 1 << 16);
        let ring = frames.next_power_of_two();
        let window_frames = config.window.min(super::MAX_WINDOW).div_ceil(FRAME_SIZE) as u32;
        let slot = config.tcp.send_buffer.next_multiple_of(FRAME_SIZE);
        let area = config.tcp_send_area.min(super::MAX_WINDOW);
        let area_frames = (area - area % slot.max(1)).div_ceil(FRAME_SIZE) as u32;
        let seg = SegmentConfig {
            frame_size: FRAME_SIZE as u32,
            frame_count: frames + area_frames + window_frames,
            ring_entries: [ring; 4],
        };
        let (endpoint, app, in_process, direct) = {
            let mut m = lock(&mux);
            let (e, a) = m.create_endpoint(&seg)?;
            // A multiplexer without direct send ports refuses: the ring
            // carries everything, as before.
            let direct = config
                .direct
                .then(|| m.open_direct(e).ok())
                .flatten()
                .map(Direct::new);
            (e, a, m.in_process(), direct)
        };
        // The multiplexer reports its largest frame with room for an 802.1Q tag.
        let link_mtu = (info.mtu as usize).saturating_sub(ETH_LEN + 4);
        let mtu = config.mtu.unwrap_or(link_mtu).clamp(68, link_mtu.max(68));
        let addrs: Vec<IfAddr> = info
            .addrs
            .iter()
            .map(|&(addr, prefix_len)| IfAddr { addr, prefix_len })
            .collect();
        // The send area's buffers and the window's come last and never go
        // on a ring.
        let buffers: Vec<u32> = app.frames.layout().buffers().collect();
        let (buffers, rest) = buffers.split_at(frames as usize);
        let (area, window) = rest.split_at(area_frames as usize);
        let send_area = SendArea::new(
            app.frames.clone(),
            area.first().copied().unwrap_or(0),
            area_frames * FRAME_SIZE as u32,
            slot as u32,
        );
        let window = window.first().map(|&offset| {
            Window::new(
                app.frames.clone(),
                offset,
                window_frames * FRAME_SIZE as u32,
            )
        });
        let (rx_bufs, tx_bufs) = buffers.split_at(buffers.len() / 2);
        let epoch = monotonic_nanos();
        let tcp = TcpTable::new(config.tcp.clone())?;
        let tso = Tso::of(&info);
        let mut inner = Inner {
            mux,
            in_process,
            endpoint,
            info,
            free: app.free,
            rx: app.rx,
            tx: app.tx,
            completion: app.completion,
            frames: app.frames,
            window,
            kick: app.kick,
            direct,
            tx_pool: tx_bufs.to_vec(),
            send_area,
            to_free: rx_bufs.to_vec(),
            rx_buffers: rx_bufs.len(),
            mtu,
            tso,
            ipv4: Ipv4Rx::new(&addrs),
            reasm: Reassembler::new(config.reasm),
            icmp: Icmp::new(),
            arp: ArpCache::new(config.arp.clone()),
            pmtu: HashMap::new(),
            sockets: Vec::new(),
            by_channel: IdMap::default(),
            socket_queue: config.socket_queue.max(1),
            // Any start will do: the multiplexer assigns the identification of
            // fragmented datagrams itself, since all applications share the address.
            ident: epoch as u16,
            epoch,
            inline: [0; INLINE_MAX],
            socket_stats: SocketStats::default(),
            udp_stats: UdpStats::default(),
            tx_stats: TxStats::default(),
            sleeping: false,
            followers: 0,
            clock: Time::ZERO,
            tx_blocked: false,
            tx_corked: false,
            tcp,
            linger: config.linger,
            lazy_bind: config.lazy_bind,
        };
        inner.give_back()?;
        Ok((inner, app.wake))
    }

    /// The cores' time now.
    pub fn now(&self) -> Time {
        Time(monotonic_nanos().saturating_sub(self.epoch))
    }

    /// The multiplexer, for a control request. An in-process one may be asleep
    /// holding its lock: the kick wakes it (its wake-up flag is up while it sleeps).
    fn control(&self) -> MutexGuard<'_, Box<dyn Multiplexer>> {
        if self.in_process {
            let _ = self.kick.notify_if_sleeping();
        }
        lock(&self.mux)
    }

    /// Installs (`Some`) or removes a handler on a socket's channel. A
    /// window the spec names must be this stack's [`Window`] or inside it.
    pub fn set_handler(&self, id: usize, spec: Option<&HandlerSpec>) -> io::Result<()> {
        let channel = self.sock(id).channel;
        match spec {
            Some(spec) => self.control().install_handler(channel, spec),
            None => self.control().remove_handler(channel),
        }
    }

    /// How long a neighbour is tried before it is given up.
    pub fn arp_give_up(&self) -> Duration {
        self.arp.config().give_up
    }

    /// Whether the rings have something for a thread about to sleep: frames
    /// to pump, buffers back, or, for a send that found the tx ring full, room
    /// on it again (inline frames come back on no completion ring, so the
    /// multiplexer's taking them is only seen here).
    pub fn has_work(&self) -> bool {
        self.rx.has_pending()
            || self.completion.has_pending()
            || (self.tx_blocked && self.tx.outstanding() < self.tx.entries())
    }

    /// A send found the tx ring or the send buffers full, or a connection
    /// corked: a sleep must also wait for the multiplexer to take frames, not
    /// only for received ones.
    pub fn tx_blocked(&self) -> bool {
        self.tx_blocked || self.tx_corked
    }

    /// Frames wait on the tx ring for the multiplexer.
    pub fn tx_queued(&self) -> bool {
        self.tx.outstanding() > 0
    }

    /// The earliest timer of the cores and connections.
    #[inline]
    pub fn next_deadline(&self) -> Option<Time> {
        earlier(
            earlier(self.reasm.next_deadline(), self.arp.next_deadline()),
            self.tcp.next_deadline(),
        )
    }

    pub fn stats(&self) -> StackStats {
        StackStats {
            ipv4: self.ipv4.stats().clone(),
            reasm: self.reasm.stats().clone(),
            icmp: self.icmp.stats().clone(),
            udp: self.udp_stats.clone(),
            arp: self.arp.stats().clone(),
            sockets: self.socket_stats.clone(),
            tx: self.tx_stats.clone(),
            tcp: self.tcp_stats(),
            reasm_bytes: self.reasm.bytes_held(),
            queued: self.sockets.iter().flatten().map(|s| s.queue.len()).sum(),
        }
    }

    pub fn sock(&self, id: usize) -> &Sock {
        self.sockets[id]
            .as_ref()
            .expect("socket id of a live socket")
    }

    pub fn sock_opt(&self, id: usize) -> Option<&Sock> {
        self.sockets.get(id)?.as_ref()
    }

    pub fn sock_mut(&mut self, id: usize) -> &mut Sock {
        self.sockets[id]
            .as_mut()
            .expect("socket id of a live socket")
    }

    /// Binds a channel at the multiplexer and adds a socket for it.
    pub fn open(&mut self, kind: Kind, local: SocketAddrV4) -> io::Result<usize> {
        let ip = self.bind_ip(*local.ip());
        let proto = match kind {
            Kind::Udp => PROTO_UDP,
            Kind::Echo => exonet_shm::control::PROTO_ICMP,
            Kind::Tcp => exonet_shm::control::PROTO_TCP,
        };
        // The registry lets one endpoint hold a port more than once (for its raw
        // channels); two sockets on one port would split its datagrams.
        if local.port() != 0
            && self
                .sockets
                .iter()
                .flatten()
                .any(|s| s.kind == kind && s.local.port() == local.port() && *s.local.ip() == ip)
        {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "{ip}:{} is bound by another socket of this stack",
                    local.port()
                ),
            ));
        }
        let (channel, port) =
            self.control()
                .bind_socket(self.endpoint, proto, (ip, local.port()), None)?;
        Ok(self.add_socket(Sock::new(kind, channel, SocketAddrV4::new(ip, port))))
    }

    /// The address of ours a socket bound to `ip` gets: `ip`, or for 0.0.0.0
    /// the first (the multiplexer binds one address per channel).
    fn bind_ip(&self, ip: Ipv4Addr) -> Ipv4Addr {
        if ip.is_unspecified() {
            self.info.addrs[0].0
        } else {
            ip
        }
    }

    /// Adds a socket in a free slot and routes its channel to it.
    fn add_socket(&mut self, sock: Sock) -> usize {
        let channel = sock.channel;
        let id = self.insert_socket(sock);
        self.by_channel.insert(channel, id);
        id
    }

    /// Adds a socket in a free slot.
    fn insert_socket(&mut self, sock: Sock) -> usize {
        match self.sockets.iter().position(Option::is_none) {
            Some(i) => {
                self.sockets[i] = Some(sock);
                i
            }
            None => {
                self.sockets.push(Some(sock));
                self.sockets.len() - 1
            }
        }
    }

    /// Removes a socket: its queued buffers go back, its channel is unbound. A
    /// TCP connection closes as TCP does, in the background.
    pub fn close(&mut self, id: usize) {
        if self.sock_opt(id).is_some_and(|s| s.kind == Kind::Tcp) {
            self.tcp_close(id);
            return;
        }
        let Some(sock) = self.sockets[id].take() else {
            return;
        };
        self.by_channel.remove(&sock.channel);
        self.flush_tx();
        for d in sock.queue {
            self.release(&d.body);
        }
        // The multiplexer may be gone already; then everything is reclaimed.
        let _ = self.control().unbind(sock.channel);
        let _ = self.give_back();
    }

    /// Waits (briefly, bounded) until the multiplexer has taken every frame off
    /// the tx ring: what was sent before a close goes out on the channel it was
    /// sent on, as a kernel socket's would.
    fn flush_tx(&mut self) {
        let give_up = Instant::now() + Duration::from_secs(1);
        while self.tx.outstanding() > 0 && Instant::now() < give_up {
            if !self.nudge(Duration::from_micros(50)) {
                return;
            }
        }
    }

    /// Lets the multiplexer move frames while a thread waits for it outside
    /// the sleep protocol: runs an in-process one (or, if another thread is
    /// at it, pauses), kicks a daemon and pauses. False if the daemon is gone.
    fn nudge(&mut self, pause: Duration) -> bool {
        if self.in_process {
            if let Ok(mut m) = self.mux.try_lock() {
                // Pause only when nothing moved: the peer has to answer.
                if m.drive().unwrap_or(0) > 0 {
                    return true;
                }
            }
        } else if self.kick.notify_if_sleeping().is_err() {
            return false;
        }
        std::thread::sleep(pause);
        true
    }

    /// Our address and prefix on the subnet of `dst`, if any.
    fn on_link(&self, dst: Ipv4Addr) -> Option<(Ipv4Addr, u8)> {
        self.info.addrs.iter().copied().find(|&(a, len)| {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(dst) & mask
        })
    }

    /// Gives a datagram's receive buffer back (on the next [`Inner::give_back`]).
    pub fn release(&mut self, body: &Body) {
        if let Body::Segment { buffer, .. } = body {
            self.to_free.push(*buffer);
        }
    }

    /// Puts released receive buffers on the free ring and wakes the multiplexer
    /// if it sleeps.
    fn give_back(&mut self) -> io::Result<()> {
        if self.to_free.is_empty() {
            return Ok(());
        }
        let n = self
            .free
            .reserve(self.to_free.len() as u32)
            .map_err(ring_error)?;
        for (i, b) in self.to_free.drain(..n as usize).enumerate() {
            self.free.write(i as u32, Desc::buffer(b, 0, 0));
        }
        self.free.submit(n);
        self.kick.notify_if_sleeping()?;
        Ok(())
    }

    /// Moves everything forward: completions back to the pool, received frames
    /// into their sockets, due timers. Problems with single frames are counted,
    /// never returned.
    pub fn pump(&mut self, now: Time) {
        self.pump_with(now, |_| {});
    }

    /// [`Inner::pump`], running `then` after the frames and timers are taken
    /// in and before the connections answer them, so that what `then` sends
    /// carries those answers (a close's FIN the ACK of the peer's FIN).
    pub fn pump_with(&mut self, now: Time, then: impl FnOnce(&mut Inner)) {
        self.clock = now;
        while let Ok(Some(d)) = self.completion.pop() {
            if d.flags & Desc::REJECTED != 0 {
                self.tx_stats.rejected += 1;
            }
            if d.is_chain() {
                if let Some(owner) = self.send_area.complete(d.offset) {
                    if let Some(c) = owner.and_then(|id| self.conn_mut(id)) {
                        c.conn.reference_done();
                    }
                    continue;
                }
            }
            if !d.is_inline() {
                if let Some(b) = self.frames.layout().buffer_of(d.offset) {
                    self.tx_pool.push(b);
                }
            }
        }
        // Connections accepted lately move to their own channels as soon as
        // the multiplexer answers, so that it follows them there.
        if self.tcp_promotions_ahead() {
            self.tcp_take_bound(false);
        }
        self.tcp_bind_lazy(now);
        // A clone (an Arc) holds the frames while their bytes are input;
        // taken at the first frame in a buffer, as most pumps see none.
        let mut frames = None;
        let mut inline = [0u8; INLINE_MAX];
        while let Ok(Some(d)) = self.rx.pop_frame(&mut inline) {
            if d.is_inline() {
                let n = (d.len as usize).min(INLINE_MAX);
                self.input(now, d.channel, &inline[..n], None, false);
                continue;
            }
            let frames: &Frames = frames.get_or_insert_with(|| self.frames.clone());
            let Some(buffer) = frames.layout().buffer_of(d.offset) else {
                continue;
            };
            let kept = match segment_bytes(frames, d.offset, d.len) {
                Some(frame) => {
                    let checked = d.flags & Desc::CSUM_OK != 0;
                    self.input(now, d.channel, frame, Some((buffer, d.offset)), checked)
                }
                None => false,
            };
            if !kept {
                self.to_free.push(buffer);
            }
        }
        if self.next_deadline().is_some_and(|t| t <= now) {
            self.reasm.poll(now);
            self.retry_arp(now);
            self.tcp_timers(now);
        }
        then(self);
        self.tcp_transmit_dirty(now);
        // A failure to give buffers back is retried on the next pump. Most
        // pumps have none to give: no call.
        if !self.to_free.is_empty() {
            let _ = self.give_back();
        }
    }

    /// Sorts one received frame into its socket; true if the socket now holds
    /// its segment buffer (`at`: the buffer and the frame's offset, for frames in
    /// the segment; `checked`: the multiplexer says its transport checksum is
    /// good, [`Desc::CSUM_OK`]).
    fn input(
        &mut self,
        now: Time,
        channel: u32,
        frame: &[u8],
        at: Option<(u32, u32)>,
        checked: bool,
    ) -> bool {
        if !self.by_channel.contains_key(&channel) && self.tcp_promotions_ahead() {
            // An accepted connection's own channel: the multiplexer answered
            // the bind before it delivered anything on it.
            self.tcp_take_bound(false);
        }
        let Some(&id) = self.by_channel.get(&channel) else {
            self.socket_stats.no_socket += 1;
            return false;
        };
        let Ok(dg) = self.ipv4.receive(frame) else {
            return false;
        };
        if dg.is_fragment() {
            let packet = Ipv4Packet::new_unchecked(dg.datagram);
            if let Ok(Some(whole)) = self.reasm.input(now, &packet) {
                self.input_reassembled(id, &dg, whole);
            }
            return false;
        }
        let start = dg.payload.as_ptr() as usize - frame.as_ptr() as usize;
        let body = |len: usize| match at {
            Some((buffer, offset)) => Body::Segment {
                buffer,
                start: offset + start as u32,
                len: len as u32,
            },
            None => {
                let mut bytes = [0u8; INLINE_MAX];
                bytes[..frame.len()].copy_from_slice(frame);
                Body::Inline {
                    bytes,
                    start: start as u8,
                    len: len as u8,
                }
            }
        };
        self.deliver(id, &dg, body, checked) && at.is_some()
    }

    fn input_reassembled(&mut self, id: usize, last: &Ipv4Datagram, whole: Vec<u8>) {
        let whole = Arc::new(whole);
        let Ok(p) = Ipv4Packet::new_checked(&whole[..]) else {
            return;
        };
        let header_len = p.header_len();
        let total = usize::from(p.total_len());
        let dg = Ipv4Datagram {
            more_frags: false,
            frag_offset: 0,
            header_len,
            datagram: &whole[..total],
            payload: &whole[header_len..total],
            ..*last
        };
        let data = whole.clone();
        self.deliver(
            id,
            &dg,
            |_len| Body::Owned {
                data,
                start: header_len,
            },
            false,
        );
    }

    /// Queues a whole datagram on socket `id` (UDP data or an echo reply) or takes
    /// an ICMP error for it; `body` makes the queue entry from the payload length.
    /// True if it was queued.
    fn deliver(
        &mut self,
        id: usize,
        dg: &Ipv4Datagram,
        body: impl FnOnce(usize) -> Body,
        checked: bool,
    ) -> bool {
        let kind = self.sock(id).kind;
        match (dg.protocol, kind) {
            (protocol::UDP, Kind::Udp) => self.deliver_udp(id, dg, body, checked),
            (protocol::TCP, Kind::Tcp) => {
                self.tcp_input(id, dg, checked);
                false
            }
            (protocol::ICMP, _) => {
                match self.icmp.receive(dg) {
                    Ok(IcmpEvent::EchoReply(r)) if kind == Kind::Echo => {
                        if r.ident != self.sock(id).local.port() {
                            return false;
                        }
                        let d = Datagram {
                            from: SocketAddrV4::new(r.src, 0),
                            body: Body::Owned {
                                data: Arc::new(r.data.to_vec()),
                                start: 0,
                            },
                            check: None,
                            seq: r.seq_no,
                        };
                        self.enqueue(id, d);
                    }
                    Ok(IcmpEvent::Error(e)) => self.icmp_error(id, e),
                    _ => {}
                }
                false
            }
            _ => false,
        }
    }

    fn deliver_udp(
        &mut self,
        id: usize,
        dg: &Ipv4Datagram,
        body: impl FnOnce(usize) -> Body,
        checked: bool,
    ) -> bool {
        self.udp_stats.received += 1;
        let p = dg.payload;
        let ulen = if p.len() >= UDP_LEN {
            usize::from(u16::from_be_bytes([p[4], p[5]]))
        } else {
            0
        };
        if ulen < UDP_LEN || ulen > p.len() {
            self.udp_stats.bad_length += 1;
            return false;
        }
        let from = SocketAddrV4::new(dg.src, u16::from_be_bytes([p[0], p[1]]));
        let sock = self.sock(id);
        if u16::from_be_bytes([p[2], p[3]]) != sock.local.port() {
            self.udp_stats.no_port += 1;
            return false;
        }
        if sock.peer.is_some_and(|peer| peer != from) {
            self.socket_stats.not_peer += 1;
            return false;
        }
        // RFC 768: zero means the sender computed no checksum. One known
        // good is not verified again in the copy.
        let check = (p[6..8] != [0, 0] && !checked).then(|| {
            checksum::add(
                checksum::pseudo_header_sum(dg.src, dg.dst, protocol::UDP, ulen as u16),
                checksum::sum(&p[..UDP_LEN]),
            )
        });
        let data_len = ulen - UDP_LEN;
        let mut b = body(data_len);
        match &mut b {
            Body::Segment { start, .. } => *start += UDP_LEN as u32,
            Body::Inline { start, .. } => *start += UDP_LEN as u8,
            Body::Owned { start, .. } => *start += UDP_LEN,
        }
        self.udp_stats.delivered += 1;
        self.enqueue(
            id,
            Datagram {
                from,
                body: b,
                check,
                seq: 0,
            },
        )
    }

    fn enqueue(&mut self, id: usize, d: Datagram) -> bool {
        let limit = self.socket_queue;
        let sock = self.sock_mut(id);
        if sock.queue.len() >= limit {
            self.socket_stats.queue_full += 1;
            return false;
        }
        sock.queue.push_back(d);
        true
    }

    /// An ICMP error about a datagram of socket `id` (the multiplexer routed it
    /// here by the quoted port). RFC 1122 §4.1.3.3: UDP MUST pass ICMP errors up;
    /// as Linux does, only a connected socket reports them as call errors (an
    /// unconnected one could not tell which send failed). "Fragmentation needed"
    /// lowers the path MTU (RFC 1191).
    fn icmp_error(&mut self, id: usize, e: crate::icmp::IcmpError) {
        let now = self.now();
        let sock = self.sock(id);
        let ours = match sock.kind {
            Kind::Udp => {
                e.quoted.protocol == protocol::UDP && e.quoted.src_port == sock.local.port()
            }
            Kind::Echo => e.quoted.protocol == protocol::ICMP,
            Kind::Tcp => e.quoted.protocol == protocol::TCP,
        };
        if !ours || e.quoted.src != *sock.local.ip() {
            self.socket_stats.icmp_errors_unclaimed += 1;
            return;
        }
        if let Some(mtu) = e.mtu {
            let mtu = usize::from(mtu).min(self.mtu);
            self.pmtu.insert(e.quoted.dst, (mtu, now + PMTU_LIFETIME));
            self.socket_stats.pmtu_updates += 1;
            return;
        }
        let to = SocketAddrV4::new(e.quoted.dst, e.quoted.dst_port);
        let sock = self.sock_mut(id);
        let connected_to = match sock.kind {
            Kind::Udp => sock.peer == Some(to),
            Kind::Echo => sock.peer.is_some_and(|p| *p.ip() == e.quoted.dst),
            Kind::Tcp => false,
        };
        if !connected_to {
            self.socket_stats.icmp_errors_unclaimed += 1;
            return;
        }
        use io::ErrorKind as K;
        sock.error = Some(match e.kind {
            IcmpErrorKind::DstUnreachable(UnreachCode::Port) => K::ConnectionRefused,
            IcmpErrorKind::DstUnreachable(UnreachCode::Net) => K::NetworkUnreachable,
            IcmpErrorKind::DstUnreachable(
                UnreachCode::NetProhibited
                | UnreachCode::HostProhibited
                | UnreachCode::AdminProhibited,
            ) => K::PermissionDenied,
            IcmpErrorKind::DstUnreachable(_) | IcmpErrorKind::TtlExceeded => K::HostUnreachable,
            IcmpErrorKind::ReassemblyExceeded => K::TimedOut,
        });
        self.socket_stats.icmp_errors += 1;
    }

    /// Takes the first good datagram of socket `id` through `read` (given the
    /// payload's bytes), dropping any whose checksum fails on the way; with
    /// `consume`, the datagram leaves the queue. `read` returns the payload's sum
    /// over the bytes it read (0 if it read none) so the check needs no second pass.
    pub fn take<R>(
        &mut self,
        id: usize,
        consume: bool,
        mut read: impl FnMut(&[u8], SocketAddrV4, u16) -> (R, u16, usize),
    ) -> Option<R> {
        let frames = self.frames.clone();
        loop {
            let d = self.sock_mut(id).queue.pop_front()?;
            let bytes: &[u8] = match &d.body {
                Body::Segment { start, len, .. } => {
                    segment_bytes(&frames, *start, *len).unwrap_or_default()
                }
                Body::Inline { bytes, start, len } => {
                    &bytes[usize::from(*start)..usize::from(*start) + usize::from(*len)]
                }
                Body::Owned { data, start } => &data[*start..],
            };
            let (r, sum, summed) = read(bytes, d.from, d.seq);
            let good = d.check.is_none_or(|c| {
                let rest = checksum::sum(&bytes[summed..]);
                // The part read and the rest join at `summed`; an odd split shifts
                // the rest's bytes by one (RFC 1071 §2(B): byte-swap the sum).
                let rest = if summed % 2 == 1 {
                    rest.swap_bytes()
                } else {
                    rest
                };
                checksum::add(checksum::add(c, sum), rest) == 0xffff
            });
            if !good {
                self.socket_stats.bad_checksum += 1;
                self.release(&d.body);
                continue;
            }
            if consume {
                self.release(&d.body);
                let _ = self.give_back();
            } else {
                self.sock_mut(id).queue.push_front(d);
            }
            return Some(r);
        }
    }

    /// Whether a send could go now (a send buffer or an inline slot).
    pub fn writable(&self) -> bool {
        !self.tx_pool.is_empty() || self.tx.has_inline()
    }

    /// The largest datagram to send whole to `dst`.
    fn path_mtu(&mut self, dst: Ipv4Addr, now: Time) -> usize {
        match self.pmtu.get(&dst) {
            Some(&(mtu, until)) if until > now => mtu,
            Some(_) => {
                self.pmtu.remove(&dst);
                self.mtu
            }
            None => self.mtu,
        }
    }

    /// The Ethernet destination for `dst`, or `None` while it is being resolved.
    /// Only our subnets are reachable: the multiplexer knows no gateway.
    fn next_hop(
        &mut self,
        dst: Ipv4Addr,
        broadcast_ok: bool,
        now: Time,
    ) -> io::Result<Option<[u8; 6]>> {
        let on_link = self.on_link(dst);
        let broadcast = dst.is_broadcast()
            || on_link.is_some_and(|(addr, prefix_len)| {
                IfAddr { addr, prefix_len }.broadcast() == Some(dst)
            });
        if broadcast {
            return if broadcast_ok {
                Ok(Some([0xff; 6]))
            } else {
                Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "a broadcast needs set_broadcast(true)",
                ))
            };
        }
        if dst.is_multicast() || dst.is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot send to {dst}"),
            ));
        }
        if on_link.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::NetworkUnreachable,
                format!("{dst} is not on the link (exonet knows no gateway)"),
            ));
        }
        if self.info.addrs.iter().any(|&(a, _)| a == dst) {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("{dst} is this host: the multiplexer does not loop frames back"),
            ));
        }
        match self.arp.lookup(dst, now) {
            Lookup::Hit(mac) => Ok(Some(mac)),
            Lookup::Wait => Ok(None),
            Lookup::Ask => self.ask(dst, now),
        }
    }

    fn ask(&mut self, dst: Ipv4Addr, now: Time) -> io::Result<Option<[u8; 6]>> {
        let mac = self.control().resolve(dst)?;
        match mac {
            Some(mac) => {
                for mut held in self.arp.resolved(dst, mac, now) {
                    held.frame[..6].copy_from_slice(&mac);
                    // A held frame that finds no room now is dropped, as the
                    // network might have.
                    let _ = self.push_frame(held.channel, &[&held.frame]);
                }
                Ok(Some(mac))
            }
            None => {
                if !self.arp.unknown(dst, now) {
                    return Err(io::Error::new(
                        io::ErrorKind::HostUnreachable,
                        "too many neighbours are being resolved",
                    ));
                }
                Ok(None)
            }
        }
    }

    fn retry_arp(&mut self, now: Time) {
        for ip in self.arp.due(now) {
            if self.arp.lookup(ip, now) == Lookup::Ask {
                let _ = self.ask(ip, now);
            }
        }
    }

    /// Sends one IPv4 datagram of protocol `proto` on socket `id` to `dst`: `l4`
    /// writes the transport header and payload into the slice it is given (of
    /// `l4_len` bytes) and is called once. Fragments to the path MTU. While the
    /// neighbour is unresolved, a non-blocking socket's datagram is held (RFC 1122
    /// §2.3.2.2) and a blocking socket's call waits ([`SendError::Unresolved`]).
    pub fn send(
        &mut self,
        id: usize,
        dst: Ipv4Addr,
        proto: u8,
        l4_len: usize,
        l4: impl FnOnce(&mut [u8]),
    ) -> Result<(), SendError> {
        let hold = self.sock(id).nonblocking;
        self.send_noting_full(id, dst, proto, l4_len, hold, l4)
    }

    /// As [`Inner::send`], but the datagram is held while the neighbour is
    /// unresolved whatever the socket's mode: for what nobody waits to send, as
    /// a listener's SYN cookies.
    pub(super) fn send_held(
        &mut self,
        id: usize,
        dst: Ipv4Addr,
        proto: u8,
        l4_len: usize,
        l4: impl FnOnce(&mut [u8]),
    ) -> Result<(), SendError> {
        self.send_noting_full(id, dst, proto, l4_len, true, l4)
    }

    /// [`Inner::send_datagram`], noting whether it found the ring full (a
    /// sleeping sender then waits for room).
    fn send_noting_full(
        &mut self,
        id: usize,
        dst: Ipv4Addr,
        proto: u8,
        l4_len: usize,
        hold: bool,
        l4: impl FnOnce(&mut [u8]),
    ) -> Result<(), SendError> {
        let r = self.send_datagram(id, dst, proto, l4_len, hold, l4);
        self.tx_blocked = matches!(r, Err(SendError::Full));
        r
    }

    fn send_datagram(
        &mut self,
        id: usize,
        dst: Ipv4Addr,
        proto: u8,
        l4_len: usize,
        hold: bool,
        l4: impl FnOnce(&mut [u8]),
    ) -> Result<(), SendError> {
        let now = self.clock;
        let (src, channel, broadcast, ttl) = {
            let s = self.sock(id);
            (*s.local.ip(), s.channel, s.broadcast, s.ttl)
        };
        let dst_mac = self.next_hop(dst, broadcast, now)?;
        if dst_mac.is_none() && !hold {
            return Err(SendError::Unresolved);
        }
        let mtu = self.path_mtu(dst, now);
        let total = IP_LEN + l4_len;
        let mut ip = Ipv4Repr::new(src, dst, proto, l4_len);
        ip.ttl = ttl;
        ip.ident = self.ident;
        // Allowed to fragment on the way (RFC 791); path MTU discovery proper
        // (DF set) would only matter behind routers, which this link has none of.
        ip.dont_frag = false;
        let frame_len = ETH_LEN + total;
        let fits = total <= mtu;
        if let Some(mac) = dst_mac.filter(|_| fits) {
            let (src_mac, inline) = (self.info.mac, &mut self.inline);
            let frames = self.frames.clone();
            let (dst_buf, pooled) = if frame_len <= INLINE_MAX && self.tx.has_inline() {
                (&mut inline[..frame_len], None)
            } else {
                let b = self.tx_pool.pop().ok_or(SendError::Full)?;
                match segment_bytes_mut(&frames, b, frame_len as u32) {
                    Some(s) => (s, Some(b)),
                    None => {
                        self.tx_pool.push(b);
                        return Err(SendError::Fatal(io::Error::other(
                            "send buffer out of range",
                        )));
                    }
                }
            };
            write_eth(dst_buf, mac, src_mac);
            ip.emit(&mut dst_buf[ETH_LEN..]).map_err(wire_error)?;
            l4(&mut dst_buf[ETH_LEN + IP_LEN..]);
            let pushed = match pooled {
                None => {
                    let frame = self.inline;
                    self.tx_stats.inline += 1;
                    self.tx.push_inline(channel, &frame[..frame_len])
                }
                Some(b) => self.tx.push(Desc::buffer(b, frame_len as u32, channel)),
            };
            match pushed {
                Ok(true) => {}
                other => {
                    if let Some(b) = pooled {
                        self.tx_pool.push(b);
                    }
                    return match other {
                        Ok(_) => Err(SendError::Full),
                        Err(e) => Err(SendError::Fatal(ring_error(e))),
                    };
                }
            }
            self.ident = self.ident.wrapping_add(1);
            self.tx_stats.datagrams += 1;
            self.tx_stats.frames += 1;
            self.kick.notify_if_sleeping()?;
            return Ok(());
        }
        // The slow path: the whole datagram in private memory, then fragments.
        let mut datagram = vec![0u8; total];
        ip.emit(&mut datagram).map_err(wire_error)?;
        l4(&mut datagram[IP_LEN..]);
        let pieces = fragment(&datagram, mtu)
            .map_err(|e| SendError::Fatal(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let Some(mac) = dst_mac else {
            // Held until the neighbour resolves (only the last datagram's frames
            // are sure to stay, RFC 1122 §2.3.2.2).
            for p in pieces {
                let mut frame = vec![0u8; ETH_LEN + p.len()];
                write_eth(&mut frame, [0; 6], self.info.mac);
                frame[ETH_LEN..].copy_from_slice(&p);
                self.arp.hold(dst, Held { channel, frame });
            }
            self.ident = self.ident.wrapping_add(1);
            self.tx_stats.datagrams += 1;
            return Ok(());
        };
        if pieces.len() > 1 && self.tx_pool.len() < pieces.len() {
            return Err(SendError::Full);
        }
        if pieces.len() > 1 {
            self.tx_stats.fragmented += 1;
        }
        let mut eth = [0u8; ETH_LEN];
        write_eth(&mut eth, mac, self.info.mac);
        for p in &pieces {
            self.push_frame(channel, &[&eth, p])?;
        }
        self.ident = self.ident.wrapping_add(1);
        self.tx_stats.datagrams += 1;
        self.kick.notify_if_sleeping()?;
        Ok(())
    }

    /// Copies a frame, given as consecutive parts, into a send buffer and puts
    /// it on the tx ring for `channel`.
    fn push_frame(&mut self, channel: u32, parts: &[&[u8]]) -> Result<(), SendError> {
        let b = self.tx_pool.pop().ok_or(SendError::Full)?;
        let mut len = 0u32;
        for part in parts {
            if let Err(e) = self.frames.write(b + len, part) {
                self.tx_pool.push(b);
                return Err(SendError::Fatal(ring_error(e)));
            }
            len += part.len() as u32;
        }
        match self.tx.push(Desc::buffer(b, len, channel)) {
            Ok(true) => {
                self.tx_stats.frames += 1;
                Ok(())
            }
            other => {
                self.tx_pool.push(b);
                match other {
                    Ok(_) => Err(SendError::Full),
                    Err(e) => Err(SendError::Fatal(ring_error(e))),
                }
            }
        }
    }

    /// Emits an ICMP echo request for socket `id`.
    pub fn send_echo(
        &mut self,
        id: usize,
        dst: Ipv4Addr,
        seq_no: u16,
        data: &[u8],
    ) -> Result<(), SendError> {
        let ident = self.sock(id).local.port();
        let icmp = IcmpRepr::EchoRequest {
            ident,
            seq_no,
            data,
        };
        let len = icmp.buffer_len();
        self.send(id, dst, protocol::ICMP, len, |buf| {
            // Cannot fail: the buffer has the message's length.
            let _ = icmp.emit(buf);
        })
    }

    /// Emits a UDP datagram for socket `id`, its checksum computed in the copy.
    pub fn send_udp(
        &mut self,
        id: usize,
        dst: SocketAddrV4,
        payload: &[u8],
    ) -> Result<(), SendError> {
        let src = self.sock(id).local;
        self.send(
            id,
            *dst.ip(),
            protocol::UDP,
            UDP_LEN + payload.len(),
            |buf| {
                // Cannot fail: the buffer has the datagram's length, under 65536.
                let _ = crate::udp::emit(buf, src, dst, payload);
            },
        )
    }
}

pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another thread leaves the state as consistent as any single
    // step does (no step spans an unlock), so go on with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.tcp_linger();
        self.flush_tx();
    }
}

/// Nanoseconds on the monotonic clock (`Instant`'s), read directly: a
/// `Time` made from an `Instant` costs a subtraction of two timespecs and a
/// 128-bit product besides, in every round of every socket call.
fn monotonic_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec for the call to write; CLOCK_MONOTONIC
    // exists on every Linux, so the call cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts)
    };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

fn write_eth(buf: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    buf[..6].copy_from_slice(&dst);
    buf[6..12].copy_from_slice(&src);
    buf[12..14].copy_from_slice(&[0x08, 0x00]);
}

fn wire_error(e: exonet_wire::WireError) -> SendError {
    SendError::Fatal(io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

/// The bytes of a frame in one of our receive buffers.
fn segment_bytes(frames: &Frames, offset: u32, len: u32) -> Option<&[u8]> {
    let p = frames.frame_ptr(offset, len).ok()?;
    // SAFETY: `frame_ptr` checked the range lies in one frame buffer of the
    // mapping, which `frames` keeps alive. The buffer is ours: the multiplexer
    // published it on the rx ring and writes it again only after we put it back
    // on the free ring, which happens after this borrow ends (callers hold it only
    // while the datagram is out of every queue). The multiplexer is trusted.
    #[allow(unsafe_code)]
    Some(unsafe { std::slice::from_raw_parts(p.as_ptr(), len as usize) })
}

/// A send buffer to build a frame in.
#[allow(clippy::mut_from_ref)]
fn segment_bytes_mut(frames: &Frames, offset: u32, len: u32) -> Option<&mut [u8]> {
    let p = frames.frame_ptr(offset, len).ok()?;
    // SAFETY: the range lies in one frame buffer (checked). It came from our send
    // pool: it is on no ring, so neither the multiplexer nor another borrow of
    // ours touches it until we push its descriptor, after this borrow ends.
    #[allow(unsafe_code)]
    Some(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len as usize) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direct_port_pays_from_half_the_kernel_burst_and_earns_at_its_rate() {
        let port = DirectPort {
            fd: std::fs::File::open("/dev/null").unwrap().into(),
            bytes_per_sec: 1_000_000,
            burst: 2000,
        };
        let mut d = Direct::new(port);
        let t0 = Time(5_000_000_000);
        assert!(d.take(600, t0));
        assert!(d.take(400, t0));
        // Half the burst spent: nothing left until it is earned.
        assert!(!d.take(1, t0));
        // 100 µs at 1 MB/s: 100 bytes.
        assert!(!d.take(101, Time(t0.0 + 100_000)));
        assert!(d.take(100, Time(t0.0 + 100_000)));
        // Earning stops at the cap, however long the wait.
        assert!(!d.take(1001, Time(t0.0 + 60_000_000_000)));
        assert!(d.take(1000, Time(t0.0 + 60_000_000_000)));
        // A clock that goes back earns nothing and is not trusted.
        assert!(!d.take(1, Time(1)));
    }
}
