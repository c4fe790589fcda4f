//! IPv4 input for a host: the RFC 791 / RFC 1122 §3.2.1 checks on a received
//! Ethernet frame, giving either a typed view of the datagram or a typed drop reason.
//!
//! Every drop is silent (RFC 1122 §3.2.1.1–3 say "silently discard") and counted in
//! [`Ipv4Stats`]. Fragments are returned as they are: reassembly is a separate core.

use std::net::Ipv4Addr;

use exonet_wire::ethernet::ethertype;
use exonet_wire::{EthernetFrame, Ipv4Packet, WireError};

/// Why a received frame was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ipv4Drop {
    /// The Ethernet header, its VLAN tags or the 20-byte IPv4 header is cut off.
    Truncated,
    /// The EtherType (after VLAN tags) is not IPv4.
    NotIpv4,
    /// Version is not 4 (RFC 1122 §3.2.1.1: MUST silently discard).
    BadVersion,
    /// IHL below 5, or the header it announces runs past the frame (RFC 791 §3.1).
    BadHeaderLen,
    /// Total length below the header length or beyond the frame (RFC 791 §3.1).
    BadTotalLen,
    /// Header checksum does not verify (RFC 1122 §3.2.1.2: MUST verify and discard).
    BadChecksum,
    /// Source is a broadcast, multicast or loopback address, which no host may send
    /// from (RFC 1122 §3.2.1.3: MUST silently discard).
    BadSource,
    /// Destination is neither ours, nor a broadcast, nor a group we joined
    /// (RFC 1122 §3.2.1.3: MUST silently discard).
    NotForUs,
    /// A link-layer broadcast carrying a unicast IP destination (RFC 1122 §3.3.6:
    /// SHOULD silently discard).
    LinkBroadcastUnicast,
}

impl Ipv4Drop {
    /// Every reason, in counter order.
    pub const ALL: [Ipv4Drop; 9] = [
        Ipv4Drop::Truncated,
        Ipv4Drop::NotIpv4,
        Ipv4Drop::BadVersion,
        Ipv4Drop::BadHeaderLen,
        Ipv4Drop::BadTotalLen,
        Ipv4Drop::BadChecksum,
        Ipv4Drop::BadSource,
        Ipv4Drop::NotForUs,
        Ipv4Drop::LinkBroadcastUnicast,
    ];
}

/// Frames seen, delivered and dropped by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ipv4Stats {
    /// Frames given to [`Ipv4Rx::receive`].
    pub received: u64,
    /// Datagrams returned to the caller.
    pub delivered: u64,
    dropped: [u64; Ipv4Drop::ALL.len()],
}

impl Ipv4Stats {
    /// Frames dropped for `reason`.
    pub fn dropped(&self, reason: Ipv4Drop) -> u64 {
        self.dropped[reason as usize]
    }

    /// Frames dropped for any reason.
    pub fn total_dropped(&self) -> u64 {
        self.dropped.iter().sum()
    }
}

/// How the destination address matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DstKind {
    /// One of our addresses.
    Unicast,
    /// 255.255.255.255 or the directed broadcast of one of our subnets.
    Broadcast,
    /// A multicast group we joined.
    Multicast,
}

/// A datagram that passed the input checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Datagram<'a> {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// How `dst` matched; ICMP uses it not to answer broadcasts (RFC 1122 §3.2.2).
    pub dst_kind: DstKind,
    /// Payload protocol.
    pub protocol: u8,
    /// Time to live, as received (not checked: see [`Ipv4Rx::receive`]).
    pub ttl: u8,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment.
    pub dont_frag: bool,
    /// More Fragments.
    pub more_frags: bool,
    /// Fragment offset in bytes.
    pub frag_offset: u16,
    /// Header length in bytes, options included (the options are skipped).
    pub header_len: usize,
    /// The whole datagram as received (header, options and payload, Ethernet padding
    /// trimmed); ICMP errors quote its start.
    pub datagram: &'a [u8],
    /// The payload, bounded by the total length (Ethernet padding trimmed).
    pub payload: &'a [u8],
}

