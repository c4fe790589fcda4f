//! A pipe list compiled with Cranelift into one data-copying loop (§2.2):
//! load a word from the source, run every pipe on it in registers, store it
//! to the destination, next word. Persistent registers live in SSA
//! variables during the loop (loaded before it, stored after it), lanes of
//! narrow pipes are shifts and masks on the word in a register, and the
//! loop is unrolled when the body is small. Two rewrites keep it as tight
//! as a hand-written loop, exactly (the property tests compare registers
//! and bytes with the interpreter):
//! - an *accumulator*, a persistent register that is only ever updated by
//!   `p = p +' x` (end-around carry), is kept as a 128-bit sum during the
//!   loop (`add; adc`: one cycle per word on the critical path instead of
//!   an add, a carry test and another add) and folded once at the exit.
//!   The end-around-carry sum of a sequence depends only on its integer
//!   sum S: 0 if S is 0, else the value in 1..=2^64-1 congruent to S
//!   modulo 2^64-1, which is `lo +' hi` of S's two halves;
//! - a *lane-wise* pipe, one without persistent registers whose output is
//!   its input or the byte swap of it at its own gauge, runs on all lanes
//!   of the word at once (a 32-bit byte swap is `bswap; rol 32`).
//!
//! When every pipe of the list is lane-wise, has no effect at all, or only
//! accumulates its (whole-word) input with end-around carry (the checksum),
//! a vector loop first runs 16 words at a time in 128-bit registers: a
//! byte shuffle for the swaps, and for each accumulator the words and
//! their high 32-bit halves summed in 64-bit lanes, which gives the integer
//! sum S exactly (the low halves' sum is the words' wrapped sum minus the
//! high halves' sum shifted by 32, and the caller keeps each call under
//! [`MAX_CALL_WORDS`], so that neither overflows); the scalar loop finishes
//! the last words.
//!
//! The tail (fewer than 8 bytes)
//! is left to the interpreter's [`super::interp::tail`], so both executions
//! share its rules.

use std::sync::OnceLock;

use cranelift_codegen::ir::{types, AbiParam, Endianness, InstBuilder, MemFlagsData, Value};
use cranelift_codegen::isa::{OwnedTargetIsa, TargetFrontendConfig};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::Module;

use super::lang::{BinOp, Gauge, Insn, Pipe, PipeError, Reg, ShiftOp, MAX_TEMPS};

/// `fn(src, dst, words, regs)`: runs `words` 64-bit words from `src` to
/// `dst` (not written by the scan variant) with the persistent registers at
/// `regs`. `words` must be at most [`MAX_CALL_WORDS`].
type LoopFn = unsafe extern "C" fn(*const u8, *mut u8, usize, *mut u64);

/// Most words per call: the vector loop's lanes sum the high and (in
/// effect) the low 32-bit halves of the words in 64 bits; 2^31 words give
/// each lane fewer than 2^30 additions of values under 2^32.
pub(crate) const MAX_CALL_WORDS: usize = 1 << 31;

/// The generated code of one pipe list.
pub(crate) struct Code {
    module: Option<JITModule>,
    pub(crate) copy: LoopFn,
    pub(crate) scan: LoopFn,
    pub(crate) size: usize,
}

// SAFETY: the module owns the code and the function pointers point into it;
// nothing in the generated code refers to thread-local state, so the code
// may run on and be dropped from any thread.
unsafe impl Send for Code {}

impl Drop for Code {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: `copy` and `scan` point into this module's memory and
            // are dropped with `self`; nobody else holds them.
            unsafe { m.free_memory() };
        }
    }
}

fn isa() -> Result<OwnedTargetIsa, PipeError> {
    static ISA: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut fb = settings::builder();
        fb.set("opt_level", "speed").map_err(|e| e.to_string())?;
        cranelift_native::builder()
            .map_err(|e| e.to_string())?
            .finish(settings::Flags::new(fb))
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(PipeError::Compile)
}

