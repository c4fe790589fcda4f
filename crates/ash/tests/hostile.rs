//! Hostile and broken handlers: each is refused at install with a clear
//! reason or aborted at run time with the right `Abort`, and the runtime is
//! not poisoned: the same handler runs the next frame normally, and a fresh
//! handler works.

mod common;

use common::*;
use exonet_ash::handler::{
    examples, Abort, Handler, HandlerConfig, InstallError, Outcome, MAX_MODULE_LEN,
};
use exonet_ash::Transfer;
use proptest::prelude::*;

fn install_err(wat: &str) -> InstallError {
    install_with(wat, HandlerConfig::default()).expect_err("refused")
}

fn install_with(wat: &str, config: HandlerConfig) -> Result<Handler, InstallError> {
    Handler::install(&engine(), wat.as_bytes(), vec![], None, config)
}

fn refused(wat: &str, reason: &str) {
    let e = install_err(wat);
    let message = e.to_string();
    assert!(message.contains(reason), "{message:?} lacks {reason:?}");
    assert!(!message.contains('\n'), "one line: {message:?}");
}

const ENTRY: &str = r#"(func (export "ash_handle") (param i32) (result i32) (i32.const 1))"#;

fn with_entry(body: &str) -> String {
    format!("(module {body} {ENTRY})")
}

#[test]
fn malformed_modules_are_refused() {
    refused("\0asm\x01\0\0\0garbage", "malformed module");
    refused("(module (func", "malformed module");
    refused("", "malformed module");
    refused(
        r#"(module (func (export "ash_handle") (param i32) (result i32) (i64.const 1)))"#,
        "malformed module",
    );
    let huge = vec![b' '; MAX_MODULE_LEN + 1];
    let e = Handler::install(&engine(), &huge, vec![], None, HandlerConfig::default());
    assert!(matches!(e, Err(InstallError::TooLarge { .. })));
    assert!(e
        .expect_err("refused")
        .to_string()
        .contains("module too large"));
}

#[test]
fn entry_point_must_exist_and_be_i32_to_i32() {
    refused("(module)", "missing entry point: no exported `ash_handle`");
    refused(
        r#"(module (func (export "ash_handle") (param i64) (result i32) (i32.const 1)))"#,
        "entry point `ash_handle` is a function (i64) -> (i32), expected",
    );
    refused(
        r#"(module (func (export "ash_handle") (param i32) (result i32 i32) (i32.const 1) (i32.const 1)))"#,
        "is a function (i32) -> (i32, i32)",
    );
    refused(
        r#"(module (global (export "ash_handle") i32 (i32.const 0)))"#,
        "entry point `ash_handle` is not a function",
    );
}

