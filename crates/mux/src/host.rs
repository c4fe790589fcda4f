//! Host duties no application can be trusted with: answering ARP for the
//! host's addresses, keeping the ARP cache, answering pings, and refusing
//! what no channel accepts (TCP RST, ICMP port unreachable), the refusals
//! rate-limited by a token bucket.
//!
//! A fragmented echo request (`ping -s 4000`) is reassembled here, within
//! small bounds of its own (bytes, datagrams, time; an overlap drops the
//! datagram, RFC 5722), and answered by a reply fragmented to the link's
//! MTU (RFC 791) under an identification from the host-wide counter the
//! applications' fragments use too (the `ident` module). The fragment pool
//! steers the request's fragments here ([`crate::frag::To::Host`]).

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::conn::Tuple;
use crate::ident::Idents;
use crate::Proto;
use exonet_stack::{ReasmConfig, Reassembler, Time};
use exonet_wire::build::{self, Transport};
use exonet_wire::ethernet::ethertype;
use exonet_wire::icmp::{msg_type, unreach};
use exonet_wire::ipv4::protocol;
use exonet_wire::tcp::flags;
use exonet_wire::{
    arp, ArpPacket, ArpRepr, EthernetFrame, EthernetRepr, IcmpPacket, IcmpRepr, Ipv4Packet,
    Ipv4Repr, MacAddr, TcpPacket, UdpPacket,
};

/// Host behaviour and limits.
#[derive(Clone, Copy, Debug)]
pub struct HostConfig {
    /// Answer ICMP echo requests to our addresses.
    pub echo: bool,
    /// Answer TCP segments no channel accepts with RST.
    pub tcp_reset: bool,
    /// Answer UDP datagrams no channel accepts with ICMP port unreachable.
    pub udp_unreachable: bool,
    /// Refusals (RST, unreachable) per second, sustained.
    pub refusal_rate: f64,
    /// Refusals in a burst.
    pub refusal_burst: u32,
    /// How long an ARP cache entry lives.
    pub arp_ttl: Duration,
    /// Least time between two ARP requests for the same address.
    pub arp_retry: Duration,
    /// Most ARP cache entries.
    pub arp_entries: usize,
    /// Most host frames waiting for the link.
    pub queue: usize,
    /// Most bytes of fragmented echo requests held for reassembly.
    pub echo_reasm_bytes: usize,
    /// Most fragmented echo requests reassembled at once.
    pub echo_reasm_datagrams: usize,
    /// How long a fragmented echo request may take to arrive whole.
    pub echo_reasm_timeout: Duration,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            echo: true,
            tcp_reset: true,
            udp_unreachable: true,
            refusal_rate: 100.0,
            refusal_burst: 20,
            arp_ttl: Duration::from_secs(60),
            arp_retry: Duration::from_secs(1),
            arp_entries: 1024,
            queue: 256,
            // A ping of the largest size fits; a flood holds little, briefly.
            echo_reasm_bytes: 64 * 1024,
            echo_reasm_datagrams: 16,
            echo_reasm_timeout: Duration::from_secs(2),
        }
    }
}

