//! The C example handlers (handlers/*.c, built with clang against
//! include/exonet_ash.h) behave like their WAT twins: the same verdicts, the
//! same frames sent and the same window contents, frame after frame.
//! Skipped where clang or wasm-ld is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;
use exonet_ash::handler::examples::{self, CacheLayout};
use exonet_ash::handler::Outcome;
use exonet_wire::build::{self, Transport};
use exonet_wire::{EthernetRepr, Ipv4Repr, MacAddr, UdpRepr, VlanTag};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

/// Every example: its name (handlers/<name>.c) and WAT twin.
const TWINS: &[(&str, &str)] = &[
    ("empty", examples::EMPTY_WAT),
    ("empty_consume", examples::EMPTY_CONSUME_WAT),
    ("remote_write", examples::REMOTE_WRITE_WAT),
    ("remote_increment", examples::REMOTE_INCREMENT_WAT),
    ("udp_echo", examples::UDP_ECHO_WAT),
    ("cache_server", examples::CACHE_SERVER_WAT),
];

fn found(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The C handlers compiled once, in TWINS' order; `None` without clang.
fn compiled() -> Option<&'static [Vec<u8>]> {
    static WASM: OnceLock<Option<Vec<Vec<u8>>>> = OnceLock::new();
    WASM.get_or_init(|| {
        if !found("clang") || !found("wasm-ld") {
            return None;
        }
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ash-handlers");
        std::fs::create_dir_all(&out_dir).expect("output directory");
        Some(
            TWINS
                .iter()
                .map(|(name, _)| compile(crate_dir, &out_dir, name))
                .collect(),
        )
    })
    .as_deref()
}

/// `clang` with the flags exonet_ash.h documents.
fn compile(crate_dir: &Path, out_dir: &Path, name: &str) -> Vec<u8> {
    let src = crate_dir.join("handlers").join(format!("{name}.c"));
    let out: PathBuf = out_dir.join(format!("{name}.wasm"));
    let status = Command::new("clang")
        .args([
            "--target=wasm32",
            "-nostdlib",
            "-O2",
            "-mcpu=mvp",
            "-mmutable-globals",
            "-msign-ext",
            "-mbulk-memory",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wl,--no-entry",
            "-Wl,--export=ash_handle",
            "-Wl,--export=__stack_pointer",
        ])
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("clang runs");
    assert!(status.success(), "clang failed on {}", src.display());
    std::fs::read(&out).expect("clang's output")
}

/// The window each handler gets (identical for both twins).
fn segment(name: &str) -> Segment {
    let layout = CacheLayout::new(3, 8, 16).expect("layout");
    let seg = Segment::new(layout.window_len().max(64));
    match name {
        "remote_increment" => seg.write(8, &u64::MAX.to_le_bytes()[..7]),
        "cache_server" => {
            let mut cache = vec![0; layout.window_len()];
            assert!(layout.format(&mut cache));
            assert!(layout.insert(&mut cache, 0, b"alpha", b"first value"));
            assert!(layout.insert(&mut cache, 2, b"beta", b""));
            seg.write(0, &cache);
        }
        _ => {}
    }
    seg
}

/// A UDP frame with IPv4 options and VLAN tags as given.
fn udp_with(options: &[u8], vlans: &[VlanTag], payload: &[u8]) -> Vec<u8> {
    let eth = EthernetRepr {
        dst: SERVER_MAC,
        src: CLIENT_MAC,
        vlans,
        ethertype: 0,
    };
    let ip = Ipv4Repr {
        options,
        ..Ipv4Repr::new(CLIENT_IP, SERVER_IP, 0, 0)
    };
    let udp = UdpRepr {
        src_port: CLIENT_PORT,
        dst_port: SERVER_PORT,
        payload,
    };
    build::ipv4_frame(&eth, &ip, &Transport::Udp(udp)).expect("a frame")
}

fn remote_write(off: u32, len: u32, data: &[u8]) -> Vec<u8> {
    request(&[&off.to_le_bytes()[..], &len.to_le_bytes(), data].concat())
}

