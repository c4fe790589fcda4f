//! Collision-free hash tables for disjunction nodes with many keys (the
//! paper's "fast disjunctions", scaled to tens of thousands of keys).
//!
//! Two-level perfect hashing (Fredman, Komlós, Szemerédi): a multiply-shift
//! hash picks a bucket; each bucket has its own multiplier into a private
//! sub-table of at least `keys²` slots, chosen so that its keys never
//! collide. A key is always confirmed against its slot, so a miss is exact.
//!
//! Up to [`SINGLE_MAX`] keys, one level is enough: a table of at least
//! `keys²` slots where one multiplier separates all keys, so a lookup is one
//! multiply and one load (DPF's "hash function chosen for the keys").
//!
//! Layout for the cache: a bucket is one packed word (about two keys per
//! bucket, so 10 000 keys need 64 KiB of buckets), and keys and values are
//! separate arrays indexed by the same slot, so the key compare and the
//! value load are issued together. A lookup is one dependent load of the
//! bucket and then one of the slot.
//!
//! The tables are data, not code: the JIT reads them through a [`TableDesc`],
//! so adding a key (the paper's fast case) only rebuilds one bucket and never
//! regenerates code.

use std::collections::HashMap;

use exonet_wire::rng::SplitMix64;

/// What the generated code reads: the level-1 hash and the three arrays.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TableDesc {
    pub mul: u64,
    pub shift: u64,
    pub buckets: *const u64,
    pub keys: *const u64,
    pub vals: *const u64,
}

pub const DESC_MUL: i32 = 0;
pub const DESC_SHIFT: i32 = 8;
pub const DESC_BUCKETS: i32 = 16;
pub const DESC_KEYS: i32 = 24;
pub const DESC_VALS: i32 = 32;
pub const DESC_SIZE: i64 = 40;

/// A bucket's sub-table, packed in a word: slot = `base + ((h * mul) >> shift)`
/// where `h = key * level-1 multiplier` (a bijection of the key, so keys
/// stay distinct, and well mixed, so a 32-bit multiplier separates them)
/// with `mul` in bits 0..32, `shift` in bits 32..38, `base` in bits 38..64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub mul: u32,
    pub shift: u32,
    pub base: u64,
}

pub const BUCKET_SHIFT_POS: i64 = 32;
pub const BUCKET_BASE_POS: i64 = 38;

impl Bucket {
    fn pack(&self) -> u64 {
        self.mul as u64 | (self.shift as u64) << BUCKET_SHIFT_POS | self.base << BUCKET_BASE_POS
    }

    /// The slot of a key whose level-1 product is `h`.
    fn slot(&self, h: u64) -> usize {
        (self.base + hash(h, self.mul as u64, self.shift as u64)) as usize
    }
}

/// Most keys of a one-level table (it needs `keys²` slots).
pub const SINGLE_MAX: usize = 32;

/// Most slots a table may have: `base` has 26 bits.
const MAX_SLOTS: usize = 1 << 26;

/// A multiply-shift hash to `2^(64 - shift)` values (all to 0 with `mul == 0`).
fn hash(key: u64, mul: u64, shift: u64) -> u64 {
    key.wrapping_mul(mul) >> shift
}

/// Sub-table hash: a 32-bit odd multiplier, so it packs into a bucket word.
fn params32(bits: u32, rng: &mut SplitMix64) -> (u32, u32) {
    if bits == 0 {
        (0, 63)
    } else {
        (next_odd(rng) as u32 | 1, 64 - bits)
    }
}

/// An odd multiplier; the generator is deterministic, so the same filters
/// give the same tables.
fn next_odd(rng: &mut SplitMix64) -> u64 {
    rng.next_u64() | 1
}

#[derive(Clone, Debug)]
pub struct PerfectHash {
    entries: HashMap<u64, u64>,
    mul: u64,
    shift: u64,
    bits: u32,
    /// One level: slot = `(key * mul) >> shift`; no buckets.
    single: bool,
    buckets: Vec<Bucket>,
    packed: Vec<u64>,
    /// Keys of each bucket, to rebuild one bucket alone.
    members: Vec<Vec<u64>>,
    /// Sub-table size (log2) of each bucket, `None` when empty.
    sizes: Vec<Option<u32>>,
    keys: Vec<u64>,
    vals: Vec<u64>,
    rng: SplitMix64,
}

