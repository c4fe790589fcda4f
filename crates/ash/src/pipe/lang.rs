//! The pipe language: gauges, registers, instructions, validation and the
//! byte encoding applications send to the multiplexer.

use std::fmt;

/// Most pipes in one pipe list.
pub const MAX_PIPES: usize = 16;
/// Most instructions in one pipe.
pub const MAX_INSNS: usize = 64;
/// Most temporary registers of one pipe.
pub const MAX_TEMPS: usize = 16;
/// Most persistent registers of one pipe.
pub const MAX_PERSISTENT: usize = 8;
/// Most instructions the compiled loop runs per 64-bit word (every pipe's
/// instructions times the lanes it runs on), so that neither the code nor
/// the per-word fuel cost can be made arbitrarily large.
pub const MAX_WORD_COST: u64 = 2048;

/// A pipe's word size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gauge {
    G8,
    G16,
    G32,
    G64,
}

impl Gauge {
    pub const fn bits(self) -> u32 {
        match self {
            Gauge::G8 => 8,
            Gauge::G16 => 16,
            Gauge::G32 => 32,
            Gauge::G64 => 64,
        }
    }

    pub const fn bytes(self) -> usize {
        self.bits() as usize / 8
    }

    /// The low `bits()` bits set.
    pub const fn mask(self) -> u64 {
        match self {
            Gauge::G64 => u64::MAX,
            g => (1u64 << g.bits()) - 1,
        }
    }

    fn from_bytes(b: u8) -> Option<Gauge> {
        match b {
            1 => Some(Gauge::G8),
            2 => Some(Gauge::G16),
            4 => Some(Gauge::G32),
            8 => Some(Gauge::G64),
            _ => None,
        }
    }
}

impl fmt::Display for Gauge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bits", self.bits())
    }
}

/// A register of one pipe. All registers are 64 bits wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reg {
    /// Scratch, undefined at the start of every invocation: must be set
    /// before it is read.
    Temp(u8),
    /// Kept across words and transfers; the application sets it (export)
    /// and reads it back (import).
    Persistent(u8),
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reg::Temp(i) => write!(f, "t{i}"),
            Reg::Persistent(i) => write!(f, "p{i}"),
        }
    }
}

/// Two-operand arithmetic; all of it wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    /// Add with end-around carry: `a + b`, plus one if that overflowed 64
    /// bits (the one's complement sum of the Internet checksum).
    AddCarry,
    Sub,
    Xor,
    And,
    Or,
}

const BIN_OPS: [BinOp; 6] = [
    BinOp::Add,
    BinOp::AddCarry,
    BinOp::Sub,
    BinOp::Xor,
    BinOp::And,
    BinOp::Or,
];

/// Shifts and rotations of the 64-bit register by a constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShiftOp {
    Shl,
    Shr,
    Rotl,
    Rotr,
}

const SHIFT_OPS: [ShiftOp; 4] = [ShiftOp::Shl, ShiftOp::Shr, ShiftOp::Rotl, ShiftOp::Rotr];

/// One instruction. There are no jumps and nothing traps, so a pipe is
/// straight-line code whose cost is its length (§3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Insn {
    /// `dst` = the input word (the pipe's gauge, zero-extended).
    Input {
        dst: Reg,
    },
    /// The output word is `src`, truncated to the gauge.
    Output {
        src: Reg,
    },
    Imm {
        dst: Reg,
        value: u64,
    },
    Mov {
        dst: Reg,
        src: Reg,
    },
    Not {
        dst: Reg,
        src: Reg,
    },
    /// Reverses the low `width` bytes of `src` (16, 32 or 64 bits); the
    /// bits above `width` of `dst` are zero.
    Bswap {
        dst: Reg,
        src: Reg,
        width: Gauge,
    },
    Bin {
        op: BinOp,
        dst: Reg,
        a: Reg,
        b: Reg,
    },
    /// `amount` is 0..=63.
    Shift {
        op: ShiftOp,
        dst: Reg,
        src: Reg,
        amount: u8,
    },
}

