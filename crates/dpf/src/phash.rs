//! Collision-free hash tables for disjunction nodes with many keys (the
//! paper's "fast disjunctions", scaled to tens of thousands of keys).
//!
//! Two-level perfect hashing (Fredman, Komlós, Szemerédi): a multiply-shift
//! hash picks a bucket; each bucket has its own multiplier into a private
//! sub-table of at least `keys²` slots, chosen so that its keys never
//! collide. A lookup is two multiplies and three loads, and a key is always
//! confirmed against the slot, so a miss is exact.
//!
//! The tables are data, not code: the JIT reads them through a [`TableDesc`],
//! so adding a key (the paper's fast case) only rebuilds one bucket and never
//! regenerates code.

use std::collections::HashMap;

/// What the generated code reads: the level-1 hash and the two arrays.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TableDesc {
    pub mul: u64,
    pub shift: u64,
    pub buckets: *const Bucket,
    pub slots: *const Slot,
}

pub const DESC_MUL: i32 = 0;
pub const DESC_SHIFT: i32 = 8;
pub const DESC_BUCKETS: i32 = 16;
pub const DESC_SLOTS: i32 = 24;
pub const DESC_SIZE: i64 = 32;

/// A bucket's sub-table: slot = `base + ((key * mul) >> shift)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Bucket {
    pub mul: u64,
    pub shift: u64,
    pub base: u64,
}

pub const BUCKET_SIZE: i64 = 24;

/// A slot: `val == 0` marks an empty slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub key: u64,
    pub val: u64,
}

pub const SLOT_SIZE: i64 = 16;

/// A multiply-shift hash to `2^bits` values; `bits == 0` maps all to 0.
fn hash(key: u64, mul: u64, shift: u64) -> u64 {
    key.wrapping_mul(mul) >> shift
}

fn params(bits: u32, rng: &mut u64) -> (u64, u64) {
    if bits == 0 {
        (0, 63)
    } else {
        (next_odd(rng), 64 - bits as u64)
    }
}

