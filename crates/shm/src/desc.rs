//! Descriptors: what travels on the four rings.

use std::fmt;

/// Bytes of a frame that can travel inside the ring instead of in a buffer
/// (U-Net §3.4: "the send and receive queues may hold entire small messages
/// in descriptors").
///
/// Why 128, and why in a slot array beside the descriptors rather than in a
/// fat descriptor:
///
/// * What goes on the rings is a whole Ethernet frame, so an inline area is
///   useless unless it holds the frames that are small *on Ethernet*: the
///   minimum frame (60 bytes without FCS, which is what ARP and any short
///   frame padded by a NIC arrive as), a pure TCP ACK with timestamps
///   (14 + 20 + 32 = 66 bytes), an ICMP echo of the default `ping` (98
///   bytes), a UDP datagram or Active Message of up to 86 payload bytes.
///   Those are the "control messages in protocol implementation" U-Net
///   inlines. 48 bytes (one ATM cell, U-Net's choice, and what a 64-byte
///   descriptor would leave) fits none of them; 64 fits the minimum frame but
///   not an ACK with timestamps; 128 (two cache lines) fits all of them.
/// * Descriptors stay 16 bytes, four to a cache line, so a ring of buffer
///   frames costs a quarter of a line per frame; the inline slot of ring
///   entry `i` is only touched when descriptor `i` is inline, and a frame of
///   up to 64 bytes touches one line of it (slots are 64-byte aligned).
/// * An inline frame skips the free and completion rings entirely (no buffer
///   to take or give back), which is where the saving is. Measured with
///   [`bench::round_trip`](crate::bench::round_trip) (all four rings, two
///   busy-polling threads, medians of 15 runs on the 2-vCPU development VM
///   while others were building): 60 bytes 0.78 µs per round trip inline
///   against 0.98 µs through a buffer, 128 bytes 0.77 against 0.99; a
///   1500-byte frame through a buffer 1.37 µs. A 128-byte inline frame
///   costs no more than a 60-byte one, so the larger slot is free.
pub const INLINE_MAX: usize = 128;

/// Most descriptors in one transmit frame (see [`Desc::MORE`]): a header and
/// up to three pieces of payload, for instance the two ends of a wrapped
/// send ring. At most the smallest ring, so that a full tx ring always
/// holds either a chain's end or a chain too long.
pub const MAX_PARTS: usize = 4;

/// One descriptor: 16 bytes, `#[repr(C)]` (`struct exonet_desc` in C).
///
/// On rx and tx a descriptor names a frame: either bytes `offset..offset+len`
/// of the segment, inside one frame buffer (the frame may start anywhere in
/// its buffer, leaving headroom), or, with [`Desc::INLINE`], `len` bytes in
/// the ring's inline slot for this entry (`offset` is then unused). On the
/// free and completion rings it names a whole buffer by the offset of its
/// first byte; `len` is unused on free and carries the sent length on
/// completion.
///
/// On tx, a frame may also be a *chain* of up to [`MAX_PARTS`] descriptors
/// (scatter-gather, AF_XDP's multi-buffer frames): every part but the last
/// carries [`Desc::MORE`], all parts name the same channel, and the frame is
/// the parts' bytes in order. The first part (the head) is an ordinary tx
/// frame descriptor, inline or in one buffer; each later part is `len` bytes
/// at `offset` anywhere in the frame area, across buffers if need be (a
/// payload in a send ring the application keeps off the free ring), never
/// inline. See [`Desc::MORE`] and [`Desc::CHAIN`] for how chains are taken
/// and completed.
///
/// Everything in a descriptor written by the other process is untrusted:
/// read it once (the rings hand out copies) and check the copy with
/// [`Layout::validate_frame`](crate::Layout::validate_frame),
/// [`Layout::validate_part`](crate::Layout::validate_part) or
/// [`Layout::validate_buffer`](crate::Layout::validate_buffer) before use.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Desc {
    /// Byte offset from the start of the segment (not of the frame area), so
    /// that it is also an address in a handler's view of the segment.
    pub offset: u32,
    /// Frame length in bytes.
    pub len: u32,
    /// The channel (U-Net's channel tag) the frame belongs to, as given by
    /// the multiplexer when the channel was bound.
    pub channel: u32,
    /// [`Desc::INLINE`], [`Desc::REJECTED`], [`Desc::MORE`], [`Desc::CHAIN`],
    /// [`Desc::QUIET`], [`Desc::CSUM_OK`]; other bits must be zero.
    pub flags: u32,
}

