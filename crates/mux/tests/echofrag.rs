//! The host answers fragmented echo requests (`ping -s 4000`), within
//! bounds.

mod common;

use std::time::{Duration, Instant};

use common::*;
use exonet_link::Link;
use exonet_wire::build;
use exonet_wire::ipv4::protocol;
use exonet_wire::{IcmpPacket, IcmpRepr, Ipv4Packet, Ipv4Repr};

/// A ping from PEER with `len` bytes of data, cut to the link's MTU (1500)
/// under IP identification `ident`, head first.
fn ping(ident: u16, seq: u16, len: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
    let data: Vec<u8> = (0..len).map(|i| (i * 13 + seq as usize) as u8).collect();
    let whole = build::icmp_echo(PEER_MAC, HOST_MAC, PEER, HOST, 0x77, seq, &data);
    let (frames, _) = fragments_of(whole, ident);
    (frames, data)
}

/// One fragment of an echo request from PEER, `data` at byte `offset`.
fn fragment(ident: u16, offset: u16, more: bool, data: &[u8]) -> Vec<u8> {
    let ip = Ipv4Repr {
        ident,
        dont_frag: false,
        more_frags: more,
        frag_offset: offset,
        ..Ipv4Repr::new(PEER, HOST, protocol::ICMP, data.len())
    };
    let mut f = build::icmp_echo(PEER_MAC, HOST_MAC, PEER, HOST, 1, 1, &[])[..14].to_vec();
    f.resize(14 + ip.total_len(), 0);
    ip.emit(&mut f[14..]).unwrap();
    f[34..].copy_from_slice(data);
    f
}

/// The data of the echo reply the frames on the wire make up, checking
/// that they are fragments of one datagram with valid headers.
fn reply_data(frames: &[Vec<u8>], seq: u16) -> Vec<u8> {
    let id = ident_of(&frames[0]).0;
    assert!(frames.iter().all(|f| ident_of(f) == (id, true)));
    assert!(frames.iter().all(|f| f.len() <= 1514));
    let icmp = reassemble(frames);
    let p = IcmpPacket::new_checked(&icmp[..]).unwrap();
    match IcmpRepr::parse(&p).unwrap() {
        IcmpRepr::EchoReply {
            ident,
            seq_no,
            data,
        } => {
            assert_eq!((ident, seq_no), (0x77, seq));
            data.to_vec()
        }
        other => panic!("not an echo reply: {other:?}"),
    }
}

#[test]
fn a_fragmented_ping_in_any_order_gets_a_fragmented_reply() {
    let (mut mux, mut wire) = mux();
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    let mut ids = Vec::new();
    for (k, order) in orders.iter().enumerate() {
        let seq = k as u16 + 1;
        let (frames, data) = ping(0x1000 + seq, seq, 4000);
        assert_eq!(frames.len(), 3);
        for &i in order {
            assert_eq!(wire.send_batch(&[&frames[i]]).unwrap(), 1);
            mux.poll_rx().unwrap();
        }
        let got = drain_wire(&mut wire);
        assert_eq!(got.len(), 3, "order {order:?}");
        assert_eq!(reply_data(&got, seq), data);
        ids.push(ident_of(&got[0]).0);
    }
    ids.dedup();
    assert_eq!(ids.len(), orders.len(), "a fresh identification each time");
    let h = mux.stats().host;
    assert_eq!(
        (h.echo_frags, h.echo_reassembled, h.echo_replies),
        (18, 6, 6)
    );
    assert_eq!(h.echo_frag_bytes_held, 0);
    // A ping that fits is still answered whole.
    let (small, data) = ping(9, 9, 100);
    wire.send_batch(&[&small[0]]).unwrap();
    mux.poll_rx().unwrap();
    let got = drain_wire(&mut wire);
    assert_eq!(got.len(), 1);
    assert_eq!(reply_data(&got, 9), data);
}

