//! Hostile input: random and mutated bytes into every checked constructor, option
//! iterator, repr parser and capture reader. None may panic; checked views must then
//! answer every getter without panicking.

use exonet_wire::build;
use exonet_wire::pcap::{CaptureReader, PcapReader, PcapngReader};
use exonet_wire::tcp::{self, TcpOption};
use exonet_wire::{
    ArpPacket, ArpRepr, EthernetFrame, IcmpPacket, IcmpRepr, Ipv4Addr, Ipv4Packet, Ipv4Repr,
    MacAddr, TcpOptionIter, TcpPacket, TcpRepr, UdpPacket, UdpRepr,
};
use proptest::prelude::*;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn poke_ethernet(b: &[u8]) {
    if let Ok(f) = EthernetFrame::new_checked(b) {
        let _ = (
            f.dst_addr(),
            f.src_addr(),
            f.vlan_count(),
            f.vlan(0),
            f.vlan(1),
            f.vlan(2),
            f.vlan_id(),
        );
        let _ = (f.ethertype(), f.header_len(), f.payload().len());
        poke_ipv4(f.payload());
        poke_arp(f.payload());
    }
}

fn poke_arp(b: &[u8]) {
    if let Ok(p) = ArpPacket::new_checked(b) {
        let _ = (
            p.htype(),
            p.ptype(),
            p.hlen(),
            p.plen(),
            p.oper(),
            p.sha(),
            p.spa(),
            p.tha(),
            p.tpa(),
        );
        let _ = ArpRepr::parse(&p);
    }
}

fn poke_ipv4(b: &[u8]) {
    for p in [
        Ipv4Packet::new_checked(b),
        Ipv4Packet::new_checked_header(b),
    ]
    .into_iter()
    .flatten()
    {
        let _ = (
            p.version(),
            p.ihl(),
            p.header_len(),
            p.dscp(),
            p.ecn(),
            p.total_len(),
            p.ident(),
        );
        let _ = (
            p.dont_frag(),
            p.more_frags(),
            p.frag_offset(),
            p.is_fragment(),
            p.is_first_fragment(),
        );
        let _ = (
            p.ttl(),
            p.protocol(),
            p.checksum(),
            p.src_addr(),
            p.dst_addr(),
            p.options().len(),
        );
        let _ = (p.verify_checksum(), p.payload().len());
        let _ = Ipv4Repr::parse(&p);
        poke_l4(p.payload());
    }
}

fn poke_l4(b: &[u8]) {
    if let Ok(p) = UdpPacket::new_checked(b) {
        let _ = (
            p.src_port(),
            p.dst_port(),
            p.len(),
            p.is_empty(),
            p.checksum(),
            p.payload().len(),
        );
        let _ = (p.verify_checksum(A, B), UdpRepr::parse(&p, A, B));
    }
    if let Ok(p) = TcpPacket::new_checked(b) {
        let _ = (
            p.src_port(),
            p.dst_port(),
            p.seq_number(),
            p.ack_number(),
            p.data_offset(),
            p.header_len(),
        );
        let _ = (
            p.flags(),
            p.fin(),
            p.syn(),
            p.rst(),
            p.psh(),
            p.ack(),
            p.urg(),
            p.window(),
            p.urgent_ptr(),
        );
        let _ = (
            p.checksum(),
            p.options().len(),
            p.payload().len(),
            p.verify_checksum(A, B),
        );
        let _ = TcpRepr::parse(&p, A, B);
        poke_options(p.options());
    }
    if let Ok(p) = IcmpPacket::new_checked(b) {
        let _ = (
            p.msg_type(),
            p.code(),
            p.checksum(),
            p.echo_ident(),
            p.echo_seq_no(),
            p.next_hop_mtu(),
        );
        let _ = (
            p.is_error(),
            p.payload().len(),
            p.verify_checksum(),
            IcmpRepr::parse(&p),
        );
        if let Ok(q) = p.quoted_ipv4() {
            let _ = (q.src_addr(), q.payload().len(), q.options().len());
        }
    }
}

fn poke_options(b: &[u8]) {
    let all: Vec<_> = TcpOptionIter::new(b).collect();
    // An error ends iteration, and nothing yields after End of Option List.
    if let Some(i) = all
        .iter()
        .position(|o| matches!(o, Err(_) | Ok(TcpOption::EndOfList)))
    {
        assert_eq!(i + 1, all.len());
    }
    // The iterator never reads past its input.
    let consumed: usize = all.iter().flatten().map(TcpOption::buffer_len).sum();
    assert!(consumed <= b.len());
}

