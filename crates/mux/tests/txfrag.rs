//! Fragmented datagrams sent by applications: held to their head's
//! template, and identified by the multiplexer.

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;
use exonet_mux::{ChannelId, ChannelSpec, MuxConfig, Proto};
use exonet_shm::{AppEndpoint, Desc};
use exonet_wire::build;
use exonet_wire::ipv4::protocol;
use exonet_wire::Ipv4Packet;

/// A UDP datagram from HOST:`sport` to PEER:53 with IP identification
/// `ident` and `len` bytes of payload, cut by `exonet_stack::fragment` into
/// frames that fit the link's MTU (1500), head first. Also the whole
/// datagram, to compare with.
fn fragmented(sport: u16, ident: u16, len: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
    let payload: Vec<u8> = (0..len).map(|i| (i * 7 + sport as usize) as u8).collect();
    let whole = build::udp_frame(HOST_MAC, PEER_MAC, HOST, PEER, sport, 53, &payload);
    fragments_of(whole, ident)
}

/// Sends `frames` on `channel`, one buffer each from `bufs`, and returns the
/// completions.
fn send_frames(
    mux: &mut exonet_mux::Mux,
    app: &mut AppEndpoint,
    bufs: &[u32],
    channel: ChannelId,
    frames: &[Vec<u8>],
) -> Vec<Desc> {
    assert!(frames.len() <= bufs.len());
    for (f, &b) in frames.iter().zip(bufs) {
        send(app, b, f, channel.0);
    }
    while mux.poll_tx().unwrap() > 0 {}
    completions(app)
}

#[test]
fn a_fragmented_datagram_leaves_with_one_fresh_id_and_reassembles() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, bufs) = endpoint(&mut mux, 8, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let (frames, whole) = fragmented(5000, 0x4242, 20_000);
    assert_eq!(frames.len(), 14);
    let done = send_frames(&mut mux, &mut app, &bufs, ch, &frames);
    assert!(done.iter().all(|d| d.flags & Desc::REJECTED == 0));
    let got = drain_wire(&mut wire);
    assert_eq!(got.len(), frames.len());
    let ids: Vec<(u16, bool)> = got.iter().map(|f| ident_of(f)).collect();
    assert!(ids.iter().all(|&(id, ok)| id == ids[0].0 && ok), "{ids:?}");
    // Only the identification and the header checksum changed.
    for (sent, out) in frames.iter().zip(&got) {
        assert_eq!(sent[..18], out[..18]);
        assert_eq!(sent[20..24], out[20..24]);
        assert_eq!(sent[26..], out[26..]);
    }
    assert_eq!(reassemble(&got), whole[34..]);
    // The next datagram gets another identification, even with the same
    // application id; an unfragmented one keeps its own.
    let (again, _) = fragmented(5000, 0x4242, 3000);
    send_frames(&mut mux, &mut app, &bufs, ch, &again);
    let got2 = drain_wire(&mut wire);
    assert_eq!(got2.len(), 3);
    assert!(got2
        .iter()
        .all(|f| ident_of(f) == (ident_of(&got2[0]).0, true)));
    assert_ne!(ident_of(&got2[0]).0, ids[0].0);
    let (small, _) = fragmented(5000, 0x4242, 100);
    send_frames(&mut mux, &mut app, &bufs, ch, &small);
    assert_eq!(drain_wire(&mut wire), small);
    let s = mux.endpoint_stats(a).unwrap();
    assert_eq!((s.tx_frames, s.tx_dropped()), (18, 0));
}

#[test]
fn a_body_fragment_without_its_head_is_dropped() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, bufs) = endpoint(&mut mux, 8, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let (frames, _) = fragmented(5000, 9, 4000);
    let done = send_frames(&mut mux, &mut app, &bufs, ch, &frames[1..]);
    assert!(done.iter().all(|d| d.flags & Desc::REJECTED != 0));
    assert!(drain_wire(&mut wire).is_empty());
    let s = mux.endpoint_stats(a).unwrap();
    assert_eq!((s.tx_frag_no_head, s.tx_template_mismatch), (2, 0));
    assert_eq!(mux.channel_stats(ch).unwrap().tx_frag_no_head, 2);
    // Sent late, the head does not bring them back: the library sends it
    // first.
    send_frames(&mut mux, &mut app, &bufs, ch, &frames[..1]);
    assert_eq!(drain_wire(&mut wire).len(), 1);
}

