//! The send buffer: the application's bytes from SND.UNA on, until the peer
//! acknowledges them.
//!
//! It lives either in the connection's own heap memory, and every segment copies
//! its data out, or in memory the caller lends ([`SendMemory`]): a part of the
//! endpoint's segment that the multiplexer reads, so that a segment's data is sent
//! (and sent again) where it lies, named by descriptors, never copied into a
//! frame (the "send buffers referenced in the segment" of the Thekkath and U-Net
//! TCPs). A byte a segment referenced stays untouched until the caller reports the
//! segment's transmission complete ([`Connection::reference_done`](super::Connection::reference_done)),
//! even if the peer acknowledged it meanwhile: the multiplexer may not have read
//! it yet.

use exonet_wire::checksum;
use std::collections::VecDeque;
use std::fmt;

/// Memory a connection's send buffer may live in, lent by the caller: bytes the
/// transmitter reads in place at `segment_offset` (the offset of the first byte
/// in the endpoint's segment). The connection uses it as a ring and writes only
/// bytes no segment in flight references.
pub trait SendMemory: Send {
    /// Where the memory starts in the endpoint's segment.
    fn segment_offset(&self) -> u32;
    fn bytes(&self) -> &[u8];
    /// Copies `data` to `at`.
    fn write(&mut self, at: usize, data: &[u8]);
}

/// Where a segment's data lies in the endpoint's segment: one piece, or two where
/// it wraps around the end of the send ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pieces {
    /// (offset in the segment, length); unused ones are zero-length.
    pub at: [(u32, u32); 2],
}

