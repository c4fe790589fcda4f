//! ICMPv4 for a host (RFC 792, RFC 1122 §3.2.2): answering echo requests, a
//! library-level ping, and turning Destination Unreachable and Time Exceeded into an
//! [`IcmpError`] naming the flow it concerns, so the UDP socket layer can report
//! "connection refused" (RFC 1122 §4.1.3.3) and a path-MTU cache can learn the
//! next-hop MTU (RFC 1191).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::time::Time;

use exonet_wire::icmp::{msg_type, time_exceeded, unreach};
use exonet_wire::ipv4::protocol;
use exonet_wire::{IcmpPacket, IcmpRepr, Ipv4Packet, Ipv4Repr, WireError};

use crate::ipv4_rx::{DstKind, Ipv4Datagram};

/// Why a received ICMP message was not acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcmpDrop {
    /// Shorter than the 8-byte ICMP header.
    Truncated,
    /// The checksum over the message does not verify (RFC 792).
    BadChecksum,
    /// A type this host does not handle (RFC 1122 §3.2.2: MUST silently discard).
    UnknownType,
    /// An echo request to a broadcast or multicast address (RFC 1122 §3.2.2.6: MAY
    /// silently discard; done, as Linux does by default, against smurf amplification).
    BroadcastEcho,
    /// An error whose quoted datagram is unusable: a bad IPv4 header, fewer than the
    /// 64 bits of transport header RFC 792 requires, or a non-first fragment (which
    /// carries no ports).
    BadQuoted,
}

impl IcmpDrop {
    /// Every reason, in counter order.
    pub const ALL: [IcmpDrop; 5] = [
        IcmpDrop::Truncated,
        IcmpDrop::BadChecksum,
        IcmpDrop::UnknownType,
        IcmpDrop::BroadcastEcho,
        IcmpDrop::BadQuoted,
    ];
}

/// Messages seen, by outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IcmpStats {
    /// Messages given to [`Icmp::receive`].
    pub received: u64,
    /// Echo requests answered.
    pub echo_requests: u64,
    /// Echo replies passed on.
    pub echo_replies: u64,
    /// Errors parsed into an [`IcmpError`].
    pub errors: u64,
    dropped: [u64; IcmpDrop::ALL.len()],
}

impl IcmpStats {
    /// Messages dropped for `reason`.
    pub fn dropped(&self, reason: IcmpDrop) -> u64 {
        self.dropped[reason as usize]
    }
}

/// Destination Unreachable codes: RFC 792 (0–5), RFC 1122 §3.2.2.1 (6–12) and
/// RFC 1812 §5.2.7.1 (13–15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnreachCode {
    /// 0: net unreachable.
    Net,
    /// 1: host unreachable.
    Host,
    /// 2: protocol unreachable.
    Protocol,
    /// 3: port unreachable ("connection refused" for UDP).
    Port,
    /// 4: fragmentation needed and DF set (RFC 1191).
    FragNeeded,
    /// 5: source route failed.
    SourceRoute,
    /// 6: destination network unknown.
    NetUnknown,
    /// 7: destination host unknown.
    HostUnknown,
    /// 8: source host isolated.
    SourceIsolated,
    /// 9: communication with destination network administratively prohibited.
    NetProhibited,
    /// 10: communication with destination host administratively prohibited.
    HostProhibited,
    /// 11: network unreachable for type of service.
    NetTos,
    /// 12: host unreachable for type of service.
    HostTos,
    /// 13: communication administratively prohibited.
    AdminProhibited,
    /// 14: host precedence violation.
    PrecedenceViolation,
    /// 15: precedence cutoff in effect.
    PrecedenceCutoff,
    /// A code no RFC assigns; kept so that the error still reaches its socket.
    Other(u8),
}

