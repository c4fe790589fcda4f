//! The filter language of DPF Figure 1: a conjunction of atoms
//! `(offset:bits [& mask]) OP constant` and `SHIFT`s that move the base.
//!
//! Loads are unsigned and in network byte order (big-endian), so constants
//! read as they do in protocol specifications (`12:16 == 0x0800`).
//!
//! Text syntax (round-trips through [`Filter`]'s `Display` and `FromStr`):
//!
//! ```text
//! filter := elem (('&' | '&&') elem)*
//! elem   := atom | '(' atom ')' | 'SHIFT' '(' shift ')' | '(' 'SHIFT' '(' shift ')' ')'
//! atom   := field OP const
//! field  := offset ':' bits | '(' offset ':' bits ['&' mask] ')'
//! shift  := const ('+' const)* | field ['<<' k]
//! OP     := '==' | '!=' | '<' | '<=' | '>' | '>='
//! ```
//!
//! `#` starts a comment that runs to the end of the line, as in Figure 1.

use std::fmt;
use std::str::FromStr;

use crate::DpfError;

/// Width of a load, in bits (the `bits` of `offset:bits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Width {
    U8,
    U16,
    U32,
}

impl Width {
    pub fn bytes(self) -> u32 {
        match self {
            Width::U8 => 1,
            Width::U16 => 2,
            Width::U32 => 4,
        }
    }

    pub fn bits(self) -> u32 {
        self.bytes() * 8
    }

    /// All ones in this width.
    pub fn full_mask(self) -> u32 {
        match self {
            Width::U8 => 0xff,
            Width::U16 => 0xffff,
            Width::U32 => 0xffff_ffff,
        }
    }

    pub fn from_bits(bits: u32) -> Option<Width> {
        match bits {
            8 => Some(Width::U8),
            16 => Some(Width::U16),
            32 => Some(Width::U32),
            _ => None,
        }
    }

    pub fn from_bytes(bytes: u32) -> Option<Width> {
        Width::from_bits(bytes * 8)
    }
}

/// Comparison operator of an atom; all comparisons are unsigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    pub fn eval(self, a: u32, b: u32) -> bool {
        match self {
            Op::Eq => a == b,
            Op::Ne => a != b,
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Gt => a > b,
            Op::Ge => a >= b,
        }
    }

    /// The operator that is true exactly when `self` is false.
    pub fn negate(self) -> Op {
        match self {
            Op::Eq => Op::Ne,
            Op::Ne => Op::Eq,
            Op::Lt => Op::Ge,
            Op::Le => Op::Gt,
            Op::Gt => Op::Le,
            Op::Ge => Op::Lt,
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Op::Eq => "==",
            Op::Ne => "!=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }
}

/// `(offset:bits & mask)`: a field of the frame relative to the current base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Field {
    pub offset: u32,
    pub width: Width,
    pub mask: u32,
}

impl Field {
    /// A field with every bit of its width selected.
    pub fn new(offset: u32, width: Width) -> Field {
        Field {
            offset,
            width,
            mask: width.full_mask(),
        }
    }

    pub fn masked(offset: u32, width: Width, mask: u32) -> Field {
        Field {
            offset,
            width,
            mask,
        }
    }

    /// Reads the field at `base` (big-endian, masked); `None` past the frame.
    pub fn read(&self, frame: &[u8], base: usize) -> Option<u32> {
        let start = base.checked_add(self.offset as usize)?;
        let end = start.checked_add(self.width.bytes() as usize)?;
        let bytes = frame.get(start..end)?;
        let v = bytes.iter().fold(0u32, |acc, &b| (acc << 8) | b as u32);
        Some(v & self.mask)
    }
}

/// One boolean comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Atom {
    pub field: Field,
    pub op: Op,
    pub value: u32,
}

