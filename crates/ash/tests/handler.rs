//! The handler runtime and the example handlers on hand-built frames, with a
//! heap buffer as the application's window.

mod common;

use common::*;
use exonet_ash::handler::examples::{self, CacheLayout};
use exonet_ash::handler::{Abort, Engine, Handler, HandlerConfig, Outbox, Outcome};
use exonet_ash::Transfer;

const ABORTED: Outcome = Outcome::Aborted(Abort::Requested);

#[test]
fn handlers_can_move_to_the_multiplexer_thread() {
    fn send<T: Send>() {}
    fn shared<T: Send + Sync + Clone>() {}
    send::<Handler>();
    send::<Outbox>();
    shared::<Engine>();
}

#[test]
fn installed_on_one_thread_run_on_another() {
    let seg = Segment::new(64);
    seg.write(8, &41u64.to_le_bytes());
    let mut h = install(
        examples::REMOTE_INCREMENT_WAT.as_bytes(),
        Some(seg.window()),
    );
    let req = request(&8u32.to_le_bytes());
    let mut out = outbox();
    assert_eq!(run(&mut h, &req, &mut out).outcome, Outcome::Consumed);
    let (_handler, out) = std::thread::spawn(move || {
        assert_eq!(run(&mut h, &req, &mut out).outcome, Outcome::Consumed);
        (h, out)
    })
    .join()
    .expect("the other thread");
    assert_eq!(out.len(), 1);
    assert_eq!(seg.read()[8..16], 43u64.to_le_bytes());
}

#[test]
fn empty_handlers() {
    let mut out = outbox();
    let mut deliver = install(examples::EMPTY_WAT.as_bytes(), None);
    let mut consume = install(examples::EMPTY_CONSUME_WAT.as_bytes(), None);
    let f = request(b"x");
    let r = run(&mut deliver, &f, &mut out);
    assert_eq!(r.outcome, Outcome::Deliver);
    assert!(
        r.fuel > 0 && r.fuel < 10,
        "a handful of instructions: {}",
        r.fuel
    );
    assert_eq!(run(&mut deliver, &f, &mut out), r, "deterministic");
    assert_eq!(run(&mut consume, &f, &mut out).outcome, Outcome::Consumed);
    assert!(out.is_empty());
}

#[test]
fn remote_write_vectors_into_the_window() {
    let seg = Segment::new(256);
    let mut h = install(examples::REMOTE_WRITE_WAT.as_bytes(), Some(seg.window()));
    let mut out = outbox();
    let msg = |off: u32, len: u32, data: &[u8]| {
        request(&[&off.to_le_bytes()[..], &len.to_le_bytes(), data].concat())
    };

    let r = run(&mut h, &msg(100, 5, b"hello"), &mut out);
    assert_eq!(r.outcome, Outcome::Consumed);
    assert!(out.is_empty());
    let w = seg.read();
    assert_eq!(&w[100..105], b"hello");
    assert!(w[..100].iter().chain(&w[105..]).all(|&b| b == 0));

    // The last bytes of the window, and an empty write.
    assert_eq!(
        run(&mut h, &msg(251, 5, b"world"), &mut out).outcome,
        Outcome::Consumed
    );
    assert_eq!(
        run(&mut h, &msg(256, 0, b""), &mut out).outcome,
        Outcome::Consumed
    );
    assert_eq!(&seg.read()[251..], b"world");

    // Short, incomplete, out of the window, not UDP: aborted, window intact.
    let before = seg.read();
    for bad in [
        request(&[1, 0, 0]),
        msg(0, 6, b"hello"),
        msg(252, 5, b"world"),
        msg(u32::MAX, 5, b"world"),
        msg(0, u32::MAX, b"world"),
        msg(0, 5, b"hello")[..40].to_vec(),
        vec![0; 60],
    ] {
        assert_eq!(run(&mut h, &bad, &mut out).outcome, ABORTED);
    }
    assert_eq!(seg.read(), before);
}

