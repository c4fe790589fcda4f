//! The fragment pool: body fragments follow their head to its channel and
//! to no other; early ones wait, bounded in bytes, count and time.

mod common;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;
use exonet_link::memwire::MemWire;
use exonet_link::Link;
use exonet_mux::{frag, ChannelId, FragKind, FragStats, Mux, MuxConfig};
use exonet_shm::AppEndpoint;
use exonet_wire::build::{self, Transport};
use exonet_wire::ethernet::ethertype;
use exonet_wire::ipv4::protocol;
use exonet_wire::rng::SplitMix64;
use exonet_wire::{EthernetRepr, Ipv4Packet, Ipv4Repr, UdpPacket, UdpRepr};
use proptest::prelude::*;

const TIMEOUT: Duration = Duration::from_secs(30);

fn eth() -> EthernetRepr<'static> {
    EthernetRepr {
        dst: HOST_MAC,
        src: PEER_MAC,
        vlans: &[],
        ethertype: ethertype::IPV4,
    }
}

/// One fragment from PEER to HOST carrying `data` at byte `offset`.
fn fragment(proto: u8, ident: u16, offset: u16, more: bool, data: &[u8]) -> Vec<u8> {
    let ip = Ipv4Repr {
        ident,
        dont_frag: false,
        more_frags: more,
        frag_offset: offset,
        ..Ipv4Repr::new(PEER, HOST, proto, data.len())
    };
    let mut f = vec![0; 14 + ip.total_len()];
    eth().emit(&mut f).unwrap();
    ip.emit(&mut f[14..]).unwrap();
    f[34..].copy_from_slice(data);
    f
}

/// The IP payload of a UDP datagram from PEER:7777 to HOST:`dport`.
fn udp_datagram(dport: u16, payload: &[u8]) -> Vec<u8> {
    let l4 = Transport::Udp(UdpRepr {
        src_port: 7777,
        dst_port: dport,
        payload,
    });
    let ip = Ipv4Repr::new(PEER, HOST, protocol::UDP, l4.buffer_len());
    build::ipv4_frame(&eth(), &ip, &l4).unwrap()[34..].to_vec()
}

/// A UDP datagram cut into fragments of at most `chunk` data bytes (a
/// multiple of 8), head first.
fn fragments(dport: u16, ident: u16, payload: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    let data = udp_datagram(dport, payload);
    data.chunks(chunk)
        .enumerate()
        .map(|(k, c)| {
            let offset = k * chunk;
            let more = offset + c.len() < data.len();
            fragment(protocol::UDP, ident, offset as u16, more, c)
        })
        .collect()
}

/// Reassembles the UDP datagram in `frames` (any order, overlaps allowed):
/// its payload, if every byte is there and the checksum verifies.
fn reassemble(frames: &[Vec<u8>]) -> Option<Vec<u8>> {
    let mut data = Vec::new();
    let mut have = Vec::new();
    let mut len = None;
    for f in frames {
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        let off = ip.frag_offset() as usize;
        let p = ip.payload();
        if data.len() < off + p.len() {
            data.resize(off + p.len(), 0);
            have.resize(off + p.len(), false);
        }
        data[off..off + p.len()].copy_from_slice(p);
        have[off..off + p.len()].fill(true);
        if !ip.more_frags() {
            len = Some(off + p.len());
        }
    }
    let len = len?;
    if !have[..len].iter().all(|&b| b) {
        return None;
    }
    let udp = UdpPacket::new_checked(&data[..len]).ok()?;
    udp.verify_checksum(PEER, HOST)
        .then(|| udp.payload().to_vec())
}

fn send_all(wire: &mut MemWire, frames: &[Vec<u8>]) {
    for f in frames {
        assert_eq!(wire.send_batch(&[f]).unwrap(), 1);
    }
}

fn frames_of(got: Vec<(u32, Vec<u8>)>, ch: ChannelId) -> Vec<Vec<u8>> {
    got.into_iter()
        .map(|(c, f)| {
            assert_eq!(c, ch.0);
            f
        })
        .collect()
}

