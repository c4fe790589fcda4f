//! The fault injector over a memwire cable, on simulated time.

use std::time::Duration;

use exonet_link::memwire::{self, Config, MemWire};
use exonet_link::{Direction, FaultInjector, Faults, Link, ManualClock};
use proptest::prelude::*;

fn frame(seq: u32) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    f
}

fn seq_of(f: &[u8]) -> u32 {
    u32::from_be_bytes([f[14], f[15], f[16], f[17]])
}

fn pair() -> (MemWire, MemWire) {
    memwire::pair_with(Config {
        slots: 4096,
        ..Config::default()
    })
    .unwrap()
}

fn drain(l: &mut impl Link, out: &mut Vec<Vec<u8>>) {
    while l.recv_batch(&mut |f| out.push(f.to_vec()), 64).unwrap() == 64 {}
}

/// Sends `n` numbered frames from `a` in batches, draining `b` after each batch.
fn pump(a: &mut impl Link, b: &mut impl Link, n: u32) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for start in (0..n).step_by(256) {
        let frames: Vec<Vec<u8>> = (start..n.min(start + 256)).map(frame).collect();
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        assert_eq!(a.send_batch(&refs).unwrap(), refs.len());
        drain(b, &mut out);
    }
    out
}

fn rx_faulty(
    faults: Faults,
    seed: u64,
    clock: ManualClock,
) -> (MemWire, FaultInjector<MemWire, ManualClock>) {
    let (a, b) = pair();
    (
        a,
        FaultInjector::with_clock(b, seed, clock).with_faults(Direction::Rx, faults),
    )
}

fn assert_rate(count: u64, n: u64, rate: f64) {
    let got = count as f64 / n as f64;
    assert!((got - rate).abs() < 0.015, "rate {got} for expected {rate}");
}

const N: u32 = 20_000;

#[test]
fn loss_rate_within_tolerance() {
    let faults = Faults {
        loss_rate: 0.1,
        ..Faults::default()
    };
    let (mut a, mut b) = rx_faulty(faults, 1, ManualClock::new());
    let got = pump(&mut a, &mut b, N);
    let st = b.fault_stats(Direction::Rx);
    assert_eq!(st.frames, u64::from(N));
    assert_eq!(got.len() as u64 + st.lost, u64::from(N));
    assert_rate(st.lost, N.into(), 0.1);
    // What survives stays in order.
    assert!(got.windows(2).all(|w| seq_of(&w[0]) < seq_of(&w[1])));
}

#[test]
fn duplicate_rate_within_tolerance() {
    let faults = Faults {
        duplicate_rate: 0.05,
        ..Faults::default()
    };
    let (mut a, mut b) = rx_faulty(faults, 2, ManualClock::new());
    let got = pump(&mut a, &mut b, N);
    let dups = b.fault_stats(Direction::Rx).duplicated;
    assert_eq!(got.len() as u64, u64::from(N) + dups);
    assert_rate(dups, N.into(), 0.05);
    // A copy follows its original.
    let seqs: Vec<u32> = got.iter().map(|f| seq_of(f)).collect();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn corruption_flips_exactly_one_bit_per_corrupted_frame() {
    let faults = Faults {
        corrupt_rate: 0.1,
        ..Faults::default()
    };
    let (mut a, mut b) = rx_faulty(faults, 3, ManualClock::new());
    let got = pump(&mut a, &mut b, N);
    assert_eq!(got.len() as u32, N);
    let mut changed = 0;
    for (i, f) in got.iter().enumerate() {
        let want = frame(i as u32);
        let bits: u32 = f.iter().zip(&want).map(|(x, y)| (x ^ y).count_ones()).sum();
        assert!(bits <= 1);
        changed += u64::from(bits);
    }
    assert_eq!(changed, b.fault_stats(Direction::Rx).corrupted);
    assert_rate(changed, N.into(), 0.1);
}

#[test]
fn reordering_keeps_every_frame() {
    let clock = ManualClock::new();
    let faults = Faults {
        reorder_rate: 0.2,
        delay: Duration::from_millis(10),
        ..Faults::default()
    };
    let (mut a, mut b) = rx_faulty(faults, 4, clock.clone());
    let mut got = pump(&mut a, &mut b, 2000);
    // Frames still waiting for someone to overtake them are released by the clock.
    assert!(b.poll_timeout().is_some());
    clock.advance(Duration::from_millis(10));
    drain(&mut b, &mut got);
    assert_eq!(b.poll_timeout(), None);

    let seqs: Vec<u32> = got.iter().map(|f| seq_of(f)).collect();
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..2000).collect::<Vec<_>>());
    let inversions = seqs.windows(2).filter(|w| w[0] > w[1]).count() as u64;
    let reordered = b.fault_stats(Direction::Rx).reordered;
    assert!(inversions > 0 && inversions <= reordered);
    assert_rate(reordered, 2000, 0.2);
}

