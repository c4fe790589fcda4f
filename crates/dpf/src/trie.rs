//! The merged filter trie (DPF §2) and the engine around it.
//!
//! Each installed conjunction (a *rule*) is a path of canonical steps. Rules
//! are merged along their longest common prefix; at every node, `==` tests
//! of the same field are one *disjunction* (a map from constant to child),
//! other tests and indirect shifts are separate branches.
//!
//! Both engines explore the trie depth-first, branch and bound: every node
//! knows the highest priority below it (`pot`), so a branch that cannot beat
//! the best accept so far is skipped, and an accept that beats everything
//! still to explore ends the search.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::canon::{canonicalize, CAtom, CField, CShift, Canon, Step};
use crate::filter::Op;
use crate::jit::{self, Compiled};
use crate::{DpfError, Engine, Filter, FilterId};

pub type NodeId = usize;

/// Most rules (conjunctions) installed at once.
pub const MAX_RULES: usize = 1 << 20;

/// A disjunction with more keys than this is resolved by a perfect hash
/// table instead of a compare chain (the paper switches after three).
pub const CHAIN_MAX: usize = 4;

/// What a rule accepts with: higher `prio` wins, then the lower id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accept {
    pub prio: u16,
    pub id: FilterId,
}

impl Accept {
    /// True if `self` wins over `other`.
    pub fn beats(&self, other: &Accept) -> bool {
        self.prio > other.prio || (self.prio == other.prio && self.id < other.id)
    }
}

#[derive(Clone, Debug)]
pub struct Disj {
    pub field: CField,
    pub keys: BTreeMap<u32, NodeId>,
}

#[derive(Clone, Debug, Default)]
pub struct Node {
    pub accepts: Vec<Accept>,
    pub disjs: Vec<Disj>,
    pub tests: Vec<(CAtom, NodeId)>,
    pub shifts: Vec<(CShift, NodeId)>,
    /// Highest priority of any accept in this subtree (0 if none).
    pub pot: u16,
    /// Fewest bytes past the region base that any accept below needs.
    pub need: u32,
}

impl Node {
    fn new() -> Node {
        Node {
            need: u32::MAX,
            ..Node::default()
        }
    }

    pub fn is_leaf(&self) -> bool {
        self.disjs.is_empty() && self.tests.is_empty() && self.shifts.is_empty()
    }

    /// The accept that wins among those ending here.
    pub fn best_accept(&self) -> Option<Accept> {
        self.accepts
            .iter()
            .copied()
            .reduce(|a, b| if b.beats(&a) { b } else { a })
    }
}

#[derive(Clone, Debug)]
struct Rule {
    canon: Canon,
    prio: u16,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Times the trie was compiled to native code.
    pub compiles: u64,
    /// Inserts and deletes that only changed a hash table (no code).
    pub fast_updates: u64,
    /// Background compilations whose code came back for a trie that had
    /// changed meanwhile, and was dropped (see [`Dpf::set_lazy`]).
    pub compiles_outdated: u64,
    /// Background compilations that failed (a panic in the code
    /// generator): the interpreter goes on until the next change.
    pub compiles_failed: u64,
}

/// The trie's nodes as the code generator reads them: the live trie's, or a
/// copy compiled on another thread.
#[derive(Clone, Copy)]
pub(crate) struct Trie<'a> {
    nodes: &'a [Node],
}

impl<'a> Trie<'a> {
    pub(crate) fn node(&self, n: NodeId) -> &'a Node {
        &self.nodes[n]
    }

    pub(crate) fn root(&self) -> NodeId {
        ROOT
    }
}

/// A compilation running on a thread of its own, for the trie as it was at
/// `version`.
struct Pending {
    version: u64,
    thread: JoinHandle<Compiled>,
}

/// A DPF demultiplexer: `insert` filters, `demux` frames.
pub struct Dpf {
    engine: Engine,
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    filters: HashMap<FilterId, Vec<Rule>>,
    rules: usize,
    next_id: u32,
    compiled: Option<Compiled>,
    stats: Stats,
    /// With `Some(delay)`, a change that needs new code leaves the trie to
    /// the interpreter until [`Dpf::settle`] compiles it, once changes have
    /// paused for `delay` (or after 10 × `delay` of steady change): a burst of
    /// connections costs one compilation, not one each.
    lazy: Option<Duration>,
    /// While the code is stale: when it went stale and the latest change.
    stale: Option<(Instant, Instant)>,
    /// Counts the changes that needed new code: a compilation's result is
    /// taken only for the trie it was made from.
    version: u64,
    /// The lazy mode's compilation in the background, if one runs.
    pending: Option<Pending>,
}

