//! Front end for the common tcpdump (libpcap) filter syntax, for Ethernet
//! (`DLT_EN10MB`) frames.
//!
//! [`compile`] turns an expression into a list of DPF conjunctions
//! ([`Filter`]s) whose disjunction is the expression: a frame matches the
//! expression when any returned filter [`Filter::matches`] it. An empty list
//! never matches (e.g. `ip and not ip`); the empty expression, like tcpdump
//! with no filter, matches every frame (one filter, `0:8 >= 0`).
//!
//! # Grammar
//!
//! As in libpcap: `and`/`&&` and `or`/`||` have equal precedence and
//! associate to the left; `not`/`!` binds tighter; parentheses group.
//! Primitives:
//!
//! ```text
//! ip  arp  rarp  tcp  udp  sctp  icmp  igmp  igrp  pim  vrrp  carp
//! atalk  aarp  decnet  lat  sca  moprc  mopdl  iso  stp  ipx  netbeui
//! [ip|arp|rarp] [src|dst|src or dst|src and dst] host A.B.C.D
//! [ip|arp|rarp] [src|dst|...] net A.B.C.D/len | A.B.C.D mask M.M.M.M | A.B[.C]
//! [ip|arp|rarp] src|dst A.B.C.D              (host implied)
//! [tcp|udp|sctp] [src|dst|...] port N|name
//! [tcp|udp|sctp] [src|dst|...] portrange N-M
//! [ip] proto N|\name      ether proto N|\name      (also link/ppp/slip proto)
//! ether [src|dst|...] host|src|dst aa:bb:cc:dd:ee:ff
//! ```
//!
//! Numbers are decimal, `0x` hex or `0`-prefixed octal, as in libpcap. A
//! bare address or number after `and`/`or`/`not` reuses the qualifiers of
//! the primitive before it, exactly as libpcap does (`host 10.0.0.1 or
//! 10.0.0.2`, `port 80 or 443`, `ip proto 6 or 17`, `port 80 and (host
//! 10.0.0.1 or 10.0.0.2) or 443`); a parenthesised expression hands on the
//! qualifiers that were in force before its `(`.
//!
//! Host and network names are not resolved (an error says so). Port names
//! come from a built-in copy of a few entries of Debian's `/etc/services`
//! (tcp-only names such as `http` and `ssh` mean the tcp port, as they do in
//! libpcap there), protocol names from `/etc/protocols`, and Ethernet
//! protocol names from libpcap's built-in table.
//!
//! # Semantics
//!
//! Each primitive is libpcap's definition for Ethernet, with no VLAN
//! handling: `ip` is `12:16 == 0x800`; `tcp` is `ip and ip[9] == 6`; `host`
//! covers IPv4 (source 26, destination 30), ARP and RARP (sender 28, target
//! 38); `port` requires tcp, udp or sctp, a zero fragment offset
//! (`(20:16 & 0x1fff) == 0`: no non-first fragment matches a port), and reads
//! the ports past the variable-length IP header with `SHIFT(14)` and
//! `SHIFT((0:8 & 0xf) << 2)`; `ether proto N` for `N <= 1500` is libpcap's
//! 802.2 LLC test; a constant too wide for its field (`ip proto 300`) never
//! matches, as in libpcap.
//!
//! `not` is pushed down with De Morgan: `not (g1 & .. & gn)` is the OR over
//! `i` of `g1 & .. & g(i-1) & !gi`, which keeps each guard (and every shift)
//! in front of the atom it guards, so each conjunction is exact on its own.
//! The result is kept in disjunctive normal form, simplified (contradictions
//! and duplicates removed, subsumed conjunctions dropped, `P & x` merged
//! with `P & !x`), and bounded by [`MAX_CONJUNCTIONS`].
//!
//! # Differences from libpcap
//!
//! * IPv6: libpcap's `tcp`, `udp`, `sctp`, `pim`, `port`, `portrange` and
//!   `proto N` also match IPv6 (ethertype `0x86dd`) packets; these filters
//!   only match IPv4, so an IPv6 frame never matches them.
//! * Truncated frames: DPF rejects only the conjunction one of whose loads
//!   falls outside the frame, while a libpcap program returns 0 at its first
//!   out-of-bounds load. The results agree on every frame long enough for
//!   the loads libpcap makes on it, and can differ only on a truncated one:
//!   `arp dst host 10.0.0.9 or ether src 02:00:00:00:00:01` on an ARP frame
//!   from that Ethernet address cut before the ARP target address matches
//!   here but not in libpcap. For the same reason a filter that is always
//!   true is `0:8 >= 0` here, which does not match an empty frame.
//! * Not supported (an error says so): name resolution, IPv6 addresses,
//!   `gateway`, `protochain`, `less`/`greater`/`len`, `vlan`/`mpls`/`pppoe`,
//!   `broadcast`/`multicast`, byte-offset arithmetic (`ip[9] = 6`), 802.11,
//!   names in port ranges, and MAC addresses other than `a:b:c:d:e:f`.

use std::cell::Cell;
use std::collections::HashSet;

use crate::filter::{Atom, Elem, Field, Filter, Op, Shift, Width};
use crate::DpfError;

/// Most conjunctions one expression may expand to.
pub const MAX_CONJUNCTIONS: usize = 256;

/// Most conjunctions an intermediate product may have before simplification.
const MAX_RAW_PRODUCT: usize = 1 << 16;
/// Most conjunctions simplified pairwise (quadratic) in one step.
const MAX_SIMPLIFY: usize = 4096;
/// Deepest nesting of parentheses and `not`s.
const MAX_DEPTH: usize = 256;
/// Most conjunction pairs compared while simplifying one expression, so
/// that no expression takes more than a second or so to compile.
const MAX_WORK: u64 = 100_000_000;

thread_local! {
    static WORK: Cell<u64> = const { Cell::new(0) };
}

fn charge(units: u64) -> Result<(), DpfError> {
    let total = WORK.with(|w| {
        let t = w.get().saturating_add(units);
        w.set(t);
        t
    });
    if total > MAX_WORK {
        return Err(DpfError::Unsupported(format!(
            "expression too complex: more than {MAX_WORK} steps to simplify"
        )));
    }
    Ok(())
}

const ETHERTYPE_IP: u32 = 0x0800;
const ETHERTYPE_ARP: u32 = 0x0806;
const ETHERTYPE_REVARP: u32 = 0x8035;
const ETHERMTU: u32 = 1500;

/// Compiles a tcpdump expression into the conjunctions whose disjunction it
/// is (see the module documentation for the grammar and semantics): a frame
/// matches the expression when any returned filter matches it.
///
/// This equals libpcap's verdict for IPv4, ARP, RARP and other non-IPv6
/// frames, except on a truncated frame: a conjunction with a load past the
/// end of the frame is false while the others still count, whereas libpcap
/// rejects the frame at its first out-of-bounds load.
///
/// Errors: [`DpfError::Parse`] (with the byte offset) for bad syntax and for
/// what libpcap also rejects (unknown names, `tcp host ..`, non-network bits
/// in a mask...); [`DpfError::Unsupported`] for valid tcpdump this front end
/// does not handle, and for expressions that expand to more than
/// [`MAX_CONJUNCTIONS`] conjunctions; [`DpfError::TooManyElems`] when one
/// conjunction needs more than 64 elements.
pub fn compile(expr: &str) -> Result<Vec<Filter>, DpfError> {
    WORK.with(|w| w.set(0));
    let toks = lex(expr)?;
    let mut p = Parser {
        len: expr.len(),
        toks,
        i: 0,
        depth: 0,
    };
    let dnf = p.parse()?;
    let filters: Vec<Filter> = dnf.iter().map(to_filter).collect();
    for f in &filters {
        f.validate()?;
    }
    Ok(filters)
}

/// One conjunction per line, in `Filter`'s text syntax.
pub fn explain_dnf(filters: &[Filter]) -> String {
    let mut s = String::new();
    for f in filters {
        s.push_str(&f.to_string());
        s.push('\n');
    }
    s
}

// ---------------------------------------------------------------------------
// Conjunctions of layered atoms.

/// Which base an atom is relative to: the frame, or the transport header
/// (`SHIFT(14) & SHIFT((0:8 & 0xf) << 2)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Layer {
    Link,
    Transport,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct LAtom {
    layer: Layer,
    atom: Atom,
}

impl LAtom {
    fn negated(self) -> LAtom {
        LAtom {
            layer: self.layer,
            atom: Atom {
                op: self.atom.op.negate(),
                ..self.atom
            },
        }
    }

    fn same_field(&self, o: &LAtom) -> bool {
        self.layer == o.layer && self.atom.field == o.atom.field
    }

    /// One past the last byte read, relative to the layer's base.
    fn end(&self) -> u32 {
        self.atom.field.offset + self.atom.field.width.bytes()
    }
}

/// A conjunction, in guard order: link atoms first, then transport atoms.
type Conj = Vec<LAtom>;
/// A disjunction of conjunctions; empty is false, `[[]]` is true.
type Dnf = Vec<Conj>;

fn true_dnf() -> Dnf {
    vec![Vec::new()]
}

/// `(offset:width & mask) op value`, with a constant that does not fit the
/// field turned into the atom that is always false (`< 0`) or always true
/// when the field is inside the frame (`>= 0`), as libpcap's comparison of
/// a narrow load with a wide constant is.
fn atom(layer: Layer, offset: u32, width: Width, mask: u32, op: Op, value: u64) -> LAtom {
    let full = width.full_mask() as u64;
    let fits = match op {
        Op::Eq | Op::Ne => value & !(mask as u64 & full) == 0,
        _ => value <= full,
    };
    let (field, op, value) = if fits {
        (Field::masked(offset, width, mask), op, value as u32)
    } else {
        let always = matches!(op, Op::Ne | Op::Lt | Op::Le);
        let op = if always { Op::Ge } else { Op::Lt };
        (Field::new(offset, width), op, 0)
    };
    LAtom {
        layer,
        atom: Atom { field, op, value },
    }
}

fn link(offset: u32, width: Width, op: Op, value: u64) -> LAtom {
    atom(Layer::Link, offset, width, width.full_mask(), op, value)
}

fn transport(offset: u32, width: Width, op: Op, value: u64) -> LAtom {
    atom(
        Layer::Transport,
        offset,
        width,
        width.full_mask(),
        op,
        value,
    )
}

fn conj(atoms: &[LAtom]) -> Dnf {
    simplify_conj(atoms.to_vec()).into_iter().collect()
}

/// The set of values an atom accepts, over its width's domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VSet {
    Empty,
    One(u32),
    Range(u32, u32),
    Except(u32),
}

fn vset(a: &Atom) -> VSet {
    let max = a.field.width.full_mask();
    let v = a.value;
    match a.op {
        Op::Eq if v & !a.field.mask != 0 || v > max => VSet::Empty,
        Op::Eq => VSet::One(v),
        Op::Ne => VSet::Except(v),
        Op::Lt if v == 0 => VSet::Empty,
        Op::Lt => VSet::Range(0, (v - 1).min(max)),
        Op::Le => VSet::Range(0, v.min(max)),
        Op::Gt if v >= max => VSet::Empty,
        Op::Gt => VSet::Range(v + 1, max),
        Op::Ge if v > max => VSet::Empty,
        Op::Ge => VSet::Range(v, max),
    }
}

fn contains(s: VSet, v: u32) -> bool {
    match s {
        VSet::Empty => false,
        VSet::One(w) => v == w,
        VSet::Range(l, h) => l <= v && v <= h,
        VSet::Except(w) => v != w,
    }
}

/// `a ⊆ b` over the domain `0..=max`.
fn subset(a: VSet, b: VSet, max: u32) -> bool {
    match (a, b) {
        (VSet::Empty, _) => true,
        (_, VSet::Empty) => false,
        (VSet::One(v), b) => contains(b, v),
        (VSet::Range(l, h), VSet::One(v)) => l == v && h == v,
        (VSet::Range(l, h), VSet::Range(l2, h2)) => l2 <= l && h <= h2,
        (VSet::Range(l, h), VSet::Except(v)) => v < l || v > h,
        (VSet::Except(_), VSet::One(_)) => false,
        (VSet::Except(v), VSet::Range(l2, h2)) => {
            (l2 == 0 || (l2 == 1 && v == 0)) && (h2 == max || (h2 == max - 1 && v == max))
        }
        (VSet::Except(v), VSet::Except(w)) => v == w,
    }
}

fn disjoint(a: VSet, b: VSet) -> bool {
    match (a, b) {
        (VSet::Empty, _) | (_, VSet::Empty) => true,
        (VSet::One(v), s) | (s, VSet::One(v)) => !contains(s, v),
        (VSet::Range(l, h), VSet::Range(l2, h2)) => h < l2 || h2 < l,
        (VSet::Range(l, h), VSet::Except(v)) | (VSet::Except(v), VSet::Range(l, h)) => {
            l == h && l == v
        }
        (VSet::Except(_), VSet::Except(_)) => false,
    }
}

