//! Pipes and pipe lists: the JIT against the interpreter on random lists and
//! data, the built-ins against plain-Rust references, validation and hostile
//! encodings.

use exonet_ash::pipe::{
    builtins, BinOp, Gauge, Insn, Pipe, PipeError, PipeList, Reg, ShiftOp, MAX_INSNS, MAX_PIPES,
};
use exonet_ash::Transfer;
use proptest::prelude::*;

/// SplitMix64: random programs from one seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const GAUGES: [Gauge; 4] = [Gauge::G8, Gauge::G16, Gauge::G32, Gauge::G64];
const BIN: [BinOp; 6] = [
    BinOp::Add,
    BinOp::AddCarry,
    BinOp::Sub,
    BinOp::Xor,
    BinOp::And,
    BinOp::Or,
];
const SHIFT: [ShiftOp; 4] = [ShiftOp::Shl, ShiftOp::Shr, ShiftOp::Rotl, ShiftOp::Rotr];

/// A random valid register program: every temporary is set before it is
/// read, a modifying pipe outputs once.
fn random_program(rng: &mut Rng) -> Pipe {
    let g = GAUGES[rng.below(4) as usize];
    let temps = 1 + rng.below(4) as u8;
    let np = rng.below(4) as usize;
    let persistent: Vec<u64> = (0..np).map(|_| rng.next()).collect();
    let non_modifying = rng.below(3) == 0;
    let mut set = vec![Reg::Temp(0)];
    set.extend((0..np as u8).map(Reg::Persistent));
    let mut code = vec![Insn::Input { dst: Reg::Temp(0) }];
    let n = rng.below(12) as usize;
    let out_at = rng.below(n as u64 + 1) as usize;
    for i in 0..=n {
        if i == out_at && !non_modifying {
            let src = set[rng.below(set.len() as u64) as usize];
            code.push(Insn::Output { src });
        }
        if i == n {
            break;
        }
        let dst = if np > 0 && rng.below(3) == 0 {
            Reg::Persistent(rng.below(np as u64) as u8)
        } else {
            Reg::Temp(rng.below(u64::from(temps)) as u8)
        };
        let pick = |rng: &mut Rng| set[rng.below(set.len() as u64) as usize];
        let insn = match rng.below(8) {
            0 => Insn::Input { dst },
            1 => Insn::Imm {
                dst,
                value: rng.next(),
            },
            2 => Insn::Mov {
                dst,
                src: pick(rng),
            },
            3 => Insn::Not {
                dst,
                src: pick(rng),
            },
            4 => Insn::Bswap {
                dst,
                src: pick(rng),
                width: GAUGES[1 + rng.below(3) as usize],
            },
            5 | 6 => Insn::Bin {
                op: BIN[rng.below(6) as usize],
                dst,
                a: pick(rng),
                b: pick(rng),
            },
            _ => Insn::Shift {
                op: SHIFT[rng.below(4) as usize],
                dst,
                src: pick(rng),
                amount: rng.below(64) as u8,
            },
        };
        code.push(insn);
        if !set.contains(&dst) {
            set.push(dst);
        }
    }
    Pipe {
        input: g,
        output: g,
        commutative: rng.below(3) == 0,
        non_modifying,
        temps,
        persistent,
        code,
    }
}

/// A random program that also accumulates one of its values into a fresh
/// persistent register with end-around carry (the JIT keeps such
/// accumulators as 128-bit sums).
fn random_accumulator(rng: &mut Rng) -> Pipe {
    let mut p = random_program(rng);
    let acc = Reg::Persistent(p.persistent.len() as u8);
    p.persistent.push(rng.next());
    let x = Reg::Temp(0);
    let (a, b) = if rng.below(2) == 0 {
        (acc, x)
    } else {
        (x, acc)
    };
    let at = 1 + rng.below(p.code.len() as u64) as usize;
    p.code.insert(
        at,
        Insn::Bin {
            op: BinOp::AddCarry,
            dst: acc,
            a,
            b,
        },
    );
    p
}