impl UnreachCode {
    /// Decodes the code field.
    pub fn from_code(code: u8) -> Self {
        use UnreachCode::*;
        const KNOWN: [UnreachCode; 16] = [
            Net,
            Host,
            Protocol,
            Port,
            FragNeeded,
            SourceRoute,
            NetUnknown,
            HostUnknown,
            SourceIsolated,
            NetProhibited,
            HostProhibited,
            NetTos,
            HostTos,
            AdminProhibited,
            PrecedenceViolation,
            PrecedenceCutoff,
        ];
        KNOWN.get(usize::from(code)).copied().unwrap_or(Other(code))
    }
}

/// What kind of error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcmpErrorKind {
    /// Destination Unreachable (type 3).
    DstUnreachable(UnreachCode),
    /// Time Exceeded (type 11), code 0: TTL exceeded in transit.
    TtlExceeded,
    /// Time Exceeded (type 11), code 1 (or unassigned): reassembly time exceeded.
    ReassemblyExceeded,
}

impl IcmpErrorKind {
    /// Whether the error is "hard" and should end the flow rather than be taken as a
    /// routing transient: RFC 1122 §3.2.2.1 and §4.2.3.9 name codes 2, 3 and 4 (as
    /// Linux, 9, 10 and 13 are hard too: a prohibition does not heal by itself).
    pub fn is_hard(&self) -> bool {
        use UnreachCode::*;
        matches!(
            self,
            IcmpErrorKind::DstUnreachable(
                Protocol | Port | FragNeeded | NetProhibited | HostProhibited | AdminProhibited
            )
        )
    }
}

/// The flow an error concerns, from the quoted IPv4 header and the first 8 bytes of
/// its transport header (RFC 792).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quoted {
    /// Source of the offending datagram (normally us).
    pub src: Ipv4Addr,
    /// Its destination.
    pub dst: Ipv4Addr,
    /// Its protocol.
    pub protocol: u8,
    /// The first 16-bit word of its transport header: the source port for UDP and TCP.
    pub src_port: u16,
    /// The second word: the destination port for UDP and TCP.
    pub dst_port: u16,
}

/// A parsed ICMP error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcmpError {
    /// What happened.
    pub kind: IcmpErrorKind,
    /// To which flow.
    pub quoted: Quoted,
    /// For fragmentation needed: the path MTU to use (see [`Icmp::receive`]).
    pub mtu: Option<u16>,
}

/// RFC 791 §3.2: every host must handle 68-byte datagrams; RFC 1191 §3: a path MTU
/// estimate MUST NOT go below it.
pub const MIN_MTU: u16 = 68;

/// RFC 1191 §7 table 7-1: common MTUs, for routers that do not report one.
const PLATEAUS: [u16; 10] = [
    32000, 17914, 8166, 4352, 2002, 1492, 1006, 508, 296, MIN_MTU,
];

/// The MTU to use after a fragmentation-needed error: the reported next-hop MTU, or
/// for an RFC 1191 §5 "old-style" router that reports 0, the largest plateau below
/// the rejected datagram's total length; never below 68.
pub fn frag_needed_mtu(next_hop_mtu: u16, quoted_total_len: u16) -> u16 {
    let mtu = if next_hop_mtu != 0 {
        next_hop_mtu
    } else {
        PLATEAUS
            .into_iter()
            .find(|p| *p < quoted_total_len)
            .unwrap_or(MIN_MTU)
    };
    mtu.max(MIN_MTU)
}

/// An echo reply as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoReply<'a> {
    /// Who answered.
    pub src: Ipv4Addr,
    /// Identifier.
    pub ident: u16,
    /// Sequence number.
    pub seq_no: u16,
    /// Data (the request's, if the peer follows RFC 1122 §3.2.2.6).
    pub data: &'a [u8],
}

/// An ICMP message to send in an IPv4 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpOut<'a> {
    /// Our address to send from.
    pub src: Ipv4Addr,
    /// Destination.
    pub dst: Ipv4Addr,
    /// The message.
    pub icmp: IcmpRepr<'a>,
}

