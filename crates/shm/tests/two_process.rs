//! Two processes share a real segment: this test binary runs itself again
//! as the application (told so by an environment variable, with the memfd
//! and eventfds inherited), which echoes every frame the multiplexer (the
//! parent) puts on rx back on tx. Both sleep when idle and kick each other.
#![cfg(not(loom))]

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;
use std::time::Duration;

use exonet_shm::*;

const CHILD: &str = "EXONET_SHM_TEST_CHILD";
const FRAMES: u32 = 50_000;
const SLEEP: Option<Duration> = Some(Duration::from_secs(20));

fn frame(seq: u32) -> (Vec<u8>, bool) {
    let len = 14 + (seq.wrapping_mul(2654435761) >> 8) as usize % 1500;
    let mut bytes: Vec<u8> = (0..len).map(|k| (k as u32 ^ seq) as u8).collect();
    bytes[..4].copy_from_slice(&seq.to_le_bytes());
    (bytes, len <= INLINE_MAX && seq.is_multiple_of(2))
}

#[test]
fn frames_cross_processes() {
    match std::env::var(CHILD) {
        Ok(fds) => application(&fds),
        Err(_) => multiplexer(),
    }
}

fn multiplexer() {
    let config = SegmentConfig {
        frame_size: 2048,
        frame_count: 128,
        ring_entries: [128, 64, 64, 128],
    };
    let seg = Segment::create(&config).unwrap();
    let events = Doorbells::new().unwrap();
    let theirs = events.try_clone().unwrap();
    let (app_rx, app_tx) = theirs.app.fds();
    let (mux_rx, mux_tx) = theirs.mux.fds();
    let fds: Vec<RawFd> = [seg.fd(), app_rx, app_tx, mux_rx, mux_tx]
        .iter()
        .map(|fd| fd.as_raw_fd())
        .collect();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "frames_cross_processes",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(
        CHILD,
        fds.iter()
            .map(|fd| fd.to_string())
            .collect::<Vec<_>>()
            .join(","),
    );
    common::inherit_fds(&mut cmd, fds);
    let child = cmd.spawn().unwrap();
    drop(theirs);

    let mut mux = seg.into_mux(events);
    let layout = *mux.frames.layout();
    let (mut sent, mut echoed, mut woken) = (0u32, 0u32, 0u32);
    let mut inline = [0u8; INLINE_MAX];
    let mut out = vec![0u8; 2048];
    while echoed < FRAMES {
        let mut progress = false;
        // Up to 32 frames in flight.
        while sent < FRAMES && sent - echoed < 32 {
            let (bytes, as_inline) = frame(sent);
            if as_inline {
                assert!(mux.rx.push_inline(5, &bytes).unwrap());
            } else {
                let Some(b) = mux.free.pop().unwrap() else {
                    break;
                };
                layout.validate_buffer(b).unwrap();
                mux.frames.write(b.offset, &bytes).unwrap();
                assert!(mux
                    .rx
                    .push(Desc::buffer(b.offset, bytes.len() as u32, 5))
                    .unwrap());
            }
            sent += 1;
            progress = true;
        }
        if progress {
            mux.upcall.notify_rx(&mux.rx).unwrap();
        }
        let mut scanned = false;
        while let Some(d) = mux.tx.pop_frame(&mut inline).unwrap() {
            layout.validate_frame(d).unwrap();
            let got = if d.is_inline() {
                &inline[..d.len as usize]
            } else {
                let n = mux.frames.read(d, &mut out).unwrap();
                let b = layout.buffer_of(d.offset).unwrap();
                assert!(mux
                    .completion
                    .push(Desc::buffer(b, d.len, d.channel))
                    .unwrap());
                &out[..n]
            };
            let (bytes, as_inline) = frame(echoed);
            assert_eq!(
                (d.is_inline(), d.channel, got),
                (as_inline, 5, &bytes[..]),
                "frame {echoed}"
            );
            echoed += 1;
            scanned = true;
        }
        if scanned {
            mux.upcall.notify_if_sleeping().unwrap();
        } else if !progress {
            let in_flight_room = sent < FRAMES && sent - echoed < 32;
            let w = mux
                .wake
                .sleep(SLEEP, || {
                    mux.tx.has_pending() || (in_flight_room && mux.free.has_pending())
                })
                .unwrap();
            assert_ne!(w, Wakeup::TimedOut, "multiplexer: lost wake-up at {echoed}");
            woken += (w == Wakeup::Signaled) as u32;
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "application process: {}", out.status);
    eprintln!("{FRAMES} frames echoed across processes; multiplexer woken {woken} times");
}

fn application(fds: &str) {
    let fds: Vec<OwnedFd> = fds
        .split(',')
        .map(|s| {
            let fd: RawFd = s.parse().unwrap();
            // SAFETY: inherited from the parent for us alone, under this
            // number; nothing else in this process owns it.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .collect();
    let [seg, app_rx, app_tx, mux_rx, mux_tx]: [OwnedFd; 5] = fds.try_into().unwrap();
    // The peer side: the header is validated here.
    let seg = Segment::open(seg).unwrap();
    let events = Doorbells {
        app: Doorbell::from_fds(app_rx, app_tx).unwrap(),
        mux: Doorbell::from_fds(mux_rx, mux_tx).unwrap(),
    };
    let mut app = seg.into_app(events);
    let layout = *app.frames.layout();
    for b in layout.buffers() {
        assert!(app.free.push(Desc::buffer(b, 0, 0)).unwrap());
    }
    let mut inline = [0u8; INLINE_MAX];
    let (mut echoed, mut woken) = (0u32, 0u32);
    while echoed < FRAMES {
        let mut kick = false;
        while let Some(c) = app.completion.pop().unwrap() {
            layout.validate_buffer(c).unwrap();
            assert!(app.free.push(Desc::buffer(c.offset, 0, 0)).unwrap());
            kick = true;
        }
        while app.tx.reserve(1).unwrap() == 1 {
            let Some(d) = app.rx.pop_frame(&mut inline).unwrap() else {
                break;
            };
            layout.validate_frame(d).unwrap();
            if d.is_inline() {
                app.tx
                    .write_inline(0, d.channel, &inline[..d.len as usize])
                    .unwrap();
            } else {
                // Echo in place: the same buffer goes out on tx.
                app.tx.write(0, d);
            }
            app.tx.submit(1);
            echoed += 1;
            kick = true;
        }
        if kick {
            app.kick.notify_if_sleeping().unwrap();
            continue;
        }
        let w = app
            .wake
            .sleep(SLEEP, || {
                app.rx.has_pending() || app.completion.has_pending()
            })
            .unwrap();
        assert_ne!(w, Wakeup::TimedOut, "application: lost wake-up at {echoed}");
        woken += (w == Wakeup::Signaled) as u32;
    }
    eprintln!("application: echoed {echoed}, woken {woken} times");
}
