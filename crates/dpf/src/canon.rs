//! Canonical form: the paper's rewriting so that filters that mean the same
//! thing look the same and merge in the trie (DPF §2, §6).
//!
//! - Constant `SHIFT`s disappear: their amount is added to the offsets that
//!   follow ("DPF eliminates constant SHIFT operations by adding its operand
//!   to the message offset of subsequent atoms", §3.3). What remains is a
//!   sequence of *regions*, each ending with an indirect shift.
//! - A mask whose leading bytes are zero becomes a narrower load at a higher
//!   offset that ends where the original did (`(12:32 & 0xffff) == 80` is
//!   `14:16 == 80`), so the frame length a filter needs does not change.
//! - `<= c` becomes `< c+1` and `>= c` becomes `> c-1`.
//! - Within a region, atoms are sorted (offset, width, mask, operator,
//!   constant) and duplicates removed: a conjunction is order-free and an
//!   atom outside the frame rejects the whole filter wherever it stands.

use std::fmt;

use crate::filter::{Atom, Elem, Field, Filter, Op, Shift, Width};
use crate::DpfError;

/// A field relative to the base of its region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CField {
    pub off: u32,
    pub width: Width,
    pub mask: u32,
}

impl CField {
    /// Bytes past the region base this field needs in the frame.
    pub fn end(&self) -> u32 {
        self.off + self.width.bytes()
    }

    /// Reads the field (big-endian, masked) at `base`, or `None` past `frame`.
    pub fn read(&self, frame: &[u8], base: usize) -> Option<u32> {
        Field::masked(self.off, self.width, self.mask).read(frame, base)
    }

    fn canonical(off: u32, width: Width, mask: u32, value: Option<u32>) -> CField {
        let mut f = CField { off, width, mask };
        // Drop zero leading bytes: the load still ends at the same byte.
        loop {
            let narrower = match f.width {
                Width::U32 if f.mask <= 0xffff => Width::U16,
                Width::U16 if f.mask <= 0xff => Width::U8,
                _ => break,
            };
            if value.is_some_and(|v| v > narrower.full_mask()) {
                break;
            }
            f.off += f.width.bytes() - narrower.bytes();
            f.width = narrower;
        }
        f
    }
}

/// A canonical atom: `(field) op value` with `op` one of `==, !=, <, >`
/// (`<=`/`>=` are rewritten unless the constant is at its bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CAtom {
    pub field: CField,
    pub op: Op,
    pub value: u32,
}

impl CAtom {
    pub fn eval(&self, frame: &[u8], base: usize) -> Option<bool> {
        self.field
            .read(frame, base)
            .map(|v| self.op.eval(v, self.value))
    }
}

/// An indirect shift: `base += add + ((field & mask) << shl)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CShift {
    pub add: u32,
    pub field: CField,
    pub shl: u8,
}

impl CShift {
    /// The new base, or `None` if the field is outside the frame or the new
    /// base is past its end.
    pub fn apply(&self, frame: &[u8], base: usize) -> Option<usize> {
        let v = self.field.read(frame, base)? as usize;
        let nb = base + self.add as usize + (v << self.shl);
        (nb <= frame.len()).then_some(nb)
    }
}

/// One step along a trie path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    Test(CAtom),
    Shift(CShift),
}

/// A filter in canonical form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Canon {
    pub steps: Vec<Step>,
}

impl Canon {
    pub fn atom_count(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Test(_)))
            .count()
    }

    /// Evaluates the canonical filter directly (used to test canonicalization).
    pub fn matches(&self, frame: &[u8]) -> bool {
        let mut base = 0usize;
        for s in &self.steps {
            match s {
                Step::Test(a) => {
                    if a.eval(frame, base) != Some(true) {
                        return false;
                    }
                }
                Step::Shift(sh) => match sh.apply(frame, base) {
                    Some(b) => base = b,
                    None => return false,
                },
            }
        }
        true
    }
}