/// A pure pipe whose output is its input or its byte swap at its gauge,
/// with dead code around (the JIT runs such pipes on all lanes at once).
fn random_lanewise(rng: &mut Rng) -> Pipe {
    let g = GAUGES[rng.below(4) as usize];
    let swap = g != Gauge::G8 && rng.below(2) == 0;
    let mut code = vec![
        Insn::Input { dst: Reg::Temp(0) },
        Insn::Mov {
            dst: Reg::Temp(1),
            src: Reg::Temp(0),
        },
        Insn::Not {
            dst: Reg::Temp(2),
            src: Reg::Temp(1),
        },
    ];
    if swap {
        code.push(Insn::Bswap {
            dst: Reg::Temp(1),
            src: Reg::Temp(1),
            width: g,
        });
    }
    code.push(Insn::Output { src: Reg::Temp(1) });
    Pipe {
        input: g,
        output: g,
        commutative: false,
        non_modifying: false,
        temps: 3,
        persistent: Vec::new(),
        code,
    }
}

fn random_pipe(rng: &mut Rng) -> Pipe {
    match rng.below(10) {
        0 => builtins::checksum(),
        1 => builtins::byte_swap16(),
        2 => builtins::byte_swap32(),
        3 => builtins::byte_swap64(),
        4 => builtins::xor_keystream(rng.next() | 1),
        5 => builtins::copy(),
        6 => random_accumulator(rng),
        7 => random_lanewise(rng),
        _ => random_program(rng),
    }
}

fn random_list(seed: u64) -> PipeList {
    let mut rng = Rng(seed);
    let n = rng.below(5) as usize;
    PipeList::new((0..n).map(|_| random_pipe(&mut rng)).collect()).expect("random lists are valid")
}

fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut rng = Rng(seed);
    (0..n).map(|_| rng.next() as u8).collect()
}

/// RFC 1071 directly: big-endian 16-bit words, an odd byte padded.
fn rfc1071(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_be_bytes([c[0], 0])
        };
        sum += u64::from(w);
    }
    while sum > 0xffff {
        sum = (sum >> 16) + (sum & 0xffff);
    }
    !(sum as u16)
}

/// Runs `t` from `src[so..so+len]` into a buffer at offset `doff`.
fn run(t: &mut dyn Transfer, src: &[u8], doff: usize) -> Vec<u8> {
    let mut dst = vec![0xa5u8; src.len() + doff];
    t.transfer(src, &mut dst[doff..]);
    dst.drain(..doff);
    dst
}