#[test]
fn remote_increment_replies_with_the_new_value() {
    let seg = Segment::new(64);
    seg.write(8, &41u64.to_le_bytes());
    let mut h = install(
        examples::REMOTE_INCREMENT_WAT.as_bytes(),
        Some(seg.window()),
    );
    let mut out = outbox();
    let req = request(&8u32.to_le_bytes());
    for expect in [42u64, 43] {
        assert_eq!(run(&mut h, &req, &mut out).outcome, Outcome::Consumed);
        assert_eq!(out.len(), 1);
        let reply = out.get(0).expect("a reply");
        assert_eq!(reply_payload(reply, &req), expect.to_le_bytes());
        assert_eq!(seg.read()[8..16], expect.to_le_bytes());
    }
    // Unaligned counters are fine; one past the end is not.
    assert_eq!(
        run(&mut h, &request(&56u32.to_le_bytes()), &mut out).outcome,
        Outcome::Consumed
    );
    assert_eq!(seg.read()[56..64], 1u64.to_le_bytes());
    for bad in [
        request(&57u32.to_le_bytes()),
        request(&[8, 0]),
        request(&[]),
    ] {
        assert_eq!(run(&mut h, &bad, &mut out).outcome, ABORTED);
        assert!(out.is_empty());
    }
    assert_eq!(seg.read()[8..16], 43u64.to_le_bytes());
}

#[test]
fn udp_echo() {
    let mut h = install(examples::UDP_ECHO_WAT.as_bytes(), None);
    let mut out = outbox();
    for payload in [&b""[..], b"echo", &[0xa5; 1472], &[7; 8972]] {
        let req = request(payload);
        assert_eq!(run(&mut h, &req, &mut out).outcome, Outcome::Consumed);
        assert_eq!(out.len(), 1);
        assert_eq!(reply_payload(out.get(0).expect("reply"), &req), payload);
    }
    // A reply over max_send_len does not fit: abort, the application sees it.
    assert_eq!(run(&mut h, &request(&[7; 8977]), &mut out).outcome, ABORTED);
    assert!(out.is_empty());
}

#[test]
fn cache_server_hits_and_misses() {
    let layout = CacheLayout::new(4, 16, 64).expect("layout");
    let seg = Segment::new(layout.window_len());
    let mut cache = vec![0; layout.window_len()];
    assert!(layout.format(&mut cache));
    assert!(layout.insert(&mut cache, 1, b"index.html", b"<html>hi</html>"));
    assert!(layout.insert(&mut cache, 3, b"index.htm", b"short"));
    assert!(layout.insert(&mut cache, 2, b"empty", b""));
    seg.write(0, &cache);
    let mut h = install(examples::CACHE_SERVER_WAT.as_bytes(), Some(seg.window()));
    let mut out = outbox();
    for (key, value) in [
        (&b"index.html"[..], &b"<html>hi</html>"[..]),
        (b"index.htm", b"short"),
        (b"empty", b""),
    ] {
        let req = request(key);
        assert_eq!(run(&mut h, &req, &mut out).outcome, Outcome::Consumed);
        assert_eq!(reply_payload(out.get(0).expect("reply"), &req), value);
    }
    for miss in [&b"index.h"[..], b"index.html5", b"", &[b'x'; 17]] {
        assert_eq!(run(&mut h, &request(miss), &mut out).outcome, ABORTED);
        assert!(out.is_empty());
    }
    // The application evicts an entry: now a miss.
    assert!(layout.remove(&mut cache, 1));
    seg.write(0, &cache);
    assert_eq!(
        run(&mut h, &request(b"index.html"), &mut out).outcome,
        ABORTED
    );
}

#[test]
fn private_state_persists() {
    let seg = Segment::new(16);
    let mut h = install(
        br#"(module
            (import "exonet" "window_store32" (func $store (param i32 i32)))
            (memory 1)
            (global $calls (mut i32) (i32.const 0))
            (func (export "ash_handle") (param $len i32) (result i32)
              (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
              (i32.store (i32.const 0) (i32.add (i32.load (i32.const 0)) (local.get $len)))
              (call $store (i32.const 0) (global.get $calls))
              (call $store (i32.const 4) (i32.load (i32.const 0)))
              (i32.const 1)))"#,
        Some(seg.window()),
    );
    let mut out = outbox();
    for len in [10, 20, 30] {
        assert_eq!(
            run(&mut h, &vec![0; len], &mut out).outcome,
            Outcome::Deliver
        );
    }
    assert_eq!(seg.read()[..8], [3, 0, 0, 0, 60, 0, 0, 0]);
}