impl IcmpOut<'_> {
    /// IPv4 header plus message.
    pub fn buffer_len(&self) -> usize {
        self.ip().total_len()
    }

    /// Writes the IPv4 datagram (TTL 64, no options) into the front of `buf`,
    /// returning its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let ip = self.ip();
        ip.emit(buf)?;
        let body = buf
            .get_mut(ip.header_len()..ip.total_len())
            .ok_or(WireError::Truncated)?;
        self.icmp.emit(body)?;
        Ok(ip.total_len())
    }

    fn ip(&self) -> Ipv4Repr<'static> {
        let mut ip = Ipv4Repr::new(self.src, self.dst, protocol::ICMP, self.icmp.buffer_len());
        // Errors may be fragmented on the way back; echo replies as large as the
        // request may need it too (RFC 1122 §3.2.2.6 requires the data entire).
        ip.dont_frag = false;
        ip
    }
}

/// What a received ICMP message means for the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcmpEvent<'a> {
    /// An echo request was received; send this reply (RFC 1122 §3.2.2.6: MUST
    /// answer, from the address the request was sent to, with the data entire).
    Reply(IcmpOut<'a>),
    /// An echo reply, for a [`Pinger`].
    EchoReply(EchoReply<'a>),
    /// An error about a datagram we sent, for the socket of [`IcmpError::quoted`].
    Error(IcmpError),
}

/// The ICMP receive core: counters only, no other state.
#[derive(Debug, Clone, Default)]
pub struct Icmp {
    stats: IcmpStats,
}

impl Icmp {
    /// A fresh core.
    pub fn new() -> Self {
        Self::default()
    }

    /// The counters.
    pub fn stats(&self) -> &IcmpStats {
        &self.stats
    }

    /// Handles the ICMP message in `ip` (unfragmented or reassembled).
    pub fn receive<'a>(&mut self, ip: &Ipv4Datagram<'a>) -> Result<IcmpEvent<'a>, IcmpDrop> {
        self.stats.received += 1;
        let r = parse(ip);
        match r {
            Ok(IcmpEvent::Reply(_)) => self.stats.echo_requests += 1,
            Ok(IcmpEvent::EchoReply(_)) => self.stats.echo_replies += 1,
            Ok(IcmpEvent::Error(_)) => self.stats.errors += 1,
            Err(reason) => self.stats.dropped[reason as usize] += 1,
        }
        r
    }
}

fn parse<'a>(ip: &Ipv4Datagram<'a>) -> Result<IcmpEvent<'a>, IcmpDrop> {
    let p = IcmpPacket::new_checked(ip.payload).map_err(|_| IcmpDrop::Truncated)?;
    if !p.verify_checksum() {
        return Err(IcmpDrop::BadChecksum);
    }
    let (ident, seq_no) = (p.echo_ident(), p.echo_seq_no());
    let data = &ip.payload[exonet_wire::icmp::HEADER_LEN..];
    match p.msg_type() {
        msg_type::ECHO_REQUEST if ip.dst_kind != DstKind::Unicast => Err(IcmpDrop::BroadcastEcho),
        msg_type::ECHO_REQUEST => Ok(IcmpEvent::Reply(IcmpOut {
            src: ip.dst,
            dst: ip.src,
            icmp: IcmpRepr::EchoReply {
                ident,
                seq_no,
                data,
            },
        })),
        msg_type::ECHO_REPLY => Ok(IcmpEvent::EchoReply(EchoReply {
            src: ip.src,
            ident,
            seq_no,
            data,
        })),
        msg_type::DST_UNREACHABLE | msg_type::TIME_EXCEEDED => {
            let kind = match (p.msg_type(), p.code()) {
                (msg_type::DST_UNREACHABLE, c) => {
                    IcmpErrorKind::DstUnreachable(UnreachCode::from_code(c))
                }
                (_, time_exceeded::TTL) => IcmpErrorKind::TtlExceeded,
                _ => IcmpErrorKind::ReassemblyExceeded,
            };
            let (quoted, total_len) = parse_quoted(data)?;
            let mtu = (kind == IcmpErrorKind::DstUnreachable(UnreachCode::FragNeeded))
                .then(|| frag_needed_mtu(p.next_hop_mtu(), total_len));
            Ok(IcmpEvent::Error(IcmpError { kind, quoted, mtu }))
        }
        _ => Err(IcmpDrop::UnknownType),
    }
}

