//! `exonet bench ash`: application-specific handlers (ASH).
//!
//! Output as every suite's (see [`crate::bench::report`]): one JSON line per
//! (case, system, metric), then on stderr a table with the ratio of every
//! value to exonet's and whether the goals are met.
//!
//! # Cases and systems
//!
//! The ASH paper's Table 5, integrated layer processing, on 4096-byte
//! messages in memory, `gbps` of message data:
//!
//! - `ilp-copy-cksum`: copy a message and compute its Internet checksum;
//! - `ilp-copy-cksum-bswap`: the same and swap the bytes of every 32-bit
//!   word (big- to little-endian).
//!
//! Systems:
//! - `exonet-dilp`: dynamic ILP, the pipe list compiled into one loop: the
//!   checksum pipe, composed with a byte swap pipe as in the paper's
//!   Figure 1 (`exonet_ash::pipe`);
//! - `hand-integrated`: a hand-written fused Rust loop, one pass over
//!   64-bit words;
//! - `separate`: `copy_from_slice`, then a checksum pass over the
//!   destination, then (bswap) a byte swap pass in place, each a good
//!   ordinary Rust loop (the checksum sums 32-bit halves, which the
//!   compiler vectorizes; the swap works on 64-bit words);
//! - `separate-uncached`: the same with the message's source and
//!   destination flushed from every cache level (`clflush`, x86-64 only;
//!   skipped elsewhere) before each pass, the paper's "much time between
//!   the operations"; only the passes are timed, not the flushes;
//! - `memcpy`: the copy alone, the physical limit.
//!
//! Every system's output (checksum and destination bytes) is checked
//! against a plain reference once before it is timed; a mismatch is an
//! error line. The destination lies half a page from the source modulo
//! 4096 (no 4K aliasing for any system). The systems are timed in six
//! interleaved rounds and each one's best round counts (see [`ROUNDS`]).
//!
//! Goals (the paper's): `exonet-dilp` at least 1.4× `separate`, and within
//! 10% of `hand-integrated`.
//!
//! The handler cases, `remote-increment` (Table 6, Figure 5),
//! `handler-overhead` and `handler-udp-below`, are in
//! [`ash_handlers`](crate::bench::ash_handlers).

use std::convert::Infallible;
use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use exonet_ash::pipe::{builtins, PipeList};
use exonet_ash::Transfer;

use crate::bench::ash_handlers;
use crate::bench::measure::{ns_per_op, Budget};
use crate::bench::report::{Fail, Outcome, Reporter};
use crate::bench::RunOpts;

#[derive(Debug, clap::Args)]
pub struct AshArgs {
    #[command(flatten)]
    pub opts: RunOpts,
}

const COPY_CKSUM: &str = "ilp-copy-cksum";
const COPY_CKSUM_BSWAP: &str = "ilp-copy-cksum-bswap";
const CASES: [&str; 5] = [
    COPY_CKSUM,
    COPY_CKSUM_BSWAP,
    ash_handlers::HANDLER_OVERHEAD,
    ash_handlers::UDP_BELOW,
    ash_handlers::REMOTE_INCREMENT,
];

const DILP: &str = "exonet-dilp";
const HAND: &str = "hand-integrated";
const SEPARATE: &str = "separate";
const UNCACHED: &str = "separate-uncached";
const MEMCPY: &str = "memcpy";
const SYSTEMS: [&str; 5] = [DILP, HAND, SEPARATE, UNCACHED, MEMCPY];

/// The paper's message size.
const MSG: usize = 4096;

