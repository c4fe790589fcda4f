//! A handler with UDP below it (§2.3): the multiplexer's trusted layers
//! check the headers, the handler sees the payload, and the UDP checksum is
//! computed in the loops that move the payload (the checksum pipe in front
//! of each of the handler's pipe lists), with what the handler did not move
//! summed afterwards, at any split, odd offsets and overlaps included.

mod common;

use common::*;
use exonet_ash::handler::{transfer_for, Below, Handler, HandlerConfig, Outcome, NULL_PIPE};
use exonet_ash::pipe::{builtins, PipeList};
use exonet_ash::Transfer;
use proptest::prelude::*;

/// Moves the payload to the window in steps: `(length, pipe list)` pairs
/// from a table in its memory at 0 (`count` of them), each at the window
/// offset equal to its message offset; sends a reply; consumes.
fn stepper(steps: &[(i32, i32)]) -> String {
    let data: String = steps
        .iter()
        .flat_map(|(n, pl)| [n.to_le_bytes(), pl.to_le_bytes()])
        .flatten()
        .map(|b| format!("\\{b:02x}"))
        .collect();
    format!(
        r#"(module
        (import "exonet" "consume_window" (func $cw (param i32 i32 i32) (result i32)))
        (import "exonet" "cursor" (func $cursor (result i32)))
        (import "exonet" "reply_udp" (func $reply (param i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 0) "{data}")
        (func (export "ash_handle") (param $len i32) (result i32)
          (local $i i32)
          (block $done
            (loop $next
              (br_if $done (i32.ge_u (local.get $i) (i32.const {count})))
              (drop (call $cw
                (call $cursor)
                (i32.load (i32.mul (local.get $i) (i32.const 8)))
                (i32.load (i32.add (i32.mul (local.get $i) (i32.const 8)) (i32.const 4)))))
              (local.set $i (i32.add (local.get $i) (i32.const 1)))
              (br $next)))
          (drop (call $reply (i32.const 0) (i32.const 2)))
          (i32.const 0)))"#,
        count = steps.len()
    )
}

fn install_below(wat: &str, seg: &Segment) -> Handler {
    let lists = [
        PipeList::new(vec![builtins::byte_swap16()]).unwrap(),
        PipeList::new(vec![builtins::copy()]).unwrap(),
    ];
    let transfers = lists
        .iter()
        .map(|l| transfer_for(Below::Udp, l).unwrap())
        .collect();
    let config = HandlerConfig {
        below: Below::Udp,
        ..HandlerConfig::default()
    };
    Handler::install(
        &engine(),
        wat.as_bytes(),
        transfers,
        Some(seg.window()),
        config,
    )
    .unwrap_or_else(|e| panic!("install: {e}"))
}

#[test]
fn the_handler_sees_the_payload_and_good_checksums_pass() {
    let seg = Segment::new(2048);
    let steps = [(3, NULL_PIPE), (5, 0), (4, 1), (7, 0)];
    let mut h = install_below(&stepper(&steps), &seg);
    let payload: Vec<u8> = (0..19u8).map(|i| i.wrapping_mul(37)).collect();
    let mut out = outbox();
    let r = run(&mut h, &request(&payload), &mut out);
    assert_eq!(r.outcome, Outcome::Consumed);
    assert_eq!(seg.read()[..19], expected(&payload, &steps)[..]);
    assert_eq!(out.len(), 1, "the reply stands");
}