#[test]
fn imports_are_checked() {
    refused(
        &with_entry(r#"(import "exonet" "open" (func))"#),
        "unknown import `exonet::open`",
    );
    refused(
        &with_entry(r#"(import "env" "peek" (func (param i32 i32 i32) (result i32)))"#),
        "unknown import `env::peek`",
    );
    refused(
        &with_entry(r#"(import "exonet" "peek" (func (param i32)))"#),
        "import `exonet::peek` has type (i32) -> (), expected (i32, i32, i32) -> (i32)",
    );
    refused(
        &with_entry(r#"(import "exonet" "window_load64" (func (param i32) (result i32)))"#),
        "expected (i32) -> (i64)",
    );
    refused(
        &with_entry(r#"(import "exonet" "memory" (memory 1))"#),
        "imported memory refused",
    );
    refused(
        &with_entry(r#"(import "exonet" "table" (table 1 funcref))"#),
        "imported table refused",
    );
    refused(
        &with_entry(r#"(import "exonet" "fuel" (global i32))"#),
        "unknown import `exonet::fuel`",
    );
}

#[test]
fn memory_and_tables_over_the_limit_are_refused() {
    refused(
        &with_entry("(memory 17)"),
        "memory over the limit: 1114112 bytes initially, limit 1048576",
    );
    refused(&with_entry("(memory 65536)"), "memory over the limit");
    refused(
        &with_entry("(table 100000 funcref)"),
        "table over the limit",
    );
    // Exactly at the limit, and a smaller limit.
    assert!(install_with(&with_entry("(memory 16)"), HandlerConfig::default()).is_ok());
    let small = HandlerConfig {
        memory_max: 64 << 10,
        ..HandlerConfig::default()
    };
    assert!(matches!(
        install_with(&with_entry("(memory 2)"), small),
        Err(InstallError::MemoryOverLimit {
            bytes: 131072,
            limit: 65536
        })
    ));
}

#[test]
fn features_beyond_the_mvp_set_are_refused() {
    for body in [
        "(func (result f32) (f32.const 1))",
        "(func (param f64))",
        "(func (result v128) (v128.const i64x2 0 0))",
        "(memory 1 1 shared)",
        "(memory 1) (memory 1)",
        "(memory i64 1)",
        "(table 1 externref)",
        "(func $f (return_call $f))",
        "(tag $e) (func (throw $e))",
    ] {
        let e = install_err(&with_entry(body));
        assert!(matches!(e, InstallError::Malformed(_)), "{body}: {e}");
    }
    refused(
        &with_entry("(func (result f32) (f32.const 1))"),
        "floating-point support is disabled",
    );
    // What handlers may use: bulk memory, sign extension, multi-value,
    // mutable globals, call_indirect through a table.
    let ok = with_entry(
        r#"(memory 1) (global $g (mut i32) (i32.const 0))
           (table 1 funcref) (elem (i32.const 0) $two)
           (type $t (func (result i32 i32)))
           (func $two (result i32 i32) (i32.const 1) (i32.const 2))
           (func
             (memory.fill (i32.const 0) (i32.const 0) (i32.const 8))
             (memory.copy (i32.const 8) (i32.const 0) (i32.const 8))
             (global.set $g (i32.extend8_s (i32.const 255)))
             (drop (drop (call_indirect (type $t) (i32.const 0)))))"#,
    );
    assert!(install_with(&ok, HandlerConfig::default()).is_ok());
}

#[test]
fn start_functions_run_under_the_budget() {
    refused(
        &with_entry("(func $s (loop $l (br $l))) (start $s)"),
        "start function aborted: out of fuel",
    );
    refused(
        &with_entry("(func $s unreachable) (start $s)"),
        "start function aborted: wasm trap: wasm `unreachable` instruction executed",
    );
    refused(
        &with_entry(r#"(import "exonet" "abort" (func $a)) (start $a)"#),
        "start function aborted: the handler called abort()",
    );
    refused(
        &with_entry(r#"(memory 1) (data (i32.const 65535) "ab")"#),
        "start function aborted: wasm trap: out of bounds memory access",
    );
    // A start function sets up private state the handler then uses.
    let seg = Segment::new(4);
    let mut h = install(
        br#"(module
            (import "exonet" "window_store32" (func $ws (param i32 i32)))
            (global $g (mut i32) (i32.const 0))
            (func $s (global.set $g (i32.const 77)))
            (start $s)
            (func (export "ash_handle") (param i32) (result i32)
              (call $ws (i32.const 0) (global.get $g)) (i32.const 1)))"#,
        Some(seg.window()),
    );
    assert_eq!(
        run(&mut h, &[0; 60], &mut outbox()).outcome,
        Outcome::Deliver
    );
    assert_eq!(seg.read(), 77u32.to_le_bytes());
}

/// A transfer that costs more fuel than any budget.
struct Expensive;

impl Transfer for Expensive {
    fn transfer(&mut self, src: &[u8], dst: &mut [u8]) {
        dst.copy_from_slice(src);
    }
    fn reg(&self, _: usize, _: usize) -> Option<u64> {
        None
    }
    fn set_reg(&mut self, _: usize, _: usize, _: u64) -> bool {
        false
    }
    fn cost(&self, _: usize) -> u64 {
        u64::MAX / 2
    }
}

/// A transfer that panics, as a buggy pipe list might.
struct Panicking;

impl Transfer for Panicking {
    fn transfer(&mut self, src: &[u8], _: &mut [u8]) {
        assert!(src.len().is_multiple_of(4), "a whole number of words");
    }
    fn reg(&self, _: usize, _: usize) -> Option<u64> {
        None
    }
    fn set_reg(&mut self, _: usize, _: usize, _: u64) -> bool {
        false
    }
    fn cost(&self, n: usize) -> u64 {
        n as u64
    }
}

#[test]
fn a_panicking_pipe_list_aborts_the_handler_only() {
    let seg = Segment::new(64);
    let mut h = Handler::install(
        &engine(),
        br#"(module
            (import "exonet" "consume_window" (func $cw (param i32 i32 i32) (result i32)))
            (func (export "ash_handle") (param $n i32) (result i32)
              (drop (call $cw (i32.const 0) (local.get $n) (i32.const 0)))
              (i32.const 0)))"#,
        vec![Box::new(Panicking)],
        Some(seg.window()),
        HandlerConfig::default(),
    )
    .expect("install");
    let mut out = outbox();
    assert_eq!(
        run(&mut h, &[0; 5], &mut out).outcome,
        Outcome::Aborted(Abort::Trap("consume_window: pipe list 0 failed".into()))
    );
    assert_eq!(run(&mut h, &[0; 8], &mut out).outcome, Outcome::Consumed);
}

/// The hostile handler's imports and helpers; its entry point is built by
/// [`hostile_wat`].
const HOSTILE_HEAD: &str = r#"
  (import "exonet" "peek" (func $peek (param i32 i32 i32) (result i32)))
  (import "exonet" "consume" (func $consume (param i32 i32) (result i32)))
  (import "exonet" "skip" (func $skip (param i32) (result i32)))
  (import "exonet" "seek" (func $seek (param i32) (result i32)))
  (import "exonet" "consume_window" (func $cw (param i32 i32 i32) (result i32)))
  (import "exonet" "window_write" (func $ww (param i32 i32 i32)))
  (import "exonet" "window_read" (func $wr (param i32 i32 i32)))
  (import "exonet" "window_load64" (func $wl64 (param i32) (result i64)))
  (import "exonet" "window_store32" (func $ws32 (param i32 i32)))
  (import "exonet" "pipe_reg" (func $reg (param i32 i32 i32) (result i64)))
  (import "exonet" "pipe_set_reg" (func $set (param i32 i32 i32 i64)))
  (import "exonet" "send" (func $send (param i32 i32) (result i32)))
  (import "exonet" "reply_udp" (func $reply (param i32 i32) (result i32)))
  (import "exonet" "msg_len" (func $len (result i32)))
  (memory (export "memory") 1)
  (table 2 funcref)
  (type $v (func))
  (func $deep (param i64 i64 i64 i64) (result i64)
    (i64.add (call $deep (local.get 0) (local.get 1) (local.get 2) (local.get 3)) (local.get 0)))
"#;

#[derive(Debug)]
enum Expect {
    Aborts(Abort),
    Traps(&'static str),
    Delivers,
}

/// Each misbehaviour: what it is, its code in `ash_handle` (with `$n` the
/// frame's length), and its outcome.
fn misbehaviours() -> Vec<(&'static str, &'static str, Expect)> {
    use Expect::*;
    vec![
        ("endless loop", "(loop $l (br $l))", Aborts(Abort::OutOfFuel)),
        (
            "deep recursion",
            "(drop (call $deep (i64.const 1) (i64.const 2) (i64.const 3) (i64.const 4)))",
            Traps("call stack exhausted"),
        ),
        (
            "out of bounds load",
            "(drop (i32.load (i32.const 0xfffffff0)))",
            Traps("out of bounds memory access"),
        ),
        (
            "out of bounds store",
            "(i32.store (i32.const 65535) (i32.const 1))",
            Traps("out of bounds memory access"),
        ),
        ("unreachable", "unreachable", Traps("unreachable")),
        (
            "division by zero",
            "(drop (i32.div_u (i32.const 1) (i32.sub (local.get $n) (local.get $n))))",
            Traps("divide by zero"),
        ),
        (
            "a null table entry",
            "(call_indirect (type $v) (i32.const 1))",
            Traps("uninitialized element"),
        ),
        (
            "outside the table",
            "(call_indirect (type $v) (i32.const 9))",
            Traps("out of bounds table access"),
        ),
        ("verdict 2", "(return (i32.const 2))", Aborts(Abort::BadVerdict(2))),
        ("verdict -1", "(return (i32.const -1))", Aborts(Abort::BadVerdict(-1))),
        (
            "peek to a bad pointer",
            "(drop (call $peek (i32.const 65533) (i32.const 0) (i32.const 4)))",
            Traps("peek: [65533, 65533+4) is outside the handler's 65536-byte memory"),
        ),
        (
            "peek at a negative offset",
            "(drop (call $peek (i32.const 0) (i32.const -1) (i32.const 4)))",
            Traps("peek: negative offset -1"),
        ),
        (
            "consume a negative length",
            "(drop (call $consume (i32.const 0) (i32.const -4)))",
            Traps("consume: negative length -4"),
        ),
        (
            "skip a negative length",
            "(drop (call $skip (i32.const -1)))",
            Traps("skip: negative length -1"),
        ),
        (
            "seek before the frame",
            "(drop (call $seek (i32.const -1)))",
            Traps("seek: negative offset -1"),
        ),
        (
            "window write outside",
            "(call $ww (i32.const 30) (i32.const 0) (i32.const 4))",
            Traps("window_write: [30, 30+4) is outside the 32-byte window"),
        ),
        (
            "window read to a bad pointer",
            "(call $wr (i32.const -1) (i32.const 0) (i32.const 4))",
            Traps("window_read: [4294967295, 4294967295+4) is outside the handler's"),
        ),
        (
            "window load at the end",
            "(drop (call $wl64 (i32.const 28)))",
            Traps("window_load64: [28, 28+8) is outside the 32-byte window"),
        ),
        (
            "consume_window outside",
            "(drop (call $cw (i32.const 0) (i32.const 33) (i32.const -1)))",
            Traps("consume_window: [0, 0+33) is outside the 32-byte window"),
        ),
        (
            "an unknown pipe list",
            "(drop (call $cw (i32.const 0) (i32.const 4) (i32.const 5)))",
            Traps("consume_window: no pipe list 5"),
        ),
        (
            "pipe list -2",
            "(drop (call $cw (i32.const 0) (i32.const 4) (i32.const -2)))",
            Traps("consume_window: no pipe list -2"),
        ),
        (
            "an unknown register",
            "(drop (call $reg (i32.const 0) (i32.const 0) (i32.const 0)))",
            Traps("pipe_reg: pipe list 0 has no register 0 in pipe 0"),
        ),
        (
            "a negative register",
            "(call $set (i32.const 0) (i32.const -1) (i32.const 0) (i64.const 0))",
            Traps("pipe_set_reg: negative index -1"),
        ),
        (
            "a transfer over the budget",
            "(drop (call $cw (i32.const 0) (i32.const 4) (i32.const 0)))",
            Aborts(Abort::OutOfFuel),
        ),
        (
            "copying through imports forever",
            "(loop $l (drop (call $peek (i32.const 0) (i32.const 0) (call $len))) (br $l))",
            Aborts(Abort::OutOfFuel),
        ),
        (
            "sends out of range, then from a bad pointer",
            "(if (i32.ne (call $send (i32.const 0) (i32.const 100000)) (i32.const -1)) (then unreachable))
             (if (i32.ne (call $send (i32.const 0) (i32.const -5)) (i32.const -1)) (then unreachable))
             (if (i32.ne (call $send (i32.const 0) (i32.const 13)) (i32.const -1)) (then unreachable))
             (if (i32.ne (call $reply (i32.const 0) (i32.const 4)) (i32.const -1)) (then unreachable))
             (drop (call $send (i32.const 65530) (i32.const 60)))",
            Traps("send: [65530, 65530+60) is outside the handler's 65536-byte memory"),
        ),
        (
            "a full outbox, then a trap",
            "(loop $l (br_if $l (i32.eqz (call $send (i32.const 0) (i32.const 60))))) unreachable",
            Traps("unreachable"),
        ),
        (
            "growing the memory past the limit",
            "(if (i32.ne (memory.grow (i32.const 16)) (i32.const -1)) (then unreachable))
             (if (i32.ne (memory.grow (i32.const -1)) (i32.const -1)) (then unreachable))
             (call $ws32 (i32.const 0) (memory.size))",
            Delivers,
        ),
    ]
}

/// A module whose `ash_handle` behaves well (delivers) on a frame starting
/// with 0 and runs misbehaviour `i` on one starting with `i + 1`.
fn hostile_wat(cases: &[(&str, &str, Expect)]) -> String {
    // Nested blocks, innermost first: br_table's label k leaves k + 1
    // blocks, landing on case k's code; the default is the good path.
    let mut f = String::from(
        r#"(func (export "ash_handle") (param $n i32) (result i32)
             (drop (call $peek (i32.const 0) (i32.const 0) (i32.const 1)))
             (block $good "#,
    );
    f.push_str(&"(block ".repeat(cases.len() + 1));
    let labels: Vec<String> = (0..=cases.len()).map(|k| k.to_string()).collect();
    f.push_str(&format!(
        "(br_table {} $good (i32.load8_u (i32.const 0))))",
        labels.join(" ")
    ));
    f.push_str(" (br $good))");
    for (_, code, _) in cases {
        f.push_str(&format!(" {code} (br $good))"));
    }
    f.push_str(" (i32.const 1))");
    format!("(module {HOSTILE_HEAD} {f})")
}

#[test]
fn misbehaviour_aborts_and_does_not_poison_the_runtime() {
    let cases = misbehaviours();
    let wat = hostile_wat(&cases);
    let seg = Segment::new(32);
    let new = || {
        Handler::install(
            &engine(),
            wat.as_bytes(),
            vec![Box::new(Expensive)],
            Some(seg.window()),
            HandlerConfig::default(),
        )
        .unwrap_or_else(|e| panic!("install: {e}"))
    };
    let mut h = new();
    let mut out = outbox();
    let good = [0u8; 60];
    let baseline = run(&mut h, &good, &mut out);
    assert_eq!(baseline.outcome, Outcome::Deliver);
    for (i, (what, _, expect)) in cases.iter().enumerate() {
        let mut frame = [0u8; 60];
        frame[0] = u8::try_from(i + 1).expect("few cases");
        let r = run(&mut h, &frame, &mut out);
        match (&r.outcome, expect) {
            (Outcome::Aborted(a), Expect::Aborts(e)) => assert_eq!(a, e, "{what}"),
            (Outcome::Aborted(Abort::Trap(m)), Expect::Traps(e)) => {
                assert!(m.contains(e), "{what}: {m:?} lacks {e:?}")
            }
            (Outcome::Deliver, Expect::Delivers) => {}
            (o, e) => panic!("{what}: {o:?}, expected {e:?}"),
        }
        if matches!(r.outcome, Outcome::Aborted(Abort::OutOfFuel)) {
            assert_eq!(
                r.fuel,
                HandlerConfig::default().fuel,
                "{what}: all the fuel"
            );
        }
        assert!(out.is_empty(), "{what}: sends discarded");
        // Not poisoned: the next frame runs as before.
        assert_eq!(run(&mut h, &good, &mut out), baseline, "after {what}");
    }
    assert_eq!(seg.read()[..4], 1u32.to_le_bytes(), "memory.size stayed 1");
    assert_eq!(
        run(&mut new(), &good, &mut out),
        baseline,
        "a fresh handler"
    );
}

#[test]
fn imports_without_a_window_or_exported_memory() {
    let mut out = outbox();
    let mut h = install(
        br#"(module
            (import "exonet" "window_len" (func $wl (result i32)))
            (import "exonet" "window_store32" (func $ws (param i32 i32)))
            (func (export "ash_handle") (param i32) (result i32)
              (if (local.get 0) (then (call $ws (i32.const 0) (i32.const 0))))
              (call $wl)))"#,
        None,
    );
    assert_eq!(
        run(&mut h, &[], &mut out).outcome,
        Outcome::Consumed,
        "window_len() = 0"
    );
    assert_eq!(
        run(&mut h, &[0], &mut out).outcome,
        Outcome::Aborted(Abort::Trap("window_store32: no window was granted".into()))
    );
    let mut h = install(
        br#"(module
            (import "exonet" "peek" (func $peek (param i32 i32 i32) (result i32)))
            (memory 1)
            (func (export "ash_handle") (param i32) (result i32)
              (call $peek (i32.const 0) (i32.const 0) (i32.const 1))))"#,
        None,
    );
    assert_eq!(
        run(&mut h, &[0], &mut out).outcome,
        Outcome::Aborted(Abort::Trap("peek: the handler exports no memory".into()))
    );
}

/// A valid binary module: `ash_handle` returns 1.
const EMPTY_BINARY: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
    0x01, 0x06, 0x01, 0x60, 0x01, 0x7f, 0x01, 0x7f, // type: (i32) -> i32
    0x03, 0x02, 0x01, 0x00, // function 0 has type 0
    0x07, 0x0e, 0x01, 0x0a, b'a', b's', b'h', b'_', b'h', b'a', b'n', b'd', b'l', b'e', 0x00,
    0x00, // export "ash_handle" = function 0
    0x0a, 0x06, 0x01, 0x04, 0x00, 0x41, 0x01, 0x0b, // code: i32.const 1
];

#[test]
fn the_binary_seed_is_valid() {
    let mut h = install(EMPTY_BINARY, None);
    assert_eq!(run(&mut h, &[], &mut outbox()).outcome, Outcome::Deliver);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Corrupted modules are refused or run; never a panic in the host.
    #[test]
    fn corrupted_modules(flips in proptest::collection::vec((0..EMPTY_BINARY.len(), any::<u8>()), 1..4),
                         frame in proptest::collection::vec(any::<u8>(), 0..80)) {
        let mut wasm = EMPTY_BINARY.to_vec();
        for (at, v) in flips {
            wasm[at] = v;
        }
        if let Ok(mut h) = Handler::install(&engine(), &wasm, vec![], None, HandlerConfig::default()) {
            let mut out = outbox();
            let r = run(&mut h, &frame, &mut out);
            prop_assert!(!matches!(r.outcome, Outcome::Aborted(_)) || out.is_empty());
        }
    }

    /// The examples on arbitrary and corrupted frames: an outcome, never a
    /// panic, and no sends on an abort.
    #[test]
    fn examples_on_hostile_frames(
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        flips in proptest::collection::vec((0usize..120, any::<u8>()), 0..4),
        cut in 0usize..120,
    ) {
        let mut frame = request(&payload);
        for (at, v) in flips {
            if let Some(b) = frame.get_mut(at) {
                *b = v;
            }
        }
        frame.truncate(cut.max(frame.len().saturating_sub(cut)));
        for wat in [
            examples::REMOTE_WRITE_WAT,
            examples::REMOTE_INCREMENT_WAT,
            examples::UDP_ECHO_WAT,
            examples::CACHE_SERVER_WAT,
        ] {
            let seg = Segment::new(64);
            seg.write(0, &[2, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0]);
            let mut h = install(wat.as_bytes(), Some(seg.window()));
            let mut out = outbox();
            let r = run(&mut h, &frame, &mut out);
            prop_assert!(!matches!(r.outcome, Outcome::Aborted(_)) || out.is_empty());
            prop_assert!(!matches!(r.outcome, Outcome::Aborted(Abort::Trap(_))), "{:?}", r.outcome);
        }
    }
}

/// One instruction must not buy unbounded work: bulk memory operations are
/// charged per byte, as imports are.
#[test]
fn bulk_memory_is_charged_per_byte() {
    let mut h = install(
        br#"(module
            (memory 1)
            (func (export "ash_handle") (param $n i32) (result i32)
              (memory.fill (i32.const 0) (i32.const 7) (local.get $n))
              (memory.copy (i32.const 0) (i32.const 32768) (local.get $n))
              (i32.const 1)))"#,
        None,
    );
    let mut out = outbox();
    let small = run(&mut h, &[0; 100], &mut out);
    let large = run(&mut h, &[0; 10_100], &mut out);
    assert_eq!(large.outcome, Outcome::Deliver);
    assert_eq!(large.fuel - small.fuel, 2 * 10_000);
}
