//! The JIT, the trie interpreter and the per-rule brute force must agree on
//! every frame, for random sets of filters (with inserts and deletes).

use exonet_dpf::{Dpf, Engine, Filter, FilterId, Op, Width};
use exonet_wire::rng::SplitMix64;
use proptest::prelude::*;

/// Frames from a small alphabet, so that filters built from one frame's
/// bytes often match others too; some are short.
fn frames(rng: &mut SplitMix64, n: usize) -> Vec<Vec<u8>> {
    let alphabet = [0u8, 1, 2, 3, 4, 0x45, 0x08, 0xff, 0x11, 0x06];
    (0..n)
        .map(|_| {
            let len = if rng.below(4) == 0 {
                rng.below(40) as usize
            } else {
                40 + rng.below(60) as usize
            };
            (0..len).map(|_| rng.pick(&alphabet)).collect()
        })
        .collect()
}

fn read_be(frame: &[u8], off: usize, w: Width) -> Option<u32> {
    let b = frame.get(off..off + w.bytes() as usize)?;
    Some(b.iter().fold(0u32, |a, &x| (a << 8) | x as u32))
}

/// A filter whose constants come from `model`, so it likely matches it.
fn filter(rng: &mut SplitMix64, model: &[u8]) -> Filter {
    let mut f = Filter::new();
    let mut base = 0usize;
    let atoms = 1 + rng.below(6);
    let mut made = 0;
    while made < atoms {
        match rng.below(10) {
            0 => {
                let c = rng.below(9) as u32;
                f = f.shift(c);
                base += c as usize;
            }
            1 => {
                let off = rng.below(6) as u32;
                let shl = rng.below(3) as u8;
                let mask = rng.pick(&[0x0fu32, 0x03, 0x01, 0x07]);
                f = f.shift_by(off, Width::U8, mask, shl);
                base += model
                    .get(base + off as usize)
                    .map_or(0, |&b| ((b as u32 & mask) << shl) as usize);
            }
            _ => {
                let w = rng.pick(&[Width::U8, Width::U8, Width::U16, Width::U32]);
                let off = rng.below(24) as u32;
                let mask = match rng.below(4) {
                    0 => (rng.next_u64() as u32 & w.full_mask()) | 1,
                    1 => w.full_mask() >> 8 | 1,
                    _ => w.full_mask(),
                };
                let seen =
                    read_be(model, base + off as usize, w).unwrap_or(rng.next_u64() as u32) & mask;
                let op = rng.pick(&[
                    Op::Eq,
                    Op::Eq,
                    Op::Eq,
                    Op::Ne,
                    Op::Lt,
                    Op::Le,
                    Op::Gt,
                    Op::Ge,
                ]);
                let value = match op {
                    Op::Eq | Op::Ne | Op::Le | Op::Ge => seen,
                    Op::Lt => seen.saturating_add(rng.below(3) as u32) & w.full_mask(),
                    Op::Gt => seen.saturating_sub(rng.below(3) as u32),
                };
                f = f.masked(off, w, mask, op, value);
                made += 1;
            }
        }
    }
    f
}