/// Puts a conjunction in guard order and removes what is easy to remove;
/// `None` if it can never be true.
fn simplify_conj(c: Conj) -> Option<Conj> {
    let mut atoms: Vec<LAtom> = Vec::with_capacity(c.len());
    for layer in [Layer::Link, Layer::Transport] {
        for a in c.iter().filter(|a| a.layer == layer) {
            if !atoms.contains(a) {
                atoms.push(*a);
            }
        }
    }
    let sets: Vec<VSet> = atoms.iter().map(|a| vset(&a.atom)).collect();
    if sets.contains(&VSet::Empty) {
        return None;
    }
    let n = atoms.len();
    for i in 0..n {
        for j in i + 1..n {
            if atoms[i].same_field(&atoms[j]) && disjoint(sets[i], sets[j]) {
                return None;
            }
        }
    }
    // Drop an atom implied by another on the same field (the later of two
    // equivalent ones).
    let mut keep = vec![true; n];
    for i in 0..n {
        let max = atoms[i].atom.field.width.full_mask();
        for j in 0..n {
            if i != j
                && keep[j]
                && atoms[i].same_field(&atoms[j])
                && subset(sets[j], sets[i], max)
                && (j < i || !subset(sets[i], sets[j], max))
            {
                keep[i] = false;
                break;
            }
        }
    }
    // Drop a field-is-in-the-frame atom (`>= 0`) made moot by another atom
    // of the same layer that reads at least as far.
    for i in 0..n {
        if keep[i] && sets[i] == VSet::Range(0, atoms[i].atom.field.width.full_mask()) {
            let moot = (0..n).any(|j| {
                j != i
                    && keep[j]
                    && atoms[j].layer == atoms[i].layer
                    && atoms[j].end() >= atoms[i].end()
            });
            if moot {
                keep[i] = false;
            }
        }
    }
    Some(
        atoms
            .into_iter()
            .zip(keep)
            .filter_map(|(a, k)| k.then_some(a))
            .collect(),
    )
}

fn too_complex(n: usize) -> DpfError {
    DpfError::Unsupported(format!(
        "expression too complex: {n} conjunctions (at most {MAX_CONJUNCTIONS})"
    ))
}

fn sorted_key(c: &Conj) -> Vec<LAtom> {
    let mut k = c.clone();
    k.sort();
    k
}

/// `a ⊆ b` for sorted, duplicate-free atom lists.
fn key_subset(a: &[LAtom], b: &[LAtom]) -> bool {
    if a.len() > b.len() {
        return false;
    }
    let mut j = 0;
    for x in a {
        while j < b.len() && b[j] < *x {
            j += 1;
        }
        if j == b.len() || b[j] != *x {
            return false;
        }
        j += 1;
    }
    true
}

/// If `a` and `b` (sorted keys of equal length) differ in exactly one atom
/// and those two atoms are negations of each other, the atom of `a`.
fn complementary(a: &[LAtom], b: &[LAtom]) -> Option<LAtom> {
    let (mut i, mut j) = (0, 0);
    let (mut only_a, mut only_b) = (None, None);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j == b.len() || (i < a.len() && a[i] < b[j]) {
            if only_a.replace(a[i]).is_some() {
                return None;
            }
            i += 1;
        } else {
            if only_b.replace(b[j]).is_some() {
                return None;
            }
            j += 1;
        }
    }
    match (only_a, only_b) {
        (Some(x), Some(y)) if x.negated() == y => Some(x),
        _ => None,
    }
}

/// Removes duplicate and subsumed conjunctions and merges complementary
/// pairs; errs past the size bound.
fn simplify_dnf(d: Dnf) -> Result<Dnf, DpfError> {
    let mut seen = HashSet::new();
    let mut d: Dnf = d
        .into_iter()
        .filter(|c| seen.insert(sorted_key(c)))
        .collect();
    if d.iter().any(|c| c.is_empty()) {
        return Ok(true_dnf());
    }
    if d.len() > MAX_SIMPLIFY {
        return Err(too_complex(d.len()));
    }
    loop {
        // Drop every conjunction that another one implies.
        let keys: Vec<Vec<LAtom>> = d.iter().map(sorted_key).collect();
        let n = d.len();
        charge((n * n) as u64)?;
        let mut keep = vec![true; n];
        for i in 0..n {
            for j in 0..n {
                if i != j && keep[j] && key_subset(&keys[j], &keys[i]) {
                    keep[i] = false;
                    break;
                }
            }
        }
        let (d2, keys): (Dnf, Vec<Vec<LAtom>>) = d
            .into_iter()
            .zip(keys)
            .zip(keep)
            .filter_map(|(ck, k)| k.then_some(ck))
            .unzip();
        d = d2;
        // Merge pairs `P & x`, `P & !x` into `P`, then start over.
        if d.len() > 512 {
            return Ok(d);
        }
        let n = d.len();
        charge((n * n / 2) as u64)?;
        let mut used = vec![false; n];
        let mut merged: Vec<(usize, LAtom)> = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                if used[i] {
                    break;
                }
                if !used[j] && keys[i].len() == keys[j].len() {
                    if let Some(x) = complementary(&keys[i], &keys[j]) {
                        used[i] = true;
                        used[j] = true;
                        merged.push((i, x));
                    }
                }
            }
        }
        if merged.is_empty() {
            return Ok(d);
        }
        let mut next: Dnf = d
            .iter()
            .enumerate()
            .filter(|(i, _)| !used[*i])
            .map(|(_, c)| c.clone())
            .collect();
        for (i, x) in merged {
            let c: Conj = d[i].iter().copied().filter(|a| *a != x).collect();
            match simplify_conj(c) {
                Some(c) if c.is_empty() => return Ok(true_dnf()),
                Some(c) => next.push(c),
                None => {}
            }
        }
        d = next;
    }
}

fn bounded(d: Dnf) -> Result<Dnf, DpfError> {
    if d.len() > MAX_CONJUNCTIONS {
        Err(too_complex(d.len()))
    } else {
        Ok(d)
    }
}

fn and(a: Dnf, b: Dnf) -> Result<Dnf, DpfError> {
    let product = a.len().saturating_mul(b.len());
    if product > MAX_RAW_PRODUCT {
        return Err(too_complex(product));
    }
    charge(product as u64)?;
    let mut out = Vec::with_capacity(product);
    for x in &a {
        for y in &b {
            let mut c = x.clone();
            c.extend_from_slice(y);
            if let Some(c) = simplify_conj(c) {
                out.push(c);
            }
        }
    }
    bounded(simplify_dnf(out)?)
}

fn or(mut a: Dnf, b: Dnf) -> Result<Dnf, DpfError> {
    a.extend(b);
    bounded(simplify_dnf(a)?)
}

/// `not (g1 & .. & gn)` = OR over i of `g1 & .. & g(i-1) & !gi`.
fn negate_conj(c: &Conj) -> Dnf {
    let mut out = Vec::new();
    for i in 0..c.len() {
        let mut d = c[..i].to_vec();
        d.push(c[i].negated());
        if let Some(d) = simplify_conj(d) {
            out.push(d);
        }
    }
    out
}

fn not(d: Dnf) -> Result<Dnf, DpfError> {
    let mut acc = true_dnf();
    for c in &d {
        acc = and(acc, negate_conj(c))?;
        if acc.is_empty() {
            break;
        }
    }
    Ok(acc)
}

fn to_filter(c: &Conj) -> Filter {
    let mut f = Filter::new();
    if c.is_empty() {
        return f.atom(0, Width::U8, Op::Ge, 0);
    }
    for a in c.iter().filter(|a| a.layer == Layer::Link) {
        f.elems.push(Elem::Atom(a.atom));
    }
    if c.iter().any(|a| a.layer == Layer::Transport) {
        f.elems.push(Elem::Shift(Shift::Const(14)));
        f.elems.push(Elem::Shift(Shift::Indirect {
            field: Field::masked(0, Width::U8, 0x0f),
            shl: 2,
        }));
        for a in c.iter().filter(|a| a.layer == Layer::Transport) {
            f.elems.push(Elem::Atom(a.atom));
        }
    }
    f
}

// ---------------------------------------------------------------------------
// libpcap's primitives for DLT_EN10MB.

/// `gen_ether_linktype`: the Ethernet type/length field, or an 802.2 LLC
/// SAP for values up to 1500.
fn ether_type(t: u32) -> Result<Dnf, DpfError> {
    let llc = link(12, Width::U16, Op::Le, ETHERMTU as u64);
    let snap = |org: u32, ptype: u32| {
        let w0 = 0xaaaa_0300 | (org >> 16);
        let w1 = ((org & 0xffff) << 16) | ptype;
        [
            link(14, Width::U32, Op::Eq, w0 as u64),
            link(18, Width::U32, Op::Eq, w1 as u64),
        ]
    };
    match t {
        // LLCSAP_ISONS, LLCSAP_IP, LLCSAP_NETBEUI: DSAP and SSAP.
        0xfe | 0x06 | 0xf0 => Ok(conj(&[
            llc,
            link(14, Width::U16, Op::Eq, ((t << 8) | t) as u64),
        ])),
        // LLCSAP_IPX: Ethernet_II, raw 802.3, 802.2 and SNAP encapsulations.
        0xe0 => {
            let s = snap(0, 0x8137);
            let d = or(
                conj(&[llc, link(14, Width::U8, Op::Eq, 0xe0)]),
                conj(&[llc, link(14, Width::U16, Op::Eq, 0xffff)]),
            )?;
            let d = or(d, conj(&[llc, s[0], s[1]]))?;
            or(d, conj(&[link(12, Width::U16, Op::Eq, 0x8137)]))
        }
        // ETHERTYPE_ATALK, ETHERTYPE_AARP: Ethernet_II or SNAP.
        0x809b | 0x80f3 => {
            let s = if t == 0x809b {
                snap(0x080007, t)
            } else {
                snap(0, t)
            };
            or(
                conj(&[llc, s[0], s[1]]),
                conj(&[link(12, Width::U16, Op::Eq, t as u64)]),
            )
        }
        t if t <= ETHERMTU => Ok(conj(&[llc, link(14, Width::U8, Op::Eq, t as u64)])),
        t => Ok(conj(&[link(12, Width::U16, Op::Eq, t as u64)])),
    }
}

/// `ip and ip[9] == p`.
fn ip_proto(p: u32) -> Result<Dnf, DpfError> {
    and(
        ether_type(ETHERTYPE_IP)?,
        conj(&[link(23, Width::U8, Op::Eq, p as u64)]),
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Default,
    Src,
    Dst,
    Or,
    And,
}

/// `gen_hostop`: the address fields at `src_off`/`dst_off` past the
/// Ethernet header of frames of type `et`.
fn hostop(
    addr: u32,
    mask: u32,
    dir: Dir,
    et: u32,
    src_off: u32,
    dst_off: u32,
) -> Result<Dnf, DpfError> {
    let one = |off: u32| -> Result<Dnf, DpfError> {
        let a = if mask == 0 {
            link(14 + off, Width::U32, Op::Ge, 0)
        } else {
            atom(Layer::Link, 14 + off, Width::U32, mask, Op::Eq, addr as u64)
        };
        and(ether_type(et)?, conj(&[a]))
    };
    match dir {
        Dir::Src => one(src_off),
        Dir::Dst => one(dst_off),
        Dir::And => and(one(src_off)?, one(dst_off)?),
        Dir::Default | Dir::Or => or(one(src_off)?, one(dst_off)?),
    }
}

/// `gen_portrangeop`: ip proto `proto`, not a non-first fragment, and the
/// port(s) in `lo..=hi`.
fn portop(lo: u32, hi: u32, proto: u32, dir: Dir) -> Result<Dnf, DpfError> {
    let guard = conj(&[
        link(12, Width::U16, Op::Eq, ETHERTYPE_IP as u64),
        link(23, Width::U8, Op::Eq, proto as u64),
        atom(Layer::Link, 20, Width::U16, 0x1fff, Op::Eq, 0),
    ]);
    let at = |off: u32| {
        if lo == hi {
            conj(&[transport(off, Width::U16, Op::Eq, lo as u64)])
        } else {
            conj(&[
                transport(off, Width::U16, Op::Ge, lo as u64),
                transport(off, Width::U16, Op::Le, hi as u64),
            ])
        }
    };
    let ports = match dir {
        Dir::Src => at(0),
        Dir::Dst => at(2),
        Dir::And => and(at(0), at(2))?,
        Dir::Default | Dir::Or => or(at(0), at(2))?,
    };
    and(guard, ports)
}

/// `gen_port`/`gen_portrange`; `proto` `None` is tcp, udp or sctp.
fn ports(lo: u32, hi: u32, proto: Option<u32>, dir: Dir) -> Result<Dnf, DpfError> {
    let (lo, hi) = (lo.min(hi), lo.max(hi));
    match proto {
        Some(p) => portop(lo, hi, p, dir),
        None => {
            let d = or(portop(lo, hi, 6, dir)?, portop(lo, hi, 17, dir)?)?;
            or(d, portop(lo, hi, 132, dir)?)
        }
    }
}

/// `gen_ehostop`: Ethernet source (offset 6) and/or destination (0).
fn ehostop(mac: [u8; 6], dir: Dir) -> Result<Dnf, DpfError> {
    let one = |off: u32| {
        let hi = u16::from_be_bytes([mac[0], mac[1]]) as u64;
        let lo = u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]) as u64;
        conj(&[
            link(off, Width::U16, Op::Eq, hi),
            link(off + 2, Width::U32, Op::Eq, lo),
        ])
    };
    match dir {
        Dir::Src => Ok(one(6)),
        Dir::Dst => Ok(one(0)),
        Dir::And => and(one(6), one(0)),
        Dir::Default | Dir::Or => or(one(6), one(0)),
    }
}

