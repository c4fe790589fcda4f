//! The segment's layout: the `#[repr(C)]` header at offset 0, the four
//! rings, the frame buffers. `include/exonet_endpoint.h` is the same thing
//! in C; a test keeps the two in step.
//!
//! ```text
//! 0                       SegmentHeader (one 4096-byte page)
//! rings[Free].offset      free ring        } each ring: RingHead (128 bytes),
//! rings[Rx].offset        rx ring          } `entries` Desc (16 bytes each),
//! rings[Tx].offset        tx ring          } then on rx/tx `entries` inline
//! rings[Completion].offset completion ring } slots of INLINE_MAX bytes;
//!                                            each ring starts on a page
//! frames_offset           frame_count buffers of frame_size bytes, aligned
//!                         to max(4096, frame_size)
//! segment_size            (a multiple of the page size)
//! ```
//!
//! Offsets in descriptors count from the start of the segment, so the whole
//! segment must be below 4 GiB.

use std::fmt;
use std::io;

use crate::desc::{Desc, DescError, INLINE_MAX, MAX_PARTS};
use crate::sync::AtomicU32;
use crate::wake::WakeWord;

/// `"EXONETSG"` read as a little-endian `u64`.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"EXONETSG");
/// Layout version; bumped by any change to this file's structures.
pub const SEGMENT_VERSION: u32 = 1;
/// Size of the header page, and the alignment of rings and frame area.
pub const HEADER_SIZE: u32 = 4096;
/// Offset of the first descriptor from the start of a ring.
pub const RING_DESCS_OFFSET: u64 = 128;

const PAGE: u64 = HEADER_SIZE as u64;
const MIN_FRAME_SIZE: u32 = 128;
const MAX_FRAME_SIZE: u32 = 65536;
const MIN_RING_ENTRIES: u32 = 4;
const MAX_RING_ENTRIES: u32 = 1 << 20;
/// Descriptor offsets are `u32`.
const MAX_SEGMENT_SIZE: u64 = 1 << 32;

/// The four rings, in header order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RingId {
    /// Empty buffers, application → multiplexer (AF_XDP fill ring).
    Free = 0,
    /// Received frames, multiplexer → application.
    Rx = 1,
    /// Frames to send, application → multiplexer.
    Tx = 2,
    /// Sent buffers given back, multiplexer → application.
    Completion = 3,
}

impl RingId {
    /// All four, in header order.
    pub const ALL: [RingId; 4] = [RingId::Free, RingId::Rx, RingId::Tx, RingId::Completion];

    /// Whether the ring carries frames, and so has inline slots.
    pub fn carries_frames(self) -> bool {
        matches!(self, RingId::Rx | RingId::Tx)
    }

    fn name(self) -> &'static str {
        match self {
            RingId::Free => "free",
            RingId::Rx => "rx",
            RingId::Tx => "tx",
            RingId::Completion => "completion",
        }
    }
}

/// Where one ring is (`struct exonet_ring_info`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingInfo {
    /// Offset of the ring's [`RingHead`] from the start of the segment.
    pub offset: u64,
    /// Number of entries, a power of two.
    pub entries: u32,
    /// Bytes per inline slot: [`INLINE_MAX`] on rx and tx, 0 on the others.
    pub inline_size: u32,
}

impl RingInfo {
    /// Offset of the inline slot array (meaningful when `inline_size > 0`).
    pub fn inline_offset(&self) -> u64 {
        self.offset + RING_DESCS_OFFSET + self.entries as u64 * std::mem::size_of::<Desc>() as u64
    }

    fn size(&self) -> u64 {
        self.inline_offset() - self.offset + self.entries as u64 * self.inline_size as u64
    }
}

/// The header page (`struct exonet_segment_header`). The layout fields are
/// written once by the creator; the peer validates them once and then both
/// sides use their private [`Layout`], never these fields again.
#[repr(C)]
pub struct SegmentHeader {
    /// [`SEGMENT_MAGIC`].
    pub magic: u64,
    /// [`SEGMENT_VERSION`].
    pub version: u32,
    /// [`HEADER_SIZE`].
    pub header_size: u32,
    /// Size of the whole segment in bytes.
    pub segment_size: u64,
    /// Offset of the first frame buffer.
    pub frames_offset: u64,
    /// Bytes per frame buffer, a power of two.
    pub frame_size: u32,
    /// Number of frame buffers.
    pub frame_count: u32,
    /// Indexed by [`RingId`].
    pub rings: [RingInfo; 4],
    /// Written by the application: wake it (rx, completion).
    pub app_wake: WakeWord,
    /// Written by the multiplexer: wake it (tx, free).
    pub mux_wake: WakeWord,
}