fn check(seed: u64, nfilters: usize) {
    let mut rng = SplitMix64::new(seed);
    let fr = frames(&mut rng, 60);
    let mut jit = Dpf::with_engine(Engine::Jit);
    let mut interp = Dpf::with_engine(Engine::Interp);
    let mut ids: Vec<FilterId> = Vec::new();
    let mut log = String::new();
    let agree = |jit: &Dpf, interp: &Dpf, what: &str, log: &str| {
        let refs: Vec<&[u8]> = fr.iter().map(|f| &f[..]).collect();
        let mut batch = vec![None; refs.len()];
        jit.demux_batch(&refs, &mut batch);
        for (f, b) in fr.iter().zip(&batch) {
            assert_eq!(*b, jit.demux(f), "batch vs one, seed {seed} {what}\n{log}");
            // A batch of one takes its own path.
            let mut lone = [None];
            jit.demux_batch(&[&f[..]], &mut lone);
            assert_eq!(lone[0], *b, "batch of one, seed {seed} {what}\n{log}");
        }
        for f in &fr {
            let (a, b, c) = (jit.demux(f), interp.demux(f), interp.brute_force(f));
            assert_eq!(
                b,
                c,
                "interp vs brute force, seed {seed} {what}\n{log}\n{}\nframe {f:02x?}",
                interp.explain()
            );
            assert_eq!(
                a,
                b,
                "jit vs interp, seed {seed} {what}\n{log}\n{}\nframe {f:02x?}",
                jit.explain()
            );
        }
    };
    for i in 0..nfilters {
        let model = fr[rng.below(fr.len() as u64) as usize].clone();
        let conj: Vec<Filter> = (0..1 + rng.below(2) as usize * rng.below(3) as usize)
            .map(|_| filter(&mut rng, &model))
            .collect();
        let prio = (rng.below(4) == 0).then(|| rng.below(8) as u16);
        log += &format!(
            "insert {prio:?}: {}\n",
            conj.iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let a = jit.insert_with(&conj, prio);
        let b = interp.insert_with(&conj, prio);
        assert_eq!(a, b);
        if let Ok(id) = a {
            ids.push(id);
        }
        if i % 5 == 4 {
            agree(&jit, &interp, "after inserts", &log);
        }
    }
    agree(&jit, &interp, "all inserted", &log);
    while ids.len() > nfilters / 2 {
        let id = ids.swap_remove(rng.below(ids.len() as u64) as usize);
        log += &format!("delete {id}\n");
        jit.delete(id).unwrap();
        interp.delete(id).unwrap();
        agree(&jit, &interp, "after delete", &log);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    #[test]
    fn jit_interp_and_brute_force_agree(seed in any::<u64>(), n in 1usize..40) {
        check(seed, n);
    }
}

fn port_filter(port: u32) -> Filter {
    Filter::new()
        .eq(12, Width::U16, 0x0800)
        .eq(23, Width::U8, 6)
        .shift(14)
        .shift_by(0, Width::U8, 0x0f, 2)
        .eq(2, Width::U16, port)
}

fn tcp_frame(dport: u16, ihl: u8) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 4 * ihl as usize + 20];
    f[12] = 8;
    f[14] = 0x40 | ihl;
    f[23] = 6;
    let t = 14 + 4 * ihl as usize;
    f[t + 2..t + 4].copy_from_slice(&dport.to_be_bytes());
    f
}

#[test]
fn hash_keys_are_added_without_regenerating_code() {
    let mut d = Dpf::new();
    let mut ids = Vec::new();
    for p in 0..2000u32 {
        ids.push(d.insert(&port_filter(1000 + p)).unwrap());
    }
    let compiles = d.stats().compiles;
    assert!(compiles < 10, "{compiles} compiles for one family");
    assert!(d.stats().fast_updates >= 1990);
    for (i, p) in (0..2000u16).step_by(7).enumerate() {
        let frame = tcp_frame(1000 + p, 5 + (i % 3) as u8);
        assert_eq!(d.demux(&frame), Some(ids[p as usize]));
    }
    assert_eq!(d.demux(&tcp_frame(999, 5)), None);
    assert_eq!(d.demux(&tcp_frame(1000, 5)[..37]), None);
    // Deleting leaf keys is data-only as well.
    for id in ids.drain(..1000) {
        d.delete(id).unwrap();
    }
    assert_eq!(d.stats().compiles, compiles);
    assert_eq!(d.demux(&tcp_frame(1000, 5)), None);
    assert_eq!(d.demux(&tcp_frame(1999, 5)), None);
    assert_eq!(d.demux(&tcp_frame(2999, 5)), Some(ids[999]));
}

#[test]
fn figure_1_filter_matches_its_packet_only() {
    let f: Filter = "(12:16 == 0x800) & SHIFT(14) & (9:8 == 6) & (12:32 == 0xc00c4501) & SHIFT(20) & (0:16 == 1234) & (2:16 == 4321)"
        .parse()
        .unwrap();
    let mut d = Dpf::new();
    let id = d.insert(&f).unwrap();
    let mut p = tcp_frame(4321, 5);
    p[26..30].copy_from_slice(&[0xc0, 0x0c, 0x45, 0x01]);
    p[34..36].copy_from_slice(&1234u16.to_be_bytes());
    assert_eq!(d.demux(&p), Some(id));
    p[29] = 2;
    assert_eq!(d.demux(&p), None);
    assert!(d.code_size() > 0);
    assert!(d.explain().contains("coalesced"));
}

#[test]
fn no_frame_reads_past_its_end() {
    // Every prefix of a matching frame: the JIT must reject, not read on.
    let mut d = Dpf::new();
    d.insert(&port_filter(80)).unwrap();
    let frame = tcp_frame(80, 15);
    let need = 14 + 60 + 4;
    for len in 0..need {
        // A fresh allocation of exactly `len` bytes, so reading past it
        // would be caught by tools like valgrind or ASan.
        let short: Vec<u8> = frame[..len].to_vec();
        assert_eq!(d.demux(&short), None, "len {len}");
    }
    assert!(d.demux(&frame).is_some());
}