fn regs(t: &dyn Transfer, pl: &PipeList) -> Vec<u64> {
    let mut v = Vec::new();
    for (i, p) in pl.pipes().iter().enumerate() {
        for r in 0..p.persistent.len() {
            v.push(t.reg(i, r).expect("register exists"));
        }
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn jit_equals_interpreter(
        seed in any::<u64>(),
        len in 0usize..9000,
        soff in 0usize..8,
        doff in 0usize..8,
    ) {
        let pl = random_list(seed);
        let data = noise(seed ^ 1, len + soff);
        let src = &data[soff..];
        let mut jit = pl.compile().expect("valid lists compile");
        let mut int = pl.interpret();
        let a = run(&mut jit, src, doff);
        let b = run(&mut int, src, doff);
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(regs(&jit, &pl), regs(&int, &pl));
        prop_assert_eq!(jit.regs(), int.regs());
        // The scan loop updates the registers as the copy does.
        let mut jit2 = pl.compile().expect("valid lists compile");
        jit2.scan(src);
        prop_assert_eq!(jit2.regs(), int.regs());
        let mut int2 = pl.interpret();
        int2.scan(src);
        prop_assert_eq!(int2.regs(), int.regs());
    }

    #[test]
    fn vectorizable_lists_equal_the_interpreter(
        seed in any::<u64>(),
        len in 0usize..5000,
        soff in 0usize..8,
        doff in 0usize..8,
        acc in any::<u64>(),
    ) {
        // Only pipes the JIT's vector loop takes: checksums (several
        // accumulators), byte swaps at every gauge, identities.
        let mut rng = Rng(seed);
        let n = 1 + rng.below(4) as usize;
        let pipes: Vec<Pipe> = (0..n)
            .map(|_| match rng.below(6) {
                0 | 1 => builtins::checksum(),
                2 => builtins::byte_swap16(),
                3 => builtins::byte_swap32(),
                4 => builtins::byte_swap64(),
                _ => random_lanewise(&mut rng),
            })
            .collect();
        let pl = PipeList::new(pipes).expect("valid");
        let data = noise(seed ^ 3, len + soff);
        let src = &data[soff..];
        let mut jit = pl.compile().expect("compiles");
        let mut int = pl.interpret();
        // Any starting accumulator, including ones near 2^64.
        for (i, p) in pl.pipes().iter().enumerate() {
            if !p.persistent.is_empty() {
                jit.set_reg(i, 0, acc);
                int.set_reg(i, 0, acc);
            }
        }
        prop_assert_eq!(run(&mut jit, src, doff), run(&mut int, src, doff));
        prop_assert_eq!(jit.regs(), int.regs());
    }

    #[test]
    fn transfers_split_at_words_equal_one_transfer(
        seed in any::<u64>(),
        len in 0usize..3000,
        cuts in proptest::collection::vec(0usize..400, 0..5),
    ) {
        let pl = random_list(seed);
        let src = noise(seed ^ 2, len);
        let mut whole = pl.compile().expect("valid lists compile");
        let a = run(&mut whole, &src, 0);
        let mut parts = pl.compile().expect("valid lists compile");
        let mut b = vec![0u8; len];
        let mut at = 0;
        for c in cuts {
            let end = (at + 8 * c).min(len);
            parts.transfer(&src[at..end], &mut b[at..end]);
            at = end;
        }
        parts.transfer(&src[at..], &mut b[at..]);
        prop_assert_eq!(a, b);
        prop_assert_eq!(whole.regs(), parts.regs());
    }

    #[test]
    fn checksum_matches_rfc1071_and_etherparse(
        seed in any::<u64>(),
        len in 0usize..9000,
        soff in 0usize..8,
        cuts in proptest::collection::vec(0usize..600, 0..4),
    ) {
        let data = noise(seed, len + soff);
        let src = &data[soff..];
        let pl = PipeList::new(vec![builtins::checksum()]).expect("valid");
        let mut jit = pl.compile().expect("compiles");
        let dst = run(&mut jit, src, 3);
        prop_assert_eq!(&dst[..], src);
        let acc = jit.reg(0, 0).expect("accumulator");
        prop_assert_eq!(acc, builtins::checksum_accumulate(0, src));
        let ck = builtins::fold_checksum(acc);
        prop_assert_eq!(ck, rfc1071(src));
        // etherparse's value is in host byte order.
        prop_assert_eq!(
            ck,
            etherparse::checksum::Sum16BitWords::new().add_slice(src).ones_complement().to_be()
        );
        // Parts of even length give the same checksum.
        let mut parts = pl.compile().expect("compiles");
        let mut out = vec![0u8; src.len()];
        let mut at = 0;
        for c in cuts {
            let end = (at + 2 * c).min(src.len());
            parts.transfer(&src[at..end], &mut out[at..end]);
            at = end;
        }
        parts.transfer(&src[at..], &mut out[at..]);
        prop_assert_eq!(builtins::fold_checksum(parts.reg(0, 0).expect("acc")), ck);
    }

    #[test]
    fn figure1_checksum_then_byte_swap(seed in any::<u64>(), len in 0usize..9000) {
        let src = noise(seed, len);
        let pl = PipeList::new(vec![builtins::checksum(), builtins::byte_swap32()])
            .expect("valid");
        let mut jit = pl.compile().expect("compiles");
        let dst = run(&mut jit, &src, 1);
        let mut want = src.clone();
        for c in want.chunks_exact_mut(4) {
            c.reverse();
        }
        prop_assert_eq!(dst, want);
        prop_assert_eq!(builtins::fold_checksum(jit.reg(0, 0).expect("acc")), rfc1071(&src));
    }

    #[test]
    fn byte_swaps_and_keystream_match_references(
        seed in any::<u64>(),
        len in 0usize..2000,
        key in 1u64..,
    ) {
        let src = noise(seed, len);
        for (pipe, w) in [
            (builtins::byte_swap16(), 2),
            (builtins::byte_swap32(), 4),
            (builtins::byte_swap64(), 8),
        ] {
            let mut t = PipeList::new(vec![pipe]).expect("valid").compile().expect("compiles");
            let mut want = src.clone();
            for c in want.chunks_exact_mut(w) {
                c.reverse();
            }
            prop_assert_eq!(run(&mut t, &src, 0), want);
        }
        let mut t = PipeList::new(vec![builtins::xor_keystream(key)])
            .expect("valid")
            .compile()
            .expect("compiles");
        let mut want = src.clone();
        let mut state = key;
        builtins::xor_keystream_reference(&mut state, &mut want);
        prop_assert_eq!(run(&mut t, &src, 5), want);
        prop_assert_eq!(t.reg(0, 0), Some(state));
        // Decryption is the same keystream.
        let key_list = PipeList::new(vec![builtins::xor_keystream(key)]).expect("valid");
        let enc = run(&mut key_list.compile().expect("compiles"), &src, 0);
        prop_assert_eq!(run(&mut key_list.interpret(), &enc, 0), src);
    }

    #[test]
    fn encodings_round_trip(seed in any::<u64>()) {
        let pl = random_list(seed);
        prop_assert_eq!(PipeList::decode(&pl.encode()), Ok(pl));
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        // Mostly refused (bad magic); the rest is checked below.
        let _ = PipeList::decode(&bytes);
        let mut b = b"ASHP\x01".to_vec();
        b.extend_from_slice(&bytes);
        if let Ok(pl) = PipeList::decode(&b) {
            let mut t = pl.compile().expect("a decoded list compiles");
            let mut out = [0u8; 37];
            t.transfer(&[7u8; 37], &mut out);
        }
    }

    #[test]
    fn mutated_encodings_are_refused_or_valid(
        seed in any::<u64>(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let mut b = random_list(seed).encode();
        for (at, v) in edits {
            let n = b.len();
            b[at % n] = v;
        }
        let cut = cut % (b.len() + 1);
        for bytes in [&b[..], &b[..cut]] {
            match PipeList::decode(bytes) {
                Ok(pl) => {
                    // Whatever it decodes to is a valid list: it runs,
                    // JIT and interpreter agree.
                    let src = noise(seed, 203);
                    let mut jit = pl.compile().expect("a decoded list compiles");
                    let mut int = pl.interpret();
                    prop_assert_eq!(run(&mut jit, &src, 0), run(&mut int, &src, 0));
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }
}

#[test]
fn null_pipe_list_copies() {
    let src = noise(9, 1001);
    let mut t = PipeList::null().compile().expect("compiles");
    assert_eq!(run(&mut t, &src, 3), src);
    assert_eq!(t.reg(0, 0), None);
    assert!(!t.set_reg(0, 0, 1));
}

#[test]
fn registers_export_and_import() {
    let pl = PipeList::new(vec![builtins::byte_swap16(), builtins::checksum()]).expect("valid");
    let mut t = pl.compile().expect("compiles");
    // Seed with a pseudo-header's sum, as UDP does.
    let pseudo = [10, 0, 0, 1, 10, 0, 0, 2, 0, 17, 0, 12];
    let seed = builtins::checksum_accumulate(0, &pseudo);
    assert!(t.set_reg(1, 0, seed));
    assert!(!t.set_reg(1, 1, 0));
    assert!(!t.set_reg(0, 0, 0));
    assert!(!t.set_reg(2, 0, 0));
    let data = noise(4, 12);
    let mut out = [0u8; 12];
    t.transfer(&data, &mut out);
    // The checksum runs after the byte swap: over the swapped data.
    let mut all = pseudo.to_vec();
    all.extend_from_slice(&out);
    assert_eq!(
        builtins::fold_checksum(t.reg(1, 0).expect("acc")),
        rfc1071(&all)
    );
}

#[test]
fn cost_is_static_instructions_times_words() {
    let pl = PipeList::new(vec![builtins::checksum(), builtins::byte_swap32()]).expect("valid");
    // Load, store, two pointer bumps; checksum 2 instructions once per
    // word (commutative); byte swap 3 instructions on 2 lanes.
    assert_eq!(pl.word_cost(), 4 + 2 + 3 * 2);
    let t = pl.compile().expect("compiles");
    let base = exonet_ash::pipe::TRANSFER_BASE_COST;
    assert_eq!(t.cost(0), base);
    assert_eq!(t.cost(1), base + 12);
    assert_eq!(t.cost(4096), base + 12 * 512);
    assert_eq!(t.cost(4097), base + 12 * 513);
    assert!(t.code_size() > 0);
}

#[test]
fn compiled_lists_are_send() {
    fn send<T: Send>(_: &T) {}
    let t = PipeList::null().compile().expect("compiles");
    send(&t);
    let b: Box<dyn Transfer> = Box::new(t);
    send(&b);
}

#[test]
fn listing_shows_one_loop() {
    let pl = PipeList::new(vec![builtins::checksum(), builtins::byte_swap32()]).expect("valid");
    let l = pl.listing().expect("compiles");
    // The byte swap runs on both 32-bit lanes at once, the checksum's
    // accumulator is a 128-bit sum.
    assert!(l.contains("bswap"), "{l}");
    assert!(!l.contains("ireduce"), "{l}");
    assert!(l.contains("iadd.i128"), "{l}");
    // Both pipes run on vectors: the byte swap as a shuffle, the checksum
    // as sums of 32-bit halves.
    if cfg!(target_endian = "little") {
        assert!(l.contains("shuffle") && l.contains("i64x2"), "{l}");
    }
    // A pipe the vector loop cannot run keeps the list scalar.
    let cipher = PipeList::new(vec![builtins::checksum(), builtins::xor_keystream(1)])
        .expect("valid")
        .listing()
        .expect("compiles");
    assert!(!cipher.contains("i64x2"), "{cipher}");
}

fn pipe(code: Vec<Insn>) -> Pipe {
    Pipe {
        input: Gauge::G32,
        output: Gauge::G32,
        commutative: false,
        non_modifying: false,
        temps: 2,
        persistent: vec![0],
        code,
    }
}

fn refused(pipes: Vec<Pipe>) -> String {
    PipeList::new(pipes).expect_err("refused").to_string()
}

#[test]
fn ill_formed_pipes_are_refused_with_clear_errors() {
    let t0 = Reg::Temp(0);
    let t1 = Reg::Temp(1);
    let input = Insn::Input { dst: t0 };
    let out = Insn::Output { src: t0 };
    let e = refused(vec![pipe(vec![Insn::Output { src: t1 }])]);
    assert_eq!(
        e,
        "pipe 0, instruction 0: temporary t1 is read before it is set"
    );
    let e = refused(vec![pipe(vec![input, Insn::Output { src: Reg::Temp(2) }])]);
    assert_eq!(e, "pipe 0, instruction 1: no register t2");
    let e = refused(vec![pipe(vec![
        input,
        Insn::Mov {
            dst: Reg::Persistent(1),
            src: t0,
        },
        out,
    ])]);
    assert_eq!(e, "pipe 0, instruction 1: no register p1");
    let e = refused(vec![builtins::copy(), pipe(vec![input])]);
    assert_eq!(e, "pipe 1: a modifying pipe needs an output instruction");
    let e = refused(vec![pipe(vec![input, out, out])]);
    assert_eq!(e, "pipe 0, instruction 2: a pipe outputs once per word");
    let mut p = pipe(vec![input, out]);
    p.non_modifying = true;
    assert!(refused(vec![p]).contains("non-modifying pipe's output is its input"));
    let mut p = pipe(vec![input, out]);
    p.output = Gauge::G16;
    assert!(
        refused(vec![p]).starts_with("pipe 0: input gauge 32 bits and output gauge 16 bits differ")
    );
    let e = refused(vec![pipe(vec![
        input,
        Insn::Shift {
            op: ShiftOp::Shl,
            dst: t0,
            src: t0,
            amount: 64,
        },
        out,
    ])]);
    assert_eq!(e, "pipe 0, instruction 1: shift by 64 (at most 63)");
    let e = refused(vec![pipe(vec![
        input,
        Insn::Bswap {
            dst: t0,
            src: t0,
            width: Gauge::G8,
        },
        out,
    ])]);
    assert!(e.contains("byte swap is 16, 32 or 64 bits"));
    let e = refused(vec![builtins::copy(); MAX_PIPES + 1]);
    assert_eq!(e, "17 pipes in one pipe list (at most 16)");
    let mut p = pipe(vec![input; MAX_INSNS]);
    p.code.push(out);
    assert!(refused(vec![p]).contains("65 instructions (at most 64)"));
    let mut p = pipe(vec![input, out]);
    p.temps = 17;
    assert!(refused(vec![p]).contains("17 temporary registers"));
    let mut p = pipe(vec![input, out]);
    p.persistent = vec![0; 9];
    assert!(refused(vec![p]).contains("9 persistent registers"));
    // 8 lanes of 63 instructions, 5 times: too much work per word.
    let mut p = pipe(vec![input; 63]);
    p.input = Gauge::G8;
    p.output = Gauge::G8;
    p.code.push(out);
    assert!(refused(vec![p; 5]).contains("instructions per 64-bit word (at most 2048)"));
}

#[test]
fn hostile_encodings_are_refused() {
    let good = PipeList::new(vec![builtins::checksum(), builtins::xor_keystream(3)])
        .expect("valid")
        .encode();
    let err = |b: &[u8]| PipeList::decode(b).expect_err("refused");
    assert_eq!(
        err(b"").to_string(),
        "malformed pipe list encoding at byte 0: truncated magic"
    );
    assert!(err(b"ASHX\x01\x00").to_string().contains("bad magic"));
    assert!(err(b"ASHP\x02\x00").to_string().contains("unknown version"));
    assert!(err(b"ASHP\x01\xff").to_string().contains("too many pipes"));
    let mut b = good.clone();
    b.push(0);
    assert!(err(&b).to_string().contains("trailing bytes"));
    for cut in 0..good.len() {
        assert!(PipeList::decode(&good[..cut]).is_err(), "cut at {cut}");
    }
    // A gauge of 3 bytes, unknown flags, an unknown opcode.
    let mut b = good.clone();
    b[6] = 3;
    assert!(err(&b)
        .to_string()
        .contains("a gauge is 1, 2, 4 or 8 bytes"));
    let mut b = good.clone();
    b[8] = 0x80;
    assert!(err(&b).to_string().contains("unknown flag bits"));
    let mut b = good.clone();
    let first_insn = 6 + 5 + 8 + 1;
    b[first_insn] = 0x7f;
    assert!(err(&b).to_string().contains("unknown opcode"));
    // Well-formed bytes, an invalid program: validation still applies.
    let mut b = good;
    b[first_insn + 1] = 5;
    assert!(matches!(err(&b), PipeError::BadRegister { .. }));
}