pub fn run(args: &AshArgs) -> ExitCode {
    let opts = &args.opts;
    if let Some(bad) = opts.cases.iter().find(|c| !CASES.contains(&c.as_str())) {
        eprintln!("unknown case {bad}; the cases are: {}", CASES.join(" "));
        return ExitCode::from(2);
    }
    let mut rep = Reporter::new("ash", opts.json_only);
    for case in [COPY_CKSUM, COPY_CKSUM_BSWAP] {
        if opts.wants(case) {
            ilp(case, case == COPY_CKSUM_BSWAP, &opts.budget(), &mut rep);
        }
    }
    for case in [COPY_CKSUM, COPY_CKSUM_BSWAP] {
        rep.goal(case, "gbps", (DILP, SEPARATE), "at least 1.4x", |r| {
            r >= 1.4
        });
        rep.goal(case, "gbps", (DILP, HAND), "at least 0.9x", |r| r >= 0.9);
    }
    if opts.wants(ash_handlers::HANDLER_OVERHEAD) {
        ash_handlers::overhead(opts, &mut rep);
    }
    if opts.wants(ash_handlers::UDP_BELOW) {
        ash_handlers::udp_below(opts, &mut rep);
    }
    if opts.wants(ash_handlers::REMOTE_INCREMENT) {
        ash_handlers::remote_increment(opts, &mut rep);
    }
    let run = if opts.quick { "--quick" } else { "full run" };
    rep.print_table(
        &format!(
            "ash: (Nx) = ratio to exonet-dilp; gbps of {MSG}-byte messages, higher is better; {run}"
        ),
        &SYSTEMS,
        DILP,
    );
    rep.print_table(
        &format!("ash: handler cost, ns per frame, lower is better; {run}"),
        &ash_handlers::OVERHEAD_SYSTEMS,
        ash_handlers::OVERHEAD_SYSTEMS[0],
    );
    rep.print_table(
        &format!("ash: a 1472-byte datagram into a handler's window, its checksum verified, ns per frame, lower is better; {run}"),
        &ash_handlers::UDP_BELOW_SYSTEMS,
        ash_handlers::UDP_BELOW_SYSTEMS[0],
    );
    let rtt: Vec<String> = ash_handlers::LOADS
        .iter()
        .flat_map(|n| [format!("handler-{n}"), format!("app-{n}")])
        .collect();
    let rtt: Vec<&str> = rtt.iter().map(String::as_str).collect();
    rep.print_table(
        &format!(
            "ash: remote increment, mean µs per round trip with N competing processes, lower is better; {run}"
        ),
        &rtt,
        "handler-0",
    );
    rep.exit_code()
}

/// One message's work: copy `src` into `dst` (the same length) and return
/// the checksum (0 for the plain copy).
type Op = Box<dyn FnMut(&[u8], &mut [u8]) -> u16>;

/// Times one system, already checked: nanoseconds per message.
type Timer<'a> = Box<dyn FnMut(&Budget) -> f64 + 'a>;

/// Rounds of measurement per case: every system is timed in each, one
/// after the other, and its best round counts, so that a burst of load
/// from other processes on a shared machine slows down one round of every
/// system rather than all of one system's time.
const ROUNDS: u32 = 6;

