//! The whole trie compiled into one native function with Cranelift (DPF §3).
//!
//! The optimizations of §3.3, as they map onto a modern code generator:
//! - *Runtime constants*: every constant and mask is an immediate. `==`/`!=`
//!   compare the raw (little-endian) load against byte-swapped constants,
//!   so only ordered comparisons and shifts pay for a `bswap`.
//! - *Atom coalescing*: a chain of `==` atoms with no branching in between
//!   whose bytes fit one 2/4/8-byte window becomes one load, mask, compare.
//! - *Alignment estimation*: the alignment of each region's base is tracked
//!   through shifts (`(x & 0xf) << 2` keeps 4-byte alignment) and coalesced
//!   windows are placed on aligned offsets when there is a choice. x86-64
//!   and AArch64 load unaligned words at full speed, so this only steers the
//!   window choice; it is reported by `explain`.
//! - *Bounds-check aggregation*: one check per region for the fewest bytes
//!   any filter below needs, and further checks only where a branch needs
//!   more; a frame too short rejects that branch, never reads past the end.
//! - *Fast disjunctions*: a compare chain (binary search) for up to
//!   [`CHAIN_MAX`] keys; above that a collision-free hash table in data,
//!   so adding a leaf key never regenerates code.
//!
//! Two functions are generated from the trie: one frame,
//! `fn(tables, frame, len) -> id or -1`, and a loop over a batch,
//! `fn(tables, frames, n, out)`; both explore the trie branch and bound like
//! the interpreter (see [`crate::trie`]) and share the hash tables.

use std::collections::HashMap;
use std::fmt::Write as _;

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, AbiParam, Block, InstBuilder, MemFlagsData, Type, Value};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::Context;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Switch, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::Module;

use crate::canon::{CField, CShift};
use crate::filter::{Op, Width};
use crate::phash::{self, PerfectHash, TableDesc};
use crate::trie::{Accept, NodeId, Trie, CHAIN_MAX};
use crate::FilterId;

/// `fn(tables, frames, n, out)`: classifies `frames[..n]` into `out[..n]`.
type BatchFn = unsafe extern "C" fn(*const TableDesc, *const FrameRef, usize, *mut i64);

/// `fn(tables, frame, len) -> id or -1`: one frame, no loop around it.
type OneFn = unsafe extern "C" fn(*const TableDesc, *const u8, usize) -> i64;

/// A frame as the generated code reads it.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct FrameRef {
    ptr: *const u8,
    len: usize,
}

/// Frames per call of the generated loop in [`Compiled::run_batch`].
const BATCH: usize = 32;

const PRESENT: u64 = 1 << 63;
const CODE: u64 = 1 << 62;

fn leaf_val(a: Accept) -> u64 {
    PRESENT | ((a.prio as u64) << 32) | a.id.0 as u64
}

/// A hashed disjunction's table and what the code assumed about it.
struct Table {
    hash: PerfectHash,
    /// The fields whose coalesced value is the key: the disjunction's own,
    /// then those of the `==` chains below it (a flattened disjunction).
    fields: Vec<CField>,
    /// Region offset of the key's load window.
    start: u32,
    /// The highest priority the code's pruning allows for a new leaf.
    cap: u16,
    /// Whether a leaf key was compiled: only then do the bounds checks
    /// above this table cover a new leaf.
    has_leaf: bool,
}

pub(crate) struct Compiled {
    module: Option<JITModule>,
    one: OneFn,
    batch: BatchFn,
    code_size: usize,
    tables: Vec<Table>,
    descs: Vec<TableDesc>,
    table_of: HashMap<(NodeId, CField), usize>,
    notes: String,
}

// SAFETY: the raw pointers in `descs` point into `tables`, which `Compiled`
// owns; they are only read by the generated code under `&self` and rewritten
// under `&mut self`, so sharing or moving a `Compiled` is as safe as sharing
// or moving the vectors themselves.
unsafe impl Send for Compiled {}
// SAFETY: see `Send`: `run` only reads.
unsafe impl Sync for Compiled {}

impl Drop for Compiled {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: `func` points into this module's memory and is dropped
            // with it; nothing else holds a pointer to the code.
            unsafe { m.free_memory() };
        }
    }
}

impl Compiled {
    #[inline]
    pub(crate) fn run(&self, frame: &[u8]) -> Option<FilterId> {
        // SAFETY: the generated code reads `frame[..len]` only after a bounds
        // check, and the tables through `descs`, which stay valid while
        // `self` is borrowed.
        let r = unsafe { (self.one)(self.descs.as_ptr(), frame.as_ptr(), frame.len()) };
        (r >= 0).then_some(FilterId(r as u32))
    }

