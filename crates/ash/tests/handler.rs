//! The handler runtime on hand-built frames.

use exonet_ash::handler::{Abort, Engine, Handler, HandlerConfig, Outbox, Outcome};

fn install(wat: &str) -> Handler {
    let engine = Engine::new().expect("engine");
    Handler::install(
        &engine,
        wat.as_bytes(),
        vec![],
        None,
        HandlerConfig::default(),
    )
    .unwrap_or_else(|e| panic!("install: {e}"))
}

#[test]
fn smoke() {
    let mut h = install(
        r#"(module
            (import "exonet" "abort" (func $abort))
            (import "exonet" "peek" (func $peek (param i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (func (export "ash_handle") (param i32) (result i32)
              (if (i32.lt_s (call $peek (i32.const 0) (i32.const 0) (i32.const 4)) (i32.const 0))
                (then (call $abort)))
              (i32.load8_u (i32.const 0))))"#,
    );
    let mut out = Outbox::new(4, 9018);
    let r = h.run(&[1, 2, 3, 4], &mut out);
    assert_eq!(r.outcome, Outcome::Deliver);
    let r = h.run(&[0, 2, 3, 4], &mut out);
    assert_eq!(r.outcome, Outcome::Consumed);
    let r = h.run(&[0, 2], &mut out);
    assert_eq!(r.outcome, Outcome::Aborted(Abort::Requested));
    let r = h.run(&[7, 2, 3, 4], &mut out);
    assert_eq!(r.outcome, Outcome::Aborted(Abort::BadVerdict(7)));
    println!("{r:?}");
}