impl Pieces {
    /// The pieces with data, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.at.iter().copied().filter(|p| p.1 > 0)
    }

    /// Their total length.
    pub fn len(&self) -> usize {
        self.at.iter().map(|p| p.1 as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub(crate) struct SendBuffer {
    store: Store,
}

enum Store {
    Heap(VecDeque<u8>),
    Lent(Ring),
}

/// A send buffer in lent memory.
struct Ring {
    mem: Box<dyn SendMemory>,
    /// Stream position (bytes since the first queued) of the oldest byte held.
    head: u64,
    len: usize,
    /// Stream positions where the data of each segment referenced and not yet
    /// done starts, in the order sent.
    in_flight: VecDeque<u64>,
    /// The sum ([`checksum::sum`]) of each whole block of [`BLOCK`] bytes of
    /// the memory, as far as this lap has written it: taken when the bytes
    /// are written (and still in the cache), so that a segment's checksum
    /// adds these and reads only its two ends.
    sums: Vec<u16>,
}

/// The block of [`Ring::sums`]: a segment reads up to a block at either end.
const BLOCK: usize = 128;

impl Ring {
    fn size(&self) -> usize {
        self.mem.bytes().len()
    }

    /// Bytes that may be written now without touching a referenced one: the
    /// ring from the end of the data round to the oldest byte held, queued
    /// or referenced.
    fn writable(&self) -> usize {
        let oldest = self.in_flight.iter().copied().fold(self.head, u64::min);
        self.size() - (self.head + self.len as u64 - oldest) as usize
    }

    /// Bytes `range` (offsets from the head) as the two slices of the ring.
    fn slices(&self, range: std::ops::Range<usize>) -> (&[u8], &[u8]) {
        let bytes = self.mem.bytes();
        let (a, b) = self.split(range);
        (&bytes[a.0..a.0 + a.1], &bytes[b.0..b.0 + b.1])
    }

    /// Takes the sums of the blocks that bytes `at..end` of the memory, just
    /// written, complete (each from its start, which this lap wrote before).
    /// A block still being filled needs none: only whole blocks inside a
    /// segment are read from their sums, and the write that completes one
    /// sums it (small writes would otherwise sum the block again each).
    fn update_sums(&mut self, at: usize, end: usize) {
        let bytes = self.mem.bytes();
        let blocks = at / BLOCK..(end / BLOCK).min(self.sums.len());
        if !blocks.is_empty() {
            checksum::sum_blocks::<BLOCK>(
                &bytes[blocks.start * BLOCK..blocks.end * BLOCK],
                &mut self.sums[blocks],
            );
        }
    }

    /// The sum of memory bytes `at..end` (no wrap), as if they began at an
    /// even offset: the whole blocks inside from their sums, the ends read.
    fn piece_sum(&self, at: usize, end: usize) -> u16 {
        let bytes = self.mem.bytes();
        let first = at.div_ceil(BLOCK);
        let last = (end / BLOCK).min(self.sums.len());
        if first >= last {
            return checksum::sum(&bytes[at..end]);
        }
        let head = checksum::sum(&bytes[at..first * BLOCK]);
        // Blocks start at even offsets of the memory, and the tail after
        // whole blocks does too: they add as they are.
        let rest = self.sums[first..last]
            .iter()
            .fold(checksum::sum(&bytes[last * BLOCK..end]), |acc, &s| {
                checksum::add(acc, s)
            });
        combine(head, first * BLOCK - at, rest)
    }

    /// `range` (offsets from the head) as (index, length) in the memory: before
    /// and after the wrap.
    fn split(&self, range: std::ops::Range<usize>) -> ((usize, usize), (usize, usize)) {
        let size = self.size();
        let start = ((self.head + range.start as u64) % size as u64) as usize;
        let n = range.len();
        let first = n.min(size - start);
        ((start, first), (0, n - first))
    }
}

impl SendBuffer {
    pub fn new() -> SendBuffer {
        SendBuffer {
            store: Store::Heap(VecDeque::new()),
        }
    }

    /// Moves the buffer into `mem`. Only while empty: returns the memory back
    /// otherwise, or if it is too small to be of use.
    pub fn lend(&mut self, mem: Box<dyn SendMemory>) -> Result<(), Box<dyn SendMemory>> {
        if self.len() > 0 || mem.bytes().is_empty() || matches!(self.store, Store::Lent(_)) {
            return Err(mem);
        }
        let size = mem.bytes().len();
        self.store = Store::Lent(Ring {
            mem,
            head: 0,
            len: 0,
            in_flight: VecDeque::new(),
            sums: vec![0; size / BLOCK],
        });
        Ok(())
    }

    /// Stops taking block sums as bytes are written (lent memory): over a link
    /// with segmentation offload, which sums the data of super-segments
    /// itself, they are mostly not read; the segments that need a sum (short
    /// ones, retransmissions) then read their bytes.
    pub fn stop_block_sums(&mut self) {
        if let Store::Lent(r) = &mut self.store {
            if !r.sums.is_empty() {
                r.sums = Vec::new();
            }
        }
    }

    pub fn is_lent(&self) -> bool {
        matches!(self.store, Store::Lent(_))
    }

    pub fn len(&self) -> usize {
        match &self.store {
            Store::Heap(q) => q.len(),
            Store::Lent(r) => r.len,
        }
    }

    /// Bytes [`SendBuffer::push`] would take now under `limit`.
    pub fn room(&self, limit: usize) -> usize {
        let room = limit.saturating_sub(self.len());
        match &self.store {
            Store::Heap(_) => room,
            Store::Lent(r) => room.min(r.writable()),
        }
    }

    /// Queues as much of `data` as fits under `limit` bytes held (and, in lent
    /// memory, beside the bytes still referenced); returns how much.
    pub fn push(&mut self, data: &[u8], limit: usize) -> usize {
        let n = data.len().min(limit.saturating_sub(self.len()));
        match &mut self.store {
            Store::Heap(q) => {
                q.extend(&data[..n]);
                n
            }
            Store::Lent(r) => {
                let n = n.min(r.writable());
                let (a, _) = r.split(r.len..r.len + n);
                r.mem.write(a.0, &data[..a.1]);
                r.update_sums(a.0, a.0 + a.1);
                if a.1 < n {
                    // Past the end of the memory: the rest at its start.
                    r.mem.write(0, &data[a.1..n]);
                    r.update_sums(0, n - a.1);
                }
                r.len += n;
                n
            }
        }
    }

    /// Drops the oldest `n` bytes (acknowledged).
    pub fn drain(&mut self, n: usize) {
        match &mut self.store {
            Store::Heap(q) => {
                q.drain(..n.min(q.len()));
            }
            Store::Lent(r) => {
                let n = n.min(r.len);
                r.head += n as u64;
                r.len -= n;
            }
        }
    }

    /// Bytes `range` (offsets from the oldest) as two slices, the second empty
    /// unless the range wraps.
    pub fn slices(&self, range: std::ops::Range<usize>) -> (&[u8], &[u8]) {
        match &self.store {
            Store::Heap(q) => {
                let (a, b) = q.as_slices();
                let in_a = range.start.min(a.len())..range.end.min(a.len());
                let in_b = range.start.saturating_sub(a.len())..range.end.saturating_sub(a.len());
                (&a[in_a], &b[in_b])
            }
            Store::Lent(r) => r.slices(range),
        }
    }

    /// The sum ([`checksum::sum`]) of bytes `range` (offsets from the oldest),
    /// as a segment's data: in lent memory mostly from the sums taken when
    /// the bytes were written.
    pub fn sum(&self, range: std::ops::Range<usize>) -> u16 {
        match &self.store {
            Store::Heap(_) => {
                let (a, b) = self.slices(range);
                sum(a, b)
            }
            Store::Lent(r) => {
                let (a, b) = r.split(range);
                combine(
                    r.piece_sum(a.0, a.0 + a.1),
                    a.1,
                    r.piece_sum(b.0, b.0 + b.1),
                )
            }
        }
    }

    /// Where bytes `range` lie in the segment, recorded as referenced until
    /// [`SendBuffer::done`]; `None` for a heap buffer.
    pub fn reference(&mut self, range: std::ops::Range<usize>) -> Option<Pieces> {
        let Store::Lent(r) = &mut self.store else {
            return None;
        };
        let base = r.mem.segment_offset();
        let (a, b) = r.split(range.clone());
        r.in_flight.push_back(r.head + range.start as u64);
        Some(Pieces {
            at: [
                (base + a.0 as u32, a.1 as u32),
                (base + b.0 as u32, b.1 as u32),
            ],
        })
    }

    /// The oldest referenced segment's transmission is complete.
    pub fn done(&mut self) {
        if let Store::Lent(r) = &mut self.store {
            r.in_flight.pop_front();
        }
    }

    /// The newest referenced segment was not sent after all.
    pub fn unsent(&mut self) {
        if let Store::Lent(r) = &mut self.store {
            r.in_flight.pop_back();
        }
    }

    #[cfg(test)]
    pub fn lent_memory(&self) -> Option<(u32, &[u8])> {
        match &self.store {
            Store::Heap(_) => None,
            Store::Lent(r) => Some((r.mem.segment_offset(), r.mem.bytes())),
        }
    }

    /// Segments referenced and not yet done.
    pub fn references(&self) -> usize {
        match &self.store {
            Store::Heap(_) => 0,
            Store::Lent(r) => r.in_flight.len(),
        }
    }
}

/// The one's complement sum (as [`checksum::sum`]) of `a` then `b`: when `a`
/// has an odd length, `b`'s bytes sit at odd offsets, and its sum is taken
/// byte-swapped (RFC 1071 §2 (B)).
pub fn sum(a: &[u8], b: &[u8]) -> u16 {
    combine(checksum::sum(a), a.len(), checksum::sum(b))
}

/// The sum of `a_len` bytes summing to `sa` followed by bytes summing to `sb`.
pub fn combine(sa: u16, a_len: usize, sb: u16) -> u16 {
    let sb = if a_len % 2 == 1 { sb.swap_bytes() } else { sb };
    checksum::add(sa, sb)
}

/// A clone holds its bytes in the heap: lent memory has one owner.
impl Clone for SendBuffer {
    fn clone(&self) -> SendBuffer {
        let (a, b) = self.slices(0..self.len());
        let mut q = VecDeque::with_capacity(self.len());
        q.extend(a);
        q.extend(b);
        SendBuffer {
            store: Store::Heap(q),
        }
    }
}

impl fmt::Debug for SendBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = self.slices(0..self.len());
        f.debug_struct("SendBuffer")
            .field("len", &self.len())
            .field("lent", &self.is_lent())
            .field("references", &self.references())
            .field("sum", &sum(a, b))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(Box<[u8]>);

    impl SendMemory for Mem {
        fn segment_offset(&self) -> u32 {
            1000
        }
        fn bytes(&self) -> &[u8] {
            &self.0
        }
        fn write(&mut self, at: usize, data: &[u8]) {
            self.0[at..at + data.len()].copy_from_slice(data);
        }
    }

    fn lent(size: usize) -> SendBuffer {
        let mut b = SendBuffer::new();
        assert!(b.lend(Box::new(Mem(vec![0; size].into()))).is_ok());
        b
    }

    fn bytes(b: &SendBuffer, r: std::ops::Range<usize>) -> Vec<u8> {
        let (x, y) = b.slices(r);
        [x, y].concat()
    }

    #[test]
    fn lends_only_while_empty() {
        let mut b = SendBuffer::new();
        assert_eq!(b.push(b"abc", 10), 3);
        assert!(b.lend(Box::new(Mem(vec![0; 8].into()))).is_err());
        b.drain(3);
        assert!(b.lend(Box::new(Mem(Box::new([])))).is_err());
        assert!(b.lend(Box::new(Mem(vec![0; 8].into()))).is_ok());
        assert!(b.is_lent());
    }

    #[test]
    fn ring_wraps_at_odd_offsets_and_pieces_name_both_ends() {
        let mut b = lent(7);
        assert_eq!(b.push(b"0123456789", 100), 7);
        b.drain(5);
        assert_eq!(b.push(b"abcdef", 100), 5);
        assert_eq!(bytes(&b, 0..7), b"56abcde");
        let p = b.reference(1..6).unwrap();
        // Bytes 6, a, b at 1006.., then c, d from the start of the memory.
        assert_eq!(p.at, [(1006, 1), (1000, 4)]);
        assert_eq!(p.len(), 5);
        // The sum of pieces of odd length equals the sum of the bytes in a row.
        let (x, y) = b.slices(1..6);
        assert_eq!(sum(x, y), checksum::sum(b"6abcd"));
    }

    #[test]
    fn referenced_bytes_stay_until_done() {
        let mut b = lent(8);
        assert_eq!(b.push(b"abcdefgh", 100), 8);
        b.reference(2..6).unwrap();
        b.reference(0..2).unwrap();
        // All acknowledged, but "ab" and "cdef" are still being read.
        b.drain(8);
        assert_eq!(b.push(b"0123456789", 100), 0);
        b.done();
        // The older reference, "cdef", is done: "ab" pins from position 0 on.
        assert_eq!(b.push(b"0123456789", 100), 0);
        b.done();
        assert_eq!(b.push(b"0123456789", 100), 8);
        b.drain(4);
        b.reference(0..4).unwrap();
        b.unsent();
        assert_eq!(b.references(), 0);
        assert_eq!(b.push(b"xyz", 100), 3);
        assert_eq!(bytes(&b, 0..7), b"4567xyz");
    }

    proptest::proptest! {
        /// A segment's sum from the block sums equals the sum of its bytes,
        /// whatever the ring's size, the writes, the acknowledgments and the
        /// range (across the wrap, at odd offsets).
        #[test]
        fn sums_from_blocks_match_the_bytes(
            size in 1usize..700,
            steps in proptest::collection::vec((0usize..400, 0usize..300, 0usize..400, 0usize..400), 1..40),
        ) {
            let mut b = lent(size);
            let mut heap = SendBuffer::new();
            let mut next = 0u8;
            for (write, ack, from, n) in steps {
                let data: Vec<u8> = (0..write).map(|_| { next = next.wrapping_mul(31).wrapping_add(7); next }).collect();
                let took = b.push(&data, usize::MAX);
                proptest::prop_assert_eq!(heap.push(&data[..took], usize::MAX), took);
                let len = b.len();
                if len > 0 {
                    let from = from % len;
                    let end = from + n % (len - from + 1);
                    let want = checksum::sum(&bytes(&heap, from..end));
                    proptest::prop_assert_eq!(b.sum(from..end), want);
                    proptest::prop_assert_eq!(heap.sum(from..end), want);
                }
                let ack = ack.min(len);
                b.drain(ack);
                heap.drain(ack);
            }
        }
    }

    #[test]
    fn a_clone_holds_its_bytes_in_the_heap() {
        let mut b = lent(4);
        b.push(b"wxyz", 4);
        b.drain(1);
        b.push(b"!", 4);
        let c = b.clone();
        assert!(!c.is_lent());
        assert_eq!(bytes(&c, 0..4), b"xyz!");
        assert_eq!(format!("{b:?}").replace("true", "false"), format!("{c:?}"));
    }
}
