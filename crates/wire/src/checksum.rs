//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Sums here are 16-bit one's-complement sums *before* the final complement, so they
//! can be combined with [`add`] (e.g. a pseudo-header sum plus a segment sum) and
//! complemented once at the end. Verifying a region that contains its checksum field
//! yields a sum of `0xffff`.

use std::net::Ipv4Addr;

use crate::field::tail_word;
use crate::ipv4;

/// Shortest data that [`sum`] adds in several carry chains.
const CHAINS_FROM: usize = 256;

/// One's-complement sum of `data` as big-endian 16-bit words (an odd last byte is
/// padded with zero), folded to 16 bits.
///
/// Fast path (RFC 1071 §2(B), §4.1 "deferred carries"): the one's-complement sum is
/// byte-order independent, so words are loaded in native order, 64 bits at a time,
/// and added with end-around carry. Long data is added in four chains side by side
/// ([`sum_chains`]); the rest goes into one accumulator, 32 bytes per iteration, then
/// 8 bytes, then the zero-padded tail (faster on short data, where the chains' setup
/// would dominate). The folded result is swapped back to network order once. Any
/// alignment is accepted; loads are byte copies.
pub fn sum(data: &[u8]) -> u16 {
    let (mut acc, rest) = if data.len() >= CHAINS_FROM {
        sum_chains(data)
    } else {
        (0, data)
    };
    let mut blocks = rest.chunks_exact(32);
    for b in &mut blocks {
        acc = add64(acc, load(&b[0..8]));
        acc = add64(acc, load(&b[8..16]));
        acc = add64(acc, load(&b[16..24]));
        acc = add64(acc, load(&b[24..32]));
    }
    let mut words = blocks.remainder().chunks_exact(8);
    for w in &mut words {
        acc = add64(acc, load(w));
    }
    acc = add64(acc, tail_word(words.remainder()));
    // Native-order 16-bit lanes are byte-swapped words on little-endian hosts; the
    // one's-complement sum of swapped words is the swapped sum (RFC 1071 §2(B)).
    u16::from_be(fold(acc))
}

/// [`sum`]'s long loop: the unfolded sum of `data`'s 32-byte blocks, and the
/// rest. Apart, so that short data, the most summed (headers), does not pay
/// for its registers.
#[inline(never)]
fn sum_chains(data: &[u8]) -> (u64, &[u8]) {
    let mut blocks = data.chunks_exact(32);
    let acc = chains(&mut blocks);
    (acc, blocks.remainder())
}

/// The unfolded sum of 32-byte blocks, each 8-byte word in one of four
/// carry chains, which the CPU runs side by side: one chain waits on the
/// carry of every add (at 1448 bytes 10.4 against 16.3 GB/s; u32 words in
/// carry-free u64 lanes that the compiler vectorizes, 11.3).
#[inline(always)]
fn chains<'a>(blocks: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut c = [0u64; 4];
    for b in blocks {
        for (x, w) in c.iter_mut().zip(b.chunks_exact(8)) {
            *x = add64(*x, load(w));
        }
    }
    add64(add64(c[0], c[1]), add64(c[2], c[3]))
}

/// The sums ([`sum`]) of `data`'s whole `N`-byte blocks, one into each of
/// `out`, as far as both go: a send buffer's block sums, where one call per
/// 128-byte block through [`sum`] ran at 17 against 30 GB/s.
pub fn sum_blocks<const N: usize>(data: &[u8], out: &mut [u16]) {
    const { assert!(N > 0 && N.is_multiple_of(32)) };
    for (b, o) in data.chunks_exact(N).zip(out) {
        *o = u16::from_be(fold(chains(b.chunks_exact(32))));
    }
}

/// The big-endian 32-bit words of `data` (whole words: a header's) added as
/// numbers, unfolded: [`fold`] reduces them to the sum of their 16-bit halves,
/// in line rather than through [`sum`]'s general loops.
#[inline]
pub fn add_words(data: &[u8]) -> u64 {
    data.chunks_exact(4)
        .map(|w| u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]])))
        .sum()
}

/// Straightforward RFC 1071 §4.1 sum, word by word; the oracle for [`sum`].
pub fn sum_reference(data: &[u8]) -> u16 {
    let acc = data
        .chunks(2)
        .map(|w| u64::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    fold(acc)
}

/// The Internet checksum of `data`: the complement of [`sum`].
pub fn checksum(data: &[u8]) -> u16 {
    !sum(data)
}

/// One's-complement addition of two folded sums. Combining sums of consecutive regions
/// is only valid when every region but the last has even length.
pub fn add(a: u16, b: u16) -> u16 {
    let s = u32::from(a) + u32::from(b);
    ((s & 0xffff) + (s >> 16)) as u16
}

/// Sum of the IPv4 pseudo-header that UDP (RFC 768) and TCP (RFC 9293 §3.1) include in
/// their checksums, binding the segment to its addresses, protocol and length.
///
/// Its words are added as numbers (an address as one 32-bit word, the zero
/// byte and the protocol as one word), which [`fold`] reduces to the same
/// one's-complement sum: 2^16 is 1 modulo 0xffff.
pub fn pseudo_header_sum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: u16) -> u16 {
    fold(u64::from(src.to_bits()) + u64::from(dst.to_bits()) + u64::from(proto) + u64::from(len))
}

