//! The outbox: frames a handler initiated during one invocation.

/// Frames a handler sent, back to back in one arena allocated up front, so
/// that sending allocates nothing. The multiplexer checks each against the
/// channel's transmit template before it goes out.
#[derive(Debug, Default)]
pub struct Outbox {
    bytes: Vec<u8>,
    ends: Vec<usize>,
    max_sends: usize,
    max_send_len: usize,
}

impl Outbox {
    /// Room for `max_sends` frames of up to `max_send_len` bytes each.
    pub fn new(max_sends: usize, max_send_len: usize) -> Outbox {
        Outbox {
            bytes: Vec::with_capacity(max_sends.saturating_mul(max_send_len)),
            ends: Vec::with_capacity(max_sends),
            max_sends,
            max_send_len,
        }
    }

    /// Forgets every frame (keeping the arena).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True if no frame was sent.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Frame `i`, in the order sent.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        (i < self.len()).then(|| self.frame(i))
    }

    /// The frames, in the order sent.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.frame(i))
    }

    /// Frame `i < len()`.
    fn frame(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// Appends a frame of `len` bytes that `fill` writes; nothing is kept if
    /// the outbox is full, `len` is over the limit or `fill` returns false.
    pub(crate) fn push_with(&mut self, len: usize, fill: impl FnOnce(&mut [u8]) -> bool) -> bool {
        if self.ends.len() >= self.max_sends || len > self.max_send_len {
            return false;
        }
        let start = self.bytes.len();
        self.bytes.resize(start + len, 0);
        if !fill(&mut self.bytes[start..]) {
            self.bytes.truncate(start);
            return false;
        }
        self.ends.push(start + len);
        true
    }

    /// Keeps only the first `n` frames (an aborted invocation's sends are
    /// discarded).
    pub(crate) fn truncate(&mut self, n: usize) {
        if n < self.ends.len() {
            let end = if n == 0 { 0 } else { self.ends[n - 1] };
            self.ends.truncate(n);
            self.bytes.truncate(end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_order_and_truncation() {
        let mut o = Outbox::new(2, 4);
        let cap = o.bytes.capacity();
        assert!(o.push_with(3, |b| {
            b.copy_from_slice(b"abc");
            true
        }));
        assert!(!o.push_with(5, |_| true), "over max_send_len");
        assert!(!o.push_with(1, |_| false), "fill refused");
        assert!(o.push_with(4, |b| {
            b.copy_from_slice(b"defg");
            true
        }));
        assert!(!o.push_with(1, |_| true), "full");
        assert_eq!(o.iter().collect::<Vec<_>>(), [&b"abc"[..], b"defg"]);
        assert_eq!(o.bytes.capacity(), cap, "no reallocation");
        o.truncate(1);
        assert_eq!(o.iter().collect::<Vec<_>>(), [&b"abc"[..]]);
        o.clear();
        assert!(o.is_empty() && o.get(0).is_none());
    }
}
