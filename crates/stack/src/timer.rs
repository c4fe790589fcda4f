//! A hierarchical timing wheel (Varghese and Lauck, "Hashed and Hierarchical Timing
//! Wheels", SOSP 1987, scheme 7), which Thekkath et al. cite for protocol timers:
//! nearly every segment sent or received starts or stops a timer, so insert and
//! cancel must be O(1).
//!
//! Time is cut into ticks of a configurable granularity. Level `i` has 64 slots of
//! 64^i ticks each. A timer goes to the level of the highest base-64 digit in which its
//! expiry tick differs from the current tick (the placement Linux's and tokio's wheels
//! use), so every timer at level `i` lies in the current level-`i + 1` block and a
//! lower level always expires before a higher one. When time reaches a slot of a
//! higher level, its timers cascade down to lower levels (or expire). Timers beyond
//! the top level wait in an overflow list that is re-examined only when time enters
//! a new top-level block.
//!
//! Each slot is an intrusive doubly linked list threaded through one slab, so insert
//! and cancel touch O(1) nodes and allocate nothing once the slab has grown.

use std::time::Duration;

use crate::Time;

const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
/// `levels × 6` bits of tick must fit in a `u64` with room for the overflow test.
const MAX_LEVELS: usize = 10;
const NIL: u32 = u32::MAX;

/// A handle to cancel a pending timer. Stale handles (fired or cancelled timers) are
/// recognised by a generation count, so cancelling twice is harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId {
    index: u32,
    generation: u32,
}

struct Node<T> {
    /// `None` while the node is on the free list.
    payload: Option<T>,
    deadline: Time,
    /// First tick at whose start the deadline has passed: ceil(deadline / granularity).
    tick: u64,
    /// Insertion order, to break ties between equal deadlines.
    seq: u64,
    generation: u32,
    list: u32,
    prev: u32,
    /// Next node in the slot's list, or in the free list.
    next: u32,
}

/// A hierarchical timing wheel holding payloads of type `T`.
///
/// Guarantees: [`TimerWheel::advance`]`(now)` never returns a timer whose deadline is
/// after `now`, and returns every timer whose deadline is at least one tick before
/// `now` (a timer fires at the first tick boundary at or after its deadline). A
/// deadline not after the last `now` fires on the next `advance`, whatever its time.
pub struct TimerWheel<T> {
    granularity: u64,
    levels: usize,
    /// Current tick: floor(last_now / granularity). Every timer in the wheel expires
    /// after it.
    elapsed: u64,
    last_now: Time,
    nodes: Vec<Node<T>>,
    free: u32,
    /// List heads: `levels × 64` slots, then the due list, then the overflow list.
    heads: Vec<u32>,
    /// One bit per non-empty slot, one word per level.
    occupied: Vec<u64>,
    next_seq: u64,
    len: usize,
}

impl<T> Default for TimerWheel<T> {
    /// 1 ms ticks and 4 levels: 64^4 ms ≈ 4.7 hours before the overflow list, which
    /// covers every TCP timer (RFC 6298 caps RTO at ≥ 60 s; keepalive is 2 hours).
    fn default() -> Self {
        TimerWheel::new(Duration::from_millis(1), 4)
    }
}

