//! `include/exonet_endpoint.h` agrees with the Rust layout, and a C program
//! using only that header drives a real segment as the application.
#![cfg(not(loom))]

mod common;

use std::collections::HashMap;
use std::mem::{align_of, offset_of, size_of};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use exonet_shm::*;

/// Compiles `tests/c/endpoint.c` once for all tests, or says why not (no C
/// compiler).
fn compile() -> Option<PathBuf> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(compile_once).clone()
}

fn compile_once() -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("exonet_endpoint_c");
    let out = match Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-I"])
        .arg(dir.join("include"))
        .arg(dir.join("tests/c/endpoint.c"))
        .arg("-o")
        .arg(&exe)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: no C compiler ({cc}: {e})");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "{cc} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

#[test]
fn c_header_layout_matches_rust() {
    let Some(exe) = compile() else { return };
    let out = Command::new(&exe).arg("layout").output().unwrap();
    assert!(out.status.success());
    let c: HashMap<String, u64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let rust: Vec<(&str, u64)> = vec![
        ("sizeof_desc", size_of::<Desc>() as u64),
        ("desc.offset", offset_of!(Desc, offset) as u64),
        ("desc.len", offset_of!(Desc, len) as u64),
        ("desc.channel", offset_of!(Desc, channel) as u64),
        ("desc.flags", offset_of!(Desc, flags) as u64),
        ("sizeof_ring_info", size_of::<RingInfo>() as u64),
        ("ring_info.offset", offset_of!(RingInfo, offset) as u64),
        ("ring_info.entries", offset_of!(RingInfo, entries) as u64),
        (
            "ring_info.inline_size",
            offset_of!(RingInfo, inline_size) as u64,
        ),
        ("sizeof_wake", size_of::<WakeWord>() as u64),
        ("alignof_wake", align_of::<WakeWord>() as u64),
        ("wake.flags", offset_of!(WakeWord, flags) as u64),
        ("wake.almost_full", offset_of!(WakeWord, almost_full) as u64),
        ("wake.rung", offset_of!(WakeWord, rung) as u64),
        ("sizeof_header", size_of::<SegmentHeader>() as u64),
        ("header.magic", offset_of!(SegmentHeader, magic) as u64),
        ("header.version", offset_of!(SegmentHeader, version) as u64),
        (
            "header.header_size",
            offset_of!(SegmentHeader, header_size) as u64,
        ),
        (
            "header.segment_size",
            offset_of!(SegmentHeader, segment_size) as u64,
        ),
        (
            "header.frames_offset",
            offset_of!(SegmentHeader, frames_offset) as u64,
        ),
        (
            "header.frame_size",
            offset_of!(SegmentHeader, frame_size) as u64,
        ),
        (
            "header.frame_count",
            offset_of!(SegmentHeader, frame_count) as u64,
        ),
        ("header.rings", offset_of!(SegmentHeader, rings) as u64),
        (
            "header.app_wake",
            offset_of!(SegmentHeader, app_wake) as u64,
        ),
        (
            "header.mux_wake",
            offset_of!(SegmentHeader, mux_wake) as u64,
        ),
        ("sizeof_ring_head", size_of::<RingHead>() as u64),
        ("ring_head.producer", offset_of!(RingHead, producer) as u64),
        ("ring_head.consumer", offset_of!(RingHead, consumer) as u64),
        ("SEGMENT_MAGIC", SEGMENT_MAGIC),
        ("SEGMENT_VERSION", SEGMENT_VERSION as u64),
        ("HEADER_SIZE", HEADER_SIZE as u64),
        ("RING_DESCS_OFFSET", RING_DESCS_OFFSET),
        ("INLINE_MAX", INLINE_MAX as u64),
        ("RING_FREE", RingId::Free as u64),
        ("RING_RX", RingId::Rx as u64),
        ("RING_TX", RingId::Tx as u64),
        ("RING_COMPLETION", RingId::Completion as u64),
        ("DESC_INLINE", Desc::INLINE as u64),
        ("DESC_REJECTED", Desc::REJECTED as u64),
        ("DESC_MORE", Desc::MORE as u64),
        ("DESC_CHAIN", Desc::CHAIN as u64),
        ("DESC_QUIET", Desc::QUIET as u64),
        ("DESC_CSUM_OK", Desc::CSUM_OK as u64),
        ("MAX_PARTS", MAX_PARTS as u64),
        ("WAKE_SLEEPING", WakeWord::SLEEPING as u64),
        ("WAKE_UPCALLS_OFF", WakeWord::UPCALLS_OFF as u64),
        ("WAKE_ALMOST_FULL", WakeWord::ALMOST_FULL as u64),
        ("WAKE_RX_ONLY", WakeWord::RX_ONLY as u64),
        ("WAKE_FUTEX", WakeWord::FUTEX as u64),
    ];
    assert_eq!(
        c.len(),
        rust.len(),
        "the C program prints {} values",
        c.len()
    );
    for (name, value) in rust {
        assert_eq!(c.get(name), Some(&value), "{name}: C vs Rust");
    }
}

