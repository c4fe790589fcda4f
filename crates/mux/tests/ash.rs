//! Handlers (ASH) in the multiplexer: installed on a channel, run on its
//! frames before delivery, their sends held to the channel's template,
//! their aborts delivering the frame untouched, their cost bounded per
//! invocation and per endpoint, and whatever they do costing only their
//! own endpoint.

mod common;

use std::time::Duration;

use common::*;
use exonet_ash::handler::examples;
use exonet_ash::layer::{
    Composition, Ipv4Layer, Layer, LayerError, LayerPipes, Message, Pass, UdpLayer,
};
use exonet_ash::pipe::builtins;
use exonet_link::Link;
use exonet_mux::{ChannelSpec, HandlerLimits, Mux, MuxConfig, MuxError, Proto};
use exonet_shm::control::HandlerSpec;
use exonet_shm::AppEndpoint;
use exonet_wire::build;

fn udp_to(port: u16, payload: &[u8]) -> Vec<u8> {
    build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 7777, port, payload)
}

fn spec(port: u16) -> ChannelSpec {
    ChannelSpec {
        proto: Proto::Udp,
        local_addr: HOST,
        local_port: port,
        remote: None,
    }
}

/// A window of two buffers this endpoint kept off its free ring.
fn window(app: &AppEndpoint, kept: &[u32]) -> (u32, u32) {
    let fs = app.frames.layout().frame_size();
    let n = kept.len() as u32;
    (kept[kept.len() - 2], 2 * fs.min(n * fs))
}

fn install(mux: &mut Mux, ch: exonet_mux::ChannelId, module: &str, window: Option<(u32, u32)>) {
    let spec = HandlerSpec {
        module: module.as_bytes().to_vec(),
        window,
        ..HandlerSpec::default()
    };
    mux.install_handler(ch, &spec, &spec.module).unwrap();
}

fn read_window(app: &AppEndpoint, at: u32, n: usize) -> Vec<u8> {
    let p = app.frames.area_ptr(at, n as u32).unwrap();
    let mut out = vec![0; n];
    // SAFETY: `area_ptr` checked the range; the multiplexer is not running.
    unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), out.as_mut_ptr(), n) };
    out
}

#[test]
fn remote_increment_answers_from_the_multiplexer() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, kept) = endpoint(&mut mux, 16, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let win = window(&app, &kept);
    install(&mut mux, ch, examples::REMOTE_INCREMENT_WAT, Some(win));
    for want in 1..=3u64 {
        wire.send_batch(&[&udp_to(5000, &16u32.to_le_bytes())])
            .unwrap();
        mux.poll_rx().unwrap();
        let replies = drain_wire(&mut wire);
        assert_eq!(replies.len(), 1, "one reply per request");
        let r = &replies[0];
        let udp = etherparse::SlicedPacket::from_ethernet(r).unwrap();
        let Some(etherparse::TransportSlice::Udp(u)) = udp.transport else {
            panic!("not UDP: {r:?}")
        };
        assert_eq!((u.source_port(), u.destination_port()), (5000, 7777));
        assert_eq!(u.payload(), want.to_le_bytes());
        assert_eq!(read_window(&app, win.0 + 16, 8), want.to_le_bytes());
    }
    assert!(drain_rx(&mut app).is_empty(), "the handler consumed them");
    let c = mux.channel_stats(ch).unwrap();
    assert_eq!((c.handler_runs, c.rx_consumed, c.handler_sent), (3, 3, 3));
    let e = mux.endpoint_stats(a).unwrap();
    assert!(e.handler_fuel > 0 && e.handler_cycles > 0);
    // Removed, the frames reach the application again.
    mux.set_handler(ch, None).unwrap();
    wire.send_batch(&[&udp_to(5000, &16u32.to_le_bytes())])
        .unwrap();
    mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut app).len(), 1);
}

const ENDLESS: &str = r#"(module (func (export "ash_handle") (param i32) (result i32)
    (loop $l (br $l)) (i32.const 0)))"#;
const TRAPS: &str = r#"(module (func (export "ash_handle") (param i32) (result i32)
    (unreachable)))"#;