// ---------------------------------------------------------------------------
// Name tables.

/// Service names, as in Debian's `/etc/services`: `(name, port, proto)`
/// with proto `None` when both tcp and udp list the name on the same port.
const SERVICES: &[(&str, u32, Option<u32>)] = &[
    ("ftp-data", 20, Some(6)),
    ("ftp", 21, Some(6)),
    ("ssh", 22, Some(6)),
    ("telnet", 23, Some(6)),
    ("smtp", 25, Some(6)),
    ("domain", 53, None),
    ("bootps", 67, Some(17)),
    ("bootpc", 68, Some(17)),
    ("tftp", 69, Some(17)),
    ("http", 80, Some(6)),
    ("www", 80, Some(6)),
    ("pop3", 110, Some(6)),
    ("ntp", 123, Some(17)),
    ("imap2", 143, Some(6)),
    ("imap", 143, Some(6)),
    ("snmp", 161, None),
    ("ldap", 389, None),
    ("https", 443, None),
    ("syslog", 514, Some(17)),
    ("submission", 587, Some(6)),
    ("imaps", 993, Some(6)),
    ("pop3s", 995, Some(6)),
];

/// IP protocol names, as in `/etc/protocols`.
const IP_PROTOS: &[(&str, u32)] = &[
    ("ip", 0),
    ("icmp", 1),
    ("igmp", 2),
    ("tcp", 6),
    ("udp", 17),
    ("ipv6", 41),
    ("gre", 47),
    ("esp", 50),
    ("ah", 51),
    ("ipv6-icmp", 58),
    ("ospf", 89),
    ("pim", 103),
    ("vrrp", 112),
    ("sctp", 132),
    ("udplite", 136),
];

/// libpcap's built-in Ethernet protocol names, then its LLC SAP names.
const ETHER_PROTOS: &[(&str, u32)] = &[
    ("aarp", 0x80f3),
    ("arp", 0x0806),
    ("atalk", 0x809b),
    ("decnet", 0x6003),
    ("ip", 0x0800),
    ("ip6", 0x86dd),
    ("lat", 0x6004),
    ("loopback", 0x9000),
    ("mopdl", 0x6001),
    ("moprc", 0x6002),
    ("rarp", 0x8035),
    ("sca", 0x6007),
    ("iso", 0xfe),
    ("stp", 0x42),
    ("ipx", 0xe0),
    ("netbeui", 0xf0),
];

fn lookup(table: &[(&str, u32)], name: &str) -> Option<u32> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

// ---------------------------------------------------------------------------
// Lexer (after libpcap's scanner.l).

/// Protocol names usable as a qualifier or, alone, as a primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pn {
    Default,
    Link,
    Ip,
    Arp,
    Rarp,
    Tcp,
    Udp,
    Sctp,
    /// A primitive that is `ip proto N` (IPv4 only in libpcap too, except pim).
    IpProto(&'static str, u32),
    /// A primitive that is `ether proto N`.
    LinkType(&'static str, u32),
}

impl Pn {
    fn name(self) -> &'static str {
        match self {
            Pn::Default => "(default)",
            Pn::Link => "ether",
            Pn::Ip => "ip",
            Pn::Arp => "arp",
            Pn::Rarp => "rarp",
            Pn::Tcp => "tcp",
            Pn::Udp => "udp",
            Pn::Sctp => "sctp",
            Pn::IpProto(n, _) | Pn::LinkType(n, _) => n,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kw {
    P(Pn),
    Src,
    Dst,
    Host,
    Net,
    Mask,
    Port,
    Portrange,
    Proto,
    /// A libpcap keyword this front end does not support.
    Unsup(&'static str),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Kw(Kw),
    Num(u32),
    /// A dotted IPv4 address or prefix (`10.1`, `10.0.0.1`).
    Hid(String),
    Eid([u8; 6]),
    /// A name, or anything escaped with a backslash.
    Id(String),
    And,
    Or,
    Not,
    LParen,
    RParen,
    Slash,
    /// Arithmetic punctuation, which is not supported.
    Other(String),
}

const UNSUPPORTED_KEYWORDS: &[&str] = &[
    "ip6",
    "icmp6",
    "radio",
    "ah",
    "esp",
    "esis",
    "es-is",
    "isis",
    "is-is",
    "l1",
    "l2",
    "iih",
    "lsp",
    "snp",
    "csnp",
    "psnp",
    "clnp",
    "protochain",
    "gateway",
    "type",
    "subtype",
    "direction",
    "dir",
    "address1",
    "addr1",
    "address2",
    "addr2",
    "address3",
    "addr3",
    "address4",
    "addr4",
    "ra",
    "ta",
    "less",
    "greater",
    "byte",
    "broadcast",
    "multicast",
    "len",
    "length",
    "inbound",
    "outbound",
    "ifindex",
    "vlan",
    "mpls",
    "pppoed",
    "pppoes",
    "geneve",
    "vxlan",
    "lane",
    "llc",
    "metac",
    "bcc",
    "oam",
    "oamf4",
    "oamf4ec",
    "oamf4sc",
    "sc",
    "ilmic",
    "vpi",
    "vci",
    "connectmsg",
    "metaconnect",
    "on",
    "ifname",
    "rnr",
    "rulenum",
    "reason",
    "rset",
    "ruleset",
    "srnr",
    "srulenum",
    "action",
    "fisu",
    "lssu",
    "lsu",
    "msu",
    "hfisu",
    "hlssu",
    "hmsu",
    "sio",
    "opc",
    "dpc",
    "sls",
    "hsio",
    "hopc",
    "hdpc",
    "hsls",
    "batadv",
];

fn keyword(s: &str) -> Option<Tok> {
    let kw = match s {
        "and" => return Some(Tok::And),
        "or" => return Some(Tok::Or),
        "not" => return Some(Tok::Not),
        "src" => Kw::Src,
        "dst" => Kw::Dst,
        "host" => Kw::Host,
        "net" => Kw::Net,
        "mask" => Kw::Mask,
        "port" => Kw::Port,
        "portrange" => Kw::Portrange,
        "proto" => Kw::Proto,
        "ether" | "link" | "ppp" | "slip" | "fddi" | "tr" | "wlan" => Kw::P(Pn::Link),
        "ip" => Kw::P(Pn::Ip),
        "arp" => Kw::P(Pn::Arp),
        "rarp" => Kw::P(Pn::Rarp),
        "tcp" => Kw::P(Pn::Tcp),
        "udp" => Kw::P(Pn::Udp),
        "sctp" => Kw::P(Pn::Sctp),
        "icmp" => Kw::P(Pn::IpProto("icmp", 1)),
        "igmp" => Kw::P(Pn::IpProto("igmp", 2)),
        "igrp" => Kw::P(Pn::IpProto("igrp", 9)),
        "pim" => Kw::P(Pn::IpProto("pim", 103)),
        "vrrp" => Kw::P(Pn::IpProto("vrrp", 112)),
        "carp" => Kw::P(Pn::IpProto("carp", 112)),
        "atalk" => Kw::P(Pn::LinkType("atalk", 0x809b)),
        "aarp" => Kw::P(Pn::LinkType("aarp", 0x80f3)),
        "decnet" => Kw::P(Pn::LinkType("decnet", 0x6003)),
        "lat" => Kw::P(Pn::LinkType("lat", 0x6004)),
        "sca" => Kw::P(Pn::LinkType("sca", 0x6007)),
        "moprc" => Kw::P(Pn::LinkType("moprc", 0x6002)),
        "mopdl" => Kw::P(Pn::LinkType("mopdl", 0x6001)),
        "iso" => Kw::P(Pn::LinkType("iso", 0xfe)),
        "stp" => Kw::P(Pn::LinkType("stp", 0x42)),
        "ipx" => Kw::P(Pn::LinkType("ipx", 0xe0)),
        "netbeui" => Kw::P(Pn::LinkType("netbeui", 0xf0)),
        _ => Kw::Unsup(UNSUPPORTED_KEYWORDS.iter().find(|k| **k == s)?),
    };
    Some(Tok::Kw(kw))
}

fn is_num(s: &str) -> bool {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit())
    } else {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
    }
}

/// libpcap's `stou`: decimal, `0x` hex, or `0`-prefixed octal.
fn stou(s: &str, pos: usize) -> Result<u32, DpfError> {
    let (digits, radix) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    let mut v: u64 = 0;
    for c in digits.chars() {
        let d = c
            .to_digit(radix)
            .ok_or_else(|| parse_err(pos, format!("number {s} contains non-octal digit")))?;
        v = v * radix as u64 + d as u64;
        if v > u32::MAX as u64 {
            return Err(parse_err(pos, format!("number {s} overflows 32 bits")));
        }
    }
    Ok(v as u32)
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(&parts) {
        if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *m = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

fn parse_err(pos: usize, msg: impl Into<String>) -> DpfError {
    DpfError::Parse {
        pos,
        msg: msg.into(),
    }
}

fn lex(src: &str) -> Result<Vec<(usize, Tok)>, DpfError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'(' | b')' | b'/' => {
                let t = match c {
                    b'(' => Tok::LParen,
                    b')' => Tok::RParen,
                    _ => Tok::Slash,
                };
                out.push((i, t));
                i += 1;
            }
            b'!' if next != Some(b'=') => {
                out.push((i, Tok::Not));
                i += 1;
            }
            b'&' if next == Some(b'&') => {
                out.push((i, Tok::And));
                i += 2;
            }
            b'|' if next == Some(b'|') => {
                out.push((i, Tok::Or));
                i += 2;
            }
            b'\\' => {
                let start = i + 1;
                let mut j = start;
                while j < b.len() && !matches!(b[j], b' ' | b'!' | b'(' | b')' | b'\n' | b'\t') {
                    j += 1;
                }
                if j == start {
                    return Err(parse_err(i, "a backslash must be followed by a name"));
                }
                out.push((i, Tok::Id(src[start..j].to_string())));
                i = j;
            }
            c if c.is_ascii_alphanumeric() => {
                let mut j = i;
                while j < b.len()
                    && (b[j].is_ascii_alphanumeric() || matches!(b[j], b'-' | b'_' | b'.' | b':'))
                {
                    j += 1;
                }
                if src[i..j].contains(':') {
                    let word = &src[i..j];
                    let mac = parse_mac(word).ok_or_else(|| {
                        parse_err(
                            i,
                            format!(
                                "'{word}' is not an Ethernet address of the form a:b:c:d:e:f \
                                 (IPv6 addresses are not supported)"
                            ),
                        )
                    })?;
                    out.push((i, Tok::Eid(mac)));
                    i = j;
                    continue;
                }
                // A name cannot end with '-' or '_'.
                while j > i + 1 && matches!(b[j - 1], b'-' | b'_') {
                    j -= 1;
                }
                let word = &src[i..j];
                let tok = if let Some(t) = keyword(word) {
                    t
                } else if is_num(word) {
                    Tok::Num(stou(word, i)?)
                } else if (2..=4).contains(&word.split('.').count()) && word.split('.').all(is_num)
                {
                    Tok::Hid(word.to_string())
                } else {
                    Tok::Id(word.to_string())
                };
                out.push((i, tok));
                i = j;
            }
            b'+' | b'-' | b'*' | b'%' | b':' | b'[' | b']' | b'<' | b'>' | b'=' | b'^' | b'&'
            | b'|' | b'!' => {
                let two = matches!(
                    (c, next),
                    (b'>', Some(b'='))
                        | (b'<', Some(b'='))
                        | (b'=', Some(b'='))
                        | (b'!', Some(b'='))
                        | (b'<', Some(b'<'))
                        | (b'>', Some(b'>'))
                );
                let n = if two { 2 } else { 1 };
                out.push((i, Tok::Other(src[i..i + n].to_string())));
                i += n;
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(parse_err(i, format!("unexpected character '{ch}'")));
            }
        }
    }
    Ok(out)
}

/// libpcap's `__pcap_atoin`: a dotted address of 1 to 4 decimal parts, and
/// its length in bits.
fn atoin(s: &str, pos: usize) -> Result<(u32, u32), DpfError> {
    let mut addr: u32 = 0;
    let mut len = 0;
    for part in s.split('.') {
        let n: u32 =
            if !part.is_empty() && part.len() <= 3 && part.bytes().all(|b| b.is_ascii_digit()) {
                part.parse().unwrap_or(256)
            } else {
                256
            };
        if n > 255 {
            return Err(parse_err(pos, format!("invalid IPv4 address '{s}'")));
        }
        addr = (addr << 8) | n;
        len += 8;
    }
    Ok((addr, len))
}

// ---------------------------------------------------------------------------
// Parser (after libpcap's grammar.y, with its implicit qualifiers).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AddrQ {
    Default,
    Host,
    Net,
    Port,
    Portrange,
    Proto,
}

