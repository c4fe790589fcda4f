//! UDP (RFC 768, RFC 1122 §4.1): datagram checks against the IPv4 pseudo-header, a
//! one-pass copy-and-checksum emitter, and the demultiplexing table from addresses and
//! ports to socket handles.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};

use exonet_wire::checksum;
use exonet_wire::ipv4::protocol;
use exonet_wire::udp::HEADER_LEN;
use exonet_wire::{UdpPacket, WireError};

use crate::ipv4_rx::Ipv4Datagram;

/// Why a received datagram was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UdpDrop {
    /// Shorter than the 8-byte header.
    Truncated,
    /// Length field below 8 or beyond the IP payload (RFC 768: the length covers
    /// header and data, so a longer field means data is missing).
    BadLength,
    /// Non-zero checksum that does not verify (RFC 1122 §4.1.3.4: MUST silently
    /// discard).
    BadChecksum,
    /// No socket is bound to the destination (RFC 1122 §4.1.3.1: the caller SHOULD
    /// answer with ICMP port unreachable, see [`crate::icmp::port_unreachable`]).
    NoPort,
}

/// Datagrams seen, delivered and dropped by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams given to [`Udp::receive`].
    pub received: u64,
    /// Datagrams matched to a socket.
    pub delivered: u64,
    /// [`UdpDrop::Truncated`] and [`UdpDrop::BadLength`].
    pub bad_length: u64,
    /// [`UdpDrop::BadChecksum`].
    pub bad_checksum: u64,
    /// [`UdpDrop::NoPort`].
    pub no_port: u64,
}

/// A datagram whose length and checksum are good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// Sender address and port.
    pub src: SocketAddrV4,
    /// Destination address and port.
    pub dst: SocketAddrV4,
    /// Whether the sender computed a checksum (0 on the wire means none, RFC 768).
    pub checksummed: bool,
    /// The data, bounded by the UDP length field.
    pub payload: &'a [u8],
}

/// Checks a UDP datagram (the whole IP payload of an unfragmented or reassembled
/// datagram) against the pseudo-header addresses `src` and `dst`.
///
/// A UDP length shorter than the IP payload is accepted and the rest ignored, as
/// Linux does (RFC 768 defines the datagram by its length field; the checksum covers
/// only that much). A checksum of 0 means the sender computed none and is accepted
/// (RFC 768; RFC 1122 §4.1.3.4 lets an application insist, which is the socket
/// layer's business).
pub fn parse(src: Ipv4Addr, dst: Ipv4Addr, ip_payload: &[u8]) -> Result<UdpDatagram<'_>, UdpDrop> {
    let p = UdpPacket::new_checked(ip_payload).map_err(|e| match e {
        WireError::Truncated if ip_payload.len() < HEADER_LEN => UdpDrop::Truncated,
        _ => UdpDrop::BadLength,
    })?;
    if !p.verify_checksum(src, dst) {
        return Err(UdpDrop::BadChecksum);
    }
    Ok(UdpDatagram {
        src: SocketAddrV4::new(src, p.src_port()),
        dst: SocketAddrV4::new(dst, p.dst_port()),
        checksummed: p.checksum() != 0,
        payload: &ip_payload[HEADER_LEN..usize::from(p.len())],
    })
}

/// Writes a UDP datagram carrying `payload` into the front of `buf`, checksum
/// included, and returns its length. The payload is copied and summed in one pass
/// ([`checksum::copy_and_sum`]) instead of copied and then read again for the checksum.
///
/// `BadLength` if the datagram would exceed 65535 bytes, `Truncated` if `buf` is
/// shorter than it.
pub fn emit(
    buf: &mut [u8],
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: &[u8],
) -> Result<usize, WireError> {
    let len = u16::try_from(HEADER_LEN + payload.len()).map_err(|_| WireError::BadLength)?;
    let buf = buf
        .get_mut(..usize::from(len))
        .ok_or(WireError::Truncated)?;
    let (head, body) = buf.split_at_mut(HEADER_LEN);
    let data_sum = checksum::copy_and_sum(body, payload);
    let mut p = UdpPacket::new_unchecked(head);
    p.set_src_port(src.port());
    p.set_dst_port(dst.port());
    p.set_len(len);
    p.set_checksum(0);
    // The header is 8 bytes, so its sum combines with the payload's (RFC 1071 §2(C)).
    let sum = [
        checksum::pseudo_header_sum(*src.ip(), *dst.ip(), protocol::UDP, len),
        checksum::sum(p.into_inner()),
        data_sum,
    ]
    .into_iter()
    .fold(0, checksum::add);
    // RFC 768: a computed 0 is sent as all ones, since 0 means "no checksum".
    let c = match !sum {
        0 => 0xffff,
        c => c,
    };
    buf[6..8].copy_from_slice(&c.to_be_bytes());
    Ok(usize::from(len))
}