    /// Classifies a batch in one call of the generated loop: no call per
    /// frame, and the CPU overlaps the lookups of consecutive frames.
    pub(crate) fn run_batch(&self, frames: &[&[u8]], out: &mut [Option<FilterId>]) {
        // A lone frame (a request-response exchange's every batch) has no
        // lookups to overlap: the single-frame code, without the batch's
        // arrays to set up.
        if let ([frame], [o, ..]) = (frames, &mut *out) {
            *o = self.run(frame);
            return;
        }
        let mut refs = [FrameRef {
            ptr: std::ptr::null(),
            len: 0,
        }; BATCH];
        let mut res = [-1i64; BATCH];
        for (fs, os) in frames.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
            for (r, f) in refs.iter_mut().zip(fs) {
                *r = FrameRef {
                    ptr: f.as_ptr(),
                    len: f.len(),
                };
            }
            let n = fs.len().min(os.len());
            // SAFETY: as in `run`, for the `n` frames of `refs` and results
            // of `res`, both at least `n` long.
            unsafe { (self.batch)(self.descs.as_ptr(), refs.as_ptr(), n, res.as_mut_ptr()) };
            for (o, &r) in os.iter_mut().zip(&res[..n]) {
                *o = (r >= 0).then_some(FilterId(r as u32));
            }
        }
    }

    pub(crate) fn code_size(&self) -> usize {
        self.code_size
    }

    pub(crate) fn tables(&self) -> usize {
        self.tables.len()
    }

    pub(crate) fn notes(&self) -> &str {
        &self.notes
    }

    /// The key fields of the table of the disjunction on `field` at `n`.
    pub(crate) fn table_fields(&self, n: NodeId, field: CField) -> Option<&[CField]> {
        let &t = self.table_of.get(&(n, field))?;
        Some(&self.tables[t].fields)
    }

    /// Sets (or with `None` removes) the slot for the `==` atoms `atoms` in
    /// the table at node `parent`. False if the code must be regenerated.
    pub(crate) fn set_leaf(
        &mut self,
        parent: NodeId,
        atoms: &[(CField, u32)],
        best: Option<Accept>,
        prio: u16,
    ) -> bool {
        let Some(&t) = atoms
            .first()
            .and_then(|(f, _)| self.table_of.get(&(parent, *f)))
        else {
            return false;
        };
        let table = &mut self.tables[t];
        let same_fields = table.fields.len() == atoms.len()
            && table.fields.iter().zip(atoms).all(|(f, (g, _))| f == g);
        if !same_fields || !table.has_leaf || prio > table.cap {
            return false;
        }
        let key = encode(table.start, atoms).1;
        match best {
            Some(a) => {
                if !table.hash.insert(key, leaf_val(a)) {
                    return false;
                }
            }
            None => {
                table.hash.remove(key);
            }
        }
        self.descs[t] = table.hash.desc();
        true
    }
}

/// The raw little-endian value a load of `field` gives when it equals `value`.
fn raw_key(field: CField, value: u32) -> u64 {
    encode(field.off, &[(field, value)]).1
}

/// Mask and value, as a little-endian word loaded at `start`, of `==` atoms.
fn encode(start: u32, atoms: &[(CField, u32)]) -> (u64, u64) {
    let (mut mask, mut val) = (0u64, 0u64);
    for (f, v) in atoms {
        let w = f.width.bytes();
        for j in 0..w {
            let sh = 8 * (w - 1 - j);
            let pos = 8 * (f.off + j - start);
            mask |= (((f.mask >> sh) & 0xff) as u64) << pos;
            val |= (((v >> sh) & 0xff) as u64) << pos;
        }
    }
    (mask, val & mask)
}

/// A region: the bytes after one indirect shift.
#[derive(Clone, Copy)]
struct Region {
    /// Address of the region base.
    addr: Value,
    base: Value,
    /// `len - base`.
    avail: Value,
    /// Known alignment of `base` (power of two, at most 8).
    align: u32,
}

enum Branch {
    Disj(usize),
    Test(usize),
    Shift(usize),
}

struct Gen<'a, 'b, 'c> {
    dpf: Trie<'a>,
    b: FunctionBuilder<'b>,
    /// The tables were built by an earlier pass over the same trie; this
    /// pass reads them in the same order.
    reuse: bool,
    frame: Value,
    len: Value,
    descs: Value,
    best_p: Variable,
    best_id: Variable,
    /// Where a classified frame's result is stored.
    finish: Block,
    tables: &'c mut Vec<Table>,
    table_of: &'c mut HashMap<(NodeId, CField), usize>,
    /// With `reuse`, the index of the next table to read.
    next_table: usize,
    stats: GenStats,
}

#[derive(Default)]
struct GenStats {
    bounds_checks: usize,
    loads: usize,
    coalesced: usize,
    aligned_windows: usize,
    chains: usize,
    flattened: usize,
    one_level: usize,
}

fn flags() -> MemFlagsData {
    // Bounds are checked before every load, so none can trap; nothing
    // writes memory while the function runs.
    MemFlagsData::new().with_notrap().with_readonly()
}

/// What a generated function does with each classified frame.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `OneFn`: return the result.
    One,
    /// `BatchFn`: store it and go on with the next frame.
    Batch,
}