fn frag_stats(mux: &Mux) -> FragStats {
    mux.stats().frag
}

/// Two unprivileged sockets, A on 5000 and B on 6000.
struct Two {
    mux: Mux,
    wire: MemWire,
    a: AppEndpoint,
    b: AppEndpoint,
    ca: ChannelId,
    cb: ChannelId,
}

fn two(config: MuxConfig) -> Two {
    let (mut mux, wire) = mux_with(config);
    let (ea, a, _) = endpoint(&mut mux, 32, false);
    let (eb, b, _) = endpoint(&mut mux, 32, false);
    let (ca, _) = mux.bind_socket(ea, spec(5000)).unwrap();
    let (cb, _) = mux.bind_socket(eb, spec(6000)).unwrap();
    Two {
        mux,
        wire,
        a,
        b,
        ca,
        cb,
    }
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn fragments_in_order_reach_the_socket_complete() {
    let mut t = two(MuxConfig::default());
    let msg = payload(4000);
    let frags = fragments(5000, 0x1234, &msg, 1480);
    assert_eq!(frags.len(), 3);
    assert_eq!(frag::kind(&frags[0]), FragKind::Head);
    assert!(frags[1..].iter().all(|f| frag::kind(f) == FragKind::Body));
    send_all(&mut t.wire, &frags);
    t.mux.poll_rx().unwrap();
    let got = frames_of(drain_rx(&mut t.a), t.ca);
    assert_eq!(got, frags);
    assert_eq!(reassemble(&got), Some(msg));
    assert!(drain_rx(&mut t.b).is_empty());
    let s = t.mux.stats();
    assert_eq!(
        (s.frag.heads, s.frag.bodies_forwarded, s.frag.completed),
        (1, 2, 1)
    );
    // Closed once every byte went through.
    assert_eq!(s.frag.datagrams, 0);
    assert_eq!(s.rx_unmatched, 0);
}

#[test]
fn body_fragments_before_their_head_wait_and_follow_it() {
    let mut t = two(MuxConfig::default());
    let msg = payload(5000);
    let frags = fragments(5000, 7, &msg, 1200);
    assert_eq!(frags.len(), 5);
    // Two bodies in one batch, the head and another body in the next, the
    // last body in a third.
    let t0 = Instant::now();
    send_all(&mut t.wire, &[frags[3].clone(), frags[1].clone()]);
    t.mux.poll_rx_at(t0).unwrap();
    assert!(drain_rx(&mut t.a).is_empty());
    let s = frag_stats(&t.mux);
    assert_eq!((s.held, s.held_frames, s.datagrams), (2, 2, 1));
    assert!(s.held_bytes > 0);
    send_all(
        &mut t.wire,
        &[frags[2].clone(), frags[0].clone(), frags[4].clone()],
    );
    t.mux.poll_rx_at(t0 + Duration::from_secs(1)).unwrap();
    let got = frames_of(drain_rx(&mut t.a), t.ca);
    // Body 2 waited too (its head came later in the batch); the waiting
    // ones follow the head in order of arrival.
    let want = vec![
        frags[0].clone(),
        frags[3].clone(),
        frags[1].clone(),
        frags[2].clone(),
        frags[4].clone(),
    ];
    assert_eq!(got, want);
    assert_eq!(reassemble(&got), Some(msg));
    assert!(drain_rx(&mut t.b).is_empty());
    let s = frag_stats(&t.mux);
    assert_eq!(
        (
            s.held,
            s.bodies_forwarded,
            s.completed,
            s.held_frames,
            s.held_bytes
        ),
        (3, 4, 1, 0, 0)
    );
    assert_eq!(s.datagrams, 0);
}

#[test]
fn fragments_go_only_to_the_channel_of_their_head() {
    let (mut mux, mut wire) = mux();
    let (ea, mut a, _) = endpoint(&mut mux, 32, false);
    let (eb, mut b, _) = endpoint(&mut mux, 32, false);
    // A privileged catch-all: DPF would accept every body fragment for it,
    // yet a body goes where its head went.
    let (ec, mut c, _) = endpoint(&mut mux, 32, true);
    let (ca, _) = mux.bind_socket(ea, spec(5000)).unwrap();
    let (cb, _) = mux.bind_socket(eb, spec(6000)).unwrap();
    let cc = mux
        .bind_channel(ec, &["12:16 == 0x800".parse().unwrap()], Default::default())
        .unwrap();
    let (ma, mb) = (payload(3500), payload(2900));
    let fa = fragments(5000, 100, &ma, 1000);
    let fb = fragments(6000, 200, &mb, 1000);
    // Interleaved, B's bodies first.
    let mut all = Vec::new();
    all.extend(fb[1..].iter().cloned());
    for k in 0..fa.len().max(fb.len()) {
        all.extend(fa.get(k).cloned());
        if k == 0 {
            all.push(fb[0].clone());
        }
    }
    send_all(&mut wire, &all);
    while mux.poll_rx().unwrap() > 0 {}
    let got_a = frames_of(drain_rx(&mut a), ca);
    let got_b = frames_of(drain_rx(&mut b), cb);
    assert_eq!(got_a.len(), fa.len());
    assert_eq!(got_b.len(), fb.len());
    assert_eq!(reassemble(&got_a), Some(ma));
    assert_eq!(reassemble(&got_b), Some(mb));
    assert!(drain_rx(&mut c).is_empty());
    // A whole datagram nobody else claims still reaches the catch-all.
    let other = build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 1, 9999, b"x");
    send_all(&mut wire, std::slice::from_ref(&other));
    mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut c), vec![(cc.0, other)]);
    // The catch-all gets the fragments of a datagram whose head it won.
    let fc = fragments(9999, 300, &payload(2000), 1000);
    send_all(&mut wire, &fc);
    mux.poll_rx().unwrap();
    assert_eq!(frames_of(drain_rx(&mut c), cc), fc);
}

