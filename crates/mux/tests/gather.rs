//! Multi-part transmit frames (`Desc::MORE`): a chain reaches the wire as
//! the same bytes sent in one piece would; malformed chains are consumed
//! whole, counted and never sent, even in part; the template is checked on
//! the gathered frame.

mod common;

use common::*;
use exonet_link::memwire::MemWire;
use exonet_mux::{ChannelId, EndpointId, Mux, MuxConfig};
use exonet_shm::{AppEndpoint, Desc, Part, INLINE_MAX, MAX_PARTS};
use exonet_wire::build;
use proptest::prelude::*;

/// A UDP frame from port 5000 of the host to the peer.
fn udp_from(payload: &[u8]) -> Vec<u8> {
    build::udp_frame(HOST_MAC, PEER_MAC, HOST, PEER, 5000, 7777, payload)
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

/// A multiplexer with one endpoint (all its buffers kept for sending) and
/// a UDP channel on port 5000.
struct Fixture {
    mux: Mux,
    wire: MemWire,
    id: EndpointId,
    app: AppEndpoint,
    bufs: Vec<u32>,
    ch: u32,
}

fn fixture() -> Fixture {
    fixture_with(MuxConfig::default())
}

fn fixture_with(config: MuxConfig) -> Fixture {
    let (mut mux, wire) = mux_with(config);
    let (id, app, bufs) = endpoint(&mut mux, 0, false);
    let (ChannelId(ch), _) = mux.bind_socket(id, spec(5000)).unwrap();
    Fixture {
        mux,
        wire,
        id,
        app,
        bufs,
        ch,
    }
}

impl Fixture {
    /// Writes `bytes` at `offset` of the frame area, across buffers if need
    /// be, and names them as a later part.
    fn area(&self, offset: u32, bytes: &[u8]) -> Part<'static> {
        self.app.frames.write_area(offset, bytes).unwrap();
        Part::Area {
            offset,
            len: bytes.len() as u32,
        }
    }

    /// Pushes raw descriptors (a hostile application's), published at once.
    fn push_raw(&mut self, descs: &[Desc]) {
        let n = descs.len() as u32;
        assert_eq!(self.app.tx.reserve(n).unwrap(), n);
        for (i, &d) in (0..).zip(descs) {
            self.app.tx.write(i, d);
        }
        self.app.tx.submit(n);
    }

    fn drain(&mut self) -> Vec<Vec<u8>> {
        while self.mux.poll_tx().unwrap() > 0 {}
        drain_wire(&mut self.wire)
    }

    fn stats(&self) -> exonet_mux::EndpointStats {
        self.mux.endpoint_stats(self.id).unwrap()
    }
}

#[test]
fn chains_reach_the_wire_as_the_frame_in_one_piece() {
    let mut fx = fixture();
    let frame = udp_from(&payload(1000));
    let (header, body) = frame.split_at(42);
    // One piece, for comparison.
    send(&mut fx.app, fx.bufs[0], &frame, fx.ch);
    // An inline header and the payload in a buffer, with headroom.
    let body_part = fx.area(fx.bufs[1] + 100, body);
    assert!(fx
        .app
        .tx
        .push_chain(fx.ch, &[Part::Inline(header), body_part])
        .unwrap());
    // Three parts: the header in a buffer, the payload in two pieces, the
    // second before the first in the segment.
    fx.app.frames.write(fx.bufs[2] + 64, header).unwrap();
    let (a, b) = body.split_at(300);
    let parts = [
        Part::Area {
            offset: fx.bufs[2] + 64,
            len: 42,
        },
        fx.area(fx.bufs[4] + 7, a),
        fx.area(fx.bufs[3], b),
    ];
    assert!(fx.app.tx.push_chain(fx.ch, &parts).unwrap());
    let sent = fx.drain();
    assert_eq!(sent, vec![frame.clone(), frame.clone(), frame.clone()]);
    let s = fx.stats();
    assert_eq!((s.tx_frames, s.tx_bytes, s.tx_dropped()), (3, 3 * 1042, 0));
    // One completion per buffer frame: the one piece's buffer; the chain
    // with an inline header, the buffer its payload starts in; the chain
    // with a buffer header, the header's buffer; each with the whole length.
    let c = completions(&mut fx.app);
    let want = |offset, flags| Desc {
        offset,
        len: 1042,
        channel: fx.ch,
        flags,
    };
    assert_eq!(
        c,
        vec![
            want(fx.bufs[0], 0),
            want(fx.bufs[1], Desc::CHAIN),
            want(fx.bufs[2], Desc::CHAIN),
        ]
    );
    assert!(c[1].is_chain() && !c[0].is_chain());
}

