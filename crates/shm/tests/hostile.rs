//! Property tests: whatever an untrusted peer writes into the segment
//! (descriptors, ring indices, header fields, wake-up words), the other
//! side gets an error or a value in bounds, never a panic or an access
//! outside the segment.
#![cfg(not(loom))]

use std::fs::File;
use std::mem::offset_of;
use std::os::unix::fs::FileExt;

use exonet_shm::*;
use proptest::prelude::*;

fn config() -> SegmentConfig {
    SegmentConfig {
        frame_size: 256,
        frame_count: 8,
        ring_entries: [4, 8, 8, 4],
    }
}

/// A segment seen from both sides, plus raw write access to it: the
/// hostile application's view.
fn setup() -> (AppEndpoint, MuxEndpoint, File) {
    let seg = Segment::create(&config()).unwrap();
    let file = File::from(seg.fd().try_clone_to_owned().unwrap());
    let (app, mux) = seg.split().unwrap();
    (app, mux, file)
}

/// Values near every boundary that matters, and anything at all.
fn interesting_u32() -> impl Strategy<Value = u32> {
    let l = Layout::new(&config()).unwrap();
    let f = l.frames_offset() as u32;
    let end = f + 8 * 256;
    prop_oneof![
        any::<u32>(),
        0u32..300,
        (f - 4)..(end + 4),
        prop::sample::select(vec![
            0,
            1,
            127,
            128,
            129,
            255,
            256,
            257,
            u32::MAX,
            u32::MAX - 1,
            1 << 31
        ]),
    ]
}

fn any_desc() -> impl Strategy<Value = Desc> {
    (
        interesting_u32(),
        interesting_u32(),
        any::<u32>(),
        prop_oneof![0u32..4, any::<u32>()],
    )
        .prop_map(|(offset, len, channel, flags)| Desc {
            offset,
            len,
            channel,
            flags,
        })
}