#[test]
fn orphans_are_dropped_after_the_timeout() {
    let mut t = two(MuxConfig::default());
    let frags = fragments(5000, 9, &payload(3000), 1480);
    let t0 = Instant::now();
    send_all(&mut t.wire, &frags[1..]);
    t.mux.poll_rx_at(t0).unwrap();
    t.mux
        .poll_rx_at(t0 + TIMEOUT - Duration::from_secs(1))
        .unwrap();
    let s = frag_stats(&t.mux);
    assert_eq!((s.held_frames, s.orphans_timed_out), (2, 0));
    // An idle poll past the deadline empties the pool.
    t.mux.poll_rx_at(t0 + TIMEOUT).unwrap();
    let s = frag_stats(&t.mux);
    assert_eq!(
        (
            s.held_frames,
            s.held_bytes,
            s.datagrams,
            s.orphans_timed_out
        ),
        (0, 0, 0, 2)
    );
    // The head, too late, comes alone.
    send_all(&mut t.wire, &frags[..1]);
    t.mux.poll_rx_at(t0 + TIMEOUT).unwrap();
    assert_eq!(frames_of(drain_rx(&mut t.a), t.ca), frags[..1].to_vec());
    assert!(drain_rx(&mut t.b).is_empty());
    // Its association lives until its own deadline, then goes too.
    assert_eq!(frag_stats(&t.mux).datagrams, 1);
    t.mux.poll_rx_at(t0 + 2 * TIMEOUT).unwrap();
    assert_eq!(frag_stats(&t.mux).datagrams, 0);
}