#[test]
fn a_part_may_span_frame_buffers() {
    let mut fx = fixture();
    let frame = udp_from(&payload(1400));
    let (header, body) = frame.split_at(42);
    // 1400 bytes from 48 bytes before the end of buffer 5 run well into
    // buffer 6.
    let start = fx.bufs[6] - 48;
    let part = fx.area(start, body);
    assert!(fx
        .app
        .tx
        .push_chain(fx.ch, &[Part::Inline(header), part])
        .unwrap());
    assert_eq!(fx.drain(), vec![frame]);
    let c = completions(&mut fx.app);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].offset, c[0].flags), (fx.bufs[5], Desc::CHAIN));
}

/// A chain whose end is not published yet is left alone, however often
/// the multiplexer looks, and goes whole once it is.
#[test]
fn a_chain_published_in_two_steps_is_not_sent_half() {
    let mut fx = fixture();
    let ch = fx.ch;
    let frame = udp_from(&payload(500));
    fx.app.frames.write_area(fx.bufs[0], &frame).unwrap();
    let part = |offset, len, flags| Desc {
        offset,
        len,
        channel: ch,
        flags,
    };
    fx.push_raw(&[
        part(fx.bufs[0], 100, Desc::MORE),
        part(fx.bufs[0] + 100, 200, Desc::MORE),
    ]);
    for _ in 0..3 {
        assert_eq!(fx.mux.poll_tx().unwrap(), 0);
    }
    assert!(drain_wire(&mut fx.wire).is_empty());
    assert_eq!(fx.app.tx.outstanding(), 2, "nothing consumed");
    assert!(completions(&mut fx.app).is_empty());
    assert_eq!(fx.stats().tx_dropped(), 0);
    // Half a chain is no work: the multiplexer would sleep rather than
    // spin on it (its wait finds nothing ready).
    assert!(!fx.mux.wait(std::time::Duration::from_millis(5)).unwrap());
    fx.push_raw(&[part(fx.bufs[0] + 300, 242, 0)]);
    assert!(
        fx.mux.wait(std::time::Duration::ZERO).unwrap(),
        "the end is work"
    );
    assert_eq!(fx.drain(), vec![frame]);
    assert_eq!(fx.app.tx.outstanding(), 0);
}

/// A chain that runs past the end of a peek is read again from its start
/// in the next one, not cut: a budget of five descriptors per scan makes
/// the peeks end inside chains of three.
#[test]
fn chains_across_batches_stay_whole() {
    let mut fx = fixture_with(MuxConfig {
        tx_budget: 5,
        ..MuxConfig::default()
    });
    let frames: Vec<Vec<u8>> = (0..20).map(|i| udp_from(&payload(100 + i))).collect();
    for (f, &buf) in frames.iter().zip(&fx.bufs) {
        let parts = [
            Part::Inline(&f[..42]),
            fx.area(buf, &f[42..72]),
            fx.area(buf + 1024, &f[72..]),
        ];
        assert!(fx.app.tx.push_chain(fx.ch, &parts).unwrap());
    }
    let mut sent = Vec::new();
    for _ in 0..40 {
        fx.mux.poll_tx().unwrap();
        sent.extend(drain_wire(&mut fx.wire));
    }
    assert_eq!(sent, frames);
    assert_eq!(fx.stats().tx_dropped(), 0);
}