impl<T> TimerWheel<T> {
    /// An empty wheel at [`Time::ZERO`].
    ///
    /// # Panics
    /// If `granularity` is under a nanosecond or over `u64::MAX` ns, or `levels` is
    /// not in `1..=10`.
    pub fn new(granularity: Duration, levels: usize) -> Self {
        let granularity = u64::try_from(granularity.as_nanos()).expect("granularity too large");
        assert!(granularity > 0, "granularity must be at least 1 ns");
        assert!(
            (1..=MAX_LEVELS).contains(&levels),
            "levels must be in 1..=10"
        );
        TimerWheel {
            granularity,
            levels,
            elapsed: 0,
            last_now: Time::ZERO,
            nodes: Vec::new(),
            free: NIL,
            heads: vec![NIL; levels * SLOTS + 2],
            occupied: vec![0; levels],
            next_seq: 0,
            len: 0,
        }
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Schedules `payload` for `deadline`. O(1).
    pub fn insert(&mut self, deadline: Time, payload: T) -> TimerId {
        let tick = deadline.0.div_ceil(self.granularity);
        let seq = self.next_seq;
        self.next_seq += 1;
        let node = Node {
            payload: Some(payload),
            deadline,
            tick,
            seq,
            generation: 0,
            list: NIL,
            prev: NIL,
            next: NIL,
        };
        let index = if self.free != NIL {
            let i = self.free;
            let n = &mut self.nodes[i as usize];
            self.free = n.next;
            let generation = n.generation;
            *n = Node { generation, ..node };
            i
        } else {
            self.nodes.push(node);
            u32::try_from(self.nodes.len() - 1).expect("more than 2^32 timers")
        };
        self.len += 1;
        if deadline <= self.last_now {
            self.push(self.due_list(), index);
        } else {
            self.place(index);
        }
        TimerId {
            index,
            generation: self.nodes[index as usize].generation,
        }
    }

    /// Cancels a pending timer and returns its payload; `None` if it already fired or
    /// was cancelled. O(1).
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        let n = self.nodes.get(id.index as usize)?;
        if n.generation != id.generation || n.payload.is_none() {
            return None;
        }
        self.unlink(id.index);
        Some(self.release(id.index))
    }

    /// Moves time to `now` (earlier times are ignored: time does not go back) and
    /// returns the expired timers in deadline order, ties in insertion order.
    pub fn advance(&mut self, now: Time) -> Vec<(TimerId, T)> {
        let now = now.max(self.last_now);
        self.last_now = now;
        let now_tick = now.0 / self.granularity;
        if self.is_empty() {
            // Nothing to fire or re-place: only the current tick moves.
            self.elapsed = now_tick;
            return Vec::new();
        }
        let mut fired = self.take(self.due_list());
        while let Some((list, start)) = self.next_slot() {
            if start > now_tick {
                break;
            }
            // Taking slots in start order keeps every other timer placed correctly
            // relative to the new current tick.
            self.elapsed = start;
            for i in self.take(list) {
                if self.nodes[i as usize].tick <= now_tick {
                    fired.push(i);
                } else {
                    self.place(i);
                }
            }
        }
        self.elapsed = now_tick;
        fired.sort_unstable_by_key(|&i| {
            let n = &self.nodes[i as usize];
            (n.deadline, n.seq)
        });
        fired
            .into_iter()
            .map(|i| {
                let generation = self.nodes[i as usize].generation;
                let payload = self.release(i);
                (
                    TimerId {
                        index: i,
                        generation,
                    },
                    payload,
                )
            })
            .collect()
    }

    /// The earliest time at which [`TimerWheel::advance`] will return a timer (the
    /// earliest deadline rounded up to a tick), or `None` if no timer is pending: when
    /// an event loop should wake up next.
    #[inline]
    pub fn next_deadline(&self) -> Option<Time> {
        // The common case on a receive path: nothing pending, no slot scan.
        if self.is_empty() {
            return None;
        }
        if self.heads[self.due_list() as usize] != NIL {
            return Some(self.last_now);
        }
        // The lowest non-empty level's first slot (or, with an empty wheel, the
        // overflow list) holds the earliest timer; only its tick matters.
        let (list, _) = self.next_slot()?;
        let tick = self.min_tick(list);
        Some(Time(tick.saturating_mul(self.granularity)))
    }

    fn due_list(&self) -> u32 {
        (self.levels * SLOTS) as u32
    }

    fn overflow_list(&self) -> u32 {
        (self.levels * SLOTS + 1) as u32
    }

    /// Puts a timer expiring after the current tick on its level and slot.
    fn place(&mut self, i: u32) {
        let tick = self.nodes[i as usize].tick;
        debug_assert!(tick > self.elapsed);
        let differ = (self.elapsed ^ tick) | (SLOTS as u64 - 1);
        let level = ((63 - differ.leading_zeros()) / SLOT_BITS) as usize;
        let list = if level >= self.levels {
            self.overflow_list()
        } else {
            let slot = (tick >> (SLOT_BITS * level as u32)) as usize & (SLOTS - 1);
            self.occupied[level] |= 1 << slot;
            (level * SLOTS + slot) as u32
        };
        self.push(list, i);
    }