#[test]
fn a_head_nobody_accepts_drops_its_bodies() {
    let mut t = two(MuxConfig::default());
    let frags = fragments(7000, 11, &payload(4000), 1000);
    assert_eq!(frags.len(), 5);
    let t0 = Instant::now();
    send_all(&mut t.wire, &frags[2..4]);
    t.mux.poll_rx_at(t0).unwrap();
    assert_eq!(frag_stats(&t.mux).held_frames, 2);
    send_all(&mut t.wire, &frags[..2]);
    t.mux.poll_rx_at(t0).unwrap();
    let s = t.mux.stats();
    assert_eq!(
        (
            s.frag.unmatched_heads,
            s.frag.dropped_unmatched_head,
            s.frag.held_frames
        ),
        (1, 3, 0)
    );
    // The head went to the host like any unclaimed frame.
    assert_eq!(s.rx_unmatched, 1);
    // A later body is dropped at once, not held.
    send_all(&mut t.wire, &frags[4..]);
    t.mux.poll_rx_at(t0).unwrap();
    let s = frag_stats(&t.mux);
    assert_eq!((s.dropped_unmatched_head, s.held), (4, 2));
    assert!(drain_rx(&mut t.a).is_empty() && drain_rx(&mut t.b).is_empty());
}

#[test]
fn an_unbound_channel_gets_no_more_fragments() {
    let (mut mux, mut wire) = mux();
    let (ea, mut a, _) = endpoint(&mut mux, 32, false);
    let (ca, _) = mux.bind_socket(ea, spec(5000)).unwrap();
    let frags = fragments(5000, 5, &payload(3000), 1000);
    send_all(&mut wire, &frags[..2]);
    mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut a).len(), 2);
    mux.unbind_channel(ca).unwrap();
    // Another endpoint now owns the port; the datagram's tail is not its.
    let (eb, mut b, _) = endpoint(&mut mux, 32, false);
    mux.bind_socket(eb, spec(5000)).unwrap();
    send_all(&mut wire, &frags[2..]);
    mux.poll_rx().unwrap();
    assert!(drain_rx(&mut a).is_empty() && drain_rx(&mut b).is_empty());
    assert_eq!(frag_stats(&mux).dropped_unmatched_head, 2);
}

#[test]
fn waiting_fragments_per_datagram_are_bounded() {
    let mut t = two(MuxConfig {
        frag_per_datagram: 4,
        ..MuxConfig::default()
    });
    let frags = fragments(5000, 3, &payload(9000), 800);
    assert_eq!(frags.len(), 12);
    send_all(&mut t.wire, &frags[1..]);
    t.mux.poll_rx().unwrap();
    let s = frag_stats(&t.mux);
    assert_eq!((s.held, s.dropped_too_many), (4, 7));
    send_all(&mut t.wire, &frags[..1]);
    t.mux.poll_rx().unwrap();
    let mut want = vec![frags[0].clone()];
    want.extend(frags[1..5].iter().cloned());
    assert_eq!(frames_of(drain_rx(&mut t.a), t.ca), want);
    assert_eq!(frag_stats(&t.mux).bodies_forwarded, 4);
}

/// A small xorshift, so that floods are varied and reproducible.
#[test]
fn a_flood_of_body_fragments_stays_within_the_bounds() {
    const MEMORY: usize = 32 * 1024;
    const DATAGRAMS: usize = 64;
    let mut t = two(MuxConfig {
        frag_memory: MEMORY,
        frag_datagrams: DATAGRAMS,
        ..MuxConfig::default()
    });
    let mut rng = SplitMix64::new(0x9e37_79b9_7f4a_7c15);
    let t0 = Instant::now();
    let mut sent = 0u64;
    for round in 0..40u64 {
        for _ in 0..64 {
            let ident = rng.next_u64() as u16;
            let offset = (1 + rng.next_u64() % 8000) as u16 * 8;
            let len = 8 * (1 + rng.next_u64() as usize % 180);
            let f = fragment(
                protocol::UDP,
                ident,
                offset,
                rng.next_u64() & 1 == 0,
                &vec![0xee; len],
            );
            t.wire.send_batch(&[&f]).unwrap();
            sent += 1;
        }
        t.mux.poll_rx_at(t0 + Duration::from_millis(round)).unwrap();
        let s = frag_stats(&t.mux);
        assert!(s.held_bytes as usize <= MEMORY, "{s:?}");
        assert!(s.datagrams as usize <= DATAGRAMS, "{s:?}");
        assert_eq!(accounted(&s), sent);
    }
    let s = frag_stats(&t.mux);
    assert!(s.dropped_no_memory > 0 && s.held > 0, "{s:?}");
    // A real datagram still gets through the flood: its head makes room.
    let msg = payload(3000);
    let frags = fragments(5000, 0xbeef, &msg, 1480);
    send_all(&mut t.wire, &frags);
    t.mux.poll_rx_at(t0 + Duration::from_secs(1)).unwrap();
    assert_eq!(reassemble(&frames_of(drain_rx(&mut t.a), t.ca)), Some(msg));
    assert!(drain_rx(&mut t.b).is_empty());
    // After the timeout nothing is left.
    t.mux
        .poll_rx_at(t0 + Duration::from_secs(1) + TIMEOUT)
        .unwrap();
    let s = frag_stats(&t.mux);
    assert_eq!((s.held_bytes, s.held_frames, s.datagrams), (0, 0, 0));
    assert_eq!(
        s.orphans_timed_out + s.dropped_no_memory + s.dropped_too_many,
        sent
    );
}