#[test]
fn a_bad_checksum_drops_the_datagram_and_its_sends() {
    let seg = Segment::new(2048);
    let mut h = install_below(&stepper(&[(8, 0)]), &seg);
    let mut f = request(b"abcdefgh");
    *f.last_mut().unwrap() ^= 1;
    let mut out = outbox();
    assert_eq!(run(&mut h, &f, &mut out).outcome, Outcome::Dropped);
    assert!(out.is_empty(), "the reply was discarded");
    // No checksum sent (0): taken as it is.
    f[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
    assert_eq!(run(&mut h, &f, &mut out).outcome, Outcome::Consumed);
    assert_eq!(out.len(), 1);
}

#[test]
fn what_is_not_udp_is_delivered_without_the_handler_and_corrupt_headers_dropped() {
    let seg = Segment::new(2048);
    let mut h = install_below(&stepper(&[(8, 0)]), &seg);
    let mut out = outbox();
    let good = request(b"abcdefgh");
    // An ARP frame, a fragment, TCP: not for the handler.
    let mut arp = good.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let mut frag = good.clone();
    frag[14 + 6] = 0x20;
    let ip_sum = |f: &mut Vec<u8>| {
        f[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
        let s = builtins::fold_checksum(builtins::checksum_accumulate(0, &f[14..34]));
        f[14 + 10..14 + 12].copy_from_slice(&s.to_be_bytes());
    };
    ip_sum(&mut frag);
    let mut tcp = good.clone();
    tcp[14 + 9] = 6;
    ip_sum(&mut tcp);
    for f in [&arp, &frag, &tcp] {
        let r = run(&mut h, f, &mut out);
        assert_eq!((r.outcome, r.fuel), (Outcome::Deliver, 0));
    }
    // A bad IP header checksum, a UDP length beyond the packet: dropped.
    let mut bad_ip = good.clone();
    bad_ip[14 + 8] ^= 1;
    let mut long = good.clone();
    long[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&100u16.to_be_bytes());
    for f in [&bad_ip, &long] {
        assert_eq!(run(&mut h, f, &mut out).outcome, Outcome::Dropped);
    }
    assert!(out.is_empty());
    assert_eq!(seg.read()[..8], [0; 8], "the handler never ran");
}

#[test]
fn seeking_back_over_moved_bytes_still_checks_exactly() {
    // Moves the payload twice over (seek back to 0 between): overlapping
    // parts, summed over the whole payload instead.
    let wat = r#"(module
        (import "exonet" "consume_window" (func $cw (param i32 i32 i32) (result i32)))
        (import "exonet" "seek" (func $seek (param i32) (result i32)))
        (func (export "ash_handle") (param $len i32) (result i32)
          (drop (call $cw (i32.const 0) (local.get $len) (i32.const 0)))
          (drop (call $seek (i32.const 0)))
          (drop (call $cw (i32.const 0) (local.get $len) (i32.const 1)))
          (i32.const 0)))"#;
    let seg = Segment::new(2048);
    let mut h = install_below(wat, &seg);
    let mut out = outbox();
    let f = request(b"overlapping parts");
    assert_eq!(run(&mut h, &f, &mut out).outcome, Outcome::Consumed);
    let mut bad = f.clone();
    bad[14 + 20 + 8 + 3] ^= 0x40;
    assert_eq!(run(&mut h, &bad, &mut out).outcome, Outcome::Dropped);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any split of the payload into steps through any lists, with the
    /// rest left unread: a datagram passes exactly when its checksum is
    /// right, and the window gets what the steps moved.
    #[test]
    fn any_split_checks_exactly(
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        steps in proptest::collection::vec((0i32..64, -1i32..2), 0..8),
        corrupt in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let seg = Segment::new(2048);
        let mut h = install_below(&stepper(&steps), &seg);
        let mut f = request(&payload);
        let header = 14 + 20 + 8;
        if let Some(i) = corrupt.filter(|_| !payload.is_empty()) {
            f[header + i.index(payload.len())] ^= 0x10;
        }
        let mut out = outbox();
        let r = run(&mut h, &f, &mut out);
        if corrupt.is_some() && !payload.is_empty() {
            prop_assert_eq!(r.outcome, Outcome::Dropped);
        } else {
            prop_assert_eq!(r.outcome, Outcome::Consumed);
            let want = expected(&payload, &steps);
            prop_assert_eq!(&seg.read()[..want.len()], &want[..]);
        }
    }
}

/// What the steps move: each through its list run on its own (list 0's
/// byte swap, list 1's and no list's copy); a step asking for more than is
/// left moves nothing (`consume_window` answers -1).
fn expected(payload: &[u8], steps: &[(i32, i32)]) -> Vec<u8> {
    let mut swap = PipeList::new(vec![builtins::byte_swap16()])
        .unwrap()
        .compile()
        .unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    for &(n, pl) in steps {
        let n = n as usize;
        if at + n > payload.len() {
            continue;
        }
        let part = &payload[at..at + n];
        let mut moved = part.to_vec();
        if pl == 0 {
            swap.transfer(part, &mut moved);
        }
        out.extend_from_slice(&moved);
        at += n;
    }
    out
}
