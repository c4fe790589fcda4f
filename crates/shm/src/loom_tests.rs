//! Model checking of the ring and wake-up protocols with loom. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p exonet-shm --release loom`.
//!
//! Rings of 2 entries and 3 items make the producer wrap and reuse a slot
//! the consumer has just released, which is where a missing acquire or
//! release shows up as a stale descriptor.

use loom::sync::Arc;
use loom::thread;

use crate::ring::heap;
use crate::sync::{AtomicU32, Ordering};
use crate::{Consumer, Desc, Part, Producer, WakeWord, INLINE_MAX};

const ITEMS: u32 = 3;

fn desc(i: u32) -> Desc {
    Desc {
        offset: 0x1000 + i,
        len: 3 * i + 1,
        channel: i ^ 0x55,
        flags: 0,
    }
}

fn payload(i: u32) -> Vec<u8> {
    (0..9).map(|k| (i * 16 + k) as u8).collect()
}

fn pop_spin(c: &mut Consumer) -> Desc {
    loop {
        if let Some(d) = c.pop().unwrap() {
            return d;
        }
        thread::yield_now();
    }
}

fn push_spin(p: &mut Producer, d: Desc) {
    while !p.push(d).unwrap() {
        thread::yield_now();
    }
}

fn wake_word(flags: u32) -> Arc<WakeWord> {
    Arc::new(WakeWord {
        flags: AtomicU32::new(flags),
        almost_full: AtomicU32::new(0),
        rung: AtomicU32::new(0),
    })
}

/// A waker that pushes one entry on a ring and then runs `signal`, against
/// a sleeper on `word` that runs `announce` and then re-checks the ring:
/// what `announce` returned, whether the re-check found the ring empty (the
/// sleeper would block), and what `signal` returned.
fn push_against_sleep<A, T: Send + 'static>(
    word: &Arc<WakeWord>,
    signal: fn(&WakeWord, &Producer) -> T,
    announce: impl FnOnce(&WakeWord) -> A,
) -> (A, bool, T) {
    let (mut p, c) = heap::ring(2, false);
    let w = word.clone();
    let waker = thread::spawn(move || {
        push_spin(&mut p, desc(0));
        signal(&w, &p)
    });
    let announced = announce(word);
    let blocks = !c.has_pending();
    // Blocked (or not) until here; awake again.
    (announced, blocks, waker.join().unwrap())
}

/// The rx upcall's test, by a waker that saw nothing cross the almost-full
/// threshold.
fn rx_upcall(w: &WakeWord, p: &Producer) -> bool {
    let mut above = false;
    let wake = w.wants_rx_upcall(|| p.outstanding(), &mut above, true);
    assert!(!above);
    wake
}

#[test]
fn loom_ring_single_items() {
    loom::model(|| {
        let (mut p, mut c) = heap::ring(2, false);
        let producer = thread::spawn(move || {
            for i in 0..ITEMS {
                push_spin(&mut p, desc(i));
            }
        });
        for i in 0..ITEMS {
            assert_eq!(pop_spin(&mut c), desc(i));
        }
        producer.join().unwrap();
    });
}

#[test]
fn loom_ring_batches() {
    loom::model(|| {
        let (mut p, mut c) = heap::ring(2, false);
        let producer = thread::spawn(move || {
            let mut next = 0;
            while next < ITEMS {
                let k = p.reserve(ITEMS - next).unwrap();
                for i in 0..k {
                    p.write(i, desc(next + i));
                }
                p.submit(k);
                next += k;
                if k == 0 {
                    thread::yield_now();
                }
            }
        });
        let mut next = 0;
        while next < ITEMS {
            let k = c.peek(2).unwrap();
            for i in 0..k {
                assert_eq!(c.read(i), desc(next + i));
            }
            c.release(k);
            next += k;
            if k == 0 {
                thread::yield_now();
            }
        }
        producer.join().unwrap();
    });
}

#[test]
fn loom_ring_inline() {
    loom::model(|| {
        let (mut p, mut c) = heap::ring(2, true);
        let producer = thread::spawn(move || {
            for i in 0..ITEMS {
                while !p.push_inline(i, &payload(i)).unwrap() {
                    thread::yield_now();
                }
            }
        });
        let mut buf = [0u8; INLINE_MAX];
        for i in 0..ITEMS {
            let d = loop {
                if let Some(d) = c.pop_frame(&mut buf).unwrap() {
                    break d;
                }
                thread::yield_now();
            };
            assert!(d.is_inline());
            assert_eq!((d.channel, d.len), (i, 9));
            assert_eq!(&buf[..9], &payload(i)[..]);
        }
        producer.join().unwrap();
    });
}