/// How a `SHIFT` moves the base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shift {
    /// `SHIFT(c)`: by a constant number of bytes.
    Const(u32),
    /// `SHIFT((offset:bits & mask) << shl)`: by a value loaded from the frame,
    /// e.g. `SHIFT((0:8 & 0x0f) << 2)` past a variable-length IP header.
    Indirect { field: Field, shl: u8 },
}

/// An element of a filter: an atom or a shift.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    Atom(Atom),
    Shift(Shift),
}

/// A DPF filter: the conjunction of its atoms, evaluated left to right with
/// the base moved by each `SHIFT`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Filter {
    pub elems: Vec<Elem>,
}

/// Limits that keep any filter cheap to merge and bounded to run.
pub mod limits {
    /// Largest offset an atom or shift may name (frames are at most 64 KiB).
    pub const MAX_OFFSET: u32 = 0xffff;
    /// Largest value an indirect shift may add (`mask << shl`).
    pub const MAX_INDIRECT_SHIFT: u32 = 0xffff;
    /// Most elements in one filter.
    pub const MAX_ELEMS: usize = 64;
    /// Most indirect shifts (protocol layers) in one filter.
    pub const MAX_INDIRECT_SHIFTS: usize = 8;
}

impl Filter {
    pub fn new() -> Filter {
        Filter::default()
    }

    /// Builder: `offset:bits == value`, and other comparisons.
    pub fn atom(mut self, offset: u32, width: Width, op: Op, value: u32) -> Filter {
        self.elems.push(Elem::Atom(Atom {
            field: Field::new(offset, width),
            op,
            value,
        }));
        self
    }

    /// Builder: `(offset:bits & mask) OP value`.
    pub fn masked(mut self, offset: u32, width: Width, mask: u32, op: Op, value: u32) -> Filter {
        self.elems.push(Elem::Atom(Atom {
            field: Field::masked(offset, width, mask),
            op,
            value,
        }));
        self
    }

    /// Builder: `offset:bits == value`.
    pub fn eq(self, offset: u32, width: Width, value: u32) -> Filter {
        self.atom(offset, width, Op::Eq, value)
    }

    /// Builder: `SHIFT(bytes)`.
    pub fn shift(mut self, bytes: u32) -> Filter {
        self.elems.push(Elem::Shift(Shift::Const(bytes)));
        self
    }

    /// Builder: `SHIFT((offset:bits & mask) << shl)`.
    pub fn shift_by(mut self, offset: u32, width: Width, mask: u32, shl: u8) -> Filter {
        self.elems.push(Elem::Shift(Shift::Indirect {
            field: Field::masked(offset, width, mask),
            shl,
        }));
        self
    }

    /// Appends all elements of `other` (conjunction).
    pub fn and(mut self, other: &Filter) -> Filter {
        self.elems.extend_from_slice(&other.elems);
        self
    }

    pub fn atom_count(&self) -> usize {
        self.elems
            .iter()
            .filter(|e| matches!(e, Elem::Atom(_)))
            .count()
    }