/// Every malformed chain is consumed whole, counted once in `tx_bad_chain`
/// and not sent, not even in part; what follows it is sent as usual.
#[test]
fn malformed_chains_are_counted_and_never_sent() {
    let mut fx = fixture();
    let (ChannelId(other), _) = fx.mux.bind_socket(fx.id, spec(6000)).unwrap();
    let (b, _app_b, _) = endpoint(&mut fx.mux, 0, false);
    let (ChannelId(theirs), _) = fx.mux.bind_socket(b, spec(7000)).unwrap();
    let frame = udp_from(&payload(600));
    let (f, ch) = (fx.bufs[0], fx.ch);
    fx.app.frames.write_area(f, &frame).unwrap();
    let end = fx.app.frames.layout().frames_offset() as u32 + 64 * 2048;
    let part = |offset, len, flags| Desc {
        offset,
        len,
        channel: ch,
        flags,
    };
    let more = Desc::MORE;
    let good = || {
        vec![
            part(f, 42, more),
            part(f + 42, 300, more),
            part(f + 342, 300, 0),
        ]
    };
    let bad: Vec<(&str, Vec<Desc>)> = vec![
        (
            "parts on two channels",
            vec![
                part(f, 42, more),
                Desc {
                    channel: other,
                    ..part(f + 42, 600, 0)
                },
            ],
        ),
        (
            "a later part inline",
            vec![part(f, 42, more), part(0, 100, Desc::INLINE)],
        ),
        (
            "an inline head too long",
            vec![
                part(0, INLINE_MAX as u32 + 1, Desc::INLINE | more),
                part(f, 100, 0),
            ],
        ),
        (
            "a head across buffers",
            vec![part(f + 2000, 100, more), part(f, 100, 0)],
        ),
        (
            "a later part past the frame area",
            vec![part(f, 42, more), part(end - 100, 101, 0)],
        ),
        (
            "a later part before the frame area",
            vec![part(f, 42, more), part(f - 4096, 600, 0)],
        ),
        (
            "a later part at the far end of u32",
            vec![part(f, 42, more), part(u32::MAX, u32::MAX, 0)],
        ),
        (
            "unknown flags on a later part",
            vec![part(f, 42, more), part(f + 42, 600, 0x100)],
        ),
        (
            "longer in all than the link's frames",
            vec![part(f, 1000, more), part(f, 519, 0)],
        ),
        (
            "lengths that overflow 32 bits",
            vec![
                part(f, 42, more),
                part(f, u32::MAX - 10, more),
                part(f, 100, 0),
            ],
        ),
    ];
    for (i, (what, chain)) in (1..).zip(&bad) {
        fx.push_raw(chain);
        fx.push_raw(&good());
        assert_eq!(
            fx.drain(),
            vec![frame.clone()],
            "{what}: only the good frame"
        );
        let s = fx.stats();
        assert_eq!(
            (s.tx_bad_chain, s.tx_dropped(), s.tx_frames),
            (i, i, i),
            "{what}"
        );
        assert_eq!(fx.app.tx.outstanding(), 0, "{what}: consumed");
        let c = completions(&mut fx.app);
        assert_eq!(c.len(), 2, "{what}: {c:?}");
        assert_eq!(c[0].flags, Desc::CHAIN | Desc::REJECTED, "{what}");
        assert_eq!(c[1].flags, Desc::CHAIN, "{what}");
    }
    // Another endpoint's channel: refused as on a one-part frame.
    let theirs: Vec<Desc> = good()
        .iter()
        .map(|d| Desc {
            channel: theirs,
            ..*d
        })
        .collect();
    fx.push_raw(&theirs);
    assert!(fx.drain().is_empty());
    assert_eq!(fx.stats().tx_bad_channel, 1);
    let c = completions(&mut fx.app);
    assert_eq!(c[0].flags, Desc::CHAIN | Desc::REJECTED);
}

/// A chain that has not ended after MAX_PARTS descriptors is rejected with
/// the rest of it, however long (here the whole ring, in several scans),
/// up to its next descriptor without MORE; nothing of it is sent.
#[test]
fn chains_too_long_are_rejected_to_their_end() {
    let mut fx = fixture();
    let ch = fx.ch;
    let frame = udp_from(&payload(600));
    let f = fx.bufs[0];
    fx.app.frames.write_area(f, &frame).unwrap();
    let part = |len, flags| Desc {
        offset: f,
        len,
        channel: ch,
        flags,
    };
    // MAX_PARTS + 1 parts: the last would end it.
    let mut long = vec![part(20, Desc::MORE); MAX_PARTS];
    long.push(part(22, 0));
    fx.push_raw(&long);
    fx.push_raw(&[part(642, 0)]);
    assert_eq!(fx.drain(), vec![frame.clone()]);
    assert_eq!((fx.stats().tx_bad_chain, fx.stats().tx_dropped()), (1, 1));
    // A ring full of MORE: one rejected chain, every entry consumed; the
    // chain's end, when it comes, is consumed too, and only then does a
    // frame go again.
    let entries = fx.app.tx.entries() as usize;
    fx.push_raw(&vec![part(20, Desc::MORE); entries]);
    assert!(fx.drain().is_empty());
    assert_eq!(fx.app.tx.outstanding(), 0);
    fx.push_raw(&[part(642, 0)]);
    assert!(fx.drain().is_empty(), "the end of the rejected chain");
    fx.push_raw(&[part(642, 0)]);
    assert_eq!(fx.drain(), vec![frame]);
    let s = fx.stats();
    assert_eq!((s.tx_frames, s.tx_bad_chain, s.tx_dropped()), (2, 2, 2));
    let c = completions(&mut fx.app);
    let rejected: Vec<u32> = c.iter().map(|d| d.flags).collect();
    assert_eq!(
        rejected,
        vec![
            Desc::CHAIN | Desc::REJECTED,
            0,
            Desc::CHAIN | Desc::REJECTED,
            0
        ]
    );
}