/// Frames every handler is tried on, good and bad.
fn corpus() -> Vec<Vec<u8>> {
    let mut frames = vec![
        request(b""),
        request(b"alpha"),
        request(b"beta"),
        request(b"alph"),
        request(&8u32.to_le_bytes()),
        request(&8u32.to_le_bytes()),
        request(&60u32.to_le_bytes()),
        request(&[0xff; 4]),
        remote_write(3, 5, b"hello"),
        remote_write(60, 4, b"tail"),
        remote_write(61, 4, b"tail"),
        remote_write(0, 9, b"short"),
        request(&[0x5a; 1400]),
        udp_with(&[1, 1, 1, 1], &[], b"alpha"),
        udp_with(&[], &[VlanTag::new(5)], b"alpha"),
        build::tcp_frame(
            CLIENT_MAC,
            SERVER_MAC,
            CLIENT_IP,
            SERVER_IP,
            1,
            2,
            0x02,
            0,
            0,
            &[],
            b"x",
        ),
        build::arp_request(MacAddr([2; 6]), CLIENT_IP, SERVER_IP),
        vec![],
        vec![0; 60],
    ];
    let mut fragment = request(b"alpha");
    fragment[20] |= 0x20; // more fragments
    frames.push(fragment);
    let mut long_udp = request(b"alpha");
    long_udp[39] += 1; // UDP length past the datagram
    frames.push(long_udp);
    let truncated = request(b"alpha");
    frames.push(truncated[..truncated.len() - 2].to_vec());
    frames
}

/// Runs both twins over `frames`, comparing everything they do.
fn same_behaviour(name: &str, c_wasm: &[u8], wat: &str, frames: &[Vec<u8>]) {
    let (c_seg, wat_seg) = (segment(name), segment(name));
    let mut c = install(c_wasm, Some(c_seg.window()));
    let mut w = install(wat.as_bytes(), Some(wat_seg.window()));
    let (mut c_out, mut w_out) = (outbox(), outbox());
    for (i, frame) in frames.iter().enumerate() {
        let (cr, wr) = (
            run(&mut c, frame, &mut c_out),
            run(&mut w, frame, &mut w_out),
        );
        assert_eq!(cr.outcome, wr.outcome, "{name}, frame {i}");
        assert!(c_out.iter().eq(w_out.iter()), "{name}, frame {i}: sends");
        assert_eq!(c_seg.read(), wat_seg.read(), "{name}, frame {i}: window");
    }
}

#[test]
fn c_handlers_behave_like_their_wat_twins() {
    let Some(wasm) = compiled() else {
        println!("skipped: clang/wasm-ld not found");
        return;
    };
    let frames = corpus();
    for ((name, wat), c_wasm) in TWINS.iter().zip(wasm) {
        same_behaviour(name, c_wasm, wat, &frames);
    }
    // The corpus exercises hits and aborts alike.
    let cache = TWINS.iter().position(|(name, _)| *name == "cache_server");
    let seg = segment("cache_server");
    let mut h = install(&wasm[cache.expect("a twin")], Some(seg.window()));
    let mut out = outbox();
    let outcomes: Vec<Outcome> = frames
        .iter()
        .map(|f| run(&mut h, f, &mut out).outcome)
        .collect();
    assert!(outcomes.contains(&Outcome::Consumed));
    assert!(outcomes.iter().any(|o| matches!(o, Outcome::Aborted(_))));
}

#[test]
fn twins_agree_on_random_frames() {
    let Some(wasm) = compiled() else {
        println!("skipped: clang/wasm-ld not found");
        return;
    };
    let frames = proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 1..6);
    let flips = proptest::collection::vec((0usize..60, any::<u8>()), 0..3);
    let mut runner = TestRunner::new(ProptestConfig::with_cases(24));
    let result = runner.run(&(frames, flips), |(payloads, flips)| {
        let frames: Vec<Vec<u8>> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut f = request(p);
                // Corrupt the headers of every other frame.
                if i % 2 == 1 {
                    for &(at, v) in &flips {
                        if let Some(b) = f.get_mut(at) {
                            *b = v;
                        }
                    }
                }
                f
            })
            .collect();
        for ((name, wat), c_wasm) in TWINS.iter().zip(wasm) {
            same_behaviour(name, c_wasm, wat, &frames);
        }
        Ok(())
    });
    result.unwrap_or_else(|e| panic!("{e}"));
}

/// C keeps its stack in memory, below `__stack_pointer`; an abort leaves the
/// aborting functions' frames allocated unless the runtime resets it. Many
/// aborts in a row would otherwise run the stack out of its memory.
#[test]
fn c_stack_survives_many_aborts() {
    let Some(wasm) = compiled() else {
        println!("skipped: clang/wasm-ld not found");
        return;
    };
    let at = TWINS
        .iter()
        .position(|(name, _)| *name == "remote_increment");
    let seg = segment("remote_increment");
    let mut h = install(&wasm[at.expect("a twin")], Some(seg.window()));
    let mut out = outbox();
    let outside = request(&1000u32.to_le_bytes());
    for _ in 0..10_000 {
        assert_eq!(
            run(&mut h, &outside, &mut out).outcome,
            Outcome::Aborted(exonet_ash::handler::Abort::Requested)
        );
    }
    let good = request(&0u32.to_le_bytes());
    assert_eq!(run(&mut h, &good, &mut out).outcome, Outcome::Consumed);
    assert_eq!(
        reply_payload(out.get(0).expect("reply"), &good),
        1u64.to_le_bytes()
    );
}
