//! The segment, rings, frames and wake-ups, one side at a time.
#![cfg(not(loom))]

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use exonet_shm::*;

fn small() -> SegmentConfig {
    SegmentConfig {
        frame_size: 2048,
        frame_count: 16,
        ring_entries: [8, 8, 8, 8],
    }
}

/// Application and multiplexer on two mappings of one memfd, as across
/// processes.
fn pair(config: &SegmentConfig) -> (AppEndpoint, MuxEndpoint) {
    let seg = Segment::create(config).unwrap();
    let peer = Segment::open(seg.fd().try_clone_to_owned().unwrap()).unwrap();
    assert_eq!(peer.layout(), seg.layout());
    let events = Doorbells::new().unwrap();
    let mux_events = events.try_clone().unwrap();
    (peer.into_app(events), seg.into_mux(mux_events))
}

#[test]
fn layout_of_the_default_segment() {
    let l = Layout::new(&SegmentConfig::default()).unwrap();
    assert_eq!(l.ring(RingId::Free).offset, 4096);
    for id in RingId::ALL {
        let r = l.ring(id);
        assert_eq!(r.offset % 4096, 0);
        assert_eq!(r.entries, 1024);
        assert_eq!(r.inline_size, if id.carries_frames() { 128 } else { 0 });
    }
    // free: 128 + 16 KiB -> 5 pages; rx: 128 + 16 KiB + 128 KiB -> 37 pages.
    assert_eq!(l.ring(RingId::Rx).offset, 4096 + 5 * 4096);
    assert_eq!(l.ring(RingId::Tx).offset, 4096 + (5 + 37) * 4096);
    assert_eq!(
        l.ring(RingId::Completion).offset,
        4096 + (5 + 37 + 37) * 4096
    );
    assert_eq!(l.frames_offset(), 4096 + (5 + 37 + 37 + 5) * 4096);
    assert_eq!(l.segment_size(), l.frames_offset() + 2048 * 2048);
    assert_eq!(l.buffers().count(), 2048);
    assert_eq!(l.config(), SegmentConfig::default());
}

#[test]
fn buffers_are_aligned_to_their_size() {
    for frame_size in [128, 2048, 8192, 65536] {
        let l = Layout::new(&SegmentConfig {
            frame_size,
            frame_count: 3,
            ring_entries: [16; 4],
        })
        .unwrap();
        assert_eq!(l.frames_offset() % frame_size.max(4096) as u64, 0);
        for b in l.buffers() {
            assert_eq!(b % frame_size, 0);
            assert_eq!(l.buffer_of(b + frame_size - 1), Some(b));
            assert_eq!(l.validate_buffer(Desc::buffer(b, 0, 0)), Ok(()));
        }
        assert_eq!(l.segment_size() % 4096, 0);
        assert!(l.segment_size() >= l.frames_offset() + 3 * frame_size as u64);
    }
}

#[test]
fn bad_configurations_are_refused() {
    let bad = |f: fn(&mut SegmentConfig)| {
        let mut c = small();
        f(&mut c);
        Layout::new(&c).unwrap_err()
    };
    assert_eq!(bad(|c| c.frame_size = 1000), ConfigError::FrameSize(1000));
    assert_eq!(bad(|c| c.frame_size = 64), ConfigError::FrameSize(64));
    assert_eq!(
        bad(|c| c.frame_size = 1 << 17),
        ConfigError::FrameSize(1 << 17)
    );
    assert_eq!(bad(|c| c.frame_count = 0), ConfigError::FrameCount(0));
    assert_eq!(
        bad(|c| c.ring_entries[2] = 6),
        ConfigError::RingEntries {
            ring: RingId::Tx,
            entries: 6
        }
    );
    assert_eq!(
        bad(|c| c.ring_entries[0] = 2),
        ConfigError::RingEntries {
            ring: RingId::Free,
            entries: 2
        }
    );
    assert!(matches!(
        bad(|c| {
            c.frame_size = 65536;
            c.frame_count = 1 << 16;
        }),
        ConfigError::TooLarge { .. }
    ));
    assert!(matches!(
        Segment::create(&SegmentConfig {
            frame_count: 0,
            ..small()
        }),
        Err(SegmentError::Config(_))
    ));
}