const BAD_VERDICT: &str = r#"(module (func (export "ash_handle") (param i32) (result i32)
    (i32.const 7)))"#;
/// Answers the frame with a copy of it turned round, from UDP port `sport`.
fn turn_round(sport: u16) -> String {
    format!(
        r#"(module
    (import "exonet" "peek" (func $peek (param i32 i32 i32) (result i32)))
    (import "exonet" "send" (func $send (param i32 i32) (result i32)))
    (memory (export "memory") 1)
    (func $swap (param $a i32) (param $b i32) (param $n i32)
        (memory.copy (i32.const 4096) (local.get $a) (local.get $n))
        (memory.copy (local.get $a) (local.get $b) (local.get $n))
        (memory.copy (local.get $b) (i32.const 4096) (local.get $n)))
    (func (export "ash_handle") (param $n i32) (result i32)
        (drop (call $peek (i32.const 0) (i32.const 0) (local.get $n)))
        (call $swap (i32.const 0) (i32.const 6) (i32.const 6))
        (call $swap (i32.const 26) (i32.const 30) (i32.const 4))
        (call $swap (i32.const 34) (i32.const 36) (i32.const 2))
        (i32.store8 (i32.const 34) (i32.const {hi}))
        (i32.store8 (i32.const 35) (i32.const {lo}))
        (drop (call $send (i32.const 0) (local.get $n)))
        (i32.const 0)))"#,
        hi = sport >> 8,
        lo = sport & 0xff
    )
}

#[test]
fn aborts_deliver_the_frame_and_cost_only_their_endpoint() {
    let (mut mux, mut wire) = mux();
    let (a, mut app_a, _) = endpoint(&mut mux, 16, false);
    let (b, mut app_b, _) = endpoint(&mut mux, 16, false);
    let mut chans = Vec::new();
    for (i, module) in [ENDLESS, TRAPS, BAD_VERDICT].into_iter().enumerate() {
        let port = 5000 + i as u16;
        let (ch, _) = mux.bind_socket(a, spec(port)).unwrap();
        install(&mut mux, ch, module, None);
        chans.push((ch, port));
    }
    let (cb, _) = mux.bind_socket(b, spec(6100)).unwrap();
    for round in 0..3 {
        for &(_, port) in &chans {
            wire.send_batch(&[&udp_to(port, format!("a{round}").as_bytes())])
                .unwrap();
        }
        wire.send_batch(&[&udp_to(6100, format!("b{round}").as_bytes())])
            .unwrap();
        mux.poll_rx().unwrap();
        // Every aborted frame arrives untouched; B never notices.
        assert_eq!(drain_rx(&mut app_a).len(), 3);
        let got = drain_rx(&mut app_b);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, cb.0);
    }
    let s: Vec<_> = chans
        .iter()
        .map(|&(ch, _)| mux.channel_stats(ch).unwrap())
        .collect();
    assert_eq!(s[0].handler_out_of_fuel, 3);
    assert_eq!(s[1].handler_traps, 3);
    assert_eq!(s[2].handler_bad_verdict, 3);
    assert!(s.iter().all(|c| c.handler_runs == 3 && c.rx_consumed == 0));
    assert_eq!(mux.endpoint_stats(b).unwrap().handler_cycles, 0);
    assert!(drain_wire(&mut wire).is_empty());
}

#[test]
fn sends_are_held_to_the_template() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, _) = endpoint(&mut mux, 16, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    // From its own port, the turned-round frame leaves.
    install(&mut mux, ch, &turn_round(5000), None);
    wire.send_batch(&[&udp_to(5000, b"turn me round")]).unwrap();
    mux.poll_rx().unwrap();
    let out = drain_wire(&mut wire);
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0][34..38], &[0x13, 0x88, 0x1e, 0x61]);
    // From a port the endpoint does not own, it does not.
    install(&mut mux, ch, &turn_round(5001), None);
    wire.send_batch(&[&udp_to(5000, b"spoof me")]).unwrap();
    mux.poll_rx().unwrap();
    assert!(drain_wire(&mut wire).is_empty(), "nothing spoofed leaves");
    assert!(drain_rx(&mut app).is_empty());
    let c = mux.channel_stats(ch).unwrap();
    assert_eq!((c.handler_send_refused, c.handler_sent), (1, 1));
}