impl Ipv4Datagram<'_> {
    /// Part of a fragmented datagram (MF set or non-zero offset).
    pub fn is_fragment(&self) -> bool {
        self.more_frags || self.frag_offset != 0
    }
}

/// One of our interface addresses and its subnet prefix length (for directed
/// broadcast, RFC 1122 §3.2.1.3 (c)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfAddr {
    /// The address.
    pub addr: Ipv4Addr,
    /// Prefix length, 0..=32.
    pub prefix_len: u8,
}

impl IfAddr {
    /// The subnet-directed broadcast address, if the subnet has one (prefixes /31 and
    /// /32 do not, RFC 3021).
    pub fn broadcast(&self) -> Option<Ipv4Addr> {
        if self.prefix_len >= 31 {
            return None;
        }
        let host_mask = u32::MAX >> self.prefix_len.min(32);
        Some(Ipv4Addr::from(u32::from(self.addr) | host_mask))
    }
}

/// The IPv4 input state: our addresses, joined groups and counters.
#[derive(Debug, Clone, Default)]
pub struct Ipv4Rx {
    addrs: Vec<IfAddr>,
    groups: Vec<Ipv4Addr>,
    stats: Ipv4Stats,
}

impl Ipv4Rx {
    /// Input for a host with these addresses.
    pub fn new(addrs: &[IfAddr]) -> Self {
        Ipv4Rx {
            addrs: addrs.to_vec(),
            ..Ipv4Rx::default()
        }
    }

    /// Accepts datagrams sent to multicast `group` from now on.
    pub fn join(&mut self, group: Ipv4Addr) {
        if group.is_multicast() && !self.groups.contains(&group) {
            self.groups.push(group);
        }
    }

    /// Stops accepting datagrams sent to `group`.
    pub fn leave(&mut self, group: Ipv4Addr) {
        self.groups.retain(|g| *g != group);
    }

    /// Our addresses.
    pub fn addrs(&self) -> &[IfAddr] {
        &self.addrs
    }

    /// The counters.
    pub fn stats(&self) -> &Ipv4Stats {
        &self.stats
    }

    /// Validates a received Ethernet frame and returns its IPv4 datagram.
    ///
    /// The TTL is not looked at: RFC 1122 §3.2.1.7 says a host "MUST NOT discard a
    /// datagram just because it was received with TTL less than 2" (TTL expiry is a
    /// forwarding rule, RFC 791 §3.2). IP options are tolerated and skipped (RFC 1122
    /// §3.2.1.8: options a host does not implement MUST be ignored).
    pub fn receive<'a>(&mut self, frame: &'a [u8]) -> Result<Ipv4Datagram<'a>, Ipv4Drop> {
        self.stats.received += 1;
        let r = self.check(frame);
        match r {
            Ok(_) => self.stats.delivered += 1,
            Err(reason) => self.stats.dropped[reason as usize] += 1,
        }
        r
    }

    fn check<'a>(&self, frame: &'a [u8]) -> Result<Ipv4Datagram<'a>, Ipv4Drop> {
        let eth = EthernetFrame::new_checked(frame).map_err(|_| Ipv4Drop::Truncated)?;
        if eth.ethertype() != ethertype::IPV4 {
            return Err(Ipv4Drop::NotIpv4);
        }
        let link_broadcast = eth.dst_addr().is_broadcast();
        let bytes = &frame[eth.header_len()..];
        // The view checks version, IHL ≥ 5, total length ≥ header length and both
        // lengths within the buffer; its bytes may extend past the total length,
        // which is Ethernet padding to the 60-byte minimum frame.
        let ip = Ipv4Packet::new_checked(bytes).map_err(|e| match e {
            WireError::BadVersion => Ipv4Drop::BadVersion,
            WireError::Truncated if bytes.len() < exonet_wire::ipv4::MIN_HEADER_LEN => {
                Ipv4Drop::Truncated
            }
            _ => classify_length(bytes),
        })?;
        if !ip.verify_checksum() {
            return Err(Ipv4Drop::BadChecksum);
        }
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        if self.is_bad_source(src) {
            return Err(Ipv4Drop::BadSource);
        }
        let dst_kind = self.dst_kind(dst).ok_or(Ipv4Drop::NotForUs)?;
        if link_broadcast && dst_kind == DstKind::Unicast {
            return Err(Ipv4Drop::LinkBroadcastUnicast);
        }
        let header_len = ip.header_len();
        let datagram = &bytes[..usize::from(ip.total_len())];
        Ok(Ipv4Datagram {
            src,
            dst,
            dst_kind,
            protocol: ip.protocol(),
            ttl: ip.ttl(),
            ident: ip.ident(),
            dont_frag: ip.dont_frag(),
            more_frags: ip.more_frags(),
            frag_offset: ip.frag_offset(),
            header_len,
            datagram,
            payload: &datagram[header_len..],
        })
    }

    /// RFC 1122 §3.2.1.3: a source may not be a broadcast (a, c, d, e), a class D
    /// multicast address, or loopback (g). 0.0.0.0 is allowed: a host that does not
    /// know its address yet sends from it (a; DHCP relies on it).
    fn is_bad_source(&self, src: Ipv4Addr) -> bool {
        src.is_broadcast()
            || src.is_multicast()
            || src.is_loopback()
            || self.addrs.iter().any(|a| a.broadcast() == Some(src))
    }

    fn dst_kind(&self, dst: Ipv4Addr) -> Option<DstKind> {
        if self.addrs.iter().any(|a| a.addr == dst) {
            Some(DstKind::Unicast)
        } else if dst.is_broadcast() || self.addrs.iter().any(|a| a.broadcast() == Some(dst)) {
            Some(DstKind::Broadcast)
        } else if self.groups.contains(&dst) {
            Some(DstKind::Multicast)
        } else {
            None
        }
    }
}