/// What the host did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    pub arp_replies_sent: u64,
    pub arp_requests_sent: u64,
    pub arp_learned: u64,
    pub echo_replies: u64,
    pub tcp_resets: u64,
    pub udp_unreachables: u64,
    /// ICMP errors for us delivered to the socket channel whose datagram
    /// they quote.
    pub icmp_errors_delivered: u64,
    /// ICMP errors for us that quote no socket channel's datagram (or
    /// quote garbage); left to the host, which drops them.
    pub icmp_errors_unclaimed: u64,
    /// Refusals not sent because the token bucket was empty.
    pub rate_limited: u64,
    /// Frames no channel accepted and the host did not answer.
    pub unmatched_dropped: u64,
    /// Host frames dropped because the queue to the link was full (a
    /// fragmented reply counts once, and is dropped whole).
    pub queue_dropped: u64,
    /// Fragments of echo requests to the host given to the reassembly,
    /// whatever became of them.
    pub echo_frags: u64,
    /// Fragmented echo requests reassembled (then answered, if valid).
    pub echo_reassembled: u64,
    /// Fragmented echo requests given up incomplete after the timeout.
    pub echo_frag_timed_out: u64,
    /// Echo request fragments dropped for overlapping another, or for
    /// belonging to a datagram dropped so (RFC 5722).
    pub echo_frag_overlap: u64,
    /// Echo request fragments dropped at a bound: bytes held, datagrams,
    /// or fragments of one datagram.
    pub echo_frag_no_room: u64,
    /// Echo request fragments dropped as invalid: a bad header, empty, past
    /// 64 KiB, unaligned, a length conflicting with the last fragment's, or
    /// an exact duplicate.
    pub echo_frag_invalid: u64,
    /// Now: bytes of echo request fragments held for reassembly.
    pub echo_frag_bytes_held: u64,
    /// Cycles ([`crate::cycles`]) spent on frames no channel accepted.
    pub cycles: u64,
    /// RSTs the multiplexer sent for connections whose application went
    /// away, or unbound them, before they finished (Thekkath §III-D).
    pub tcp_aborted: u64,
    /// Connections in TIME-WAIT the multiplexer took over from their
    /// application.
    pub time_wait_held: u64,
    /// ACKs sent for held connections (RFC 9293 §3.10.7.4).
    pub time_wait_acks: u64,
    /// RSTs to held connections, ignored (RFC 1337).
    pub time_wait_rst_ignored: u64,
    /// Holds ended early by a new connection's SYN (RFC 6191 by timestamps, else RFC 1122 §4.2.2.13).
    pub time_wait_reused: u64,
    /// Held connections whose 2×MSL ran out.
    pub time_wait_expired: u64,
    /// Held connections dropped early to stay within
    /// [`crate::MuxConfig::time_wait_max`], oldest first (or not held at all
    /// for want of room or of a filter).
    pub time_wait_evicted: u64,
    /// Now: connections held in TIME-WAIT.
    pub time_wait_now: u64,
}

impl HostStats {
    /// Every counter with its name, for `exonet stats`.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("arp_replies_sent", self.arp_replies_sent),
            ("arp_requests_sent", self.arp_requests_sent),
            ("arp_learned", self.arp_learned),
            ("echo_replies", self.echo_replies),
            ("tcp_resets", self.tcp_resets),
            ("udp_unreachables", self.udp_unreachables),
            ("icmp_errors_delivered", self.icmp_errors_delivered),
            ("icmp_errors_unclaimed", self.icmp_errors_unclaimed),
            ("rate_limited", self.rate_limited),
            ("unmatched_dropped", self.unmatched_dropped),
            ("queue_dropped", self.queue_dropped),
            ("echo_frags", self.echo_frags),
            ("echo_reassembled", self.echo_reassembled),
            ("echo_frag_timed_out", self.echo_frag_timed_out),
            ("echo_frag_overlap", self.echo_frag_overlap),
            ("echo_frag_no_room", self.echo_frag_no_room),
            ("echo_frag_invalid", self.echo_frag_invalid),
            ("echo_frag_bytes_held", self.echo_frag_bytes_held),
            ("cycles", self.cycles),
            ("tcp_aborted", self.tcp_aborted),
            ("time_wait_held", self.time_wait_held),
            ("time_wait_acks", self.time_wait_acks),
            ("time_wait_rst_ignored", self.time_wait_rst_ignored),
            ("time_wait_reused", self.time_wait_reused),
            ("time_wait_expired", self.time_wait_expired),
            ("time_wait_evicted", self.time_wait_evicted),
            ("time_wait_now", self.time_wait_now),
        ]
    }
}

/// A token bucket: `rate` tokens a second, at most `burst`.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate: f64, burst: u32, now: Instant) -> TokenBucket {
        TokenBucket {
            rate,
            burst: burst as f64,
            tokens: burst as f64,
            last: now,
        }
    }

    /// Takes a token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct ArpEntry {
    mac: MacAddr,
    expires: Instant,
}

pub(crate) struct Host {
    pub config: HostConfig,
    pub mac: MacAddr,
    pub addrs: Vec<Ipv4Addr>,
    cache: HashMap<Ipv4Addr, ArpEntry>,
    asked: HashMap<Ipv4Addr, Instant>,
    bucket: TokenBucket,
    pub out: VecDeque<Vec<u8>>,
    /// The counters kept here; [`Host::stats`] adds the reassembly's.
    pub stats: HostStats,
    /// The link's MTU, to fragment replies to.
    mtu: usize,
    reasm: Reassembler,
    /// The reassembler's clock counts from here.
    epoch: Instant,
    /// Identifications of fragmented datagrams, for the applications' and
    /// the host's alike.
    pub idents: Idents,
}

