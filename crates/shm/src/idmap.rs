//! Maps keyed by the small integer ids both sides use (channels, endpoints):
//! looked up once per frame, so hashed with one multiplication instead of
//! SipHash. The ids come from the multiplexer's own counters; nothing an
//! application chooses can steer them into collisions.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by a `u32` id.
pub type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing: the id times 2^64 / φ, which spreads consecutive ids
/// over the high bits hashbrown takes its control bytes from and keeps the
/// low bits distinct.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_map_and_spread() {
        let mut m: IdMap<u32> = IdMap::default();
        for i in 0..10_000 {
            m.insert(i, i * 2);
        }
        assert!((0..10_000).all(|i| m[&i] == i * 2));
        let h = |v: u32| {
            let mut h = IdHasher::default();
            h.write_u32(v);
            h.finish()
        };
        // Consecutive ids differ in their top 7 bits (hashbrown's tags) often.
        let tags: std::collections::HashSet<u64> = (0..128).map(|v| h(v) >> 57).collect();
        assert!(tags.len() > 64, "{} distinct tags", tags.len());
    }
}
