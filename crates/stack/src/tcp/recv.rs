//! The receive buffer: bytes in order waiting for the application, and segments that
//! arrived ahead of a hole (RFC 9293 §3.10.7.4, "seventh": segments beyond RCV.NXT
//! are held for later processing).

use std::collections::{BTreeMap, VecDeque};

/// Positions are stream offsets counted in a `u64` from the first data byte, so the
/// out-of-order map never meets the 2^32 wrap of sequence numbers.
#[derive(Debug, Clone)]
pub(crate) struct RecvBuffer {
    ready: VecDeque<u8>,
    /// Disjoint byte runs after `next`, keyed by their first offset.
    ahead: BTreeMap<u64, Vec<u8>>,
    /// Offset of the first byte not yet received in order.
    next: u64,
    capacity: usize,
}

impl RecvBuffer {
    pub(crate) fn new(capacity: usize) -> Self {
        RecvBuffer {
            // Grown on demand: a large window need not cost its memory while idle.
            ready: VecDeque::new(),
            ahead: BTreeMap::new(),
            next: 0,
            capacity,
        }
    }

    /// Bytes that may arrive after `next`: everything held ahead lies inside this
    /// window, so the buffer never holds more than its capacity.
    pub(crate) fn window(&self) -> usize {
        self.capacity - self.ready.len()
    }

    /// The capacity.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Raises the capacity (never lowers it: the window offered must not shrink).
    pub(crate) fn grow(&mut self, capacity: usize) {
        self.capacity = self.capacity.max(capacity);
    }

    /// Bytes ready to read.
    pub(crate) fn len(&self) -> usize {
        self.ready.len()
    }

    /// Whether bytes are held beyond a hole.
    pub(crate) fn has_gap(&self) -> bool {
        !self.ahead.is_empty()
    }

    /// The stream offset of the next byte expected in order (RCV.NXT's).
    pub(crate) fn offset(&self) -> u64 {
        self.next
    }

    /// The contiguous bytes held beyond a hole around offset `at`, as [start, end)
    /// (a SACK block, RFC 2018 §3); `None` if `at` is not held there.
    pub(crate) fn run_at(&self, at: u64) -> Option<(u64, u64)> {
        let end_of = |(&s, run): (&u64, &Vec<u8>)| s + run.len() as u64;
        let (mut start, mut end) = self
            .ahead
            .range(..=at)
            .next_back()
            .map(|r| (*r.0, end_of(r)))
            .filter(|&(_, e)| e > at)?;
        // Retransmissions with other boundaries leave adjacent runs: join them.
        while let Some(r) = self.ahead.range(..start).next_back() {
            if end_of(r) != start {
                break;
            }
            start = *r.0;
        }
        while let Some(run) = self.ahead.get(&end) {
            end += run.len() as u64;
        }
        Some((start, end))
    }

    /// Stores `data` that starts `offset` bytes after the next expected byte, cut to
    /// the window, and returns how many bytes became readable in order.
    pub(crate) fn write(&mut self, offset: usize, data: &[u8]) -> usize {
        let fit = self.window().saturating_sub(offset).min(data.len());
        let data = &data[..fit];
        if data.is_empty() {
            return 0;
        }
        if offset > 0 {
            self.insert_ahead(self.next + offset as u64, data);
            return 0;
        }
        let before = self.next;
        self.ready.extend(data);
        self.next += data.len() as u64;
        // Runs that now start at or before `next` join the readable bytes.
        while let Some(entry) = self.ahead.first_entry() {
            let start = *entry.key();
            if start > self.next {
                break;
            }
            let run = entry.remove();
            let skip = (self.next - start) as usize;
            if skip < run.len() {
                self.ready.extend(&run[skip..]);
                self.next += (run.len() - skip) as u64;
            }
        }
        (self.next - before) as usize
    }

    /// Inserts only the parts of `[start, start + len)` not already held, so runs stay
    /// disjoint and retransmissions with different boundaries cost no memory.
    fn insert_ahead(&mut self, start: u64, data: &[u8]) {
        let end = start + data.len() as u64;
        let held: Vec<(u64, u64)> = self
            .ahead
            .range(..end)
            .map(|(&s, run)| (s, s + run.len() as u64))
            .filter(|&(_, e)| e > start)
            .collect();
        let mut at = start;
        for (s, e) in held {
            if at < s {
                self.ahead.insert(
                    at,
                    data[(at - start) as usize..(s - start) as usize].to_vec(),
                );
            }
            at = at.max(e);
        }
        if at < end {
            self.ahead
                .insert(at, data[(at - start) as usize..].to_vec());
        }
    }

    /// Moves readable bytes into `buf`.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> usize {
        let n = self.peek(buf);
        self.ready.drain(..n);
        n
    }

    /// Copies readable bytes into `buf`, leaving them readable.
    pub(crate) fn peek(&self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.ready.len());
        let (a, b) = self.ready.as_slices();
        let from_a = n.min(a.len());
        buf[..from_a].copy_from_slice(&a[..from_a]);
        // The second half only when the bytes wrap the ring: no call to
        // copy nothing.
        if n > from_a {
            buf[from_a..n].copy_from_slice(&b[..n - from_a]);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn holes_fill_and_window_bounds() {
        let mut r = RecvBuffer::new(10);
        assert_eq!(r.write(4, b"efgh"), 0);
        assert!(r.has_gap());
        // Overlaps keep the bytes first stored; beyond the window is cut off.
        assert_eq!(r.write(6, b"XXxyz"), 0);
        // "efgh" and "yz" (the bytes beyond "gh") are one block.
        assert_eq!(r.run_at(7), Some((4, 10)));
        assert_eq!(r.run_at(9), Some((4, 10)));
        assert_eq!(r.run_at(3), None);
        assert_eq!(r.run_at(10), None);
        assert_eq!(r.write(0, b"ab"), 2);
        assert_eq!(r.write(0, b"cd"), 8);
        assert!(!r.has_gap());
        assert_eq!(r.window(), 0);
        assert_eq!(r.write(0, b"12"), 0);
        let mut out = [0; 16];
        assert_eq!(r.read(&mut out), 10);
        assert_eq!(&out[..10], b"abcdefghxy");
        assert_eq!(r.window(), 10);
        assert_eq!(r.len(), 0);
    }

    proptest! {
        /// Any cover of the stream by runs, in any order and with repeats, reads back
        /// as the stream.
        #[test]
        fn any_order_reassembles(
            runs in prop::collection::vec((0usize..300, 1usize..40), 1..60),
            seed: u64,
        ) {
            let stream: Vec<u8> = (0..340).map(|i| (i * 7 + 3) as u8).collect();
            let mut pieces: Vec<(usize, usize)> = runs;
            // Cover every byte once in addition to the random runs.
            pieces.extend((0..340).step_by(17).map(|s| (s, 17)));
            exonet_wire::rng::SplitMix64::new(seed).shuffle(&mut pieces);
            let mut r = RecvBuffer::new(400);
            let mut delivered = 0usize;
            for (s, len) in pieces {
                let e = (s + len).min(340);
                if e <= delivered {
                    continue;
                }
                let s2 = s.max(delivered);
                delivered += r.write(s2 - delivered, &stream[s2..e]);
            }
            prop_assert_eq!(delivered, 340);
            let mut out = vec![0; 400];
            prop_assert_eq!(r.read(&mut out), 340);
            prop_assert_eq!(&out[..340], &stream[..]);
            prop_assert!(!r.has_gap());
        }
    }
}