const ROOT: NodeId = 0;

/// Puts the calling thread in `SCHED_IDLE`: a background compilation only
/// speeds classifying up, which the interpreter does meanwhile, and must not
/// take a CPU from the frames' way. At the multiplexer's priority, the two
/// daemons' compilations at the start of a connection held both CPUs of a
/// 2-CPU machine for a millisecond, and its transfer stood still. Where the
/// scheduler refuses, the thread runs as it is.
fn idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain system call on the calling thread (pid 0) with a valid
    // sched_param read during the call.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
}

impl Default for Dpf {
    fn default() -> Self {
        Dpf::new()
    }
}

impl Dpf {
    /// A demultiplexer using the JIT.
    pub fn new() -> Dpf {
        Dpf::with_engine(Engine::Jit)
    }

    pub fn with_engine(engine: Engine) -> Dpf {
        let mut d = Dpf {
            engine,
            nodes: vec![Node::new()],
            free: Vec::new(),
            filters: HashMap::new(),
            rules: 0,
            next_id: 0,
            compiled: None,
            stats: Stats::default(),
            lazy: None,
            stale: None,
            version: 0,
            pending: None,
        };
        d.recompile();
        d
    }

    /// Defers compilation after slow updates (see the `lazy` field); `None`
    /// compiles at once, the default. Lazily, the code is compiled on a
    /// thread of its own while the interpreter classifies: a compilation
    /// takes about a millisecond, which the caller's loop (a multiplexer
    /// moving frames) would otherwise stand still for.
    pub fn set_lazy(&mut self, delay: Option<Duration>) {
        self.lazy = delay;
        if delay.is_none() && self.stale.is_some() {
            self.pending = None;
            self.compile_now();
        }
    }

    /// Whether demux interprets while new code waits for [`Dpf::settle`].
    pub fn is_stale(&self) -> bool {
        self.stale.is_some()
    }