/// Compiles the pipes; with `listing`, appends their CLIF and machine code.
pub(crate) fn compile(pipes: &[Pipe], mut listing: Option<&mut String>) -> Result<Code, PipeError> {
    let mut module = JITModule::new(JITBuilder::with_isa(
        isa()?,
        cranelift_module::default_libcall_names(),
    ));
    let mut ctx = module.make_context();
    ctx.set_disasm(listing.is_some());
    let mut fctx = FunctionBuilderContext::new();
    let mut ids = [None, None];
    let mut size = 0;
    for (k, store) in [true, false].into_iter().enumerate() {
        let ptr = module.target_config().pointer_type();
        ctx.func.signature.params = vec![AbiParam::new(ptr); 4];
        generate(
            FunctionBuilder::new(&mut ctx.func, &mut fctx),
            pipes,
            store,
            module.isa().frontend_config(),
        );
        if let Some(l) = listing.as_deref_mut() {
            l.push_str(&ctx.func.display().to_string());
        }
        let id = module
            .declare_anonymous_function(&ctx.func.signature)
            .map_err(|e| PipeError::Compile(e.to_string()))?;
        module
            .define_function(id, &mut ctx)
            .map_err(|e| PipeError::Compile(format!("{e:?}")))?;
        if let Some(code) = ctx.compiled_code() {
            size += code.code_info().total_size as usize;
            if let (Some(l), Some(v)) = (listing.as_deref_mut(), &code.vcode) {
                l.push_str(v);
            }
        }
        module.clear_context(&mut ctx);
        ids[k] = Some(id);
    }
    module
        .finalize_definitions()
        .map_err(|e| PipeError::Compile(e.to_string()))?;
    let (Some(copy), Some(scan)) = (ids[0], ids[1]) else {
        return Err(PipeError::Compile("a loop was not generated".into()));
    };
    // SAFETY: both functions were declared with four pointer-sized
    // parameters and no result in the host's default calling convention,
    // which is `LoopFn`'s `extern "C"`.
    let (copy, scan) = unsafe {
        (
            std::mem::transmute::<*const u8, LoopFn>(module.get_finalized_function(copy)),
            std::mem::transmute::<*const u8, LoopFn>(module.get_finalized_function(scan)),
        )
    };
    Ok(Code {
        module: Some(module),
        copy,
        scan,
        size,
    })
}

/// Static instructions per word, as [`super::Compiled::cost`] charges them.
pub(crate) fn word_cost(pipes: &[Pipe]) -> u64 {
    // The load, the store and the loop's pointer and counter updates.
    4 + pipes
        .iter()
        .map(|p| p.code.len() as u64 * u64::from(p.lanes()))
        .sum::<u64>()
}

fn mem() -> MemFlagsData {
    // The caller passes valid buffers of `8 * words` bytes; words are
    // little-endian whatever the host.
    MemFlagsData::new()
        .with_notrap()
        .with_endianness(Endianness::Little)
}