#[test]
fn open_refuses_files_that_are_not_sealed_segments() {
    let tmp = std::env::temp_dir().join(format!("exonet-shm-test-{}", std::process::id()));
    let f = File::create(&tmp).unwrap();
    f.set_len(1 << 20).unwrap();
    std::fs::remove_file(&tmp).unwrap();
    assert!(matches!(
        Segment::open(OwnedFd::from(f)),
        Err(SegmentError::NotSealed)
    ));
}

#[test]
fn open_checks_the_header() {
    let seg = Segment::create(&small()).unwrap();
    let file = File::from(seg.fd().try_clone_to_owned().unwrap());
    let open = || Segment::open(seg.fd().try_clone_to_owned().unwrap());
    file.write_at(&0u64.to_le_bytes(), 0).unwrap();
    assert!(matches!(open(), Err(SegmentError::BadMagic(0))));
    file.write_at(&SEGMENT_MAGIC.to_le_bytes(), 0).unwrap();
    file.write_at(&2u32.to_le_bytes(), 8).unwrap();
    assert!(matches!(open(), Err(SegmentError::BadVersion(2))));
    file.write_at(&1u32.to_le_bytes(), 8).unwrap();
    // A frame count that would reach past the end of the file.
    file.write_at(&17u32.to_le_bytes(), 36).unwrap();
    assert!(matches!(
        open(),
        Err(SegmentError::Field {
            field: "segment_size",
            ..
        })
    ));
    file.write_at(&16u32.to_le_bytes(), 36).unwrap();
    // A ring moved onto the frames.
    let rx_offset = std::mem::offset_of!(SegmentHeader, rings) as u64 + 16;
    let frames = seg.layout().frames_offset();
    file.write_at(&frames.to_le_bytes(), rx_offset).unwrap();
    assert!(matches!(
        open(),
        Err(SegmentError::Field {
            field: "ring offset",
            ..
        })
    ));
    file.write_at(
        &seg.layout().ring(RingId::Rx).offset.to_le_bytes(),
        rx_offset,
    )
    .unwrap();
    assert!(open().is_ok());
}

#[test]
fn descriptors_are_validated() {
    let l = Layout::new(&small()).unwrap();
    let f = l.frames_offset() as u32;
    let ok = |d: Desc| l.validate_frame(d);
    assert_eq!(ok(Desc::buffer(f, 2048, 1)), Ok(()));
    assert_eq!(ok(Desc::buffer(f + 15 * 2048 + 100, 1948, 1)), Ok(()));
    assert_eq!(
        ok(Desc::buffer(f + 100, 1949, 1)),
        Err(DescError::TooLong {
            offset: f + 100,
            len: 1949
        })
    );
    assert_eq!(
        ok(Desc::buffer(f - 1, 1, 1)),
        Err(DescError::OutOfRange { offset: f - 1 })
    );
    assert_eq!(
        ok(Desc::buffer(f + 16 * 2048, 0, 1)),
        Err(DescError::OutOfRange {
            offset: f + 16 * 2048
        })
    );
    assert_eq!(
        ok(Desc::buffer(u32::MAX, u32::MAX, 1)),
        Err(DescError::OutOfRange { offset: u32::MAX })
    );
    assert_eq!(
        ok(Desc::buffer(f, u32::MAX, 1)),
        Err(DescError::TooLong {
            offset: f,
            len: u32::MAX
        })
    );
    let inline = |len, flags| Desc {
        offset: 0xdead_beef,
        len,
        channel: 0,
        flags,
    };
    assert_eq!(ok(inline(128, Desc::INLINE)), Ok(()));
    assert_eq!(
        ok(inline(129, Desc::INLINE)),
        Err(DescError::InlineTooLong { len: 129 })
    );
    assert_eq!(ok(inline(1, Desc::INLINE | Desc::QUIET)), Ok(()));
    assert_eq!(ok(inline(1, Desc::INLINE | Desc::CSUM_OK)), Ok(()));
    assert_eq!(
        ok(inline(1, 0x40)),
        Err(DescError::UnknownFlags { flags: 0x40 })
    );

    assert_eq!(l.validate_buffer(Desc::buffer(f + 2048, 7, 0)), Ok(()));
    assert_eq!(
        l.validate_buffer(Desc::buffer(f + 2049, 0, 0)),
        Err(DescError::Misaligned { offset: f + 2049 })
    );
    assert_eq!(
        l.validate_buffer(inline(0, Desc::INLINE)),
        Err(DescError::Inline)
    );
    assert_eq!(l.buffer_of(f + 2049), Some(f + 2048));
    assert_eq!(l.buffer_of(f - 1), None);
}

