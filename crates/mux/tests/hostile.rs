//! Hostile applications: arbitrary descriptors (and chains of them) on the
//! free and tx rings and arbitrary producer indices are counted drops, never
//! a crash or an access outside the segment.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use common::*;
use exonet_link::Link;
use exonet_mux::{ChannelSpec, EndpointId, Mux, Proto};
use exonet_shm::{AppEndpoint, Desc, RingId, Segment, MAX_PARTS};
use exonet_wire::build;
use proptest::prelude::*;

/// The segment mapped a second time, as a hostile application would, to
/// write ring indices directly.
struct RawMap {
    ptr: *mut u8,
    len: usize,
}

impl RawMap {
    fn new(seg: &Segment) -> RawMap {
        let len = seg.layout().segment_size() as usize;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&seg.fd());
        // SAFETY: a fresh shared mapping of a memfd of `len` bytes; the
        // result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        RawMap {
            ptr: ptr.cast(),
            len,
        }
    }

    /// Overwrites a ring's producer index (the first word of its head).
    fn set_producer(&self, offset: u64, value: u32) {
        assert!((offset as usize) + 4 <= self.len);
        // SAFETY: in bounds (checked), 64-byte aligned (ring heads are), and
        // the index is only ever accessed atomically.
        let word = unsafe { &*(self.ptr.add(offset as usize) as *const AtomicU32) };
        word.store(value, Ordering::Release);
    }
}

impl Drop for RawMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

struct Fixture {
    mux: Mux,
    wire: exonet_link::memwire::MemWire,
    id: EndpointId,
    app: AppEndpoint,
    channel: u32,
    raw: RawMap,
    tx_head: u64,
    free_head: u64,
}

fn fixture() -> Fixture {
    let (mut mux, wire) = mux();
    let seg = segment(&small_segment());
    let raw = RawMap::new(&seg);
    let tx_head = seg.layout().ring(RingId::Tx).offset;
    let free_head = seg.layout().ring(RingId::Free).offset;
    let (app, me) = seg.split().unwrap();
    let id = mux.add_endpoint(me, 1000, false);
    let (ch, _) = mux
        .bind_socket(
            id,
            ChannelSpec {
                proto: Proto::Udp,
                local_addr: HOST,
                local_port: 5000,
                remote: None,
            },
        )
        .unwrap();
    Fixture {
        mux,
        wire,
        id,
        app,
        channel: ch.0,
        raw,
        tx_head,
        free_head,
    }
}

/// A descriptor; `channel == None` stands for the endpoint's own channel.
fn arb_desc() -> impl Strategy<Value = (Desc, bool)> {
    let frames_offset = exonet_shm::Layout::new(&small_segment())
        .unwrap()
        .frames_offset() as u32;
    let offset = prop_oneof![
        any::<u32>(),
        (0u32..200_000).prop_map(move |o| frames_offset.wrapping_add(o)),
        Just(u32::MAX - 3),
        (0u32..64).prop_map(move |i| frames_offset + i * 2048),
    ];
    let len = prop_oneof![any::<u32>(), 0u32..3000, Just(u32::MAX)];
    let flags = prop_oneof![
        Just(0u32),
        Just(Desc::INLINE),
        Just(Desc::REJECTED),
        Just(Desc::MORE),
        Just(Desc::MORE | Desc::INLINE),
        any::<u32>()
    ];
    (offset, len, any::<u32>(), any::<bool>(), flags).prop_map(
        |(offset, len, channel, own, flags)| {
            (
                Desc {
                    offset,
                    len,
                    channel,
                    flags,
                },
                own,
            )
        },
    )
}