    /// In lazy mode: takes the code of a finished background compilation
    /// if the trie is still the one it was made from; starts one if changes
    /// have paused long enough, and compiles in place if they have gone on
    /// too long.
    pub fn settle(&mut self, now: Instant) {
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.thread.is_finished())
        {
            self.collect();
        }
        let (Some(delay), Some((first, last)), None) = (self.lazy, self.stale, &self.pending)
        else {
            return;
        };
        if now.saturating_duration_since(first) >= delay * 10 {
            // Steady change: code made meanwhile elsewhere would come back
            // outdated every time, while code made here (the trie stands
            // still for it) stays right through the changes that only fill
            // its hash tables.
            self.compile_now();
        } else if now.saturating_duration_since(last) >= delay {
            self.compile_in_background();
        }
    }

    /// Waits for a background compilation, if one runs, and takes its code
    /// as [`Dpf::settle`] would.
    pub fn finish_compile(&mut self) {
        self.collect();
    }

    fn compile_in_background(&mut self) {
        let nodes = self.nodes.clone();
        let spawned = std::thread::Builder::new()
            .name("exonet-dpf-jit".into())
            .spawn(move || {
                idle_priority();
                jit::compile(Trie { nodes: &nodes })
            });
        match spawned {
            Ok(thread) => {
                self.pending = Some(Pending {
                    version: self.version,
                    thread,
                })
            }
            // No thread to be had: compiled here, as in eager mode.
            Err(_) => self.compile_now(),
        }
    }

    fn collect(&mut self) {
        let Some(p) = self.pending.take() else { return };
        match p.thread.join() {
            Ok(code) if p.version == self.version => {
                self.stats.compiles += 1;
                self.compiled = Some(code);
                self.stale = None;
            }
            Ok(_) => self.stats.compiles_outdated += 1,
            Err(_) => {
                self.stats.compiles_failed += 1;
                // Not tried again before the next change.
                self.stale = None;
            }
        }
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn len(&self) -> usize {
        self.filters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Installs one filter; its priority is its number of atoms.
    pub fn insert(&mut self, f: &Filter) -> Result<FilterId, DpfError> {
        self.insert_any(std::slice::from_ref(f))
    }

    /// Installs the disjunction of `fs` under one id.
    pub fn insert_any(&mut self, fs: &[Filter]) -> Result<FilterId, DpfError> {
        self.insert_with(fs, None)
    }

    /// Installs the disjunction of `fs` with an explicit priority. An empty
    /// disjunction is allowed: it never matches (`ip and not ip`).
    pub fn insert_with(&mut self, fs: &[Filter], prio: Option<u16>) -> Result<FilterId, DpfError> {
        if self.rules + fs.len() > MAX_RULES {
            return Err(DpfError::TooManyFilters(self.rules + fs.len()));
        }
        let rules = fs
            .iter()
            .map(|f| {
                let canon = canonicalize(f)?;
                let prio = prio.unwrap_or(canon.atom_count().min(u16::MAX as usize) as u16);
                Ok(Rule { canon, prio })
            })
            .collect::<Result<Vec<_>, DpfError>>()?;
        let id = FilterId(self.next_id);
        self.next_id = self
            .next_id
            .checked_add(1)
            .ok_or(DpfError::TooManyFilters(u32::MAX as usize))?;
        let mut fast = true;
        for r in &rules {
            fast &= self.add_rule(r, id);
        }
        self.rules += rules.len();
        self.filters.insert(id, rules);
        if fast {
            self.stats.fast_updates += 1;
        } else {
            self.recompile();
        }
        Ok(id)
    }

    pub fn delete(&mut self, id: FilterId) -> Result<(), DpfError> {
        let rules = self.filters.remove(&id).ok_or(DpfError::NoSuchFilter(id))?;
        self.rules -= rules.len();
        let mut fast = true;
        for r in &rules {
            fast &= self.remove_rule(r, id);
        }
        if fast {
            self.stats.fast_updates += 1;
        } else {
            self.recompile();
        }
        Ok(())
    }

    /// Classifies a frame: the winning filter, if any accepts it.
    #[inline]
    pub fn demux(&self, frame: &[u8]) -> Option<FilterId> {
        match (&self.engine, &self.compiled) {
            (Engine::Jit, Some(c)) => c.run(frame),
            _ => self.interpret(frame),
        }
    }

    /// Classifies a batch of frames into `out` (as many as both hold). The
    /// JIT runs the whole batch in one call of its generated loop.
    pub fn demux_batch(&self, frames: &[&[u8]], out: &mut [Option<FilterId>]) {
        match (&self.engine, &self.compiled) {
            (Engine::Jit, Some(c)) => c.run_batch(frames, out),
            _ => {
                for (o, f) in out.iter_mut().zip(frames) {
                    *o = self.interpret(f);
                }
            }
        }
    }

    /// The reference interpreter, whatever the engine.
    pub fn interpret(&self, frame: &[u8]) -> Option<FilterId> {
        let mut best = None;
        self.walk(ROOT, frame, 0, &mut best);
        best.map(|a: Accept| a.id)
    }

    /// Evaluates every rule on its own, straight from the canonical form.
    pub fn brute_force(&self, frame: &[u8]) -> Option<FilterId> {
        let mut best: Option<Accept> = None;
        for (&id, rules) in &self.filters {
            for r in rules {
                let a = Accept { prio: r.prio, id };
                if r.canon.matches(frame) && best.is_none_or(|b| a.beats(&b)) {
                    best = Some(a);
                }
            }
        }
        best.map(|a| a.id)
    }

    /// Size in bytes of the generated code (0 with the interpreter).
    pub fn code_size(&self) -> usize {
        self.compiled.as_ref().map_or(0, |c| c.code_size())
    }

    /// Canonical rules, the trie, and the generated code size.
    pub fn explain(&self) -> String {
        let mut s = String::new();
        let mut ids: Vec<_> = self.filters.keys().copied().collect();
        ids.sort();
        let _ = writeln!(s, "canonical filters:");
        for id in ids {
            for r in &self.filters[&id] {
                let _ = writeln!(s, "  {id} prio {}: {}", r.prio, r.canon);
            }
        }
        let _ = writeln!(s, "trie ({} nodes):", self.nodes.len() - self.free.len());
        self.dump(ROOT, 1, &mut s);
        match &self.compiled {
            Some(c) => {
                let _ = writeln!(
                    s,
                    "native code: {} bytes, {} hash tables, {} compiles ({} dropped as outdated), {} fast updates",
                    c.code_size(),
                    c.tables(),
                    self.stats.compiles,
                    self.stats.compiles_outdated,
                    self.stats.fast_updates
                );
                let _ = write!(s, "{}", c.notes());
            }
            None => {
                let _ = writeln!(s, "engine: interpreter");
            }
        }
        s
    }

    fn dump(&self, n: NodeId, depth: usize, s: &mut String) {
        let node = &self.nodes[n];
        let pad = "  ".repeat(depth);
        for a in &node.accepts {
            let _ = writeln!(s, "{pad}accept {} (prio {})", a.id, a.prio);
        }
        for d in &node.disjs {
            if d.keys.len() == 1 {
                let (k, &c) = d.keys.iter().next().unwrap();
                let _ = writeln!(s, "{pad}{} == {k:#x}", d.field);
                self.dump(c, depth + 1, s);
                continue;
            }
            let how = if d.keys.len() > CHAIN_MAX {
                "hash"
            } else {
                "compare chain"
            };
            let _ = writeln!(
                s,
                "{pad}{} == one of {} keys ({how})",
                d.field,
                d.keys.len()
            );
            for (k, &c) in &d.keys {
                let _ = writeln!(s, "{pad}  == {k:#x}");
                self.dump(c, depth + 2, s);
            }
        }
        for (a, c) in &node.tests {
            let _ = writeln!(s, "{pad}{a}");
            self.dump(*c, depth + 1, s);
        }
        for (sh, c) in &node.shifts {
            let _ = writeln!(s, "{pad}{sh}");
            self.dump(*c, depth + 1, s);
        }
    }

    fn walk(&self, n: NodeId, frame: &[u8], base: usize, best: &mut Option<Accept>) {
        let node = &self.nodes[n];
        if best.is_some_and(|b| b.prio > node.pot) {
            return;
        }
        if let Some(a) = node.best_accept() {
            if best.is_none_or(|b| a.beats(&b)) {
                *best = Some(a);
            }
        }
        for d in &node.disjs {
            if let Some(v) = d.field.read(frame, base) {
                if let Some(&c) = d.keys.get(&v) {
                    self.walk(c, frame, base, best);
                }
            }
        }
        for (a, c) in &node.tests {
            if a.eval(frame, base) == Some(true) {
                self.walk(*c, frame, base, best);
            }
        }
        for (sh, c) in &node.shifts {
            if let Some(nb) = sh.apply(frame, base) {
                self.walk(*c, frame, nb, best);
            }
        }
    }

    fn alloc(&mut self) -> NodeId {
        match self.free.pop() {
            Some(n) => {
                self.nodes[n] = Node::new();
                n
            }
            None => {
                self.nodes.push(Node::new());
                self.nodes.len() - 1
            }
        }
    }

    /// Merges a rule into the trie. Returns true if the compiled code is
    /// still right: the rule only added a key to a hashed disjunction whose
    /// children are leaves or chains of `==` atoms ending in leaves (the
    /// paper's fast case), or another accept to such a leaf.
    fn add_rule(&mut self, r: &Rule, id: FilterId) -> bool {
        let mut n = ROOT;
        let mut created_at = None;
        for (i, step) in r.canon.steps.iter().enumerate() {
            let (next, created) = self.child(n, step);
            if created && created_at.is_none() {
                created_at = Some(i);
            }
            n = next;
        }
        let accept = Accept { prio: r.prio, id };
        self.nodes[n].accepts.push(accept);
        let path = self.path(&r.canon);
        self.refresh_added(&path, &r.canon.steps);
        match self.slot_table(&path, &r.canon.steps) {
            Some(j) if created_at.is_none_or(|i| i >= j) => {
                self.sync_leaf(&path, &r.canon.steps, j, accept.prio)
            }
            _ => false,
        }
    }

    /// Where the compiled code keeps the rule's leaf as a hash slot: the
    /// index `j` in `path` of the node whose hashed disjunction covers
    /// `steps[j..]`, all `==` atoms ending in a leaf.
    fn slot_table(&self, path: &[NodeId], steps: &[Step]) -> Option<usize> {
        let c = self.compiled.as_ref()?;
        if !self.nodes[*path.last()?].is_leaf() {
            return None;
        }
        let mut fields = Vec::new();
        for j in (0..steps.len()).rev() {
            let Step::Test(a) = steps[j] else { return None };
            if a.op != Op::Eq {
                return None;
            }
            fields.insert(0, a.field);
            if c.table_fields(path[j], a.field) == Some(&fields[..]) {
                return Some(j);
            }
        }
        None
    }

    /// Updates the hash slot of the rule's leaf in the table at `path[j]`.
    /// False if the code must be regenerated instead.
    fn sync_leaf(&mut self, path: &[NodeId], steps: &[Step], j: usize, prio: u16) -> bool {
        let leaf = *path.last().unwrap();
        let atoms: Vec<(CField, u32)> = steps[j..]
            .iter()
            .map(|s| match s {
                Step::Test(a) => (a.field, a.value),
                Step::Shift(_) => unreachable!("slot tables cover == atoms only"),
            })
            .collect();
        let best = self.nodes[leaf].best_accept();
        match self.compiled.as_mut() {
            Some(c) => c.set_leaf(path[j], &atoms, best, prio),
            None => false,
        }
    }

    /// The child of `n` along `step`, created if missing.
    fn child(&mut self, n: NodeId, step: &Step) -> (NodeId, bool) {
        let found = match step {
            Step::Test(a) if a.op == Op::Eq => self.nodes[n]
                .disjs
                .iter()
                .find(|d| d.field == a.field)
                .and_then(|d| d.keys.get(&a.value).copied()),
            Step::Test(a) => self.nodes[n]
                .tests
                .iter()
                .find(|(t, _)| t == a)
                .map(|&(_, c)| c),
            Step::Shift(s) => self.nodes[n]
                .shifts
                .iter()
                .find(|(t, _)| t == s)
                .map(|&(_, c)| c),
        };
        if let Some(c) = found {
            return (c, false);
        }
        let c = self.alloc();
        let node = &mut self.nodes[n];
        match step {
            Step::Test(a) if a.op == Op::Eq => {
                match node.disjs.iter_mut().find(|d| d.field == a.field) {
                    Some(d) => {
                        d.keys.insert(a.value, c);
                    }
                    None => node.disjs.push(Disj {
                        field: a.field,
                        keys: BTreeMap::from([(a.value, c)]),
                    }),
                }
            }
            Step::Test(a) => node.tests.push((*a, c)),
            Step::Shift(s) => node.shifts.push((*s, c)),
        }
        (c, true)
    }

    /// The nodes along a rule's path, root first.
    fn path(&self, canon: &Canon) -> Vec<NodeId> {
        let mut path = vec![ROOT];
        let mut n = ROOT;
        for step in &canon.steps {
            let node = &self.nodes[n];
            n = match step {
                Step::Test(a) if a.op == Op::Eq => node
                    .disjs
                    .iter()
                    .find(|d| d.field == a.field)
                    .and_then(|d| d.keys.get(&a.value).copied()),
                Step::Test(a) => node.tests.iter().find(|(t, _)| t == a).map(|&(_, c)| c),
                Step::Shift(s) => node.shifts.iter().find(|(t, _)| t == s).map(|&(_, c)| c),
            }
            .expect("rule path is in the trie");
            path.push(n);
        }
        path
    }

    /// Updates `pot` and `need` bottom-up along the path of a rule just
    /// added. Both only move one way on insert (`pot` up, `need` down), so
    /// each node looks at the one child on the path, not at all its children.
    fn refresh_added(&mut self, path: &[NodeId], steps: &[Step]) {
        let leaf = *path.last().unwrap();
        let (pot, need) = self.summarize(leaf);
        self.nodes[leaf].pot = pot;
        self.nodes[leaf].need = need;
        for w in (0..path.len() - 1).rev() {
            let (n, c) = (path[w], path[w + 1]);
            let (cpot, cneed) = (self.nodes[c].pot, self.nodes[c].need);
            let ext = match steps[w] {
                Step::Test(a) => a.field.end().max(cneed),
                Step::Shift(s) => s.field.end(),
            };
            let node = &mut self.nodes[n];
            node.pot = node.pot.max(cpot);
            node.need = node.need.min(ext);
        }
    }

    /// Recomputes `pot` and `need` bottom-up along a path after a delete.
    /// A node with many children keeps its old values: a `pot` too high
    /// only prunes less and a `need` too low only checks bounds later, so
    /// stale values are safe, and a delete stays O(path) instead of
    /// O(children).
    fn refresh_removed(&mut self, path: &[NodeId]) {
        for &n in path.iter().rev() {
            let node = &self.nodes[n];
            let children: usize = node.disjs.iter().map(|d| d.keys.len()).sum::<usize>()
                + node.tests.len()
                + node.shifts.len();
            if children > 64 {
                continue;
            }
            let (pot, need) = self.summarize(n);
            let node = &mut self.nodes[n];
            node.pot = pot;
            node.need = need;
        }
    }

    fn summarize(&self, n: NodeId) -> (u16, u32) {
        let node = &self.nodes[n];
        let mut pot = node.best_accept().map_or(0, |a| a.prio);
        let mut need = if node.accepts.is_empty() { u32::MAX } else { 0 };
        for d in &node.disjs {
            for &c in d.keys.values() {
                pot = pot.max(self.nodes[c].pot);
                need = need.min(d.field.end().max(self.nodes[c].need));
            }
        }
        for (a, c) in &node.tests {
            pot = pot.max(self.nodes[*c].pot);
            need = need.min(a.field.end().max(self.nodes[*c].need));
        }
        for (s, c) in &node.shifts {
            pot = pot.max(self.nodes[*c].pot);
            // The next region's needs are checked after the shift.
            need = need.min(s.field.end());
        }
        (pot, need)
    }

    /// Removes a rule's accept and prunes the nodes left empty. Returns true
    /// if the compiled code is still right: the leaf was a hash slot and
    /// nothing at or above its table went away.
    fn remove_rule(&mut self, r: &Rule, id: FilterId) -> bool {
        let path = self.path(&r.canon);
        let leaf = *path.last().unwrap();
        let table = self.slot_table(&path, &r.canon.steps);
        let node = &mut self.nodes[leaf];
        let i = node
            .accepts
            .iter()
            .position(|a| a.id == id && a.prio == r.prio)
            .expect("rule accept is in the trie");
        node.accepts.swap_remove(i);
        let mut fast = match table {
            Some(j) => self.sync_leaf(&path, &r.canon.steps, j, 0),
            None => false,
        };
        // Prune bottom-up every node with nothing left below it.
        for w in (1..path.len()).rev() {
            let (n, parent) = (path[w], path[w - 1]);
            let node = &self.nodes[n];
            if !(node.is_leaf() && node.accepts.is_empty()) {
                break;
            }
            // The edge to `n` is the rule's step into it: remove that key
            // alone (a connection's port under a disjunction of thousands
            // must not cost a walk over all of them).
            let p = &mut self.nodes[parent];
            match &r.canon.steps[w - 1] {
                Step::Test(a) if a.op == Op::Eq => {
                    if let Some(k) = p.disjs.iter().position(|d| d.field == a.field) {
                        p.disjs[k].keys.remove(&a.value);
                        if p.disjs[k].keys.is_empty() {
                            p.disjs.remove(k);
                        }
                    }
                }
                Step::Test(_) => p.tests.retain(|(_, c)| *c != n),
                Step::Shift(_) => p.shifts.retain(|(_, c)| *c != n),
            }
            self.free.push(n);
            // Nodes below the table live only in its slots; the table's
            // own node and those above it have code.
            if table.is_none_or(|j| w <= j) {
                fast = false;
            }
        }
        self.refresh_removed(&path[..path.len() - 1]);
        fast
    }

    fn recompile(&mut self) {
        self.version += 1;
        if self.lazy.is_some() && self.engine == Engine::Jit {
            let now = Instant::now();
            self.compiled = None;
            self.stale = Some(self.stale.map_or((now, now), |(first, _)| (first, now)));
            return;
        }
        self.compile_now();
    }

    fn compile_now(&mut self) {
        self.stale = None;
        self.compiled = match self.engine {
            Engine::Jit => {
                self.stats.compiles += 1;
                Some(jit::compile(Trie { nodes: &self.nodes }))
            }
            Engine::Interp => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_mode_interprets_until_changes_settle() {
        let mut d = Dpf::new();
        d.set_lazy(Some(Duration::from_millis(5)));
        let compiles = d.stats().compiles;
        let mut ids = Vec::new();
        for port in [80u32, 443, 8080] {
            let f = format!(
                "12:16 == 0x800 & 23:8 == 6 & SHIFT(14) & SHIFT((0:8 & 0xf) << 2) & 2:16 == {port}"
            );
            ids.push(d.insert(&f.parse().unwrap()).unwrap());
        }
        assert!(d.is_stale());
        let mut f = vec![0u8; 54];
        f[12] = 8;
        f[14] = 0x45;
        f[23] = 6;
        f[36..38].copy_from_slice(&443u16.to_be_bytes());
        // Right while stale (the interpreter), and after compiling.
        assert_eq!(d.demux(&f), Some(ids[1]));
        let t = Instant::now();
        d.settle(t);
        d.finish_compile();
        assert!(d.is_stale(), "changes have not paused yet");
        assert_eq!(d.code_size(), 0, "nothing compiled yet");
        d.settle(t + Duration::from_millis(6));
        // The compilation runs on its own thread; classifying goes on.
        assert_eq!(d.demux(&f), Some(ids[1]));
        d.finish_compile();
        assert!(!d.is_stale());
        assert!(d.code_size() > 0);
        assert_eq!(
            d.stats().compiles,
            compiles + 1,
            "one compilation for the burst"
        );
        assert_eq!(d.demux(&f), Some(ids[1]));
        // Steady change compiles after ten delays at the latest.
        d.delete(ids[0]).unwrap();
        d.settle(Instant::now() + Duration::from_millis(51));
        d.finish_compile();
        assert!(!d.is_stale());
        d.set_lazy(None);
        d.delete(ids[2]).unwrap();
        assert!(!d.is_stale(), "eager again");
    }

    #[test]
    fn code_for_a_trie_changed_meanwhile_is_dropped() {
        let mut d = Dpf::new();
        d.set_lazy(Some(Duration::from_millis(1)));
        let filter = |port: u16| {
            format!(
                "12:16 == 0x800 & 23:8 == 6 & SHIFT(14) & SHIFT((0:8 & 0xf) << 2) & 2:16 == {port}"
            )
            .parse()
            .unwrap()
        };
        let frame = |port: u16| {
            let mut f = vec![0u8; 54];
            f[12] = 8;
            f[14] = 0x45;
            f[23] = 6;
            f[36..38].copy_from_slice(&port.to_be_bytes());
            f
        };
        let a = d.insert(&filter(80)).unwrap();
        let compiles = d.stats().compiles;
        d.settle(Instant::now() + Duration::from_millis(2));
        // A change while the code for the trie with `a` alone is made.
        let b = d.insert(&filter(81)).unwrap();
        d.finish_compile();
        assert_eq!(d.stats().compiles_outdated, 1);
        assert_eq!(d.stats().compiles, compiles);
        assert!(d.is_stale());
        assert_eq!(d.demux(&frame(81)), Some(b));
        // The next settle compiles the trie as it is now.
        d.settle(Instant::now() + Duration::from_millis(2));
        d.finish_compile();
        assert!(!d.is_stale());
        assert_eq!(d.stats().compiles, compiles + 1);
        assert_eq!(d.demux(&frame(80)), Some(a));
        assert_eq!(d.demux(&frame(81)), Some(b));
        assert_eq!(d.demux(&frame(82)), None);
    }

    #[test]
    fn interpreter_prefers_the_more_specific_filter() {
        let mut d = Dpf::with_engine(Engine::Interp);
        let listen = d
            .insert(
                &"12:16 == 0x800 & 23:8 == 6 & SHIFT(14) & SHIFT((0:8 & 0xf) << 2) & 2:16 == 80"
                    .parse()
                    .unwrap(),
            )
            .unwrap();
        let conn = d
            .insert(&"12:16 == 0x800 & 23:8 == 6 & 26:32 == 0x0a000001 & SHIFT(14) & SHIFT((0:8 & 0xf) << 2) & 2:16 == 80 & 0:16 == 1234".parse().unwrap())
            .unwrap();
        let mut f = vec![0u8; 54];
        f[12] = 8;
        f[14] = 0x45;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&80u16.to_be_bytes());
        assert_eq!(d.demux(&f), Some(conn));
        f[35] = 1;
        assert_eq!(d.demux(&f), Some(listen));
        assert_eq!(d.demux(&f[..37]), None);
        d.delete(listen).unwrap();
        assert_eq!(d.demux(&f), None);
        d.delete(conn).unwrap();
        assert_eq!(d.nodes.len() - d.free.len(), 1);
    }
}
