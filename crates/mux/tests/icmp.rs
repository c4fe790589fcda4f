//! ICMP errors routed to the socket they concern; ICMP echo sockets.

mod common;

use std::net::Ipv4Addr;

use common::*;
use exonet_dpf::{Filter, Width};
use exonet_link::Link;
use exonet_mux::registry::{socket_filter, socket_template};
use exonet_mux::{ChannelSpec, MuxError, Proto};
use exonet_shm::Desc;
use exonet_wire::build::{self, Transport};
use exonet_wire::ethernet::ethertype;
use exonet_wire::icmp::{time_exceeded, unreach};
use exonet_wire::ipv4::protocol;
use exonet_wire::{EthernetRepr, IcmpPacket, IcmpRepr, Ipv4Repr};

/// A router on the path.
const ROUTER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
const FAR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);

/// An ICMP message from the router to us, as a frame.
fn icmp_to_us(msg: IcmpRepr) -> Vec<u8> {
    let eth = EthernetRepr {
        dst: HOST_MAC,
        src: PEER_MAC,
        vlans: &[],
        ethertype: ethertype::IPV4,
    };
    let l4 = Transport::Icmp(msg);
    let ip = Ipv4Repr::new(ROUTER, HOST, protocol::ICMP, l4.buffer_len());
    build::ipv4_frame(&eth, &ip, &l4).unwrap()
}

fn unreachable(quoted: &[u8]) -> Vec<u8> {
    icmp_to_us(IcmpRepr::DstUnreachable {
        code: unreach::PORT,
        next_hop_mtu: 0,
        quoted,
    })
}

/// The IP datagram of a UDP frame we sent from `sport` to `dst`:`dport`.
fn our_udp(sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    build::udp_frame(HOST_MAC, PEER_MAC, HOST, dst, sport, dport, b"query")[14..].to_vec()
}

fn udp(port: u16, remote: Option<(Ipv4Addr, u16)>) -> ChannelSpec {
    ChannelSpec {
        remote,
        ..spec(port)
    }
}

fn echo(ident: u16) -> ChannelSpec {
    ChannelSpec {
        proto: Proto::Icmp,
        ..spec(ident)
    }
}

fn echo_reply(ident: u16) -> Vec<u8> {
    let eth = EthernetRepr {
        dst: HOST_MAC,
        src: PEER_MAC,
        vlans: &[],
        ethertype: ethertype::IPV4,
    };
    let l4 = Transport::Icmp(IcmpRepr::EchoReply {
        ident,
        seq_no: 1,
        data: b"pong",
    });
    let ip = Ipv4Repr::new(PEER, HOST, protocol::ICMP, l4.buffer_len());
    build::ipv4_frame(&eth, &ip, &l4).unwrap()
}