/// A pipe: a small computation on streaming data (§2.2).
///
/// Words are read from the byte stream little-endian. A pipe whose gauge is
/// narrower than the pipe list's 64-bit word runs once per lane, lowest
/// address first, unless it is `commutative`: then it may run once on the
/// whole 64-bit word (it promises that is equivalent, e.g. the Internet
/// checksum with end-around carry).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pipe {
    pub input: Gauge,
    pub output: Gauge,
    /// May see the data out of order or at a wider gauge.
    pub commutative: bool,
    /// Its output is its input: it must have no `Output` instruction.
    pub non_modifying: bool,
    /// Temporary registers `t0..temps`.
    pub temps: u8,
    /// Persistent registers `p0..`, with their initial values.
    pub persistent: Vec<u64>,
    pub code: Vec<Insn>,
}

/// Why a pipe list (or its encoding) was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PipeError {
    TooManyPipes(usize),
    TooManyInsns {
        pipe: usize,
        count: usize,
    },
    TooManyTemps {
        pipe: usize,
        count: usize,
    },
    TooManyPersistent {
        pipe: usize,
        count: usize,
    },
    /// A pipe's input and output gauges differ.
    GaugeMismatch {
        pipe: usize,
        input: Gauge,
        output: Gauge,
    },
    BadRegister {
        pipe: usize,
        insn: usize,
        reg: Reg,
    },
    UnsetTemp {
        pipe: usize,
        insn: usize,
        reg: Reg,
    },
    BadShift {
        pipe: usize,
        insn: usize,
        amount: u8,
    },
    BadBswapWidth {
        pipe: usize,
        insn: usize,
    },
    MissingOutput {
        pipe: usize,
    },
    SecondOutput {
        pipe: usize,
        insn: usize,
    },
    OutputInNonModifying {
        pipe: usize,
        insn: usize,
    },
    TooCostly {
        cost: u64,
    },
    /// The encoding is malformed at byte `at`.
    Malformed {
        at: usize,
        what: &'static str,
    },
    /// Cranelift refused the generated code (a bug, reported, not a panic).
    Compile(String),
}

impl fmt::Display for PipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PipeError::TooManyPipes(n) => {
                write!(f, "{n} pipes in one pipe list (at most {MAX_PIPES})")
            }
            PipeError::TooManyInsns { pipe, count } => {
                write!(
                    f,
                    "pipe {pipe}: {count} instructions (at most {MAX_INSNS})"
                )
            }
            PipeError::TooManyTemps { pipe, count } => write!(
                f,
                "pipe {pipe}: {count} temporary registers (at most {MAX_TEMPS})"
            ),
            PipeError::TooManyPersistent { pipe, count } => write!(
                f,
                "pipe {pipe}: {count} persistent registers (at most {MAX_PERSISTENT})"
            ),
            PipeError::GaugeMismatch {
                pipe,
                input,
                output,
            } => write!(
                f,
                "pipe {pipe}: input gauge {input} and output gauge {output} differ; a transfer keeps the message's length, so a pipe must output as many bits as it reads"
            ),
            PipeError::BadRegister { pipe, insn, reg } => {
                write!(f, "pipe {pipe}, instruction {insn}: no register {reg}")
            }
            PipeError::UnsetTemp { pipe, insn, reg } => write!(
                f,
                "pipe {pipe}, instruction {insn}: temporary {reg} is read before it is set"
            ),
            PipeError::BadShift { pipe, insn, amount } => write!(
                f,
                "pipe {pipe}, instruction {insn}: shift by {amount} (at most 63)"
            ),
            PipeError::BadBswapWidth { pipe, insn } => write!(
                f,
                "pipe {pipe}, instruction {insn}: a byte swap is 16, 32 or 64 bits wide"
            ),
            PipeError::MissingOutput { pipe } => write!(
                f,
                "pipe {pipe}: a modifying pipe needs an output instruction"
            ),
            PipeError::SecondOutput { pipe, insn } => write!(
                f,
                "pipe {pipe}, instruction {insn}: a pipe outputs once per word"
            ),
            PipeError::OutputInNonModifying { pipe, insn } => write!(
                f,
                "pipe {pipe}, instruction {insn}: a non-modifying pipe's output is its input; it has no output instruction"
            ),
            PipeError::TooCostly { cost } => write!(
                f,
                "the pipe list runs {cost} instructions per 64-bit word (at most {MAX_WORD_COST})"
            ),
            PipeError::Malformed { at, what } => {
                write!(f, "malformed pipe list encoding at byte {at}: {what}")
            }
            PipeError::Compile(e) => write!(f, "pipe list compilation failed: {e}"),
        }
    }
}