    /// Checks the limits that make a filter safe to install.
    pub fn validate(&self) -> Result<(), DpfError> {
        if self.elems.len() > limits::MAX_ELEMS {
            return Err(DpfError::TooManyElems(self.elems.len()));
        }
        if self.atom_count() == 0 {
            return Err(DpfError::Invalid("a filter needs at least one atom".into()));
        }
        let mut indirect = 0;
        let mut pending: u64 = 0;
        let check_field = |f: &Field, pending: u64| -> Result<(), DpfError> {
            let end = pending + f.offset as u64 + f.width.bytes() as u64;
            if end > limits::MAX_OFFSET as u64 + 1 {
                return Err(DpfError::OffsetTooLarge(end - f.width.bytes() as u64));
            }
            if f.mask == 0 || f.mask & !f.width.full_mask() != 0 {
                return Err(DpfError::Invalid(format!(
                    "mask {:#x} does not fit a {}-bit field or selects no bits",
                    f.mask,
                    f.width.bits()
                )));
            }
            Ok(())
        };
        for e in &self.elems {
            match e {
                Elem::Atom(a) => {
                    check_field(&a.field, pending)?;
                    if a.value & !a.field.width.full_mask() != 0 {
                        return Err(DpfError::Invalid(format!(
                            "constant {:#x} does not fit a {}-bit field",
                            a.value,
                            a.field.width.bits()
                        )));
                    }
                }
                Elem::Shift(Shift::Const(c)) => {
                    pending += *c as u64;
                    if pending > limits::MAX_OFFSET as u64 {
                        return Err(DpfError::OffsetTooLarge(pending));
                    }
                }
                Elem::Shift(Shift::Indirect { field, shl }) => {
                    check_field(field, pending)?;
                    indirect += 1;
                    if indirect > limits::MAX_INDIRECT_SHIFTS {
                        return Err(DpfError::TooManyShifts(indirect));
                    }
                    let max = (field.mask as u64) << (*shl as u64).min(32);
                    if *shl > 16 || max > limits::MAX_INDIRECT_SHIFT as u64 {
                        return Err(DpfError::ShiftOverflow {
                            mask: field.mask,
                            shl: *shl,
                        });
                    }
                    pending = 0;
                }
            }
        }
        Ok(())
    }

    /// Evaluates the filter on a frame directly from its definition: every
    /// atom must be inside the frame and true. This is the specification the
    /// trie interpreter and the JIT are tested against.
    pub fn matches(&self, frame: &[u8]) -> bool {
        let mut base: usize = 0;
        for e in &self.elems {
            match e {
                Elem::Atom(a) => match a.field.read(frame, base) {
                    Some(v) if a.op.eval(v, a.value) => {}
                    _ => return false,
                },
                Elem::Shift(Shift::Const(c)) => base += *c as usize,
                Elem::Shift(Shift::Indirect { field, shl }) => match field.read(frame, base) {
                    Some(v) => base += (v as usize) << *shl,
                    None => return false,
                },
            }
        }
        true
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.mask == self.width.full_mask() {
            write!(f, "{}:{}", self.offset, self.width.bits())
        } else {
            write!(
                f,
                "({}:{} & {:#x})",
                self.offset,
                self.width.bits(),
                self.mask
            )
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {:#x}", self.field, self.op.symbol(), self.value)
    }
}

impl fmt::Display for Shift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shift::Const(c) => write!(f, "SHIFT({c})"),
            Shift::Indirect { field, shl: 0 } => write!(f, "SHIFT({field})"),
            Shift::Indirect { field, shl } => write!(f, "SHIFT({field} << {shl})"),
        }
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Atom(a) => a.fmt(f),
            Elem::Shift(s) => s.fmt(f),
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.elems.iter().enumerate() {
            if i > 0 {
                f.write_str(" & ")?;
            }
            e.fmt(f)?;
        }
        Ok(())
    }
}

impl FromStr for Filter {
    type Err = DpfError;

    fn from_str(s: &str) -> Result<Filter, DpfError> {
        let mut p = Parser::new(s)?;
        let mut filter = Filter::new();
        loop {
            filter.elems.push(p.elem()?);
            if p.eat("&&") || p.eat("&") {
                continue;
            }
            if p.at_end() {
                break;
            }
            return Err(p.error("expected '&' or end of filter"));
        }
        filter.validate()?;
        Ok(filter)
    }
}

/// Tokens of the filter text syntax.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Num(u64),
    Ident(String),
    Punct(&'static str),
}

struct Parser {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    len: usize,
}

const PUNCTS: [&str; 14] = [
    "&&", "==", "!=", "<=", ">=", "<<", "&", "<", ">", "(", ")", ":", "+", ",",
];