pub(crate) fn compile(dpf: Trie<'_>) -> Compiled {
    let mut flag_builder = settings::builder();
    flag_builder
        .set("opt_level", "speed")
        .expect("known cranelift setting");
    // The generator is tested against the interpreter; checking its IR again
    // at every compilation would double the cost of a slow update.
    flag_builder
        .set("enable_verifier", "false")
        .expect("known cranelift setting");
    let isa = cranelift_native::builder()
        .expect("host is supported by cranelift")
        .finish(settings::Flags::new(flag_builder))
        .expect("host ISA builds");
    let mut module = JITModule::new(JITBuilder::with_isa(
        isa,
        cranelift_module::default_libcall_names(),
    ));
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    // The batch loop first: its pass builds the hash tables, which the
    // single-frame function then shares.
    let mut tables = Vec::new();
    let mut table_of = HashMap::new();
    let stats = generate(
        dpf,
        &module,
        &mut ctx,
        &mut fctx,
        Shape::Batch,
        &mut tables,
        &mut table_of,
    );
    let (batch_id, batch_size) = define(&mut module, &mut ctx);
    generate(
        dpf,
        &module,
        &mut ctx,
        &mut fctx,
        Shape::One,
        &mut tables,
        &mut table_of,
    );
    let (one_id, one_size) = define(&mut module, &mut ctx);
    module.finalize_definitions().expect("finalize demux code");
    // SAFETY: each function was declared with exactly this signature (the
    // pointer-sized arguments and result of `BatchFn` / `OneFn`, the host's
    // default calling convention, which is `extern "C"`).
    let (batch, one) = unsafe {
        (
            std::mem::transmute::<*const u8, BatchFn>(module.get_finalized_function(batch_id)),
            std::mem::transmute::<*const u8, OneFn>(module.get_finalized_function(one_id)),
        )
    };
    let descs = tables.iter().map(|t| t.hash.desc()).collect();
    let mut notes = String::new();
    let _ = writeln!(
        notes,
        "  {} loads, {} bounds checks, {} coalesced loads ({} aligned), {} compare chains, {} flattened disjunctions, {} one-level hashes",
        stats.loads, stats.bounds_checks, stats.coalesced, stats.aligned_windows, stats.chains, stats.flattened, stats.one_level
    );
    let _ = writeln!(
        notes,
        "  single-frame function {one_size} bytes, batch loop {batch_size} bytes"
    );
    for (i, t) in tables.iter().enumerate() {
        let _ = writeln!(
            notes,
            "  hash table {i}: {} keys in {} slots",
            t.hash.len(),
            t.hash.slots_len()
        );
    }
    Compiled {
        module: Some(module),
        one,
        batch,
        code_size: one_size + batch_size,
        tables,
        descs,
        table_of,
        notes,
    }
}

/// Generates one function of the trie into `ctx`.
fn generate(
    dpf: Trie<'_>,
    module: &JITModule,
    ctx: &mut Context,
    fctx: &mut FunctionBuilderContext,
    shape: Shape,
    tables: &mut Vec<Table>,
    table_of: &mut HashMap<(NodeId, CField), usize>,
) -> GenStats {
    let ptr = module.target_config().pointer_type();
    let frontend_config = module.isa().frontend_config();
    ctx.func.signature.params = match shape {
        Shape::One => vec![AbiParam::new(ptr); 3],
        Shape::Batch => vec![AbiParam::new(ptr); 4],
    };
    ctx.func.signature.returns = match shape {
        Shape::One => vec![AbiParam::new(types::I64)],
        Shape::Batch => vec![],
    };
    let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    let descs = params[0];
    let best_p = b.declare_var(types::I64);
    let best_id = b.declare_var(types::I64);
    let i = b.declare_var(types::I64);
    let zero = b.ins().iconst(types::I64, 0);
    let finish = b.create_block();
    let header = b.create_block();
    let (frame, len) = match shape {
        Shape::One => (params[1], params[2]),
        Shape::Batch => {
            // for i in 0..n { out[i] = classify(frames[i]) }
            let (frames, n) = (params[1], params[2]);
            b.def_var(i, zero);
            let body = b.create_block();
            let exit = b.create_block();
            b.ins().jump(header, &[]);
            b.switch_to_block(header);
            let iv = b.use_var(i);
            let more = b.ins().icmp(IntCC::UnsignedLessThan, iv, n);
            b.ins().brif(more, body, &[], exit, &[]);
            b.switch_to_block(exit);
            b.ins().return_(&[]);
            b.switch_to_block(body);
            let fr = b.ins().ishl_imm_u(iv, 4);
            let fr = b.ins().iadd(frames, fr);
            let frame = b.ins().load(types::I64, flags(), fr, 0);
            let len = b.ins().load(types::I64, flags(), fr, 8);
            (frame, len)
        }
    };
    let minus1 = b.ins().iconst(types::I64, -1);
    b.def_var(best_p, minus1);
    b.def_var(best_id, minus1);
    let reuse = shape == Shape::One;
    let mut g = Gen {
        dpf,
        b,
        reuse,
        frame,
        len,
        descs,
        best_p,
        best_id,
        finish,
        tables,
        table_of,
        next_table: 0,
        stats: GenStats::default(),
    };
    let root = Region {
        addr: frame,
        base: zero,
        avail: len,
        align: 8,
    };
    g.node(dpf.root(), root, 0, finish, -1, false);
    g.b.switch_to_block(finish);
    let id = g.b.use_var(best_id);
    match shape {
        Shape::One => {
            g.b.ins().return_(&[id]);
        }
        Shape::Batch => {
            let out = params[3];
            let iv = g.b.use_var(i);
            let slot = g.b.ins().ishl_imm_u(iv, 3);
            let slot = g.b.ins().iadd(out, slot);
            g.b.ins()
                .store(MemFlagsData::new().with_notrap(), id, slot, 0);
            let next = g.b.ins().iadd_imm_u(iv, 1);
            g.b.def_var(i, next);
            g.b.ins().jump(header, &[]);
        }
    }
    g.b.seal_all_blocks();
    g.b.finalize(frontend_config);
    g.stats
}