/// A chain is published with one index store: the consumer sees none of
/// it or all of it, never the head alone.
#[test]
fn loom_chain_seen_whole() {
    loom::model(|| {
        let (mut p, mut c) = heap::ring(4, true);
        let producer = thread::spawn(move || {
            let parts = [
                Part::Inline(&[7; 9]),
                Part::Area {
                    offset: 0x1000,
                    len: 5,
                },
                Part::Area {
                    offset: 0x2000,
                    len: 6,
                },
            ];
            assert!(p.push_chain(3, &parts).unwrap());
        });
        let seen = loop {
            match c.peek(4).unwrap() {
                0 => thread::yield_now(),
                n => break n,
            }
        };
        assert_eq!(seen, 3);
        let d: Vec<Desc> = (0..3).map(|i| c.read(i)).collect();
        assert!(d[0].has_more() && d[0].is_inline() && d[1].has_more() && !d[2].has_more());
        assert_eq!((d[1].offset, d[2].len), (0x1000, 6));
        producer.join().unwrap();
    });
}

/// The sleep protocol: if the sleeper's re-check finds the ring empty and
/// it blocks, the waker must have seen `SLEEPING` and signalled.
#[test]
fn loom_wakeup_not_lost() {
    loom::model(|| {
        let word = wake_word(0);
        let ((), blocks, signalled) =
            push_against_sleep(&word, |w, _| w.wants_wakeup(), WakeWord::announce_sleep);
        word.end_sleep();
        assert!(!blocks || signalled, "lost wake-up");
    });
}

/// The sleep in `FUTEX_WAIT`: if the sleeper's re-check finds the ring
/// empty, the waker must have seen `SLEEPING | FUTEX` and bumped `rung`
/// past the value the sleeper looked at, so that its `FUTEX_WAIT`
/// (modelled: it blocks only while `rung` holds that value) returns.
#[test]
fn loom_futex_wakeup_not_lost() {
    loom::model(|| {
        let word = wake_word(0);
        let (seen, blocks, bumped) = push_against_sleep(
            &word,
            |w, _| w.wants_wakeup() && w.ring_futex(),
            WakeWord::announce_futex_sleep,
        );
        let woken = word.rung.load(Ordering::Acquire) != seen;
        word.end_sleep();
        assert!(!blocks || (bumped && woken), "lost wake-up");
    });
}

/// The same through the rx upcall test, with the almost-full threshold
/// armed (at 2, so a single entry does not cross it).
#[test]
fn loom_rx_upcall_not_lost() {
    loom::model(|| {
        let word = wake_word(0);
        word.set_almost_full(Some(2));
        let ((), blocks, signalled) =
            push_against_sleep(&word, rx_upcall, WakeWord::announce_sleep);
        assert!(!blocks || signalled, "lost wake-up");
    });
}

/// Switching upcalls back on while a thread sleeps: either the waker sees
/// them on and signals, or the re-check after switching finds the entry and
/// the sleeper's side signals itself.
#[test]
fn loom_upcalls_reenabled_not_lost() {
    loom::model(|| {
        let word = wake_word(WakeWord::SLEEPING | WakeWord::UPCALLS_OFF);
        let (sleeping, empty, signalled) =
            push_against_sleep(&word, rx_upcall, |w| w.set_upcalls(true));
        let self_signal = sleeping && !empty;
        assert!(signalled || self_signal, "sleeping thread never woken");
    });
}

/// An owner asleep for received frames only ([`WakeWord::RX_ONLY`]) that
/// comes to wait for tx room clears the flag, then re-checks: either the
/// waker that just made room sees the flag gone and signals (the tx
/// upcall), or the re-check finds the room.
#[test]
fn loom_tx_upcall_after_rx_only_not_lost() {
    loom::model(|| {
        let word = wake_word(WakeWord::SLEEPING | WakeWord::RX_ONLY);
        let (was_set, blocks, signalled) =
            push_against_sleep(&word, |w, _| w.wants_tx_upcall(), |w| w.set_rx_only(false));
        assert!(was_set);
        assert!(!blocks || signalled, "tx upcall lost");
    });
}

/// The same without the fence in clearing the flag: loom finds the lost
/// upcall.
#[test]
#[should_panic(expected = "tx upcall lost")]
fn loom_tx_upcall_lost_without_fence() {
    loom::model(|| {
        let word = wake_word(WakeWord::SLEEPING | WakeWord::RX_ONLY);
        let (_, blocks, signalled) = push_against_sleep(
            &word,
            |w, _| w.wants_tx_upcall(),
            |w| w.flags.fetch_and(!WakeWord::RX_ONLY, Ordering::Relaxed),
        );
        assert!(!blocks || signalled, "tx upcall lost");
    });
}

/// The checker has teeth: without the sleeper's fence the wake-up can be
/// lost (store buffering), and loom finds it.
#[test]
#[should_panic(expected = "lost wake-up")]
fn loom_wakeup_lost_without_fence() {
    loom::model(|| {
        let word = wake_word(0);
        let (_, blocks, signalled) = push_against_sleep(
            &word,
            |w, _| w.wants_wakeup(),
            |w| w.flags.fetch_or(WakeWord::SLEEPING, Ordering::Relaxed),
        );
        assert!(!blocks || signalled, "lost wake-up");
    });
}