/// Which length field made [`Ipv4Packet::new_checked`] fail on a buffer of at least
/// 20 bytes: the header length (IHL) is checked before the total length.
fn classify_length(bytes: &[u8]) -> Ipv4Drop {
    let ip = Ipv4Packet::new_unchecked(bytes);
    let hl = ip.header_len();
    if hl < exonet_wire::ipv4::MIN_HEADER_LEN || hl > bytes.len() {
        Ipv4Drop::BadHeaderLen
    } else {
        Ipv4Drop::BadTotalLen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exonet_wire::build::{self, Transport};
    use exonet_wire::ipv4::protocol;
    use exonet_wire::{EthernetRepr, Ipv4Repr, MacAddr, UdpRepr};
    use proptest::prelude::*;

    const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const M1: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const M2: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const ETH: usize = 14;

    fn rx() -> Ipv4Rx {
        Ipv4Rx::new(&[IfAddr {
            addr: US,
            prefix_len: 24,
        }])
    }

    fn frame_to(dst_mac: MacAddr, src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
        build::udp_frame(M1, dst_mac, src, dst, 1000, 2000, payload)
    }

    fn udp_frame(payload: &[u8]) -> Vec<u8> {
        frame_to(M2, PEER, US, payload)
    }

    /// Rewrites the IP header checksum after a test edits the header.
    fn refill(frame: &mut [u8]) {
        let hl = usize::from(frame[ETH] & 0xf) * 4;
        Ipv4Packet::new_unchecked(&mut frame[ETH..ETH + hl]).fill_checksum();
    }

    fn drop_of(frame: &[u8]) -> Ipv4Drop {
        rx().receive(frame).unwrap_err()
    }

    #[test]
    fn delivers_valid_datagram() {
        let f = udp_frame(b"abc");
        let mut rx = rx();
        let d = rx.receive(&f).unwrap();
        assert_eq!((d.src, d.dst, d.protocol), (PEER, US, protocol::UDP));
        assert_eq!(
            (d.dst_kind, d.header_len, d.payload.len()),
            (DstKind::Unicast, 20, 11)
        );
        assert!(!d.is_fragment() && d.dont_frag);
        assert_eq!((rx.stats().received, rx.stats().delivered), (1, 1));
        assert_eq!(rx.stats().total_dropped(), 0);
    }

    /// RFC 894: Ethernet pads short frames to 60 bytes; the total length bounds the
    /// payload, so the padding is trimmed.
    #[test]
    fn rfc894_ethernet_padding_trimmed() {
        let mut f = udp_frame(b"x");
        f.resize(60, 0xee);
        let d = rx().receive(&f).unwrap();
        assert_eq!(d.payload.len(), 9);
    }

    #[test]
    fn not_ipv4_and_truncated() {
        let f = build::arp_request(M1, PEER, US);
        assert_eq!(drop_of(&f), Ipv4Drop::NotIpv4);
        assert_eq!(drop_of(&udp_frame(b"")[..13]), Ipv4Drop::Truncated);
        assert_eq!(drop_of(&udp_frame(b"")[..ETH + 19]), Ipv4Drop::Truncated);
    }

    /// RFC 1122 §3.2.1.1: version other than 4 is silently discarded.
    #[test]
    fn rfc1122_3_2_1_1_bad_version() {
        let mut f = udp_frame(b"abc");
        f[ETH] = 0x65;
        assert_eq!(drop_of(&f), Ipv4Drop::BadVersion);
    }

    /// RFC 791 §3.1: IHL is at least 5, and the header must fit in the frame.
    #[test]
    fn rfc791_ihl_bounds() {
        let mut f = udp_frame(b"abc");
        f[ETH] = 0x44;
        assert_eq!(drop_of(&f), Ipv4Drop::BadHeaderLen);
        let mut f = udp_frame(b"");
        f[ETH] = 0x4f; // 60-byte header in a 48-byte frame
        assert_eq!(drop_of(&f), Ipv4Drop::BadHeaderLen);
    }

    /// RFC 791 §3.1: total length covers the header and must not exceed what arrived.
    #[test]
    fn rfc791_total_length_bounds() {
        let mut f = udp_frame(b"abc");
        f[ETH + 2..ETH + 4].copy_from_slice(&19u16.to_be_bytes());
        refill(&mut f);
        assert_eq!(drop_of(&f), Ipv4Drop::BadTotalLen);
        let mut f = udp_frame(b"abc");
        f.pop();
        assert_eq!(drop_of(&f), Ipv4Drop::BadTotalLen);
    }

    /// RFC 1122 §3.2.1.2: a host MUST verify the header checksum.
    #[test]
    fn rfc1122_3_2_1_2_bad_checksum() {
        let mut f = udp_frame(b"abc");
        f[ETH + 10] ^= 0x40;
        let mut rx = rx();
        assert_eq!(rx.receive(&f), Err(Ipv4Drop::BadChecksum));
        assert_eq!(rx.stats().dropped(Ipv4Drop::BadChecksum), 1);
    }

    /// RFC 1122 §3.2.1.7: a host MUST NOT discard a datagram for TTL < 2.
    #[test]
    fn rfc1122_3_2_1_7_ttl_zero_accepted() {
        let mut f = udp_frame(b"abc");
        f[ETH + 8] = 0;
        refill(&mut f);
        assert_eq!(rx().receive(&f).unwrap().ttl, 0);
    }

    /// RFC 1122 §3.2.1.8: options are tolerated; the payload starts after them.
    #[test]
    fn rfc1122_3_2_1_8_options_skipped() {
        let eth = EthernetRepr {
            dst: M2,
            src: M1,
            vlans: &[],
            ethertype: 0,
        };
        // Record Route with room for one address, then End of Options List.
        let opts = [7, 7, 4, 0, 0, 0, 0, 0];
        let ip = Ipv4Repr {
            options: &opts,
            ..Ipv4Repr::new(PEER, US, 0, 0)
        };
        let udp = UdpRepr {
            src_port: 1,
            dst_port: 2,
            payload: b"opt",
        };
        let f = build::ipv4_frame(&eth, &ip, &Transport::Udp(udp)).unwrap();
        let d = rx().receive(&f).unwrap();
        assert_eq!((d.header_len, d.datagram.len()), (28, 39));
        assert_eq!(&d.payload[8..], b"opt");
    }

    /// RFC 1122 §3.2.1.3: accept our address, limited and directed broadcast and
    /// joined groups; discard the rest.
    #[test]
    fn rfc1122_3_2_1_3_destinations() {
        let mut rx = rx();
        let bc = MacAddr::BROADCAST;
        let ok = |rx: &mut Ipv4Rx, mac, dst| {
            rx.receive(&frame_to(mac, PEER, dst, b""))
                .map(|d| d.dst_kind)
        };
        assert_eq!(ok(&mut rx, bc, Ipv4Addr::BROADCAST), Ok(DstKind::Broadcast));
        assert_eq!(
            ok(&mut rx, bc, Ipv4Addr::new(10, 0, 0, 255)),
            Ok(DstKind::Broadcast)
        );
        let group = Ipv4Addr::new(224, 0, 0, 251);
        assert_eq!(ok(&mut rx, M2, group), Err(Ipv4Drop::NotForUs));
        rx.join(group);
        assert_eq!(ok(&mut rx, M2, group), Ok(DstKind::Multicast));
        rx.leave(group);
        assert_eq!(ok(&mut rx, M2, group), Err(Ipv4Drop::NotForUs));
        assert_eq!(
            ok(&mut rx, M2, Ipv4Addr::new(10, 0, 0, 3)),
            Err(Ipv4Drop::NotForUs)
        );
        assert_eq!(rx.stats().dropped(Ipv4Drop::NotForUs), 3);
    }

    /// RFC 1122 §3.2.1.3: broadcast, multicast and loopback sources are discarded;
    /// 0.0.0.0 is allowed.
    #[test]
    fn rfc1122_3_2_1_3_sources() {
        for src in [
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(10, 0, 0, 255),
            Ipv4Addr::new(239, 1, 1, 1),
            Ipv4Addr::LOCALHOST,
        ] {
            assert_eq!(drop_of(&frame_to(M2, src, US, b"")), Ipv4Drop::BadSource);
        }
        assert!(rx()
            .receive(&frame_to(M2, Ipv4Addr::UNSPECIFIED, US, b""))
            .is_ok());
    }

    /// RFC 1122 §3.3.6: a link-layer broadcast with a unicast IP destination.
    #[test]
    fn rfc1122_3_3_6_link_broadcast_unicast() {
        let f = frame_to(MacAddr::BROADCAST, PEER, US, b"");
        assert_eq!(drop_of(&f), Ipv4Drop::LinkBroadcastUnicast);
    }

    #[test]
    fn directed_broadcast_absent_on_31_and_32() {
        let a = |prefix_len| {
            IfAddr {
                addr: US,
                prefix_len,
            }
            .broadcast()
        };
        assert_eq!(a(0), Some(Ipv4Addr::BROADCAST));
        assert_eq!(a(8), Some(Ipv4Addr::new(10, 255, 255, 255)));
        assert_eq!((a(31), a(32)), (None, None));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Random bytes never panic, and the counters add up.
        #[test]
        fn random_frames_never_panic(f in proptest::collection::vec(any::<u8>(), 0..120)) {
            let mut rx = rx();
            let _ = rx.receive(&f);
            let s = rx.stats();
            prop_assert_eq!(s.received, s.delivered + s.total_dropped());
        }

        /// Valid frames, cut short or with one byte changed: no panic, and whatever is
        /// delivered agrees with etherparse on the fields both decode.
        #[test]
        fn mutated_frames_agree_with_etherparse(
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            cut in 0usize..100, at in 0usize..100, xor in any::<u8>(), ttl in any::<u8>(),
        ) {
            let mut f = udp_frame(&payload);
            f[ETH + 8] = ttl;
            refill(&mut f);
            let at = at % f.len();
            f[at] ^= xor;
            f.truncate(f.len().saturating_sub(cut % 8));
            if let Ok(d) = rx().receive(&f) {
                // The IP layer only: the transport header may be the mutated part.
                let ip = etherparse::Ipv4Slice::from_slice(&f[ETH..]);
                let ip = ip.expect("etherparse accepts what we deliver");
                let h = ip.header();
                prop_assert_eq!((h.source_addr(), h.destination_addr()), (d.src, d.dst));
                prop_assert_eq!(h.protocol().0, d.protocol);
                prop_assert_eq!(h.identification(), d.ident);
                prop_assert_eq!(h.fragments_offset().byte_offset(), d.frag_offset);
                prop_assert_eq!(ip.payload().payload, d.payload);
            }
        }
    }
}