/// `MORE` only on tx: a whole frame (rx, a one-part tx frame) and a buffer
/// (free, completion) refuse it; a chain's parts are checked by
/// `validate_part`, the head within one buffer, the others anywhere in the
/// frame area.
#[test]
fn more_is_valid_only_on_transmit_parts() {
    let l = Layout::new(&small()).unwrap();
    let f = l.frames_offset() as u32;
    let end = f + 16 * 2048;
    let more = |d: Desc| Desc {
        flags: d.flags | Desc::MORE,
        ..d
    };
    let inline = |len| Desc {
        offset: 0,
        len,
        channel: 0,
        flags: Desc::INLINE,
    };
    // rx, and tx frames of one part.
    assert_eq!(
        l.validate_frame(more(Desc::buffer(f, 60, 1))),
        Err(DescError::More)
    );
    assert_eq!(l.validate_frame(more(inline(60))), Err(DescError::More));
    // free and completion.
    assert_eq!(
        l.validate_buffer(more(Desc::buffer(f, 0, 0))),
        Err(DescError::More)
    );
    let chain_done = Desc {
        flags: Desc::CHAIN | Desc::REJECTED,
        ..Desc::buffer(f, 3000, 0)
    };
    assert_eq!(l.validate_buffer(chain_done), Ok(()));
    // The head of a chain: a tx frame that continues.
    assert_eq!(l.validate_part(more(inline(128)), true), Ok(()));
    assert_eq!(
        l.validate_part(more(inline(129)), true),
        Err(DescError::InlineTooLong { len: 129 })
    );
    assert_eq!(
        l.validate_part(more(Desc::buffer(f + 100, 1948, 1)), true),
        Ok(())
    );
    assert_eq!(
        l.validate_part(more(Desc::buffer(f + 100, 1949, 1)), true),
        Err(DescError::TooLong {
            offset: f + 100,
            len: 1949
        })
    );
    // Later parts: across buffers, up to the end of the area, never inline.
    assert_eq!(
        l.validate_part(Desc::buffer(f + 100, 1949, 1), false),
        Ok(())
    );
    assert_eq!(
        l.validate_part(more(Desc::buffer(f + 2000, 5000, 1)), false),
        Ok(())
    );
    assert_eq!(
        l.validate_part(Desc::buffer(end - 10, 10, 1), false),
        Ok(())
    );
    assert_eq!(
        l.validate_part(Desc::buffer(end - 10, 11, 1), false),
        Err(DescError::TooLong {
            offset: end - 10,
            len: 11
        })
    );
    assert_eq!(
        l.validate_part(Desc::buffer(f - 1, 1, 1), false),
        Err(DescError::TooLong {
            offset: f - 1,
            len: 1
        })
    );
    assert_eq!(
        l.validate_part(Desc::buffer(u32::MAX, u32::MAX, 1), false),
        Err(DescError::TooLong {
            offset: u32::MAX,
            len: u32::MAX
        })
    );
    assert_eq!(l.validate_part(inline(10), false), Err(DescError::Inline));
    assert_eq!(
        l.validate_part(
            Desc {
                flags: 0x100,
                ..Desc::buffer(f, 1, 1)
            },
            false
        ),
        Err(DescError::UnknownFlags { flags: 0x100 })
    );
    // A chain's part is not a frame to read by itself.
    let (app, _mux) = pair(&small());
    let mut out = [0u8; 8];
    assert_eq!(
        app.frames.read(more(Desc::buffer(f, 8, 1)), &mut out),
        Err(DescError::More)
    );
}

