//! Differential tests against etherparse 0.16: frames it builds must parse identically
//! with our views, and frames our builders emit must parse identically with it.

use etherparse::{
    EtherType, Ethernet2Header, Icmpv4Type, IpFragOffset, IpNumber, Ipv4Dscp, Ipv4Ecn, Ipv4Header,
    Ipv4Options, LinkHeader, NetHeaders, PacketHeaders, PayloadSlice, SingleVlanHeader, TcpHeader,
    TcpOptionElement, TransportHeader, UdpHeader, VlanHeader, VlanId, VlanPcp,
};
use exonet_wire::build::{self, Transport};
use exonet_wire::ethernet::ethertype;
use exonet_wire::ipv4::protocol;
use exonet_wire::tcp::{self, TcpOption};
use exonet_wire::{
    EthernetFrame, EthernetRepr, IcmpPacket, IcmpRepr, Ipv4Addr, Ipv4Packet, Ipv4Repr, MacAddr,
    TcpPacket, TcpRepr, UdpPacket, UdpRepr, VlanTag,
};
use proptest::prelude::*;

fn vlan_tags() -> impl Strategy<Value = Vec<VlanTag>> {
    let tag = (
        prop_oneof![
            Just(ethertype::VLAN),
            Just(ethertype::QINQ),
            Just(ethertype::QINQ_LEGACY)
        ],
        0u8..8,
        any::<bool>(),
        0u16..4096,
    )
        .prop_map(|(tpid, pcp, dei, vid)| VlanTag {
            tpid,
            pcp,
            dei,
            vid,
        });
    proptest::collection::vec(tag, 0..=2)
}

fn ip_options() -> impl Strategy<Value = Vec<u8>> {
    (0usize..=10).prop_flat_map(|words| proptest::collection::vec(any::<u8>(), words * 4))
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..300)
}

fn sack() -> impl Strategy<Value = [Option<(u32, u32)>; 4]> {
    proptest::collection::vec(any::<(u32, u32)>(), 1..=3).prop_map(|v| {
        let mut b = [None; 4];
        for (s, x) in b.iter_mut().zip(v) {
            *s = Some(x);
        }
        b
    })
}

/// Options both implementations know (etherparse stops at unknown kinds).
fn tcp_option() -> impl Strategy<Value = TcpOption<'static>> {
    prop_oneof![
        Just(TcpOption::NoOp),
        any::<u16>().prop_map(TcpOption::Mss),
        any::<u8>().prop_map(TcpOption::WindowScale),
        Just(TcpOption::SackPermitted),
        sack().prop_map(TcpOption::Sack),
        any::<(u32, u32)>().prop_map(|(tsval, tsecr)| TcpOption::Timestamps { tsval, tsecr }),
    ]
}

fn tcp_options() -> impl Strategy<Value = Vec<TcpOption<'static>>> {
    proptest::collection::vec(tcp_option(), 0..6).prop_filter("fits in 40 bytes", |o| {
        o.iter().map(TcpOption::buffer_len).sum::<usize>() <= 40
    })
}

fn to_etherparse(o: &TcpOption) -> TcpOptionElement {
    match *o {
        TcpOption::NoOp => TcpOptionElement::Noop,
        TcpOption::Mss(v) => TcpOptionElement::MaximumSegmentSize(v),
        TcpOption::WindowScale(v) => TcpOptionElement::WindowScale(v),
        TcpOption::SackPermitted => TcpOptionElement::SelectiveAcknowledgementPermitted,
        TcpOption::Sack(b) => {
            TcpOptionElement::SelectiveAcknowledgement(b[0].unwrap(), [b[1], b[2], b[3]])
        }
        TcpOption::Timestamps { tsval, tsecr } => TcpOptionElement::Timestamp(tsval, tsecr),
        TcpOption::EndOfList | TcpOption::Unknown { .. } => panic!("not generated: {o:?}"),
    }
}

/// Our decoded options without the trailing End-of-List that padding produces.
fn our_options(p: &TcpPacket<&[u8]>) -> Vec<TcpOptionElement> {
    p.options_iter()
        .map(Result::unwrap)
        .filter(|o| *o != TcpOption::EndOfList)
        .map(|o| to_etherparse(&o))
        .collect()
}

