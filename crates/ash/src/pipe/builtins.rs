//! Built-in pipes and plain-Rust references for them.

use super::lang::{BinOp, Gauge, Insn, Pipe, Reg, ShiftOp};

const T0: Reg = Reg::Temp(0);
const T1: Reg = Reg::Temp(1);
const P0: Reg = Reg::Persistent(0);

/// The Internet checksum (RFC 1071, Figure 2): a commutative,
/// non-modifying pipe of gauge 16 with one persistent register `p0`, the
/// accumulator, to which each word is added with end-around carry.
///
/// Being commutative it runs on whole 64-bit words, so the accumulator
/// holds the 64-bit one's complement sum of the data read as little-endian
/// 64-bit words (a trailing partial word zero-padded), which
/// [`checksum_accumulate`] computes in plain Rust. That sum is congruent
/// modulo 0xffff to RFC 1071's sum of 16-bit little-endian words, so
/// [`fold_checksum`] gives the checksum. To include a pseudo-header, seed
/// `p0` (set_reg(pipe, 0, ..)) with `checksum_accumulate(0, &pseudo_header)`
/// (any even length). A message split into transfers gets the same checksum
/// as long as every part but the last has an even length.
pub fn checksum() -> Pipe {
    Pipe {
        input: Gauge::G16,
        output: Gauge::G16,
        commutative: true,
        non_modifying: true,
        temps: 1,
        persistent: vec![0],
        code: vec![
            Insn::Input { dst: T0 },
            Insn::Bin {
                op: BinOp::AddCarry,
                dst: P0,
                a: P0,
                b: T0,
            },
        ],
    }
}

/// What the checksum pipe's accumulator becomes after `bytes`, starting
/// from `acc`.
pub fn checksum_accumulate(acc: u64, bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(8);
    let mut acc = acc;
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        acc = super::interp::add_carry(acc, u64::from_le_bytes(w));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        acc = super::interp::add_carry(acc, u64::from_le_bytes(w));
    }
    acc
}

/// The checksum of an accumulator: folded to 16 bits, complemented, as the
/// value a header carries in network byte order (the header's two bytes are
/// `fold_checksum(acc).to_be_bytes()`). Over data that includes a correct
/// checksum field it is 0.
pub fn fold_checksum(acc: u64) -> u16 {
    // The sum of little-endian words is the byte-swapped sum of
    // big-endian ones (RFC 1071 §2(B)).
    !fold16(acc).swap_bytes()
}

/// An accumulator folded to its 16-bit one's complement sum (of
/// little-endian words), not complemented.
pub(crate) fn fold16(acc: u64) -> u16 {
    let mut s = (acc >> 32) + (acc & 0xffff_ffff);
    while s > 0xffff {
        s = (s >> 16) + (s & 0xffff);
    }
    s as u16
}

/// One's complement addition of two accumulators.
pub(crate) use super::interp::add_carry;

fn swap(width: Gauge) -> Pipe {
    Pipe {
        input: width,
        output: width,
        commutative: false,
        non_modifying: false,
        temps: 2,
        persistent: Vec::new(),
        code: vec![
            Insn::Input { dst: T0 },
            Insn::Bswap {
                dst: T1,
                src: T0,
                width,
            },
            Insn::Output { src: T1 },
        ],
    }
}

/// Swaps the bytes of every 16-bit word (a trailing odd byte is copied).
pub fn byte_swap16() -> Pipe {
    swap(Gauge::G16)
}

/// Swaps the bytes of every 32-bit word (a trailing partial word is copied).
pub fn byte_swap32() -> Pipe {
    swap(Gauge::G32)
}

/// Swaps the bytes of every 64-bit word (a trailing partial word is copied).
pub fn byte_swap64() -> Pipe {
    swap(Gauge::G64)
}

/// A stand-in cipher: `p0` is an xorshift64 state (13, 7, 17), advanced
/// once per 64-bit word, and each word is XORed with the new state. A
/// trailing partial word is copied unchanged (the state does not advance
/// for it). A zero seed stays zero (the identity): seed it non-zero.
/// [`xor_keystream_reference`] is the same in plain Rust.
pub fn xor_keystream(seed: u64) -> Pipe {
    let shift = |op, amount| Insn::Shift {
        op,
        dst: T0,
        src: P0,
        amount,
    };
    let mix = Insn::Bin {
        op: BinOp::Xor,
        dst: P0,
        a: P0,
        b: T0,
    };
    Pipe {
        input: Gauge::G64,
        output: Gauge::G64,
        commutative: false,
        non_modifying: false,
        temps: 2,
        persistent: vec![seed],
        code: vec![
            shift(ShiftOp::Shl, 13),
            mix,
            shift(ShiftOp::Shr, 7),
            mix,
            shift(ShiftOp::Shl, 17),
            mix,
            Insn::Input { dst: T1 },
            Insn::Bin {
                op: BinOp::Xor,
                dst: T1,
                a: T1,
                b: P0,
            },
            Insn::Output { src: T1 },
        ],
    }
}

/// [`xor_keystream`] in plain Rust, in place; `state` is `p0`.
pub fn xor_keystream_reference(state: &mut u64, data: &mut [u8]) {
    for c in data.chunks_exact_mut(8) {
        let mut s = *state;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *state = s;
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        c.copy_from_slice(&(u64::from_le_bytes(w) ^ s).to_le_bytes());
    }
}

/// The identity: a non-modifying pipe with no code.
pub fn copy() -> Pipe {
    Pipe {
        input: Gauge::G64,
        output: Gauge::G64,
        commutative: true,
        non_modifying: true,
        temps: 0,
        persistent: Vec::new(),
        code: Vec::new(),
    }
}
