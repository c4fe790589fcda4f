//! The window: the part of the application's shared-memory segment a handler
//! may read and write (message vectoring, §5.1.1 of the paper).

use std::ptr::{self, NonNull};

use crate::Transfer;

/// A window into the application's segment, granted to one handler.
///
/// The application may write the window while a handler runs, so no Rust
/// reference to its bytes outlives a single copy: every access is a bounds
/// checked `ptr::copy_nonoverlapping` (or one [`Transfer`] call), and a torn
/// read or write of a concurrently updated field is the two parties' own
/// protocol to avoid, as with any shared memory.
#[derive(Debug)]
pub struct Window {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Window is an address range in a mapping that `Window::new`'s
// caller keeps alive for the window's whole life, whichever thread uses it;
// it owns nothing thread-bound.
unsafe impl Send for Window {}

impl Window {
    /// Grants `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as
    /// the window (or a handler holding it) lives, and must not overlap a
    /// handler's own memory or a frame it runs on. Others (the application)
    /// may write the bytes concurrently. A null `ptr` is allowed only with
    /// `len == 0`.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Window {
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        Window { ptr, len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the window has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of `[off, off + n)` if it lies inside the window.
    fn at(&self, off: u64, n: usize) -> Option<*mut u8> {
        let off = usize::try_from(off).ok()?;
        if off.checked_add(n)? > self.len {
            return None;
        }
        // SAFETY: off + n <= len, so the offset stays inside the granted range.
        Some(unsafe { self.ptr.as_ptr().add(off) })
    }

    /// Copies `dst.len()` bytes at `off` out of the window; false (nothing
    /// copied) if the range is outside it.
    pub(crate) fn read(&self, off: u64, dst: &mut [u8]) -> bool {
        let Some(src) = self.at(off, dst.len()) else {
            return false;
        };
        // SAFETY: `at` checked the range against the grant, valid for reads
        // (Window::new's contract); `dst` is host or handler memory, which the
        // window does not overlap.
        unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `src` into the window at `off`; false (nothing copied) if the
    /// range is outside it.
    pub(crate) fn write(&self, off: u64, src: &[u8]) -> bool {
        let Some(dst) = self.at(off, src.len()) else {
            return false;
        };
        // SAFETY: as in `read`, with the grant valid for writes.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        true
    }

    /// Moves `src` into the window at `off` through `transfer` (message
    /// vectoring through a pipe list); false if the range is outside it.
    pub(crate) fn transfer(&self, off: u64, src: &[u8], transfer: &mut dyn Transfer) -> bool {
        let Some(dst) = self.at(off, src.len()) else {
            return false;
        };
        // SAFETY: the range is inside the grant (checked by `at`) and does not
        // overlap `src` (a frame); the slice lives only for this one copy, the
        // same exposure to concurrent application writes as a plain copy.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, src.len()) };
        transfer.transfer(src, dst);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        let mut buf = [0u8; 16];
        // SAFETY: `buf` outlives the window and nothing else touches it.
        let w = unsafe { Window::new(buf.as_mut_ptr(), buf.len()) };
        assert!(w.write(12, &[1, 2, 3, 4]));
        assert!(!w.write(13, &[1, 2, 3, 4]));
        assert!(!w.write(u64::MAX, &[1]));
        let mut out = [0u8; 4];
        assert!(w.read(12, &mut out));
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(!w.read(17, &mut []));
        assert!(w.read(16, &mut []));
        assert_eq!(buf[12..], [1, 2, 3, 4]);
    }

    #[test]
    fn an_empty_window_from_null() {
        // SAFETY: a null pointer with length 0 is allowed.
        let w = unsafe { Window::new(std::ptr::null_mut(), 0) };
        assert!(w.is_empty());
        assert!(w.read(0, &mut []));
        assert!(!w.write(0, &[0]));
    }
}