impl Parser {
    fn new(s: &str) -> Result<Parser, DpfError> {
        let mut toks = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c.is_ascii_whitespace() {
                i += 1;
            } else if c == b'#' {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            } else if c.is_ascii_digit() {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric()) {
                    i += 1;
                }
                let t = &s[start..i];
                let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    u64::from_str_radix(h, 16)
                } else {
                    t.parse::<u64>()
                }
                .map_err(|_| DpfError::Parse {
                    pos: start,
                    msg: format!("bad number '{t}'"),
                })?;
                toks.push((start, Tok::Num(v)));
            } else if c.is_ascii_alphabetic() {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                toks.push((start, Tok::Ident(s[start..i].to_string())));
            } else if let Some(p) = PUNCTS.iter().find(|p| s[i..].starts_with(**p)) {
                toks.push((i, Tok::Punct(p)));
                i += p.len();
            } else {
                return Err(DpfError::Parse {
                    pos: i,
                    msg: format!("unexpected character '{}'", s[i..].chars().next().unwrap()),
                });
            }
        }
        Ok(Parser {
            toks,
            pos: 0,
            len: s.len(),
        })
    }

    fn at_end(&self) -> bool {
        self.pos >= self.toks.len()
    }

    fn here(&self) -> usize {
        self.toks.get(self.pos).map_or(self.len, |t| t.0)
    }

    fn error(&self, msg: &str) -> DpfError {
        DpfError::Parse {
            pos: self.here(),
            msg: msg.to_string(),
        }
    }

    fn peek(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.pos + k).map(|t| &t.1)
    }

    fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(0), Some(Tok::Punct(q)) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, p: &str) -> Result<(), DpfError> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(self.error(&format!("expected '{p}'")))
        }
    }

    fn num(&mut self, what: &str, max: u64) -> Result<u64, DpfError> {
        match self.peek(0) {
            Some(Tok::Num(v)) => {
                let v = *v;
                if v > max {
                    return Err(self.error(&format!("{what} {v} is larger than {max}")));
                }
                self.pos += 1;
                Ok(v)
            }
            _ => Err(self.error(&format!("expected {what}"))),
        }
    }

    fn is_shift(&self, k: usize) -> bool {
        matches!(self.peek(k), Some(Tok::Ident(s)) if s.eq_ignore_ascii_case("SHIFT"))
    }

    fn elem(&mut self) -> Result<Elem, DpfError> {
        // A parenthesised element: `(SHIFT(..))` or `(atom)`; but `(o:b & m) op c`
        // also starts with '(' so look at what follows.
        if matches!(self.peek(0), Some(Tok::Punct("("))) && self.is_shift(1) {
            self.pos += 1;
            let e = self.elem()?;
            self.expect(")")?;
            return Ok(e);
        }
        if self.is_shift(0) {
            self.pos += 1;
            self.expect("(")?;
            let s = self.shift()?;
            self.expect(")")?;
            return Ok(Elem::Shift(s));
        }
        if matches!(self.peek(0), Some(Tok::Punct("("))) {
            // `( field op const )` or `( o:b & m ) op const`.
            let save = self.pos;
            self.pos += 1;
            if let Ok(field) = self.field() {
                if let Some(op) = self.op() {
                    let value = self.num("constant", u32::MAX as u64)? as u32;
                    self.expect(")")?;
                    return Ok(Elem::Atom(Atom { field, op, value }));
                }
            }
            self.pos = save;
        }
        let field = self.field()?;
        let op = self
            .op()
            .ok_or_else(|| self.error("expected a comparison operator"))?;
        let value = self.num("constant", u32::MAX as u64)? as u32;
        Ok(Elem::Atom(Atom { field, op, value }))
    }

    fn op(&mut self) -> Option<Op> {
        let op = match self.peek(0) {
            Some(Tok::Punct("==")) => Op::Eq,
            Some(Tok::Punct("!=")) => Op::Ne,
            Some(Tok::Punct("<")) => Op::Lt,
            Some(Tok::Punct("<=")) => Op::Le,
            Some(Tok::Punct(">")) => Op::Gt,
            Some(Tok::Punct(">=")) => Op::Ge,
            _ => return None,
        };
        self.pos += 1;
        Some(op)
    }

    /// `offset:bits` or `(offset:bits [& mask])`.
    fn field(&mut self) -> Result<Field, DpfError> {
        let paren = self.eat("(");
        let offset = self.num("offset", limits::MAX_OFFSET as u64)? as u32;
        self.expect(":")?;
        let bits = self.num("width in bits", 64)? as u32;
        let width =
            Width::from_bits(bits).ok_or_else(|| self.error("width must be 8, 16 or 32 bits"))?;
        let mut mask = width.full_mask();
        if paren {
            if self.eat("&") {
                mask = self.num("mask", u32::MAX as u64)? as u32;
            }
            self.expect(")")?;
        }
        Ok(Field {
            offset,
            width,
            mask,
        })
    }

    fn shift(&mut self) -> Result<Shift, DpfError> {
        if let Some(Tok::Num(_)) = self.peek(0) {
            let mut total = self.num("shift", limits::MAX_OFFSET as u64)?;
            while self.eat("+") {
                total += self.num("shift", limits::MAX_OFFSET as u64)?;
                if total > limits::MAX_OFFSET as u64 {
                    return Err(DpfError::OffsetTooLarge(total));
                }
            }
            return Ok(Shift::Const(total as u32));
        }
        let field = self.field()?;
        let shl = if self.eat("<<") {
            self.num("shift amount", 31)? as u8
        } else {
            0
        };
        Ok(Shift::Indirect { field, shl })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIG1: &str = "
        (12:16 == 0x800) &     # IP datagram?
        (SHIFT(6 + 6 + 2)) &   # skip the Ethernet header
        (9:8 == 6) &           # TCP
        (12:32 == 0xc00c4501) & # source 192.12.69.1
        (SHIFT(20)) &
        (0:16 == 1234) &
        (2:16 == 4321)";

    #[test]
    fn parses_figure_1() {
        let f: Filter = FIG1.parse().unwrap();
        assert_eq!(f.elems.len(), 7);
        assert_eq!(f.elems[1], Elem::Shift(Shift::Const(14)));
        let again: Filter = f.to_string().parse().unwrap();
        assert_eq!(f, again);
    }

    #[test]
    fn parses_indirect_shift_and_masks() {
        let f: Filter = "12:16 == 0x800 & SHIFT(14) & SHIFT((0:8 & 0x0f) << 2) & (2:16) >= 1024"
            .parse()
            .unwrap();
        assert_eq!(
            f.elems[2],
            Elem::Shift(Shift::Indirect {
                field: Field::masked(0, Width::U8, 0x0f),
                shl: 2
            })
        );
        assert_eq!(f.to_string().parse::<Filter>().unwrap(), f);
    }

    #[test]
    fn rejects_hostile_filters() {
        for bad in [
            "70000:8 == 1",
            "0:12 == 1",
            "0:8 == 0x100",
            "SHIFT((0:32) << 4) & 0:8 == 1",
            "(0:8 & 0) == 0",
            "SHIFT(60000) & SHIFT(6000) & 0:8 == 1",
            "SHIFT(14)",
            "0:8 = 1",
            "0:8 == 1 &",
        ] {
            assert!(bad.parse::<Filter>().is_err(), "{bad} accepted");
        }
        let long = vec!["0:8 == 1"; 65].join(" & ");
        assert!(matches!(
            long.parse::<Filter>(),
            Err(DpfError::TooManyElems(65))
        ));
    }

    #[test]
    fn matches_reads_big_endian_and_respects_bounds() {
        let f = Filter::new().eq(0, Width::U16, 0x0102);
        assert!(f.matches(&[1, 2]));
        assert!(!f.matches(&[1]));
        let g = Filter::new()
            .shift_by(0, Width::U8, 0x0f, 2)
            .eq(0, Width::U8, 9);
        let mut frame = [0u8; 9];
        frame[0] = 2;
        frame[8] = 9;
        assert!(g.matches(&frame));
        assert!(!g.matches(&frame[..8]));
    }
}
