//! Big-endian (network byte order) field access shared by the views.
//!
//! Callers index only within lengths already validated by `new_checked`
//! (they panic past the slice's end).
//!
//! These and the views' small accessors are `#[inline]`: a load or two each,
//! on every frame, which other crates otherwise often call out of line.

// One bounds check and one load per field: indexing byte by byte checks
// each byte, which the compiler does not always merge.

/// The big-endian `u16` at `at`.
#[inline]
pub fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

/// The big-endian `u32` at `at`.
#[inline]
pub fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Writes `v` big-endian at `at`.
#[inline]
pub fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes `v` big-endian at `at`.
#[inline]
pub fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// Writes `words` big-endian from the start of `b`: a header's fixed part
/// built as its 32-bit words at once.
#[inline]
pub(crate) fn set_words(b: &mut [u8], words: &[u32]) {
    for (b, w) in b.chunks_exact_mut(4).zip(words) {
        b.copy_from_slice(&w.to_be_bytes());
    }
}

/// The last 0 to 7 bytes of some data as the native-order word they start,
/// zero-padded: in at most three loads (a copy of a length not known in
/// advance is a call to `memcpy`, which costs more than the sum of a 20-byte
/// header or the rest of a short frame's word).
#[inline]
pub fn tail_word(t: &[u8]) -> u64 {
    // Built little-endian (byte k at bits 8k), then put in native order.
    let mut w = 0u64;
    let mut at = 0;
    if t.len() >= 4 {
        w = u64::from(u32::from_le_bytes([t[0], t[1], t[2], t[3]]));
        at = 4;
    }
    if t.len() - at >= 2 {
        w |= u64::from(u16::from_le_bytes([t[at], t[at + 1]])) << (8 * at);
        at += 2;
    }
    if t.len() > at {
        w |= u64::from(t[at]) << (8 * at);
    }
    u64::from_le(w)
}