proptest! {
    #[test]
    fn validated_descriptors_stay_in_their_buffer(d in any_desc()) {
        let l = Layout::new(&config()).unwrap();
        let (start, end) = (l.frames_offset(), l.frames_offset() + 8 * 256);
        if l.validate_frame(d).is_ok() {
            prop_assert_eq!(d.flags & !Desc::KNOWN_FLAGS, 0);
            if d.is_inline() {
                prop_assert!(d.len as usize <= INLINE_MAX);
            } else {
                let (o, n) = (d.offset as u64, d.len as u64);
                prop_assert!(start <= o && o + n <= end);
                let buf = l.buffer_of(d.offset).unwrap() as u64;
                prop_assert!(o + n <= buf + 256, "stays in one buffer");
            }
        }
        if l.validate_buffer(d).is_ok() {
            prop_assert!(!d.is_inline());
            prop_assert_eq!(l.buffer_of(d.offset), Some(d.offset));
        }
    }

    /// The application puts arbitrary descriptors on tx; the multiplexer
    /// pops, validates and copies out, as it will.
    #[test]
    fn hostile_tx_descriptors(descs in prop::collection::vec(any_desc(), 1..20), inline_bytes in any::<[u8; 16]>()) {
        let (mut app, mut mux, file) = setup();
        let tx = mux.frames.layout().ring(RingId::Tx);
        let mut inline = [0u8; INLINE_MAX];
        let mut out = [0u8; 512];
        for chunk in descs.chunks(8) {
            let k = app.tx.reserve(chunk.len() as u32).unwrap();
            prop_assert_eq!(k as usize, chunk.len());
            for (i, d) in chunk.iter().enumerate() {
                app.tx.write(i as u32, *d);
            }
            // Scribble on the inline slots too.
            file.write_at(&inline_bytes, tx.inline_offset()).unwrap();
            app.tx.submit(k);
            while let Some(d) = mux.tx.pop_frame(&mut inline).unwrap() {
                match mux.frames.layout().validate_frame(d) {
                    Ok(()) if d.is_inline() => prop_assert!(d.len as usize <= INLINE_MAX),
                    Ok(()) => {
                        let n = mux.frames.read(d, &mut out).unwrap();
                        prop_assert_eq!(n, (d.len as usize).min(out.len()));
                    }
                    Err(_) => prop_assert!(mux.frames.read(d, &mut out).is_err()),
                }
            }
        }
    }

    /// The application moves the tx producer index anywhere: the
    /// multiplexer sees at most a ring's worth of entries, or an error.
    #[test]
    fn hostile_producer_index(pushed in 0u32..8, popped in 0u32..8, index in interesting_u32(), n in 0u32..20) {
        let (mut app, mut mux, file) = setup();
        let popped = popped.min(pushed);
        for i in 0..pushed {
            prop_assert!(app.tx.push(Desc::buffer(0, i, 0)).unwrap());
        }
        for _ in 0..popped {
            mux.tx.pop().unwrap().unwrap();
        }
        let head = mux.frames.layout().ring(RingId::Tx).offset + offset_of!(RingHead, producer) as u64;
        file.write_at(&index.to_ne_bytes(), head).unwrap();
        let ahead = index.wrapping_sub(popped);
        let mut cons = popped;
        match mux.tx.peek(n) {
            Ok(k) => {
                prop_assert!(k <= n.min(8));
                prop_assert!(k <= pushed - popped || (ahead <= 8 && k == n.min(ahead)));
                for i in 0..k {
                    let _ = mux.tx.read(i);
                }
                mux.tx.release(k);
                cons += k;
            }
            Err(e) => {
                prop_assert!(ahead > 8);
                prop_assert_eq!(e, RingError::ProducerIndex { producer: index, consumer: popped });
            }
        }
        // Entries seen published earlier stay ours even if the index moves
        // back, so only one direction is certain.
        prop_assert!(mux.tx.has_pending() || index == cons);
    }

    /// The application moves the rx consumer index anywhere: the
    /// multiplexer never sees more room than the ring has.
    #[test]
    fn hostile_consumer_index(pushed in 0u32..8, index in interesting_u32(), n in 0u32..20) {
        let (_app, mut mux, file) = setup();
        for i in 0..pushed {
            prop_assert!(mux.rx.push(Desc::buffer(0, i, 0)).unwrap());
        }
        let head = mux.frames.layout().ring(RingId::Rx).offset + offset_of!(RingHead, consumer) as u64;
        file.write_at(&index.to_ne_bytes(), head).unwrap();
        prop_assert!(mux.rx.outstanding() <= 8);
        let used = pushed.wrapping_sub(index);
        match mux.rx.reserve(n) {
            Ok(k) => {
                prop_assert!(k <= n.min(8));
                prop_assert!(k <= 8 - pushed || (used <= 8 && k == n.min(8 - used)));
                for i in 0..k {
                    mux.rx.write(i, Desc::default());
                }
                mux.rx.submit(k);
            }
            Err(e) => {
                prop_assert!(used > 8);
                prop_assert_eq!(e, RingError::ConsumerIndex { producer: pushed, consumer: index });
            }
        }
    }

    /// Arbitrary bytes anywhere in the header: the peer's open either
    /// refuses the segment or finds a layout that is exactly what its sizes
    /// imply and exactly fills the file (usually the creator's; other sizes
    /// can lay out the same way).
    #[test]
    fn hostile_header_bytes(at in 0u64..256, bytes in prop::collection::vec(any::<u8>(), 1..16)) {
        let seg = Segment::create(&config()).unwrap();
        let file = File::from(seg.fd().try_clone_to_owned().unwrap());
        file.write_at(&bytes, at).unwrap();
        if let Ok(peer) = Segment::open(seg.fd().try_clone_to_owned().unwrap()) {
            let l = *peer.layout();
            prop_assert_eq!(Layout::new(&l.config()), Ok(l));
            prop_assert_eq!(l.segment_size(), seg.layout().segment_size());
        }
    }

    /// Plausible but wrong sizes: other frame sizes, counts and ring
    /// lengths, so that the layout check itself is what refuses them.
    #[test]
    fn hostile_header_sizes(
        frame_size in prop::sample::select(vec![128u32, 256, 512, 4096, 65536, 100, 0]),
        frame_count in prop_oneof![1u32..64, any::<u32>()],
        entries in prop::array::uniform4(prop::sample::select(vec![4u32, 8, 16, 1 << 20, 1 << 21, 3, 0])),
    ) {
        let seg = Segment::create(&config()).unwrap();
        let file = File::from(seg.fd().try_clone_to_owned().unwrap());
        file.write_at(&frame_size.to_ne_bytes(), offset_of!(SegmentHeader, frame_size) as u64).unwrap();
        file.write_at(&frame_count.to_ne_bytes(), offset_of!(SegmentHeader, frame_count) as u64).unwrap();
        for (i, e) in entries.iter().enumerate() {
            let at = offset_of!(SegmentHeader, rings) + i * 16 + offset_of!(RingInfo, entries);
            file.write_at(&e.to_ne_bytes(), at as u64).unwrap();
        }
        // Accepted exactly when the claimed sizes lay out to the offsets
        // the header has (the creator's) in a file of this size.
        let orig = seg.layout();
        let claimed = Layout::new(&SegmentConfig { frame_size, frame_count, ring_entries: entries });
        let fits = claimed.is_ok_and(|l| {
            l.segment_size() == orig.segment_size()
                && l.frames_offset() == orig.frames_offset()
                && RingId::ALL.iter().all(|&r| {
                    (l.ring(r).offset, l.ring(r).inline_size) == (orig.ring(r).offset, orig.ring(r).inline_size)
                })
        });
        match Segment::open(seg.fd().try_clone_to_owned().unwrap()) {
            Ok(peer) => {
                prop_assert!(fits);
                prop_assert_eq!(Ok(*peer.layout()), claimed);
            }
            Err(_) => prop_assert!(!fits),
        }
    }

    /// Arbitrary wake-up words cost at most a signal.
    #[test]
    fn hostile_wake_words(flags in any::<u32>(), threshold in any::<u32>(), pushes in 1u32..8) {
        let (_app, mut mux, file) = setup();
        let at = offset_of!(SegmentHeader, app_wake) as u64;
        file.write_at(&flags.to_ne_bytes(), at).unwrap();
        file.write_at(&threshold.to_ne_bytes(), at + 4).unwrap();
        for _ in 0..pushes {
            mux.rx.push_inline(0, b"x").unwrap();
            let signalled = mux.upcall.notify_rx(&mux.rx).unwrap();
            prop_assert!(!signalled || flags & WakeWord::UPCALLS_OFF == 0);
        }
    }
}