fn generate(mut b: FunctionBuilder<'_>, pipes: &[Pipe], store: bool, config: TargetFrontendConfig) {
    let i64t = types::I64;
    // Unroll while the body stays small enough for the instruction cache.
    let unroll: u32 = match word_cost(pipes) {
        0..=48 => 4,
        49..=192 => 2,
        _ => 1,
    };
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    let (src0, dst0, words, regs) = (params[0], params[1], params[2], params[3]);
    let mut vars: Vec<PipeVars> = Vec::with_capacity(pipes.len());
    let mut off = 0i32;
    for p in pipes {
        let wide = accumulators(p);
        let mut v = Vec::with_capacity(p.persistent.len());
        for &w in &wide {
            let x = b.ins().load(i64t, MemFlagsData::trusted(), regs, off);
            let var = if w {
                let var = b.declare_var(types::I128);
                let x = b.ins().uextend(types::I128, x);
                b.def_var(var, x);
                var
            } else {
                let var = b.declare_var(i64t);
                b.def_var(var, x);
                var
            };
            v.push(var);
            off += 8;
        }
        vars.push(PipeVars {
            vars: v,
            wide,
            lanewise: lanewise(p),
        });
    }
    let src = b.declare_var(i64t);
    let dst = b.declare_var(i64t);
    let count = b.declare_var(i64t);
    b.def_var(src, src0);
    b.def_var(dst, dst0);
    let words = match vector_plan(pipes) {
        Some(plan) if cfg!(target_endian = "little") => {
            gen_vector_loop(&mut b, &plan, &vars, store, words, (src, dst, count))
        }
        _ => words,
    };
    let big = b
        .ins()
        .ushr_imm_u(words, i64::from(unroll.trailing_zeros()));
    b.def_var(count, big);
    let rem = b.ins().band_imm_u(words, i64::from(unroll - 1));

    let big_head = b.create_block();
    let big_body = b.create_block();
    let small_start = b.create_block();
    let small_head = b.create_block();
    let small_body = b.create_block();
    let exit = b.create_block();

    b.ins().jump(big_head, &[]);
    for (head, body, next, step) in [
        (big_head, big_body, small_start, unroll),
        (small_head, small_body, exit, 1),
    ] {
        b.switch_to_block(head);
        let c = b.use_var(count);
        b.ins().brif(c, body, &[], next, &[]);
        b.switch_to_block(body);
        let s = b.use_var(src);
        let d = b.use_var(dst);
        for u in 0..step {
            let o = 8 * u as i32;
            let w = b.ins().load(i64t, mem(), s, o);
            let w = gen_word(&mut b, pipes, &vars, w);
            if store {
                b.ins().store(mem(), w, d, o);
            }
        }
        let s = b.ins().iadd_imm_s(s, 8 * i64::from(step));
        b.def_var(src, s);
        let d = b.ins().iadd_imm_s(d, 8 * i64::from(step));
        b.def_var(dst, d);
        let c = b.use_var(count);
        let c = b.ins().iadd_imm_s(c, -1);
        b.def_var(count, c);
        b.ins().jump(head, &[]);
        if next == small_start {
            b.switch_to_block(small_start);
            b.def_var(count, rem);
            b.ins().jump(small_head, &[]);
        }
    }
    b.switch_to_block(exit);
    let mut off = 0i32;
    for v in &vars {
        for (&var, &w) in v.vars.iter().zip(&v.wide) {
            let x = b.use_var(var);
            let x = if w {
                let (lo, hi) = b.ins().isplit(x);
                add_carry(&mut b, lo, hi)
            } else {
                x
            };
            b.ins().store(MemFlagsData::trusted(), x, regs, off);
            off += 8;
        }
    }
    b.ins().return_(&[]);
    b.seal_all_blocks();
    b.finalize(config);
}

/// One word through every pipe; returns the word to store.
fn gen_word(b: &mut FunctionBuilder<'_>, pipes: &[Pipe], vars: &[PipeVars], w: Value) -> Value {
    let mut w = w;
    for (p, v) in pipes.iter().zip(vars) {
        let lanes = p.lanes();
        match v.lanewise {
            Some(Lanewise::Identity) => continue,
            Some(Lanewise::ByteSwap) => {
                w = lanes_bswap(b, p.input, w);
                continue;
            }
            None => {}
        }
        if lanes == 1 {
            w = gen_pipe(b, p, v, w);
            continue;
        }
        let bits = p.input.bits();
        let mask = p.input.mask() as i64;
        let mut out: Option<Value> = None;
        for l in 0..lanes {
            let sh = i64::from(l * bits);
            let x = match l {
                0 => b.ins().band_imm_u(w, mask),
                _ if l == lanes - 1 => b.ins().ushr_imm_u(w, sh),
                _ => {
                    let x = b.ins().ushr_imm_u(w, sh);
                    b.ins().band_imm_u(x, mask)
                }
            };
            let o = gen_pipe(b, p, v, x);
            if p.non_modifying {
                continue;
            }
            // The top lane's shift drops the bits above the gauge.
            let o = if l == lanes - 1 {
                b.ins().ishl_imm_u(o, sh)
            } else {
                let o = b.ins().band_imm_u(o, mask);
                b.ins().ishl_imm_u(o, sh)
            };
            out = Some(match out {
                Some(acc) => b.ins().bor(acc, o),
                None => o,
            });
        }
        if let Some(o) = out {
            w = o;
        }
    }
    w
}