/// The template sees the gathered frame: headers split across parts are
/// checked as a whole, and a later part cannot bring in a header of its own.
#[test]
fn the_template_checks_the_gathered_frame() {
    let mut fx = fixture();
    let good = udp_from(&payload(200));
    let wrong_port = build::udp_frame(HOST_MAC, PEER_MAC, HOST, PEER, 5001, 7777, &payload(200));
    for (frame, &buf) in [&good, &wrong_port].into_iter().zip(&fx.bufs) {
        // Cut inside the IP header, then inside the UDP header.
        let parts = [
            Part::Inline(&frame[..20]),
            fx.area(buf, &frame[20..35]),
            fx.area(buf + 1024, &frame[35..]),
        ];
        assert!(fx.app.tx.push_chain(fx.ch, &parts).unwrap());
    }
    // A good header inline, then a whole frame as "payload": the header in
    // front is what is checked and what the network sees; the other stays
    // payload.
    let parts = [Part::Inline(&good[..42]), fx.area(fx.bufs[2], &wrong_port)];
    assert!(fx.app.tx.push_chain(fx.ch, &parts).unwrap());
    let carried = [&good[..42], &wrong_port[..]].concat();
    // Only an Ethernet header in front: the forged IP and UDP headers of
    // the second part are the frame's, and fail.
    let parts = [
        Part::Inline(&wrong_port[..14]),
        fx.area(fx.bufs[3], &wrong_port[14..]),
    ];
    assert!(fx.app.tx.push_chain(fx.ch, &parts).unwrap());
    assert_eq!(fx.drain(), vec![good.clone(), carried]);
    let s = fx.stats();
    assert_eq!(
        (s.tx_frames, s.tx_template_mismatch, s.tx_dropped()),
        (2, 2, 2)
    );
    let flags: Vec<u32> = completions(&mut fx.app).iter().map(|d| d.flags).collect();
    let rejected = Desc::CHAIN | Desc::REJECTED;
    assert_eq!(flags, vec![Desc::CHAIN, rejected, Desc::CHAIN, rejected]);
}

/// Deficit round robin charges a chain its whole length, not its head's:
/// an endpoint sending 1000-byte frames as a 42-byte inline header and a
/// payload part gets the bandwidth of one sending them in one piece.
#[test]
fn drr_charges_the_whole_chain() {
    // A quantum of one frame, and a scan that ends with both backlogged.
    let (mut mux, mut wire) = mux_with(MuxConfig {
        tx_budget: 30,
        quantum: 1000,
        ..MuxConfig::default()
    });
    let frame = udp_from(&payload(958));
    assert_eq!(frame.len(), 1000);
    let (a, mut app_a, bufs_a) = endpoint(&mut mux, 0, false);
    let (ChannelId(ca), _) = mux.bind_socket(a, spec(5000)).unwrap();
    let (b, mut app_b, bufs_b) = endpoint(&mut mux, 0, false);
    let (ChannelId(cb), _) = mux.bind_socket(b, spec(6000)).unwrap();
    let frame_b = build::udp_frame(HOST_MAC, PEER_MAC, HOST, PEER, 6000, 7777, &payload(958));
    for &buf in bufs_a.iter().take(30) {
        app_a.frames.write(buf, &frame[42..]).unwrap();
        let parts = [
            Part::Inline(&frame[..42]),
            Part::Area {
                offset: buf,
                len: 958,
            },
        ];
        assert!(app_a.tx.push_chain(ca, &parts).unwrap());
    }
    for &buf in bufs_b.iter().take(60) {
        send(&mut app_b, buf, &frame_b, cb);
    }
    mux.poll_tx().unwrap();
    drain_wire(&mut wire);
    let (sa, sb) = (
        mux.endpoint_stats(a).unwrap(),
        mux.endpoint_stats(b).unwrap(),
    );
    // A frame each per round, A's taking two descriptors: ten rounds.
    assert_eq!((sa.tx_frames, sb.tx_frames), (10, 10), "{sa:?} {sb:?}");
}

