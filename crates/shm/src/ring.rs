//! Single-producer single-consumer descriptor rings (AF_XDP's xsk rings,
//! U-Net's queues).
//!
//! A ring is a producer index and a consumer index, each on its own cache
//! line, then `entries` descriptors (a power of two), then, on rx and tx, one
//! inline slot per entry. Indices are free-running `u32`s; entry `i` lives at
//! `i & (entries - 1)`. The producer fills entries `[prod, prod + n)` and then
//! publishes them with a release store of `prod + n`; the consumer reads the
//! producer index with an acquire load, copies entries `[cons, prod)` out,
//! and gives them back with a release store of its consumer index. The
//! acquire on the other side's index orders our accesses to entries after
//! theirs: the consumer sees the descriptors the producer wrote, and the
//! producer never overwrites an entry the consumer is still reading.
//!
//! Each side keeps its own index privately (it never reads it back from
//! shared memory, where the peer could have changed it) and a cached copy of
//! the other side's, which it refreshes only when the cache says the ring is
//! full (producer) or empty (consumer), so the fast path does not touch the
//! line the other side writes.
//!
//! The other side is untrusted: an index that claims more than a ring's
//! worth of entries is reported as [`RingError`], never followed; every slot
//! access is masked into the ring; descriptors are handed out as copies to
//! be validated by the caller.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use exonet_wire::field::tail_word;

use crate::desc::{Desc, INLINE_MAX, MAX_PARTS};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Keeps the memory a ring points into alive (the mapping, or under loom the
/// heap allocation).
pub(crate) type Keep = Arc<dyn Send + Sync>;

/// A descriptor as it sits in shared memory: the fields of [`Desc`] as
/// atomics, so that a peer writing them concurrently is a race on values,
/// not undefined behaviour.
#[repr(C)]
pub(crate) struct DescSlot {
    offset: AtomicU32,
    len: AtomicU32,
    channel: AtomicU32,
    flags: AtomicU32,
}

impl DescSlot {
    // Relaxed: the ring indices' acquire/release order these accesses.
    #[inline]
    fn load(&self) -> Desc {
        Desc {
            offset: self.offset.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
            channel: self.channel.load(Ordering::Relaxed),
            flags: self.flags.load(Ordering::Relaxed),
        }
    }

    #[inline]
    fn store(&self, d: &Desc) {
        self.offset.store(d.offset, Ordering::Relaxed);
        self.len.store(d.len, Ordering::Relaxed);
        self.channel.store(d.channel, Ordering::Relaxed);
        self.flags.store(d.flags, Ordering::Relaxed);
    }
}

const INLINE_WORDS: usize = INLINE_MAX / 8;

/// One inline slot: [`INLINE_MAX`] bytes, accessed as 64-bit atomic words
/// (native byte order, so the bytes in memory are the frame's bytes).
#[repr(C)]
pub(crate) struct InlineSlot([AtomicU64; INLINE_WORDS]);

impl InlineSlot {
    // Whole words go as they are and only the last, partial one is padded:
    // this runs four times per short frame (application and multiplexer, each
    // way), so a per-chunk copy of variable length would show.
    fn store(&self, data: &[u8]) {
        let mut words = data.chunks_exact(8);
        let mut slots = self.0.iter();
        // Chunks first: zip stops on them without taking a slot.
        for (chunk, word) in (&mut words).zip(&mut slots) {
            let w = u64::from_ne_bytes(chunk.try_into().expect("8-byte chunk"));
            word.store(w, Ordering::Relaxed);
        }
        let tail = words.remainder();
        if let (Some(word), false) = (slots.next(), tail.is_empty()) {
            word.store(tail_word(tail), Ordering::Relaxed);
        }
    }

    fn load(&self, out: &mut [u8]) {
        let mut words = out.chunks_exact_mut(8);
        let mut slots = self.0.iter();
        for (chunk, word) in (&mut words).zip(&mut slots) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        let tail = words.into_remainder();
        if let (Some(word), false) = (slots.next(), tail.is_empty()) {
            word_tail(word.load(Ordering::Relaxed), tail);
        }
    }
}

// A partial word's bytes go in at most three moves each way (wire's
// `tail_word` in, `word_tail` out): a copy of a length not known in advance
// is a call to `memcpy`, which costs more than the rest of a short frame's
// word.

/// Writes the first `t.len()` (under 8) native-order bytes of `w` to `t`.
fn word_tail(w: u64, t: &mut [u8]) {
    let w = w.to_le();
    let mut at = 0;
    if t.len() >= 4 {
        t[..4].copy_from_slice(&(w as u32).to_le_bytes());
        at = 4;
    }
    if t.len() - at >= 2 {
        t[at..at + 2].copy_from_slice(&((w >> (8 * at)) as u16).to_le_bytes());
        at += 2;
    }
    if t.len() > at {
        t[at] = (w >> (8 * at)) as u8;
    }
}

/// Where one ring's parts are.
#[derive(Clone, Copy)]
pub(crate) struct RingPtrs {
    pub producer: NonNull<AtomicU32>,
    pub consumer: NonNull<AtomicU32>,
    /// `mask + 1` descriptor slots.
    pub descs: NonNull<DescSlot>,
    /// `mask + 1` inline slots, on rings that carry inline frames.
    pub inline: Option<NonNull<InlineSlot>>,
    pub mask: u32,
}

/// The invariant every method relies on: the pointers of `ptrs` stay valid
/// for as long as `_keep` is held, and `descs` (and `inline`, if any) hold
/// `mask + 1` slots.
struct Ring {
    ptrs: RingPtrs,
    _keep: Keep,
}

impl Ring {
    #[inline]
    fn producer(&self) -> &AtomicU32 {
        // SAFETY: valid while `_keep` lives (the `Ring` invariant).
        unsafe { self.ptrs.producer.as_ref() }
    }

    #[inline]
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: valid while `_keep` lives (the `Ring` invariant).
        unsafe { self.ptrs.consumer.as_ref() }
    }

    #[inline]
    fn entries(&self) -> u32 {
        self.ptrs.mask + 1
    }

    #[inline]
    fn desc(&self, index: u32) -> &DescSlot {
        let i = (index & self.ptrs.mask) as usize;
        // SAFETY: `i <= mask` and there are `mask + 1` slots (the `Ring`
        // invariant), so the slot is inside the ring.
        unsafe { &*self.ptrs.descs.as_ptr().add(i) }
    }

    fn inline(&self, index: u32) -> Option<&InlineSlot> {
        let i = (index & self.ptrs.mask) as usize;
        // SAFETY: as in `desc`.
        self.ptrs.inline.map(|p| unsafe { &*p.as_ptr().add(i) })
    }
}