#[test]
fn delay_is_measured_on_the_injected_clock() {
    let clock = ManualClock::new();
    let faults = Faults {
        delay_rate: 1.0,
        delay: Duration::from_millis(5),
        ..Faults::default()
    };
    let (mut a, mut b) = rx_faulty(faults, 5, clock.clone());
    let got = pump(&mut a, &mut b, 100);
    assert!(got.is_empty());
    assert_eq!(b.poll_timeout(), Some(Duration::from_millis(5)));
    clock.advance(Duration::from_millis(4));
    assert_eq!(b.recv_batch(&mut |_| {}, 64).unwrap(), 0);
    assert_eq!(b.poll_timeout(), Some(Duration::from_millis(1)));
    clock.advance(Duration::from_millis(1));
    let mut got = Vec::new();
    drain(&mut b, &mut got);
    assert_eq!(got, (0..100).map(frame).collect::<Vec<_>>());
}

#[test]
fn same_seed_same_faults_other_seed_other_faults() {
    let faults = Faults {
        loss_rate: 0.05,
        duplicate_rate: 0.05,
        corrupt_rate: 0.05,
        reorder_rate: 0.05,
        delay_rate: 0.05,
        delay: Duration::from_millis(1),
    };
    let run = |seed| {
        let clock = ManualClock::new();
        let (mut a, mut b) = rx_faulty(faults, seed, clock.clone());
        let mut got = pump(&mut a, &mut b, 3000);
        clock.advance(Duration::from_millis(1));
        drain(&mut b, &mut got);
        got
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
fn transmit_faults_and_delayed_sends_flushed_by_receive() {
    let clock = ManualClock::new();
    let (a, mut b) = pair();
    let mut a = FaultInjector::with_clock(a, 6, clock.clone()).with_faults(
        Direction::Tx,
        Faults {
            loss_rate: 0.5,
            delay_rate: 0.5,
            delay: Duration::from_millis(2),
            ..Faults::default()
        },
    );
    let mut got = pump(&mut a, &mut b, 4000);
    let st = a.fault_stats(Direction::Tx);
    assert_rate(st.lost, 4000, 0.5);
    assert_eq!(got.len() as u64, 4000 - st.lost - st.delayed);
    // The application only receives; its delayed transmissions still go out.
    clock.advance(Duration::from_millis(2));
    assert_eq!(a.recv_batch(&mut |_| {}, 64).unwrap(), 0);
    drain(&mut b, &mut got);
    assert_eq!(got.len() as u64, 4000 - st.lost);
    assert_eq!(a.stats().tx_frames, 4000 - st.lost);
}

proptest! {
    /// Without loss or corruption every frame arrives, as often as it was copied,
    /// whatever the duplication, reordering and delay.
    #[test]
    fn no_frame_is_lost_without_loss(
        seed in any::<u64>(),
        dup in 0.0..0.5f64,
        reorder in 0.0..0.5f64,
        delay in 0.0..0.5f64,
        n in 1u32..400,
        dir_tx in any::<bool>(),
    ) {
        let clock = ManualClock::new();
        let faults = Faults {
            duplicate_rate: dup,
            reorder_rate: reorder,
            delay_rate: delay,
            delay: Duration::from_millis(3),
            ..Faults::default()
        };
        let (a, b) = pair();
        let dir = if dir_tx { Direction::Tx } else { Direction::Rx };
        let mut a = FaultInjector::with_clock(a, seed, clock.clone()).with_faults(dir, faults);
        let mut b = FaultInjector::with_clock(b, seed, clock.clone()).with_faults(dir, faults);
        let mut got = pump(&mut a, &mut b, n);
        clock.advance(Duration::from_millis(3));
        a.recv_batch(&mut |_| {}, 64).unwrap();
        drain(&mut b, &mut got);
        let dups = a.fault_stats(Direction::Tx).duplicated + b.fault_stats(Direction::Rx).duplicated;
        prop_assert_eq!(got.len() as u64, u64::from(n) + dups);
        let mut seqs: Vec<u32> = got.iter().map(|f| seq_of(f)).collect();
        seqs.sort_unstable();
        seqs.dedup();
        prop_assert_eq!(seqs, (0..n).collect::<Vec<_>>());
        prop_assert_eq!(a.poll_timeout(), None);
        prop_assert_eq!(b.poll_timeout(), None);
    }
}