/// The flow and total length of a quoted datagram (RFC 792: "Internet Header + 64
/// bits of Original Data Datagram").
fn parse_quoted(data: &[u8]) -> Result<(Quoted, u16), IcmpDrop> {
    let q = Ipv4Packet::new_checked_header(data).map_err(|_| IcmpDrop::BadQuoted)?;
    let l4 = q.payload();
    if l4.len() < 8 || q.frag_offset() != 0 {
        return Err(IcmpDrop::BadQuoted);
    }
    let quoted = Quoted {
        src: q.src_addr(),
        dst: q.dst_addr(),
        protocol: q.protocol(),
        src_port: u16::from_be_bytes([l4[0], l4[1]]),
        dst_port: u16::from_be_bytes([l4[2], l4[3]]),
    };
    Ok((quoted, q.total_len()))
}

/// The Port Unreachable to send for a UDP datagram no socket wanted (RFC 1122
/// §4.1.3.1: SHOULD), quoting its header and first 8 data bytes (RFC 792).
///
/// `None` where RFC 1122 §3.2.2 forbids an error: for a datagram sent to a
/// broadcast or multicast address, for a non-first fragment, or from a source that
/// is not one host (0.0.0.0; [`crate::ipv4_rx`] already drops the others). Rate
/// limiting (§3.2.2, SHOULD) is the caller's, since it needs the time.
pub fn port_unreachable<'a>(ip: &Ipv4Datagram<'a>) -> Option<IcmpOut<'a>> {
    if ip.dst_kind != DstKind::Unicast || ip.frag_offset != 0 || ip.src.is_unspecified() {
        return None;
    }
    let end = ip.datagram.len().min(ip.header_len + 8);
    Some(IcmpOut {
        src: ip.dst,
        dst: ip.src,
        icmp: IcmpRepr::DstUnreachable {
            code: unreach::PORT,
            next_hop_mtu: 0,
            quoted: &ip.datagram[..end],
        },
    })
}

/// A reply matched to an outstanding request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pong {
    /// Sequence number.
    pub seq_no: u16,
    /// Time from request to reply.
    pub rtt: Duration,
}

/// A library-level ping: numbers echo requests to one destination and matches the
/// replies, measuring round-trip times with the times the caller passes in.
#[derive(Debug, Clone)]
pub struct Pinger {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ident: u16,
    next_seq: u16,
    outstanding: BTreeMap<u16, Time>,
}

