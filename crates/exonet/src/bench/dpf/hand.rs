//! `hand-rust`: the classifiers a careful engineer would write by hand in
//! Rust for each case: check the EtherType, then the IP protocol, then look
//! the port / address tuple up in a `HashMap` with a fast hash (FxHash, the
//! multiply-rotate hash rustc uses) keyed on the tuple and giving the filter
//! index. Each mirrors its DPF filter exactly: same fields, same fixed or
//! variable IP header, and no match when any field it reads is past the end
//! of the frame.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::cases::{
    DPORT, DST_MAC_WORD, INNER_KEY, INNER_TYPE, SPORT, SRC_IP, XL_CHANNEL, XL_TYPE,
};

/// FxHash: one rotate, xor and multiply per word.
#[derive(Clone, Copy, Default)]
pub struct FxHasher(u64);

const FX_K: u64 = 0x517c_c1b7_2722_0a95;

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(FX_K);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64)
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(i as u64)
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64)
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i)
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64)
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[inline(always)]
fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}

#[inline(always)]
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// The first `N` bytes of `b`, if it has them (one bounds check, after
/// which the compiler drops the per-byte ones).
#[inline(always)]
fn head<const N: usize>(b: &[u8]) -> Option<&[u8; N]> {
    b.get(..N)?.try_into().ok()
}

/// `tcp10` / `tcp10-var`: Ethernet type IP, protocol TCP, then the
/// (source address, source port, destination port) tuple as one `u64` key.
pub struct Tcp10 {
    map: FxHashMap<u64, usize>,
}

impl Tcp10 {
    pub fn new(src: u32, ports: &[(u16, u16)]) -> Tcp10 {
        let map = ports
            .iter()
            .enumerate()
            .map(|(i, &(s, d))| (key(src, (s as u32) << 16 | d as u32), i))
            .collect();
        Tcp10 { map }
    }

    /// Fixed 20-byte IP header: the ports at 34 and 36.
    #[inline]
    pub fn classify_fixed(&self, f: &[u8]) -> Option<usize> {
        let h = head::<38>(f)?;
        if be16(h, 12) != 0x0800 || h[23] != 6 {
            return None;
        }
        self.map.get(&key(be32(h, 26), be32(h, 34))).copied()
    }

    /// Variable IP header: the ports after `4 * IHL` bytes.
    #[inline]
    pub fn classify_var(&self, f: &[u8]) -> Option<usize> {
        let h = head::<30>(f)?;
        if be16(h, 12) != 0x0800 || h[23] != 6 {
            return None;
        }
        let tcp = 14 + ((h[14] & 0x0f) as usize) * 4;
        let ports = head::<4>(f.get(tcp..)?)?;
        self.map
            .get(&key(be32(h, 26), u32::from_be_bytes(*ports)))
            .copied()
    }
}

#[inline(always)]
fn key(src: u32, ports: u32) -> u64 {
    (src as u64) << 32 | ports as u64
}

/// `ports-N`: Ethernet type IP, protocol TCP, variable IP header, then the
/// destination port.
pub struct Ports {
    map: FxHashMap<u16, usize>,
}

impl Ports {
    pub fn new(ports: &[u16]) -> Ports {
        Ports {
            map: ports.iter().enumerate().map(|(i, &p)| (p, i)).collect(),
        }
    }

    #[inline]
    pub fn classify(&self, f: &[u8]) -> Option<usize> {
        let h = head::<24>(f)?;
        if be16(h, 12) != 0x0800 || h[23] != 6 {
            return None;
        }
        let tcp = 14 + ((h[14] & 0x0f) as usize) * 4;
        let t = head::<4>(f.get(tcp..)?)?;
        self.map.get(&be16(t, 2)).copied()
    }
}

/// `depth-D`: one filter, so straight-line compares against constants,
/// level by level (the `if D == ..` fold away at compile time).
#[inline]
pub fn depth<const D: usize>(f: &[u8]) -> Option<usize> {
    let eth = head::<14>(f)?;
    if be16(eth, 12) != 0x0800 || be32(eth, 0) != DST_MAC_WORD {
        return None;
    }
    if D == 1 {
        return Some(0);
    }
    let ip = f.get(14..)?;
    let h = head::<16>(ip)?;
    if h[9] != 6 || be32(h, 12) != SRC_IP {
        return None;
    }
    if D == 2 {
        return Some(0);
    }
    let tcp = ip.get(((h[0] & 0x0f) as usize) * 4..)?;
    let t = head::<4>(tcp)?;
    if be16(t, 0) != SPORT || be16(t, 2) != DPORT {
        return None;
    }
    if D == 3 {
        return Some(0);
    }
    let xl = tcp.get(20..)?;
    let x = head::<4>(xl)?;
    if x[1] != XL_TYPE || be16(x, 2) != XL_CHANNEL {
        return None;
    }
    if D == 4 {
        return Some(0);
    }
    let inner = xl.get(((x[0] & 0x0f) as usize) * 4..)?;
    let y = head::<8>(inner)?;
    if y[1] != INNER_TYPE || be32(y, 4) != INNER_KEY {
        return None;
    }
    Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::dpf::cases::{Kind, Spec};

    /// The hand-written classifiers agree with the filters' definition on
    /// the case frames and on every truncation of them.
    #[test]
    fn mirrors_the_filters() {
        for spec in [
            Spec::Tcp10 { var_header: false },
            Spec::Tcp10 { var_header: true },
            Spec::Ports(3),
            Spec::Depth(1),
            Spec::Depth(2),
            Spec::Depth(3),
            Spec::Depth(4),
            Spec::Depth(5),
        ] {
            let case = spec.build().unwrap();
            type Classify = Box<dyn Fn(&[u8]) -> Option<usize>>;
            let classify: Classify = match &case.kind {
                Kind::Tcp10 { var_header, ports } => {
                    let t = Tcp10::new(SRC_IP, ports);
                    if *var_header {
                        Box::new(move |f| t.classify_var(f))
                    } else {
                        Box::new(move |f| t.classify_fixed(f))
                    }
                }
                Kind::Ports(p) => {
                    let t = Ports::new(p);
                    Box::new(move |f| t.classify(f))
                }
                Kind::Depth(1) => Box::new(depth::<1>),
                Kind::Depth(2) => Box::new(depth::<2>),
                Kind::Depth(3) => Box::new(depth::<3>),
                Kind::Depth(4) => Box::new(depth::<4>),
                Kind::Depth(_) => Box::new(depth::<5>),
            };
            for f in &case.frames {
                for len in 0..=f.len() {
                    let want = case.filters.iter().position(|x| x.matches(&f[..len]));
                    assert_eq!(classify(&f[..len]), want, "{} len {len}", case.name);
                }
            }
        }
    }
}