#[test]
fn errors_reach_the_socket_they_quote_and_no_other() {
    let (mut mux, mut wire) = mux();
    let (a, mut app_a, _) = endpoint(&mut mux, 8, false);
    let (b, mut app_b, _) = endpoint(&mut mux, 8, false);
    let (ca, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let (cb, _) = mux.bind_socket(b, spec(6000)).unwrap();
    let for_a = unreachable(&our_udp(5000, FAR, 53));
    // Time exceeded with a longer quote (RFC 1812 §4.3.2.3): still A's.
    let mut long = our_udp(5000, FAR, 53);
    long.extend_from_slice(&[0; 100]);
    let exceeded = icmp_to_us(IcmpRepr::TimeExceeded {
        code: time_exceeded::TTL,
        quoted: &long,
    });
    // Parameter problem (12) quotes like the others.
    let mut problem = unreachable(&our_udp(5000, FAR, 53));
    let mut p = IcmpPacket::new_unchecked(&mut problem[34..]);
    p.set_msg_type(12);
    p.fill_checksum();
    // Quoting only the IP header and 8 bytes, as RFC 792 allows.
    let for_b = unreachable(&our_udp(6000, FAR, 53)[..28]);
    wire.send_batch(&[&for_a, &exceeded, &problem, &for_b])
        .unwrap();
    mux.poll_rx().unwrap();
    // Delivered unchanged, on the socket's channel.
    assert_eq!(
        drain_rx(&mut app_a),
        vec![(ca.0, for_a), (ca.0, exceeded), (ca.0, problem)]
    );
    assert_eq!(drain_rx(&mut app_b), vec![(cb.0, for_b)]);
    // Errors are never answered.
    assert!(drain_wire(&mut wire).is_empty());
    let s = mux.stats();
    assert_eq!(
        (s.host.icmp_errors_delivered, s.host.icmp_errors_unclaimed),
        (4, 0)
    );
    assert_eq!(s.rx_unmatched, 0);
}

#[test]
fn connected_beats_unconnected_and_protocols_are_apart() {
    let (mut mux, mut wire) = mux();
    let (a, mut app_a, _) = endpoint(&mut mux, 8, false);
    let (b, mut app_b, _) = endpoint(&mut mux, 8, false);
    let (open, _) = mux.bind_socket(a, udp(5000, None)).unwrap();
    let (conn, _) = mux.bind_socket(a, udp(5000, Some((FAR, 53)))).unwrap();
    let (other, _) = mux.bind_socket(a, udp(5000, Some((FAR, 54)))).unwrap();
    // The same number as a TCP port is someone else's.
    let (tcp, _) = mux
        .bind_socket(
            b,
            ChannelSpec {
                proto: Proto::Tcp,
                ..spec(5000)
            },
        )
        .unwrap();
    let to_conn = unreachable(&our_udp(5000, FAR, 53));
    let to_other = unreachable(&our_udp(5000, FAR, 54));
    let to_open = unreachable(&our_udp(5000, FAR, 99));
    let to_open2 = unreachable(&our_udp(5000, PEER, 53));
    let seg = build::tcp_frame(
        HOST_MAC,
        PEER_MAC,
        HOST,
        FAR,
        5000,
        80,
        exonet_wire::tcp::flags::SYN,
        1,
        0,
        &[],
        &[],
    );
    let to_tcp = unreachable(&seg[14..]);
    wire.send_batch(&[&to_conn, &to_other, &to_open, &to_open2, &to_tcp])
        .unwrap();
    mux.poll_rx().unwrap();
    assert_eq!(
        drain_rx(&mut app_a),
        vec![
            (conn.0, to_conn),
            (other.0, to_other),
            (open.0, to_open),
            (open.0, to_open2)
        ]
    );
    assert_eq!(drain_rx(&mut app_b), vec![(tcp.0, to_tcp)]);
    // Without the unconnected channel, an error for another remote goes
    // nowhere.
    mux.unbind_channel(open).unwrap();
    wire.send_batch(&[&unreachable(&our_udp(5000, FAR, 99))])
        .unwrap();
    mux.poll_rx().unwrap();
    assert!(drain_rx(&mut app_a).is_empty());
    let h = mux.stats().host;
    assert_eq!((h.icmp_errors_delivered, h.icmp_errors_unclaimed), (5, 1));
}

#[test]
fn unowned_or_garbled_quotes_reach_nobody_and_are_counted() {
    let (mut mux, mut wire) = mux();
    let (a, mut app_a, _) = endpoint(&mut mux, 8, false);
    let (b, mut app_b, _) = endpoint(&mut mux, 8, false);
    mux.bind_socket(a, spec(5000)).unwrap();
    // B holds 7000 for raw channels: not a socket, so errors are not its.
    mux.allocate_port(b, Proto::Udp, 7000).unwrap();
    let quote = our_udp(5000, FAR, 53);
    let mut bad_ihl = quote.clone();
    bad_ihl[0] = 0x43;
    let mut v6 = quote.clone();
    v6[0] = 0x65;
    let mut later_fragment = quote.clone();
    later_fragment[7] = 1;
    let mut not_from_us = quote.clone();
    not_from_us[12..16].copy_from_slice(&PEER.octets());
    let mut icmp_quoted = quote.clone();
    icmp_quoted[9] = protocol::ICMP;
    let frames = [
        unreachable(&our_udp(5001, FAR, 53)),
        unreachable(&our_udp(7000, FAR, 53)),
        // The IP header and only 7 bytes of the UDP header.
        unreachable(&quote[..27]),
        unreachable(&quote[..10]),
        unreachable(&[]),
        unreachable(&bad_ihl),
        unreachable(&v6),
        unreachable(&later_fragment),
        unreachable(&not_from_us),
        unreachable(&icmp_quoted),
    ];
    for (i, f) in frames.iter().enumerate() {
        wire.send_batch(&[f]).unwrap();
        mux.poll_rx().unwrap();
        assert_eq!(
            mux.stats().host.icmp_errors_unclaimed,
            i as u64 + 1,
            "frame {i}"
        );
    }
    // Not errors for us: not counted as such.
    let mut bad_sum = unreachable(&quote);
    bad_sum[36] ^= 0xff;
    let mut not_ours = unreachable(&quote);
    not_ours[30..34].copy_from_slice(&[10, 0, 0, 99]);
    let mut p = exonet_wire::Ipv4Packet::new_unchecked(&mut not_ours[14..]);
    p.fill_checksum();
    wire.send_batch(&[&bad_sum, &not_ours]).unwrap();
    mux.poll_rx().unwrap();
    assert!(drain_rx(&mut app_a).is_empty());
    assert!(drain_rx(&mut app_b).is_empty());
    assert!(drain_wire(&mut wire).is_empty());
    let s = mux.stats();
    assert_eq!(
        (s.host.icmp_errors_delivered, s.host.icmp_errors_unclaimed),
        (0, frames.len() as u64)
    );
    assert_eq!(s.rx_unmatched, frames.len() as u64 + 2);
    assert_eq!(s.host.unmatched_dropped, frames.len() as u64 + 2);
}

#[test]
fn echo_sockets_get_only_their_replies_and_the_host_still_answers_pings() {
    let (mut mux, mut wire) = mux();
    let (a, mut app_a, _) = endpoint(&mut mux, 8, false);
    let (b, mut app_b, _) = endpoint(&mut mux, 8, false);
    let (ca, ia) = mux.bind_socket(a, echo(0)).unwrap();
    // No privileged range for identifiers.
    let (cb, ib) = mux.bind_socket(b, echo(7)).unwrap();
    assert_eq!(ib, 7);
    assert_ne!(ia, 0);
    // A UDP port of the same number is another space.
    let (cu, _) = mux.bind_socket(b, spec(ia)).unwrap();
    assert_eq!(
        mux.bind_socket(b, echo(ia)),
        Err(MuxError::PortInUse {
            proto: Proto::Icmp,
            port: ia
        })
    );
    let (ra, rb, nobody) = (echo_reply(ia), echo_reply(7), echo_reply(8));
    let ping = build::icmp_echo(PEER_MAC, HOST_MAC, PEER, HOST, ia, 3, b"ping");
    let udp = build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 9, ia, b"u");
    wire.send_batch(&[&ra, &rb, &nobody, &ping, &udp]).unwrap();
    mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut app_a), vec![(ca.0, ra)]);
    assert_eq!(drain_rx(&mut app_b), vec![(cb.0, rb), (cu.0, udp)]);
    // The request with A's identifier was the host's to answer.
    let replies = drain_wire(&mut wire);
    assert_eq!(replies.len(), 1);
    let p = IcmpPacket::new_checked(&replies[0][34..]).unwrap();
    assert_eq!(
        IcmpRepr::parse(&p).unwrap(),
        IcmpRepr::EchoReply {
            ident: ia,
            seq_no: 3,
            data: b"ping"
        }
    );
    assert_eq!(mux.stats().host.echo_replies, 1);
    // Connected: only replies from that peer.
    let (c, mut app_c, _) = endpoint(&mut mux, 8, false);
    let (cc, ic) = mux
        .bind_socket(
            c,
            ChannelSpec {
                remote: Some((FAR, 0)),
                ..echo(0)
            },
        )
        .unwrap();
    let from_peer = echo_reply(ic);
    let mut from_far = echo_reply(ic);
    from_far[26..30].copy_from_slice(&FAR.octets());
    exonet_wire::Ipv4Packet::new_unchecked(&mut from_far[14..]).fill_checksum();
    wire.send_batch(&[&from_peer, &from_far]).unwrap();
    mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut app_c), vec![(cc.0, from_far)]);
}