#[test]
fn impossible_fragments_are_counted_bad() {
    let mut t = two(MuxConfig::default());
    let frags = fragments(5000, 21, &payload(3000), 1000);
    let mut bad_checksum = frags[1].clone();
    bad_checksum[14 + 10] ^= 0xff;
    let mut too_long = frags[1].clone();
    too_long[14 + 2] = 0x40; // total length 16 KiB in a short frame
    let empty = fragment(protocol::UDP, 21, 1000, true, &[]);
    let past_64k = fragment(protocol::UDP, 21, 65_528, false, &[0; 16]);
    let not_multiple_of_8 = fragment(protocol::UDP, 21, 1000, true, &[0; 13]);
    let tcp_overlay = fragment(protocol::TCP, 21, 8, false, &[0; 16]);
    let runt = frags[1][..30].to_vec();
    let bad = [
        bad_checksum,
        too_long,
        empty,
        past_64k,
        not_multiple_of_8,
        tcp_overlay,
        runt,
    ];
    send_all(&mut t.wire, &frags[..1]);
    send_all(&mut t.wire, &bad);
    t.mux.poll_rx().unwrap();
    // The head, and none of the bad bodies (its association was open).
    assert_eq!(drain_rx(&mut t.a).len(), 1);
    let s = frag_stats(&t.mux);
    assert_eq!(
        (s.bad, s.bodies_forwarded, s.held),
        (bad.len() as u64, 0, 0)
    );
    // A bogus head is delivered as the filter says but opens nothing.
    let mut bad_head = fragments(5000, 22, &payload(3000), 1000);
    bad_head[0][14 + 10] ^= 0xff;
    send_all(&mut t.wire, &bad_head);
    t.mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut t.a).len(), 1);
    let s = frag_stats(&t.mux);
    let bodies = bad_head.len() as u64 - 1;
    assert_eq!(
        (s.bad, s.heads, s.held_frames),
        (bad.len() as u64 + 1, 1, bodies)
    );
}

#[test]
fn whole_frames_do_not_touch_the_pool() {
    let mut t = two(MuxConfig::default());
    let f = build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 1, 5000, &[1; 900]);
    assert_eq!(frag::kind(&f), FragKind::Whole);
    send_all(&mut t.wire, std::slice::from_ref(&f));
    t.mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut t.a), vec![(t.ca.0, f)]);
    assert_eq!(frag_stats(&t.mux), FragStats::default());
}

/// One datagram of the random traffic: where it goes, how long, and how
/// it is cut.
#[derive(Clone, Debug)]
struct Datagram {
    port: u16,
    len: usize,
    chunk: usize,
}