/// `push_chain` publishes all parts with one index store, `MORE` on all but
/// the last, or nothing at all.
#[test]
fn chains_are_pushed_whole_or_not_at_all() {
    let (mut app, mut mux) = pair(&small());
    let f = app.frames.layout().frames_offset() as u32;
    let header = [0xabu8; 42];
    let parts = [
        Part::Inline(&header),
        Part::Area {
            offset: f + 2000,
            len: 100,
        },
        Part::Area {
            offset: f + 4096,
            len: 7,
        },
    ];
    assert!(app.tx.push_chain(9, &parts).unwrap());
    assert_eq!(mux.tx.peek(8).unwrap(), 3);
    let got: Vec<Desc> = (0..3).map(|i| mux.tx.read(i)).collect();
    assert_eq!(got[0].flags, Desc::INLINE | Desc::MORE);
    assert_eq!((got[0].len, got[0].channel), (42, 9));
    let mut inline = [0u8; INLINE_MAX];
    assert_eq!(mux.tx.read_inline(0, &got[0], &mut inline), 42);
    assert_eq!(&inline[..42], &header[..]);
    assert_eq!(
        got[1],
        Desc {
            flags: Desc::MORE,
            ..Desc::buffer(f + 2000, 100, 9)
        }
    );
    assert_eq!(got[2], Desc::buffer(f + 4096, 7, 9));
    assert!(got[1].has_more() && !got[2].has_more());
    mux.tx.release(3);
    // Three and four of eight entries taken: a chain of three no longer
    // fits, and nothing of it is pushed.
    assert!(app.tx.push_chain(1, &parts).unwrap());
    assert!(app.tx.push_chain(1, &[parts[1]; 4]).unwrap());
    assert!(!app.tx.push_chain(1, &parts).unwrap());
    assert_eq!(app.tx.outstanding(), 7);
    assert!(app.tx.push(Desc::buffer(f, 60, 1)).unwrap());
    // Malformed chains are refused before anything is written.
    let area = parts[1];
    for bad in [
        &[][..],
        &[area; MAX_PARTS + 1][..],
        &[area, Part::Inline(&header)][..],
    ] {
        assert!(matches!(
            app.tx.push_chain(1, bad),
            Err(RingError::BadChain { .. })
        ));
    }
    assert_eq!(
        app.tx
            .push_chain(1, &[Part::Inline(&[0; INLINE_MAX + 1]), area]),
        Err(RingError::InlineTooLong {
            len: INLINE_MAX + 1
        })
    );
    assert_eq!(
        app.free.push_chain(1, &[Part::Inline(&header)]),
        Err(RingError::NoInlineSlots)
    );
    assert_eq!(app.tx.outstanding(), 8);
}

#[test]
fn frames_are_copied_in_bounds() {
    let (app, mux) = pair(&small());
    let f = mux.frames.layout().frames_offset() as u32;
    mux.frames.write(f + 2048 + 10, b"hello").unwrap();
    let mut out = [0u8; 16];
    assert_eq!(
        app.frames.read(Desc::buffer(f + 2048 + 10, 5, 0), &mut out),
        Ok(5)
    );
    assert_eq!(&out[..5], b"hello");
    // Short output buffer: copies what fits.
    assert_eq!(
        app.frames
            .read(Desc::buffer(f + 2048 + 10, 5, 0), &mut out[..2]),
        Ok(2)
    );
    assert_eq!(
        mux.frames.write(f + 2040, &[0; 9]),
        Err(DescError::TooLong {
            offset: f + 2040,
            len: 9
        })
    );
    assert_eq!(
        mux.frames.write(0, b"x"),
        Err(DescError::OutOfRange { offset: 0 })
    );
    assert_eq!(
        app.frames.read(
            Desc {
                flags: Desc::INLINE,
                ..Desc::default()
            },
            &mut out
        ),
        Err(DescError::Inline)
    );
    assert!(app.frames.frame_ptr(f, 2048).is_ok());
}