impl Host {
    pub fn new(
        config: HostConfig,
        mac: [u8; 6],
        addrs: Vec<Ipv4Addr>,
        mtu: usize,
        now: Instant,
    ) -> Host {
        let reasm = Reassembler::new(ReasmConfig {
            max_bytes: config.echo_reasm_bytes,
            max_datagrams: config.echo_reasm_datagrams,
            timeout: config.echo_reasm_timeout,
            ..ReasmConfig::default()
        });
        Host {
            mtu,
            reasm,
            epoch: now,
            config,
            mac: MacAddr(mac),
            addrs,
            cache: HashMap::new(),
            asked: HashMap::new(),
            bucket: TokenBucket::new(config.refusal_rate, config.refusal_burst, now),
            out: VecDeque::new(),
            stats: HostStats::default(),
            idents: Idents::new(),
        }
    }

    /// Every counter, the reassembly's included.
    pub fn stats(&self) -> HostStats {
        let r = self.reasm.stats();
        HostStats {
            echo_frags: r.fragments,
            echo_reassembled: r.reassembled,
            echo_frag_timed_out: r.timed_out,
            echo_frag_overlap: r.overlap + r.poisoned,
            echo_frag_no_room: r.no_memory + r.too_many_datagrams + r.too_many_fragments,
            echo_frag_invalid: self.stats.echo_frag_invalid
                + r.empty
                + r.too_long
                + r.unaligned
                + r.length_conflict
                + r.duplicate,
            echo_frag_bytes_held: self.reasm.bytes_held() as u64,
            ..self.stats
        }
    }