/// New checksum after one 16-bit word of the covered data changes from `old` to `new`
/// (RFC 1624 eqn. 3: `HC' = ~(~HC + ~m + m')`), without touching the rest of the data
/// — what a NAT or TTL decrement needs.
///
/// Equals recomputation except that when the new data sums to zero the result may be
/// `0x0000` where recomputation gives `0xffff` (the two one's-complement zeros); RFC 1624
/// §3 explains why eqn. 3 is the form that never produces a wrong non-zero value.
pub fn update(old_cksum: u16, old: u16, new: u16) -> u16 {
    !add(add(!old_cksum, !old), new)
}

/// [`update`] for a 32-bit field (e.g. an IPv4 address), as two 16-bit words.
pub fn update_u32(old_cksum: u16, old: u32, new: u32) -> u16 {
    let c = update(old_cksum, (old >> 16) as u16, (new >> 16) as u16);
    update(c, old as u16, new as u16)
}

// Inline: [`sum_blocks`] is generic, so built in the caller's crate, which
// otherwise calls it for every word (4% of a sending application's time).
#[inline(always)]
fn load(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    u64::from_ne_bytes(w)
}

/// Add with end-around carry (RFC 1071 §2(A)), on 64-bit words: for sums
/// accumulated a word at a time (e.g. while copying), folded with [`fold`].
#[inline]
pub fn add64(a: u64, b: u64) -> u64 {
    let (s, carry) = a.overflowing_add(b);
    s + u64::from(carry)
}

/// Fold a wide one's-complement sum to 16 bits: halves added with
/// end-around carry (RFC 1071 §2(A)), 64 to 32 to 16 bits, in a fixed number
/// of steps. Only zero folds to zero, so the result is the one a loop
/// folding 16 bits at a time gives.
#[inline]
pub fn fold(acc: u64) -> u16 {
    let (s, c) = (acc as u32).overflowing_add((acc >> 32) as u32);
    let s = s + u32::from(c);
    let (s, c) = (s as u16).overflowing_add((s >> 16) as u16);
    s + u16::from(c)
}

/// The sum of the pseudo-header (RFC 9293 §3.1, RFC 768) of the packet of
/// protocol `proto` in `frame` whose IPv4 header is at `l3`, transport header
/// at `l4`, and end at `end`.
pub(crate) fn pseudo_sum_in(frame: &[u8], l3: usize, l4: usize, end: usize, proto: u8) -> u16 {
    let ip = &frame[l3..l4];
    let addr = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
    pseudo_header_sum(addr(12), addr(16), proto, (end - l4) as u16)
}

/// The IPv4 packet of a TCP or UDP frame (see [`ipv4::in_frame`]), if long
/// enough to hold its checksum field, and that field's offset in the
/// transport part.
fn transport(frame: &[u8]) -> Option<(ipv4::InFrame, usize)> {
    let p = ipv4::in_frame(frame)?;
    let field = match p.proto {
        6 => 16,
        17 => 6,
        _ => return None,
    };
    (p.end - p.l4 >= field + 2).then_some((p, field))
}

/// Finishes the transport checksum of packet `p` of `frame`, whose field is
/// at `field` in the transport part.
fn finish(frame: &mut [u8], p: ipv4::InFrame, field: usize) {
    let l4 = &mut frame[p.l4..p.end];
    let c = !sum(l4);
    // RFC 768: a computed zero is sent as all ones (zero means "none").
    let c = if p.proto == 17 && c == 0 { 0xffff } else { c };
    l4[field..field + 2].copy_from_slice(&c.to_be_bytes());
}

/// Finishes the TCP or UDP checksum of an Ethernet frame (untagged or behind one
/// 802.1Q tag) carrying IPv4 whose sender left it to the hardware: Linux hands such
/// frames over a veth or to a packet socket with the field holding only the
/// pseudo-header sum (`CHECKSUM_PARTIAL`, `TP_STATUS_CSUMNOTREADY`). The sum over the
/// transport header and data, that field included, is the checksum's complement.
/// Returns false, leaving the frame alone, if it is not such a frame or is cut short.
pub fn complete_partial(frame: &mut [u8]) -> bool {
    let Some((p, field)) = transport(frame) else {
        return false;
    };
    finish(frame, p, field);
    true
}