/// Compiles the function in `ctx` into the module.
fn define(module: &mut JITModule, ctx: &mut Context) -> (cranelift_module::FuncId, usize) {
    let id = module
        .declare_anonymous_function(&ctx.func.signature)
        .expect("declare demux function");
    module
        .define_function(id, ctx)
        .expect("generated demux function compiles");
    let size = ctx
        .compiled_code()
        .map_or(0, |c| c.code_info().total_size as usize);
    module.clear_context(ctx);
    (id, size)
}

/// Atoms on overlapping bits cannot share one compare: their constants
/// might disagree, and one merged constant would hide that.
fn disjoint_masks(start: u32, atoms: &[(CField, u32)]) -> bool {
    let mut seen = 0u64;
    for a in atoms {
        let (m, _) = encode(start, std::slice::from_ref(a));
        if seen & m != 0 {
            return false;
        }
        seen |= m;
    }
    true
}

fn align_of_const(c: u32) -> u32 {
    if c == 0 {
        8
    } else {
        (1 << c.trailing_zeros()).min(8)
    }
}

impl Gen<'_, '_, '_> {
    fn pot_i(&self, n: NodeId) -> i32 {
        self.dpf.node(n).pot as i32
    }

    fn branch_pot(&self, n: NodeId, br: &Branch) -> i32 {
        let node = self.dpf.node(n);
        match *br {
            Branch::Disj(i) => node.disjs[i]
                .keys
                .values()
                .map(|&c| self.pot_i(c))
                .max()
                .unwrap_or(-1),
            Branch::Test(i) => self.pot_i(node.tests[i].1),
            Branch::Shift(i) => self.pot_i(node.shifts[i].1),
        }
    }

    /// Bytes of the region a branch needs before anything below it can match.
    fn branch_ext(&self, n: NodeId, br: &Branch) -> u32 {
        let node = self.dpf.node(n);
        match *br {
            Branch::Disj(i) => {
                let d = &node.disjs[i];
                d.keys
                    .values()
                    .map(|&c| d.field.end().max(self.dpf.node(c).need))
                    .min()
                    .unwrap_or(d.field.end())
            }
            Branch::Test(i) => {
                let (a, c) = &node.tests[i];
                a.field.end().max(self.dpf.node(*c).need)
            }
            Branch::Shift(i) => node.shifts[i].0.field.end(),
        }
    }

    fn iconst(&mut self, v: i64) -> Value {
        self.b.ins().iconst(types::I64, v)
    }

    /// `if !(avail >= need) goto fail`, continuing in a new block.
    fn check(&mut self, r: Region, need: u32, fail: Block) {
        self.stats.bounds_checks += 1;
        let ok = self.b.create_block();
        let c = self
            .b
            .ins()
            .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, r.avail, need as i64);
        self.b.ins().brif(c, ok, &[], fail, &[]);
        self.b.switch_to_block(ok);
    }

    /// Branches to `then` if `cond`, else continues in a new block.
    fn branch_if(&mut self, cond: Value, then: Block) {
        let next = self.b.create_block();
        self.b.ins().brif(cond, then, &[], next, &[]);
        self.b.switch_to_block(next);
    }

    /// Loads `bytes` raw (little-endian) at region offset `off`, as i64.
    fn load_raw(&mut self, r: Region, off: u32, bytes: u32) -> Value {
        self.stats.loads += 1;
        let f = flags();
        let off = off as i32;
        match bytes {
            1 => self.b.ins().uload8(types::I64, f, r.addr, off),
            2 => self.b.ins().uload16(types::I64, f, r.addr, off),
            4 => self.b.ins().uload32(f, r.addr, off),
            _ => self.b.ins().load(types::I64, f, r.addr, off),
        }
    }

    /// Loads a field as a number (big-endian, masked), as i64.
    fn load_be(&mut self, r: Region, field: CField) -> Value {
        self.stats.loads += 1;
        let f = flags();
        let off = field.off as i32;
        let ty: Type = match field.width {
            Width::U8 => types::I8,
            Width::U16 => types::I16,
            Width::U32 => types::I32,
        };
        let mut v = self.b.ins().load(ty, f, r.addr, off);
        if field.width != Width::U8 {
            v = self.b.ins().bswap(v);
        }
        let v = self.b.ins().uextend(types::I64, v);
        if field.mask == field.width.full_mask() {
            v
        } else {
            self.b.ins().band_imm_u(v, field.mask as i64)
        }
    }

    /// Records an accept known at compile time.
    fn record_static(&mut self, a: Accept, maybe_best: bool) {
        let p = self.iconst(a.prio as i64);
        let id = self.iconst(a.id.0 as i64);
        if maybe_best {
            self.record(p, id);
        } else {
            self.b.def_var(self.best_p, p);
            self.b.def_var(self.best_id, id);
        }
    }

    /// `best = max(best, (p, id))`: higher priority, then lower id.
    fn record(&mut self, p: Value, id: Value) {
        let bp = self.b.use_var(self.best_p);
        let bid = self.b.use_var(self.best_id);
        let gt = self.b.ins().icmp(IntCC::SignedGreaterThan, p, bp);
        let eq = self.b.ins().icmp(IntCC::Equal, p, bp);
        let lt = self.b.ins().icmp(IntCC::SignedLessThan, id, bid);
        let tie = self.b.ins().band(eq, lt);
        let win = self.b.ins().bor(gt, tie);
        let np = self.b.ins().select(win, p, bp);
        let nid = self.b.ins().select(win, id, bid);
        self.b.def_var(self.best_p, np);
        self.b.def_var(self.best_id, nid);
    }

    /// This frame is classified: store the best and go on with the next.
    fn ret_best(&mut self) {
        self.b.ins().jump(self.finish, &[]);
    }

    /// Emits the search of the subtree at `n` into the current block; when
    /// done (matched or not) control goes to `cont`, whose subtrees can
    /// reach priority `cont_pot` (-1: nothing).
    fn node(
        &mut self,
        n: NodeId,
        r: Region,
        mut checked: u32,
        cont: Block,
        cont_pot: i32,
        mut maybe_best: bool,
    ) {
        let dpf = self.dpf;
        let node = dpf.node(n);
        // Each branch's potential once (for a disjunction, a pass over all
        // its keys), then the branches in order of it.
        let mut ranked: Vec<(i32, Branch)> = (0..node.disjs.len())
            .map(Branch::Disj)
            .chain((0..node.tests.len()).map(Branch::Test))
            .chain((0..node.shifts.len()).map(Branch::Shift))
            .map(|br| (self.branch_pot(n, &br), br))
            .collect();
        ranked.sort_by_key(|(pot, _)| -pot);
        let (pots, branches): (Vec<i32>, Vec<Branch>) = ranked.into_iter().unzip();
        let below = pots.first().copied().unwrap_or(-1);
        if let Some(a) = node.best_accept() {
            self.record_static(a, maybe_best);
            maybe_best = true;
            if a.prio as i32 > below.max(cont_pot) {
                self.ret_best();
                return;
            }
            if a.prio as i32 > below {
                self.b.ins().jump(cont, &[]);
                return;
            }
        } else if branches.is_empty() {
            self.b.ins().jump(cont, &[]);
            return;
        } else if node.need > checked {
            self.check(r, node.need, cont);
            checked = node.need;
        }
        for (i, br) in branches.iter().enumerate() {
            let last = i + 1 == branches.len();
            let next = if last { cont } else { self.b.create_block() };
            let next_pot = pots[i + 1..]
                .iter()
                .copied()
                .max()
                .unwrap_or(-1)
                .max(cont_pot);
            // Every branch holds an accept: after the first, one may
            // have been recorded.
            maybe_best |= i > 0;
            if maybe_best {
                // Branches are sorted by potential: once one cannot beat
                // the best so far, none after it can.
                let bp = self.b.use_var(self.best_p);
                let c = self
                    .b
                    .ins()
                    .icmp_imm_u(IntCC::SignedGreaterThan, bp, pots[i] as i64);
                self.branch_if(c, cont);
            }
            let ext = self.branch_ext(n, br);
            let mut bchecked = checked;
            if ext > checked {
                self.check(r, ext, next);
                bchecked = ext;
            }
            match *br {
                Branch::Disj(d) => self.disj(n, d, r, bchecked, next, next_pot, maybe_best),
                Branch::Test(t) => {
                    let (a, c) = node.tests[t];
                    let v = self.load_be(r, a.field);
                    let cc = match a.op {
                        Op::Eq => IntCC::Equal,
                        Op::Ne => IntCC::NotEqual,
                        Op::Lt => IntCC::UnsignedLessThan,
                        Op::Le => IntCC::UnsignedLessThanOrEqual,
                        Op::Gt => IntCC::UnsignedGreaterThan,
                        Op::Ge => IntCC::UnsignedGreaterThanOrEqual,
                    };
                    let ok = self.b.ins().icmp_imm_u(cc, v, a.value as i64);
                    let then = self.b.create_block();
                    self.b.ins().brif(ok, then, &[], next, &[]);
                    self.b.switch_to_block(then);
                    self.node(c, r, bchecked, next, next_pot, maybe_best);
                }
                Branch::Shift(s) => {
                    let (sh, c) = node.shifts[s];
                    self.shift(sh, c, r, next, next_pot, maybe_best);
                }
            }
            if !last {
                self.b.switch_to_block(next);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn disj(
        &mut self,
        n: NodeId,
        d: usize,
        r: Region,
        checked: u32,
        next: Block,
        next_pot: i32,
        maybe_best: bool,
    ) {
        let dpf = self.dpf;
        let disj = &dpf.node(n).disjs[d];
        if disj.keys.len() == 1 {
            let (&k, &c) = disj.keys.iter().next().unwrap();
            return self.eq_chain(disj.field, k, c, r, checked, next, next_pot, maybe_best);
        }
        if disj.keys.len() <= CHAIN_MAX {
            let raw = self.load_raw(r, disj.field.off, disj.field.width.bytes());
            let key = self.masked(
                raw,
                &[(disj.field, 0)],
                disj.field.off,
                disj.field.width.bytes(),
            );
            self.stats.chains += 1;
            if disj.keys.values().all(|&c| dpf.node(c).is_leaf()) {
                // Leaves only: pick the leaf with selects, so that keys in
                // any order cost no branch misprediction; one branch on
                // whether any key matched.
                let mut val = self.iconst(0);
                for (&k, &c) in &disj.keys {
                    let a = dpf.node(c).best_accept().expect("a leaf accepts");
                    let is =
                        self.b
                            .ins()
                            .icmp_imm_u(IntCC::Equal, key, raw_key(disj.field, k) as i64);
                    let v = self.iconst(leaf_val(a) as i64);
                    val = self.b.ins().select(is, v, val);
                }
                let hit = self.b.create_block();
                self.b.ins().brif(val, hit, &[], next, &[]);
                self.b.switch_to_block(hit);
                return self.accept_val(val, next, next_pot, maybe_best);
            }
            let mut sw = Switch::new();
            let mut targets = Vec::new();
            for (&k, &c) in &disj.keys {
                let blk = self.b.create_block();
                sw.set_entry(raw_key(disj.field, k) as u128, blk);
                targets.push((blk, c));
            }
            sw.emit(&mut self.b, key, next);
            for (blk, c) in targets {
                self.b.switch_to_block(blk);
                self.node(c, r, checked, next, next_pot, maybe_best);
            }
            return;
        }
        let (fields, start, bytes) = self.flat_fields(n, d, r, checked).unwrap_or((
            vec![disj.field],
            disj.field.off,
            disj.field.width.bytes(),
        ));
        if fields.len() > 1 {
            self.stats.flattened += 1;
        }
        let mut entries = Vec::with_capacity(disj.keys.len());
        let mut code = Vec::new();
        let mut cap = 0u16;
        let mut has_leaf = false;
        for (&k, &c) in &disj.keys {
            let (atoms, end) = self.chain_below(disj.field, k, c, fields.len());
            let child = dpf.node(end);
            cap = cap.max(child.pot);
            let key = encode(start, &atoms).1;
            if child.is_leaf() {
                has_leaf = true;
                let a = child.best_accept().expect("a leaf accepts");
                entries.push((key, leaf_val(a)));
            } else {
                entries.push((key, PRESENT | CODE | code.len() as u64));
                code.push(c);
            }
        }
        let raw = self.load_raw(r, start, bytes);
        let zero: Vec<(CField, u32)> = fields.iter().map(|&f| (f, 0)).collect();
        let key = self.masked(raw, &zero, start, bytes);
        let t = if self.reuse {
            self.next_table += 1;
            self.next_table - 1
        } else {
            self.tables.push(Table {
                hash: PerfectHash::build(entries),
                fields,
                start,
                cap,
                has_leaf,
            });
            self.tables.len() - 1
        };
        debug_assert!(!self.reuse || self.table_of[&(n, disj.field)] == t);
        self.table_of.insert((n, disj.field), t);
        self.hashed(t, key, code, r, checked, next, next_pot, maybe_best);
    }

    /// `raw & mask` for the fields of `atoms` in a window at `start`; no
    /// instruction when the mask is all ones.
    fn masked(&mut self, raw: Value, atoms: &[(CField, u32)], start: u32, bytes: u32) -> Value {
        let (mask, _) = encode(start, atoms);
        let full = if bytes == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * bytes)) - 1
        };
        if mask == full {
            raw
        } else {
            self.b.ins().band_imm_u(raw, mask as i64)
        }
    }

    /// The `==` atoms from key `k` of a disjunction on `field` down `depth`
    /// levels of single-key chains, and the node where they end.
    fn chain_below(
        &self,
        field: CField,
        k: u32,
        child: NodeId,
        depth: usize,
    ) -> (Vec<(CField, u32)>, NodeId) {
        let mut atoms = vec![(field, k)];
        let mut c = child;
        while atoms.len() < depth {
            let d = &self.dpf.node(c).disjs[0];
            let (&k, &next) = d.keys.iter().next().unwrap();
            atoms.push((d.field, k));
            c = next;
        }
        (atoms, c)
    }

    /// Flattened disjunction: if below every key there is the same chain of
    /// single `==` atoms ending in a leaf (tcp10's source port, then its
    /// destination port), and all the fields fit one load window, the
    /// disjunction hashes their coalesced value: one lookup, no branch per
    /// level. Returns the fields and the window.
    fn flat_fields(
        &mut self,
        n: NodeId,
        d: usize,
        r: Region,
        checked: u32,
    ) -> Option<(Vec<CField>, u32, u32)> {
        let dpf = self.dpf;
        let disj = &dpf.node(n).disjs[d];
        let chain = |mut c: NodeId| -> Option<Vec<CField>> {
            let mut fields = Vec::new();
            loop {
                let node = dpf.node(c);
                if node.is_leaf() {
                    return Some(fields);
                }
                let single = node.accepts.is_empty()
                    && node.tests.is_empty()
                    && node.shifts.is_empty()
                    && node.disjs.len() == 1
                    && node.disjs[0].keys.len() == 1;
                if !single {
                    return None;
                }
                let d = &node.disjs[0];
                fields.push(d.field);
                c = *d.keys.values().next().unwrap();
            }
        };
        let mut children = disj.keys.values();
        let below = chain(*children.next()?)?;
        if below.is_empty() || below.len() >= 8 {
            return None;
        }
        for &c in children {
            if chain(c)? != below {
                return None;
            }
        }
        let mut fields = vec![disj.field];
        fields.extend(below);
        let probe: Vec<(CField, u32)> = fields.iter().map(|&f| (f, 0)).collect();
        let (start, bytes) = self.window(&probe, r, checked)?;
        disjoint_masks(start, &probe).then_some((fields, start, bytes))
    }

    /// A chain of single `==` atoms with nothing else in between, merged into
    /// as few loads as their bytes allow (atom coalescing).
    #[allow(clippy::too_many_arguments)]
    fn eq_chain(
        &mut self,
        field: CField,
        value: u32,
        child: NodeId,
        r: Region,
        checked: u32,
        next: Block,
        next_pot: i32,
        maybe_best: bool,
    ) {
        let dpf = self.dpf;
        let mut atoms = vec![(field, value)];
        let mut child = child;
        let mut window = self.window(&atoms, r, checked);
        loop {
            let node = dpf.node(child);
            if !node.accepts.is_empty() || node.disjs.len() != 1 || node.disjs[0].keys.len() != 1 {
                break;
            }
            if !node.tests.is_empty() || !node.shifts.is_empty() {
                break;
            }
            let d = &node.disjs[0];
            let (&k, &c) = d.keys.iter().next().unwrap();
            atoms.push((d.field, k));
            match self.window(&atoms, r, checked) {
                Some(w) if disjoint_masks(w.0, &atoms) => {
                    window = Some(w);
                    child = c;
                }
                _ => {
                    atoms.pop();
                    break;
                }
            }
        }
        let (start, bytes) = window.unwrap_or((field.off, field.width.bytes()));
        if atoms.len() > 1 {
            self.stats.coalesced += 1;
        }
        let (_, val) = encode(start, &atoms);
        let raw = self.load_raw(r, start, bytes);
        let v = self.masked(raw, &atoms, start, bytes);
        let ok = self.b.ins().icmp_imm_u(IntCC::Equal, v, val as i64);
        let then = self.b.create_block();
        self.b.ins().brif(ok, then, &[], next, &[]);
        self.b.switch_to_block(then);
        self.node(child, r, checked, next, next_pot, maybe_best);
    }

    /// A load window `(start, bytes)` covering `atoms`, inside the checked
    /// bytes of the region, preferring an aligned start.
    fn window(&mut self, atoms: &[(CField, u32)], r: Region, checked: u32) -> Option<(u32, u32)> {
        let lo = atoms.iter().map(|(f, _)| f.off).min()?;
        let hi = atoms.iter().map(|(f, _)| f.end()).max()?;
        let bytes = (hi - lo).next_power_of_two().max(1);
        if bytes > 8 {
            return None;
        }
        if atoms.len() == 1 {
            return Some((lo, bytes));
        }
        let candidates = (hi.saturating_sub(bytes)..=lo).filter(|s| s + bytes <= checked);
        let mut best = None;
        for s in candidates {
            let aligned = r.align >= bytes && s % bytes == 0;
            if aligned {
                self.stats.aligned_windows += 1;
                return Some((s, bytes));
            }
            best.get_or_insert((s, bytes));
        }
        best
    }

    /// Looks `key` up in table `t`: a leaf slot accepts, a code slot jumps
    /// to the child's code (`code[i]`), a miss goes to `next`.
    #[allow(clippy::too_many_arguments)]
    fn hashed(
        &mut self,
        t: usize,
        key: Value,
        code: Vec<NodeId>,
        r: Region,
        checked: u32,
        next: Block,
        next_pot: i32,
        maybe_best: bool,
    ) {
        // One level: slot = (key * mul) >> shift. Two levels:
        // bucket = buckets[(key * mul) >> shift], packed (bmul, bshift, base);
        // slot = base + ((key * mul * bmul) >> bshift).
        let f = flags();
        let desc = self
            .b
            .ins()
            .iadd_imm_u(self.descs, t as i64 * phash::DESC_SIZE);
        let mul = self.b.ins().load(types::I64, f, desc, phash::DESC_MUL);
        let shift = self.b.ins().load(types::I64, f, desc, phash::DESC_SHIFT);
        let keys = self.b.ins().load(types::I64, f, desc, phash::DESC_KEYS);
        let vals = self.b.ins().load(types::I64, f, desc, phash::DESC_VALS);
        let h = self.b.ins().imul(key, mul);
        let si = if self.tables[t].hash.is_single() {
            self.stats.one_level += 1;
            self.b.ins().ushr(h, shift)
        } else {
            let buckets = self.b.ins().load(types::I64, f, desc, phash::DESC_BUCKETS);
            let bi = self.b.ins().ushr(h, shift);
            let boff = self.b.ins().ishl_imm_u(bi, 3);
            let baddr = self.b.ins().iadd(buckets, boff);
            let bucket = self.b.ins().load(types::I64, f, baddr, 0);
            let bmul = self.b.ins().band_imm_u(bucket, 0xffff_ffff);
            let bshift = self.b.ins().ushr_imm_u(bucket, phash::BUCKET_SHIFT_POS);
            let bshift = self.b.ins().band_imm_u(bshift, 63);
            let base = self.b.ins().ushr_imm_u(bucket, phash::BUCKET_BASE_POS);
            let h2 = self.b.ins().imul(h, bmul);
            let si = self.b.ins().ushr(h2, bshift);
            self.b.ins().iadd(si, base)
        };
        let soff = self.b.ins().ishl_imm_u(si, 3);
        let kaddr = self.b.ins().iadd(keys, soff);
        let vaddr = self.b.ins().iadd(vals, soff);
        let skey = self.b.ins().load(types::I64, f, kaddr, 0);
        let sval = self.b.ins().load(types::I64, f, vaddr, 0);
        let same = self.b.ins().icmp(IntCC::Equal, skey, key);
        let present = self.b.ins().icmp_imm_u(IntCC::NotEqual, sval, 0);
        let hit = self.b.ins().band(same, present);
        let hit_blk = self.b.create_block();
        self.b.ins().brif(hit, hit_blk, &[], next, &[]);
        self.b.switch_to_block(hit_blk);

        let leaf_blk = self.b.create_block();
        if !code.is_empty() {
            let is_code = self.b.ins().band_imm_u(sval, CODE as i64);
            let code_blk = self.b.create_block();
            self.b.ins().brif(is_code, code_blk, &[], leaf_blk, &[]);
            self.b.switch_to_block(code_blk);
            let idx = self.b.ins().ireduce(types::I32, sval);
            let mut sw = Switch::new();
            let blocks: Vec<Block> = code.iter().map(|_| self.b.create_block()).collect();
            for (i, blk) in blocks.iter().enumerate() {
                sw.set_entry(i as u128, *blk);
            }
            sw.emit(&mut self.b, idx, next);
            for (blk, c) in blocks.into_iter().zip(code) {
                self.b.switch_to_block(blk);
                self.node(c, r, checked, next, next_pot, maybe_best);
            }
        } else {
            self.b.ins().jump(leaf_blk, &[]);
        }
        self.b.switch_to_block(leaf_blk);
        self.accept_val(sval, next, next_pot, maybe_best);
    }

    /// Accepts the leaf value `val` (id, priority) found at run time, then
    /// returns if nothing left can beat it, else goes on at `next`.
    fn accept_val(&mut self, val: Value, next: Block, next_pot: i32, maybe_best: bool) {
        let id = self.b.ins().band_imm_u(val, 0xffff_ffff);
        if !maybe_best && next_pot < 0 {
            // Nothing was recorded and nothing is left: this leaf is it.
            self.b.def_var(self.best_id, id);
            self.ret_best();
            return;
        }
        let p = self.b.ins().ushr_imm_u(val, 32);
        let p = self.b.ins().band_imm_u(p, 0xffff);
        if maybe_best {
            self.record(p, id);
        } else {
            self.b.def_var(self.best_p, p);
            self.b.def_var(self.best_id, id);
        }
        if next_pot < 0 {
            self.ret_best();
            return;
        }
        // Done if this leaf beats everything still to explore.
        let done = self.b.create_block();
        let c = self
            .b
            .ins()
            .icmp_imm_u(IntCC::SignedGreaterThan, p, next_pot as i64);
        self.b.ins().brif(c, done, &[], next, &[]);
        self.b.switch_to_block(done);
        self.ret_best();
    }

    fn shift(
        &mut self,
        sh: CShift,
        child: NodeId,
        r: Region,
        next: Block,
        next_pot: i32,
        maybe_best: bool,
    ) {
        let v = self.load_be(r, sh.field);
        let v = if sh.shl > 0 {
            self.b.ins().ishl_imm_u(v, sh.shl as i64)
        } else {
            v
        };
        let v = self.b.ins().iadd_imm_u(v, sh.add as i64);
        let base = self.b.ins().iadd(r.base, v);
        let inside = self
            .b
            .ins()
            .icmp(IntCC::UnsignedLessThanOrEqual, base, self.len);
        let then = self.b.create_block();
        self.b.ins().brif(inside, then, &[], next, &[]);
        self.b.switch_to_block(then);
        let addr = self.b.ins().iadd(self.frame, base);
        let avail = self.b.ins().isub(self.len, base);
        let shifted = (1u32 << (sh.shl as u32 + sh.field.mask.trailing_zeros()).min(3)).min(8);
        let align = r.align.min(align_of_const(sh.add)).min(shifted);
        let nr = Region {
            addr,
            base,
            avail,
            align,
        };
        self.node(child, nr, 0, next, next_pot, maybe_best);
    }
}