    fn time(&self, now: Instant) -> Time {
        let since = now.saturating_duration_since(self.epoch);
        Time(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Whether echo requests are being reassembled (so the clock matters).
    pub fn reassembling(&self) -> bool {
        self.reasm.datagrams_held() > 0
    }

    /// Gives up the echo requests whose reassembly timed out.
    pub fn expire(&mut self, now: Instant) {
        let t = self.time(now);
        self.reasm.poll(t);
    }

    /// Whether a head fragment no channel accepted is an echo request for
    /// the host to reassemble (looking at the bytes only; the reassembly
    /// checks the header).
    pub fn takes_fragment(&self, frame: &[u8]) -> bool {
        let Some(h) = frame.get(..34) else {
            return false;
        };
        let ihl = (h[14] & 0x0f) as usize * 4;
        let dst = Ipv4Addr::new(h[30], h[31], h[32], h[33]);
        self.config.echo
            && h[12..14] == [0x08, 0x00]
            && ihl >= 20
            && h[23] == protocol::ICMP
            && self.ours(dst)
            && frame.get(14 + ihl) == Some(&msg_type::ECHO_REQUEST)
    }

    /// A fragment of an echo request to us (a head [`Host::takes_fragment`]
    /// accepted, or a body fragment the pool steered after it): held for
    /// reassembly, and the request answered once whole.
    pub fn on_echo_fragment(&mut self, frame: &[u8], now: Instant) {
        let eth = EthernetFrame::new_checked(frame).ok();
        let peer_mac = eth.as_ref().map(|e| e.src_addr());
        let ip = frame
            .get(14..)
            .filter(|_| eth.is_some_and(|e| e.ethertype() == ethertype::IPV4))
            .and_then(|p| Ipv4Packet::new_checked(p).ok())
            .filter(|ip| ip.verify_checksum());
        let (Some(peer_mac), Some(ip)) = (peer_mac, ip) else {
            self.stats.echo_frag_invalid += 1;
            return;
        };
        let t = self.time(now);
        // Held, or dropped and counted by the reassembler, unless whole.
        if let Ok(Some(datagram)) = self.reasm.input(t, &ip) {
            let answered = Ipv4Packet::new_checked(&datagram[..])
                .is_ok_and(|ip| self.reply_echo(peer_mac, &ip));
            if !answered {
                self.stats.unmatched_dropped += 1;
            }
        }
    }

    /// Queues a frame for the link; false if the queue was full (counted).
    fn queue(&mut self, frame: Vec<u8>) -> bool {
        if self.out.len() >= self.config.queue {
            self.stats.queue_dropped += 1;
            false
        } else {
            self.out.push_back(frame);
            true
        }
    }

    /// Takes a token from the refusal budget, or counts the answer not
    /// sent.
    pub fn take_token(&mut self, now: Instant) -> bool {
        let ok = self.bucket.take(now);
        if !ok {
            self.stats.rate_limited += 1;
        }
        ok
    }

    /// Queues a bare TCP segment of the multiplexer's own on a connection
    /// (an abandoned one's RST, a held one's ACK), to the next hop `to`.
    /// Whether it was queued.
    pub fn send_tcp(&mut self, to: MacAddr, t: Tuple, fl: u8, seq: u32, ack: u32) -> bool {
        let f = build::tcp_frame(
            self.mac,
            to,
            t.local.0,
            t.remote.0,
            t.local.1,
            t.remote.1,
            fl,
            seq,
            ack,
            &[],
            &[],
        );
        self.queue(f)
    }

    fn ours(&self, a: Ipv4Addr) -> bool {
        self.addrs.contains(&a)
    }

    /// The cached address of `ip`, if fresh.
    pub fn lookup(&self, ip: Ipv4Addr, now: Instant) -> Option<MacAddr> {
        self.cache
            .get(&ip)
            .filter(|e| e.expires > now)
            .map(|e| e.mac)
    }

    /// The cached address of `ip`; if there is none, queues a request (at
    /// most one per `arp_retry`) and returns `None`.
    pub fn resolve(&mut self, ip: Ipv4Addr, now: Instant) -> Option<MacAddr> {
        if let Some(mac) = self.lookup(ip, now) {
            return Some(mac);
        }
        let due = self
            .asked
            .get(&ip)
            .is_none_or(|&t| now.saturating_duration_since(t) >= self.config.arp_retry);
        if due {
            if self.asked.len() >= self.config.arp_entries {
                let retry = self.config.arp_retry;
                self.asked
                    .retain(|_, t| now.saturating_duration_since(*t) < retry);
            }
            if self.asked.len() < self.config.arp_entries {
                let src = self.addrs.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED);
                self.asked.insert(ip, now);
                self.queue(build::arp_request(self.mac, src, ip));
                self.stats.arp_requests_sent += 1;
            }
        }
        None
    }

    fn learn(&mut self, ip: Ipv4Addr, mac: MacAddr, now: Instant) {
        if !mac.is_unicast() || ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return;
        }
        if !self.cache.contains_key(&ip) && self.cache.len() >= self.config.arp_entries {
            self.cache.retain(|_, e| e.expires > now);
            if self.cache.len() >= self.config.arp_entries {
                return;
            }
        }
        let expires = now + self.config.arp_ttl;
        self.cache.insert(ip, ArpEntry { mac, expires });
        self.asked.remove(&ip);
        self.stats.arp_learned += 1;
    }