fn tuple_filter(src: u32, sport: u32, dport: u32) -> Filter {
    Filter::new()
        .eq(12, Width::U16, 0x0800)
        .eq(23, Width::U8, 6)
        .eq(26, Width::U32, src)
        .shift(14)
        .shift_by(0, Width::U8, 0x0f, 2)
        .eq(0, Width::U16, sport)
        .eq(2, Width::U16, dport)
}

fn tuple_frame(src: u32, sport: u16, dport: u16, ihl: u8) -> Vec<u8> {
    let mut f = tcp_frame(dport, ihl);
    f[26..30].copy_from_slice(&src.to_be_bytes());
    let t = 14 + 4 * ihl as usize;
    f[t..t + 2].copy_from_slice(&sport.to_be_bytes());
    f
}

/// Disjunctions whose keys each lead down the same chain of `==` atoms
/// (source port, then destination port) hash the coalesced value; inserts
/// and deletes of such filters change only the table, and every engine
/// still agrees, also when the chains stop being alike.
#[test]
fn flattened_disjunctions_agree_and_update_in_place() {
    let mut jit = Dpf::new();
    let mut interp = Dpf::with_engine(Engine::Interp);
    let mut ids = Vec::new();
    let src = 0x0a4d_0105;
    for i in 0..300u32 {
        let f = tuple_filter(src, 1000 + i, 80 + i % 7);
        ids.push(jit.insert(&f).unwrap());
        interp.insert(&f).unwrap();
    }
    assert!(jit.explain().contains("1 flattened"), "{}", jit.explain());
    let compiles = jit.stats().compiles;
    assert!(compiles < 10, "{compiles} compiles");
    let frames: Vec<Vec<u8>> = (0..320u32)
        .flat_map(|i| {
            [
                tuple_frame(
                    src,
                    (1000 + i) as u16,
                    (80 + i % 7) as u16,
                    5 + (i % 3) as u8,
                ),
                tuple_frame(src, (1000 + i) as u16, 81, 5),
                tuple_frame(src + 1, (1000 + i) as u16, (80 + i % 7) as u16, 5),
            ]
        })
        .collect();
    let check = |jit: &Dpf, interp: &Dpf| {
        for f in &frames {
            assert_eq!(jit.demux(f), interp.demux(f), "frame {f:02x?}");
            assert_eq!(interp.demux(f), interp.brute_force(f));
        }
    };
    check(&jit, &interp);
    for id in ids.drain(..100) {
        jit.delete(id).unwrap();
        interp.delete(id).unwrap();
    }
    assert_eq!(jit.stats().compiles, compiles);
    check(&jit, &interp);
    // A listener on a destination port alone: the chains differ now.
    let listen = Filter::new()
        .eq(12, Width::U16, 0x0800)
        .eq(23, Width::U8, 6)
        .eq(26, Width::U32, src)
        .shift(14)
        .shift_by(0, Width::U8, 0x0f, 2)
        .eq(0, Width::U16, 1150);
    jit.insert(&listen).unwrap();
    interp.insert(&listen).unwrap();
    check(&jit, &interp);
}

/// Few keys (compare chains, branch-free for leaves) up to the hash tables,
/// checked at every size, with priorities that differ per key.
#[test]
fn small_disjunctions_agree_at_every_size() {
    let mut jit = Dpf::new();
    let mut interp = Dpf::with_engine(Engine::Interp);
    let frames: Vec<Vec<u8>> = (0..12u16).map(|p| tcp_frame(100 + p, 5)).collect();
    for p in 0..10u32 {
        let prio = Some((p % 3) as u16);
        let f = [port_filter(100 + p)];
        assert_eq!(jit.insert_with(&f, prio), interp.insert_with(&f, prio));
        // A catch-all listener on the same path competes with each port.
        if p == 3 {
            let all = Filter::new()
                .eq(12, Width::U16, 0x0800)
                .eq(23, Width::U8, 6);
            jit.insert_with(std::slice::from_ref(&all), Some(1))
                .unwrap();
            interp.insert_with(&[all], Some(1)).unwrap();
        }
        for f in &frames {
            assert_eq!(jit.demux(f), interp.demux(f), "{} ports", p + 1);
            assert_eq!(interp.demux(f), interp.brute_force(f));
        }
    }
}