fn next_odd(rng: &mut u64) -> u64 {
    // splitmix64: deterministic, so the same filters give the same tables.
    *rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *rng;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

#[derive(Clone, Debug)]
pub struct PerfectHash {
    entries: HashMap<u64, u64>,
    mul: u64,
    shift: u64,
    bits: u32,
    buckets: Vec<Bucket>,
    /// Keys of each bucket, to rebuild one bucket alone.
    members: Vec<Vec<u64>>,
    /// Sub-table size (log2) of each bucket, `None` when empty.
    sizes: Vec<Option<u32>>,
    slots: Vec<Slot>,
    rng: u64,
}

impl PerfectHash {
    /// Builds a table of `(key, value)`; values must be non-zero.
    pub fn build(entries: impl IntoIterator<Item = (u64, u64)>) -> PerfectHash {
        let mut t = PerfectHash {
            entries: entries.into_iter().collect(),
            mul: 0,
            shift: 63,
            bits: 0,
            buckets: Vec::new(),
            members: Vec::new(),
            sizes: Vec::new(),
            slots: Vec::new(),
            rng: 0x5eed,
        };
        t.rebuild();
        t
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn get(&self, key: u64) -> Option<u64> {
        let b = &self.buckets[hash(key, self.mul, self.shift) as usize];
        let s = &self.slots[(b.base + hash(key, b.mul, b.shift)) as usize];
        (s.key == key && s.val != 0).then_some(s.val)
    }

    pub fn desc(&self) -> TableDesc {
        TableDesc {
            mul: self.mul,
            shift: self.shift,
            buckets: self.buckets.as_ptr(),
            slots: self.slots.as_ptr(),
        }
    }

    pub fn slots_len(&self) -> usize {
        self.slots.len()
    }

    /// Inserts or replaces a key; only the key's bucket is rebuilt.
    pub fn insert(&mut self, key: u64, val: u64) {
        debug_assert!(val != 0);
        if self.entries.insert(key, val).is_some() {
            let b = hash(key, self.mul, self.shift) as usize;
            let bk = self.buckets[b];
            self.slots[(bk.base + hash(key, bk.mul, bk.shift)) as usize].val = val;
            return;
        }
        let n = self.entries.len();
        if n > 2 * self.buckets.len() || self.slots.len() > 8 * n + 64 {
            self.rebuild();
            return;
        }
        let b = hash(key, self.mul, self.shift) as usize;
        self.members[b].push(key);
        self.place_bucket(b);
    }

    pub fn remove(&mut self, key: u64) -> Option<u64> {
        let v = self.entries.remove(&key)?;
        let b = hash(key, self.mul, self.shift) as usize;
        let bk = self.buckets[b];
        self.slots[(bk.base + hash(key, bk.mul, bk.shift)) as usize] = Slot::default();
        self.members[b].retain(|&k| k != key);
        Some(v)
    }

    /// Everything from scratch: the level-1 size follows the key count, and
    /// a multiplier is drawn until the sub-tables need at most 4n slots.
    fn rebuild(&mut self) {
        let n = self.entries.len().max(1);
        self.bits = n.next_power_of_two().trailing_zeros();
        let keys: Vec<u64> = self.entries.keys().copied().collect();
        loop {
            (self.mul, self.shift) = params(self.bits, &mut self.rng);
            let nb = 1usize << self.bits;
            self.members = vec![Vec::new(); nb];
            for &k in &keys {
                self.members[hash(k, self.mul, self.shift) as usize].push(k);
            }
            let squares: usize = self.members.iter().map(|m| m.len() * m.len()).sum();
            if squares <= 4 * n {
                break;
            }
        }
        self.buckets = vec![Bucket::default(); 1 << self.bits];
        self.sizes = vec![None; 1 << self.bits];
        self.slots = vec![Slot::default()];
        for b in 0..self.buckets.len() {
            self.place_bucket(b);
        }
    }

    /// Gives bucket `b` a collision-free sub-table at the end of `slots`
    /// (its old region is abandoned until the next full rebuild), or keeps
    /// its region if the present multiplier still separates its keys.
    fn place_bucket(&mut self, b: usize) {
        let keys = &self.members[b];
        if keys.is_empty() {
            // An empty bucket points at slot 0, which is kept empty.
            self.buckets[b] = Bucket {
                mul: 0,
                shift: 63,
                base: 0,
            };
            self.sizes[b] = None;
            return;
        }
        let need = (keys.len() * keys.len())
            .next_power_of_two()
            .trailing_zeros();
        if let Some(bits) = self.sizes[b] {
            if bits >= need && self.try_fill(b, self.buckets[b]) {
                return;
            }
        }
        let base = self.slots.len() as u64;
        self.slots
            .resize(self.slots.len() + (1usize << need), Slot::default());
        loop {
            let (mul, shift) = params(need, &mut self.rng);
            let bk = Bucket { mul, shift, base };
            if self.try_fill(b, bk) {
                self.buckets[b] = bk;
                self.sizes[b] = Some(need);
                return;
            }
        }
    }

    /// Writes bucket `b`'s keys into the sub-table `bk`, if none collide.
    fn try_fill(&mut self, b: usize, bk: Bucket) -> bool {
        let size = if bk.mul == 0 {
            1
        } else {
            1usize << (64 - bk.shift)
        };
        let region = bk.base as usize..bk.base as usize + size;
        let mut used = vec![false; size];
        for &k in &self.members[b] {
            let i = hash(k, bk.mul, bk.shift) as usize;
            if used[i] {
                return false;
            }
            used[i] = true;
        }
        self.slots[region.clone()].fill(Slot::default());
        for &k in &self.members[b] {
            let i = bk.base as usize + hash(k, bk.mul, bk.shift) as usize;
            self.slots[i] = Slot {
                key: k,
                val: self.entries[&k],
            };
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
        assert!(t.slots_len() <= 8 * t.len() + 64 + 4 * t.len());
        for k in 1000..20000u64 {
            assert_eq!(t.remove(k << 16), Some(k));
            assert_eq!(t.get(k << 16), None);
        }
        assert_eq!(t.get(7919), Some(2));
        assert_eq!(t.get(0), Some(1));
    }

    #[test]
    fn empty_table_misses() {
        let t = PerfectHash::build([]);
        assert_eq!(t.get(0), None);
        assert_eq!(t.get(42), None);
    }
}
