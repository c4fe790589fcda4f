//! Dynamic ILP: pipes and pipe lists (§2.2).
//!
//! A [`Pipe`] is straight-line code in a small register language (in the
//! spirit of VCODE) run on every word of a message as it is copied: a
//! checksum accumulates, a byte swap or a cipher rewrites. A [`PipeList`]
//! composes any pipes at run time, in order, converting between their
//! gauges; [`PipeList::compile`] turns it into ONE copying loop (Cranelift)
//! that runs every pipe on each word in registers, and
//! [`PipeList::interpret`] runs the same semantics word by word (the
//! reference). Both implement [`crate::Transfer`].
//!
//! # Semantics
//!
//! The stream is cut into 64-bit little-endian words. Every pipe runs on
//! each word in list order: once on the whole word if it is commutative or
//! 64 bits wide, else once per lane of its gauge (lowest address first), the
//! lanes of its output put back where they came from, so gauges convert by
//! splitting and aggregating words. Registers are 64 bits; `Input` gives
//! the lane zero-extended, the output is truncated to the lane.
//!
//! The last `len % 8` bytes (the tail) run through each pipe in turn:
//! - a non-modifying pipe sees them zero-padded: a commutative one as one
//!   64-bit word, others as the lanes the bytes touch (RFC 1071 pads an odd
//!   byte with zero the same way);
//! - a modifying pipe runs on the tail's whole lanes of its own gauge (a
//!   commutative one too: it cannot be widened over bytes that are not
//!   there) and leaves a partial lane unchanged.
//!
//! So a transfer split into parts at multiples of 8 bytes computes exactly
//! what one transfer does (registers and bytes); the Internet checksum
//! ([`builtins::checksum`]) only needs parts of even length.
//!
//! A transfer's cost ([`crate::Transfer::cost`], §3.3) is
//! [`TRANSFER_BASE_COST`] plus [`PipeList::word_cost`] (the pipes'
//! instructions times the lanes they run on, plus 4 for the load, the
//! store and the loop) per started 64-bit word.
//!
//! ```
//! use exonet_ash::pipe::{builtins, PipeList};
//! use exonet_ash::Transfer;
//!
//! // Figure 1: a checksum pipe and a byte swap pipe, compiled together.
//! let pl = PipeList::new(vec![builtins::checksum(), builtins::byte_swap32()]).unwrap();
//! let mut ilp = pl.compile().unwrap();
//! let src = [1u8, 2, 3, 4, 5, 6, 7, 8];
//! let mut dst = [0u8; 8];
//! ilp.transfer(&src, &mut dst);
//! assert_eq!(dst, [4, 3, 2, 1, 8, 7, 6, 5]);
//! let acc = ilp.reg(0, 0).unwrap();
//! assert_eq!(builtins::fold_checksum(acc), !0x1014u16); // 0x0102 + 0x0304 + ...
//! ```

pub mod builtins;
mod interp;
mod jit;
mod lang;

pub use lang::{
    BinOp, Gauge, Insn, Pipe, PipeError, Reg, ShiftOp, MAX_INSNS, MAX_PERSISTENT, MAX_PIPES,
    MAX_TEMPS, MAX_WORD_COST,
};

use crate::Transfer;

/// The fixed part of a transfer's cost: the call, the setup of the loop
/// and the tail.
pub const TRANSFER_BASE_COST: u64 = 16;

/// A validated composition of pipes, run in order on every word. The empty
/// list is the NULL pipe list: a plain copy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PipeList {
    pipes: Vec<Pipe>,
}

impl PipeList {
    /// Validates the pipes: register numbers, temporaries set before they
    /// are read, one output per modifying pipe, gauges, and the limits.
    pub fn new(pipes: Vec<Pipe>) -> Result<PipeList, PipeError> {
        if pipes.len() > MAX_PIPES {
            return Err(PipeError::TooManyPipes(pipes.len()));
        }
        for (i, p) in pipes.iter().enumerate() {
            p.validate(i)?;
        }
        let cost = jit::word_cost(&pipes);
        if cost > MAX_WORD_COST {
            return Err(PipeError::TooCostly { cost });
        }
        Ok(PipeList { pipes })
    }