#[test]
fn cursor_peek_consume_skip_seek() {
    // Each result goes to the window as an i32, in call order.
    let seg = Segment::new(64);
    let mut h = install(
        br#"(module
            (import "exonet" "msg_len" (func $len (result i32)))
            (import "exonet" "peek" (func $peek (param i32 i32 i32) (result i32)))
            (import "exonet" "consume" (func $consume (param i32 i32) (result i32)))
            (import "exonet" "skip" (func $skip (param i32) (result i32)))
            (import "exonet" "cursor" (func $cursor (result i32)))
            (import "exonet" "seek" (func $seek (param i32) (result i32)))
            (import "exonet" "window_write" (func $ww (param i32 i32 i32)))
            (import "exonet" "window_store32" (func $ws (param i32 i32)))
            (memory (export "memory") 1)
            (global $at (mut i32) (i32.const 0))
            (func $out (param i32)
              (call $ws (global.get $at) (local.get 0))
              (global.set $at (i32.add (global.get $at) (i32.const 4))))
            (func (export "ash_handle") (param i32) (result i32)
              (global.set $at (i32.const 0))
              (call $out (call $len))
              (call $out (call $peek (i32.const 100) (i32.const 2) (i32.const 3)))
              (call $out (call $peek (i32.const 100) (i32.const 8) (i32.const 3)))
              (call $out (call $cursor))
              (call $out (call $consume (i32.const 104) (i32.const 4)))
              (call $out (call $cursor))
              (call $out (call $skip (i32.const 7)))
              (call $out (call $skip (i32.const 5)))
              (call $out (call $cursor))
              (call $out (call $consume (i32.const 108) (i32.const 7)))
              (call $out (call $seek (i32.const 10)))
              (call $out (call $seek (i32.const 11)))
              (call $out (call $cursor))
              (call $ww (i32.const 56) (i32.const 100) (i32.const 8))
              (i32.const 1)))"#,
        Some(seg.window()),
    );
    let mut out = outbox();
    let frame: Vec<u8> = (0..10).collect();
    assert_eq!(run(&mut h, &frame, &mut out).outcome, Outcome::Deliver);
    let w = seg.read();
    let words: Vec<i32> = w[..52]
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    assert_eq!(words, [10, 3, -1, 0, 4, 4, -1, 5, 9, -1, 10, -1, 10]);
    assert_eq!(w[56..64], [2, 3, 4, 0, 0, 1, 2, 3]);
}

/// A transfer of our own (the real pipe lists land separately): copies and
/// adds the bytes into register 0 of pipe 0; costs one unit per 4 bytes.
struct SumCopy {
    sum: u64,
}

impl Transfer for SumCopy {
    fn transfer(&mut self, src: &[u8], dst: &mut [u8]) {
        dst.copy_from_slice(src);
        self.sum += src.iter().map(|&b| u64::from(b)).sum::<u64>();
    }

    fn reg(&self, pipe: usize, reg: usize) -> Option<u64> {
        (pipe == 0 && reg == 0).then_some(self.sum)
    }

    fn set_reg(&mut self, pipe: usize, reg: usize, value: u64) -> bool {
        let ok = pipe == 0 && reg == 0;
        if ok {
            self.sum = value;
        }
        ok
    }

    fn cost(&self, n: usize) -> u64 {
        n as u64 / 4
    }
}

#[test]
fn consume_window_through_a_pipe_list() {
    // Resets the sum, moves the whole frame to window offset 16 through pipe
    // list 0, stores the sum at 0.
    let wat = br#"(module
        (import "exonet" "consume_window" (func $cw (param i32 i32 i32) (result i32)))
        (import "exonet" "pipe_reg" (func $reg (param i32 i32 i32) (result i64)))
        (import "exonet" "pipe_set_reg" (func $set (param i32 i32 i32 i64)))
        (import "exonet" "window_store64" (func $st (param i32 i64)))
        (func (export "ash_handle") (param $len i32) (result i32)
          (call $set (i32.const 0) (i32.const 0) (i32.const 0) (i64.const 1000))
          (drop (call $cw (i32.const 16) (local.get $len) (i32.const 0)))
          (call $st (i32.const 0) (call $reg (i32.const 0) (i32.const 0) (i32.const 0)))
          (i32.const 0)))"#;
    let seg = Segment::new(16 + 1000);
    let mut h = Handler::install(
        &engine(),
        wat,
        vec![Box::new(SumCopy { sum: 0 })],
        Some(seg.window()),
        HandlerConfig::default(),
    )
    .expect("install");
    let mut out = outbox();
    let frame: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
    let small = run(&mut h, &frame[..200], &mut out);
    assert_eq!(small.outcome, Outcome::Consumed);
    let large = run(&mut h, &frame, &mut out);
    assert_eq!(large.outcome, Outcome::Consumed);
    let w = seg.read();
    let sum: u64 = frame.iter().map(|&b| u64::from(b)).sum();
    assert_eq!(w[..8], (1000 + sum).to_le_bytes());
    assert_eq!(w[16..616], frame[..]);
    // The same instructions ran: the difference is the transfer's cost.
    assert_eq!(large.fuel - small.fuel, 400 / 4);
}

