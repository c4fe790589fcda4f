//! DPF: fast, flexible message demultiplexing with dynamic code generation
//! (Engler and Kaashoek, SIGCOMM 1996).
//!
//! Filters ([`Filter`]) are canonicalized ([`canon`]), merged into one trie
//! ([`trie`]) along their longest common prefix, with atoms that compare the
//! same field to different constants merged into disjunction nodes. The trie
//! is run by a reference interpreter or compiled by Cranelift into a single
//! native function (the `jit` module).
//!
//! When several filters accept a frame, the one with the highest priority
//! wins (by default a filter's priority is its number of atoms, so the most
//! specific filter wins: a connected socket over a listening one); ties go
//! to the lowest filter id.

pub mod canon;
pub mod filter;
mod phash;
pub mod tcpdump;
pub mod trie;

mod jit;

use std::fmt;

pub use filter::{Atom, Elem, Field, Filter, Op, Shift, Width};

/// Names an installed filter (one or more conjunctions that share a result).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FilterId(pub u32);

impl fmt::Display for FilterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Why a filter was refused, or could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DpfError {
    Parse { pos: usize, msg: String },
    Invalid(String),
    OffsetTooLarge(u64),
    ShiftOverflow { mask: u32, shl: u8 },
    TooManyElems(usize),
    TooManyShifts(usize),
    TooManyFilters(usize),
    NoSuchFilter(FilterId),
    Unsupported(String),
}

impl fmt::Display for DpfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DpfError::Parse { pos, msg } => write!(f, "parse error at {pos}: {msg}"),
            DpfError::Invalid(m) => write!(f, "invalid filter: {m}"),
            DpfError::OffsetTooLarge(o) => write!(
                f,
                "offset {o} is past the largest frame ({})",
                filter::limits::MAX_OFFSET
            ),
            DpfError::ShiftOverflow { mask, shl } => write!(
                f,
                "indirect shift ({mask:#x} << {shl}) may move the base by more than {}",
                filter::limits::MAX_INDIRECT_SHIFT
            ),
            DpfError::TooManyElems(n) => write!(
                f,
                "filter has {n} elements, more than {}",
                filter::limits::MAX_ELEMS
            ),
            DpfError::TooManyShifts(n) => write!(
                f,
                "filter has {n} indirect shifts, more than {}",
                filter::limits::MAX_INDIRECT_SHIFTS
            ),
            DpfError::TooManyFilters(n) => write!(f, "too many filters installed ({n})"),
            DpfError::NoSuchFilter(id) => write!(f, "no filter {id}"),
            DpfError::Unsupported(m) => write!(f, "unsupported: {m}"),
        }
    }
}

impl std::error::Error for DpfError {}

/// Which engine [`Dpf::demux`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The trie compiled to native code with Cranelift.
    Jit,
    /// The reference interpreter walking the trie.
    Interp,
}

pub use trie::Dpf;