    /// The NULL pipe list: a plain copy.
    pub fn null() -> PipeList {
        PipeList::default()
    }

    pub fn pipes(&self) -> &[Pipe] {
        &self.pipes
    }

    /// The bytes an application sends to the multiplexer.
    pub fn encode(&self) -> Vec<u8> {
        lang::encode(&self.pipes)
    }

    /// Decodes and validates bytes from an untrusted application: a clear
    /// error for anything malformed, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<PipeList, PipeError> {
        PipeList::new(lang::decode(bytes)?)
    }

    /// Instructions the loop runs per 64-bit word (§3.3's static cost).
    pub fn word_cost(&self) -> u64 {
        jit::word_cost(&self.pipes)
    }

    /// Compiles the list into one copying loop.
    pub fn compile(&self) -> Result<Compiled, PipeError> {
        Ok(Compiled {
            code: jit::compile(&self.pipes, None)?,
            state: State::new(self),
        })
    }

    /// The reference execution of the list.
    pub fn interpret(&self) -> Interpreted {
        Interpreted {
            state: State::new(self),
        }
    }

    /// The generated loop's Cranelift IR and machine code, for inspection.
    pub fn listing(&self) -> Result<String, PipeError> {
        let mut s = String::new();
        jit::compile(&self.pipes, Some(&mut s))?;
        Ok(s)
    }
}

/// The pipes and their persistent registers, in one flat array.
struct State {
    pipes: Vec<Pipe>,
    bases: Vec<usize>,
    regs: Vec<u64>,
    word_cost: u64,
}

impl State {
    fn new(pl: &PipeList) -> State {
        State {
            bases: interp::reg_bases(&pl.pipes),
            regs: pl
                .pipes
                .iter()
                .flat_map(|p| p.persistent.iter().copied())
                .collect(),
            word_cost: pl.word_cost(),
            pipes: pl.pipes.clone(),
        }
    }

    fn slot(&self, pipe: usize, reg: usize) -> Option<usize> {
        let p = self.pipes.get(pipe)?;
        (reg < p.persistent.len()).then(|| self.bases[pipe] + reg)
    }

    fn tail(&mut self, bytes: &mut [u8]) {
        interp::tail(&self.pipes, &self.bases, &mut self.regs, bytes);
    }

    fn cost(&self, n: usize) -> u64 {
        TRANSFER_BASE_COST + self.word_cost * (n as u64).div_ceil(8)
    }
}

macro_rules! registers {
    () => {
        fn reg(&self, pipe: usize, reg: usize) -> Option<u64> {
            self.state.slot(pipe, reg).map(|i| self.state.regs[i])
        }

        fn set_reg(&mut self, pipe: usize, reg: usize, value: u64) -> bool {
            match self.state.slot(pipe, reg) {
                Some(i) => {
                    self.state.regs[i] = value;
                    true
                }
                None => false,
            }
        }

        fn cost(&self, n: usize) -> u64 {
            self.state.cost(n)
        }
    };
}

/// A pipe list compiled into one loop.
pub struct Compiled {
    state: State,
    code: jit::Code,
}