/// What went wrong on a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// The peer's producer index claims more entries than the ring holds
    /// (or is behind our consumer index): the peer is broken or hostile.
    ProducerIndex { producer: u32, consumer: u32 },
    /// The peer's consumer index is ahead of our producer index, or more
    /// than a ring behind it.
    ConsumerIndex { producer: u32, consumer: u32 },
    /// Inline data longer than [`INLINE_MAX`].
    InlineTooLong { len: usize },
    /// This ring has no inline slots (only rx and tx do).
    NoInlineSlots,
    /// A chain of no parts or more than [`MAX_PARTS`], or with an inline
    /// part after the first.
    BadChain { parts: usize },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RingError::ProducerIndex { producer, consumer } => write!(
                f,
                "peer's producer index {producer} is not within a ring of consumer index {consumer}"
            ),
            RingError::ConsumerIndex { producer, consumer } => write!(
                f,
                "peer's consumer index {consumer} is not within a ring of producer index {producer}"
            ),
            RingError::InlineTooLong { len } => {
                write!(f, "inline frame of {len} bytes (at most {INLINE_MAX})")
            }
            RingError::NoInlineSlots => write!(f, "this ring has no inline slots"),
            RingError::BadChain { parts } => write!(
                f,
                "a chain of {parts} parts (1 to {MAX_PARTS}, only the first inline)"
            ),
        }
    }
}

impl std::error::Error for RingError {}