impl std::error::Error for PipeError {}

impl Pipe {
    /// How many times the compiled loop runs this pipe per 64-bit word.
    pub(crate) fn lanes(&self) -> u32 {
        if self.commutative {
            1
        } else {
            64 / self.input.bits()
        }
    }

    /// Checks one pipe (number `p` in its list).
    pub(crate) fn validate(&self, p: usize) -> Result<(), PipeError> {
        if self.input != self.output {
            return Err(PipeError::GaugeMismatch {
                pipe: p,
                input: self.input,
                output: self.output,
            });
        }
        if self.code.len() > MAX_INSNS {
            return Err(PipeError::TooManyInsns {
                pipe: p,
                count: self.code.len(),
            });
        }
        if self.temps as usize > MAX_TEMPS {
            return Err(PipeError::TooManyTemps {
                pipe: p,
                count: self.temps as usize,
            });
        }
        if self.persistent.len() > MAX_PERSISTENT {
            return Err(PipeError::TooManyPersistent {
                pipe: p,
                count: self.persistent.len(),
            });
        }
        let mut set = [false; MAX_TEMPS];
        let mut outputs = 0;
        for (i, insn) in self.code.iter().enumerate() {
            let (dst, srcs) = insn.operands();
            for r in srcs.into_iter().flatten() {
                self.check_reg(p, i, r)?;
                if let Reg::Temp(t) = r {
                    if !set[t as usize] {
                        return Err(PipeError::UnsetTemp {
                            pipe: p,
                            insn: i,
                            reg: r,
                        });
                    }
                }
            }
            if let Some(r) = dst {
                self.check_reg(p, i, r)?;
                if let Reg::Temp(t) = r {
                    set[t as usize] = true;
                }
            }
            match *insn {
                Insn::Output { .. } if self.non_modifying => {
                    return Err(PipeError::OutputInNonModifying { pipe: p, insn: i })
                }
                Insn::Output { .. } => {
                    outputs += 1;
                    if outputs > 1 {
                        return Err(PipeError::SecondOutput { pipe: p, insn: i });
                    }
                }
                Insn::Shift { amount, .. } if amount > 63 => {
                    return Err(PipeError::BadShift {
                        pipe: p,
                        insn: i,
                        amount,
                    })
                }
                Insn::Bswap {
                    width: Gauge::G8, ..
                } => return Err(PipeError::BadBswapWidth { pipe: p, insn: i }),
                _ => {}
            }
        }
        if !self.non_modifying && outputs == 0 {
            return Err(PipeError::MissingOutput { pipe: p });
        }
        Ok(())
    }

    fn check_reg(&self, p: usize, i: usize, r: Reg) -> Result<(), PipeError> {
        let ok = match r {
            Reg::Temp(t) => t < self.temps,
            Reg::Persistent(q) => (q as usize) < self.persistent.len(),
        };
        if ok {
            Ok(())
        } else {
            Err(PipeError::BadRegister {
                pipe: p,
                insn: i,
                reg: r,
            })
        }
    }
}

impl Insn {
    /// The register written and those read.
    pub(crate) fn operands(&self) -> (Option<Reg>, [Option<Reg>; 2]) {
        match *self {
            Insn::Input { dst } | Insn::Imm { dst, .. } => (Some(dst), [None, None]),
            Insn::Output { src } => (None, [Some(src), None]),
            Insn::Mov { dst, src }
            | Insn::Not { dst, src }
            | Insn::Bswap { dst, src, .. }
            | Insn::Shift { dst, src, .. } => (Some(dst), [Some(src), None]),
            Insn::Bin { dst, a, b, .. } => (Some(dst), [Some(a), Some(b)]),
        }
    }
}