#[test]
fn rings_carry_descriptors_between_mappings() {
    let (mut app, mut mux) = pair(&small());
    let bufs: Vec<u32> = app.frames.layout().buffers().collect();
    // Batch: 8 of 16 fit.
    assert_eq!(app.free.reserve(16).unwrap(), 8);
    for (i, &b) in bufs[..8].iter().enumerate() {
        app.free.write(i as u32, Desc::buffer(b, 0, 0));
    }
    app.free.submit(8);
    assert!(!app.free.push(Desc::buffer(bufs[8], 0, 0)).unwrap(), "full");
    assert_eq!(mux.free.peek(3).unwrap(), 3);
    assert_eq!(mux.free.read(2), Desc::buffer(bufs[2], 0, 0));
    mux.free.release(2);
    assert_eq!(app.free.reserve(4).unwrap(), 2, "two given back");
    app.free.submit(0);
    assert_eq!(mux.free.pop().unwrap(), Some(Desc::buffer(bufs[2], 0, 0)));
    assert_eq!(mux.free.peek(100).unwrap(), 5);
    mux.free.release(5);
    assert_eq!(mux.free.pop().unwrap(), None);
    assert!(!mux.free.has_pending());

    // Inline frames on rx; none on free.
    assert_eq!(mux.rx.push_inline(3, &[1, 2, 3]), Ok(true));
    assert_eq!(
        mux.rx.push_inline(3, &[0; 129]),
        Err(RingError::InlineTooLong { len: 129 })
    );
    assert_eq!(app.free.push_inline(3, &[1]), Err(RingError::NoInlineSlots));
    assert!(mux.rx.has_inline() && !mux.completion.has_inline());
    assert!(app.rx.has_pending());
    let mut buf = [0u8; INLINE_MAX];
    let d = app.rx.pop_frame(&mut buf).unwrap().unwrap();
    assert_eq!(
        d,
        Desc {
            offset: 0,
            len: 3,
            channel: 3,
            flags: Desc::INLINE
        }
    );
    assert_eq!(&buf[..3], &[1, 2, 3]);

    // Wrap the free-running indices many times round an 8-entry ring.
    for i in 0..100u32 {
        let data: Vec<u8> = (0..(i % 129) as u8).collect();
        assert_eq!(mux.rx.reserve(2).unwrap(), 2);
        mux.rx.write_inline(0, i, &data).unwrap();
        mux.rx.write(1, Desc::buffer(bufs[0], i, i));
        mux.rx.submit(2);
        assert_eq!(mux.rx.outstanding(), 2);
        assert_eq!(app.rx.peek(2).unwrap(), 2);
        let d = app.rx.read(0);
        assert_eq!(app.rx.read_inline(0, &d, &mut buf), data.len());
        assert_eq!(&buf[..data.len()], &data[..]);
        assert_eq!(app.rx.read(1), Desc::buffer(bufs[0], i, i));
        app.rx.release(2);
    }
    assert_eq!(mux.rx.outstanding(), 0);
}

#[test]
fn sleep_returns_at_once_when_work_is_there() {
    let (app, mut mux) = pair(&small());
    mux.rx.push_inline(0, b"x").unwrap();
    let t = Instant::now();
    let w = app
        .wake
        .sleep(Some(Duration::from_secs(5)), || app.rx.has_pending())
        .unwrap();
    assert_eq!(w, Wakeup::Ready);
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn sleep_times_out_without_work() {
    let (app, _mux) = pair(&small());
    let w = app
        .wake
        .sleep(Some(Duration::from_millis(20)), || false)
        .unwrap();
    assert_eq!(w, Wakeup::TimedOut);
}

/// Application and multiplexer as [`pair`], and a way to read the
/// application's wake-up flags from outside.
fn pair_with_file(config: &SegmentConfig) -> (AppEndpoint, MuxEndpoint, File) {
    let seg = Segment::create(config).unwrap();
    let file = File::from(seg.fd().try_clone_to_owned().unwrap());
    let peer = Segment::open(seg.fd().try_clone_to_owned().unwrap()).unwrap();
    let events = Doorbells::new().unwrap();
    let mux_events = events.try_clone().unwrap();
    (peer.into_app(events), seg.into_mux(mux_events), file)
}

/// The application's wake-up flags, read from outside.
fn app_flags(file: &File) -> u32 {
    let at = std::mem::offset_of!(SegmentHeader, app_wake) as u64;
    let mut flags = [0u8; 4];
    file.read_exact_at(&mut flags, at).unwrap();
    u32::from_ne_bytes(flags)
}

/// Waits until the application's wake-up word says it sleeps; its flags
/// then.
fn app_flags_once_asleep(file: &File) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let flags = app_flags(file);
        if flags & WakeWord::SLEEPING != 0 {
            return flags;
        }
        assert!(Instant::now() < deadline, "the application never slept");
        std::thread::yield_now();
    }
}