fn poke_captures(b: &[u8]) {
    // Bounded: each record consumes at least one header's worth of input.
    for r in PcapReader::new(b).into_iter().flatten().take(10_000) {
        let _ = r.map(|r| r.data.len());
    }
    for r in PcapngReader::new(b).into_iter().flatten().take(10_000) {
        let _ = r.map(|r| r.data.len());
    }
    for r in CaptureReader::new(b).into_iter().flatten().take(10_000) {
        let _ = r.map(|r| r.data.len());
    }
}

/// Valid frames of every kind, to mutate.
fn seeds() -> Vec<Vec<u8>> {
    let (m1, m2) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
    let opts = [
        TcpOption::Mss(1460),
        TcpOption::SackPermitted,
        TcpOption::Timestamps { tsval: 1, tsecr: 2 },
        TcpOption::NoOp,
        TcpOption::WindowScale(7),
    ];
    vec![
        build::udp_frame(m1, m2, A, B, 1, 2, b"udp payload"),
        build::tcp_frame(
            m1,
            m2,
            A,
            B,
            1,
            2,
            tcp::flags::SYN,
            1,
            0,
            &opts,
            b"tcp payload",
        ),
        build::icmp_echo(m1, m2, A, B, 1, 2, b"ping"),
        build::arp_request(m1, A, B),
    ]
}

/// A little-endian pcap header followed by random records, and a pcapng SHB.
const PCAP_HEADER: [u8; 24] = [
    0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0,
];
const PCAPNG_SHB: [u8; 28] = [
    0x0a, 0x0d, 0x0d, 0x0a, 28, 0, 0, 0, 0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 28, 0, 0, 0,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        poke_ethernet(&b);
        poke_arp(&b);
        poke_ipv4(&b);
        poke_l4(&b);
        poke_options(&b);
        poke_captures(&b);
    }

    #[test]
    fn mutated_frames_never_panic(seed in 0usize..4, edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        let mut f = seeds().swap_remove(seed);
        for (at, v) in edits {
            let i = at % f.len();
            f[i] = v;
        }
        f.truncate(cut % (f.len() + 1));
        poke_ethernet(&f);
        poke_l4(f.get(14..).unwrap_or(&[]));
        poke_l4(f.get(34..).unwrap_or(&[]));
    }

    #[test]
    fn random_capture_bodies_never_panic(ng in any::<bool>(), body in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut f = if ng { PCAPNG_SHB.to_vec() } else { PCAP_HEADER.to_vec() };
        f.extend_from_slice(&body);
        poke_captures(&f);
    }

    #[test]
    fn random_options_never_panic(b in proptest::collection::vec(any::<u8>(), 0..44)) {
        poke_options(&b);
    }

    /// `timestamps()` (with its short path for NOP, NOP, TS) finds what a
    /// scan of the options finds, for random option bytes and for the
    /// usual layout with random values.
    #[test]
    fn timestamps_match_a_scan(words in proptest::collection::vec(any::<[u8; 4]>(), 0..10), usual in any::<bool>(), ts in any::<(u32, u32)>()) {
        let mut opts: Vec<u8> = words.concat();
        if usual && opts.len() >= 12 {
            opts[..4].copy_from_slice(&[1, 1, 8, 10]);
            opts[4..8].copy_from_slice(&ts.0.to_be_bytes());
            opts[8..12].copy_from_slice(&ts.1.to_be_bytes());
        }
        let mut seg = vec![0u8; 20];
        seg[12] = (((20 + opts.len()) / 4) << 4) as u8;
        seg.extend_from_slice(&opts);
        let p = TcpPacket::new_checked(&seg[..]).unwrap();
        let scan = TcpOptionIter::new(&opts).map_while(Result::ok).find_map(|o| match o {
            TcpOption::Timestamps { tsval, tsecr } => Some((tsval, tsecr)),
            _ => None,
        });
        prop_assert_eq!(p.timestamps(), scan);
        if usual && opts.len() >= 12 {
            prop_assert_eq!(p.timestamps(), Some(ts));
        }
    }
}