// The encoding: "ASHP", version 1, the number of pipes, then per pipe its
// input and output gauge (in bytes), flags (bit 0 commutative, bit 1
// non-modifying), temporaries, persistent registers with their initial
// values (u64 little-endian), the number of instructions and the
// instructions: an opcode byte, then registers as one byte each (bit 7 set
// for persistent), immediates as u64 little-endian, shift amounts and
// byte-swap widths (in bytes) as one byte.
const MAGIC: &[u8; 4] = b"ASHP";
const VERSION: u8 = 1;
const FLAG_COMMUTATIVE: u8 = 1;
const FLAG_NON_MODIFYING: u8 = 2;
const OP_INPUT: u8 = 0;
const OP_OUTPUT: u8 = 1;
const OP_IMM: u8 = 2;
const OP_MOV: u8 = 3;
const OP_NOT: u8 = 4;
const OP_BSWAP: u8 = 5;
const OP_BIN: u8 = 0x10;
const OP_SHIFT: u8 = 0x20;

fn reg_byte(r: Reg) -> u8 {
    match r {
        Reg::Temp(i) => i & 0x7f,
        Reg::Persistent(i) => 0x80 | (i & 0x7f),
    }
}

pub(crate) fn encode(pipes: &[Pipe]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(pipes.len() as u8);
    for p in pipes {
        out.push(p.input.bytes() as u8);
        out.push(p.output.bytes() as u8);
        out.push(
            if p.commutative { FLAG_COMMUTATIVE } else { 0 }
                | if p.non_modifying {
                    FLAG_NON_MODIFYING
                } else {
                    0
                },
        );
        out.push(p.temps);
        out.push(p.persistent.len() as u8);
        for v in &p.persistent {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(p.code.len() as u8);
        for insn in &p.code {
            match *insn {
                Insn::Input { dst } => out.extend_from_slice(&[OP_INPUT, reg_byte(dst)]),
                Insn::Output { src } => out.extend_from_slice(&[OP_OUTPUT, reg_byte(src)]),
                Insn::Imm { dst, value } => {
                    out.extend_from_slice(&[OP_IMM, reg_byte(dst)]);
                    out.extend_from_slice(&value.to_le_bytes());
                }
                Insn::Mov { dst, src } => {
                    out.extend_from_slice(&[OP_MOV, reg_byte(dst), reg_byte(src)])
                }
                Insn::Not { dst, src } => {
                    out.extend_from_slice(&[OP_NOT, reg_byte(dst), reg_byte(src)])
                }
                Insn::Bswap { dst, src, width } => out.extend_from_slice(&[
                    OP_BSWAP,
                    reg_byte(dst),
                    reg_byte(src),
                    width.bytes() as u8,
                ]),
                Insn::Bin { op, dst, a, b } => {
                    let k = BIN_OPS.iter().position(|&o| o == op).unwrap_or(0) as u8;
                    out.extend_from_slice(&[OP_BIN + k, reg_byte(dst), reg_byte(a), reg_byte(b)])
                }
                Insn::Shift {
                    op,
                    dst,
                    src,
                    amount,
                } => {
                    let k = SHIFT_OPS.iter().position(|&o| o == op).unwrap_or(0) as u8;
                    out.extend_from_slice(&[OP_SHIFT + k, reg_byte(dst), reg_byte(src), amount])
                }
            }
        }
    }
    out
}

/// Reads hostile bytes: every read is checked, every count bounded before
/// anything is allocated for it.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u8(&mut self, what: &'static str) -> Result<u8, PipeError> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or(PipeError::Malformed { at: self.at, what })?;
        self.at += 1;
        Ok(b)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, PipeError> {
        let b = self
            .bytes
            .get(self.at..self.at + 8)
            .ok_or(PipeError::Malformed { at: self.at, what })?;
        self.at += 8;
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        Ok(u64::from_le_bytes(w))
    }

    fn bad(&self, what: &'static str) -> PipeError {
        PipeError::Malformed {
            at: self.at.saturating_sub(1),
            what,
        }
    }

    fn reg(&mut self) -> Result<Reg, PipeError> {
        let b = self.u8("truncated register")?;
        Ok(if b & 0x80 != 0 {
            Reg::Persistent(b & 0x7f)
        } else {
            Reg::Temp(b)
        })
    }

    fn gauge(&mut self) -> Result<Gauge, PipeError> {
        let b = self.u8("truncated gauge")?;
        Gauge::from_bytes(b).ok_or_else(|| self.bad("a gauge is 1, 2, 4 or 8 bytes"))
    }

    fn insn(&mut self) -> Result<Insn, PipeError> {
        let op = self.u8("truncated instruction")?;
        Ok(match op {
            OP_INPUT => Insn::Input { dst: self.reg()? },
            OP_OUTPUT => Insn::Output { src: self.reg()? },
            OP_IMM => Insn::Imm {
                dst: self.reg()?,
                value: self.u64("truncated immediate")?,
            },
            OP_MOV => Insn::Mov {
                dst: self.reg()?,
                src: self.reg()?,
            },
            OP_NOT => Insn::Not {
                dst: self.reg()?,
                src: self.reg()?,
            },
            OP_BSWAP => Insn::Bswap {
                dst: self.reg()?,
                src: self.reg()?,
                width: self.gauge()?,
            },
            o if (OP_BIN..OP_BIN + BIN_OPS.len() as u8).contains(&o) => Insn::Bin {
                op: BIN_OPS[(o - OP_BIN) as usize],
                dst: self.reg()?,
                a: self.reg()?,
                b: self.reg()?,
            },
            o if (OP_SHIFT..OP_SHIFT + SHIFT_OPS.len() as u8).contains(&o) => Insn::Shift {
                op: SHIFT_OPS[(o - OP_SHIFT) as usize],
                dst: self.reg()?,
                src: self.reg()?,
                amount: self.u8("truncated shift amount")?,
            },
            _ => return Err(self.bad("unknown opcode")),
        })
    }

    fn pipe(&mut self) -> Result<Pipe, PipeError> {
        let input = self.gauge()?;
        let output = self.gauge()?;
        let flags = self.u8("truncated flags")?;
        if flags & !(FLAG_COMMUTATIVE | FLAG_NON_MODIFYING) != 0 {
            return Err(self.bad("unknown flag bits"));
        }
        let temps = self.u8("truncated temporary count")?;
        if temps as usize > MAX_TEMPS {
            return Err(self.bad("too many temporary registers"));
        }
        let np = self.u8("truncated persistent count")? as usize;
        if np > MAX_PERSISTENT {
            return Err(self.bad("too many persistent registers"));
        }
        let persistent = (0..np)
            .map(|_| self.u64("truncated persistent value"))
            .collect::<Result<Vec<_>, _>>()?;
        let ni = self.u8("truncated instruction count")? as usize;
        if ni > MAX_INSNS {
            return Err(self.bad("too many instructions"));
        }
        let code = (0..ni)
            .map(|_| self.insn())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Pipe {
            input,
            output,
            commutative: flags & FLAG_COMMUTATIVE != 0,
            non_modifying: flags & FLAG_NON_MODIFYING != 0,
            temps,
            persistent,
            code,
        })
    }
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Vec<Pipe>, PipeError> {
    let mut r = Reader { bytes, at: 0 };
    for &m in MAGIC {
        if r.u8("truncated magic")? != m {
            return Err(r.bad("not a pipe list (bad magic)"));
        }
    }
    if r.u8("truncated version")? != VERSION {
        return Err(r.bad("unknown version"));
    }
    let n = r.u8("truncated pipe count")? as usize;
    if n > MAX_PIPES {
        return Err(r.bad("too many pipes"));
    }
    let pipes = (0..n).map(|_| r.pipe()).collect::<Result<Vec<_>, _>>()?;
    if r.at != bytes.len() {
        return Err(PipeError::Malformed {
            at: r.at,
            what: "trailing bytes",
        });
    }
    Ok(pipes)
}