impl PerfectHash {
    /// Builds a table of `(key, value)`; values must be non-zero. One level
    /// if there are at most [`SINGLE_MAX`] keys, else two.
    pub fn build(entries: impl IntoIterator<Item = (u64, u64)>) -> PerfectHash {
        let entries: HashMap<u64, u64> = entries.into_iter().collect();
        let mut t = PerfectHash {
            single: entries.len() <= SINGLE_MAX,
            entries,
            mul: 0,
            shift: 63,
            bits: 0,
            buckets: Vec::new(),
            packed: Vec::new(),
            members: Vec::new(),
            sizes: Vec::new(),
            keys: Vec::new(),
            vals: Vec::new(),
            rng: SplitMix64::new(0x5eed),
        };
        t.rebuild();
        t
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_single(&self) -> bool {
        self.single
    }

    fn slot(&self, key: u64) -> usize {
        if self.single {
            hash(key, self.mul, self.shift) as usize
        } else {
            self.buckets[hash(key, self.mul, self.shift) as usize].slot(key.wrapping_mul(self.mul))
        }
    }

    #[cfg(test)]
    pub fn get(&self, key: u64) -> Option<u64> {
        let i = self.slot(key);
        (self.keys[i] == key && self.vals[i] != 0).then_some(self.vals[i])
    }

    pub fn desc(&self) -> TableDesc {
        TableDesc {
            mul: self.mul,
            shift: self.shift,
            buckets: self.packed.as_ptr(),
            keys: self.keys.as_ptr(),
            vals: self.vals.as_ptr(),
        }
    }

    pub fn slots_len(&self) -> usize {
        self.keys.len()
    }

    /// Inserts or replaces a key; only the key's bucket is rebuilt. False
    /// (and nothing changed) if a one-level table would outgrow
    /// [`SINGLE_MAX`]: the code that reads it must change.
    pub fn insert(&mut self, key: u64, val: u64) -> bool {
        debug_assert!(val != 0);
        if let Some(v) = self.entries.get_mut(&key) {
            *v = val;
            let i = self.slot(key);
            self.vals[i] = val;
            return true;
        }
        if self.single {
            if self.entries.len() >= SINGLE_MAX {
                return false;
            }
            self.entries.insert(key, val);
            let i = self.slot(key);
            if self.vals[i] == 0 {
                self.keys[i] = key;
                self.vals[i] = val;
            } else {
                self.rebuild_single();
            }
            return true;
        }
        self.entries.insert(key, val);
        let n = self.entries.len();
        if n > 4 * self.buckets.len() || self.keys.len() > 16 * n + 64 {
            self.rebuild();
            return true;
        }
        let b = hash(key, self.mul, self.shift) as usize;
        self.members[b].push(key);
        self.place_bucket(b);
        true
    }

    pub fn remove(&mut self, key: u64) -> Option<u64> {
        let v = self.entries.remove(&key)?;
        let i = self.slot(key);
        self.keys[i] = 0;
        self.vals[i] = 0;
        if !self.single {
            let b = hash(key, self.mul, self.shift) as usize;
            self.members[b].retain(|&k| k != key);
        }
        Some(v)
    }

    /// One level: `keys²` slots (at least 4), growing when no multiplier
    /// drawn separates the keys.
    fn rebuild_single(&mut self) {
        let n = self.entries.len();
        let mut bits = (n * n).max(4).next_power_of_two().trailing_zeros();
        let mut tries = 0;
        loop {
            let mul = next_odd(&mut self.rng);
            let shift = 64 - bits as u64;
            let mut used = vec![false; 1 << bits];
            let separates = self.entries.keys().all(|&k| {
                let i = hash(k, mul, shift) as usize;
                !std::mem::replace(&mut used[i], true)
            });
            if separates {
                (self.mul, self.shift, self.bits) = (mul, shift, bits);
                break;
            }
            tries += 1;
            if tries % 16 == 0 {
                bits += 1;
            }
        }
        self.keys = vec![0; 1 << self.bits];
        self.vals = vec![0; 1 << self.bits];
        for (&k, &v) in &self.entries {
            let i = hash(k, self.mul, self.shift) as usize;
            self.keys[i] = k;
            self.vals[i] = v;
        }
    }

    /// Everything from scratch: about two keys per bucket, and a multiplier
    /// drawn until the sub-tables need at most 6n slots (3n expected).
    fn rebuild(&mut self) {
        if self.single {
            return self.rebuild_single();
        }
        let n = self.entries.len().max(1);
        // At least two buckets: the level-1 shift must stay below 64.
        self.bits = n.div_ceil(2).next_power_of_two().trailing_zeros().max(1);
        let keys: Vec<u64> = self.entries.keys().copied().collect();
        loop {
            (self.mul, self.shift) = (next_odd(&mut self.rng), 64 - self.bits as u64);
            let nb = 1usize << self.bits;
            self.members = vec![Vec::new(); nb];
            for &k in &keys {
                self.members[hash(k, self.mul, self.shift) as usize].push(k);
            }
            let squares: usize = self.members.iter().map(|m| m.len() * m.len()).sum();
            if squares <= 6 * n {
                break;
            }
        }
        self.buckets = vec![Bucket::default(); 1 << self.bits];
        self.packed = vec![0; 1 << self.bits];
        self.sizes = vec![None; 1 << self.bits];
        // Slot 0 stays empty: empty buckets point at it.
        self.keys = vec![0];
        self.vals = vec![0];
        for b in 0..self.buckets.len() {
            self.place_bucket(b);
        }
    }

    /// Gives bucket `b` a collision-free sub-table at the end of the slot
    /// arrays (its old region is abandoned until the next full rebuild), or
    /// keeps its region if the present multiplier still separates its keys.
    fn place_bucket(&mut self, b: usize) {
        if self.members[b].is_empty() {
            self.set_bucket(
                b,
                Bucket {
                    mul: 0,
                    shift: 63,
                    base: 0,
                },
            );
            self.sizes[b] = None;
            return;
        }
        let c = self.members[b].len();
        let need = (c * c).next_power_of_two().trailing_zeros();
        if let Some(bits) = self.sizes[b] {
            if bits >= need && self.try_fill(b, self.buckets[b]) {
                return;
            }
        }
        let base = self.keys.len() as u64;
        let len = self.keys.len() + (1usize << need);
        assert!(
            len <= MAX_SLOTS,
            "perfect hash table over {MAX_SLOTS} slots"
        );
        self.keys.resize(len, 0);
        self.vals.resize(len, 0);
        loop {
            let (mul, shift) = params32(need, &mut self.rng);
            let bk = Bucket { mul, shift, base };
            if self.try_fill(b, bk) {
                self.set_bucket(b, bk);
                self.sizes[b] = Some(need);
                return;
            }
        }
    }

    fn set_bucket(&mut self, b: usize, bk: Bucket) {
        self.buckets[b] = bk;
        self.packed[b] = bk.pack();
    }

    /// Writes bucket `b`'s keys into the sub-table `bk`, if none collide.
    fn try_fill(&mut self, b: usize, bk: Bucket) -> bool {
        let size = if bk.mul == 0 {
            1
        } else {
            1usize << (64 - bk.shift)
        };
        // Most sub-tables have a few slots: their marks fit a word, and a
        // key's insert allocates nothing here.
        let mut small = 0u64;
        let mut used = if size > 64 {
            vec![false; size]
        } else {
            Vec::new()
        };
        for &k in &self.members[b] {
            let i = bk.slot(k.wrapping_mul(self.mul)) - bk.base as usize;
            let taken = match used.get_mut(i) {
                Some(u) => std::mem::replace(u, true),
                None => {
                    let was = small & 1 << i != 0;
                    small |= 1 << i;
                    was
                }
            };
            if taken {
                return false;
            }
        }
        let region = bk.base as usize..bk.base as usize + size;
        self.keys[region.clone()].fill(0);
        self.vals[region].fill(0);
        for &k in &self.members[b] {
            let i = bk.slot(k.wrapping_mul(self.mul));
            self.keys[i] = k;
            self.vals[i] = self.entries[&k];
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_key_and_no_other() {
        let mut t = PerfectHash::build((0..1000u64).map(|k| (k * 7919 % 65536, k + 1)));
        for k in 0..1000u64 {
            assert_eq!(t.get(k * 7919 % 65536), Some(k + 1));
        }
        assert_eq!(t.get(1), None);
        for k in 1000..20000u64 {
            t.insert(k << 16, k);
        }
        for k in 1000..20000u64 {
            assert_eq!(t.get(k << 16), Some(k));
        }
        assert!(t.slots_len() <= 16 * t.len() + 64 + 6 * t.len());
        for k in 1000..20000u64 {
            assert_eq!(t.remove(k << 16), Some(k));
            assert_eq!(t.get(k << 16), None);
        }
        assert_eq!(t.get(7919), Some(2));
        assert_eq!(t.get(0), Some(1));
    }

    #[test]
    fn one_level_tables_hold_up_to_single_max() {
        let mut t = PerfectHash::build((0..10u64).map(|k| (1234 + k, k + 1)));
        assert!(t.is_single());
        for k in 10..SINGLE_MAX as u64 {
            assert!(t.insert(1234 + k, k + 1));
        }
        assert!(!t.insert(99, 1));
        assert_eq!(t.get(99), None);
        for k in 0..SINGLE_MAX as u64 {
            assert_eq!(t.get(1234 + k), Some(k + 1));
        }
        assert_eq!(t.remove(1234), Some(1));
        assert_eq!(t.get(1234), None);
    }

    #[test]
    fn empty_table_misses() {
        let t = PerfectHash::build([]);
        assert_eq!(t.get(0), None);
        assert_eq!(t.get(42), None);
    }
}