/// libpcap's `struct qual`; `None` stands for `qerr` (no qualifiers to
/// reuse, as after a bare `tcp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Qual {
    proto: Pn,
    dir: Dir,
    addr: AddrQ,
}

type Q = Option<Qual>;

struct Parser {
    len: usize,
    toks: Vec<(usize, Tok)>,
    i: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i).map(|t| &t.1)
    }

    fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(k).map(|t| &t.1)
    }

    fn here(&self) -> usize {
        self.toks.get(self.i).map_or(self.len, |t| t.0)
    }

    fn syntax(&self) -> DpfError {
        match self.toks.get(self.i) {
            None => parse_err(self.len, "syntax error: unexpected end of expression"),
            Some((pos, Tok::Other(s))) => parse_err(
                *pos,
                format!("syntax error at '{s}' (arithmetic and byte-offset expressions are not supported)"),
            ),
            Some((pos, t)) => parse_err(*pos, format!("syntax error at {}", describe(t))),
        }
    }

    fn expect_rparen(&mut self) -> Result<(), DpfError> {
        if self.peek() == Some(&Tok::RParen) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.syntax())
        }
    }

    fn enter(&mut self) -> Result<(), DpfError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(DpfError::Unsupported(format!(
                "expression nested more than {MAX_DEPTH} deep"
            )));
        }
        Ok(())
    }

    fn parse(&mut self) -> Result<Dnf, DpfError> {
        if self.toks.is_empty() {
            return Ok(true_dnf());
        }
        let (d, _) = self.expr(None)?;
        if self.i < self.toks.len() {
            return Err(self.syntax());
        }
        Ok(d)
    }

    /// `expr: term | expr and term | expr and id | expr or term | expr or id`.
    fn expr(&mut self, q: Q) -> Result<(Dnf, Q), DpfError> {
        let (mut d, mut q) = self.term_or_id(q, false)?;
        loop {
            let is_and = match self.peek() {
                Some(Tok::And) => true,
                Some(Tok::Or) => false,
                _ => return Ok((d, q)),
            };
            self.i += 1;
            let (d2, q2) = self.term_or_id(q, true)?;
            d = if is_and { and(d, d2)? } else { or(d, d2)? };
            q = q2;
        }
    }

    /// `k` tokens of `(`, a number, `k` tokens of `)` at `at` (libpcap's
    /// `pnum`, k >= 1): the number and the index after it.
    fn paren_num(&self, at: usize) -> Option<(u32, usize)> {
        let mut k = 0;
        while self.peek_at(at + k) == Some(&Tok::LParen) {
            k += 1;
        }
        let v = match self.peek_at(at + k) {
            Some(Tok::Num(v)) if k > 0 => *v,
            _ => return None,
        };
        (1..=k)
            .all(|m| self.peek_at(at + k + m) == Some(&Tok::RParen))
            .then_some((v, at + 2 * k + 1))
    }

    /// Whether the tokens after a `(` at `at` start libpcap's `pid` (a list
    /// of bare addresses) rather than an expression.
    fn starts_pid(&self, mut at: usize) -> bool {
        while matches!(self.peek_at(at), Some(Tok::Not) | Some(Tok::LParen)) {
            at += 1;
        }
        matches!(
            self.peek_at(at),
            Some(Tok::Num(_)) | Some(Tok::Hid(_)) | Some(Tok::Eid(_)) | Some(Tok::Id(_))
        )
    }

    /// A `term`, or (when `allow_id`, after `and`/`or`) a bare `id` that
    /// reuses the qualifiers `q`.
    fn term_or_id(&mut self, q: Q, allow_id: bool) -> Result<(Dnf, Q), DpfError> {
        self.enter()?;
        let r = self.term_or_id_inner(q, allow_id);
        self.depth -= 1;
        r
    }

    fn term_or_id_inner(&mut self, q: Q, allow_id: bool) -> Result<(Dnf, Q), DpfError> {
        let pos = self.here();
        match self.peek().cloned() {
            Some(Tok::Not) => {
                self.i += 1;
                let (d, q2) = self.term_or_id(q, allow_id)?;
                Ok((not(d)?, q2))
            }
            Some(Tok::LParen) => {
                if allow_id {
                    if let Some((v, next)) = self.paren_num(self.i) {
                        self.i = next;
                        return Ok((self.ncode(pos, None, v, q)?, q));
                    }
                    if self.starts_pid(self.i + 1) {
                        self.i += 1;
                        let d = self.pid(q)?;
                        self.expect_rparen()?;
                        return Ok((d, q));
                    }
                }
                self.i += 1;
                let (d, _) = self.expr(q)?;
                self.expect_rparen()?;
                Ok((d, q))
            }
            Some(Tok::Kw(Kw::Unsup(k))) => Err(unsupported_kw(k)),
            Some(Tok::Kw(_)) => self.head_term(),
            Some(Tok::Num(_)) | Some(Tok::Hid(_)) | Some(Tok::Eid(_)) | Some(Tok::Id(_))
                if allow_id =>
            {
                Ok((self.id(q)?, q))
            }
            Some(Tok::Num(_)) | Some(Tok::Hid(_)) | Some(Tok::Eid(_)) | Some(Tok::Id(_)) => {
                Err(parse_err(
                    pos,
                    "syntax error: an address, number or name needs a qualifier such as \
                 'host', 'net', 'port' or 'proto' before it",
                ))
            }
            _ => Err(self.syntax()),
        }
    }

    /// `rterm: head id | pname`.
    fn head_term(&mut self) -> Result<(Dnf, Q), DpfError> {
        let pos = self.here();
        let mut proto = Pn::Default;
        if let Some(Tok::Kw(Kw::P(p))) = self.peek() {
            proto = *p;
            self.i += 1;
        }
        let mut dir = None;
        match self.peek() {
            Some(Tok::Kw(Kw::Src)) | Some(Tok::Kw(Kw::Dst)) => {
                let first = self.peek() == Some(&Tok::Kw(Kw::Src));
                self.i += 1;
                let other = if first { Kw::Dst } else { Kw::Src };
                dir = Some(if first { Dir::Src } else { Dir::Dst });
                if matches!(self.peek(), Some(Tok::And) | Some(Tok::Or)) {
                    let is_and = self.peek() == Some(&Tok::And);
                    self.i += 1;
                    if self.peek() != Some(&Tok::Kw(other)) {
                        return Err(self.syntax());
                    }
                    self.i += 1;
                    dir = Some(if is_and { Dir::And } else { Dir::Or });
                }
            }
            Some(Tok::Kw(Kw::Unsup(k))) => return Err(unsupported_kw(k)),
            _ => {}
        }
        let addr = match self.peek() {
            Some(Tok::Kw(Kw::Host)) => Some(AddrQ::Host),
            Some(Tok::Kw(Kw::Net)) => Some(AddrQ::Net),
            Some(Tok::Kw(Kw::Port)) => Some(AddrQ::Port),
            Some(Tok::Kw(Kw::Portrange)) => Some(AddrQ::Portrange),
            Some(Tok::Kw(Kw::Proto)) if dir.is_none() => Some(AddrQ::Proto),
            Some(Tok::Kw(Kw::Unsup(k))) => return Err(unsupported_kw(k)),
            _ => None,
        };
        if addr.is_some() {
            self.i += 1;
        }
        if dir.is_none() && addr.is_none() {
            return match proto {
                Pn::Default => Err(self.syntax()),
                p => Ok((self.abbrev(pos, p)?, None)),
            };
        }
        let q = Some(Qual {
            proto,
            dir: dir.unwrap_or(Dir::Default),
            addr: addr.unwrap_or(AddrQ::Default),
        });
        Ok((self.id(q)?, q))
    }

    /// `pid: nid | qid and id | qid or id` inside `( .. )`.
    fn pid(&mut self, q: Q) -> Result<Dnf, DpfError> {
        let mut d = if self.peek() == Some(&Tok::LParen) {
            let pos = self.here();
            let (v, next) = self.paren_num(self.i).ok_or_else(|| self.syntax())?;
            self.i = next;
            self.ncode(pos, None, v, q)?
        } else {
            self.id(q)?
        };
        loop {
            let is_and = match self.peek() {
                Some(Tok::And) => true,
                Some(Tok::Or) => false,
                _ => return Ok(d),
            };
            self.i += 1;
            let d2 = self.id(q)?;
            d = if is_and { and(d, d2)? } else { or(d, d2)? };
        }
    }

    /// `id: nid | pnum | paren pid ')'`, with the qualifiers `q`.
    fn id(&mut self, q: Q) -> Result<Dnf, DpfError> {
        self.enter()?;
        let r = self.id_inner(q);
        self.depth -= 1;
        r
    }

    fn id_inner(&mut self, q: Q) -> Result<Dnf, DpfError> {
        let pos = self.here();
        match self.peek().cloned() {
            Some(Tok::Not) => {
                self.i += 1;
                not(self.id(q)?)
            }
            Some(Tok::LParen) => {
                if let Some((v, next)) = self.paren_num(self.i) {
                    self.i = next;
                    return self.ncode(pos, None, v, q);
                }
                self.i += 1;
                let d = self.pid(q)?;
                self.expect_rparen()?;
                Ok(d)
            }
            Some(Tok::Num(v)) => {
                self.i += 1;
                self.ncode(pos, None, v, q)
            }
            Some(Tok::Hid(s)) => {
                self.i += 1;
                match self.peek() {
                    Some(Tok::Slash) => {
                        self.i += 1;
                        match self.peek() {
                            Some(Tok::Num(len)) => {
                                let len = *len;
                                self.i += 1;
                                self.mcode(pos, &s, None, len, q)
                            }
                            _ => Err(self.syntax()),
                        }
                    }
                    Some(Tok::Kw(Kw::Mask)) => {
                        self.i += 1;
                        match self.peek().cloned() {
                            Some(Tok::Hid(m)) => {
                                self.i += 1;
                                self.mcode(pos, &s, Some(&m), 0, q)
                            }
                            _ => Err(self.syntax()),
                        }
                    }
                    _ => self.ncode(pos, Some(&s), 0, q),
                }
            }
            Some(Tok::Eid(mac)) => {
                self.i += 1;
                self.ecode(pos, mac, q)
            }
            Some(Tok::Id(name)) => {
                self.i += 1;
                self.scode(pos, &name, q)
            }
            Some(Tok::Kw(Kw::Unsup(k))) => Err(unsupported_kw(k)),
            _ => Err(self.syntax()),
        }
    }

    fn need_q(&self, pos: usize, q: Q) -> Result<Qual, DpfError> {
        q.ok_or_else(|| {
            parse_err(
                pos,
                "syntax error in filter expression: no qualifiers to reuse here \
                 (say 'host', 'net', 'port' or 'proto')",
            )
        })
    }

    /// `gen_proto_abbrev`: a protocol name alone.
    fn abbrev(&self, pos: usize, p: Pn) -> Result<Dnf, DpfError> {
        match p {
            Pn::Default | Pn::Link => Err(parse_err(pos, "link layer applied in wrong context")),
            Pn::Ip => ether_type(ETHERTYPE_IP),
            Pn::Arp => ether_type(ETHERTYPE_ARP),
            Pn::Rarp => ether_type(ETHERTYPE_REVARP),
            Pn::Tcp => ip_proto(6),
            Pn::Udp => ip_proto(17),
            Pn::Sctp => ip_proto(132),
            Pn::IpProto(_, n) => ip_proto(n),
            Pn::LinkType(_, t) => ether_type(t),
        }
    }

    /// `gen_host` for IPv4 `addr`/`mask` under the protocol qualifier.
    fn host(&self, pos: usize, addr: u32, mask: u32, q: Qual) -> Result<Dnf, DpfError> {
        match q.proto {
            Pn::Default => {
                let d = or(
                    hostop(addr, mask, q.dir, ETHERTYPE_IP, 12, 16)?,
                    hostop(addr, mask, q.dir, ETHERTYPE_ARP, 14, 24)?,
                )?;
                or(d, hostop(addr, mask, q.dir, ETHERTYPE_REVARP, 14, 24)?)
            }
            Pn::Ip => hostop(addr, mask, q.dir, ETHERTYPE_IP, 12, 16),
            Pn::Arp => hostop(addr, mask, q.dir, ETHERTYPE_ARP, 14, 24),
            Pn::Rarp => hostop(addr, mask, q.dir, ETHERTYPE_REVARP, 14, 24),
            Pn::Link => Err(parse_err(pos, "illegal link layer address")),
            Pn::LinkType(n, _) => Err(DpfError::Unsupported(format!("'{n}' addresses"))),
            p => Err(parse_err(
                pos,
                format!("'{}' modifier applied to host", p.name()),
            )),
        }
    }

    /// The transport protocol of a port qualifier (`None`: tcp, udp, sctp).
    fn port_proto(&self, pos: usize, p: Pn, what: &str) -> Result<Option<u32>, DpfError> {
        match p {
            Pn::Default => Ok(None),
            Pn::Tcp => Ok(Some(6)),
            Pn::Udp => Ok(Some(17)),
            Pn::Sctp => Ok(Some(132)),
            _ => Err(parse_err(pos, format!("illegal qualifier of '{what}'"))),
        }
    }

    /// `gen_proto`: `proto N` under the protocol qualifier.
    fn proto(&self, pos: usize, v: u32, q: Qual) -> Result<Dnf, DpfError> {
        match q.proto {
            Pn::Default | Pn::Ip => ip_proto(v),
            Pn::Link => ether_type(v),
            Pn::Arp | Pn::Rarp => Err(parse_err(
                pos,
                format!("{} does not encapsulate another protocol", q.proto.name()),
            )),
            Pn::LinkType(n, _) => Err(DpfError::Unsupported(format!("'{n} proto'"))),
            p => Err(parse_err(pos, format!("'{} proto' is bogus", p.name()))),
        }
    }

    /// `gen_ncode`: a number, or a dotted address `hid`.
    fn ncode(&self, pos: usize, hid: Option<&str>, v: u32, q: Q) -> Result<Dnf, DpfError> {
        let q = self.need_q(pos, q)?;
        match q.addr {
            AddrQ::Default | AddrQ::Host | AddrQ::Net => {
                let (mut v, vlen) = match hid {
                    Some(s) => atoin(s, pos)?,
                    None => (v, 32),
                };
                if q.proto == Pn::Link {
                    return Err(parse_err(pos, "illegal link layer address"));
                }
                let mut mask = u32::MAX;
                if hid.is_none() && q.addr == AddrQ::Net {
                    // Promote a short net number (`net 10` is 10.0.0.0/8).
                    while v != 0 && v & 0xff00_0000 == 0 {
                        v <<= 8;
                        mask <<= 8;
                    }
                } else {
                    // Promote a short address (`host 10.1` is 10.1.0.0/16).
                    v <<= 32 - vlen;
                    mask <<= 32 - vlen;
                }
                self.host(pos, v, mask, q)
            }
            AddrQ::Port | AddrQ::Portrange => {
                let what = if q.addr == AddrQ::Port {
                    "port"
                } else {
                    "portrange"
                };
                if hid.is_some() {
                    return Err(parse_err(
                        pos,
                        format!("'{what}' modifier applied to ip host"),
                    ));
                }
                let p = self.port_proto(pos, q.proto, what)?;
                if v > 65535 {
                    return Err(parse_err(pos, format!("illegal port number {v} > 65535")));
                }
                ports(v, v, p, q.dir)
            }
            AddrQ::Proto => {
                if hid.is_some() {
                    return Err(parse_err(pos, "'proto' modifier applied to ip host"));
                }
                self.proto(pos, v, q)
            }
        }
    }

    /// `gen_mcode`: `A.B.C.D/len` or `A.B.C.D mask M.M.M.M`.
    fn mcode(
        &self,
        pos: usize,
        s1: &str,
        s2: Option<&str>,
        masklen: u32,
        q: Q,
    ) -> Result<Dnf, DpfError> {
        let q = self.need_q(pos, q)?;
        let (n, nlen) = atoin(s1, pos)?;
        let n = n << (32 - nlen);
        let m = match s2 {
            Some(s2) => {
                let (m, mlen) = atoin(s2, pos)?;
                let m = m << (32 - mlen);
                if n & !m != 0 {
                    return Err(parse_err(
                        pos,
                        format!("non-network bits set in \"{s1} mask {s2}\""),
                    ));
                }
                m
            }
            None => {
                if masklen > 32 {
                    return Err(parse_err(pos, "mask length must be <= 32"));
                }
                let m = if masklen == 0 {
                    0
                } else {
                    u32::MAX << (32 - masklen)
                };
                if n & !m != 0 {
                    return Err(parse_err(
                        pos,
                        format!("non-network bits set in \"{s1}/{masklen}\""),
                    ));
                }
                m
            }
        };
        if q.addr != AddrQ::Net {
            return Err(parse_err(pos, "Mask syntax for networks only"));
        }
        self.host(pos, n, m, q)
    }

    /// `gen_ecode`: an Ethernet address.
    fn ecode(&self, pos: usize, mac: [u8; 6], q: Q) -> Result<Dnf, DpfError> {
        let q = self.need_q(pos, q)?;
        if q.proto == Pn::Link && matches!(q.addr, AddrQ::Host | AddrQ::Default) {
            ehostop(mac, q.dir)
        } else {
            Err(parse_err(
                pos,
                "ethernet address used in non-ether expression",
            ))
        }
    }

    /// `gen_scode`: a name (host, port, port range or protocol).
    fn scode(&self, pos: usize, name: &str, q: Q) -> Result<Dnf, DpfError> {
        let q = self.need_q(pos, q)?;
        match q.addr {
            AddrQ::Default | AddrQ::Host => Err(parse_err(
                pos,
                format!("host names are not resolved: '{name}' (use a dotted IPv4 or a:b:c:d:e:f Ethernet address)"),
            )),
            AddrQ::Net => Err(parse_err(
                pos,
                format!("network names are not resolved: '{name}' (use A.B.C.D/len)"),
            )),
            AddrQ::Port => {
                let p = self.port_proto(pos, q.proto, "port")?;
                let &(_, port, real) = SERVICES
                    .iter()
                    .find(|(n, _, _)| *n == name)
                    .ok_or_else(|| parse_err(pos, format!("unknown port '{name}'")))?;
                let real = match (p, real) {
                    (None, r) => r,
                    (Some(want), None) => Some(want),
                    (Some(want), Some(r)) if want == r => Some(r),
                    (Some(_), Some(r)) => {
                        let is = match r {
                            6 => "tcp",
                            17 => "udp",
                            _ => "sctp",
                        };
                        return Err(parse_err(pos, format!("port '{name}' is {is}")));
                    }
                };
                ports(port, port, real, q.dir)
            }
            AddrQ::Portrange => {
                let p = self.port_proto(pos, q.proto, "portrange")?;
                let (a, b) = name.split_once('-').ok_or_else(|| parse_err(pos, format!("unknown port range '{name}'")))?;
                let num = |s: &str| -> Option<u32> {
                    (!s.is_empty() && s.len() <= 9 && s.bytes().all(|c| c.is_ascii_digit()))
                        .then(|| s.parse().ok())
                        .flatten()
                };
                let (Some(lo), Some(hi)) = (num(a), num(b)) else {
                    return Err(DpfError::Unsupported(format!(
                        "port range '{name}': only numeric ranges N-M are supported"
                    )));
                };
                for v in [lo, hi] {
                    if v > 65535 {
                        return Err(parse_err(pos, format!("illegal port number {v} > 65535")));
                    }
                }
                ports(lo, hi, p, q.dir)
            }
            AddrQ::Proto => {
                let v = match q.proto {
                    Pn::Default | Pn::Ip => lookup(IP_PROTOS, name)
                        .ok_or_else(|| parse_err(pos, format!("unknown ip proto '{name}'")))?,
                    Pn::Link => lookup(ETHER_PROTOS, name)
                        .ok_or_else(|| parse_err(pos, format!("unknown ether proto '{name}'")))?,
                    _ => 0,
                };
                self.proto(pos, v, q)
            }
        }
    }
}