/// One invocation of `pipe` on `input`; returns its output (the input if
/// it is non-modifying), which the caller truncates to the lane.
fn gen_pipe(b: &mut FunctionBuilder<'_>, pipe: &Pipe, pv: &PipeVars, input: Value) -> Value {
    let i64t = types::I64;
    let vars = &pv.vars;
    // Validation guarantees every temporary is set before it is read, so
    // this initial value is never used.
    let mut temps = [input; MAX_TEMPS];
    let mut output = input;
    let read = |b: &mut FunctionBuilder<'_>, temps: &[Value; MAX_TEMPS], r: Reg| match r {
        Reg::Temp(t) => temps[t as usize],
        Reg::Persistent(q) => b.use_var(vars[q as usize]),
    };
    for insn in &pipe.code {
        let v = match *insn {
            Insn::Bin {
                op: BinOp::AddCarry,
                dst: Reg::Persistent(q),
                a,
                b: c,
            } if pv.wide[q as usize] => {
                // `accumulators` made sure the other operand is not `q`.
                let x = if a == Reg::Persistent(q) { c } else { a };
                let x = read(b, &temps, x);
                let x = b.ins().uextend(types::I128, x);
                let acc = b.use_var(vars[q as usize]);
                let sum = b.ins().iadd(acc, x);
                b.def_var(vars[q as usize], sum);
                continue;
            }
            Insn::Input { .. } => input,
            Insn::Output { src } => {
                output = read(b, &temps, src);
                continue;
            }
            Insn::Imm { value, .. } => b.ins().iconst(i64t, value as i64),
            Insn::Mov { src, .. } => read(b, &temps, src),
            Insn::Not { src, .. } => {
                let x = read(b, &temps, src);
                b.ins().bnot(x)
            }
            Insn::Bswap { src, width, .. } => {
                let x = read(b, &temps, src);
                match width {
                    Gauge::G16 | Gauge::G32 => {
                        let t = if width == Gauge::G16 {
                            types::I16
                        } else {
                            types::I32
                        };
                        let n = b.ins().ireduce(t, x);
                        let n = b.ins().bswap(n);
                        b.ins().uextend(i64t, n)
                    }
                    _ => b.ins().bswap(x),
                }
            }
            Insn::Bin { op, a, b: c, .. } => {
                let x = read(b, &temps, a);
                let y = read(b, &temps, c);
                match op {
                    BinOp::Add => b.ins().iadd(x, y),
                    BinOp::AddCarry => add_carry(b, x, y),
                    BinOp::Sub => b.ins().isub(x, y),
                    BinOp::Xor => b.ins().bxor(x, y),
                    BinOp::And => b.ins().band(x, y),
                    BinOp::Or => b.ins().bor(x, y),
                }
            }
            Insn::Shift {
                op, src, amount, ..
            } => {
                let x = read(b, &temps, src);
                let k = i64::from(amount);
                match op {
                    ShiftOp::Shl => b.ins().ishl_imm_u(x, k),
                    ShiftOp::Shr => b.ins().ushr_imm_u(x, k),
                    ShiftOp::Rotl => b.ins().rotl_imm_u(x, k),
                    ShiftOp::Rotr => b.ins().rotr_imm_u(x, k),
                }
            }
        };
        match insn.operands().0 {
            Some(Reg::Temp(t)) => temps[t as usize] = v,
            Some(Reg::Persistent(q)) => b.def_var(vars[q as usize], v),
            None => {}
        }
    }
    if pipe.non_modifying {
        input
    } else {
        output
    }
}

