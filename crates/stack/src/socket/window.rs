//! [`Window`]: the part of the endpoint's segment an application grants its
//! handlers (ASH "message vectoring": a handler in the multiplexer writes
//! message data straight into the application's data structures here).

use std::io;

use exonet_shm::Frames;

/// Shared memory the application and its handlers both write: whole frame
/// buffers at the end of the segment that never go on a ring. Accesses are
/// bounds-checked copies; a value the handler is writing at the same time
/// may be read torn, except aligned 64-bit words, which are read and
/// written whole.
#[derive(Clone)]
pub struct Window {
    frames: Frames,
    offset: u32,
    len: u32,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

fn outside(off: usize, n: usize, len: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{n} bytes at {off} are outside the window of {len} bytes"),
    )
}

impl Window {
    pub(crate) fn new(frames: Frames, offset: u32, len: u32) -> Window {
        Window {
            frames,
            offset,
            len,
        }
    }

    /// Where the window starts in the segment (what a handler install names).
    pub fn offset(&self) -> u32 {
        self.offset
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment offset of `n` bytes at `off` in the window.
    fn at(&self, off: usize, n: usize) -> io::Result<u32> {
        match off.checked_add(n) {
            Some(end) if end <= self.len as usize => Ok(self.offset + off as u32),
            _ => Err(outside(off, n, self.len)),
        }
    }

    /// Copies `out.len()` bytes at `off` out of the window.
    pub fn read(&self, off: usize, out: &mut [u8]) -> io::Result<()> {
        let at = self.at(off, out.len())?;
        self.frames
            .read_area(at, out)
            .map_err(|_| outside(off, out.len(), self.len))
    }

    /// Copies `data` into the window at `off`.
    pub fn write(&self, off: usize, data: &[u8]) -> io::Result<()> {
        let at = self.at(off, data.len())?;
        self.frames
            .write_area(at, data)
            .map_err(|_| outside(off, data.len(), self.len))
    }

    /// The little-endian `u64` at `off` (whole, never torn by a handler's
    /// store, when aligned).
    pub fn load_u64(&self, off: usize) -> io::Result<u64> {
        let at = self.at(off, 8)?;
        self.frames
            .load_u64(at)
            .map_err(|_| outside(off, 8, self.len))
    }

    /// Stores a little-endian `u64` at `off`.
    pub fn store_u64(&self, off: usize, v: u64) -> io::Result<()> {
        let at = self.at(off, 8)?;
        self.frames
            .store_u64(at, v)
            .map_err(|_| outside(off, 8, self.len))
    }
}