#[derive(Debug, Clone)]
struct TcpSpec {
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    urgent: u16,
    options: Vec<TcpOption<'static>>,
}

fn tcp_spec() -> impl Strategy<Value = TcpSpec> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u8>(),
        any::<u16>(),
        any::<u16>(),
        tcp_options(),
    )
        .prop_map(|(seq, ack, flags, window, urgent, options)| TcpSpec {
            seq,
            ack,
            flags,
            window,
            urgent,
            options,
        })
}

#[derive(Debug, Clone)]
struct IpSpec {
    dscp: u8,
    ecn: u8,
    ident: u16,
    df: bool,
    mf: bool,
    frag_units: u16,
    ttl: u8,
    src: [u8; 4],
    dst: [u8; 4],
    options: Vec<u8>,
}

fn ip_spec(fragments: bool) -> impl Strategy<Value = IpSpec> {
    (
        (
            0u8..64,
            0u8..4,
            any::<u16>(),
            any::<bool>(),
            any::<bool>(),
            0u16..8192,
        ),
        (
            any::<u8>(),
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            ip_options(),
        ),
    )
        .prop_map(
            move |((dscp, ecn, ident, df, mf, frag_units), (ttl, src, dst, options))| IpSpec {
                dscp,
                ecn,
                ident,
                df,
                mf: mf && fragments,
                frag_units: if fragments { frag_units } else { 0 },
                ttl,
                src,
                dst,
                options,
            },
        )
}

#[derive(Debug, Clone)]
struct FrameSpec {
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    vlans: Vec<VlanTag>,
    ip: IpSpec,
    ports: (u16, u16),
    /// `None`: UDP.
    tcp: Option<TcpSpec>,
    payload: Vec<u8>,
}

fn frame_spec(fragments: bool) -> impl Strategy<Value = FrameSpec> {
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        vlan_tags(),
        ip_spec(fragments),
        any::<(u16, u16)>(),
        proptest::option::of(tcp_spec()),
        payload(),
    )
        .prop_map(
            |(src_mac, dst_mac, vlans, ip, ports, tcp, payload)| FrameSpec {
                src_mac,
                dst_mac,
                vlans,
                ip,
                ports,
                tcp,
                payload,
            },
        )
}