impl Pinger {
    /// Pings `dst` from `src` with identifier `ident` (which tells our replies apart
    /// from other pingers' on the host).
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, ident: u16) -> Self {
        Pinger {
            src,
            dst,
            ident,
            next_seq: 0,
            outstanding: BTreeMap::new(),
        }
    }

    /// The next echo request, sent at `now`.
    pub fn request<'a>(&mut self, now: Time, data: &'a [u8]) -> IcmpOut<'a> {
        let seq_no = self.next_seq;
        self.next_seq = seq_no.wrapping_add(1);
        self.outstanding.insert(seq_no, now);
        IcmpOut {
            src: self.src,
            dst: self.dst,
            icmp: IcmpRepr::EchoRequest {
                ident: self.ident,
                seq_no,
                data,
            },
        }
    }

    /// Matches a reply received at `now`: it must come from the destination with our
    /// identifier and an outstanding sequence number (a duplicate matches nothing).
    pub fn on_reply(&mut self, now: Time, r: &EchoReply) -> Option<Pong> {
        if r.src != self.dst || r.ident != self.ident {
            return None;
        }
        let sent = self.outstanding.remove(&r.seq_no)?;
        Some(Pong {
            seq_no: r.seq_no,
            rtt: now.saturating_duration_since(sent),
        })
    }

    /// Forgets requests sent more than `timeout` before `now`, returning how many
    /// were lost.
    pub fn expire(&mut self, now: Time, timeout: Duration) -> usize {
        let before = self.outstanding.len();
        self.outstanding
            .retain(|_, sent| now.saturating_duration_since(*sent) <= timeout);
        before - self.outstanding.len()
    }

    /// Requests still waiting for a reply.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipv4_rx::{IfAddr, Ipv4Rx};
    use exonet_wire::build::{self, Transport};
    use exonet_wire::{EthernetRepr, MacAddr};
    use proptest::prelude::*;

    const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const FAR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 9);
    const M: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);

    fn rx() -> Ipv4Rx {
        Ipv4Rx::new(&[IfAddr {
            addr: US,
            prefix_len: 24,
        }])
    }

    /// An Ethernet frame carrying `out` from `out.src` to `out.dst`.
    fn frame(dst_mac: MacAddr, out: &IcmpOut) -> Vec<u8> {
        let eth = EthernetRepr {
            dst: dst_mac,
            src: M,
            vlans: &[],
            ethertype: 0,
        };
        let ip = Ipv4Repr::new(out.src, out.dst, 0, 0);
        build::ipv4_frame(&eth, &ip, &Transport::Icmp(out.icmp)).unwrap()
    }

    fn receive(f: &[u8]) -> Result<IcmpEvent<'_>, IcmpDrop> {
        Icmp::new().receive(&rx().receive(f).unwrap())
    }

    /// The first 28 bytes of a UDP datagram we sent from port 5353 to FAR:53.
    fn quoted_udp(total_len: u16) -> Vec<u8> {
        let mut q = vec![0u8; 28];
        let ip = Ipv4Repr::new(US, FAR, protocol::UDP, usize::from(total_len) - 20);
        ip.emit(&mut q).unwrap();
        q[20..22].copy_from_slice(&5353u16.to_be_bytes());
        q[22..24].copy_from_slice(&53u16.to_be_bytes());
        q
    }

    fn error_frame(icmp: IcmpRepr) -> Vec<u8> {
        frame(
            M,
            &IcmpOut {
                src: PEER,
                dst: US,
                icmp,
            },
        )
    }

    /// RFC 1122 §3.2.2.6: the reply comes from the request's destination and carries
    /// the identifier, sequence number and data unchanged.
    #[test]
    fn rfc1122_3_2_2_6_echo_reply() {
        let req = IcmpOut {
            src: PEER,
            dst: US,
            icmp: IcmpRepr::EchoRequest {
                ident: 7,
                seq_no: 9,
                data: b"ping data",
            },
        };
        let f = frame(M, &req);
        let Ok(IcmpEvent::Reply(reply)) = receive(&f) else {
            panic!("no reply")
        };
        assert_eq!((reply.src, reply.dst), (US, PEER));
        assert_eq!(
            reply.icmp,
            IcmpRepr::EchoReply {
                ident: 7,
                seq_no: 9,
                data: b"ping data"
            }
        );
        // The emitted reply parses back as an echo reply at the requester.
        let mut buf = vec![0; reply.buffer_len()];
        assert_eq!(reply.emit(&mut buf).unwrap(), buf.len());
        let ip = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert!(ip.verify_checksum() && !ip.dont_frag());
        let icmp = IcmpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!(IcmpRepr::parse(&icmp).unwrap(), reply.icmp);
        let mut peer = Ipv4Rx::new(&[IfAddr {
            addr: PEER,
            prefix_len: 24,
        }]);
        let f = frame(M, &reply);
        let Ok(IcmpEvent::EchoReply(r)) = Icmp::new().receive(&peer.receive(&f).unwrap()) else {
            panic!("no echo reply")
        };
        assert_eq!(
            (r.src, r.ident, r.seq_no, r.data),
            (US, 7, 9, &b"ping data"[..])
        );
    }

    /// RFC 1122 §3.2.2.6: echo requests to broadcast MAY be discarded, and are.
    #[test]
    fn rfc1122_3_2_2_6_broadcast_echo_dropped() {
        let req = IcmpOut {
            src: PEER,
            dst: Ipv4Addr::BROADCAST,
            icmp: IcmpRepr::EchoRequest {
                ident: 1,
                seq_no: 1,
                data: b"",
            },
        };
        assert_eq!(
            receive(&frame(MacAddr::BROADCAST, &req)),
            Err(IcmpDrop::BroadcastEcho)
        );
    }

    /// RFC 792: a bad checksum is dropped; RFC 1122 §3.2.2: unknown types are
    /// silently discarded.
    #[test]
    fn rfc792_checksum_and_rfc1122_3_2_2_unknown_type() {
        let req = IcmpOut {
            src: PEER,
            dst: US,
            icmp: IcmpRepr::EchoRequest {
                ident: 1,
                seq_no: 1,
                data: b"abcd",
            },
        };
        let mut f = frame(M, &req);
        *f.last_mut().unwrap() ^= 1;
        let mut icmp = Icmp::new();
        assert_eq!(
            icmp.receive(&rx().receive(&f).unwrap()),
            Err(IcmpDrop::BadChecksum)
        );
        let mut f = frame(M, &req);
        f[34] = 13; // timestamp request
        let at = 34 + 2;
        f[at..at + 2].fill(0);
        let c = exonet_wire::checksum::checksum(&f[34..]);
        f[at..at + 2].copy_from_slice(&c.to_be_bytes());
        assert_eq!(
            icmp.receive(&rx().receive(&f).unwrap()),
            Err(IcmpDrop::UnknownType)
        );
        let short = IcmpOut {
            src: PEER,
            dst: US,
            icmp: IcmpRepr::EchoRequest {
                ident: 1,
                seq_no: 1,
                data: b"",
            },
        };
        let mut f = frame(M, &short);
        // Drop the last 4 ICMP bytes and fix the IP total length and checksum.
        f.truncate(f.len() - 4);
        f[16..18].copy_from_slice(&24u16.to_be_bytes());
        Ipv4Packet::new_unchecked(&mut f[14..34]).fill_checksum();
        assert_eq!(
            icmp.receive(&rx().receive(&f).unwrap()),
            Err(IcmpDrop::Truncated)
        );
        let s = icmp.stats();
        assert_eq!(
            (
                s.received,
                s.dropped(IcmpDrop::BadChecksum),
                s.dropped(IcmpDrop::UnknownType),
                s.dropped(IcmpDrop::Truncated)
            ),
            (3, 1, 1, 1)
        );
    }

    /// RFC 792 / RFC 1122 §4.1.3.3: port unreachable names the UDP flow it concerns.
    #[test]
    fn rfc792_port_unreachable_quotes_flow() {
        let q = quoted_udp(100);
        let f = error_frame(IcmpRepr::DstUnreachable {
            code: unreach::PORT,
            next_hop_mtu: 0,
            quoted: &q,
        });
        let Ok(IcmpEvent::Error(e)) = receive(&f) else {
            panic!("no error")
        };
        assert_eq!(e.kind, IcmpErrorKind::DstUnreachable(UnreachCode::Port));
        assert!(e.kind.is_hard());
        assert_eq!(
            e.quoted,
            Quoted {
                src: US,
                dst: FAR,
                protocol: protocol::UDP,
                src_port: 5353,
                dst_port: 53
            }
        );
        assert_eq!(e.mtu, None);
    }

    /// RFC 1191 §4: fragmentation needed carries the next-hop MTU; §5: 0 from an
    /// old router means estimate from the plateau table; §3: never below 68.
    #[test]
    fn rfc1191_frag_needed_mtu() {
        let q = quoted_udp(1500);
        let mtu_of = |next_hop_mtu| {
            let f = error_frame(IcmpRepr::DstUnreachable {
                code: unreach::FRAG_NEEDED,
                next_hop_mtu,
                quoted: &q,
            });
            match receive(&f) {
                Ok(IcmpEvent::Error(e)) => e.mtu,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(mtu_of(1400), Some(1400));
        assert_eq!(mtu_of(0), Some(1492));
        assert_eq!(mtu_of(20), Some(68));
        assert_eq!(frag_needed_mtu(0, 1492), 1006);
        assert_eq!(frag_needed_mtu(0, 60), 68);
    }

    /// RFC 792: Time Exceeded, code 0 (TTL) and 1 (reassembly).
    #[test]
    fn rfc792_time_exceeded() {
        let q = quoted_udp(100);
        for (code, kind) in [
            (time_exceeded::TTL, IcmpErrorKind::TtlExceeded),
            (time_exceeded::REASSEMBLY, IcmpErrorKind::ReassemblyExceeded),
        ] {
            let f = error_frame(IcmpRepr::TimeExceeded { code, quoted: &q });
            let Ok(IcmpEvent::Error(e)) = receive(&f) else {
                panic!("no error")
            };
            assert_eq!((e.kind, e.quoted.dst_port, e.mtu), (kind, 53, None));
            assert!(!e.kind.is_hard());
        }
    }

    #[test]
    fn all_unreachable_codes_decode() {
        for code in 0..=255u8 {
            let c = UnreachCode::from_code(code);
            assert_eq!(c == UnreachCode::Other(code), code > 15, "code {code}");
        }
        assert_eq!(UnreachCode::from_code(13), UnreachCode::AdminProhibited);
    }

    /// RFC 792 quotes the header plus 64 bits: less, a bad IHL or a non-first
    /// fragment is dropped and counted.
    #[test]
    fn rfc792_garbage_quoted_dropped() {
        let good = quoted_udp(100);
        let mut bad_ihl = good.clone();
        bad_ihl[0] = 0x44;
        let mut frag = good.clone();
        frag[6..8].copy_from_slice(&1u16.to_be_bytes());
        let mut icmp = Icmp::new();
        for q in [&good[..27], &good[..19], &bad_ihl[..], &frag[..], &[][..]] {
            let f = error_frame(IcmpRepr::TimeExceeded { code: 0, quoted: q });
            assert_eq!(
                icmp.receive(&rx().receive(&f).unwrap()),
                Err(IcmpDrop::BadQuoted)
            );
        }
        assert_eq!(icmp.stats().dropped(IcmpDrop::BadQuoted), 5);
    }

    /// RFC 1122 §4.1.3.1 port unreachable for a UDP datagram, and §3.2.2's cases
    /// where no error may be sent.
    #[test]
    fn rfc1122_port_unreachable_generation() {
        let f = build::udp_frame(M, M, PEER, US, 5353, 9, &[0xaa; 40]);
        let mut rx = rx();
        let d = rx.receive(&f).unwrap();
        let out = port_unreachable(&d).unwrap();
        assert_eq!((out.src, out.dst), (US, PEER));
        // It round-trips to the sender as an error naming its flow.
        let mut peer = Ipv4Rx::new(&[IfAddr {
            addr: PEER,
            prefix_len: 24,
        }]);
        let back = frame(M, &out);
        let Ok(IcmpEvent::Error(e)) = Icmp::new().receive(&peer.receive(&back).unwrap()) else {
            panic!()
        };
        assert_eq!(
            e.quoted,
            Quoted {
                src: PEER,
                dst: US,
                protocol: protocol::UDP,
                src_port: 5353,
                dst_port: 9
            }
        );
        let IcmpRepr::DstUnreachable { quoted, .. } = out.icmp else {
            panic!()
        };
        assert_eq!(quoted.len(), 28);

        let bc = build::udp_frame(M, MacAddr::BROADCAST, PEER, Ipv4Addr::BROADCAST, 1, 9, b"");
        assert_eq!(port_unreachable(&rx.receive(&bc).unwrap()), None);
        let zero = build::udp_frame(M, M, Ipv4Addr::UNSPECIFIED, US, 68, 9, b"");
        assert_eq!(port_unreachable(&rx.receive(&zero).unwrap()), None);
        let mut frag = f.clone();
        frag[14 + 6..14 + 8].copy_from_slice(&1u16.to_be_bytes());
        Ipv4Packet::new_unchecked(&mut frag[14..34]).fill_checksum();
        assert_eq!(port_unreachable(&rx.receive(&frag).unwrap()), None);
    }

    #[test]
    fn pinger_matches_replies() {
        let t0 = Time::from_millis(1000);
        let ms = Duration::from_millis;
        let mut p = Pinger::new(US, PEER, 0x77);
        let r0 = p.request(t0, b"x");
        let r1 = p.request(t0 + ms(1), b"x");
        assert_eq!((r0.src, r0.dst), (US, PEER));
        let seq = |r: &IcmpOut| match r.icmp {
            IcmpRepr::EchoRequest {
                ident: 0x77,
                seq_no,
                ..
            } => seq_no,
            other => panic!("{other:?}"),
        };
        assert_eq!((seq(&r0), seq(&r1), p.outstanding()), (0, 1, 2));
        let reply = |src, ident, seq_no| EchoReply {
            src,
            ident,
            seq_no,
            data: b"x",
        };
        assert_eq!(p.on_reply(t0 + ms(5), &reply(FAR, 0x77, 1)), None);
        assert_eq!(p.on_reply(t0 + ms(5), &reply(PEER, 0x78, 1)), None);
        assert_eq!(
            p.on_reply(t0 + ms(5), &reply(PEER, 0x77, 1)),
            Some(Pong {
                seq_no: 1,
                rtt: ms(4)
            })
        );
        assert_eq!(
            p.on_reply(t0 + ms(6), &reply(PEER, 0x77, 1)),
            None,
            "duplicate"
        );
        assert_eq!(p.expire(t0 + ms(1000), ms(2000)), 0);
        assert_eq!(p.expire(t0 + ms(3000), ms(2000)), 1);
        assert_eq!(p.outstanding(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Random ICMP bodies (valid checksum, random type, code and contents, any
        /// length) never panic, and every message is counted once.
        #[test]
        fn random_messages_never_panic(mut body in proptest::collection::vec(any::<u8>(), 0..80),
                                       ty in prop_oneof![Just(0u8), Just(3), Just(8), Just(11), any::<u8>()]) {
            if let Some(b) = body.first_mut() {
                *b = ty;
            }
            if body.len() >= 4 {
                body[2..4].fill(0);
                let c = exonet_wire::checksum::checksum(&body);
                body[2..4].copy_from_slice(&c.to_be_bytes());
            }
            let mut f = build::udp_frame(M, M, PEER, US, 1, 2, &body);
            // Turn the frame into ICMP: drop the UDP header, fix protocol and lengths.
            f.drain(34..42);
            f[14 + 9] = protocol::ICMP;
            let total = (f.len() - 14) as u16;
            f[16..18].copy_from_slice(&total.to_be_bytes());
            Ipv4Packet::new_unchecked(&mut f[14..34]).fill_checksum();
            let mut icmp = Icmp::new();
            let _ = icmp.receive(&rx().receive(&f).unwrap());
            let s = icmp.stats();
            let dropped: u64 = IcmpDrop::ALL.iter().map(|r| s.dropped(*r)).sum();
            prop_assert_eq!(s.echo_requests + s.echo_replies + s.errors + dropped, 1);
        }
    }
}