/// How many frames the multiplexer takes from `descs` (the rules of
/// [`Desc::MORE`]): a chain ends at its first descriptor without MORE, or
/// after MAX_PARTS, and then the rest of it is skipped; a chain that does
/// not end is not taken.
fn frames_in(descs: &[Desc]) -> u64 {
    let (mut i, mut frames, mut skip) = (0, 0, false);
    while i < descs.len() {
        if skip {
            skip = descs[i].has_more();
            i += 1;
            continue;
        }
        let Some(k) = (0..MAX_PARTS)
            .take_while(|k| i + k < descs.len())
            .find(|&k| !descs[i + k].has_more() || k + 1 == MAX_PARTS)
        else {
            break;
        };
        frames += 1;
        skip = descs[i + k].has_more();
        i += k + 1;
    }
    frames
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn hostile_tx_descriptors_are_counted(descs in proptest::collection::vec(arb_desc(), 1..60)) {
        let mut fx = fixture();
        let descs: Vec<Desc> = descs
            .into_iter()
            .map(|(d, own)| if own { Desc { channel: fx.channel, ..d } } else { d })
            .collect();
        for &d in &descs {
            // Raw reservations let the application write any descriptor.
            prop_assert_eq!(fx.app.tx.reserve(1).unwrap(), 1);
            fx.app.tx.write(0, d);
            fx.app.tx.submit(1);
        }
        while fx.mux.poll_tx().unwrap() > 0 {}
        let s = fx.mux.endpoint_stats(fx.id).unwrap();
        prop_assert_eq!(s.tx_frames + s.tx_dropped(), frames_in(&descs));
        let sent = drain_wire(&mut fx.wire);
        prop_assert_eq!(sent.len() as u64, s.tx_frames);
        // Whatever went back names a real buffer.
        for c in completions(&mut fx.app) {
            let plain = Desc { flags: 0, ..c };
            let ok = fx.app.frames.layout().validate_buffer(plain).is_ok();
            prop_assert!(ok);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn hostile_descriptors_and_indices(
        tx in proptest::collection::vec((any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()), 0..40),
        free in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..40),
        tx_index in proptest::option::of(any::<u32>()),
        free_index in proptest::option::of(any::<u32>()),
        frames in 0usize..20,
    ) {
        let mut fx = fixture();
        let fo = fx.app.frames.layout().frames_offset() as u32;
        for (o, l, c, f) in tx {
            if fx.app.tx.reserve(1).unwrap() == 1 {
                // Half of the offsets near the frame area, to reach the checks past the range test.
                let offset = if o & 1 == 0 { fo.wrapping_add(o % 150_000) } else { o };
                let channel = if c & 1 == 0 { fx.channel } else { c };
                let d = Desc { offset, len: l % 4096, channel, flags: f & 7 };
                fx.app.tx.write(0, d);
                fx.app.tx.submit(1);
            }
        }
        for (o, f) in free {
            if fx.app.free.reserve(1).unwrap() == 1 {
                let offset = if o & 1 == 0 { fo.wrapping_add(o % 150_000) } else { o };
                let d = Desc { offset, len: 0, channel: 0, flags: f & 3 };
                fx.app.free.write(0, d);
                fx.app.free.submit(1);
            }
        }
        if let Some(i) = tx_index { fx.raw.set_producer(fx.tx_head, i); }
        if let Some(i) = free_index { fx.raw.set_producer(fx.free_head, i); }
        let big = build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 1, 5000, &[5u8; 900]);
        for _ in 0..frames {
            fx.wire.send_batch(&[&big]).unwrap();
        }
        for _ in 0..4 {
            fx.mux.poll_rx().unwrap();
            fx.mux.poll_tx().unwrap();
        }
        let s = fx.mux.endpoint_stats(fx.id).unwrap();
        // Every arrived frame was delivered or counted as dropped or as a ring error.
        prop_assert!(s.rx_frames + s.rx_dropped() + s.ring_errors >= frames as u64);
        prop_assert_eq!(drain_wire(&mut fx.wire).len() as u64, s.tx_frames);
        // Delivered frames are intact.
        let mut inline = [0u8; exonet_shm::INLINE_MAX];
        let mut delivered = 0;
        while let Ok(Some(d)) = fx.app.rx.pop_frame(&mut inline) {
            let mut buf = vec![0u8; 2048];
            let n = fx.app.frames.read(d, &mut buf).unwrap();
            prop_assert_eq!(&buf[..n], &big[..]);
            delivered += 1;
        }
        prop_assert_eq!(delivered, s.rx_frames);
    }
}