#[test]
fn echo_template_sends_only_requests_with_the_identifier() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, bufs) = endpoint(&mut mux, 8, false);
    let (ch, id) = mux.bind_socket(a, echo(0)).unwrap();
    let good = build::icmp_echo(HOST_MAC, PEER_MAC, HOST, PEER, id, 1, b"ping");
    let other_id = build::icmp_echo(HOST_MAC, PEER_MAC, HOST, PEER, id ^ 1, 1, b"ping");
    let mut reply = good.clone();
    let mut p = IcmpPacket::new_unchecked(&mut reply[34..]);
    p.set_msg_type(0);
    p.fill_checksum();
    let spoofed = build::icmp_echo(HOST_MAC, PEER_MAC, PEER, PEER, id, 1, b"ping");
    for (i, f) in [&good, &other_id, &reply, &spoofed].iter().enumerate() {
        send(&mut app, bufs[i], f, ch.0);
    }
    mux.poll_tx().unwrap();
    assert_eq!(drain_wire(&mut wire), vec![good]);
    let comp = completions(&mut app);
    assert_eq!(comp.len(), 4);
    assert_eq!(comp[0].flags, 0);
    assert!(comp[1..].iter().all(|d| d.flags == Desc::REJECTED));
    assert_eq!(mux.endpoint_stats(a).unwrap().tx_template_mismatch, 3);
}