#[test]
fn an_endpoint_budget_bounds_its_handlers() {
    let (mut mux, mut wire) = mux_with(MuxConfig {
        handlers: HandlerLimits {
            fuel: 10_000,
            budget: 25_000,
            period: Duration::from_secs(3600),
            ..HandlerLimits::default()
        },
        ..MuxConfig::default()
    });
    let (a, mut app, _) = endpoint(&mut mux, 16, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    install(&mut mux, ch, ENDLESS, None);
    for i in 0..5u8 {
        wire.send_batch(&[&udp_to(5000, &[i])]).unwrap();
        mux.poll_rx().unwrap();
    }
    // 10 000 fuel each: three runs reach the budget, the other two frames
    // go by without their handler. All five are delivered.
    assert_eq!(drain_rx(&mut app).len(), 5);
    let c = mux.channel_stats(ch).unwrap();
    let e = mux.endpoint_stats(a).unwrap();
    assert_eq!((c.handler_runs, e.handler_over_budget), (3, 2));
    assert!(e.handler_fuel >= 30_000);
}

#[test]
fn installs_are_checked() {
    let (mut mux, _wire) = mux();
    let (a, app, kept) = endpoint(&mut mux, 16, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let refuse =
        |mux: &mut Mux, spec: HandlerSpec| match mux.install_handler(ch, &spec, &spec.module) {
            Err(MuxError::BadHandler(why)) => why,
            other => panic!("installed: {other:?}"),
        };
    let why = refuse(
        &mut mux,
        HandlerSpec {
            module: b"\0asm garbage".to_vec(),
            ..HandlerSpec::default()
        },
    );
    assert!(!why.is_empty());
    // A window must lie in the endpoint's own frame area.
    let layout = *app.frames.layout();
    let end = (layout.frames_offset() + layout.frame_count() as u64 * 2048) as u32;
    for win in [(0, 4096), (end - 1024, 2048), (kept[0], u32::MAX)] {
        let why = refuse(
            &mut mux,
            HandlerSpec {
                module: examples::EMPTY_WAT.as_bytes().to_vec(),
                window: Some(win),
                ..HandlerSpec::default()
            },
        );
        assert!(why.contains("window"), "{why}");
    }
    let why = refuse(
        &mut mux,
        HandlerSpec {
            module: examples::EMPTY_WAT.as_bytes().to_vec(),
            pipe_lists: vec![vec![0xff; 9]],
            ..HandlerSpec::default()
        },
    );
    assert!(why.contains("pipe list 0"), "{why}");
    assert!(matches!(
        mux.install_handler(exonet_mux::ChannelId(999), &HandlerSpec::default(), &[]),
        Err(MuxError::NoSuchChannel(_))
    ));
    // Nothing was installed.
    assert!(!mux.stats().channels[0].has_handler);
}

/// Message vectoring through a pipe list (the paper's Figure 1): the UDP
/// payload goes into the window byte-swapped, checksummed in the same
/// loop, and the checksum accumulator is stored beside it.
const VECTOR_ILP: &str = r#"(module
    (import "exonet" "skip" (func $skip (param i32) (result i32)))
    (import "exonet" "consume_window" (func $cw (param i32 i32 i32) (result i32)))
    (import "exonet" "pipe_reg" (func $reg (param i32 i32 i32) (result i64)))
    (import "exonet" "pipe_set_reg" (func $set (param i32 i32 i32 i64)))
    (import "exonet" "window_store64" (func $store (param i32 i64)))
    (func (export "ash_handle") (param $n i32) (result i32)
        (call $set (i32.const 0) (i32.const 0) (i32.const 0) (i64.const 0))
        (drop (call $skip (i32.const 42)))
        (if (i32.lt_s (call $cw (i32.const 64) (i32.sub (local.get $n) (i32.const 42)) (i32.const 0))
                      (i32.const 0))
            (then (unreachable)))
        (call $store (i32.const 0) (call $reg (i32.const 0) (i32.const 0) (i32.const 0)))
        (i32.const 0)))"#;

#[test]
fn pipe_lists_vector_messages_into_the_window() {
    use exonet_ash::pipe::{builtins, PipeList};
    let (mut mux, mut wire) = mux();
    let (a, app, kept) = endpoint(&mut mux, 16, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let win = window(&app, &kept);
    let list = PipeList::new(vec![builtins::checksum(), builtins::byte_swap32()]).unwrap();
    let spec = HandlerSpec {
        module: VECTOR_ILP.as_bytes().to_vec(),
        window: Some(win),
        pipe_lists: vec![list.encode()],
        ..HandlerSpec::default()
    };
    mux.install_handler(ch, &spec, &spec.module).unwrap();
    for len in [4usize, 64, 1000, 1472] {
        let payload: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8).collect();
        wire.send_batch(&[&udp_to(5000, &payload)]).unwrap();
        mux.poll_rx().unwrap();
        let got = read_window(&app, win.0 + 64, len);
        let want: Vec<u8> = payload
            .chunks(4)
            .flat_map(|w| w.iter().rev().copied().collect::<Vec<u8>>())
            .collect();
        assert_eq!(got, want, "{len}: swapped into the window");
        let acc = u64::from_le_bytes(read_window(&app, win.0, 8).try_into().unwrap());
        assert_eq!(
            builtins::fold_checksum(acc),
            builtins::fold_checksum(builtins::checksum_accumulate(0, &payload)),
            "{len}: summed in the same loop"
        );
    }
    let c = mux.channel_stats(ch).unwrap();
    assert_eq!((c.handler_runs, c.rx_consumed, c.handler_traps), (4, 4, 0));
}

/// The application layer of a composition: takes the payload through its
/// byte swap (and the UDP checksum the layer below pushed) in one loop,
/// keeps it on commit.
struct Collect {
    staged: Vec<u8>,
    kept: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl Layer for Collect {
    fn pipes(&self) -> LayerPipes {
        LayerPipes {
            up: Vec::new(),
            own: vec![builtins::byte_swap32()],
        }
    }

    fn body(&mut self, msg: &mut Message<'_>) -> Result<Pass, LayerError> {
        let n = msg.remaining();
        self.staged.resize(n, 0);
        msg.consume_into(&mut self.staged, n, true)?;
        Ok(Pass::Consumed)
    }

    fn commit(&mut self, _: &Message<'_>) -> Result<(), LayerError> {
        let got = std::mem::take(&mut self.staged);
        self.kept.lock().expect("not poisoned").push(got);
        Ok(())
    }

    fn abort(&mut self) {
        self.staged.clear();
    }
}

#[test]
fn a_composition_of_ip_udp_and_application_layers_runs_on_its_channel() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, _) = endpoint(&mut mux, 16, false);
    let (ch, _) = mux.bind_socket(a, spec(5000)).unwrap();
    let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(Ipv4Layer),
        Box::new(UdpLayer::default()),
        Box::new(Collect {
            staged: Vec::new(),
            kept: kept.clone(),
        }),
    ];
    let composed = Composition::new(layers).unwrap();
    mux.set_handler(ch, Some(Box::new(composed))).unwrap();

    let good = udp_to(5000, b"abcdefgh");
    // The same datagram with a payload byte changed: its checksum fails.
    let mut bad = good.clone();
    *bad.last_mut().unwrap() ^= 0x20;
    // Without a checksum (0: none was sent), taken as it is.
    let mut unchecked = udp_to(5000, b"12345678");
    unchecked[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
    wire.send_batch(&[&good, &bad, &unchecked]).unwrap();
    mux.poll_rx().unwrap();

    assert!(drain_rx(&mut app).is_empty(), "consumed or dropped");
    let kept = kept.lock().unwrap().clone();
    assert_eq!(kept, vec![b"dcbahgfe".to_vec(), b"43218765".to_vec()]);
    let c = mux.channel_stats(ch).unwrap();
    assert_eq!(
        (c.handler_runs, c.rx_consumed, c.handler_dropped),
        (3, 3, 1)
    );
}