/// One part of a multi-part transmit frame, for
/// [`Producer::push_chain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part<'a> {
    /// Bytes copied into the entry's inline slot (the first part only).
    Inline(&'a [u8]),
    /// `len` bytes at `offset` of the segment: inside one buffer for the
    /// first part, anywhere in the frame area for the others.
    Area { offset: u32, len: u32 },
}

/// The producing end of a ring: free and tx for the application, rx and
/// completion for the multiplexer.
///
/// Batch use: [`reserve`](Self::reserve) `n`, [`write`](Self::write) entries
/// `0..k` of the `k` granted, [`submit`](Self::submit) them. Single items:
/// [`push`](Self::push), [`push_inline`](Self::push_inline).
pub struct Producer {
    ring: Ring,
    /// Next index to fill; everything before it is published.
    prod: u32,
    /// The consumer index as last read (always within a ring of `prod`).
    cons_cache: u32,
    /// Entries granted by the last `reserve`, not yet submitted.
    reserved: u32,
}

// SAFETY: the pointers are into memory kept alive by the `Keep` the producer
// holds, and all accesses to it are atomic.
unsafe impl Send for Producer {}

impl Producer {
    /// # Safety
    /// `ptrs` must satisfy the `Ring` invariant for as long as `keep` lives.
    pub(crate) unsafe fn new(ptrs: RingPtrs, keep: Keep) -> Producer {
        let ring = Ring { ptrs, _keep: keep };
        // Start where the shared index says (zero on a fresh segment), and
        // keep our own copy from then on.
        let prod = ring.producer().load(Ordering::Relaxed);
        Producer {
            ring,
            prod,
            cons_cache: prod,
            reserved: 0,
        }
    }

    /// Number of entries in the ring.
    #[inline]
    pub fn entries(&self) -> u32 {
        self.ring.entries()
    }

    /// Whether [`write_inline`](Self::write_inline) can be used (rx, tx).
    #[inline]
    pub fn has_inline(&self) -> bool {
        self.ring.ptrs.inline.is_some()
    }

    /// Reserves up to `n` entries and returns how many were granted (0 when
    /// the ring is full). A new reservation replaces an unsubmitted one.
    #[inline]
    pub fn reserve(&mut self, n: u32) -> Result<u32, RingError> {
        let size = self.ring.entries();
        let mut free = size - self.prod.wrapping_sub(self.cons_cache);
        if free < n {
            // Acquire: the consumer's reads of the entries it gave back
            // happen before we overwrite them.
            let cons = self.ring.consumer().load(Ordering::Acquire);
            let used = self.prod.wrapping_sub(cons);
            if used > size {
                return Err(RingError::ConsumerIndex {
                    producer: self.prod,
                    consumer: cons,
                });
            }
            self.cons_cache = cons;
            free = size - used;
        }
        self.reserved = n.min(free);
        Ok(self.reserved)
    }

    /// Fills reserved entry `i` (counted from the first reserved one).
    ///
    /// # Panics
    /// If `i` is not below the count the last `reserve` granted.
    #[inline]
    pub fn write(&mut self, i: u32, desc: Desc) {
        assert!(
            i < self.reserved,
            "write({i}) beyond reservation of {}",
            self.reserved
        );
        self.ring.desc(self.prod.wrapping_add(i)).store(&desc);
    }

    /// Fills reserved entry `i` with an inline frame: `data` goes into the
    /// entry's inline slot and the descriptor gets [`Desc::INLINE`].
    ///
    /// # Panics
    /// If `i` is not below the count the last `reserve` granted.
    pub fn write_inline(&mut self, i: u32, channel: u32, data: &[u8]) -> Result<(), RingError> {
        self.write_inline_flags(i, channel, data, 0)
    }

    /// [`write_inline`](Self::write_inline) with `flags` besides
    /// [`Desc::INLINE`].
    fn write_inline_flags(
        &mut self,
        i: u32,
        channel: u32,
        data: &[u8],
        flags: u32,
    ) -> Result<(), RingError> {
        assert!(
            i < self.reserved,
            "write_inline({i}) beyond reservation of {}",
            self.reserved
        );
        let index = self.prod.wrapping_add(i);
        let slot = self.ring.inline(index).ok_or(RingError::NoInlineSlots)?;
        if data.len() > INLINE_MAX {
            return Err(RingError::InlineTooLong { len: data.len() });
        }
        slot.store(data);
        self.ring.desc(index).store(&Desc {
            offset: 0,
            len: data.len() as u32,
            channel,
            flags: Desc::INLINE | flags,
        });
        Ok(())
    }

