//! The reference semantics of a pipe list, word by word, as the module
//! doc of [`super`] states them.

use super::lang::{BinOp, Gauge, Insn, Pipe, Reg, ShiftOp, MAX_TEMPS};

/// Runs `pipe` once on `input` with its persistent registers `regs`;
/// returns its output (its input if it is non-modifying), which the caller
/// truncates to the lane it runs on.
pub(crate) fn invoke(pipe: &Pipe, regs: &mut [u64], input: u64) -> u64 {
    let mut temps = [0u64; MAX_TEMPS];
    let mut output = input;
    let get = |temps: &[u64; MAX_TEMPS], regs: &[u64], r: Reg| match r {
        Reg::Temp(t) => temps[t as usize],
        Reg::Persistent(p) => regs[p as usize],
    };
    for insn in &pipe.code {
        let v = match *insn {
            Insn::Input { .. } => input,
            Insn::Output { src } => {
                output = get(&temps, regs, src);
                continue;
            }
            Insn::Imm { value, .. } => value,
            Insn::Mov { src, .. } => get(&temps, regs, src),
            Insn::Not { src, .. } => !get(&temps, regs, src),
            Insn::Bswap { src, width, .. } => {
                let x = get(&temps, regs, src);
                match width {
                    Gauge::G16 => (x as u16).swap_bytes() as u64,
                    Gauge::G32 => (x as u32).swap_bytes() as u64,
                    _ => x.swap_bytes(),
                }
            }
            Insn::Bin { op, a, b, .. } => {
                let (a, b) = (get(&temps, regs, a), get(&temps, regs, b));
                match op {
                    BinOp::Add => a.wrapping_add(b),
                    BinOp::AddCarry => add_carry(a, b),
                    BinOp::Sub => a.wrapping_sub(b),
                    BinOp::Xor => a ^ b,
                    BinOp::And => a & b,
                    BinOp::Or => a | b,
                }
            }
            Insn::Shift {
                op, src, amount, ..
            } => {
                let x = get(&temps, regs, src);
                let k = u32::from(amount);
                match op {
                    ShiftOp::Shl => x << k,
                    ShiftOp::Shr => x >> k,
                    ShiftOp::Rotl => x.rotate_left(k),
                    ShiftOp::Rotr => x.rotate_right(k),
                }
            }
        };
        match insn.operands().0 {
            Some(Reg::Temp(t)) => temps[t as usize] = v,
            Some(Reg::Persistent(p)) => regs[p as usize] = v,
            None => {}
        }
    }
    if pipe.non_modifying {
        input
    } else {
        output
    }
}

/// The one's complement (end-around carry) sum of two 64-bit words.
pub(crate) fn add_carry(a: u64, b: u64) -> u64 {
    let (s, c) = a.overflowing_add(b);
    s.wrapping_add(u64::from(c))
}

/// Where each pipe's persistent registers start in one flat array.
pub(crate) fn reg_bases(pipes: &[Pipe]) -> Vec<usize> {
    pipes
        .iter()
        .scan(0, |at, p| {
            let b = *at;
            *at += p.persistent.len();
            Some(b)
        })
        .collect()
}

/// One full 64-bit word through every pipe.
pub(crate) fn word(pipes: &[Pipe], bases: &[usize], regs: &mut [u64], mut w: u64) -> u64 {
    for (p, &base) in pipes.iter().zip(bases) {
        let r = &mut regs[base..base + p.persistent.len()];
        let lanes = p.lanes();
        if lanes == 1 {
            w = invoke(p, r, w);
            continue;
        }
        let bits = p.input.bits();
        let mask = p.input.mask();
        let mut out = 0;
        for l in 0..lanes {
            let x = (w >> (l * bits)) & mask;
            out |= (invoke(p, r, x) & mask) << (l * bits);
        }
        w = out;
    }
    w
}

/// The tail (fewer than 8 bytes), in place, by the rules in the module doc.
pub(crate) fn tail(pipes: &[Pipe], bases: &[usize], regs: &mut [u64], bytes: &mut [u8]) {
    let n = bytes.len();
    debug_assert!(n < 8);
    if n == 0 {
        return;
    }
    let mut buf = [0u8; 8];
    buf[..n].copy_from_slice(bytes);
    let mut w = u64::from_le_bytes(buf);
    for (p, &base) in pipes.iter().zip(bases) {
        let r = &mut regs[base..base + p.persistent.len()];
        let g = p.input.bytes();
        let mask = p.input.mask();
        if p.non_modifying {
            if p.commutative {
                invoke(p, r, w);
            } else {
                for l in 0..n.div_ceil(g) {
                    invoke(p, r, (w >> (l * g * 8)) & mask);
                }
            }
        } else {
            for l in 0..n / g {
                let sh = (l * g * 8) as u32;
                let o = invoke(p, r, (w >> sh) & mask) & mask;
                w = (w & !(mask << sh)) | (o << sh);
            }
        }
    }
    bytes.copy_from_slice(&w.to_le_bytes()[..n]);
}