#[test]
fn notify_only_when_sleeping() {
    let (mut app, mut mux, file) = pair_with_file(&small());
    // Nobody sleeps: no system call, no signal.
    assert!(!mux.upcall.notify_if_sleeping().unwrap());
    assert!(!app.kick.notify_if_sleeping().unwrap());
    mux.rx.push_inline(0, b"x").unwrap();
    assert!(!mux.upcall.notify_rx(&mux.rx).unwrap());
    let mut buf = [0; INLINE_MAX];
    assert!(app.rx.pop_frame(&mut buf).unwrap().is_some());

    std::thread::scope(|s| {
        let sleeper = s.spawn(|| {
            let w = app
                .wake
                .sleep(Some(Duration::from_secs(10)), || app.rx.has_pending())
                .unwrap();
            (w, app.rx.pop_frame(&mut buf).unwrap())
        });
        app_flags_once_asleep(&file);
        mux.rx.push_inline(0, b"y").unwrap();
        assert!(mux.upcall.notify_rx(&mux.rx).unwrap());
        let (w, d) = sleeper.join().unwrap();
        assert_eq!(w, Wakeup::Signaled);
        assert_eq!(d.map(|d| d.len), Some(1));
    });
    // Awake again: the flag is cleared.
    mux.rx.push_inline(0, b"z").unwrap();
    assert!(!mux.upcall.notify_rx(&mux.rx).unwrap());
}

#[test]
fn upcalls_off_suppress_signals_and_on_catches_up() {
    let (app, mut mux, file) = pair_with_file(&small());
    app.wake.set_upcalls(false, || false).unwrap();
    let woke = while_app_sleeps(&app.wake, &file, || {
        // The word says SLEEPING|UPCALLS_OFF: never signalled.
        mux.rx.push_inline(0, b"x").unwrap();
        assert!(!mux.upcall.notify_rx(&mux.rx).unwrap());
        assert!(!mux.upcall.notify_if_sleeping().unwrap());
        // Switching upcalls on finds the pending frame and wakes the
        // sleeping thread itself.
        app.wake.set_upcalls(true, || app.rx.has_pending()).unwrap();
    });
    assert_eq!(woke, Wakeup::Signaled);
}

/// Runs `meanwhile` once a thread sleeps on the application's `wake` (for
/// at most 10 s, ready never) and returns how that sleep ended.
fn while_app_sleeps(wake: &Sleeper, file: &File, meanwhile: impl FnOnce()) -> Wakeup {
    std::thread::scope(|s| {
        let sleeper = s.spawn(|| wake.sleep(Some(Duration::from_secs(10)), || false).unwrap());
        app_flags_once_asleep(file);
        meanwhile();
        sleeper.join().unwrap()
    })
}