#[test]
fn a_flood_of_unfinished_fragments_is_bounded_and_times_out() {
    let (mut mux, mut wire) = mux();
    assert_eq!(mux.stats().host.echo_frag_bytes_held, 0);
    let t0 = Instant::now();
    let body = vec![0xab; 1480];
    let mut head = vec![0xab; 1480];
    head[0] = 8; // an echo request
    for ident in 0..200u16 {
        // A head and a body, never the last fragment; every fourth datagram
        // is only a body, whose head never comes.
        let mut frames = vec![fragment(ident, 1480, true, &body)];
        if ident % 4 != 0 {
            frames.push(fragment(ident, 0, true, &head));
        }
        for f in &frames {
            wire.send_batch(&[f]).unwrap();
        }
        mux.poll_rx_at(t0).unwrap();
        let s = mux.stats();
        assert!(s.host.echo_frag_bytes_held <= 64 * 1024);
        assert!(s.frag.held_bytes <= 256 * 1024);
    }
    assert!(drain_wire(&mut wire).is_empty());
    let s = mux.stats();
    assert!(s.host.echo_frag_no_room > 0);
    assert!(s.host.echo_frag_bytes_held > 0 && s.frag.held_bytes > 0);
    // The host gives up after its 2 s; the pool's orphans wait for their
    // 30 s.
    mux.poll_rx_at(t0 + Duration::from_secs(3)).unwrap();
    let s = mux.stats();
    assert_eq!(s.host.echo_frag_bytes_held, 0);
    assert!(s.host.echo_frag_timed_out > 0);
    mux.poll_rx_at(t0 + Duration::from_secs(31)).unwrap();
    assert_eq!(mux.stats().frag.held_bytes, 0);
    // And a ping still gets through.
    let (frames, data) = ping(7, 7, 4000);
    for f in &frames {
        wire.send_batch(&[f]).unwrap();
    }
    mux.poll_rx_at(t0 + Duration::from_secs(32)).unwrap();
    assert_eq!(reply_data(&drain_wire(&mut wire), 7), data);
}

#[test]
fn overlapping_fragments_drop_the_datagram_and_are_counted() {
    let (mut mux, mut wire) = mux();
    let (frames, _) = ping(3, 3, 4000);
    // A piece that overlaps the head's data (RFC 5722), then the real rest.
    let overlap = fragment(3, 1000, true, &[0; 800]);
    for f in [&frames[0], &overlap, &frames[1], &frames[2]] {
        wire.send_batch(&[f]).unwrap();
        mux.poll_rx().unwrap();
    }
    assert!(drain_wire(&mut wire).is_empty(), "no reply");
    let h = mux.stats().host;
    // The overlapping piece, and the two that came after it.
    assert_eq!((h.echo_frag_overlap, h.echo_reassembled), (3, 0));
    assert_eq!(h.echo_frag_bytes_held, 0);
}

#[test]
fn pings_do_not_evict_the_applications_datagrams_from_the_pool() {
    let (mut mux, mut wire) = mux_with(exonet_mux::MuxConfig {
        frag_datagrams: 2,
        ..exonet_mux::MuxConfig::default()
    });
    let (a, mut app, _) = endpoint(&mut mux, 8, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let udp = |ident: u16| -> Vec<Vec<u8>> {
        let mut whole = build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 9, 5000, &[1; 2000]);
        let mut ip = Ipv4Packet::new_unchecked(&mut whole[14..]);
        ip.set_ident(ident);
        ip.set_frag(false, false, 0);
        ip.fill_checksum();
        exonet_stack::fragment(&whole[14..], 1500)
            .unwrap()
            .into_iter()
            .map(|f| [&whole[..14], &f[..]].concat())
            .collect()
    };
    let (d1, d2) = (udp(1), udp(2));
    let (pings, _) = ping(3, 3, 4000);
    for f in [&d1[0], &d2[0], &pings[0], &d1[1], &d2[1]] {
        wire.send_batch(&[f]).unwrap();
        mux.poll_rx().unwrap();
    }
    let got = drain_rx(&mut app);
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|(c, _)| *c == ch.0));
    assert_eq!(mux.stats().frag.evicted, 0);
}