/// The frame, as etherparse serializes it.
fn etherparse_frame(s: &FrameSpec) -> Vec<u8> {
    let tpid_or_ipv4 = |i: usize| EtherType(s.vlans.get(i).map_or(ethertype::IPV4, |v| v.tpid));
    let mut out = Ethernet2Header {
        source: s.src_mac,
        destination: s.dst_mac,
        ether_type: tpid_or_ipv4(0),
    }
    .to_bytes()
    .to_vec();
    for (i, v) in s.vlans.iter().enumerate() {
        let h = SingleVlanHeader {
            pcp: VlanPcp::try_new(v.pcp).unwrap(),
            drop_eligible_indicator: v.dei,
            vlan_id: VlanId::try_new(v.vid).unwrap(),
            ether_type: tpid_or_ipv4(i + 1),
        };
        out.extend_from_slice(&h.to_bytes());
    }
    let mut ip = Ipv4Header {
        dscp: Ipv4Dscp::try_new(s.ip.dscp).unwrap(),
        ecn: Ipv4Ecn::try_new(s.ip.ecn).unwrap(),
        identification: s.ip.ident,
        dont_fragment: s.ip.df,
        more_fragments: s.ip.mf,
        fragment_offset: IpFragOffset::try_new(s.ip.frag_units).unwrap(),
        time_to_live: s.ip.ttl,
        protocol: if s.tcp.is_some() {
            IpNumber::TCP
        } else {
            IpNumber::UDP
        },
        source: s.ip.src,
        destination: s.ip.dst,
        options: Ipv4Options::try_from(&s.ip.options[..]).unwrap(),
        ..Default::default()
    };
    let l4 = match &s.tcp {
        None => UdpHeader::with_ipv4_checksum(s.ports.0, s.ports.1, &ip, &s.payload)
            .unwrap()
            .to_bytes()
            .to_vec(),
        Some(t) => {
            let mut h = TcpHeader::new(s.ports.0, s.ports.1, t.seq, t.window);
            h.acknowledgment_number = t.ack;
            h.fin = t.flags & tcp::flags::FIN != 0;
            h.syn = t.flags & tcp::flags::SYN != 0;
            h.rst = t.flags & tcp::flags::RST != 0;
            h.psh = t.flags & tcp::flags::PSH != 0;
            h.ack = t.flags & tcp::flags::ACK != 0;
            h.urg = t.flags & tcp::flags::URG != 0;
            h.ece = t.flags & tcp::flags::ECE != 0;
            h.cwr = t.flags & tcp::flags::CWR != 0;
            h.urgent_pointer = t.urgent;
            h.set_options(&t.options.iter().map(to_etherparse).collect::<Vec<_>>())
                .unwrap();
            h.checksum = h.calc_checksum_ipv4(&ip, &s.payload).unwrap();
            h.to_bytes().to_vec()
        }
    };
    ip.set_payload_len(l4.len() + s.payload.len()).unwrap();
    ip.header_checksum = ip.calc_header_checksum();
    out.extend_from_slice(&ip.to_bytes());
    out.extend_from_slice(&l4);
    out.extend_from_slice(&s.payload);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// etherparse builds, we parse: every field and checksum agrees.
    #[test]
    fn etherparse_built_frames_parse(s in frame_spec(true)) {
        let bytes = etherparse_frame(&s);
        let eth = EthernetFrame::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(eth.src_addr(), MacAddr(s.src_mac));
        prop_assert_eq!(eth.dst_addr(), MacAddr(s.dst_mac));
        prop_assert_eq!(eth.vlan_count(), s.vlans.len());
        for (i, v) in s.vlans.iter().enumerate() {
            prop_assert_eq!(eth.vlan(i), Some(*v));
        }
        prop_assert_eq!(eth.ethertype(), ethertype::IPV4);
        prop_assert_eq!(eth.header_len(), 14 + 4 * s.vlans.len());

        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        prop_assert!(ip.verify_checksum());
        prop_assert_eq!(ip.header_len(), 20 + s.ip.options.len());
        prop_assert_eq!(ip.options(), &s.ip.options[..]);
        prop_assert_eq!((ip.dscp(), ip.ecn(), ip.ident(), ip.ttl()), (s.ip.dscp, s.ip.ecn, s.ip.ident, s.ip.ttl));
        prop_assert_eq!((ip.dont_frag(), ip.more_frags(), ip.frag_offset()), (s.ip.df, s.ip.mf, s.ip.frag_units * 8));
        prop_assert_eq!(ip.is_fragment(), s.ip.mf || s.ip.frag_units != 0);
        prop_assert_eq!(ip.is_first_fragment(), s.ip.mf && s.ip.frag_units == 0);
        prop_assert_eq!((ip.src_addr(), ip.dst_addr()), (Ipv4Addr::from(s.ip.src), Ipv4Addr::from(s.ip.dst)));
        prop_assert_eq!(usize::from(ip.total_len()), eth.payload().len());
        let (src, dst) = (ip.src_addr(), ip.dst_addr());

        match &s.tcp {
            None => {
                prop_assert_eq!(ip.protocol(), protocol::UDP);
                let udp = UdpPacket::new_checked(ip.payload()).unwrap();
                prop_assert_eq!((udp.src_port(), udp.dst_port()), s.ports);
                prop_assert_eq!(usize::from(udp.len()), 8 + s.payload.len());
                prop_assert_eq!(udp.payload(), &s.payload[..]);
                prop_assert!(udp.checksum() != 0 && udp.verify_checksum(src, dst));
            }
            Some(t) => {
                prop_assert_eq!(ip.protocol(), protocol::TCP);
                let seg = TcpPacket::new_checked(ip.payload()).unwrap();
                prop_assert_eq!((seg.src_port(), seg.dst_port()), s.ports);
                prop_assert_eq!((seg.seq_number(), seg.ack_number(), seg.flags()), (t.seq, t.ack, t.flags));
                prop_assert_eq!((seg.window(), seg.urgent_ptr()), (t.window, t.urgent));
                prop_assert_eq!(our_options(&seg), t.options.iter().map(to_etherparse).collect::<Vec<_>>());
                prop_assert_eq!(seg.payload(), &s.payload[..]);
                prop_assert!(seg.verify_checksum(src, dst));
            }
        }
    }

    /// We build, etherparse parses: every field agrees and its checksums match ours.
    #[test]
    fn our_frames_parse_in_etherparse(s in frame_spec(false), icmp in any::<bool>()) {
        let mut opts = [0u8; 40];
        let l4 = match (&s.tcp, icmp) {
            (_, true) => Transport::Icmp(IcmpRepr::EchoReply { ident: s.ports.0, seq_no: s.ports.1, data: &s.payload }),
            (None, false) => Transport::Udp(UdpRepr { src_port: s.ports.0, dst_port: s.ports.1, payload: &s.payload }),
            (Some(t), false) => {
                let n = tcp::write_options(&t.options, &mut opts).unwrap();
                Transport::Tcp(TcpRepr {
                    src_port: s.ports.0,
                    dst_port: s.ports.1,
                    seq_number: t.seq,
                    ack_number: t.ack,
                    flags: t.flags,
                    window: t.window,
                    urgent_ptr: t.urgent,
                    options: &opts[..n],
                    payload: &s.payload,
                })
            }
        };
        let eth = EthernetRepr { dst: MacAddr(s.dst_mac), src: MacAddr(s.src_mac), vlans: &s.vlans, ethertype: 0 };
        let ip = Ipv4Repr {
            ttl: s.ip.ttl,
            ident: s.ip.ident,
            dont_frag: s.ip.df,
            dscp: s.ip.dscp,
            ecn: s.ip.ecn,
            options: &s.ip.options,
            ..Ipv4Repr::new(s.ip.src.into(), s.ip.dst.into(), 0, 0)
        };
        let bytes = build::ipv4_frame(&eth, &ip, &l4).unwrap();
        let h = PacketHeaders::from_ethernet_slice(&bytes).unwrap();

        let Some(LinkHeader::Ethernet2(e)) = &h.link else { panic!("no ethernet: {h:?}") };
        prop_assert_eq!((e.source, e.destination), (s.src_mac, s.dst_mac));
        let tags: Vec<SingleVlanHeader> = match &h.vlan {
            None => vec![],
            Some(VlanHeader::Single(v)) => vec![v.clone()],
            Some(VlanHeader::Double(d)) => vec![d.outer.clone(), d.inner.clone()],
        };
        prop_assert_eq!(tags.len(), s.vlans.len());
        for (t, v) in tags.iter().zip(&s.vlans) {
            prop_assert_eq!((t.pcp.value(), t.drop_eligible_indicator, t.vlan_id.value()), (v.pcp, v.dei, v.vid));
        }

        let Some(NetHeaders::Ipv4(iph, _)) = &h.net else { panic!("no ipv4: {h:?}") };
        prop_assert_eq!(iph.header_checksum, iph.calc_header_checksum());
        prop_assert_eq!((iph.dscp.value(), iph.ecn.value(), iph.identification), (s.ip.dscp, s.ip.ecn, s.ip.ident));
        prop_assert_eq!((iph.dont_fragment, iph.more_fragments, iph.fragment_offset.value()), (s.ip.df, false, 0));
        prop_assert_eq!((iph.time_to_live, iph.source, iph.destination), (s.ip.ttl, s.ip.src, s.ip.dst));
        prop_assert_eq!(iph.options.as_slice(), &s.ip.options[..]);
        prop_assert_eq!(iph.protocol.0, l4.protocol());

        match (h.transport.as_ref().unwrap(), &h.payload, &l4) {
            (TransportHeader::Udp(u), PayloadSlice::Udp(p), Transport::Udp(_)) => {
                prop_assert_eq!((u.source_port, u.destination_port), s.ports);
                prop_assert_eq!(*p, &s.payload[..]);
                prop_assert_eq!(u.checksum, u.calc_checksum_ipv4(iph, p).unwrap());
            }
            (TransportHeader::Tcp(t), PayloadSlice::Tcp(p), Transport::Tcp(r)) => {
                prop_assert_eq!((t.source_port, t.destination_port), s.ports);
                prop_assert_eq!((t.sequence_number, t.acknowledgment_number), (r.seq_number, r.ack_number));
                let flags = [t.fin, t.syn, t.rst, t.psh, t.ack, t.urg, t.ece, t.cwr]
                    .iter()
                    .enumerate()
                    .fold(0u8, |f, (i, &b)| f | (u8::from(b) << i));
                prop_assert_eq!(flags, r.flags);
                prop_assert_eq!((t.window_size, t.urgent_pointer), (r.window, r.urgent_ptr));
                let theirs: Vec<_> = t.options_iterator().map(Result::unwrap).collect();
                let ours: Vec<_> = s.tcp.as_ref().unwrap().options.iter().map(to_etherparse).collect();
                prop_assert_eq!(theirs, ours);
                prop_assert_eq!(*p, &s.payload[..]);
                prop_assert_eq!(t.checksum, t.calc_checksum_ipv4(iph, p).unwrap());
            }
            (TransportHeader::Icmpv4(i), PayloadSlice::Icmpv4(p), Transport::Icmp(_)) => {
                let Icmpv4Type::EchoReply(echo) = &i.icmp_type else { panic!("not an echo reply: {i:?}") };
                prop_assert_eq!((echo.id, echo.seq), s.ports);
                prop_assert_eq!(*p, &s.payload[..]);
                prop_assert_eq!(i.checksum, i.icmp_type.calc_checksum(p));
            }
            other => panic!("transport mismatch: {other:?}"),
        }
    }
}