fn add_carry(b: &mut FunctionBuilder<'_>, x: Value, y: Value) -> Value {
    let (s, carry) = b.ins().uadd_overflow(x, y);
    let carry = b.ins().uextend(types::I64, carry);
    b.ins().iadd(s, carry)
}

/// A pipe's persistent registers in the loop.
struct PipeVars {
    vars: Vec<Variable>,
    /// Which are accumulators, kept as 128-bit sums.
    wide: Vec<bool>,
    lanewise: Option<Lanewise>,
}

/// Which persistent registers are only ever updated as `p = p +' x` with
/// `x` another register, and read nowhere else.
fn accumulators(pipe: &Pipe) -> Vec<bool> {
    (0..pipe.persistent.len())
        .map(|q| {
            let me = Reg::Persistent(q as u8);
            let mut accumulated = false;
            for insn in &pipe.code {
                if let Insn::Bin {
                    op: BinOp::AddCarry,
                    dst,
                    a,
                    b,
                } = *insn
                {
                    if dst == me && (a == me) != (b == me) {
                        accumulated = true;
                        continue;
                    }
                }
                let (dst, srcs) = insn.operands();
                if dst == Some(me) || srcs.contains(&Some(me)) {
                    return false;
                }
            }
            accumulated
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lanewise {
    Identity,
    ByteSwap,
}

/// Whether the pipe is a pure lane-wise function the word can run through
/// at once: no persistent registers (so no effect but its output), and an
/// output that is the input or its byte swap at the gauge.
fn lanewise(pipe: &Pipe) -> Option<Lanewise> {
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Sym {
        Input,
        Swapped,
        Other,
    }
    // A widened (commutative) narrow pipe runs on the whole word, where a
    // byte swap at its gauge is not lane-wise.
    if !pipe.persistent.is_empty() || pipe.non_modifying || pipe.lanes() * pipe.input.bits() != 64 {
        return None;
    }
    let mut temps = [Sym::Other; MAX_TEMPS];
    let mut out = Sym::Other;
    let sym = |temps: &[Sym; MAX_TEMPS], r: Reg| match r {
        Reg::Temp(t) => temps[t as usize],
        Reg::Persistent(_) => Sym::Other,
    };
    for insn in &pipe.code {
        let v = match *insn {
            Insn::Input { .. } => Sym::Input,
            Insn::Mov { src, .. } => sym(&temps, src),
            Insn::Bswap { src, width, .. }
                if width == pipe.input && sym(&temps, src) == Sym::Input =>
            {
                Sym::Swapped
            }
            Insn::Output { src } => {
                out = sym(&temps, src);
                continue;
            }
            _ => Sym::Other,
        };
        if let Some(Reg::Temp(t)) = insn.operands().0 {
            temps[t as usize] = v;
        }
    }
    match out {
        Sym::Input => Some(Lanewise::Identity),
        Sym::Swapped => Some(Lanewise::ByteSwap),
        Sym::Other => None,
    }
}

/// Swaps the bytes of every `g`-bit lane of `w` (16, 32 or 64 bits).
fn lanes_bswap(b: &mut FunctionBuilder<'_>, g: Gauge, w: Value) -> Value {
    if g == Gauge::G64 {
        b.ins().bswap(w)
    } else if g == Gauge::G32 {
        let s = b.ins().bswap(w);
        b.ins().rotl_imm_u(s, 32)
    } else {
        let m = 0x00ff_00ff_00ff_00ff_i64;
        let hi = b.ins().ushr_imm_u(w, 8);
        let hi = b.ins().band_imm_u(hi, m);
        let lo = b.ins().band_imm_u(w, m);
        let lo = b.ins().ishl_imm_u(lo, 8);
        b.ins().bor(hi, lo)
    }
}

/// One accumulator's sums in the vector loop: per set, the words' sum
/// and their high halves' sum.
type SumSets = [[Variable; 2]; 2];

/// What the vector loop does for one pipe.
enum VecStage {
    /// Nothing: the identity, or a non-modifying pipe without effects.
    Skip,
    /// Swaps the bytes of every lane of this gauge.
    Swap(Gauge),
    /// Adds the word to these accumulators (one entry per addition).
    Accumulate(Vec<usize>),
}

/// Words the vector loop runs per iteration (eight 128-bit vectors: fewer
/// pay for the loop's bookkeeping on 4 KB messages, more did not help).
const VEC_WORDS: u32 = 16;

/// How the vector loop runs the list, if every pipe can run on vectors
/// exactly (see the module doc).
fn vector_plan(pipes: &[Pipe]) -> Option<Vec<VecStage>> {
    pipes
        .iter()
        .map(|p| match lanewise(p) {
            Some(Lanewise::Identity) => Some(VecStage::Skip),
            Some(Lanewise::ByteSwap) => Some(VecStage::Swap(p.input)),
            None => input_accumulations(p).map(|qs| {
                if qs.is_empty() {
                    VecStage::Skip
                } else {
                    VecStage::Accumulate(qs)
                }
            }),
        })
        .collect()
}

/// For a non-modifying whole-word pipe whose only effect is adding its
/// input to accumulators: the accumulator of each addition.
fn input_accumulations(pipe: &Pipe) -> Option<Vec<usize>> {
    if !pipe.non_modifying || pipe.lanes() != 1 {
        return None;
    }
    let wide = accumulators(pipe);
    let mut input = [false; MAX_TEMPS];
    let mut qs = Vec::new();
    for insn in &pipe.code {
        match *insn {
            Insn::Bin {
                op: BinOp::AddCarry,
                dst: Reg::Persistent(q),
                a,
                b,
            } if wide[q as usize] => {
                let x = if a == Reg::Persistent(q) { b } else { a };
                match x {
                    Reg::Temp(t) if input[t as usize] => qs.push(q as usize),
                    _ => return None,
                }
            }
            Insn::Input { dst: Reg::Temp(t) } => input[t as usize] = true,
            Insn::Mov {
                dst: Reg::Temp(t),
                src: Reg::Temp(u),
            } => input[t as usize] = input[u as usize],
            _ => match insn.operands().0 {
                // Writes to temporaries have no effect but on the later
                // instructions, which are checked in turn.
                Some(Reg::Temp(t)) => input[t as usize] = false,
                None => {}
                Some(Reg::Persistent(_)) => return None,
            },
        }
    }
    Some(qs)
}

/// The vector loop over the first `words & !(VEC_WORDS - 1)` words;
/// returns how many words are left for the scalar loop.
fn gen_vector_loop(
    b: &mut FunctionBuilder<'_>,
    plan: &[VecStage],
    vars: &[PipeVars],
    store: bool,
    words: Value,
    (src, dst, count): (Variable, Variable, Variable),
) -> Value {
    let v64 = types::I64X2;
    let lanes = MemFlagsData::new().with_endianness(Endianness::Little);
    let zero = b.func.dfg.constants.insert(vec![0u8; 16].into());
    // Per accumulation target (pipe, register), two sets (even and odd
    // vectors, two independent dependency chains) of two sums: of the
    // words, wrapping, and of their high halves. The low halves' sum, which
    // fits 64 bits, is the first minus the second shifted by 32.
    let mut sums: Vec<((usize, usize), SumSets)> = Vec::new();
    for (i, stage) in plan.iter().enumerate() {
        if let VecStage::Accumulate(qs) = stage {
            for &q in qs {
                if !sums.iter().any(|s| s.0 == (i, q)) {
                    let z = b.ins().vconst(v64, zero);
                    let mut set = || {
                        let all = b.declare_var(v64);
                        let hi = b.declare_var(v64);
                        b.def_var(all, z);
                        b.def_var(hi, z);
                        [all, hi]
                    };
                    let sets = [set(), set()];
                    sums.push(((i, q), sets));
                }
            }
        }
    }
    let n = b
        .ins()
        .ushr_imm_u(words, i64::from(VEC_WORDS.trailing_zeros()));
    b.def_var(count, n);
    let head = b.create_block();
    let body = b.create_block();
    let done = b.create_block();
    b.ins().jump(head, &[]);
    b.switch_to_block(head);
    let c = b.use_var(count);
    b.ins().brif(c, body, &[], done, &[]);
    b.switch_to_block(body);
    let s = b.use_var(src);
    let d = b.use_var(dst);
    for k in 0..VEC_WORDS / 2 {
        let o = 16 * k as i32;
        let mut v = b.ins().load(types::I8X16, mem(), s, o);
        for (i, stage) in plan.iter().enumerate() {
            match stage {
                VecStage::Skip => {}
                VecStage::Swap(g) => {
                    let w = g.bytes() as u8;
                    let idx: Vec<u8> = (0..16u8).map(|j| j - j % w + (w - 1 - j % w)).collect();
                    let idx = b.func.dfg.immediates.push(idx.into());
                    v = b.ins().shuffle(v, v, idx);
                }
                VecStage::Accumulate(qs) => {
                    let x = b.ins().bitcast(v64, lanes, v);
                    let hi = b.ins().ushr_imm_u(x, 32);
                    for &q in qs {
                        // Every target was given its sums above.
                        if let Some(&(_, sets)) = sums.iter().find(|t| t.0 == (i, q)) {
                            let [all, shi] = sets[k as usize % 2];
                            let a = b.use_var(all);
                            let a = b.ins().iadd(a, x);
                            b.def_var(all, a);
                            let a = b.use_var(shi);
                            let a = b.ins().iadd(a, hi);
                            b.def_var(shi, a);
                        }
                    }
                }
            }
        }
        if store {
            b.ins().store(mem(), v, d, o);
        }
    }
    let step = 8 * i64::from(VEC_WORDS);
    let s = b.ins().iadd_imm_s(s, step);
    b.def_var(src, s);
    let d = b.ins().iadd_imm_s(d, step);
    b.def_var(dst, d);
    let c = b.use_var(count);
    let c = b.ins().iadd_imm_s(c, -1);
    b.def_var(count, c);
    b.ins().jump(head, &[]);
    b.switch_to_block(done);
    // S = the low halves' sum + (the high halves' sum << 32), added to the
    // accumulator's 128-bit sum.
    for ((i, q), [[all0, hi0], [all1, hi1]]) in sums {
        let (a0, a1) = (b.use_var(all0), b.use_var(all1));
        let all = b.ins().iadd(a0, a1);
        let (h0, h1) = (b.use_var(hi0), b.use_var(hi1));
        let hi = b.ins().iadd(h0, h1);
        let shifted = b.ins().ishl_imm_u(hi, 32);
        let lo = b.ins().isub(all, shifted);
        let mut total = None;
        for (v, shift) in [(lo, 0), (hi, 32)] {
            let x0 = b.ins().extractlane(v, 0);
            let x0 = b.ins().uextend(types::I128, x0);
            let x1 = b.ins().extractlane(v, 1);
            let x1 = b.ins().uextend(types::I128, x1);
            let mut part = b.ins().iadd(x0, x1);
            if shift > 0 {
                part = b.ins().ishl_imm_u(part, shift);
            }
            total = Some(match total {
                Some(t) => b.ins().iadd(t, part),
                None => part,
            });
        }
        if let Some(t) = total {
            let var = vars[i].vars[q];
            let acc = b.use_var(var);
            let acc = b.ins().iadd(acc, t);
            b.def_var(var, acc);
        }
    }
    b.ins().band_imm_u(words, i64::from(VEC_WORDS - 1))
}