/// How a frame is cut into a chain: the inline head's length (if inline),
/// the cut points, and where each later part goes.
#[derive(Debug, Clone)]
struct Cut {
    inline_head: bool,
    cuts: Vec<usize>,
    headroom: u32,
    places: Vec<u32>,
    corrupt: Option<(usize, u8)>,
}

fn arb_cut() -> impl Strategy<Value = (usize, Cut)> {
    (
        0usize..1477,
        any::<bool>(),
        proptest::collection::vec(any::<prop::sample::Index>(), 0..MAX_PARTS),
        0u32..2048,
        proptest::collection::vec(0u32..30_000, MAX_PARTS),
        proptest::option::of((0usize..42, 1u8..=255)),
    )
        .prop_map(|(n, inline_head, cuts, headroom, places, corrupt)| {
            let len = 42 + n;
            let mut cuts: Vec<usize> = cuts.iter().map(|i| 1 + i.index(len - 1)).collect();
            cuts.sort_unstable();
            cuts.dedup();
            (
                n,
                Cut {
                    inline_head,
                    cuts,
                    headroom,
                    places,
                    corrupt,
                },
            )
        })
}

/// Frames with the IP identification and header checksum of fragments
/// zeroed: the multiplexer numbers each fragmented datagram it sends (a
/// corrupted flags byte can make a frame one), so two sends of the same
/// fragment differ there and only there.
fn unnumbered(frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    frames
        .iter()
        .map(|f| {
            let mut f = f.clone();
            let fragment = f.len() >= 34 && u16::from_be_bytes([f[20], f[21]]) & 0x3fff != 0;
            if fragment {
                f[18..20].fill(0);
                f[24..26].fill(0);
            }
            f
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any frame cut into any chain goes on the wire as the same frame
    /// sent in one piece (a fragment's number aside), or, when one goes,
    /// neither does (a corrupted header fails the template either way).
    #[test]
    fn chains_match_contiguous_frames((n, cut) in arb_cut()) {
        let mut fx = fixture();
        let mut frame = udp_from(&payload(n));
        if let Some((at, x)) = cut.corrupt {
            frame[at] ^= x;
        }
        let fo = fx.app.frames.layout().frames_offset() as u32;
        let mut bounds = vec![0];
        bounds.extend(&cut.cuts);
        bounds.push(frame.len());
        let pieces: Vec<&[u8]> = bounds.windows(2).map(|w| &frame[w[0]..w[1]]).collect();
        let head = pieces[0];
        let mut parts = Vec::new();
        if cut.inline_head && head.len() <= INLINE_MAX {
            parts.push(Part::Inline(head));
        } else {
            // In buffer 0, after what headroom still fits.
            let room = 2048 - head.len() as u32;
            parts.push(fx.area(fo + cut.headroom % (room + 1), head));
        }
        for (k, piece) in pieces.iter().enumerate().skip(1) {
            // Part k in its own 32 KiB of the area, anywhere in it.
            parts.push(fx.area(fo + k as u32 * 32768 + cut.places[k], piece));
        }
        prop_assert!(fx.app.tx.push_chain(fx.ch, &parts).unwrap());
        let chained = fx.drain();
        // The same bytes in one piece, in buffer 15 (free of every part).
        send(&mut fx.app, fo + 15 * 2048, &frame, fx.ch);
        let whole = fx.drain();
        prop_assert_eq!(unnumbered(&chained), unnumbered(&whole));
        prop_assert!(whole.is_empty() || unnumbered(&whole) == unnumbered(&[frame.clone()]));
        prop_assert!(cut.corrupt.is_some() || whole.len() == 1);
        let s = fx.stats();
        prop_assert_eq!(s.tx_frames + s.tx_dropped(), 2);
        prop_assert_eq!(s.tx_bad_chain, 0);
        // The one piece's, and the chain's if it has a buffer part.
        let lent = parts.len() > 1 || !matches!(parts[0], Part::Inline(_));
        let c = completions(&mut fx.app);
        prop_assert_eq!(c.len(), 1 + lent as usize);
    }
}