const COUNT: u32 = 20_000;

/// The child dies with a failing test instead of spinning on.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Frame `i`: varying lengths; two in three short ones go inline.
fn frame(i: u32) -> (Vec<u8>, bool) {
    let len = 1 + (i as usize * 37) % 300;
    let bytes = (0..len).map(|k| (i as usize * 7 + k) as u8).collect();
    (bytes, len <= INLINE_MAX && !i.is_multiple_of(3))
}

#[test]
fn c_program_echoes_frames() {
    let Some(exe) = compile() else { return };
    let config = SegmentConfig {
        frame_size: 2048,
        frame_count: 64,
        ring_entries: [64; 4],
    };
    let seg = Segment::create(&config).unwrap();
    let events = Doorbells::new().unwrap();
    let kick = events.try_clone().unwrap().mux;
    let (seg_fd, kick_fd) = (seg.fd().as_raw_fd(), kick.fds().1.as_raw_fd());
    let mut cmd = Command::new(&exe);
    cmd.args([
        "echo",
        &seg_fd.to_string(),
        &kick_fd.to_string(),
        &COUNT.to_string(),
    ]);
    common::inherit_fds(&mut cmd, vec![seg_fd, kick_fd]);
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let mut mux = seg.into_mux(events);
    let layout = *mux.frames.layout();

    let (mut sent, mut received, mut sleeps) = (0u32, 0u32, 0u32);
    let mut inline = [0u8; INLINE_MAX];
    let mut copy = vec![0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs(60);
    while received < COUNT {
        assert!(Instant::now() < deadline, "stuck at {received} of {COUNT}");
        let mut progress = false;
        while sent < COUNT && sent - received < 48 {
            let (bytes, as_inline) = frame(sent);
            if as_inline {
                assert!(mux.rx.push_inline(7, &bytes).unwrap());
            } else {
                let Some(buf) = mux.free.pop().unwrap() else {
                    break;
                };
                layout.validate_buffer(buf).unwrap();
                mux.frames.write(buf.offset, &bytes).unwrap();
                assert!(mux
                    .rx
                    .push(Desc::buffer(buf.offset, bytes.len() as u32, 7))
                    .unwrap());
            }
            sent += 1;
            progress = true;
        }
        while let Some(d) = mux.tx.pop_frame(&mut inline).unwrap() {
            layout.validate_frame(d).unwrap();
            let (bytes, as_inline) = frame(received);
            assert_eq!(
                (d.is_inline(), d.channel),
                (as_inline, 7),
                "frame {received}"
            );
            let got = if d.is_inline() {
                &inline[..d.len as usize]
            } else {
                let n = mux.frames.read(d, &mut copy).unwrap();
                let buf = layout.buffer_of(d.offset).unwrap();
                assert!(mux
                    .completion
                    .push(Desc::buffer(buf, d.len, d.channel))
                    .unwrap());
                &copy[..n]
            };
            assert_eq!(got, &bytes[..], "frame {received}");
            received += 1;
            progress = true;
        }
        if !progress {
            // Nothing to do until the C side sends or frees: sleep, and
            // rely on it to kick us (a timeout would be a lost wake-up).
            let wants_buffers = sent < COUNT && sent - received < 48;
            let w = mux
                .wake
                .sleep(Some(Duration::from_secs(10)), || {
                    mux.tx.has_pending() || (wants_buffers && mux.free.has_pending())
                })
                .unwrap();
            assert_ne!(w, Wakeup::TimedOut, "lost wake-up after {received} frames");
            sleeps += (w == Wakeup::Signaled) as u32;
        }
    }
    let status = child.0.wait().unwrap();
    assert!(status.success(), "C program: {status}");
    eprintln!("{COUNT} frames echoed by C; the multiplexer was kicked awake {sleeps} times");
}