/// The simple builders agree with etherparse's own PacketBuilder byte for byte.
#[test]
fn simple_builders_match_packet_builder() {
    let (m1, m2) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let (a, b) = ([10, 0, 0, 1], [10, 0, 0, 2]);
    let payload = b"the quick brown fox";

    let ours = build::udp_frame(
        MacAddr(m1),
        MacAddr(m2),
        a.into(),
        b.into(),
        4000,
        53,
        payload,
    );
    let builder = etherparse::PacketBuilder::ethernet2(m1, m2)
        .ipv4(a, b, 64)
        .udp(4000, 53);
    let mut theirs = Vec::new();
    builder.write(&mut theirs, payload).unwrap();
    assert_eq!(ours, theirs);

    let ours = build::icmp_echo(MacAddr(m1), MacAddr(m2), a.into(), b.into(), 77, 3, payload);
    let builder = etherparse::PacketBuilder::ethernet2(m1, m2)
        .ipv4(a, b, 64)
        .icmpv4_echo_request(77, 3);
    let mut theirs = Vec::new();
    builder.write(&mut theirs, payload).unwrap();
    assert_eq!(ours, theirs);

    let opts = [
        TcpOption::Mss(1460),
        TcpOption::NoOp,
        TcpOption::WindowScale(7),
    ];
    let flags = tcp::flags::SYN | tcp::flags::ACK;
    let ours = build::tcp_frame(
        MacAddr(m1),
        MacAddr(m2),
        a.into(),
        b.into(),
        80,
        5555,
        flags,
        100,
        200,
        &opts,
        payload,
    );
    let builder = etherparse::PacketBuilder::ethernet2(m1, m2)
        .ipv4(a, b, 64)
        .tcp(80, 5555, 100, 65535)
        .syn()
        .ack(200)
        .options(&opts.iter().map(to_etherparse).collect::<Vec<_>>())
        .unwrap();
    let mut theirs = Vec::new();
    builder.write(&mut theirs, payload).unwrap();
    assert_eq!(ours, theirs);

    // And the ICMP view agrees on what etherparse built.
    let ip = Ipv4Packet::new_checked(&theirs[14..]).unwrap();
    assert!(IcmpPacket::new_checked(ip.payload()).is_ok());
}