/// A ring's two indices, each on its own cache line (`struct
/// exonet_ring_head`); the descriptors follow at [`RING_DESCS_OFFSET`].
#[repr(C)]
pub struct RingHead {
    /// Written by the producer only.
    pub producer: IndexLine,
    /// Written by the consumer only.
    pub consumer: IndexLine,
}

/// A free-running `u32` index alone on a 64-byte line.
#[repr(C, align(64))]
pub struct IndexLine {
    pub value: AtomicU32,
}

const _: () = {
    assert!(std::mem::size_of::<Desc>() == 16);
    assert!(std::mem::size_of::<crate::ring::DescSlot>() == 16);
    assert!(std::mem::size_of::<crate::ring::InlineSlot>() == INLINE_MAX);
    assert!(std::mem::size_of::<RingHead>() as u64 == RING_DESCS_OFFSET);
    assert!(std::mem::size_of::<SegmentHeader>() <= HEADER_SIZE as usize);
    // A whole chain fits in any tx ring (see `MAX_PARTS`).
    assert!(MAX_PARTS as u32 <= MIN_RING_ENTRIES);
};

/// What a segment is made of. Sizes are checked by [`Layout::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentConfig {
    /// Bytes per frame buffer: a power of two from 128 to 65536.
    pub frame_size: u32,
    /// Number of frame buffers (at least 1).
    pub frame_count: u32,
    /// Entries per ring, indexed by [`RingId`]: powers of two from 4 to 2^20.
    pub ring_entries: [u32; 4],
}

impl Default for SegmentConfig {
    /// 2048 buffers of 2048 bytes (4 MiB), rings of 1024.
    fn default() -> Self {
        SegmentConfig {
            frame_size: 2048,
            frame_count: 2048,
            ring_entries: [1024; 4],
        }
    }
}