    /// Publishes the first `k` reserved entries (and drops the rest of the
    /// reservation).
    ///
    /// # Panics
    /// If `k` exceeds the count the last `reserve` granted.
    #[inline]
    pub fn submit(&mut self, k: u32) {
        assert!(
            k <= self.reserved,
            "submit({k}) beyond reservation of {}",
            self.reserved
        );
        self.reserved = 0;
        if k == 0 {
            return;
        }
        self.prod = self.prod.wrapping_add(k);
        // Release: the entries' contents are visible before the index.
        self.ring.producer().store(self.prod, Ordering::Release);
    }

    /// Pushes one descriptor; `Ok(false)` if the ring is full.
    pub fn push(&mut self, desc: Desc) -> Result<bool, RingError> {
        if self.reserve(1)? == 0 {
            return Ok(false);
        }
        self.write(0, desc);
        self.submit(1);
        Ok(true)
    }

    /// Pushes one inline frame; `Ok(false)` if the ring is full.
    pub fn push_inline(&mut self, channel: u32, data: &[u8]) -> Result<bool, RingError> {
        self.push_inline_with(channel, data, 0)
    }

    /// [`push_inline`](Self::push_inline) with `flags` besides
    /// [`Desc::INLINE`] (such as [`Desc::QUIET`]).
    pub fn push_inline_with(
        &mut self,
        channel: u32,
        data: &[u8],
        flags: u32,
    ) -> Result<bool, RingError> {
        if !self.has_inline() {
            return Err(RingError::NoInlineSlots);
        }
        if data.len() > INLINE_MAX {
            return Err(RingError::InlineTooLong { len: data.len() });
        }
        if self.reserve(1)? == 0 {
            return Ok(false);
        }
        self.write_inline_flags(0, channel, data, flags)?;
        self.submit(1);
        Ok(true)
    }