impl Desc {
    /// The frame's bytes are in the ring's inline slot, not in a buffer.
    pub const INLINE: u32 = 1 << 0;
    /// On the completion ring: the multiplexer did not send the frame (it
    /// failed the channel's header template, or the link refused it).
    pub const REJECTED: u32 = 1 << 1;
    /// On tx only: the frame continues in the next descriptor (AF_XDP's
    /// `XDP_PKT_CONTD`). The multiplexer takes a chain only once its last
    /// part (the first without `MORE`) is published, so an application
    /// publishes a chain with one producer index store
    /// ([`Producer::push_chain`](crate::Producer::push_chain)) and the
    /// multiplexer never sees half of one. A chain that has not ended after
    /// [`MAX_PARTS`] descriptors is rejected, and so is the rest of it, up
    /// to and including its next descriptor without `MORE`. A chain is
    /// rejected as a whole: every part is consumed, nothing is sent.
    /// Invalid on rx, free and completion.
    pub const MORE: u32 = 1 << 2;
    /// On the completion ring: this entry completes a chain ([`Desc::MORE`]).
    /// A chain gets exactly one completion, once the multiplexer has copied
    /// all of its parts (so every byte it referenced may be reused; the
    /// parts' entries are not released before that either), naming the
    /// buffer of its first part that is not inline: the head's buffer, or
    /// with an inline head the buffer holding the start of the second part,
    /// which the application may have kept (a send ring) rather than lent.
    /// `len` is the frame's total length (saturated). With
    /// [`Desc::REJECTED`] when the frame was not sent; a rejected chain
    /// whose first such offset is outside the frame area gets no
    /// completion. Completions come in tx ring order. A one-part frame is
    /// completed as before: its buffer if it has one, nothing if inline.
    pub const CHAIN: u32 = 1 << 3;
    /// On tx only, on a frame's first descriptor: from this frame on, frames
    /// received on its channel go on the rx ring without waking the
    /// application (no "non-empty" upcall; the "almost full" one stays),
    /// except, on a TCP connection's channel, a segment with the peer's FIN.
    /// It lasts as long as the channel. For a connection of which only the
    /// end is left to hear, so that the last ACKs wait for the
    /// application's next wake-up instead of causing one; set only by a
    /// frame the channel's template passed, so it concerns the sender's own
    /// channels only. A segment on a TCP listener's channel quiets the
    /// channel of its connection (now, or when the connection's own channel
    /// is bound), never the listener's. Ignored on rx, free and completion.
    pub const QUIET: u32 = 1 << 4;
    /// On rx only: the frame's transport checksum (TCP or UDP) is known
    /// good, so the application need not verify it again: Linux or the
    /// device verified it (`TP_STATUS_CSUM_VALID`), or the link computed it
    /// itself (a checksum Linux left partial, a segment cut from a
    /// super-segment). The IPv4 header's checksum is not covered, and a
    /// fragment never has it. Ignored on tx, free and completion.
    pub const CSUM_OK: u32 = 1 << 5;
    /// All flags this version knows; a descriptor with others is invalid.
    pub const KNOWN_FLAGS: u32 =
        Self::INLINE | Self::REJECTED | Self::MORE | Self::CHAIN | Self::QUIET | Self::CSUM_OK;

    /// A frame of `len` bytes at `offset` in a buffer, on `channel`.
    pub fn buffer(offset: u32, len: u32, channel: u32) -> Desc {
        Desc {
            offset,
            len,
            channel,
            flags: 0,
        }
    }

    /// Whether the frame is in the inline slot.
    pub fn is_inline(&self) -> bool {
        self.flags & Self::INLINE != 0
    }

    /// Whether the frame continues in the next tx descriptor.
    pub fn has_more(&self) -> bool {
        self.flags & Self::MORE != 0
    }

    /// Whether this completion completes a chain.
    pub fn is_chain(&self) -> bool {
        self.flags & Self::CHAIN != 0
    }

    /// Whether this tx frame makes its channel quiet.
    pub fn is_quiet(&self) -> bool {
        self.flags & Self::QUIET != 0
    }
}

/// Why a descriptor was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescError {
    /// Flag bits this version does not know.
    UnknownFlags { flags: u32 },
    /// An inline frame longer than [`INLINE_MAX`].
    InlineTooLong { len: u32 },
    /// Inline where a buffer is required (free and completion rings,
    /// [`Frames::read`](crate::Frames::read)).
    Inline,
    /// The offset is not inside the frame area.
    OutOfRange { offset: u32 },
    /// A buffer offset that is not the first byte of a frame buffer.
    Misaligned { offset: u32 },
    /// The frame runs past the end of its buffer.
    TooLong { offset: u32, len: u32 },
    /// [`Desc::MORE`] where a frame must be whole (rx, free, completion,
    /// [`Frames::read`](crate::Frames::read)).
    More,
}

impl fmt::Display for DescError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DescError::UnknownFlags { flags } => write!(f, "unknown descriptor flags {flags:#x}"),
            DescError::InlineTooLong { len } => {
                write!(f, "inline frame of {len} bytes (at most {INLINE_MAX})")
            }
            DescError::Inline => write!(f, "inline descriptor where a buffer is required"),
            DescError::OutOfRange { offset } => {
                write!(f, "offset {offset:#x} outside the frame area")
            }
            DescError::Misaligned { offset } => {
                write!(f, "offset {offset:#x} is not the start of a frame buffer")
            }
            DescError::TooLong { offset, len } => {
                write!(
                    f,
                    "frame of {len} bytes at {offset:#x} runs past its buffer"
                )
            }
            DescError::More => write!(f, "a continued frame where a whole one is required"),
        }
    }
}

impl std::error::Error for DescError {}