/// What a socket is bound to: a local address and port (address 0.0.0.0 matches any
/// of ours) and, for a connected socket, the one remote address and port it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Binding {
    /// Local address (0.0.0.0: any) and port.
    pub local: SocketAddrV4,
    /// The peer of a connected socket.
    pub remote: Option<SocketAddrV4>,
}

impl Binding {
    fn matches(&self, d: &UdpDatagram) -> bool {
        (self.local.ip().is_unspecified() || self.local.ip() == d.dst.ip())
            && self.remote.is_none_or(|r| r == d.src)
    }

    /// Connected beats unconnected, then a specific local address beats 0.0.0.0.
    fn specificity(&self) -> u8 {
        2 * u8::from(self.remote.is_some()) + u8::from(!self.local.ip().is_unspecified())
    }
}

/// The binding is taken already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrInUse;

/// The UDP receive core: bindings to socket handles `H` and counters.
#[derive(Debug, Clone)]
pub struct Udp<H> {
    /// Bindings by local port, the field every lookup has.
    by_port: HashMap<u16, Vec<(Binding, H)>>,
    stats: UdpStats,
}

impl<H> Default for Udp<H> {
    fn default() -> Self {
        Udp {
            by_port: HashMap::new(),
            stats: UdpStats::default(),
        }
    }
}

