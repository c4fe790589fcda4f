//! Host duties no application can be trusted with: answering ARP for the
//! host's addresses, keeping the ARP cache, answering pings, and refusing
//! what no channel accepts (TCP RST, ICMP port unreachable), the refusals
//! rate-limited by a token bucket.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::ident::Idents;
use crate::Proto;
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
    /// Host frames dropped because the queue to the link was full.
    pub queue_dropped: u64,
    /// Cycles ([`crate::cycles`]) spent on frames no channel accepted.
    pub cycles: u64,
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
            ("cycles", self.cycles),
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
    pub stats: HostStats,
    /// Identifications of fragmented datagrams, for the applications' and
    /// the host's alike.
    pub idents: Idents,
}

impl Host {
    pub fn new(config: HostConfig, mac: [u8; 6], addrs: Vec<Ipv4Addr>, now: Instant) -> Host {
        Host {
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

    fn queue(&mut self, frame: Vec<u8>) {
        if self.out.len() >= self.config.queue {
            self.stats.queue_dropped += 1;
        } else {
            self.out.push_back(frame);
        }
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
                let l4 = Transport::Icmp(IcmpRepr::EchoReply {
                    ident,
                    seq_no,
                    data,
                });
                let ipr = Ipv4Repr::new(src, peer, protocol::ICMP, l4.buffer_len());
                let Ok(f) = build::ipv4_frame(&reply_to, &ipr, &l4) else {
                    return false;
                };
                self.queue(f);
                self.stats.echo_replies += 1;
                true
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