fn unsupported_kw(k: &str) -> DpfError {
    DpfError::Unsupported(format!("the '{k}' primitive or qualifier is not supported"))
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Kw(Kw::P(p)) => format!("'{}'", p.name()),
        Tok::Kw(k) => format!("'{}'", format!("{k:?}").to_lowercase()),
        Tok::Num(v) => format!("number {v}"),
        Tok::Hid(s) | Tok::Id(s) | Tok::Other(s) => format!("'{s}'"),
        Tok::Eid(m) => format!(
            "'{:x}:{:x}:{:x}:{:x}:{:x}:{:x}'",
            m[0], m[1], m[2], m[3], m[4], m[5]
        ),
        Tok::And => "'and'".into(),
        Tok::Or => "'or'".into(),
        Tok::Not => "'not'".into(),
        Tok::LParen => "'('".into(),
        Tok::RParen => "')'".into(),
        Tok::Slash => "'/'".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(fs: &[Filter], frame: &[u8]) -> bool {
        fs.iter().any(|f| f.matches(frame))
    }

    fn m(expr: &str, frame: &[u8]) -> bool {
        let fs = compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        matches(&fs, frame)
    }

    /// An Ethernet + IPv4 frame with `ihl` words of header and 8 bytes of
    /// transport header.
    fn ipv4(ihl: u8, proto: u8, src: u32, dst: u32, sport: u16, dport: u16, frag: u16) -> Vec<u8> {
        let hl = 4 * ihl.max(5) as usize;
        let mut f = vec![0u8; 14 + hl + 8];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let t = 14 + 4 * ihl as usize;
        f[t..t + 2].copy_from_slice(&sport.to_be_bytes());
        f[t + 2..t + 4].copy_from_slice(&dport.to_be_bytes());
        f[14] = 0x40 | ihl;
        f[20..22].copy_from_slice(&frag.to_be_bytes());
        f[23] = proto;
        f[26..30].copy_from_slice(&src.to_be_bytes());
        f[30..34].copy_from_slice(&dst.to_be_bytes());
        f
    }

    fn tcp(src: u32, dst: u32, sport: u16, dport: u16) -> Vec<u8> {
        ipv4(5, 6, src, dst, sport, dport, 0)
    }

    fn arp(ethertype: u16, spa: u32, tpa: u32) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f[28..32].copy_from_slice(&spa.to_be_bytes());
        f[38..42].copy_from_slice(&tpa.to_be_bytes());
        f
    }

    fn other(ethertype: u16, body: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f[14..14 + body.len()].copy_from_slice(body);
        f
    }

    const A: u32 = 0x0a00_0001; // 10.0.0.1
    const B: u32 = 0x0a00_0002; // 10.0.0.2
    const C: u32 = 0xc0a8_0101; // 192.168.1.1

    #[test]
    fn tcpdump_protocols() {
        let t = tcp(A, B, 1234, 80);
        let u = ipv4(5, 17, A, B, 53, 1000, 0);
        let i = ipv4(5, 1, A, B, 0, 0, 0);
        let s = ipv4(5, 132, A, B, 80, 1, 0);
        let a = arp(0x0806, A, B);
        let r = arp(0x8035, A, B);
        for (e, yes) in [
            ("ip", vec![&t, &u, &i, &s]),
            ("tcp", vec![&t]),
            ("udp", vec![&u]),
            ("icmp", vec![&i]),
            ("sctp", vec![&s]),
            ("arp", vec![&a]),
            ("rarp", vec![&r]),
            ("proto 6", vec![&t]),
            ("ip proto 17", vec![&u]),
            ("proto \\tcp", vec![&t]),
            ("ip proto \\icmp", vec![&i]),
            ("ether proto 0x0806", vec![&a]),
            ("ether proto \\ip", vec![&t, &u, &i, &s]),
            ("ether proto \\rarp", vec![&r]),
            ("not ip", vec![&a, &r]),
            ("tcp or udp", vec![&t, &u]),
            ("ip and not tcp", vec![&u, &i, &s]),
        ] {
            for f in [&t, &u, &i, &s, &a, &r] {
                assert_eq!(m(e, f), yes.contains(&f), "{e} on {f:02x?}");
            }
        }
        // A constant wider than the field never matches, as in libpcap.
        assert!(compile("ip proto 300").unwrap().is_empty());
        assert!(compile("ether proto 70000").unwrap().is_empty());
    }

    #[test]
    fn tcpdump_ether_proto_llc() {
        let llc = other(100, &[0x42, 0x42, 3]);
        assert!(m("ether proto 0x42", &llc));
        assert!(m("stp", &llc));
        assert!(!m("ether proto 0x43", &llc));
        // A type field of 0x42 is not an LLC SAP.
        assert!(!m("stp", &other(0x42 + 1501, &[0x42])));
        let snap = other(100, &[0xaa, 0xaa, 3, 8, 0, 7, 0x80, 0x9b]);
        assert!(m("atalk", &snap));
        assert!(m("atalk", &other(0x809b, &[])));
        assert!(!m("aarp", &snap));
        assert!(m("ipx", &other(100, &[0xff, 0xff])));
        assert!(m("ether proto \\iso", &other(100, &[0xfe, 0xfe])));
    }

    #[test]
    fn tcpdump_hosts() {
        let t = tcp(A, B, 1, 2);
        let a = arp(0x0806, B, A);
        let r = arp(0x8035, A, C);
        assert!(m("host 10.0.0.1", &t) && m("host 10.0.0.1", &a) && m("host 10.0.0.1", &r));
        assert!(m("src host 10.0.0.1", &t) && !m("src host 10.0.0.1", &a));
        assert!(m("dst host 10.0.0.1", &a) && !m("dst host 10.0.0.1", &t));
        assert!(m("src or dst host 10.0.0.2", &t));
        assert!(!m("src and dst host 10.0.0.2", &t));
        assert!(m("src and dst host 10.0.0.1", &tcp(A, A, 1, 2)));
        assert!(m("ip host 10.0.0.1", &t) && !m("ip host 10.0.0.1", &a));
        assert!(m("arp host 10.0.0.1", &a) && !m("arp host 10.0.0.1", &r));
        assert!(m("rarp dst host 192.168.1.1", &r));
        assert!(m("src 10.0.0.1", &t));
        assert!(m("host 10.0.0.3 or 10.0.0.2", &t));
        assert!(m("host 10.0.0.2 and 10.0.0.1", &t));
        assert!(!m("host 10.0.0.2 and not 10.0.0.1", &t));
        assert!(m("host 10.0", &t), "a short address is a prefix");
        assert!(!m("host 10.0.0.5", &t));
        // The ARP addresses are at 28 and 38, not 26 and 30.
        let mut odd = arp(0x0806, C, C);
        odd[26..30].copy_from_slice(&A.to_be_bytes());
        odd[30..34].copy_from_slice(&A.to_be_bytes());
        assert!(!m("host 10.0.0.1", &odd));
        let e = "ether host 02:00:00:00:00:01";
        assert!(m(e, &t));
        assert!(m("ether src 2:0:0:0:0:1", &t));
        assert!(!m("ether dst 02:00:00:00:00:01", &t));
    }

    #[test]
    fn tcpdump_nets() {
        let t = tcp(A, C, 1, 2);
        assert!(m("net 10.0.0.0/8", &t));
        assert!(m("net 192.168.0.0/16", &t));
        assert!(!m("src net 192.168.0.0/16", &t));
        assert!(m("dst net 192.168.1.0 mask 255.255.255.0", &t));
        assert!(m("net 10", &t), "net 10 is 10.0.0.0/8");
        assert!(m("net 192.168", &t));
        assert!(!m("src and dst net 10.0.0.0/8", &t));
        assert!(m("net 0.0.0.0/0", &t));
        assert!(m("arp net 10.0.0.0/24", &arp(0x0806, A, C)));
        assert!(
            m("net 10.0.0.0/31", &tcp(B ^ 3, C, 1, 2)),
            "10.0.0.1 in 10.0.0.0/31"
        );
    }

    #[test]
    fn tcpdump_ports() {
        let t = tcp(A, B, 1234, 80);
        assert!(m("port 80", &t) && m("dst port 80", &t) && !m("src port 80", &t));
        assert!(m("tcp port 80", &t) && !m("udp port 80", &t));
        assert!(m("port 1234 and port 80", &t));
        assert!(m("src and dst port 80", &tcp(A, B, 80, 80)));
        assert!(!m("src and dst port 80", &t));
        assert!(m("port 443 or 80", &t));
        assert!(m("tcp dst port 443 or 80", &t));
        assert!(m("port http", &t) && m("port www", &t));
        assert!(m("udp port domain", &ipv4(5, 17, A, B, 53, 9, 0)));
        assert!(
            !m("port http", &ipv4(5, 17, A, B, 80, 9, 0)),
            "http is tcp only"
        );
        assert!(
            m("port 80", &ipv4(5, 132, A, B, 80, 9, 0)),
            "sctp has ports"
        );
        assert!(!m("port 80", &ipv4(5, 1, A, B, 80, 80, 0)), "icmp has none");
        // Ports are read after the options.
        assert!(m("port 80", &ipv4(15, 6, A, B, 1234, 80, 0)));
        assert!(!m("port 80", &ipv4(15, 6, A, B, 1234, 81, 0)));
        // Non-first fragments never match a port; the first one does.
        assert!(!m("port 80", &ipv4(5, 6, A, B, 1234, 80, 0x0001)));
        assert!(m("port 80", &ipv4(5, 6, A, B, 1234, 80, 0x2000)));
        assert!(m("not port 80", &ipv4(5, 6, A, B, 1234, 80, 0x1fff)));
        assert!(m("portrange 1-1000", &t) && !m("src portrange 1-1000", &t));
        assert!(m("portrange 1000-1300", &t) && m("portrange 1300-1000", &t));
        assert!(m("tcp src portrange 1234-1234", &t));
        assert!(m("portrange 80", &t));
        assert!(!m("udp portrange 1-65535", &t));
    }

    #[test]
    fn tcpdump_boolean_structure() {
        let t = tcp(A, B, 1234, 80);
        let u = ipv4(5, 17, A, B, 53, 53, 0);
        // `or` and `and` have equal precedence and associate to the left.
        assert!(!m("tcp or udp and port 80", &u));
        assert!(m("tcp or (udp and port 80)", &t));
        assert!(m("udp or tcp and port 80", &t));
        assert!(m("not tcp or port 80", &t));
        assert!(!m("not (tcp or udp)", &u));
        assert!(m("!tcp && !(udp && port 80)", &u));
        assert!(m("tcp || udp", &u));
        assert!(m("not not tcp", &t));
        // Qualifiers carry over a parenthesised expression.
        let e = "port 1 and (host 10.0.0.9 or 10.0.0.1) or 80";
        assert!(m(e, &t));
        assert!(compile("(host 10.0.0.1) or 10.0.0.2").is_err());
        // `tcp or not tcp` collapses to the ethertype test and its negation,
        // which merge into the filter that accepts everything.
        let all = compile("tcp or not tcp").unwrap();
        assert_eq!(all.len(), 1, "{}", explain_dnf(&all));
        assert!(compile("ip and not ip").unwrap().is_empty());
        assert_eq!(compile("").unwrap().len(), 1);
    }

    #[test]
    fn tcpdump_negation_keeps_guards_and_shifts() {
        let fs = compile("not tcp port 80").unwrap();
        let text = explain_dnf(&fs);
        assert_eq!(fs.len(), 4, "{text}");
        // Every disjunct that reads a port keeps the guards and both shifts.
        for f in &fs {
            let s = f.to_string();
            if s.contains("SHIFT") {
                assert!(
                    s.starts_with("12:16 == 0x800 & 23:8 == 0x6 & (20:16 & 0x1fff) == 0x0"),
                    "{s}"
                );
                assert!(s.contains("SHIFT(14) & SHIFT((0:8 & 0xf) << 2)"), "{s}");
            }
        }
        assert_eq!(text.lines().count(), fs.len());
    }

    #[test]
    fn tcpdump_output_shape() {
        let fs = compile("tcp dst port 80").unwrap();
        assert_eq!(fs.len(), 1);
        assert_eq!(
            fs[0].to_string(),
            "12:16 == 0x800 & 23:8 == 0x6 & (20:16 & 0x1fff) == 0x0 & SHIFT(14) & \
             SHIFT((0:8 & 0xf) << 2) & 2:16 == 0x50"
        );
        let fs = compile("host 10.0.0.1").unwrap();
        assert_eq!(fs.len(), 6, "{}", explain_dnf(&fs));
        let fs = compile("port 80").unwrap();
        assert_eq!(fs.len(), 6, "{}", explain_dnf(&fs));
        for e in [
            "port 80 and host 10.0.0.1",
            "not (port 80 or port 443)",
            "net 10/8 or 11.0.0.0/8",
        ] {
            if let Ok(fs) = compile(e) {
                for f in &fs {
                    f.validate().unwrap();
                    assert_eq!(f.to_string().parse::<Filter>().unwrap(), *f);
                }
            }
        }
    }

    #[test]
    fn tcpdump_errors() {
        for bad in [
            "host",
            "host foo",
            "host www.example.com",
            "net example",
            "10.0.0.1",
            "not 10.0.0.1",
            "port",
            "port 80 and",
            "port 80 or",
            "(tcp",
            "tcp)",
            "()",
            "and tcp",
            "tcp and or udp",
            "not",
            "port 70000",
            "port 08",
            "port 4294967296",
            "port 80x",
            "port 80 or 10.0.0.1",
            "portrange 1-70000",
            "portrange http-https",
            "tcp host 10.0.0.1",
            "tcp src 80",
            "ip port 80",
            "arp proto 6",
            "tcp proto 6",
            "proto tcp",
            "ip proto \\nosuch",
            "ether proto \\nosuch",
            "ether",
            "ether host 10.0.0.1",
            "host 02:00:00:00:00:01",
            "ether host 02:00:00:00:00",
            "host fe80::1",
            "host 256.0.0.1",
            "host 10.0.0.0/8",
            "net 10.0.0.1/8",
            "net 10.0.0.0/33",
            "net 10/8",
            "net 10.0.0.0 mask 255",
            "udp port ssh",
            "tcp port ntp",
            "tcp or 80",
            "(host 10.0.0.1) or 10.0.0.2",
            "host 10.0.0.1 or (10.0.0.2 and port 80)",
            "host 10.0.0.1 or ((10.0.0.2))",
            "src or 10.0.0.1",
            "HOST 10.0.0.1",
            "Tcp",
            "ip[9] = 6",
            "len > 100",
            "vlan 10",
            "gateway foo",
            "ip broadcast",
            "ip6",
            "tcp port 80 $",
            "host 10.0.0.1 \u{e9}",
            "\\",
        ] {
            match compile(bad) {
                Err(DpfError::Parse { .. }) | Err(DpfError::Unsupported(_)) => {}
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        let e = compile("host foo").unwrap_err().to_string();
        assert!(e.contains("not resolved"), "{e}");
        match compile("port 80 and %") {
            Err(DpfError::Parse { pos, .. }) => assert_eq!(pos, 12),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tcpdump_too_complex() {
        let join = |n: u32, f: &dyn Fn(u32) -> String, sep: &str| {
            (1..=n).map(f).collect::<Vec<_>>().join(sep)
        };
        let too_complex = |e: &str| match compile(e) {
            Err(DpfError::Unsupported(msg)) => {
                assert!(msg.starts_with("expression too complex: "), "{msg}")
            }
            other => panic!("{e}: {other:?}"),
        };
        // 100 ports are 600 conjunctions.
        too_complex(&join(100, &|p| format!("port {p}"), " or "));
        too_complex(&format!("port {}", join(100, &|p| p.to_string(), " or ")));
        // 2^9 ways to pick a source or destination address.
        too_complex(&join(9, &|p| format!("ip net 10.0.0.0/{}", 8 + p), " and "));
        // Negation multiplies out.
        too_complex(&format!(
            "not ({})",
            join(
                12,
                &|p| format!(
                    "(ip src net 10.0.0.0/{0} and ip dst net 10.0.0.0/{0})",
                    8 + p
                ),
                " or "
            )
        ));
        // Within the bound, and quick to refuse when past it.
        let start = std::time::Instant::now();
        assert_eq!(
            compile(&join(40, &|p| format!("tcp port {p}"), " or "))
                .unwrap()
                .len(),
            80
        );
        assert_eq!(
            compile(&format!(
                "not ({})",
                join(20, &|p| format!("port {p}"), " or ")
            ))
            .unwrap()
            .len(),
            8
        );
        // Past DPF's 64 elements per filter.
        assert!(matches!(
            compile(&format!(
                "not ({})",
                join(40, &|p| format!("port {p}"), " or ")
            )),
            Err(DpfError::TooManyElems(_))
        ));
        assert!(compile(&join(7, &|p| format!("ip net 10.0.0.0/{}", 8 + p), " and ")).is_ok());
        too_complex(&format!(
            "({}) and ({})",
            join(100, &|p| format!("tcp dst port {p}"), " or "),
            join(60, &|p| format!("ether src 2:0:0:0:0:{p:x}"), " or ")
        ));
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
        // Too many atoms in one conjunction.
        assert!(compile(&vec!["tcp dst port 80"; 70].join(" and ")).is_ok());
        let atoms = join(70, &|p| format!("ip src host 10.0.0.{p}"), " or ");
        assert!(matches!(
            compile(&format!("not ({atoms})")),
            Err(DpfError::TooManyElems(71))
        ));
        // Deep nesting is refused, not a stack overflow.
        let nested = format!("{}tcp{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(compile(&nested).is_err());
        let nots = format!("{}tcp", "not ".repeat(10_000));
        assert!(compile(&nots).is_err());
        assert!(compile(&format!("{}tcp", "not ".repeat(100))).is_ok());
    }

    #[test]
    fn tcpdump_ipv6_is_never_matched() {
        // libpcap's `tcp` and `port 80` also match IPv6; these filters do not.
        let mut f = vec![0u8; 80];
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        f[14] = 0x60;
        f[20] = 6;
        f[56..58].copy_from_slice(&80u16.to_be_bytes());
        for e in ["tcp", "port 80", "proto 6", "host 10.0.0.1"] {
            assert!(!m(e, &f), "{e}");
        }
        assert!(m("ether proto \\ip6", &f));
    }

    #[test]
    fn tcpdump_truncated_frames_reject_only_the_conjunction() {
        // A conjunction whose load falls outside the frame is false.
        let t = tcp(A, B, 1, 80);
        assert!(m("port 80", &t));
        assert!(!m("port 80", &t[..t.len() - 5]));
        assert!(m("tcp", &t[..24]));
        assert!(!m("tcp", &t[..23]));
    }

    /// The one documented difference: on a truncated frame libpcap gives up
    /// at its first out-of-bounds load, DPF only drops that conjunction.
    #[test]
    fn tcpdump_oracle_truncated_frame_difference() {
        let expr = "arp dst host 10.0.0.9 or ether src 02:00:00:00:00:01";
        let mut f = arp(0x0806, A, B);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        let short = &f[..36]; // the ARP target address (38..42) is cut off
        let _g = PCAP.lock().unwrap_or_else(|e| e.into_inner());
        let cap = pcap::Capture::dead(pcap::Linktype::ETHERNET).unwrap();
        let prog = cap.compile(expr, true).unwrap();
        assert!(prog.filter(&f) && m(expr, &f), "whole frame: both match");
        assert!(m(expr, short), "DPF: the second conjunction matches");
        assert!(!prog.filter(short), "libpcap: out-of-bounds load rejects");
    }

    // -----------------------------------------------------------------------
    // Oracle: libpcap itself.

    use std::sync::Mutex;

    /// libpcap's compiler is not guaranteed reentrant across versions.
    static PCAP: Mutex<()> = Mutex::new(());

    use exonet_wire::rng::SplitMix64 as Rng;

    const ADDRS: [u32; 10] = [
        0x0a00_0001, // 10.0.0.1
        0x0a00_0002,
        0x0a00_0003,
        0x0a01_0005, // 10.1.0.5
        0x0000_000a, // 0.0.0.10
        0xc0a8_0101, // 192.168.1.1
        0xc0a8_014d, // 192.168.1.77
        0xc0a8_c801, // 192.168.200.1
        0x0b00_0001, // 11.0.0.1
        0x0a0f_ffff, // 10.15.255.255
    ];
    const PORTS: [u16; 12] = [0, 22, 53, 80, 90, 100, 123, 443, 1000, 1024, 1100, 65535];
    const MACS: [[u8; 6]; 3] = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [0xff; 6]];

    fn fill(r: &mut Rng, f: &mut [u8]) {
        for b in f.iter_mut() {
            *b = r.next_u64() as u8;
        }
    }

    fn addr(r: &mut Rng) -> [u8; 4] {
        if r.chance(0.9) {
            r.pick(&ADDRS).to_be_bytes()
        } else {
            (r.next_u64() as u32).to_be_bytes()
        }
    }

    fn macs(r: &mut Rng, f: &mut [u8]) {
        for off in [0, 6] {
            if r.chance(0.7) {
                f[off..off + 6].copy_from_slice(&r.pick(&MACS));
            }
        }
    }

    fn random_ipv4(r: &mut Rng) -> Vec<u8> {
        let ihl = if r.chance(0.05) {
            r.below(5)
        } else {
            5 + r.below(11)
        } as usize;
        let len = 14 + 4 * ihl.max(5) + 8 + r.below(24) as usize;
        let mut f = vec![0u8; len];
        fill(r, &mut f);
        macs(r, &mut f);
        let t = 14 + 4 * ihl;
        for off in [t, t + 2] {
            let p = if r.chance(0.9) {
                r.pick(&PORTS)
            } else {
                r.next_u64() as u16
            };
            f[off..off + 2].copy_from_slice(&p.to_be_bytes());
        }
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = if r.chance(0.95) {
            0x40
        } else {
            r.next_u64() as u8 & 0xf0
        } | ihl as u8;
        f[23] = if r.chance(0.9) {
            r.pick(&[1, 6, 17, 132, 2, 6, 17])
        } else {
            r.next_u64() as u8
        };
        let flags = (r.next_u64() as u16) & 0xe000;
        let offset = match r.below(4) {
            0 | 3 => 0,
            1 => 1 + r.below(0x1fff) as u16,
            _ => r.pick(&[1, 0x1000, 0x1fff, 0x0100]),
        };
        f[20..22].copy_from_slice(&(flags | offset).to_be_bytes());
        let (s, d) = (addr(r), addr(r));
        f[26..30].copy_from_slice(&s);
        f[30..34].copy_from_slice(&d);
        f
    }

    fn random_arp(r: &mut Rng) -> Vec<u8> {
        let len = 42 + r.below(30) as usize;
        let mut f = vec![0u8; len];
        fill(r, &mut f);
        macs(r, &mut f);
        let et: u16 = if r.chance(0.5) { 0x0806 } else { 0x8035 };
        f[12..14].copy_from_slice(&et.to_be_bytes());
        let (s, d) = (addr(r), addr(r));
        f[28..32].copy_from_slice(&s);
        f[38..42].copy_from_slice(&d);
        if r.chance(0.3) {
            // Where an IPv4 header would keep its addresses.
            let (s, d) = (addr(r), addr(r));
            f[26..30].copy_from_slice(&s);
            f[30..34].copy_from_slice(&d);
        }
        f
    }

    fn random_other(r: &mut Rng) -> Vec<u8> {
        let len = 60 + r.below(40) as usize;
        let mut f = vec![0u8; len];
        fill(r, &mut f);
        macs(r, &mut f);
        let et: u16 = match r.below(4) {
            0 => r.below(1501) as u16,
            1 => r.pick(&[0x42, 0xe0, 0xfe, 0x06, 0xf0, 100, 1500, 1501, 0x64]),
            2 => r.pick(&[
                0x809b, 0x80f3, 0x8137, 0x6001, 0x6002, 0x6003, 0x6004, 0x6007, 0x9000, 0x0806,
            ]),
            _ => loop {
                let e = r.next_u64() as u16;
                if e != 0x0800 && e != 0x86dd {
                    break e;
                }
            },
        };
        f[12..14].copy_from_slice(&et.to_be_bytes());
        match r.below(4) {
            0 => {
                let sap = r.pick(&[0x42u8, 0xe0, 0xfe, 0x06, 0xf0, 100, 0xff]);
                f[14] = sap;
                if r.chance(0.7) {
                    f[15] = sap;
                }
            }
            1 => {
                let org: u32 = r.pick(&[0, 0x080007, 0x000001]);
                let pt: u16 = r.pick(&[0x809b, 0x80f3, 0x8137, 0x0800]);
                f[14..17].copy_from_slice(&[0xaa, 0xaa, 3]);
                f[17..20].copy_from_slice(&org.to_be_bytes()[1..]);
                f[20..22].copy_from_slice(&pt.to_be_bytes());
            }
            _ => {}
        }
        f
    }

    fn frames() -> Vec<Vec<u8>> {
        let mut r = Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut v = Vec::new();
        for _ in 0..4000 {
            v.push(random_ipv4(&mut r));
        }
        for _ in 0..600 {
            v.push(random_arp(&mut r));
        }
        for _ in 0..600 {
            v.push(random_other(&mut r));
        }
        v
    }

    /// Expressions compared against libpcap on every random frame.
    const ORACLE: &[&str] = &[
        "",
        "ip",
        "arp",
        "rarp",
        "tcp",
        "udp",
        "icmp",
        "sctp",
        "igmp",
        "not ip",
        "ether proto 0x0800",
        "ether proto \\ip",
        "ether proto \\arp or \\rarp",
        "ether proto 100",
        "ether proto 6",
        "ether proto 0xe0",
        "ether proto \\ipx",
        "ether proto \\atalk",
        "aarp",
        "iso or netbeui",
        "stp",
        "decnet or lat or sca or moprc or mopdl",
        "ether proto 70000",
        "not ether proto 70000",
        "ether proto 1000",
        "ether host 02:00:00:00:00:01",
        "ether src 2:0:0:0:0:1 or 2:0:0:0:0:2",
        "ether dst ff:ff:ff:ff:ff:ff and not arp",
        "ether src and dst 02:00:00:00:00:01",
        "host 10.0.0.1",
        "src host 10.0.0.1",
        "dst host 10.0.0.2",
        "src or dst host 10.0.0.1",
        "src and dst host 10.0.0.1",
        "host 10.0.0.1 or 10.0.0.2",
        "host 10.0.0.1 and 10.0.0.2",
        "ip host 10.0.0.1",
        "arp host 10.0.0.1",
        "rarp src host 10.0.0.2",
        "arp dst 10.0.0.3",
        "src 10.0.0.1 or dst 192.168.1.1",
        "host 10.1",
        "host 10",
        "net 10.0.0.0/8",
        "net 192.168.1.0/24",
        "src net 10.0.0.0/8",
        "dst net 192.168.0.0 mask 255.255.0.0",
        "net 10.0.0.1 mask 255.0.0.255",
        "net 10 or 192.168",
        "net 10.0.0.0/12",
        "net 0.0.0.0/0",
        "not net 0.0.0.0/0",
        "src and dst net 10.0.0.0/8",
        "ip net 10.0.0.0/31",
        "rarp net 10.0.0.0/30",
        "port 80",
        "src port 80",
        "dst port 443",
        "tcp port 80",
        "udp port 53",
        "sctp port 80",
        "tcp dst port 80 or 443",
        "port 80 or 443",
        "port 80 and 443",
        "src and dst port 80",
        "src or dst port 1024",
        "port (80) or ((443))",
        "portrange 1000-1100",
        "tcp portrange 1-1023",
        "udp src portrange 1024-65535",
        "portrange 100-90",
        "portrange 80",
        "portrange 1-100 or 1000-1023",
        "proto 6",
        "ip proto 17",
        "proto \\tcp",
        "ip proto \\udp",
        "proto 300",
        "ip proto 1 or 6",
        "proto 6 or \\udp",
        "tcp and port 80",
        "tcp or udp",
        "not tcp",
        "!tcp",
        "not port 80",
        "not (port 80 or port 443)",
        "not (host 10.0.0.1 and port 80)",
        "host 10.0.0.1 and not port 22",
        "(tcp or udp) and host 10.0.0.1",
        "tcp && port 80 || udp && port 53",
        "tcp or udp and port 53",
        "not not tcp",
        "not (tcp and not port 80)",
        "ip and not icmp",
        "host 10.0.0.1 and (port 80 or 443)",
        "port 80 and (host 10.0.0.1 or 10.0.0.2) or 443",
        "not port 80 or 443",
        "port 80 or not 443",
        "host 10.0.0.1 or not (10.0.0.2 or 10.0.0.3)",
        "host 10.0.0.1 and not 10.0.0.2",
        "arp or rarp or host 10.0.0.1",
        "not (src net 10.0.0.0/8 and dst port 80)",
        "(udp or tcp) and not (src portrange 1-1023 or dst portrange 1-1023)",
        "not (tcp src portrange 1000-1100 and dst portrange 1000-1100)",
        "tcp or not tcp",
        "ip and not ip",
        "not (ip and not ip)",
        "not (arp or (ip and (port 53 or host 192.168.1.77)))",
        "(host 10.0.0.1 or host 10.0.0.2) and (port 22 or port 80) and not udp",
        "not host 10.0.0.1 and not host 10.0.0.2",
        "ether src 02:00:00:00:00:01 and (tcp dst port 80 or arp)",
        "host 10.0.0.1 and src and dst port 80 or not ip proto 6",
    ];

    /// Port names are compared only where this machine's /etc/services
    /// agrees with the built-in table (libpcap reads the file).
    const ORACLE_NAMES: &[&str] = &[
        "port http",
        "port domain",
        "port https",
        "tcp port ssh",
        "udp port ntp or domain",
        "tcp port domain",
        "not port www",
    ];

    fn services_agree(name: &str) -> bool {
        let Ok(text) = std::fs::read_to_string("/etc/services") else {
            return false;
        };
        let mut protos = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            let mut w = line.split_whitespace();
            let (Some(n), Some(pp)) = (w.next(), w.next()) else {
                continue;
            };
            if n == name || w.any(|alias| alias == name) {
                if let Some((p, proto)) = pp.split_once('/') {
                    protos.push((p.parse::<u32>().unwrap_or(0), proto.to_string()));
                }
            }
        }
        let Some(&(_, port, real)) = SERVICES.iter().find(|(n, _, _)| *n == name) else {
            return false;
        };
        let port_of = |pr: &str| protos.iter().find(|(_, p)| p == pr).map(|(n, _)| *n);
        match real {
            None => port_of("tcp") == Some(port) && port_of("udp") == Some(port),
            Some(6) => port_of("tcp") == Some(port) && port_of("udp").is_none_or(|p| p != port),
            Some(_) => port_of("udp") == Some(port) && port_of("tcp").is_none(),
        }
    }

    fn hex(f: &[u8]) -> String {
        f.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// libpcap's programs for `expr`: unoptimized (the reference: the code
    /// libpcap's generator emits for each primitive) and optimized (`None`
    /// when the optimizer finds it rejects everything).
    type Programs = (pcap::BpfProgram, Option<pcap::BpfProgram>);

    fn libpcap(cap: &pcap::Capture<pcap::Dead>, expr: &str) -> Result<Programs, pcap::Error> {
        let raw = cap.compile(expr, false)?;
        let opt = match cap.compile(expr, true) {
            Ok(p) => Some(p),
            Err(e) if e.to_string().contains("rejects all packets") => None,
            Err(e) => return Err(e),
        };
        Ok((raw, opt))
    }

    /// Compares with libpcap's unoptimized program. libpcap 1.10's optimizer
    /// has known bugs (the-tcpdump-group/libpcap#945), so where the optimized
    /// program disagrees with the unoptimized one it is only counted.
    fn oracle_check(exprs: &[&str], frames: &[Vec<u8>]) -> (Vec<String>, usize) {
        let _g = PCAP.lock().unwrap_or_else(|e| e.into_inner());
        let cap = pcap::Capture::dead(pcap::Linktype::ETHERNET).unwrap();
        let mut failures = Vec::new();
        let mut optimizer_bugs = 0;
        for &expr in exprs {
            let (raw, opt) =
                libpcap(&cap, expr).unwrap_or_else(|e| panic!("libpcap rejects {expr:?}: {e}"));
            let fs = compile(expr).unwrap_or_else(|e| panic!("compile({expr:?}): {e}"));
            let mut hits = 0;
            let mut bad = 0;
            for f in frames {
                let want = raw.filter(f);
                let got = matches(&fs, f);
                hits += want as usize;
                if opt.as_ref().is_some_and(|p| p.filter(f)) != want {
                    optimizer_bugs += 1;
                    println!("libpcap optimizer differs: {expr:?} on {}", hex(f));
                }
                if want != got {
                    bad += 1;
                    if bad <= 3 {
                        failures.push(format!(
                            "{expr:?}: libpcap {want}, dpf {got} on frame {}\n{}",
                            hex(f),
                            explain_dnf(&fs)
                        ));
                    }
                }
            }
            if bad > 3 {
                failures.push(format!("{expr:?}: {bad} disagreements in all"));
            }
            println!(
                "{expr:?}: {} conjunctions, {hits}/{} frames match",
                fs.len(),
                frames.len()
            );
        }
        (failures, optimizer_bugs)
    }

    #[test]
    fn tcpdump_oracle_libpcap() {
        let frames = frames();
        let (mut failures, opt_bugs) = oracle_check(ORACLE, &frames);
        let named: Vec<&str> = ORACLE_NAMES
            .iter()
            .copied()
            .filter(|e| {
                let ok = e
                    .split_whitespace()
                    .filter(|w| SERVICES.iter().any(|(n, _, _)| n == w))
                    .all(services_agree);
                if !ok {
                    println!("skipping {e:?}: /etc/services differs here");
                }
                ok
            })
            .collect();
        let (more, more_bugs) = oracle_check(&named, &frames);
        failures.extend(more);
        println!(
            "{} frames where libpcap's optimizer disagrees with itself",
            opt_bugs + more_bugs
        );
        assert!(
            failures.is_empty(),
            "{} disagreements:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    /// Every expression libpcap rejects is rejected here too, and the
    /// supported ones it accepts are accepted.
    #[test]
    fn tcpdump_oracle_errors() {
        let _g = PCAP.lock().unwrap_or_else(|e| e.into_inner());
        let cap = pcap::Capture::dead(pcap::Linktype::ETHERNET).unwrap();
        for expr in [
            "10.0.0.1",
            "port 80 or 0.80",
            "port 80 or 10.0.0.1",
            "(host 10.0.0.1) or 10.0.0.2",
            "host 10.0.0.1 or ((10.0.0.2))",
            "host 10.0.0.1 or (10.0.0.2 and port 80)",
            "net 10/8",
            "port 08",
            "proto tcp",
            "portrange 1 - 100",
            "tcp host 1.2.3.4",
            "ip port 80",
            "tcp or 80",
            "host 10.0.0.0/8",
            "net 10.0.0.1/8",
            "port 70000",
            "arp proto 6",
            "tcp proto 6",
            "ether dst 1.2.3.4",
            "host 02:00:00:00:00:01",
            "net 10.0.0.0/33",
            "host foo",
            "port 80 and",
            "not",
            "ip proto \\6",
            "udp port ssh",
            "ether",
            "src or 1.2.3.4",
            "not 1.2.3.4",
            "net 10.0.0.0 mask 255",
            "port 4294967296",
            "portrange 1-70000",
            "host 256.0.0.1",
            "HOST 1.2.3.4",
            "tcp src 80",
            "port 80x",
            "ether proto 0x",
        ] {
            assert!(
                cap.compile(expr, false).is_err(),
                "libpcap accepts {expr:?}"
            );
            assert!(
                compile(expr).is_err(),
                "{expr:?} accepted: {:?}",
                compile(expr)
            );
        }
        for expr in ORACLE {
            assert!(cap.compile(expr, false).is_ok(), "{expr:?}");
            if let Err(e) = cap.compile(expr, true) {
                assert!(
                    e.to_string().contains("rejects all packets"),
                    "{expr:?}: {e}"
                );
                assert!(compile(expr).unwrap().is_empty(), "{expr:?}");
            }
        }
    }

    // -----------------------------------------------------------------------
    // Random expressions against libpcap: parse decisions and semantics.

    const BARE_ADDRS: &[&str] = &[
        "10.0.0.1",
        "10.0.0.2",
        "192.168.1.77",
        "10.1",
        "10",
        "0.0.0.10",
    ];
    const BARE_NETS: &[&str] = &[
        "10.0.0.0/8",
        "192.168.1.0/24",
        "10.0.0.0/31",
        "0.0.0.0/0",
        "10.0.0.0 mask 255.255.0.0",
        "10.0.0.1/8",
    ];
    const BARE_PORTS: &[&str] = &[
        "80", "443", "53", "22", "1024", "0x50", "0120", "http", "domain", "70000",
    ];
    const BARE_RANGES: &[&str] = &["1000-1100", "1-1023", "100-90", "80", "1024-65535"];
    const BARE_PROTOS: &[&str] = &["6", "17", "1", "132", "\\tcp", "\\udp", "300"];
    const BARE_EPROTOS: &[&str] = &["0x800", "\\arp", "\\ip", "100", "\\atalk", "0xe0", "\\rarp"];
    const BARE_MACS: &[&str] = &["02:00:00:00:00:01", "2:0:0:0:0:2", "ff:ff:ff:ff:ff:ff"];

    fn pick_str(r: &mut Rng, xs: &[&str]) -> String {
        r.pick(xs).to_string()
    }

    fn gen_dir(r: &mut Rng) -> &'static str {
        r.pick(&[
            "",
            "",
            "src ",
            "dst ",
            "src or dst ",
            "src and dst ",
            "dst or src ",
        ])
    }

    /// A primitive and the bare operands that may follow it.
    fn gen_prim(r: &mut Rng) -> (String, &'static [&'static str]) {
        match r.below(14) {
            0 => (
                r.pick(&[
                    "ip", "arp", "rarp", "tcp", "udp", "icmp", "sctp", "igmp", "stp", "aarp",
                ])
                .into(),
                &[],
            ),
            1 | 2 => {
                let p = r.pick(&["", "", "ip ", "arp ", "rarp ", "tcp "]);
                let a = r.pick(&["host ", "host ", ""]);
                let d = gen_dir(r);
                let a = if d.is_empty() && a.is_empty() {
                    "host "
                } else {
                    a
                };
                (format!("{p}{d}{a}{}", pick_str(r, BARE_ADDRS)), BARE_ADDRS)
            }
            3 => {
                let p = r.pick(&["", "", "ip ", "arp ", "rarp "]);
                (
                    format!("{p}{}net {}", gen_dir(r), pick_str(r, BARE_NETS)),
                    BARE_NETS,
                )
            }
            4..=6 => {
                let p = r.pick(&["", "", "tcp ", "udp ", "sctp ", "ip "]);
                (
                    format!("{p}{}port {}", gen_dir(r), pick_str(r, BARE_PORTS)),
                    BARE_PORTS,
                )
            }
            7 => {
                let p = r.pick(&["", "tcp ", "udp "]);
                (
                    format!("{p}{}portrange {}", gen_dir(r), pick_str(r, BARE_RANGES)),
                    BARE_RANGES,
                )
            }
            8 | 9 => {
                let p = r.pick(&["", "ip ", "arp "]);
                (
                    format!("{p}proto {}", pick_str(r, BARE_PROTOS)),
                    BARE_PROTOS,
                )
            }
            10 => (
                format!("ether proto {}", pick_str(r, BARE_EPROTOS)),
                BARE_EPROTOS,
            ),
            11 => {
                let a = r.pick(&["host ", ""]);
                let d = gen_dir(r);
                let a = if d.is_empty() && a.is_empty() {
                    "host "
                } else {
                    a
                };
                (format!("ether {d}{a}{}", pick_str(r, BARE_MACS)), BARE_MACS)
            }
            _ => ("tcp".into(), &[]),
        }
    }

    fn gen_bare(r: &mut Rng, bare: &[&str], depth: u32) -> String {
        let pool = if bare.is_empty() || r.chance(0.05) {
            BARE_ADDRS
        } else {
            bare
        };
        match r.below(if depth > 2 { 6 } else { 9 }) {
            6 => format!("not {}", gen_bare(r, bare, depth + 1)),
            7 => format!(
                "({} or {})",
                gen_bare(r, bare, depth + 1),
                gen_bare(r, bare, depth + 1)
            ),
            8 => format!("({} and not {})", pick_str(r, pool), pick_str(r, pool)),
            _ => pick_str(r, pool),
        }
    }

    /// An expression and the bare operands its last primitive allows.
    fn gen_expr(r: &mut Rng, depth: u32) -> (String, &'static [&'static str]) {
        let (mut e, mut bare) = if depth < 3 && r.chance(0.25) {
            let (inner, b) = gen_expr(r, depth + 1);
            let not = if r.chance(0.3) { "not " } else { "" };
            (format!("{not}({inner})"), b)
        } else {
            let (p, b) = gen_prim(r);
            let not = r.pick(&["", "", "", "not ", "! "]);
            (format!("{not}{p}"), b)
        };
        let n = r.below(if depth < 2 { 4 } else { 2 });
        for _ in 0..n {
            let op = r.pick(&["and", "or", "&&", "||"]);
            if r.chance(0.35) {
                e = format!("{e} {op} {}", gen_bare(r, bare, depth));
            } else {
                let (rhs, b) = if depth < 3 && r.chance(0.2) {
                    let (inner, b) = gen_expr(r, depth + 1);
                    (format!("({inner})"), b)
                } else {
                    gen_prim(r)
                };
                e = format!("{e} {op} {rhs}");
                bare = b;
            }
        }
        (e, bare)
    }

    const SOUP: &[&str] = &[
        "host",
        "src",
        "dst",
        "net",
        "port",
        "portrange",
        "proto",
        "ip",
        "tcp",
        "udp",
        "arp",
        "ether",
        "and",
        "or",
        "not",
        "!",
        "(",
        ")",
        "(",
        ")",
        "10.0.0.1",
        "10.0.0.0/8",
        "80",
        "443",
        "1000-1100",
        "\\tcp",
        "6",
        "mask",
        "255.0.0.0",
        "10.1",
        "2:0:0:0:0:1",
        "&&",
        "||",
    ];

    #[test]
    fn tcpdump_oracle_random_expressions() {
        let mut r = Rng::new(0x2545_f491_4f6c_dd1d);
        let frames: Vec<Vec<u8>> = frames().into_iter().step_by(4).collect();
        let _g = PCAP.lock().unwrap_or_else(|e| e.into_inner());
        let cap = pcap::Capture::dead(pcap::Linktype::ETHERNET).unwrap();
        let mut failures = Vec::new();
        let (mut both_ok, mut both_err, mut only_pcap, mut optimizer_bugs) = (0, 0, 0, 0);
        for k in 0..10000 {
            let expr = if k % 3 == 2 {
                let n = 1 + r.below(7);
                (0..n).map(|_| r.pick(SOUP)).collect::<Vec<_>>().join(" ")
            } else {
                gen_expr(&mut r, 0).0
            };
            let ours = compile(&expr);
            let (raw, opt) = match libpcap(&cap, &expr) {
                Ok(p) => p,
                Err(e) => {
                    both_err += 1;
                    if let Ok(fs) = ours {
                        failures.push(format!(
                            "{expr:?}: libpcap: {e}, dpf accepts:\n{}",
                            explain_dnf(&fs)
                        ));
                    }
                    continue;
                }
            };
            let fs = match ours {
                Ok(fs) => fs,
                Err(DpfError::Unsupported(_)) | Err(DpfError::TooManyElems(_)) => {
                    only_pcap += 1;
                    continue;
                }
                Err(e) => {
                    failures.push(format!("{expr:?}: libpcap accepts, dpf: {e}"));
                    continue;
                }
            };
            both_ok += 1;
            for f in &frames {
                let want = raw.filter(f);
                if opt.as_ref().is_some_and(|p| p.filter(f)) != want {
                    optimizer_bugs += 1;
                }
                if want != matches(&fs, f) {
                    failures.push(format!(
                        "{expr:?}: libpcap {want}, dpf {} on frame {}\n{}",
                        !want,
                        hex(f),
                        explain_dnf(&fs)
                    ));
                    break;
                }
            }
        }
        println!("libpcap's optimizer disagrees with itself on {optimizer_bugs} (expression, frame) pairs");
        println!("random expressions: {both_ok} compared, {both_err} rejected by both, {only_pcap} too complex here");
        assert!(both_ok > 1000, "{both_ok}");
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}