#[test]
fn a_sleep_for_received_frames_only_is_not_woken_by_a_transmit_scan() {
    let (app, mut mux, file) = pair_with_file(&small());
    assert!(!app.wake.set_rx_only(true), "not set before");
    let woke = while_app_sleeps(&app.wake, &file, || {
        // Its frames taken: no signal for a sleep that waits for rx only.
        assert!(!mux.upcall.notify_tx_done().unwrap());
        // A received frame does signal it.
        mux.rx.push_inline(0, b"x").unwrap();
        assert!(mux.upcall.notify_rx(&mux.rx).unwrap());
    });
    assert_eq!(woke, Wakeup::Signaled);
    // Cleared: a transmit scan signals a sleeper again.
    assert!(app.wake.set_rx_only(false), "was set");
    let woke = while_app_sleeps(&app.wake, &file, || {
        assert!(mux.upcall.notify_tx_done().unwrap());
    });
    assert_eq!(woke, Wakeup::Signaled);
}

#[test]
fn almost_full_upcall_fires_once_per_crossing() {
    let (mut app, mut mux) = pair(&small());
    app.wake.set_almost_full(Some(6));
    let mut fired = vec![];
    for _ in 0..8 {
        mux.rx.push_inline(0, b"x").unwrap();
        fired.push(mux.upcall.notify_rx(&mux.rx).unwrap());
    }
    assert_eq!(
        fired,
        [false, false, false, false, false, true, false, false]
    );
    // Drain below the threshold and fill again: fires again.
    let mut buf = [0; INLINE_MAX];
    for _ in 0..4 {
        app.rx.pop_frame(&mut buf).unwrap().unwrap();
    }
    mux.rx.push_inline(0, b"x").unwrap();
    assert!(!mux.upcall.notify_rx(&mux.rx).unwrap());
    mux.rx.push_inline(0, b"x").unwrap();
    assert!(mux.upcall.notify_rx(&mux.rx).unwrap());
    // The signal is on the application's eventfd.
    assert!(app.wake.doorbell().wait(Some(Duration::ZERO)).unwrap());
    app.wake.set_almost_full(None);
    app.rx.pop_frame(&mut buf).unwrap().unwrap();
    mux.rx.push_inline(0, b"x").unwrap();
    assert!(!mux.upcall.notify_rx(&mux.rx).unwrap());
}

#[test]
fn doorbells_pass_as_owned_fds() {
    let e = Doorbell::new().unwrap();
    let (rx, tx) = e.fds();
    let other = Doorbell::from_fds(
        rx.try_clone_to_owned().unwrap(),
        tx.try_clone_to_owned().unwrap(),
    )
    .unwrap();
    other.signal().unwrap();
    assert!(e.wait(Some(Duration::from_secs(1))).unwrap());
    assert!(!e.wait(Some(Duration::ZERO)).unwrap(), "reset by the wait");
    assert!(e.as_fd().try_clone_to_owned().is_ok());
}

#[test]
fn doorbell_refuses_other_descriptors() {
    let f = File::open("/dev/null").unwrap();
    let g = f.try_clone().unwrap();
    assert!(Doorbell::from_fds(OwnedFd::from(f), OwnedFd::from(g)).is_err());
}