    /// An ARP frame: learn the sender (RFC 826: if it is already known or
    /// the message is for us) and answer requests for our addresses.
    pub fn on_arp(&mut self, frame: &[u8], now: Instant) {
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return;
        };
        if eth.ethertype() != ethertype::ARP {
            return;
        }
        let Ok(pkt) = ArpPacket::new_checked(eth.payload()) else {
            return;
        };
        let Ok(req) = ArpRepr::parse(&pkt) else {
            return;
        };
        let for_us = self.ours(req.tpa);
        if for_us || self.cache.contains_key(&req.spa) {
            self.learn(req.spa, req.sha, now);
        }
        if for_us && req.oper == arp::OP_REQUEST && req.sha.is_unicast() {
            let reply = ArpRepr {
                oper: arp::OP_REPLY,
                sha: self.mac,
                spa: req.tpa,
                tha: req.sha,
                tpa: req.spa,
            };
            self.queue(build::arp_frame(req.sha, &reply));
            self.stats.arp_replies_sent += 1;
        }
    }

    /// A frame no channel accepted: answer as a host would, or drop.
    pub fn on_unmatched(&mut self, frame: &[u8], now: Instant) {
        if !self.answer(frame, now) {
            self.stats.unmatched_dropped += 1;
        }
    }

    fn answer(&mut self, frame: &[u8], now: Instant) -> bool {
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return false;
        };
        if eth.ethertype() != ethertype::IPV4 || !eth.src_addr().is_unicast() {
            return false;
        }
        let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
            return false;
        };
        if !ip.verify_checksum() || !self.ours(ip.dst_addr()) {
            return false;
        }
        let (src, peer, peer_mac) = (ip.dst_addr(), ip.src_addr(), eth.src_addr());
        if peer.is_broadcast() || peer.is_multicast() || peer.is_unspecified() {
            return false;
        }
        // Only whole datagrams or first fragments carry a transport header.
        if ip.frag_offset() != 0 {
            return false;
        }
        let reply_to = EthernetRepr {
            dst: peer_mac,
            src: self.mac,
            vlans: &[],
            ethertype: ethertype::IPV4,
        };
        match ip.protocol() {
            protocol::ICMP if self.config.echo && !ip.more_frags() => {
                self.reply_echo(peer_mac, &ip)
            }
            protocol::TCP if self.config.tcp_reset => {
                let Ok(seg) = TcpPacket::new_checked(ip.payload()) else {
                    return false;
                };
                if seg.rst() || (!ip.more_frags() && !seg.verify_checksum(peer, src)) {
                    return false;
                }
                if !self.bucket.take(now) {
                    self.stats.rate_limited += 1;
                    return true;
                }
                // RFC 9293 §3.10.7.1: with ACK, <SEQ=SEG.ACK><CTL=RST>;
                // without, <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>.
                let (fl, seq, ack) = if seg.ack() {
                    (flags::RST, seg.ack_number(), 0)
                } else {
                    let seg_len = ip.payload().len().saturating_sub(seg.header_len()) as u32
                        + seg.syn() as u32
                        + seg.fin() as u32;
                    (
                        flags::RST | flags::ACK,
                        0,
                        seg.seq_number().wrapping_add(seg_len),
                    )
                };
                let f = build::tcp_frame(
                    self.mac,
                    peer_mac,
                    src,
                    peer,
                    seg.dst_port(),
                    seg.src_port(),
                    fl,
                    seq,
                    ack,
                    &[],
                    &[],
                );
                self.queue(f);
                self.stats.tcp_resets += 1;
                true
            }
            protocol::UDP if self.config.udp_unreachable => {
                let Ok(dgram) = UdpPacket::new_checked(ip.payload()) else {
                    return false;
                };
                if !ip.more_frags() && dgram.checksum() != 0 && !dgram.verify_checksum(peer, src) {
                    return false;
                }
                if !self.bucket.take(now) {
                    self.stats.rate_limited += 1;
                    return true;
                }
                // RFC 1812 §4.3.2.3: quote as much as fits in 576 bytes.
                let datagram = eth
                    .payload()
                    .get(..ip.total_len() as usize)
                    .unwrap_or(eth.payload());
                let quoted = &datagram[..datagram.len().min(576 - 20 - 8)];
                let l4 = Transport::Icmp(IcmpRepr::DstUnreachable {
                    code: unreach::PORT,
                    next_hop_mtu: 0,
                    quoted,
                });
                let ipr = Ipv4Repr::new(src, peer, protocol::ICMP, l4.buffer_len());
                let Ok(f) = build::ipv4_frame(&reply_to, &ipr, &l4) else {
                    return false;
                };
                self.queue(f);
                self.stats.udp_unreachables += 1;
                true
            }
            _ => false,
        }
    }
}

impl Host {
    /// Answers a whole echo request (to one of our addresses, header
    /// checksum verified), fragmenting the reply to the MTU if it does not
    /// fit (RFC 791 §3.2). Whether it was answered.
    fn reply_echo(&mut self, peer_mac: MacAddr, ip: &Ipv4Packet<&[u8]>) -> bool {
        let (src, peer) = (ip.dst_addr(), ip.src_addr());
        if !peer_mac.is_unicast() || peer.is_broadcast() || peer.is_multicast() {
            return false;
        }
        if peer.is_unspecified() || !self.ours(src) {
            return false;
        }
        let Ok(icmp) = IcmpPacket::new_checked(ip.payload()) else {
            return false;
        };
        if icmp.msg_type() != msg_type::ECHO_REQUEST {
            return false;
        }
        let Ok(IcmpRepr::EchoRequest {
            ident,
            seq_no,
            data,
        }) = IcmpRepr::parse(&icmp)
        else {
            return false;
        };
        let reply_to = EthernetRepr {
            dst: peer_mac,
            src: self.mac,
            vlans: &[],
            ethertype: ethertype::IPV4,
        };
        let l4 = Transport::Icmp(IcmpRepr::EchoReply {
            ident,
            seq_no,
            data,
        });
        let ipr = Ipv4Repr::new(src, peer, protocol::ICMP, l4.buffer_len());
        let fits = ipr.total_len() <= self.mtu;
        // A fragmented reply needs an identification no application's
        // fragments use (an unfragmented one's is never looked at, RFC 6864).
        let ipr = if fits {
            ipr
        } else {
            Ipv4Repr {
                ident: self.idents.take(),
                dont_frag: false,
                ..ipr
            }
        };
        let Ok(f) = build::ipv4_frame(&reply_to, &ipr, &l4) else {
            return false;
        };
        if fits {
            self.queue(f);
        } else {
            let Ok(frags) = exonet_stack::fragment(&f[14..], self.mtu) else {
                return false;
            };
            // Part of a datagram is worth nothing: all of it, or none.
            if self.out.len() + frags.len() > self.config.queue {
                self.stats.queue_dropped += 1;
                return true;
            }
            for frag in frags {
                self.out.push_back([&f[..14], &frag[..]].concat());
            }
        }
        self.stats.echo_replies += 1;
        true
    }
}