impl Compiled {
    /// Transfers `len` bytes from `src` to `dst` through the pipes.
    ///
    /// # Safety
    /// `src` must be valid for reading and `dst` for writing `len` bytes
    /// for the whole call, and they must be the same address or not
    /// overlap. Concurrent writers of `src` only make the result
    /// unspecified (each word is read once).
    pub unsafe fn transfer_raw(&mut self, src: *const u8, dst: *mut u8, len: usize) {
        if self.state.pipes.is_empty() {
            // SAFETY: the caller's contract; `copy` allows src == dst.
            unsafe { std::ptr::copy(src, dst, len) };
            return;
        }
        let words = len / 8;
        let mut done = 0;
        while done < words {
            // Split at word boundaries, which changes nothing (see interp).
            let n = (words - done).min(jit::MAX_CALL_WORDS);
            // SAFETY: the loop reads and writes `8 * n` bytes from word
            // `done` on, within the caller's `len`; `regs` holds every
            // persistent register the code loads and stores.
            unsafe {
                (self.code.copy)(
                    src.add(8 * done),
                    dst.add(8 * done),
                    n,
                    self.state.regs.as_mut_ptr(),
                )
            };
            done += n;
        }
        let r = len % 8;
        if r > 0 {
            let mut buf = [0u8; 8];
            // SAFETY: the last `r` bytes of the caller's buffers.
            unsafe { std::ptr::copy(src.add(8 * words), buf.as_mut_ptr(), r) };
            self.state.tail(&mut buf[..r]);
            // SAFETY: as above.
            unsafe { std::ptr::copy(buf.as_ptr(), dst.add(8 * words), r) };
        }
    }

    /// Runs the pipes over `src` without writing anything: the pipes'
    /// registers see the data (e.g. a checksum over bytes no one copies).
    pub fn scan(&mut self, src: &[u8]) {
        let words = src.len() / 8;
        if !self.state.pipes.is_empty() {
            for chunk in src[..8 * words].chunks(8 * jit::MAX_CALL_WORDS) {
                // SAFETY: the scan loop only reads the chunk's words (its
                // destination pointer is never used).
                unsafe {
                    (self.code.scan)(
                        chunk.as_ptr(),
                        std::ptr::null_mut(),
                        chunk.len() / 8,
                        self.state.regs.as_mut_ptr(),
                    )
                };
            }
        }
        let mut buf = [0u8; 8];
        let rest = &src[8 * words..];
        buf[..rest.len()].copy_from_slice(rest);
        self.state.tail(&mut buf[..rest.len()]);
    }

    /// All persistent registers, pipe by pipe.
    pub fn regs(&self) -> &[u64] {
        &self.state.regs
    }

    /// Bytes of machine code generated (the copy and the scan loop).
    pub fn code_size(&self) -> usize {
        self.code.size
    }
}

impl Transfer for Compiled {
    /// Transfers `min(src.len(), dst.len())` bytes.
    fn transfer(&mut self, src: &[u8], dst: &mut [u8]) {
        let n = src.len().min(dst.len());
        // SAFETY: both slices are valid for `n` bytes and, one shared and
        // one exclusive borrow, cannot overlap.
        unsafe { self.transfer_raw(src.as_ptr(), dst.as_mut_ptr(), n) }
    }

    registers!();
}

/// A pipe list run by the interpreter (the reference semantics).
pub struct Interpreted {
    state: State,
}

impl Interpreted {
    /// As [`Compiled::scan`].
    pub fn scan(&mut self, src: &[u8]) {
        let mut buf = vec![0u8; src.len()];
        self.transfer(src, &mut buf);
    }

    /// All persistent registers, pipe by pipe.
    pub fn regs(&self) -> &[u64] {
        &self.state.regs
    }
}

impl Transfer for Interpreted {
    /// Transfers `min(src.len(), dst.len())` bytes.
    fn transfer(&mut self, src: &[u8], dst: &mut [u8]) {
        let n = src.len().min(dst.len());
        let (src, dst) = (&src[..n], &mut dst[..n]);
        let s = &mut self.state;
        let mut words = src.chunks_exact(8);
        let mut outs = dst.chunks_exact_mut(8);
        for (i, o) in (&mut words).zip(&mut outs) {
            let mut w = [0u8; 8];
            w.copy_from_slice(i);
            let w = interp::word(&s.pipes, &s.bases, &mut s.regs, u64::from_le_bytes(w));
            o.copy_from_slice(&w.to_le_bytes());
        }
        let rest = outs.into_remainder();
        rest.copy_from_slice(words.remainder());
        s.tail(rest);
    }

    registers!();
}
