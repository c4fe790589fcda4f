//! The TCP send area: frame buffers of the segment kept off every ring and
//! lent, a slot each, to connections as their send buffers, so that segments
//! name their data there (tx chains) and the multiplexer reads it in place,
//! for transmissions and retransmissions alike.

use exonet_shm::Frames;

use crate::tcp::SendMemory;

/// One connection's send buffer in the area.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// The socket whose connection has it; `None` when free or draining.
    owner: Option<usize>,
    /// Chains naming its bytes the multiplexer has not completed: it is not
    /// lent again before they are.
    in_flight: u32,
}

pub(crate) struct SendArea {
    frames: Frames,
    /// Segment offset of the first slot.
    base: u32,
    slot_size: u32,
    slots: Vec<Slot>,
}

impl SendArea {
    /// An area of `len` bytes at segment offset `base` (whole frame buffers),
    /// in slots of `slot_size` bytes; none if either is zero.
    pub fn new(frames: Frames, base: u32, len: u32, slot_size: u32) -> SendArea {
        let count = len.checked_div(slot_size).unwrap_or(0);
        SendArea {
            frames,
            base,
            slot_size,
            slots: vec![Slot::default(); count as usize],
        }
    }

    /// The largest send buffer a slot holds.
    pub fn slot_size(&self) -> usize {
        self.slot_size as usize
    }

    /// Lends a free slot to socket `owner`: its index and the memory.
    pub fn lend(&mut self, owner: usize) -> Option<(usize, Box<dyn SendMemory>)> {
        let i = self
            .slots
            .iter()
            .position(|s| s.owner.is_none() && s.in_flight == 0)?;
        self.slots[i].owner = Some(owner);
        let offset = self.base + i as u32 * self.slot_size;
        let ptr = self.frames.area_ptr(offset, self.slot_size).ok()?;
        Some((
            i,
            Box::new(SlotMemory {
                _frames: self.frames.clone(),
                ptr,
                offset,
                len: self.slot_size as usize,
            }),
        ))
    }

    /// The connection of slot `i` is gone: the slot is free once the chains
    /// in flight from it complete.
    pub fn release(&mut self, i: usize) {
        if let Some(s) = self.slots.get_mut(i) {
            s.owner = None;
        }
    }

    /// A chain naming slot `i`'s bytes went on the tx ring.
    pub fn sent(&mut self, i: usize) {
        if let Some(s) = self.slots.get_mut(i) {
            s.in_flight += 1;
        }
    }

    /// A completion naming the buffer at `offset`: if it is in the area, the
    /// slot's oldest chain is done; returns the slot's owner (if it has one
    /// still). `None` also for a buffer outside the area, which is the
    /// caller's.
    pub fn complete(&mut self, offset: u32) -> Option<Option<usize>> {
        let rel = offset.checked_sub(self.base)?;
        let s = self.slots.get_mut((rel / self.slot_size.max(1)) as usize)?;
        s.in_flight = s.in_flight.saturating_sub(1);
        Some(s.owner)
    }

    /// Slots lent or draining.
    pub fn in_use(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.owner.is_some() || s.in_flight > 0)
            .count()
    }
}

/// A slot's bytes, as a connection's send memory.
struct SlotMemory {
    /// Keeps the mapping alive.
    _frames: Frames,
    ptr: std::ptr::NonNull<u8>,
    offset: u32,
    len: usize,
}

// SAFETY: the pointer is into the segment mapping `_frames` keeps alive; the
// slot is used by one connection at a time, and whichever thread holds the
// stack's lock.
#[allow(unsafe_code)]
unsafe impl Send for SlotMemory {}

impl SendMemory for SlotMemory {
    fn segment_offset(&self) -> u32 {
        self.offset
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` lie in the frame area (checked when
        // lent). The multiplexer only reads them (tx chains); the slot is this
        // connection's alone, and its send buffer writes no byte a chain in
        // flight names, so no write races this shared borrow.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
        }
    }

    fn write(&mut self, at: usize, data: &[u8]) {
        assert!(
            at <= self.len && data.len() <= self.len - at,
            "write past the slot"
        );
        // SAFETY: the range lies in the slot (asserted), which is in the frame
        // area; the send buffer writes no byte a chain in flight names, so the
        // multiplexer reads none of these bytes now. Through the pointer, not a
        // `&mut` over the slot, which the multiplexer's reads elsewhere in it
        // would alias.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(at), data.len())
        }
    }
}