#[test]
fn body_fragments_of_one_endpoint_cannot_join_anothers_datagram() {
    let (mut mux, mut wire) = mux();
    let (a, mut app_a, bufs_a) = endpoint(&mut mux, 8, false);
    let (b, mut app_b, bufs_b) = endpoint(&mut mux, 8, false);
    let (ca, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let (cb, _) = mux.bind_socket(b, spec(6000)).unwrap();
    let (frames_a, whole_a) = fragmented(5000, 77, 4000);
    send_frames(&mut mux, &mut app_a, &bufs_a, ca, &frames_a[..1]);
    // B forges a body fragment of the same (destination, id), with its own
    // addresses: it passes B's template, but B sent no such head.
    let mut forged = frames_a[1].clone();
    forged[40..].fill(0xee);
    let done = send_frames(&mut mux, &mut app_b, &bufs_b, cb, &[forged]);
    assert_eq!(done[0].flags & Desc::REJECTED, Desc::REJECTED);
    assert_eq!(mux.endpoint_stats(b).unwrap().tx_frag_no_head, 1);
    // B's own head under the same application id gets its own association.
    let (frames_b, _) = fragmented(6000, 77, 4000);
    send_frames(&mut mux, &mut app_b, &bufs_b, cb, &frames_b[..1]);
    send_frames(&mut mux, &mut app_a, &bufs_a, ca, &frames_a[1..]);
    let got = drain_wire(&mut wire);
    assert_eq!(got.len(), 4);
    let id_a = ident_of(&got[0]).0;
    let of_a: Vec<Vec<u8>> = got
        .iter()
        .filter(|f| ident_of(f).0 == id_a)
        .cloned()
        .collect();
    assert_eq!(of_a.len(), 3);
    assert_eq!(reassemble(&of_a), whole_a[34..]);
}

#[test]
fn two_applications_with_the_same_id_get_different_ids_on_the_wire() {
    let (mut mux, mut wire) = mux();
    let (a, mut app_a, bufs_a) = endpoint(&mut mux, 8, false);
    let (b, mut app_b, bufs_b) = endpoint(&mut mux, 8, false);
    let (ca, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let (cb, _) = mux.bind_socket(b, spec(6000)).unwrap();
    let (frames_a, whole_a) = fragmented(5000, 1, 3000);
    let (frames_b, whole_b) = fragmented(6000, 1, 3000);
    // Interleaved: A's head, B's head, then the bodies.
    send_frames(&mut mux, &mut app_a, &bufs_a, ca, &frames_a[..1]);
    send_frames(&mut mux, &mut app_b, &bufs_b, cb, &frames_b[..1]);
    send_frames(&mut mux, &mut app_a, &bufs_a, ca, &frames_a[1..]);
    send_frames(&mut mux, &mut app_b, &bufs_b, cb, &frames_b[1..]);
    let got = drain_wire(&mut wire);
    assert_eq!(got.len(), 6);
    let (id_a, id_b) = (ident_of(&got[0]).0, ident_of(&got[1]).0);
    assert_ne!(id_a, id_b);
    let pick = |id| -> Vec<Vec<u8>> {
        got.iter()
            .filter(|f| ident_of(f) == (id, true))
            .cloned()
            .collect()
    };
    assert_eq!(reassemble(&pick(id_a)), whole_a[34..]);
    assert_eq!(reassemble(&pick(id_b)), whole_b[34..]);
}

#[test]
fn forged_body_fragments_fail_the_template() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, bufs) = endpoint(&mut mux, 8, false);
    let remote = ChannelSpec {
        remote: Some((PEER, 53)),
        ..spec(5000)
    };
    let (ch, _) = mux.bind_socket(a, remote).unwrap();
    let (frames, _) = fragmented(5000, 5, 4000);
    send_frames(&mut mux, &mut app, &bufs, ch, &frames[..1]);
    let body = &frames[1];
    let forge = |at: usize, bytes: &[u8]| {
        let mut f = body.clone();
        f[at..at + bytes.len()].copy_from_slice(bytes);
        let mut ip = Ipv4Packet::new_unchecked(&mut f[14..]);
        ip.fill_checksum();
        f
    };
    let forged = [
        forge(26, &Ipv4Addr::new(10, 0, 0, 9).octets()),
        forge(23, &[protocol::TCP]),
        // Another destination: not the connected remote.
        forge(30, &Ipv4Addr::new(10, 0, 0, 9).octets()),
        forge(6, &[2, 0, 0, 0, 0, 9]),
        // IP options would move the transport header.
        forge(14, &[0x46]),
        body[..30].to_vec(),
    ];
    let done = send_frames(&mut mux, &mut app, &bufs, ch, &forged);
    assert!(done.iter().all(|d| d.flags & Desc::REJECTED != 0));
    assert_eq!(drain_wire(&mut wire).len(), 1, "only the head");
    let s = mux.endpoint_stats(a).unwrap();
    assert_eq!((s.tx_template_mismatch, s.tx_frag_no_head), (6, 0));
    // The real ones still go.
    send_frames(&mut mux, &mut app, &bufs, ch, &frames[1..]);
    assert_eq!(drain_wire(&mut wire).len(), 2);
}

