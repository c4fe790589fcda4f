//! Stage 2: host duties, checked with exonet-wire views.

mod common;

use std::net::Ipv4Addr;

use common::*;
use exonet_link::Link;
use exonet_mux::{ChannelSpec, HostConfig, MuxConfig, Proto};
use exonet_wire::icmp::{msg_type, unreach};
use exonet_wire::tcp::flags;
use exonet_wire::{
    arp, build, ArpPacket, ArpRepr, EthernetFrame, IcmpPacket, IcmpRepr, Ipv4Packet, TcpPacket,
};

fn one_reply(wire: &mut exonet_link::memwire::MemWire) -> Vec<u8> {
    let mut got = drain_wire(wire);
    assert_eq!(got.len(), 1, "expected one reply, got {}", got.len());
    got.pop().unwrap()
}

#[test]
fn answers_arp_for_its_addresses_only() {
    let (mut mux, mut wire) = mux();
    wire.send_batch(&[&build::arp_request(PEER_MAC, PEER, HOST)])
        .unwrap();
    mux.poll_rx().unwrap();
    let f = one_reply(&mut wire);
    let eth = EthernetFrame::new_checked(&f[..]).unwrap();
    assert_eq!(eth.dst_addr(), PEER_MAC);
    assert_eq!(eth.src_addr(), HOST_MAC);
    let a = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap()).unwrap();
    assert_eq!(
        a,
        ArpRepr {
            oper: arp::OP_REPLY,
            sha: HOST_MAC,
            spa: HOST,
            tha: PEER_MAC,
            tpa: PEER
        }
    );
    // The request taught us the peer.
    assert_eq!(mux.arp_lookup(PEER), Some(PEER_MAC.0));
    // Not ours: no reply.
    wire.send_batch(&[&build::arp_request(
        PEER_MAC,
        PEER,
        Ipv4Addr::new(10, 0, 0, 77),
    )])
    .unwrap();
    mux.poll_rx().unwrap();
    assert!(drain_wire(&mut wire).is_empty());
    assert_eq!(mux.stats().host.arp_replies_sent, 1);
}

#[test]
fn resolves_through_the_cache() {
    let (mut mux, mut wire) = mux();
    let far = Ipv4Addr::new(10, 0, 0, 9);
    let far_mac = exonet_wire::MacAddr([2, 0, 0, 0, 0, 9]);
    assert_eq!(mux.resolve(far).unwrap(), None);
    let req = one_reply(&mut wire);
    let eth = EthernetFrame::new_checked(&req[..]).unwrap();
    assert!(eth.dst_addr().is_broadcast());
    let r = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap()).unwrap();
    assert_eq!((r.oper, r.spa, r.tpa), (arp::OP_REQUEST, HOST, far));
    // Asking again at once does not flood the wire.
    assert_eq!(mux.resolve(far).unwrap(), None);
    assert!(drain_wire(&mut wire).is_empty());
    let reply = build::arp_frame(
        HOST_MAC,
        &ArpRepr {
            oper: arp::OP_REPLY,
            sha: far_mac,
            spa: far,
            tha: HOST_MAC,
            tpa: HOST,
        },
    );
    wire.send_batch(&[&reply]).unwrap();
    mux.poll_rx().unwrap();
    assert_eq!(mux.resolve(far).unwrap(), Some(far_mac.0));
    assert!(drain_wire(&mut wire).is_empty());
}

#[test]
fn answers_echo_requests() {
    let (mut mux, mut wire) = mux();
    let ping = build::icmp_echo(PEER_MAC, HOST_MAC, PEER, HOST, 0x1234, 7, b"abcdefgh");
    wire.send_batch(&[&ping]).unwrap();
    mux.poll_rx().unwrap();
    let f = one_reply(&mut wire);
    let eth = EthernetFrame::new_checked(&f[..]).unwrap();
    assert_eq!((eth.src_addr(), eth.dst_addr()), (HOST_MAC, PEER_MAC));
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    assert!(ip.verify_checksum());
    assert_eq!((ip.src_addr(), ip.dst_addr()), (HOST, PEER));
    let icmp = IcmpPacket::new_checked(ip.payload()).unwrap();
    assert!(icmp.verify_checksum());
    assert_eq!(
        IcmpRepr::parse(&icmp).unwrap(),
        IcmpRepr::EchoReply {
            ident: 0x1234,
            seq_no: 7,
            data: b"abcdefgh"
        }
    );
    // A ping for someone else is ignored.
    let other = build::icmp_echo(
        PEER_MAC,
        HOST_MAC,
        PEER,
        Ipv4Addr::new(10, 0, 0, 50),
        1,
        1,
        b"x",
    );
    wire.send_batch(&[&other]).unwrap();
    mux.poll_rx().unwrap();
    assert!(drain_wire(&mut wire).is_empty());
}