impl<H: Copy> Udp<H> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `handle` to `b`. Distinct bindings may share a port (a connected and an
    /// unconnected socket, or 0.0.0.0 and a specific address); the most specific one
    /// receives. The same binding twice is refused.
    pub fn bind(&mut self, b: Binding, handle: H) -> Result<(), AddrInUse> {
        let v = self.by_port.entry(b.local.port()).or_default();
        if v.iter().any(|(x, _)| *x == b) {
            return Err(AddrInUse);
        }
        v.push((b, handle));
        Ok(())
    }

    /// Removes binding `b`, returning its handle.
    pub fn unbind(&mut self, b: &Binding) -> Option<H> {
        let v = self.by_port.get_mut(&b.local.port())?;
        let i = v.iter().position(|(x, _)| x == b)?;
        let (_, h) = v.swap_remove(i);
        if v.is_empty() {
            self.by_port.remove(&b.local.port());
        }
        Some(h)
    }

    /// The socket that should receive `d`: the most specific matching binding.
    pub fn lookup(&self, d: &UdpDatagram) -> Option<H> {
        self.by_port
            .get(&d.dst.port())?
            .iter()
            .filter(|(b, _)| b.matches(d))
            .max_by_key(|(b, _)| b.specificity())
            .map(|(_, h)| *h)
    }

    /// The counters.
    pub fn stats(&self) -> &UdpStats {
        &self.stats
    }

    /// Checks the UDP datagram in `ip` (unfragmented or reassembled) and finds its
    /// socket.
    pub fn receive<'a>(&mut self, ip: &Ipv4Datagram<'a>) -> Result<(H, UdpDatagram<'a>), UdpDrop> {
        self.stats.received += 1;
        let r = parse(ip.src, ip.dst, ip.payload)
            .and_then(|d| self.lookup(&d).map(|h| (h, d)).ok_or(UdpDrop::NoPort));
        match r {
            Ok(_) => self.stats.delivered += 1,
            Err(UdpDrop::Truncated | UdpDrop::BadLength) => self.stats.bad_length += 1,
            Err(UdpDrop::BadChecksum) => self.stats.bad_checksum += 1,
            Err(UdpDrop::NoPort) => self.stats.no_port += 1,
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipv4_rx::{IfAddr, Ipv4Rx};
    use exonet_wire::{build, MacAddr};
    use proptest::prelude::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const C: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);

    fn sa(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(ip, port)
    }

    fn datagram(payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0; HEADER_LEN + payload.len()];
        emit(&mut buf, sa(A, 1000), sa(B, 53), payload).unwrap();
        buf
    }

    #[test]
    fn emit_parse_round_trip_matches_wire_emitter() {
        let buf = datagram(b"hello");
        let d = parse(A, B, &buf).unwrap();
        assert_eq!(
            (d.src, d.dst, d.payload),
            (sa(A, 1000), sa(B, 53), &b"hello"[..])
        );
        assert!(d.checksummed);
        let mut wire = vec![0; buf.len()];
        let r = exonet_wire::UdpRepr {
            src_port: 1000,
            dst_port: 53,
            payload: b"hello",
        };
        r.emit(&mut wire, A, B).unwrap();
        assert_eq!(buf, wire);
    }

    /// RFC 768: 0 means no checksum and is accepted; a computed 0 is sent as 0xffff.
    #[test]
    fn rfc768_zero_checksum() {
        let mut buf = datagram(b"hello");
        buf[6..8].fill(0);
        let d = parse(C, C, &buf).unwrap();
        assert!(!d.checksummed);
        // Choose the last data word so that the checksum computes to 0.
        let mut buf = datagram(&[0, 0]);
        buf[6..8].fill(0);
        let s = checksum::add(
            checksum::pseudo_header_sum(A, B, protocol::UDP, 10),
            checksum::sum(&buf),
        );
        let payload = (!s).to_be_bytes();
        let buf = datagram(&payload);
        assert_eq!(&buf[6..8], &[0xff, 0xff]);
        assert!(parse(A, B, &buf).unwrap().checksummed);
    }

    /// RFC 1122 §4.1.3.4: a non-zero bad checksum is discarded; the pseudo-header
    /// binds the datagram to its addresses.
    #[test]
    fn rfc1122_4_1_3_4_bad_checksum() {
        let mut buf = datagram(b"hello");
        assert_eq!(parse(A, C, &buf), Err(UdpDrop::BadChecksum));
        buf[9] ^= 1;
        assert_eq!(parse(A, B, &buf), Err(UdpDrop::BadChecksum));
    }

    /// RFC 768 length: below 8 or beyond the IP payload is dropped; a shorter UDP
    /// length than IP payload is trimmed.
    #[test]
    fn rfc768_length_field() {
        let buf = datagram(b"hello");
        assert_eq!(parse(A, B, &buf[..7]), Err(UdpDrop::Truncated));
        assert_eq!(parse(A, B, &buf[..12]), Err(UdpDrop::BadLength));
        let mut short = buf.clone();
        short[4..6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(parse(A, B, &short), Err(UdpDrop::BadLength));
        let mut padded = buf.clone();
        padded.extend_from_slice(b"junk");
        assert_eq!(parse(A, B, &padded).unwrap().payload, b"hello");
    }

    #[test]
    fn emit_too_long_or_short_buffer() {
        let big = vec![0; 65_528];
        let mut buf = vec![0; 70_000];
        assert!(matches!(
            emit(&mut buf, sa(A, 1), sa(B, 2), &big),
            Err(WireError::BadLength)
        ));
        assert!(matches!(
            emit(&mut buf[..12], sa(A, 1), sa(B, 2), b"hello"),
            Err(WireError::Truncated)
        ));
    }

    /// Most specific match: connected beats unconnected, specific beats 0.0.0.0.
    #[test]
    fn demux_most_specific() {
        let mut udp = Udp::new();
        let any = Binding {
            local: sa(Ipv4Addr::UNSPECIFIED, 53),
            remote: None,
        };
        let spec = Binding {
            local: sa(B, 53),
            remote: None,
        };
        let conn = Binding {
            local: sa(B, 53),
            remote: Some(sa(A, 1000)),
        };
        let conn_any = Binding {
            local: sa(Ipv4Addr::UNSPECIFIED, 53),
            remote: Some(sa(C, 7)),
        };
        udp.bind(any, 1).unwrap();
        assert_eq!(udp.bind(any, 9), Err(AddrInUse));
        let d = |src, dst| UdpDatagram {
            src,
            dst,
            checksummed: true,
            payload: &[],
        };
        let from_a = d(sa(A, 1000), sa(B, 53));
        assert_eq!(udp.lookup(&from_a), Some(1));
        udp.bind(spec, 2).unwrap();
        assert_eq!(udp.lookup(&from_a), Some(2));
        udp.bind(conn, 3).unwrap();
        udp.bind(conn_any, 4).unwrap();
        assert_eq!(udp.lookup(&from_a), Some(3));
        assert_eq!(udp.lookup(&d(sa(A, 1001), sa(B, 53))), Some(2));
        assert_eq!(udp.lookup(&d(sa(C, 7), sa(B, 53))), Some(4));
        // A broadcast reaches only 0.0.0.0 bindings.
        assert_eq!(
            udp.lookup(&d(sa(A, 1001), sa(Ipv4Addr::BROADCAST, 53))),
            Some(1)
        );
        assert_eq!(udp.lookup(&d(sa(A, 1000), sa(B, 54))), None);
        assert_eq!(udp.unbind(&conn), Some(3));
        assert_eq!(udp.unbind(&conn), None);
        assert_eq!(udp.lookup(&from_a), Some(2));
        for b in [any, spec, conn_any] {
            udp.unbind(&b).unwrap();
        }
        assert!(udp.by_port.is_empty());
    }

    #[test]
    fn receive_counts_by_reason() {
        let mut ip = Ipv4Rx::new(&[IfAddr {
            addr: B,
            prefix_len: 24,
        }]);
        let mut udp = Udp::new();
        udp.bind(
            Binding {
                local: sa(B, 53),
                remote: None,
            },
            7u32,
        )
        .unwrap();
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        let f = build::udp_frame(mac, mac, A, B, 1000, 53, b"q");
        let (h, d) = udp.receive(&ip.receive(&f).unwrap()).unwrap();
        assert_eq!((h, d.payload), (7, &b"q"[..]));
        let f = build::udp_frame(mac, mac, A, B, 1000, 54, b"q");
        assert_eq!(udp.receive(&ip.receive(&f).unwrap()), Err(UdpDrop::NoPort));
        let mut f = build::udp_frame(mac, mac, A, B, 1000, 53, b"q");
        *f.last_mut().unwrap() ^= 1;
        assert_eq!(
            udp.receive(&ip.receive(&f).unwrap()),
            Err(UdpDrop::BadChecksum)
        );
        let mut f = build::udp_frame(mac, mac, A, B, 1000, 53, b"q");
        f[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(
            udp.receive(&ip.receive(&f).unwrap()),
            Err(UdpDrop::BadLength)
        );
        let s = udp.stats();
        assert_eq!(
            (
                s.received,
                s.delivered,
                s.no_port,
                s.bad_checksum,
                s.bad_length
            ),
            (4, 1, 1, 1, 1)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The one-pass copy gives the same bytes and sum as copy then sum, for any
        /// length and either slice's alignment.
        #[test]
        fn copy_and_sum_equals_sum(data in proptest::collection::vec(any::<u8>(), 0..300),
                                   src_off in 0usize..8, dst_off in 0usize..8) {
            let src = &data[src_off.min(data.len())..];
            let mut out = vec![0u8; src.len() + dst_off];
            let s = checksum::copy_and_sum(&mut out[dst_off..], src);
            prop_assert_eq!(&out[dst_off..], src);
            prop_assert_eq!(s, checksum::sum(src));
            prop_assert_eq!(s, checksum::sum_reference(src));
        }

        /// Random bytes never panic.
        #[test]
        fn random_input_never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = parse(A, B, &b);
        }

        /// Emitted datagrams, cut short: etherparse agrees on what we accept.
        #[test]
        fn agrees_with_etherparse(payload in proptest::collection::vec(any::<u8>(), 0..100),
                                  sport in any::<u16>(), dport in any::<u16>(), cut in 0usize..120) {
            let mut buf = vec![0; HEADER_LEN + payload.len()];
            emit(&mut buf, sa(A, sport), sa(B, dport), &payload).unwrap();
            let ours = parse(A, B, &buf).unwrap();
            let ep = etherparse::UdpSlice::from_slice(&buf).unwrap();
            prop_assert_eq!((ep.source_port(), ep.destination_port()), (sport, dport));
            prop_assert_eq!(ep.payload(), ours.payload);
            let ep_sum = ep.to_header().calc_checksum_ipv4_raw(A.octets(), B.octets(), ep.payload()).unwrap();
            prop_assert_eq!(ep_sum, ep.checksum());
            let cut = &buf[..buf.len().saturating_sub(cut)];
            prop_assert_eq!(parse(A, B, cut).is_ok(), etherparse::UdpSlice::from_slice(cut).is_ok());
        }
    }
}