/// [`complete_partial`] for a frame that carries no flag saying its checksum
/// was left undone (AF_XDP shows none): finished if its checksum field holds
/// exactly the pseudo-header sum, as Linux leaves it; returns whether it did.
///
/// Finishing a frame whose correct checksum happens to equal that sum leaves
/// it as it was. But a frame corrupted on its way whose field happens to hold
/// it (one in 65,536 corrupted frames) would be passed as good: only for frames
/// from a sender that leaves its checksums so and a path that corrupts nothing
/// (a veth's peer, whose frames are the same memory).
pub fn complete_if_partial(frame: &mut [u8]) -> bool {
    let Some((p, field)) = transport(frame) else {
        return false;
    };
    let at = p.l4 + field;
    if u16::from_be_bytes([frame[at], frame[at + 1]])
        != pseudo_sum_in(frame, p.l3, p.l4, p.end, p.proto)
    {
        return false;
    }
    finish(frame, p, field);
    true
}

/// Copies `src` into `dst` and returns the one's-complement sum of the bytes
/// ([`sum`] of `src`).
///
/// The copy and the sum are two passes: the sum reads the bytes just copied,
/// from the cache, and its parallel chains make the pair faster than a loop
/// that sums while it copies word by word (measured with an earlier, slower
/// sum: 96 against 150 ns for 1460 bytes).
///
/// Inline: on a short segment the call costs about what the copy does.
///
/// # Panics
/// If the slices differ in length (as [`slice::copy_from_slice`]).
#[inline]
pub fn copy_and_sum(dst: &mut [u8], src: &[u8]) -> u16 {
    assert_eq!(dst.len(), src.len(), "copy_and_sum: lengths differ");
    dst.copy_from_slice(src);
    sum(src)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 1071 §3 worked example.
    #[test]
    fn rfc1071_example() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(sum(&data), 0xddf2);
        assert_eq!(sum_reference(&data), 0xddf2);
    }

    #[test]
    fn empty_and_odd() {
        assert_eq!(sum(&[]), 0);
        assert_eq!(sum(&[0xab]), 0xab00);
        assert_eq!(sum(&[0xff; 64]), 0xffff);
        // The vector lanes, at their largest words and at zero.
        assert_eq!(sum(&[0xff; 4099]), sum_reference(&[0xff; 4099]));
        assert_eq!(sum(&[0; 4096]), 0);
    }

    #[test]
    fn update_rfc1624_example() {
        // RFC 1624 §4: HC = 0xdd2f, m = 0x5555 -> m' = 0x3285 gives HC' = 0x0000.
        assert_eq!(update(0xdd2f, 0x5555, 0x3285), 0x0000);
    }

    /// Both checksum encodings of zero are the same one's-complement value.
    fn same_ones_complement(a: u16, b: u16) -> bool {
        a == b || (a | b == 0xffff && (a == 0 || b == 0))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn fast_equals_reference(buf in proptest::collection::vec(any::<u8>(), 0..2100),
                                 off in 0usize..16, cut in 0usize..16) {
            let start = off.min(buf.len());
            let end = buf.len().saturating_sub(cut).max(start);
            let s = &buf[start..end];
            prop_assert_eq!(sum(s), sum_reference(s));
        }

        #[test]
        fn block_sums_are_each_blocks_sum(buf in proptest::collection::vec(any::<u8>(), 0..1100),
                                          room in 0usize..10) {
            let mut out = vec![0u16; room];
            sum_blocks::<128>(&buf, &mut out);
            let blocks = buf.chunks_exact(128).len().min(room);
            for (k, &s) in out.iter().enumerate() {
                let want = if k < blocks { sum_reference(&buf[k * 128..(k + 1) * 128]) } else { 0 };
                prop_assert_eq!(s, want);
            }
        }

        #[test]
        fn pseudo_header_sum_is_its_bytes_sum(src in any::<u32>(), dst in any::<u32>(),
                                              proto in any::<u8>(), len in any::<u16>()) {
            let mut ph = [0u8; 12];
            ph[0..4].copy_from_slice(&src.to_be_bytes());
            ph[4..8].copy_from_slice(&dst.to_be_bytes());
            ph[9] = proto;
            ph[10..12].copy_from_slice(&len.to_be_bytes());
            let (s, d) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            prop_assert_eq!(pseudo_header_sum(s, d, proto, len), sum_reference(&ph));
        }

        #[test]
        fn fold_equals_folding_by_16_bits(acc in any::<u64>(), small in 0u64..0x2_0000) {
            let by_16 = |mut a: u64| {
                while a > 0xffff {
                    a = (a & 0xffff) + (a >> 16);
                }
                a as u16
            };
            prop_assert_eq!(fold(acc), by_16(acc));
            prop_assert_eq!(fold(small), by_16(small));
        }

        #[test]
        fn copy_and_sum_copies_and_sums(buf in proptest::collection::vec(any::<u8>(), 0..300),
                                        off in 0usize..16) {
            let s = &buf[off.min(buf.len())..];
            // Bytes either side of the copy stay as they were.
            let mut out = vec![0xa5u8; s.len() + 2];
            let n = s.len();
            prop_assert_eq!(copy_and_sum(&mut out[1..n + 1], s), sum_reference(s));
            prop_assert_eq!(&out[1..n + 1], s);
            prop_assert_eq!((out[0], out[n + 1]), (0xa5, 0xa5));
        }

        #[test]
        fn combine_equals_whole(buf in proptest::collection::vec(any::<u8>(), 0..600),
                                split in 0usize..300) {
            let split = (split * 2).min(buf.len() & !1);
            prop_assert_eq!(add(sum(&buf[..split]), sum(&buf[split..])), sum(&buf));
        }

        #[test]
        fn incremental_equals_recomputed(mut buf in proptest::collection::vec(any::<u8>(), 8..400),
                                         at in 0usize..200, new16 in any::<u16>(), new32 in any::<u32>()) {
            let len = buf.len() & !1;
            let i = (at * 2) % (len - 2);
            let old = checksum(&buf[..len]);
            let old16 = u16::from_be_bytes([buf[i], buf[i + 1]]);
            buf[i..i + 2].copy_from_slice(&new16.to_be_bytes());
            let c16 = update(old, old16, new16);
            prop_assert!(same_ones_complement(c16, checksum(&buf[..len])));

            let j = (at * 2) % (len - 4);
            let old32 = u32::from_be_bytes([buf[j], buf[j + 1], buf[j + 2], buf[j + 3]]);
            buf[j..j + 4].copy_from_slice(&new32.to_be_bytes());
            let c32 = update_u32(c16, old32, new32);
            prop_assert!(same_ones_complement(c32, checksum(&buf[..len])));
        }
    }

    #[test]
    fn partial_checksums_are_completed() {
        use crate::build;
        use crate::ethernet::MacAddr;
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let good = build::udp_frame(
            MacAddr([2; 6]),
            MacAddr([4; 6]),
            a,
            b,
            5,
            6,
            b"partial sums",
        );
        // What Linux hands over: the field holds the pseudo-header sum alone.
        let mut f = good.clone();
        let len = (good.len() - 34) as u16;
        f[40..42].copy_from_slice(&pseudo_header_sum(a, b, 17, len).to_be_bytes());
        assert!(complete_partial(&mut f));
        assert_eq!(f, good);
        // Behind a VLAN tag, and refusals.
        let mut tagged = [&f[..12], &[0x81, 0, 0, 5], &f[12..]].concat();
        tagged[44..46].copy_from_slice(&pseudo_header_sum(a, b, 17, len).to_be_bytes());
        assert!(complete_partial(&mut tagged));
        assert_eq!(&tagged[16..], &good[12..]);
        assert!(!complete_partial(&mut f[..30]));
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!complete_partial(&mut arp));
    }

    #[test]
    fn only_a_field_holding_the_pseudo_header_sum_is_completed_unasked() {
        use crate::build;
        use crate::ethernet::MacAddr;
        use crate::tcp::flags;
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let (ma, mb) = (MacAddr([2; 6]), MacAddr([4; 6]));
        let udp = build::udp_frame(ma, mb, a, b, 5, 6, b"partial sums");
        let tcp = build::tcp_frame(ma, mb, a, b, 5, 6, flags::ACK, 9, 7, &[], b"x");
        for (good, field, proto) in [(udp, 40, 17), (tcp, 50, 6)] {
            // Whole checksums are left alone.
            let mut f = good.clone();
            assert!(!complete_if_partial(&mut f));
            assert_eq!(f, good);
            // A partial one is finished.
            let pseudo = pseudo_header_sum(a, b, proto, (good.len() - 34) as u16);
            f[field..field + 2].copy_from_slice(&pseudo.to_be_bytes());
            assert!(complete_if_partial(&mut f));
            assert_eq!(f, good);
            // A wrong checksum that is not the pseudo-header sum stays wrong.
            f[field..field + 2].copy_from_slice(&pseudo.wrapping_add(1).to_be_bytes());
            let bad = f.clone();
            assert!(!complete_if_partial(&mut f));
            assert_eq!(f, bad);
            // A packet longer than its frame is no such frame.
            f[field..field + 2].copy_from_slice(&pseudo.to_be_bytes());
            assert!(!complete_if_partial(&mut f[..good.len() - 1]));
        }
    }
}