    /// Pushes a frame of `parts` on `channel` (tx): every part but the last
    /// gets [`Desc::MORE`], and all are published with one index store, so
    /// the consumer sees the whole chain or none of it. `Ok(false)` if the
    /// ring has no room for all the parts (nothing is pushed then).
    pub fn push_chain(&mut self, channel: u32, parts: &[Part<'_>]) -> Result<bool, RingError> {
        self.push_chain_with(channel, parts, 0)
    }

    /// [`push_chain`](Self::push_chain) with `flags` on the head (such as
    /// [`Desc::QUIET`]).
    pub fn push_chain_with(
        &mut self,
        channel: u32,
        parts: &[Part<'_>],
        flags: u32,
    ) -> Result<bool, RingError> {
        let bad = RingError::BadChain { parts: parts.len() };
        if parts.is_empty() || parts.len() > MAX_PARTS {
            return Err(bad);
        }
        for (i, part) in parts.iter().enumerate() {
            match part {
                Part::Inline(_) if i > 0 => return Err(bad),
                Part::Inline(data) if data.len() > INLINE_MAX => {
                    return Err(RingError::InlineTooLong { len: data.len() })
                }
                Part::Inline(_) if !self.has_inline() => return Err(RingError::NoInlineSlots),
                _ => {}
            }
        }
        let n = parts.len() as u32;
        if self.reserve(n)? < n {
            // Drops the partial reservation: a chain goes whole or not at all.
            self.submit(0);
            return Ok(false);
        }
        for (i, part) in (0..).zip(parts) {
            let more = if i + 1 < n { Desc::MORE } else { 0 };
            let more = if i == 0 { more | flags } else { more };
            match *part {
                Part::Inline(data) => self.write_inline_flags(i, channel, data, more)?,
                Part::Area { offset, len } => self.write(
                    i,
                    Desc {
                        offset,
                        len,
                        channel,
                        flags: more,
                    },
                ),
            }
        }
        self.submit(n);
        Ok(true)
    }

    /// Entries published and not yet given back by the consumer, read fresh
    /// from shared memory. A consumer index out of range reads as a full
    /// ring (this is a hint for wake-ups, not a bound anything relies on).
    #[inline]
    pub fn outstanding(&self) -> u32 {
        let cons = self.ring.consumer().load(Ordering::Relaxed);
        self.prod.wrapping_sub(cons).min(self.ring.entries())
    }
}

/// The consuming end of a ring: rx and completion for the application, free
/// and tx for the multiplexer.
///
/// The small index operations of both ends are `#[inline]`: the stack and
/// the multiplexer call them dozens of times per round trip, across crates.
///
/// Batch use: [`peek`](Self::peek) up to `n`, [`read`](Self::read) entries
/// `0..k` of the `k` available (each read copies the descriptor out of
/// shared memory: read each once and validate the copy),
/// [`release`](Self::release) them. Single items: [`pop`](Self::pop),
/// [`pop_frame`](Self::pop_frame).
pub struct Consumer {
    ring: Ring,
    /// Next index to read; everything before it is given back.
    cons: u32,
    /// The producer index as last read (always within a ring of `cons`).
    prod_cache: u32,
    /// Entries made available by the last `peek`, not yet released.
    peeked: u32,
}

// SAFETY: as for `Producer`.
unsafe impl Send for Consumer {}

impl Consumer {
    /// # Safety
    /// `ptrs` must satisfy the `Ring` invariant for as long as `keep` lives.
    pub(crate) unsafe fn new(ptrs: RingPtrs, keep: Keep) -> Consumer {
        let ring = Ring { ptrs, _keep: keep };
        let cons = ring.consumer().load(Ordering::Relaxed);
        Consumer {
            ring,
            cons,
            prod_cache: cons,
            peeked: 0,
        }
    }

    /// Number of entries in the ring.
    #[inline]
    pub fn entries(&self) -> u32 {
        self.ring.entries()
    }

    /// Makes up to `n` entries available to [`read`](Self::read) and returns
    /// how many (0 when the ring is empty).
    #[inline]
    pub fn peek(&mut self, n: u32) -> Result<u32, RingError> {
        let mut avail = self.prod_cache.wrapping_sub(self.cons);
        if avail < n {
            // Acquire: the producer's writes to the entries happen before
            // our reads of them.
            let prod = self.ring.producer().load(Ordering::Acquire);
            let a = prod.wrapping_sub(self.cons);
            if a > self.ring.entries() {
                return Err(RingError::ProducerIndex {
                    producer: prod,
                    consumer: self.cons,
                });
            }
            self.prod_cache = prod;
            avail = a;
        }
        self.peeked = n.min(avail);
        Ok(self.peeked)
    }

    /// Copies entry `i` of the peeked ones out of shared memory.
    ///
    /// # Panics
    /// If `i` is not below the count the last `peek` returned.
    #[inline]
    pub fn read(&self, i: u32) -> Desc {
        assert!(i < self.peeked, "read({i}) beyond peek of {}", self.peeked);
        self.ring.desc(self.cons.wrapping_add(i)).load()
    }

    /// Copies the inline bytes of peeked entry `i`, whose descriptor (as
    /// read and validated by the caller) is `desc`, into `out`; returns the
    /// number of bytes copied: `desc.len`, clamped to [`INLINE_MAX`] and to
    /// `out.len()`; 0 on a ring without inline slots.
    ///
    /// # Panics
    /// If `i` is not below the count the last `peek` returned.
    pub fn read_inline(&self, i: u32, desc: &Desc, out: &mut [u8]) -> usize {
        assert!(
            i < self.peeked,
            "read_inline({i}) beyond peek of {}",
            self.peeked
        );
        let Some(slot) = self.ring.inline(self.cons.wrapping_add(i)) else {
            return 0;
        };
        let n = (desc.len as usize).min(INLINE_MAX).min(out.len());
        slot.load(&mut out[..n]);
        n
    }

    /// Gives the first `n` peeked entries back to the producer (and drops
    /// the rest of the peek).
    ///
    /// # Panics
    /// If `n` exceeds the count the last `peek` returned.
    #[inline]
    pub fn release(&mut self, n: u32) {
        assert!(
            n <= self.peeked,
            "release({n}) beyond peek of {}",
            self.peeked
        );
        self.peeked = 0;
        if n == 0 {
            return;
        }
        self.cons = self.cons.wrapping_add(n);
        // Release: our reads of the entries happen before the producer
        // reuses them.
        self.ring.consumer().store(self.cons, Ordering::Release);
    }

    /// Takes one descriptor (free and completion rings).
    #[inline]
    pub fn pop(&mut self) -> Result<Option<Desc>, RingError> {
        if self.peek(1)? == 0 {
            return Ok(None);
        }
        let d = self.read(0);
        self.release(1);
        Ok(Some(d))
    }

    /// Takes one frame descriptor (rx and tx rings); if it is inline, its
    /// bytes (`desc.len` of them, at most [`INLINE_MAX`]) are copied into
    /// `inline` first.
    #[inline]
    pub fn pop_frame(&mut self, inline: &mut [u8; INLINE_MAX]) -> Result<Option<Desc>, RingError> {
        if self.peek(1)? == 0 {
            return Ok(None);
        }
        let d = self.read(0);
        if d.is_inline() {
            self.read_inline(0, &d, inline);
        }
        self.release(1);
        Ok(Some(d))
    }

    /// Whether the producer has published entries we have not taken: the
    /// re-check of the sleep protocol. Reads shared memory only when the
    /// cached producer index says the ring is empty.
    #[inline]
    pub fn has_pending(&self) -> bool {
        self.prod_cache != self.cons || self.ring.producer().load(Ordering::Acquire) != self.cons
    }
}

/// A ring on the heap, for model checking without a segment.
#[cfg(all(loom, test))]
pub(crate) mod heap {
    use super::*;

    struct HeapRing {
        producer: AtomicU32,
        consumer: AtomicU32,
        descs: Box<[DescSlot]>,
        inline: Option<Box<[InlineSlot]>>,
    }

    /// A ring of `entries` (a power of two), with inline slots if `inline`.
    pub(crate) fn ring(entries: u32, inline: bool) -> (Producer, Consumer) {
        assert!(entries.is_power_of_two());
        let heap = Arc::new(HeapRing {
            producer: AtomicU32::new(0),
            consumer: AtomicU32::new(0),
            descs: (0..entries)
                .map(|_| DescSlot {
                    offset: AtomicU32::new(0),
                    len: AtomicU32::new(0),
                    channel: AtomicU32::new(0),
                    flags: AtomicU32::new(0),
                })
                .collect(),
            inline: inline.then(|| {
                (0..entries)
                    .map(|_| InlineSlot(std::array::from_fn(|_| AtomicU64::new(0))))
                    .collect()
            }),
        });
        let ptrs = RingPtrs {
            producer: NonNull::from(&heap.producer),
            consumer: NonNull::from(&heap.consumer),
            descs: NonNull::from(&*heap.descs).cast(),
            inline: heap.inline.as_ref().map(|s| NonNull::from(&**s).cast()),
            mask: entries - 1,
        };
        // SAFETY: the pointers are into `heap`, which both ends keep alive,
        // and the slices hold `entries` slots.
        unsafe { (Producer::new(ptrs, heap.clone()), Consumer::new(ptrs, heap)) }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn inline_slots_keep_every_length() {
        let slot = InlineSlot(std::array::from_fn(|_| AtomicU64::new(u64::MAX)));
        for len in 0..=INLINE_MAX {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            slot.store(&data);
            // A partial last word is zero-padded.
            if len % 8 != 0 {
                let mut last = [0u8; 8];
                last[..len % 8].copy_from_slice(&data[len / 8 * 8..]);
                let word = slot.0[len / 8].load(Ordering::Relaxed);
                assert_eq!(word, u64::from_ne_bytes(last), "length {len}");
            }
            let mut out = vec![0xaa; len];
            slot.load(&mut out);
            assert_eq!(out, data, "length {len}");
        }
    }
}