/// Rewrites a (validated) filter into canonical form.
pub fn canonicalize(f: &Filter) -> Result<Canon, DpfError> {
    f.validate()?;
    let mut steps = Vec::with_capacity(f.elems.len());
    let mut region: Vec<CAtom> = Vec::new();
    let mut pending = 0u32;
    let flush = |region: &mut Vec<CAtom>, steps: &mut Vec<Step>| {
        region.sort();
        region.dedup();
        steps.extend(region.drain(..).map(Step::Test));
    };
    for e in &f.elems {
        match *e {
            Elem::Atom(a) => region.push(canonical_atom(a, pending)),
            Elem::Shift(Shift::Const(c)) => pending += c,
            Elem::Shift(Shift::Indirect { field, shl }) => {
                flush(&mut region, &mut steps);
                let cf = CField::canonical(pending + field.offset, field.width, field.mask, None);
                steps.push(Step::Shift(CShift {
                    add: pending,
                    field: cf,
                    shl,
                }));
                pending = 0;
            }
        }
    }
    flush(&mut region, &mut steps);
    Ok(Canon { steps })
}

fn canonical_atom(a: Atom, pending: u32) -> CAtom {
    let (op, value) = match a.op {
        Op::Le if a.value < a.field.mask => (Op::Lt, a.value + 1),
        Op::Ge if a.value > 0 => (Op::Gt, a.value - 1),
        op => (op, a.value),
    };
    let field = CField::canonical(
        pending + a.field.offset,
        a.field.width,
        a.field.mask,
        Some(value),
    );
    CAtom { field, op, value }
}

impl fmt::Display for CField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Field::masked(self.off, self.width, self.mask).fmt(f)
    }
}

impl fmt::Display for CAtom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {:#x}", self.field, self.op.symbol(), self.value)
    }
}

impl fmt::Display for CShift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SHIFT(")?;
        if self.add > 0 {
            write!(f, "{} + ", self.add)?;
        }
        if self.shl > 0 {
            write!(f, "{} << {})", self.field, self.shl)
        } else {
            write!(f, "{})", self.field)
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Test(a) => a.fmt(f),
            Step::Shift(s) => s.fmt(f),
        }
    }
}

impl fmt::Display for Canon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str(" & ")?;
            }
            s.fmt(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> Canon {
        canonicalize(&s.parse().unwrap()).unwrap()
    }

    #[test]
    fn structurally_different_filters_become_equal() {
        let a = canon(
            "12:16 == 0x800 & SHIFT(6 + 6 + 2) & 9:8 == 6 & SHIFT((0:8 & 0xf) << 2) & 2:16 == 80",
        );
        let b = canon(
            "(10:32 & 0x0000ffff) == 0x0800 & SHIFT(14) & 9:8 == 6 & SHIFT(0) & SHIFT((0:8 & 0xf) << 2) & (0:32 & 0xffff) <= 80 & 2:16 >= 80 & 2:16 == 80",
        );
        assert_eq!(a.steps[0].to_string(), "12:16 == 0x800");
        assert_eq!(a.steps[1].to_string(), "23:8 == 0x6");
        assert_eq!(a.steps[2].to_string(), "SHIFT(14 + (14:8 & 0xf) << 2)");
        // b differs only by the extra range atoms
        assert_eq!(b.steps[..3], a.steps[..3]);
        assert_eq!(b.steps[3].to_string(), "2:16 == 0x50");
        assert_eq!(b.steps[4].to_string(), "2:16 < 0x51");
        assert_eq!(b.steps[5].to_string(), "2:16 > 0x4f");
    }

    #[test]
    fn narrowing_keeps_the_end_of_the_load() {
        let c = canon("(10:32 & 0xffff) == 0x1234");
        assert_eq!(c.steps[0].to_string(), "12:16 == 0x1234");
        // trailing zero bytes stay: the frame must still hold byte 13
        let c = canon("(10:32 & 0xffff0000) == 0x12340000");
        assert_eq!(c.steps[0].to_string(), "(10:32 & 0xffff0000) == 0x12340000");
    }
}