fn arb_datagram() -> impl Strategy<Value = Datagram> {
    (
        prop::sample::select(vec![5000u16, 6000, 7000]),
        1usize..6000,
        (1usize..=185).prop_map(|c| c * 8),
    )
        .prop_map(|(port, len, chunk)| Datagram { port, len, chunk })
}

/// A frame that is not part of any datagram above.
#[derive(Clone, Debug)]
enum Junk {
    /// A body fragment of a datagram whose head never comes.
    Body {
        ident: u16,
        proto: u8,
        offset: u16,
        more: bool,
        len: usize,
    },
    /// A head to some port, of a datagram whose bodies never come.
    Head { port: u16, ident: u16, len: usize },
    /// Bytes, as IPv4 with random fragment bits or not.
    Bytes(Vec<u8>, bool),
}

/// Identifications of the random datagrams: one each, so no two of them
/// (to different channels) can be mistaken for each other. Junk heads and
/// junk bodies have identifications of their own, below.
const IDENT_BASE: u16 = 0x4000;
const JUNK_HEADS: u16 = 0x2000;

fn arb_junk() -> impl Strategy<Value = Junk> {
    prop_oneof![
        (
            0u16..JUNK_HEADS,
            prop::sample::select(vec![protocol::UDP, protocol::TCP, 1, 99]),
            0u16..8192,
            any::<bool>(),
            0usize..=1480,
        )
            .prop_map(|(ident, proto, units, more, len)| Junk::Body {
                ident,
                proto,
                offset: units * 8,
                more,
                len,
            }),
        (
            prop::sample::select(vec![5000u16, 6000, 7000]),
            JUNK_HEADS..IDENT_BASE,
            1usize..1400
        )
            .prop_map(|(port, ident, len)| Junk::Head { port, ident, len }),
        (prop::collection::vec(any::<u8>(), 0..120), any::<bool>())
            .prop_map(|(b, ip)| Junk::Bytes(b, ip)),
    ]
}