/// Ringing never blocks, however many rings nobody drains, even when the
/// other side clears `O_NONBLOCK` on the shared descriptors.
#[test]
fn doorbell_never_blocks() {
    let e = Doorbell::new().unwrap();
    let (rx, tx) = e.fds();
    for fd in [rx, tx] {
        // SAFETY: fcntl on a live descriptor of ours.
        unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    for _ in 0..100_000 {
        e.signal().unwrap();
    }
    assert!(e.drain().unwrap());
    assert!(!e.drain().unwrap());
}

/// A drain empties the queue whatever the number of rings in it, batch
/// boundaries included.
#[test]
fn doorbell_drains_every_ring() {
    let e = Doorbell::new().unwrap();
    for rings in [1, 15, 16, 17, 33] {
        for _ in 0..rings {
            e.signal().unwrap();
        }
        assert!(e.drain().unwrap(), "{rings} rings");
        assert!(!e.drain().unwrap(), "{rings} rings left some");
    }
}

/// The application's sleep, in `FUTEX_WAIT` ([`Sleeper::sleep_or_hangup`]
/// with the control socket): the multiplexer's notifier wakes it through
/// the futex, not the doorbell, across slices; a timeout ends it, whatever
/// its length; a ring left on the doorbell ends it at the slice's end; and
/// the other side's going away ends it even with no timeout.
#[test]
fn an_application_sleep_wakes_on_notices_timeouts_and_hangups() {
    let (mut app, mut mux, file) = pair_with_file(&small());
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut buf = [0; INLINE_MAX];
    // As callers do: sleep again after a slice that timed out.
    let sleep = |wake: &Sleeper, pending: &dyn Fn() -> bool| {
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            match wake
                .sleep_or_hangup(None, Some(ours.as_fd()), pending)
                .unwrap()
            {
                Wakeup::TimedOut if Instant::now() < give_up => {}
                w => return w,
            }
        }
    };
    for _ in 0..3 {
        let (woke, flags) = std::thread::scope(|s| {
            let (wake, rx) = (&app.wake, &mut app.rx);
            let sleeper = s.spawn(move || sleep(wake, &|| rx.has_pending()));
            let flags = app_flags_once_asleep(&file);
            // Halfway through a slice: at a slice's end the sleeper's own
            // re-check may find the frame first (Ready, not Signaled).
            std::thread::sleep(SLEEP_SLICE * 5 / 2);
            mux.rx.push_inline(0, b"x").unwrap();
            assert!(mux.upcall.notify_rx(&mux.rx).unwrap());
            (sleeper.join().unwrap(), flags)
        });
        assert_eq!(woke, Wakeup::Signaled);
        assert_eq!(flags & WakeWord::FUTEX, WakeWord::FUTEX);
        assert!(app.rx.pop_frame(&mut buf).unwrap().is_some());
        // Woken through the futex: nothing on the doorbell.
        assert!(!app.wake.doorbell().drain().unwrap());
        assert_eq!(app_flags(&file) & (WakeWord::SLEEPING | WakeWord::FUTEX), 0);
    }
    // Timeouts: zero, shorter and longer than a slice.
    for ms in [0, 3, 0, 20, 3, 1] {
        let t = Instant::now();
        let w = app
            .wake
            .sleep_or_hangup(Some(Duration::from_millis(ms)), Some(ours.as_fd()), || {
                false
            })
            .unwrap();
        assert_eq!(w, Wakeup::TimedOut, "{ms} ms");
        let least = Duration::from_millis(ms).min(SLEEP_SLICE);
        assert!(t.elapsed() >= least, "{ms} ms");
    }
    // A ring on the doorbell (an almost-full upcall while awake) is taken
    // at the end of the slice.
    app.wake.doorbell().signal().unwrap();
    assert_eq!(sleep(&app.wake, &|| false), Wakeup::Signaled);
    assert!(!app.wake.doorbell().drain().unwrap());
    // The other side goes away while we sleep without a timeout.
    let woke = std::thread::scope(|s| {
        let sleeper = s.spawn(|| sleep(&app.wake, &|| false));
        app_flags_once_asleep(&file);
        std::thread::sleep(SLEEP_SLICE * 3);
        drop(theirs);
        sleeper.join().unwrap()
    });
    assert_eq!(woke, Wakeup::HangUp);
}

#[test]
fn in_process_split() {
    let (mut app, mut mux) = Segment::create(&small()).unwrap().split().unwrap();
    let b = app.frames.layout().buffers().next().unwrap();
    app.free.push(Desc::buffer(b, 0, 0)).unwrap();
    let got = mux.free.pop().unwrap().unwrap();
    mux.frames.layout().validate_buffer(got).unwrap();
    mux.frames.write(got.offset, b"frame").unwrap();
    mux.rx.push(Desc::buffer(got.offset, 5, 9)).unwrap();
    let d = app.rx.pop().unwrap().unwrap();
    let mut out = [0; 5];
    app.frames.read(d, &mut out).unwrap();
    assert_eq!(&out, b"frame");
}

#[test]
fn round_trip_helper_runs() {
    for inline in [false, true] {
        let t = bench::round_trip(60, inline, 1000).unwrap();
        assert!(t > Duration::ZERO);
    }
    assert!(bench::round_trip(129, true, 10).is_err());
}