    /// The non-empty list that is due first, with the tick at which it is due.
    fn next_slot(&self) -> Option<(u32, u64)> {
        for (level, &occ) in self.occupied.iter().enumerate() {
            if occ == 0 {
                continue;
            }
            let shift = SLOT_BITS * level as u32;
            // Placement relative to `elapsed` puts every timer in a later slot of the
            // current block, so the first occupied slot is the next one due.
            debug_assert!(occ.trailing_zeros() as u64 > (self.elapsed >> shift) & 63);
            let slot = u64::from(occ.trailing_zeros());
            let block = (self.elapsed >> (shift + SLOT_BITS)) << (shift + SLOT_BITS);
            return Some((
                (level * SLOTS) as u32 + slot as u32,
                block | (slot << shift),
            ));
        }
        let overflow = self.overflow_list();
        if self.heads[overflow as usize] == NIL {
            return None;
        }
        // Nothing is left in the current top-level block: jump straight to the block
        // of the earliest overflowed timer.
        let top = SLOT_BITS * self.levels as u32;
        Some((overflow, (self.min_tick(overflow) >> top) << top))
    }

    fn min_tick(&self, list: u32) -> u64 {
        let mut min = u64::MAX;
        let mut i = self.heads[list as usize];
        while i != NIL {
            min = min.min(self.nodes[i as usize].tick);
            i = self.nodes[i as usize].next;
        }
        min
    }

    fn push(&mut self, list: u32, i: u32) {
        let head = self.heads[list as usize];
        let n = &mut self.nodes[i as usize];
        n.list = list;
        n.prev = NIL;
        n.next = head;
        if head != NIL {
            self.nodes[head as usize].prev = i;
        }
        self.heads[list as usize] = i;
    }

    fn unlink(&mut self, i: u32) {
        let (list, prev, next) = {
            let n = &self.nodes[i as usize];
            (n.list, n.prev, n.next)
        };
        if prev == NIL {
            self.heads[list as usize] = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        }
        self.clear_if_empty(list);
    }

    /// Empties a list, returning its nodes (still allocated, linked to nothing).
    fn take(&mut self, list: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut i = std::mem::replace(&mut self.heads[list as usize], NIL);
        while i != NIL {
            out.push(i);
            i = self.nodes[i as usize].next;
        }
        self.clear_if_empty(list);
        out
    }

    fn clear_if_empty(&mut self, list: u32) {
        let l = list as usize;
        if l < self.levels * SLOTS && self.heads[l] == NIL {
            self.occupied[l / SLOTS] &= !(1 << (l % SLOTS));
        }
    }