#[test]
fn sends_are_limited_and_discarded_on_abort() {
    // Sends the frame (up to 5 times: the limit is 4), then aborts if the
    // frame's first byte is 1, returns 7 if it is 2.
    let wat = br#"(module
        (import "exonet" "peek" (func $peek (param i32 i32 i32) (result i32)))
        (import "exonet" "send" (func $send (param i32 i32) (result i32)))
        (import "exonet" "abort" (func $abort))
        (import "exonet" "window_store32" (func $ws (param i32 i32)))
        (memory (export "memory") 1)
        (func (export "ash_handle") (param $len i32) (result i32)
          (local $i i32)
          (drop (call $peek (i32.const 0) (i32.const 0) (local.get $len)))
          (loop $again
            (call $ws (i32.mul (local.get $i) (i32.const 4)) (call $send (i32.const 0) (local.get $len)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $again (i32.lt_u (local.get $i) (i32.const 5))))
          (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 1)) (then (call $abort)))
          (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 2)) (then (return (i32.const 7))))
          (i32.const 1)))"#;
    let seg = Segment::new(20);
    let mut h = install(wat, Some(seg.window()));
    let mut out = outbox();
    let frame = [0u8; 60];
    assert_eq!(run(&mut h, &frame, &mut out).outcome, Outcome::Deliver);
    assert_eq!(out.iter().collect::<Vec<_>>(), vec![&frame[..]; 4]);
    let results: Vec<u8> = seg.read().chunks(4).map(|c| c[0]).collect();
    assert_eq!(results, [0, 0, 0, 0, 0xff]);

    // Sends accumulate after what the caller left in the outbox; an abort
    // removes only this invocation's.
    let mut out = Outbox::new(8, 100);
    assert_eq!(h.run(&frame, &mut out).outcome, Outcome::Deliver);
    assert_eq!(h.run(&[1; 20], &mut out).outcome, ABORTED);
    assert_eq!(
        h.run(&[2; 20], &mut out).outcome,
        Outcome::Aborted(Abort::BadVerdict(7))
    );
    assert_eq!(out.len(), 4);
    // Too short for an Ethernet frame, or over the outbox's own limit.
    assert_eq!(run(&mut h, &[0; 13], &mut out).outcome, Outcome::Deliver);
    assert!(out.is_empty());
    let mut small = Outbox::new(2, 30);
    assert_eq!(h.run(&[0; 31], &mut small).outcome, Outcome::Deliver);
    assert!(small.is_empty());
    assert_eq!(h.run(&[0; 30], &mut small).outcome, Outcome::Deliver);
    assert_eq!(small.len(), 2);
}

#[test]
fn an_abort_resets_the_exported_stack_pointer() {
    // Like C: allocates a frame on the shadow stack, and aborts while it is
    // allocated when the frame's length is odd; reports the pointer.
    let wat = br#"(module
        (import "exonet" "abort" (func $abort))
        (import "exonet" "window_store32" (func $ws (param i32 i32)))
        (memory (export "memory") 1)
        (global $sp (export "__stack_pointer") (mut i32) (i32.const 4096))
        (func (export "ash_handle") (param $len i32) (result i32)
          (call $ws (i32.const 0) (global.get $sp))
          (global.set $sp (i32.sub (global.get $sp) (i32.const 64)))
          (if (i32.and (local.get $len) (i32.const 1)) (then (call $abort)))
          (global.set $sp (i32.add (global.get $sp) (i32.const 64)))
          (i32.const 1)))"#;
    let seg = Segment::new(4);
    let mut h = install(wat, Some(seg.window()));
    let mut out = outbox();
    for len in [1, 3, 5, 2] {
        run(&mut h, &vec![0; len], &mut out);
        assert_eq!(seg.read(), 4096u32.to_le_bytes());
    }
}

#[test]
fn memory_grows_up_to_the_limit() {
    // Grows by the frame's first byte (pages); returns the old size or -1.
    let wat = br#"(module
        (import "exonet" "peek" (func $peek (param i32 i32 i32) (result i32)))
        (import "exonet" "window_store32" (func $ws (param i32 i32)))
        (memory (export "memory") 1)
        (func (export "ash_handle") (param i32) (result i32)
          (drop (call $peek (i32.const 0) (i32.const 0) (i32.const 1)))
          (call $ws (i32.const 0) (memory.grow (i32.load8_u (i32.const 0))))
          (i32.const 1)))"#;
    let seg = Segment::new(4);
    let mut h = install(wat, Some(seg.window()));
    let mut out = outbox();
    let grew = |h: &mut Handler, out: &mut Outbox, pages: u8| {
        assert_eq!(run(h, &[pages], out).outcome, Outcome::Deliver);
        i32::from_le_bytes(seg.read().try_into().expect("4 bytes"))
    };
    assert_eq!(grew(&mut h, &mut out, 10), 1);
    assert_eq!(grew(&mut h, &mut out, 6), -1, "17 pages is over 1 MiB");
    assert_eq!(grew(&mut h, &mut out, 5), 11);
    assert_eq!(grew(&mut h, &mut out, 1), -1);
}