#[test]
fn raw_icmp_filters_and_templates_must_pin_an_owned_identifier() {
    let (mut mux, _wire) = mux();
    let mac = HOST_MAC.0;
    let (a, _app_a, _) = endpoint(&mut mux, 8, false);
    let (b, _app_b, _) = endpoint(&mut mux, 8, false);
    let ia = mux.allocate_port(a, Proto::Icmp, 0).unwrap();
    let ib = mux.allocate_port(b, Proto::Icmp, 0).unwrap();
    assert_eq!(mux.ports_of(a), vec![(Proto::Icmp, ia)]);
    // A's own identifier: accepted.
    mux.bind_channel(
        a,
        &[socket_filter(&echo(ia))],
        socket_template(mac, &echo(ia)),
    )
    .unwrap();
    let denied = |r: Result<_, MuxError>| assert!(matches!(r, Err(MuxError::NotPermitted(_))));
    // B's identifier, in the filter or in the template.
    denied(mux.bind_channel(
        a,
        &[socket_filter(&echo(ib))],
        socket_template(mac, &echo(ia)),
    ));
    denied(mux.bind_channel(
        a,
        &[socket_filter(&echo(ia))],
        socket_template(mac, &echo(ib)),
    ));
    // Requests (type 8) to us are the host's: a filter for them is refused
    // even with A's identifier.
    let requests = Filter::new()
        .eq(12, Width::U16, 0x800)
        .eq(23, Width::U8, 1)
        .eq(30, Width::U32, u32::from(HOST))
        .masked(20, Width::U16, 0x1fff, exonet_dpf::Op::Eq, 0)
        .shift(14)
        .shift_by(0, Width::U8, 0x0f, 2)
        .eq(0, Width::U8, 8)
        .eq(4, Width::U16, ia as u32);
    denied(mux.bind_channel(a, &[requests], socket_template(mac, &echo(ia))));
    // Offset 2 of ICMP is the checksum, not a port: pinning it to A's
    // identifier (or to a UDP port A owns) claims nothing.
    mux.allocate_port(a, Proto::Udp, 5000).unwrap();
    let checksum = |v: u16| {
        Filter::new()
            .eq(12, Width::U16, 0x800)
            .eq(23, Width::U8, 1)
            .eq(30, Width::U32, u32::from(HOST))
            .masked(20, Width::U16, 0x1fff, exonet_dpf::Op::Eq, 0)
            .shift(14)
            .shift_by(0, Width::U8, 0x0f, 2)
            .eq(2, Width::U16, v as u32)
    };
    denied(mux.bind_channel(a, &[checksum(ia)], socket_template(mac, &echo(ia))));
    denied(mux.bind_channel(a, &[checksum(5000)], socket_template(mac, &echo(ia))));
    // A UDP template on a UDP port with A's identifier's number is not A's.
    denied(mux.bind_channel(
        a,
        &[socket_filter(&echo(ia))],
        socket_template(mac, &spec(ia)),
    ));
    // A template for replies instead of requests.
    let replies = exonet_mux::Template::new()
        .field(6, &mac)
        .field(12, &[0x08, 0x00, 0x45])
        .masked(20, &[0, 0], &[0x3f, 0xff])
        .field(23, &[1])
        .field(26, &HOST.octets())
        .field(34, &[0, 0])
        .field(38, &ia.to_be_bytes());
    let requests = replies.clone().field(34, &[8, 0]);
    mux.bind_channel(a, &[socket_filter(&echo(ia))], requests)
        .unwrap();
    denied(mux.bind_channel(a, &[socket_filter(&echo(ia))], replies));
}