    /// Returns an unlinked node to the free list; bumping the generation voids its ids.
    fn release(&mut self, i: u32) -> T {
        let n = &mut self.nodes[i as usize];
        let payload = n.payload.take().expect("released a free timer node");
        n.generation = n.generation.wrapping_add(1);
        n.next = self.free;
        self.free = i;
        self.len -= 1;
        payload
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn fires_in_deadline_order_then_insertion_order() {
        let mut w = TimerWheel::default();
        let a = w.insert(Time::from_millis(5), "a");
        w.insert(Time::from_millis(3), "b");
        w.insert(Time::from_millis(5), "c");
        w.insert(Time::from_millis(70_000), "far");
        assert_eq!(w.next_deadline(), Some(Time::from_millis(3)));
        assert!(w.advance(Time::from_millis(2)).is_empty());
        let got: Vec<_> = w
            .advance(Time::from_millis(10))
            .into_iter()
            .map(|x| x.1)
            .collect();
        assert_eq!(got, ["b", "a", "c"]);
        assert_eq!(w.cancel(a), None, "a fired; its id is stale");
        assert_eq!(w.next_deadline(), Some(Time::from_millis(70_000)));
        assert_eq!(w.advance(Time::from_millis(70_000))[0].1, "far");
        assert!(w.is_empty() && w.next_deadline().is_none());
    }

    #[test]
    fn past_deadlines_fire_on_next_advance_and_rounding_is_up() {
        let mut w = TimerWheel::new(Duration::from_millis(1), 2);
        w.advance(Time::from_millis(100) + Duration::from_micros(500));
        w.insert(Time::from_millis(100) + Duration::from_micros(200), 1);
        w.insert(Time::from_millis(100) + Duration::from_micros(700), 2);
        assert_eq!(
            w.next_deadline(),
            Some(Time::from_millis(100) + Duration::from_micros(500))
        );
        // Same instant: the past one fires, the later one waits for its tick boundary.
        let got: Vec<_> = w.advance(Time::ZERO).into_iter().map(|x| x.1).collect();
        assert_eq!(got, [1]);
        assert_eq!(w.next_deadline(), Some(Time::from_millis(101)));
        assert_eq!(w.advance(Time::from_millis(101)).len(), 1);
    }

    #[test]
    fn overflow_beyond_top_level_and_huge_deadlines() {
        // One level of 64 × 1 ns: almost everything overflows.
        let mut w = TimerWheel::new(Duration::from_nanos(1), 1);
        let huge = w.insert(Time(u64::MAX - 1), 'h');
        w.insert(Time(1_000_000), 'm');
        w.insert(Time(64), 'e');
        assert_eq!(w.next_deadline(), Some(Time(64)));
        assert_eq!(w.advance(Time(999_999)).len(), 1);
        assert_eq!(w.advance(Time(1_000_000))[0].1, 'm');
        assert_eq!(w.next_deadline(), Some(Time(u64::MAX - 1)));
        assert_eq!(w.cancel(huge), Some('h'));
        assert_eq!(w.cancel(huge), None);
        assert!(w.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Cancel(usize),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..5_000).prop_map(Op::Insert),
            // Far deadlines to reach the top level and the overflow list.
            1 => (0u64..2_000_000).prop_map(Op::Insert),
            2 => any::<usize>().prop_map(Op::Cancel),
            3 => (0u64..3_000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Against a BTreeMap model: same expirations in the same order, never early,
        /// at most one tick late.
        #[test]
        fn matches_reference_model(
            gran in 1u64..20,
            levels in 1usize..4,
            ops in prop::collection::vec(op(), 1..300),
        ) {
            let mut w = TimerWheel::new(Duration::from_nanos(gran), levels);
            // (deadline, seq) -> (payload, past-due at insertion)
            let mut model: BTreeMap<(u64, u64), (u64, bool)> = BTreeMap::new();
            let mut ids = Vec::new();
            let (mut now, mut seq) = (0u64, 0u64);
            for op in ops {
                match op {
                    Op::Insert(delta) => {
                        // Deadlines both before and after now.
                        let d = (now + delta).saturating_sub(1_000);
                        let id = w.insert(Time(d), seq);
                        model.insert((d, seq), (seq, d <= now));
                        ids.push((id, d, seq));
                        seq += 1;
                    }
                    Op::Cancel(k) if !ids.is_empty() => {
                        let (id, d, s) = ids[k % ids.len()];
                        prop_assert_eq!(w.cancel(id), model.remove(&(d, s)).map(|v| v.0));
                    }
                    Op::Cancel(_) => {}
                    Op::Advance(delta) => {
                        now += delta;
                        let now_tick = now / gran;
                        let expected: Vec<u64> = model
                            .iter()
                            .filter(|(&(d, _), &(_, past))| past || d.div_ceil(gran) <= now_tick)
                            .map(|(_, &(p, _))| p)
                            .collect();
                        let got: Vec<u64> = w.advance(Time(now)).into_iter().map(|x| x.1).collect();
                        prop_assert_eq!(&got, &expected);
                        model.retain(|_, (p, _)| !got.contains(p));
                        for &(d, _) in model.keys() {
                            // Not fired: the deadline is later than one tick ago.
                            prop_assert!(d + gran > now);
                        }
                        for p in &got {
                            let d = ids.iter().find(|x| x.2 == *p).unwrap().1;
                            prop_assert!(d <= now, "fired early");
                        }
                        let next = w.next_deadline();
                        let want = model.iter().map(|(&(d, _), _)| Time(d.div_ceil(gran) * gran)).min();
                        prop_assert_eq!(next, want);
                    }
                }
                prop_assert_eq!(w.len(), model.len());
            }
        }
    }
}
