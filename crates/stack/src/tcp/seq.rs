//! Sequence numbers and their arithmetic modulo 2^32 (RFC 9293 §3.4).

use std::cmp::Ordering;
use std::ops::{Add, Sub};

/// A TCP sequence number. Comparison is modulo 2^32 ("serial number arithmetic",
/// RFC 1982): `a < b` when `b` lies less than 2^31 ahead of `a`. The order is not
/// transitive over spans of 2^31 or more, so it only means something for numbers
/// within one window of each other, which is all RFC 9293 §3.4 compares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SeqNum(pub u32);

impl SeqNum {
    /// `self - other` as a signed distance (`other` + distance = `self`).
    pub fn diff(self, other: SeqNum) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// `self - other` as a count of bytes, 0 if `other` is ahead of `self`.
    pub fn distance_from(self, other: SeqNum) -> u32 {
        self.diff(other).max(0) as u32
    }

    /// The later of two numbers.
    pub fn max(self, other: SeqNum) -> SeqNum {
        if self < other {
            other
        } else {
            self
        }
    }

    /// `start <= self < start + len` (an empty range holds nothing).
    pub fn in_range(self, start: SeqNum, len: u32) -> bool {
        (self.diff(start) as u32) < len
    }
}

impl Add<u32> for SeqNum {
    type Output = SeqNum;

    fn add(self, n: u32) -> SeqNum {
        SeqNum(self.0.wrapping_add(n))
    }
}

impl Sub<u32> for SeqNum {
    type Output = SeqNum;

    fn sub(self, n: u32) -> SeqNum {
        SeqNum(self.0.wrapping_sub(n))
    }
}

impl PartialOrd for SeqNum {
    fn partial_cmp(&self, other: &SeqNum) -> Option<Ordering> {
        Some(self.diff(*other).cmp(&0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        let a = SeqNum(u32::MAX - 1);
        let b = a + 5;
        assert_eq!(b, SeqNum(3));
        assert!(a < b);
        assert!(b > a);
        assert_eq!(b.diff(a), 5);
        assert_eq!(a.diff(b), -5);
        assert_eq!(a.distance_from(b), 0);
        assert!(SeqNum(1).in_range(a, 5) && !b.in_range(a, 5) && !a.in_range(a, 0));
        assert_eq!(a.max(b), b);
    }

    proptest! {
        #[test]
        fn order_follows_offsets(x: u32, d in 1u32..(1 << 31)) {
            let a = SeqNum(x);
            let b = a + d;
            prop_assert!(a < b);
            prop_assert!(b > a);
            prop_assert_eq!(a.partial_cmp(&a), Some(Ordering::Equal));
            prop_assert_eq!(b.partial_cmp(&a), Some(Ordering::Greater));
            prop_assert_eq!(b.diff(a), d as i32);
            prop_assert_eq!(b - d, a);
            prop_assert_eq!(b.distance_from(a), d);
            prop_assert_eq!(a.distance_from(b), 0);
        }

        #[test]
        fn range_membership(start: u32, len: u32, off: u32) {
            let s = SeqNum(start);
            prop_assert_eq!((s + off).in_range(s, len), off < len);
        }
    }
}