impl Junk {
    fn frame(&self) -> Vec<u8> {
        match self {
            Junk::Body {
                ident,
                proto,
                offset,
                more,
                len,
            } => fragment(*proto, *ident, (*offset).max(8), *more, &vec![0xab; *len]),
            // Junk heads carry a payload the test does not reassemble.
            Junk::Head { port, ident, len } => {
                let data = udp_datagram(*port, &vec![0xcd; *len]);
                let cut = (data.len() / 8).max(1) * 8;
                fragment(protocol::UDP, *ident, 0, true, &data[..cut.min(data.len())])
            }
            Junk::Bytes(b, ip) => {
                let mut f = b.clone();
                if *ip && f.len() >= 22 {
                    f[12..14].copy_from_slice(&[0x08, 0x00]);
                }
                f
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_fragment_traffic_keeps_the_invariants(
        datagrams in prop::collection::vec(arb_datagram(), 1..12),
        junk in prop::collection::vec(arb_junk(), 0..120),
        order in prop::collection::vec(any::<u32>(), 400),
        lost in prop::collection::vec(any::<u8>(), 400),
        cuts in prop::collection::vec((1usize..40, 0u64..12_000), 1..30),
        memory in 0usize..40_000,
        per_datagram in 0usize..20,
        max_datagrams in 0usize..24,
    ) {
        let config = MuxConfig {
            frag_memory: memory,
            frag_per_datagram: per_datagram,
            frag_datagrams: max_datagrams,
            frag_timeout: Duration::from_secs(10),
            ..MuxConfig::default()
        };
        let mut t = two(config);
        // Every frame with the channel it may reach (None: no channel).
        let mut frames: Vec<(Vec<u8>, Option<ChannelId>)> = Vec::new();
        let mut dest = BTreeMap::new();
        for (k, d) in datagrams.iter().enumerate() {
            let ident = IDENT_BASE + k as u16;
            let ch = match d.port {
                5000 => Some(t.ca),
                6000 => Some(t.cb),
                _ => None,
            };
            dest.insert(ident, ch);
            for f in fragments(d.port, ident, &payload(d.len), d.chunk) {
                frames.push((f, ch));
            }
        }
        for j in &junk {
            let f = j.frame();
            let ch = match j {
                Junk::Head { port: 5000, .. } => Some(t.ca),
                Junk::Head { port: 6000, .. } => Some(t.cb),
                _ => None,
            };
            frames.push((f, ch));
        }
        // Shuffle, lose some, duplicate some.
        let mut keyed: Vec<_> = frames
            .into_iter()
            .enumerate()
            .map(|(i, f)| (order[i % order.len()], i, f))
            .collect();
        keyed.sort_by_key(|&(k, i, _)| (k, i));
        let mut feed = Vec::new();
        for (n, (_, _, f)) in keyed.into_iter().enumerate() {
            match lost[n % lost.len()] {
                0..=12 => {}
                13..=20 => {
                    feed.push(f.clone());
                    feed.push(f);
                }
                _ => feed.push(f),
            }
        }
        let fragments_fed = feed
            .iter()
            .filter(|(f, _)| frag::kind(f) != FragKind::Whole)
            .count() as u64;
        let t0 = Instant::now();
        let mut clock = t0;
        let mut rest = &feed[..];
        let mut cut = cuts.iter().cycle();
        while !rest.is_empty() {
            let &(n, ms) = cut.next().unwrap();
            let (batch, tail) = rest.split_at(n.min(rest.len()));
            rest = tail;
            for (f, _) in batch {
                t.wire.send_batch(&[f]).unwrap();
            }
            clock += Duration::from_millis(ms);
            while t.mux.poll_rx_at(clock).unwrap() > 0 {}
            let s = frag_stats(&t.mux);
            prop_assert!(s.held_bytes as usize <= memory, "{:?}", s);
            prop_assert!(s.datagrams as usize <= max_datagrams.max(1), "{:?}", s);
            for (app, ch) in [(&mut t.a, t.ca), (&mut t.b, t.cb)] {
                for (c, f) in drain_rx(app) {
                    prop_assert_eq!(c, ch.0);
                    // Only fragments of datagrams, or junk heads, sent to
                    // this channel: never junk bodies, never another's.
                    let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
                    let ok = match dest.get(&ip.ident()) {
                        Some(&want) => want == Some(ch),
                        None => feed.iter().any(|(g, to)| *g == f && *to == Some(ch)),
                    };
                    prop_assert!(ok, "frame with ident {} on channel {}", ip.ident(), c);
                }
            }
            prop_assert_eq!(t.mux.stats().rx_truncated, 0);
        }
        let s = frag_stats(&t.mux);
        prop_assert_eq!(accounted(&s), fragments_fed);
        t.mux.poll_rx_at(clock + Duration::from_secs(10)).unwrap();
        let s = frag_stats(&t.mux);
        prop_assert_eq!((s.held_bytes, s.held_frames, s.datagrams), (0, 0, 0));
        prop_assert_eq!(accounted(&s), fragments_fed);
    }
}

#[test]
fn addresses_in_the_key_separate_datagrams() {
    // Same identification from another source: another datagram.
    let mut t = two(MuxConfig::default());
    let frags = fragments(5000, 77, &payload(3000), 1480);
    let mut stranger = frags[1].clone();
    let mut ip = Ipv4Packet::new_unchecked(&mut stranger[14..]);
    ip.set_src_addr(Ipv4Addr::new(10, 0, 0, 66));
    ip.fill_checksum();
    send_all(&mut t.wire, &[frags[0].clone(), stranger]);
    t.mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut t.a).len(), 1);
    assert_eq!(frag_stats(&t.mux).held_frames, 1);
}

/// Every fragment is counted once, or is still waiting.
fn accounted(s: &FragStats) -> u64 {
    s.heads
        + s.unmatched_heads
        + s.host_heads
        + s.bad
        + s.bodies_forwarded
        + s.orphans_timed_out
        + s.dropped_no_memory
        + s.dropped_too_many
        + s.dropped_unmatched_head
        + s.held_frames
}