/// One ILP case: every system checked, then timed.
fn ilp(case: &str, bswap: bool, budget: &Budget, rep: &mut Reporter) {
    let src = message();
    let want = if bswap { swap32(&src) } else { src.clone() };
    let sum = builtins::fold_checksum(builtins::checksum_accumulate(0, &src));
    let mut timers: Vec<(&str, Result<Timer<'_>, Fail>)> = SYSTEMS
        .into_iter()
        .map(|system| {
            let t = match system {
                UNCACHED => uncached(&src, bswap, &want, sum),
                MEMCPY => {
                    let op: Op = Box::new(|s, d| {
                        d.copy_from_slice(s);
                        0
                    });
                    cached(&src, op, &src, None)
                }
                _ => op(system, bswap).and_then(|op| cached(&src, op, &want, Some(sum))),
            };
            (system, t)
        })
        .collect();
    let round = Budget {
        per_case: budget.per_case / ROUNDS,
        reps: budget.reps,
    };
    let mut best = vec![f64::INFINITY; timers.len()];
    for r in 1..=ROUNDS {
        for ((system, t), best) in timers.iter_mut().zip(&mut best) {
            if let Ok(t) = t {
                rep.progress(&format!("{case}: {system}, round {r} of {ROUNDS}"));
                *best = best.min(t(&round));
            }
        }
    }
    for ((system, t), ns) in timers.into_iter().zip(best) {
        rep.push(case, system, "gbps", Outcome::of(t.map(|_| gbps(ns))));
    }
}

fn op(system: &str, bswap: bool) -> Result<Op, Fail> {
    Ok(match system {
        DILP => {
            // Figure 1: the checksum pipe, then the byte swap pipe.
            let mut pipes = vec![builtins::checksum()];
            if bswap {
                pipes.push(builtins::byte_swap32());
            }
            let mut t = PipeList::new(pipes)
                .and_then(|pl| pl.compile())
                .map_err(|e| Fail::Error(format!("the pipe list: {e}")))?;
            Box::new(move |s, d| {
                // Export a fresh accumulator, transfer, import it.
                t.set_reg(0, 0, 0);
                t.transfer(s, d);
                builtins::fold_checksum(t.reg(0, 0).unwrap_or(0))
            })
        }
        HAND => Box::new(move |s, d| hand_integrated(s, d, bswap)),
        _ => Box::new(move |s, d| separate(s, d, bswap, &mut || {})),
    })
}

/// Checks `op`'s output once; its timer runs it on the cached message.
fn cached<'a>(src: &'a [u8], mut op: Op, want: &[u8], sum: Option<u16>) -> Result<Timer<'a>, Fail> {
    let mut buf = vec![0u8; src.len() + 4096 + 64];
    let dst = apart(&mut buf, src);
    let got = op(src, dst);
    check(dst, want, got, sum)?;
    Ok(Box::new(move |budget| {
        let dst = apart(&mut buf, src);
        let r = ns_per_op(budget, |count| {
            let start = Instant::now();
            for _ in 0..count {
                black_box(op(black_box(src), black_box(&mut *dst)));
            }
            Ok::<_, Infallible>(start.elapsed())
        });
        match r {
            Ok(ns) => ns,
            Err(never) => match never {},
        }
    }))
}

fn check(dst: &[u8], want: &[u8], got: u16, sum: Option<u16>) -> Result<(), Fail> {
    if dst != want {
        let at = dst.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(Fail::Error(format!(
            "wrong destination bytes from offset {at}"
        )));
    }
    match sum {
        Some(s) if s != got => Err(Fail::Error(format!(
            "checksum {got:#06x}, the reference says {s:#06x}"
        ))),
        _ => Ok(()),
    }
}

/// A destination of `src.len()` bytes in `buf` whose address is half a
/// page away from `src`'s modulo 4096: a store and a later load whose
/// addresses agree in their low 12 bits stall on x86 (4K aliasing), which
/// two page-sized buffers allocated one after the other would inflict on
/// every loop that loads and stores, and not on `memcpy`.
fn apart<'a>(buf: &'a mut [u8], src: &[u8]) -> &'a mut [u8] {
    let want = (src.as_ptr() as usize + 2048) % 4096;
    let at = (want + 4096 - buf.as_ptr() as usize % 4096) % 4096;
    &mut buf[at..at + src.len()]
}

fn gbps(ns_per_msg: f64) -> f64 {
    (MSG * 8) as f64 / ns_per_msg
}