/// For information: `cargo test --release -p exonet-ash --test handler --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn run_cost() {
    let seg = Segment::new(64);
    let cases = [
        ("empty", examples::EMPTY_WAT, request(b"x")),
        (
            "remote_increment",
            examples::REMOTE_INCREMENT_WAT,
            request(&8u32.to_le_bytes()),
        ),
        ("udp_echo 64 B", examples::UDP_ECHO_WAT, request(&[1; 64])),
    ];
    for (name, wat, frame) in cases {
        let mut h = install(wat.as_bytes(), Some(seg.window()));
        let mut out = outbox();
        let n = 1_000_000;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for _ in 0..n {
                out.clear();
                std::hint::black_box(h.run(std::hint::black_box(&frame), &mut out));
            }
            let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
            println!("{name}: {ns:.1} ns per run");
        }
    }
}

/// Counts this thread's allocations, to check the per-frame path makes none.
struct Counting;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count_one() {
    // try_with: the counter may already be gone while the thread exits.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counter is a const-initialised thread-local that never allocates.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract, forwarded.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract, forwarded.
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

#[test]
fn running_allocates_nothing() {
    let allocations = || ALLOCATIONS.with(|n| n.get());
    let at_start = allocations();
    let seg = Segment::new(64);
    let mut handlers = [
        install(examples::EMPTY_WAT.as_bytes(), None),
        install(examples::UDP_ECHO_WAT.as_bytes(), None),
        install(
            examples::REMOTE_INCREMENT_WAT.as_bytes(),
            Some(seg.window()),
        ),
    ];
    let mut out = outbox();
    let req = request(&8u32.to_le_bytes());
    let mut run_all = || {
        for h in &mut handlers {
            let r = run(h, &req, &mut out);
            assert!(!matches!(r.outcome, Outcome::Aborted(_)), "{r:?}");
        }
    };
    run_all();
    let before = allocations();
    assert!(
        before > at_start,
        "installing allocates: the counter counts"
    );
    for _ in 0..100 {
        run_all();
    }
    assert_eq!(allocations(), before);
}

#[test]
fn reply_udp_keeps_vlan_tags_and_drops_ip_options() {
    use etherparse::{SlicedPacket, VlanSlice};
    use exonet_wire::build::{ipv4_frame, Transport};
    use exonet_wire::{EthernetRepr, Ipv4Repr, UdpRepr, VlanTag};

    let mut h = install(
        br#"(module
            (import "exonet" "reply_udp" (func $reply (param i32 i32) (result i32)))
            (memory (export "memory") 1)
            (data (i32.const 0) "pong")
            (func (export "ash_handle") (param i32) (result i32)
              (i32.eqz (i32.eqz (call $reply (i32.const 0) (i32.const 4))))))"#,
        None,
    );
    let eth = EthernetRepr {
        dst: SERVER_MAC,
        src: CLIENT_MAC,
        vlans: &[VlanTag::new(5)],
        ethertype: 0,
    };
    let ip = Ipv4Repr {
        options: &[1, 1, 1, 1],
        ..Ipv4Repr::new(CLIENT_IP, SERVER_IP, 0, 0)
    };
    let udp = UdpRepr {
        src_port: CLIENT_PORT,
        dst_port: SERVER_PORT,
        payload: b"ping",
    };
    let req = ipv4_frame(&eth, &ip, &Transport::Udp(udp)).expect("a frame");
    let mut out = outbox();
    assert_eq!(run(&mut h, &req, &mut out).outcome, Outcome::Consumed);
    let reply = out.get(0).expect("a reply");
    assert_eq!(reply_payload(reply, &req), b"pong");
    let parsed = SlicedPacket::from_ethernet(reply).expect("parses");
    let Some(VlanSlice::SingleVlan(tag)) = parsed.vlan else {
        panic!("one VLAN tag: {:?}", parsed.vlan);
    };
    assert_eq!(tag.vlan_identifier().value(), 5);
    assert_eq!(reply.len(), 18 + 20 + 8 + 4, "no IP options");

    // Not UDP: -1, so the handler delivers.
    let mut tcp = req.clone();
    tcp[27] = 6;
    assert_eq!(run(&mut h, &tcp, &mut out).outcome, Outcome::Deliver);
    assert!(out.is_empty());
}