#[test]
fn associations_expire_and_are_bounded_per_channel() {
    let (mut mux, mut wire) = mux_with(MuxConfig {
        tx_frag_datagrams: 2,
        tx_frag_timeout: Duration::from_secs(5),
        ..MuxConfig::default()
    });
    let (a, mut app, bufs) = endpoint(&mut mux, 8, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let t0 = Instant::now();
    let datagrams: Vec<Vec<Vec<u8>>> = (1..=3).map(|id| fragmented(5000, id, 2000).0).collect();
    let mut tx_at = |frames: &[Vec<u8>], t: Instant| {
        for (f, &b) in frames.iter().zip(&bufs) {
            send(&mut app, b, f, ch.0);
        }
        while mux.poll_tx_at(t).unwrap() > 0 {}
        completions(&mut app);
    };
    for d in &datagrams {
        tx_at(&d[..1], t0);
    }
    // The third head evicted the first's association.
    tx_at(&datagrams[0][1..], t0);
    tx_at(&datagrams[1][1..], t0 + Duration::from_secs(4));
    // Five seconds after its head, the third's has expired.
    tx_at(&datagrams[2][1..], t0 + Duration::from_secs(5));
    assert_eq!(drain_wire(&mut wire).len(), 4);
    assert_eq!(mux.endpoint_stats(a).unwrap().tx_frag_no_head, 2);
}

#[test]
fn echo_sockets_may_send_fragmented_requests() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, bufs) = endpoint(&mut mux, 8, false);
    let echo = ChannelSpec {
        proto: Proto::Icmp,
        ..spec(900)
    };
    let (ch, ident) = mux.bind_socket(a, echo).unwrap();
    let data = vec![0x5a; 4000];
    let mut whole = build::icmp_echo(HOST_MAC, PEER_MAC, HOST, PEER, ident, 1, &data);
    let mut ip = Ipv4Packet::new_unchecked(&mut whole[14..]);
    ip.set_frag(false, false, 0);
    ip.fill_checksum();
    let frames: Vec<Vec<u8>> = exonet_stack::fragment(&whole[14..], 1500)
        .unwrap()
        .into_iter()
        .map(|f| [&whole[..14], &f[..]].concat())
        .collect();
    send_frames(&mut mux, &mut app, &bufs, ch, &frames);
    let got = drain_wire(&mut wire);
    assert_eq!(got.len(), 3);
    assert_eq!(reassemble(&got), whole[34..]);
}
