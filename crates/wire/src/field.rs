//! Big-endian (network byte order) field access shared by the views.
//!
//! Callers index only within lengths already validated by `new_checked`.
//!
//! These and the views' small accessors are `#[inline]`: a load or two each,
//! on every frame, which other crates otherwise often call out of line.

// One bounds check and one load per field: indexing byte by byte checks
// each byte, which the compiler does not always merge.

#[inline]
pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

#[inline]
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[inline]
pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