/// Why a configuration cannot be laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    FrameSize(u32),
    FrameCount(u32),
    RingEntries {
        ring: RingId,
        entries: u32,
    },
    /// The segment would not fit in the 4 GiB descriptors can address.
    TooLarge {
        size: u64,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConfigError::FrameSize(s) => write!(
                f,
                "frame size {s} is not a power of two from {MIN_FRAME_SIZE} to {MAX_FRAME_SIZE}"
            ),
            ConfigError::FrameCount(n) => write!(f, "frame count {n} (need at least 1)"),
            ConfigError::RingEntries { ring, entries } => write!(
                f,
                "{} ring of {entries} entries is not a power of two from {MIN_RING_ENTRIES} to {MAX_RING_ENTRIES}",
                ring.name()
            ),
            ConfigError::TooLarge { size } => {
                write!(f, "segment of {size} bytes exceeds {MAX_SEGMENT_SIZE}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a segment could not be created or opened.
#[derive(Debug)]
pub enum SegmentError {
    Io(io::Error),
    /// The sizes (given, or found in a peer's header) cannot be laid out.
    Config(ConfigError),
    /// The file is not a memfd sealed against shrinking, so the peer could
    /// truncate it under us.
    NotSealed,
    /// The file's size is not the one the header claims (or is too small to
    /// hold a header).
    Size {
        file: u64,
        header: u64,
    },
    BadMagic(u64),
    BadVersion(u32),
    /// A header field differs from what the header's sizes imply.
    Field {
        field: &'static str,
        found: u64,
        expected: u64,
    },
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentError::Io(e) => write!(f, "segment: {e}"),
            SegmentError::Config(e) => write!(f, "segment: {e}"),
            SegmentError::NotSealed => write!(f, "segment file is not sealed against shrinking"),
            SegmentError::Size { file, header } => {
                write!(f, "segment file has {file} bytes, header says {header}")
            }
            SegmentError::BadMagic(m) => write!(f, "segment magic {m:#018x} is not exonet's"),
            SegmentError::BadVersion(v) => {
                write!(f, "segment layout version {v}, this is {SEGMENT_VERSION}")
            }
            SegmentError::Field {
                field,
                found,
                expected,
            } => write!(f, "segment header {field} is {found}, expected {expected}"),
        }
    }
}

impl std::error::Error for SegmentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SegmentError::Io(e) => Some(e),
            SegmentError::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for SegmentError {
    fn from(e: io::Error) -> Self {
        SegmentError::Io(e)
    }
}

impl From<ConfigError> for SegmentError {
    fn from(e: ConfigError) -> Self {
        SegmentError::Config(e)
    }
}

/// A segment's layout, computed from a [`SegmentConfig`]; each side keeps
/// its own copy, so nothing the peer writes later can move anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    frame_size: u32,
    frame_count: u32,
    frames_offset: u64,
    segment_size: u64,
    rings: [RingInfo; 4],
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl Layout {
    /// Lays out a segment: header page, the rings in [`RingId`] order each
    /// on a page of its own, then the frame buffers.
    pub fn new(config: &SegmentConfig) -> Result<Layout, ConfigError> {
        let fs = config.frame_size;
        if !fs.is_power_of_two() || !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&fs) {
            return Err(ConfigError::FrameSize(fs));
        }
        if config.frame_count == 0 {
            return Err(ConfigError::FrameCount(config.frame_count));
        }
        let mut offset = PAGE;
        let mut rings = [RingInfo {
            offset: 0,
            entries: 0,
            inline_size: 0,
        }; 4];
        for id in RingId::ALL {
            let entries = config.ring_entries[id as usize];
            if !entries.is_power_of_two()
                || !(MIN_RING_ENTRIES..=MAX_RING_ENTRIES).contains(&entries)
            {
                return Err(ConfigError::RingEntries { ring: id, entries });
            }
            let info = RingInfo {
                offset,
                entries,
                inline_size: if id.carries_frames() {
                    INLINE_MAX as u32
                } else {
                    0
                },
            };
            offset = align_up(offset + info.size(), PAGE);
            rings[id as usize] = info;
        }
        // Buffers aligned to their size (or a page, if smaller).
        let frames_offset = align_up(offset, PAGE.max(fs as u64));
        // No overflow: every term is below 2^32 and there are few of them.
        let size = align_up(frames_offset + config.frame_count as u64 * fs as u64, PAGE);
        if size > MAX_SEGMENT_SIZE {
            return Err(ConfigError::TooLarge { size });
        }
        Ok(Layout {
            frame_size: fs,
            frame_count: config.frame_count,
            frames_offset,
            segment_size: size,
            rings,
        })
    }

    /// The configuration this layout was made from.
    pub fn config(&self) -> SegmentConfig {
        SegmentConfig {
            frame_size: self.frame_size,
            frame_count: self.frame_count,
            ring_entries: self.rings.map(|r| r.entries),
        }
    }

    pub fn frame_size(&self) -> u32 {
        self.frame_size
    }

    pub fn frame_count(&self) -> u32 {
        self.frame_count
    }

    /// Offset of the first frame buffer.
    pub fn frames_offset(&self) -> u64 {
        self.frames_offset
    }

    /// Size of the whole segment in bytes.
    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    pub fn ring(&self, id: RingId) -> RingInfo {
        self.rings[id as usize]
    }

    /// The offsets of all frame buffers, in order (to fill the free ring).
    pub fn buffers(&self) -> impl Iterator<Item = u32> {
        let (base, size) = (self.frames_offset as u32, self.frame_size);
        (0..self.frame_count).map(move |i| base + i * size)
    }

    /// The buffer that byte `offset` of the segment belongs to, if it is in
    /// the frame area.
    pub fn buffer_of(&self, offset: u32) -> Option<u32> {
        let rel = (offset as u64).checked_sub(self.frames_offset)?;
        let fs = self.frame_size as u64;
        (rel < self.frame_count as u64 * fs)
            .then(|| (self.frames_offset + (rel & !(fs - 1))) as u32)
    }

    /// Checks a frame descriptor (rx, a one-part tx frame): known flags, no
    /// [`Desc::MORE`]; inline and at most [`INLINE_MAX`] bytes, or `len`
    /// bytes at `offset` all inside one frame buffer. Takes the descriptor
    /// by value because it must be the caller's private copy.
    pub fn validate_frame(&self, d: Desc) -> Result<(), DescError> {
        if d.has_more() {
            return Err(DescError::More);
        }
        self.validate_part(d, true)
    }

    /// Checks one part of a tx frame, which may carry [`Desc::MORE`]: the
    /// `head` (first part) as [`validate_frame`](Self::validate_frame)
    /// checks a whole frame; a later part is not inline and lies anywhere
    /// in the frame area ([`check_area`](Self::check_area)). Whether the
    /// parts make a chain (count, channel, total length) is the caller's
    /// check.
    pub fn validate_part(&self, d: Desc, head: bool) -> Result<(), DescError> {
        if d.flags & !Desc::KNOWN_FLAGS != 0 {
            return Err(DescError::UnknownFlags { flags: d.flags });
        }
        if !head {
            if d.is_inline() {
                return Err(DescError::Inline);
            }
            return self.check_area(d.offset, d.len);
        }
        if d.is_inline() {
            if d.len as usize > INLINE_MAX {
                return Err(DescError::InlineTooLong { len: d.len });
            }
            return Ok(());
        }
        self.check_range(d.offset, d.len)
    }

    /// Checks a buffer descriptor (free, completion): known flags, not
    /// inline, no [`Desc::MORE`], `offset` the first byte of a frame
    /// buffer; `len` is not looked at.
    pub fn validate_buffer(&self, d: Desc) -> Result<(), DescError> {
        if d.flags & !Desc::KNOWN_FLAGS != 0 {
            return Err(DescError::UnknownFlags { flags: d.flags });
        }
        if d.has_more() {
            return Err(DescError::More);
        }
        if d.is_inline() {
            return Err(DescError::Inline);
        }
        self.check_range(d.offset, 0)?;
        if (d.offset as u64 - self.frames_offset) & (self.frame_size as u64 - 1) != 0 {
            return Err(DescError::Misaligned { offset: d.offset });
        }
        Ok(())
    }

    /// `len` bytes at `offset` lie inside the frame area, across buffers if
    /// need be: a window an application grants its handler (buffers it
    /// keeps off the free ring for its own data).
    pub fn check_area(&self, offset: u32, len: u32) -> Result<(), DescError> {
        let end = self.frames_offset + self.frame_count as u64 * self.frame_size as u64;
        if (offset as u64) < self.frames_offset || offset as u64 + len as u64 > end {
            return Err(DescError::TooLong { offset, len });
        }
        Ok(())
    }

    /// `len` bytes at `offset` lie inside one frame buffer.
    pub(crate) fn check_range(&self, offset: u32, len: u32) -> Result<(), DescError> {
        let rel = (offset as u64)
            .checked_sub(self.frames_offset)
            .filter(|&rel| rel < self.frame_count as u64 * self.frame_size as u64)
            .ok_or(DescError::OutOfRange { offset })?;
        let fs = self.frame_size as u64;
        if (rel & (fs - 1)) + len as u64 > fs {
            return Err(DescError::TooLong { offset, len });
        }
        Ok(())
    }

    /// Validates the layout fields of a header read from a peer's segment
    /// of `file_size` bytes: the layout must be exactly the one its sizes
    /// imply, so everything it places is in bounds.
    pub(crate) fn from_header(h: &HeaderFields, file_size: u64) -> Result<Layout, SegmentError> {
        if h.magic != SEGMENT_MAGIC {
            return Err(SegmentError::BadMagic(h.magic));
        }
        if h.version != SEGMENT_VERSION {
            return Err(SegmentError::BadVersion(h.version));
        }
        let layout = Layout::new(&SegmentConfig {
            frame_size: h.frame_size,
            frame_count: h.frame_count,
            ring_entries: h.rings.map(|r| r.entries),
        })?;
        let check = |field, found: u64, expected: u64| {
            if found == expected {
                Ok(())
            } else {
                Err(SegmentError::Field {
                    field,
                    found,
                    expected,
                })
            }
        };
        check("header_size", h.header_size as u64, HEADER_SIZE as u64)?;
        check("segment_size", h.segment_size, layout.segment_size)?;
        check("frames_offset", h.frames_offset, layout.frames_offset)?;
        for id in RingId::ALL {
            let (found, expected) = (h.rings[id as usize], layout.ring(id));
            check("ring offset", found.offset, expected.offset)?;
            check(
                "ring inline_size",
                found.inline_size as u64,
                expected.inline_size as u64,
            )?;
        }
        if file_size != layout.segment_size {
            return Err(SegmentError::Size {
                file: file_size,
                header: layout.segment_size,
            });
        }
        Ok(layout)
    }

    /// The header fields that describe this layout.
    pub(crate) fn header_fields(&self) -> HeaderFields {
        HeaderFields {
            magic: SEGMENT_MAGIC,
            version: SEGMENT_VERSION,
            header_size: HEADER_SIZE,
            segment_size: self.segment_size,
            frames_offset: self.frames_offset,
            frame_size: self.frame_size,
            frame_count: self.frame_count,
            rings: self.rings,
        }
    }
}

/// The plain (non-atomic) part of [`SegmentHeader`], as read or written once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeaderFields {
    pub magic: u64,
    pub version: u32,
    pub header_size: u32,
    pub segment_size: u64,
    pub frames_offset: u64,
    pub frame_size: u32,
    pub frame_count: u32,
    pub rings: [RingInfo; 4],
}