/// A message of pseudo-random bytes (SplitMix64).
fn message() -> Vec<u8> {
    let mut x: u64 = 0x243f_6a88_85a3_08d3;
    (0..MSG)
        .map(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

fn swap32(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    for c in v.chunks_exact_mut(4) {
        c.reverse();
    }
    v
}

fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(w)
}

/// The Internet checksum of a 128-bit sum of little-endian 64-bit words.
fn fold128(sum: u128) -> u16 {
    let (lo, hi) = (sum as u64, (sum >> 64) as u64);
    let (s, c) = lo.overflowing_add(hi);
    builtins::fold_checksum(s + u64::from(c))
}

/// Copy, checksum and (bswap) byte swap in one pass over 64-bit words.
fn hand_integrated(src: &[u8], dst: &mut [u8], bswap: bool) -> u16 {
    let mut sum: u128 = 0;
    let mut s = src.chunks_exact(8);
    let mut d = dst.chunks_exact_mut(8);
    for (s, d) in (&mut s).zip(&mut d) {
        let w = word(s);
        sum += u128::from(w);
        let w = if bswap {
            w.swap_bytes().rotate_left(32)
        } else {
            w
        };
        d.copy_from_slice(&w.to_le_bytes());
    }
    let (s, d) = (s.remainder(), d.into_remainder());
    sum += u128::from(word(s));
    d.copy_from_slice(s);
    if bswap {
        for c in d.chunks_exact_mut(4) {
            c.reverse();
        }
    }
    fold128(sum)
}

/// A checksum pass over `data`: the low and high 32-bit halves of the
/// words summed apart, which the compiler vectorizes (exact for messages
/// under 2^32 words).
fn checksum(data: &[u8]) -> u16 {
    let mut words = data.chunks_exact(8);
    let (mut lo, mut hi) = (0u64, 0u64);
    for w in &mut words {
        let w = word(w);
        lo += w & 0xffff_ffff;
        hi += w >> 32;
    }
    let w = word(words.remainder());
    lo += w & 0xffff_ffff;
    hi += w >> 32;
    fold128(u128::from(lo) + (u128::from(hi) << 32))
}

/// A byte swap pass in place, a 64-bit word at a time.
fn swap_in_place(data: &mut [u8]) {
    let mut words = data.chunks_exact_mut(8);
    for c in &mut words {
        c.copy_from_slice(&word(c).swap_bytes().rotate_left(32).to_le_bytes());
    }
    for c in words.into_remainder().chunks_exact_mut(4) {
        c.reverse();
    }
}

/// Copy, then checksum, then (bswap) byte swap, calling `between` between
/// the passes.
fn separate(src: &[u8], dst: &mut [u8], bswap: bool, between: &mut dyn FnMut()) -> u16 {
    dst.copy_from_slice(src);
    between();
    let sum = checksum(dst);
    if bswap {
        between();
        swap_in_place(dst);
    }
    sum
}

/// `separate` with the message flushed from the caches before each pass;
/// only the passes are timed.
#[cfg(target_arch = "x86_64")]
fn uncached<'a>(src: &'a [u8], bswap: bool, want: &[u8], sum: u16) -> Result<Timer<'a>, Fail> {
    let mut buf = vec![0u8; src.len() + 4096 + 64];
    let dst = apart(&mut buf, src);
    let flush = |dst: *const u8| {
        flush_lines(src.as_ptr(), src.len());
        flush_lines(dst, src.len());
    };
    let dp = dst.as_ptr();
    let got = separate(src, dst, bswap, &mut || flush(dp));
    check(dst, want, got, Some(sum))?;
    Ok(Box::new(move |budget| {
        let dst = apart(&mut buf, src);
        let dp = dst.as_ptr();
        let r = ns_per_op(budget, |count| {
            let mut total = Duration::ZERO;
            for _ in 0..count {
                flush(dp);
                let mut start = Instant::now();
                let mut lap = || {
                    total += start.elapsed();
                    flush(dp);
                    start = Instant::now();
                };
                black_box(separate(
                    black_box(src),
                    black_box(&mut *dst),
                    bswap,
                    &mut lap,
                ));
                total += start.elapsed();
            }
            Ok::<_, Infallible>(total)
        });
        match r {
            Ok(ns) => ns,
            Err(never) => match never {},
        }
    }))
}

#[cfg(not(target_arch = "x86_64"))]
fn uncached<'a>(_: &'a [u8], _: bool, _: &[u8], _: u16) -> Result<Timer<'a>, Fail> {
    Err(Fail::Skip("needs x86-64 (clflush)".into()))
}

/// Evicts `[p, p + len)` from every cache level.
#[cfg(target_arch = "x86_64")]
fn flush_lines(p: *const u8, len: usize) {
    use std::arch::x86_64::{_mm_clflush, _mm_mfence};
    for off in (0..len).step_by(64) {
        // SAFETY: `p + off` lies inside a live buffer of `len` bytes;
        // clflush only evicts the line (SSE2, always on x86-64).
        unsafe { _mm_clflush(p.add(off)) };
    }
    // SAFETY: a fence has no preconditions; it orders the flushes before
    // the next pass's loads.
    unsafe { _mm_mfence() };
}