#[test]
fn resets_unclaimed_tcp() {
    let (mut mux, mut wire) = mux();
    let syn = build::tcp_frame(
        PEER_MAC,
        HOST_MAC,
        PEER,
        HOST,
        40000,
        80,
        flags::SYN,
        1000,
        0,
        &[],
        &[],
    );
    wire.send_batch(&[&syn]).unwrap();
    mux.poll_rx().unwrap();
    let f = one_reply(&mut wire);
    let eth = EthernetFrame::new_checked(&f[..]).unwrap();
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    assert!(ip.verify_checksum());
    let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
    assert!(tcp.verify_checksum(HOST, PEER));
    assert_eq!((tcp.src_port(), tcp.dst_port()), (80, 40000));
    assert_eq!(tcp.flags(), flags::RST | flags::ACK);
    assert_eq!((tcp.seq_number(), tcp.ack_number()), (0, 1001));
    // With ACK: SEQ = SEG.ACK, RST alone.
    let ack = build::tcp_frame(
        PEER_MAC,
        HOST_MAC,
        PEER,
        HOST,
        40000,
        80,
        flags::ACK,
        5,
        777,
        &[],
        b"data",
    );
    wire.send_batch(&[&ack]).unwrap();
    mux.poll_rx().unwrap();
    let f = one_reply(&mut wire);
    let tcp_ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
    let tcp = TcpPacket::new_checked(tcp_ip.payload()).unwrap();
    assert!(tcp.verify_checksum(HOST, PEER));
    assert_eq!((tcp.flags(), tcp.seq_number()), (flags::RST, 777));
    // Never a RST for a RST.
    let rst = build::tcp_frame(
        PEER_MAC,
        HOST_MAC,
        PEER,
        HOST,
        40000,
        80,
        flags::RST,
        5,
        0,
        &[],
        &[],
    );
    wire.send_batch(&[&rst]).unwrap();
    mux.poll_rx().unwrap();
    assert!(drain_wire(&mut wire).is_empty());
    assert_eq!(mux.stats().host.tcp_resets, 2);
}

#[test]
fn port_unreachable_for_unclaimed_udp_and_not_for_claimed() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, _) = endpoint(&mut mux, 8, false);
    mux.bind_socket(
        a,
        ChannelSpec {
            proto: Proto::Udp,
            local_addr: HOST,
            local_port: 5000,
            remote: None,
        },
    )
    .unwrap();
    let claimed = build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 9, 5000, b"mine");
    let unclaimed = build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 9, 5001, b"nobody's");
    wire.send_batch(&[&claimed, &unclaimed]).unwrap();
    mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut app).len(), 1);
    let f = one_reply(&mut wire);
    let eth = EthernetFrame::new_checked(&f[..]).unwrap();
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    assert!(ip.verify_checksum());
    assert_eq!((ip.src_addr(), ip.dst_addr()), (HOST, PEER));
    let icmp = IcmpPacket::new_checked(ip.payload()).unwrap();
    assert!(icmp.verify_checksum());
    assert_eq!(
        (icmp.msg_type(), icmp.code()),
        (msg_type::DST_UNREACHABLE, unreach::PORT)
    );
    // The quote is the offending datagram.
    assert_eq!(icmp.payload(), &unclaimed[14..]);
}

#[test]
fn refusals_are_rate_limited() {
    let (mut mux, mut wire) = mux_with(MuxConfig {
        host: HostConfig {
            refusal_rate: 0.001,
            refusal_burst: 3,
            ..HostConfig::default()
        },
        ..MuxConfig::default()
    });
    let f = build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 9, 5001, b"x");
    for _ in 0..10 {
        wire.send_batch(&[&f]).unwrap();
    }
    while mux.poll_rx().unwrap() > 0 {}
    assert_eq!(drain_wire(&mut wire).len(), 3);
    let h = mux.stats().host;
    assert_eq!((h.udp_unreachables, h.rate_limited), (3, 7));
    // Echo replies are not refusals: still answered.
    let ping = build::icmp_echo(PEER_MAC, HOST_MAC, PEER, HOST, 1, 1, b"p");
    wire.send_batch(&[&ping]).unwrap();
    mux.poll_rx().unwrap();
    assert_eq!(drain_wire(&mut wire).len(), 1);
}