/// ICMP types that quote the offending datagram: destination
/// unreachable, time exceeded, parameter problem.
const ICMP_ERRORS: [u8; 3] = [msg_type::DST_UNREACHABLE, msg_type::TIME_EXCEEDED, 12];

/// The quoted datagram of a frame that is a whole, intact ICMP error
/// addressed to one of `addrs`; `None` for any other frame.
pub(crate) fn icmp_error_quote<'a>(frame: &'a [u8], addrs: &[Ipv4Addr]) -> Option<&'a [u8]> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != ethertype::IPV4 || frame.len() < 14 + 20 {
        return None;
    }
    // Cheap rejections first: this runs on every frame no filter took.
    let ihl = (frame[14] & 0x0f) as usize * 4;
    let icmp_type = frame.get(14 + ihl);
    if frame[14 + 9] != protocol::ICMP || !icmp_type.is_some_and(|t| ICMP_ERRORS.contains(t)) {
        return None;
    }
    let ip = Ipv4Packet::new_checked(&frame[14..]).ok()?;
    if !ip.verify_checksum() || !addrs.contains(&ip.dst_addr()) {
        return None;
    }
    // A fragment's checksum cannot be checked, nor its quote trusted whole.
    if ip.frag_offset() != 0 || ip.more_frags() {
        return None;
    }
    let icmp = IcmpPacket::new_checked(ip.payload()).ok()?;
    if !icmp.verify_checksum() {
        return None;
    }
    let end = (14 + ip.total_len() as usize).min(frame.len());
    frame.get(14 + ip.header_len() + exonet_wire::icmp::HEADER_LEN..end)
}

/// The UDP or TCP flow of ours a quoted datagram belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QuotedFlow {
    pub proto: Proto,
    /// Our address and port: the quoted source.
    pub local: (Ipv4Addr, u16),
    /// The quoted destination.
    pub remote: (Ipv4Addr, u16),
}

/// Reads a quote: an IPv4 header with a valid IHL, from one of `addrs`, UDP
/// or TCP, first fragment (only it has ports), and the 8 bytes of transport
/// header every ICMP error must carry (RFC 792).
pub(crate) fn quoted_flow(quoted: &[u8], addrs: &[Ipv4Addr]) -> Option<QuotedFlow> {
    let ip = Ipv4Packet::new_checked_header(quoted).ok()?;
    let proto = match ip.protocol() {
        protocol::UDP => Proto::Udp,
        protocol::TCP => Proto::Tcp,
        _ => return None,
    };
    if ip.frag_offset() != 0 || !addrs.contains(&ip.src_addr()) {
        return None;
    }
    let l4 = quoted.get(ip.header_len()..ip.header_len() + 8)?;
    let port = |i: usize| u16::from_be_bytes([l4[i], l4[i + 1]]);
    Some(QuotedFlow {
        proto,
        local: (ip.src_addr(), port(0)),
        remote: (ip.dst_addr(), port(2)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refills() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 2, t0);
        assert!(b.take(t0) && b.take(t0) && !b.take(t0));
        assert!(b.take(t0 + Duration::from_millis(100)));
        assert!(!b.take(t0 + Duration::from_millis(100)));
        let later = t0 + Duration::from_secs(10);
        assert!(b.take(later) && b.take(later) && !b.take(later));
    }
}
