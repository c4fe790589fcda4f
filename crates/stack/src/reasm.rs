//! IPv4 reassembly on receive (RFC 791 §3.2 "An Example Reassembly Procedure",
//! RFC 815 "IP Datagram Reassembly Algorithms", RFC 5722 for overlaps).
//!
//! RFC 815 tracks the holes left in a datagram. Since RFC 5722 makes any overlap fatal,
//! the fragments held are disjoint, so this keeps the equivalent dual: a sorted list of
//! received intervals. A datagram is complete when its length is known (the MF=0
//! fragment arrived) and the intervals add up to it — then there is no hole.
//!
//! Every resource is bounded ([`ReasmConfig`]): bytes held, concurrent datagrams,
//! fragments per datagram and time. A fragment that would exceed a bound is dropped
//! (as Linux ≥ 4.17 does) rather than evicting others, so a flood cannot flush
//! datagrams already in progress; what the flood holds times out.

use std::collections::HashMap;
use std::time::Duration;

use exonet_wire::{Ipv4Addr, Ipv4Packet};

use crate::{Time, TimerId, TimerWheel};

/// The largest IPv4 datagram, header included (the total length field is 16 bits).
const MAX_DATAGRAM: usize = 65_535;

/// Limits of a [`Reassembler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasmConfig {
    /// Bytes held across all datagrams (fragment payloads plus stored headers).
    pub max_bytes: usize,
    /// Datagrams in progress at once (including ones poisoned by an overlap).
    pub max_datagrams: usize,
    /// Fragments held for one datagram; one more drops the datagram.
    pub max_fragments: usize,
    /// Time from a datagram's first fragment until it is given up.
    pub timeout: Duration,
}

impl Default for ReasmConfig {
    /// Linux's defaults for memory (`ipfrag_high_thresh` = 4 MiB) and time
    /// (`ipfrag_time` = 30 s; RFC 791 suggests 15 s as a lower bound for the timer,
    /// RFC 1122 §3.3.2 60 to 120 s); 64 fragments per datagram (a maximal datagram
    /// over Ethernet needs 45) and 1024 concurrent datagrams.
    fn default() -> Self {
        ReasmConfig {
            max_bytes: 4 << 20,
            max_datagrams: 1024,
            max_fragments: 64,
            timeout: Duration::from_secs(30),
        }
    }
}

/// Why a fragment (or, for some causes, its whole datagram) was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropCause {
    /// Overlaps a fragment already held; the whole datagram is dropped (RFC 5722 §4).
    Overlap,
    /// Belongs to a datagram already dropped, which is remembered until its timeout
    /// (RFC 5722 §4: "any subsequent fragments ... MUST be silently discarded").
    Poisoned,
    /// An exact duplicate of a fragment held (dropped alone, as RFC 5722 allows).
    Duplicate,
    /// Offset plus length beyond the largest datagram, 65535 bytes.
    TooLong,
    /// A fragment with MF set whose payload is not a multiple of 8 bytes.
    Unaligned,
    /// Conflicts with the datagram length already known from the last fragment
    /// (another last fragment ending elsewhere, or data past the end); the whole
    /// datagram is dropped.
    LengthConflict,
    /// A fragment without payload.
    Empty,
    /// Holding it would exceed [`ReasmConfig::max_bytes`].
    NoMemory,
    /// It would start a datagram beyond [`ReasmConfig::max_datagrams`].
    TooManyDatagrams,
    /// Its datagram already has [`ReasmConfig::max_fragments`] fragments; the whole
    /// datagram is dropped.
    TooManyFragments,
}

/// Counters, one per outcome. Drop counters count fragments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasmStats {
    /// Fragments received.
    pub fragments: u64,
    /// Datagrams reassembled.
    pub reassembled: u64,
    /// Incomplete datagrams given up after the timeout.
    pub timed_out: u64,
    /// [`DropCause::Overlap`].
    pub overlap: u64,
    /// [`DropCause::Poisoned`].
    pub poisoned: u64,
    /// [`DropCause::Duplicate`].
    pub duplicate: u64,
    /// [`DropCause::TooLong`].
    pub too_long: u64,
    /// [`DropCause::Unaligned`].
    pub unaligned: u64,
    /// [`DropCause::LengthConflict`].
    pub length_conflict: u64,
    /// [`DropCause::Empty`].
    pub empty: u64,
    /// [`DropCause::NoMemory`].
    pub no_memory: u64,
    /// [`DropCause::TooManyDatagrams`].
    pub too_many_datagrams: u64,
    /// [`DropCause::TooManyFragments`].
    pub too_many_fragments: u64,
}

impl ReasmStats {
    fn count(&mut self, cause: DropCause) {
        let c = match cause {
            DropCause::Overlap => &mut self.overlap,
            DropCause::Poisoned => &mut self.poisoned,
            DropCause::Duplicate => &mut self.duplicate,
            DropCause::TooLong => &mut self.too_long,
            DropCause::Unaligned => &mut self.unaligned,
            DropCause::LengthConflict => &mut self.length_conflict,
            DropCause::Empty => &mut self.empty,
            DropCause::NoMemory => &mut self.no_memory,
            DropCause::TooManyDatagrams => &mut self.too_many_datagrams,
            DropCause::TooManyFragments => &mut self.too_many_fragments,
        };
        *c += 1;
    }
}

/// RFC 791: fragments belong together when source, destination, protocol and
/// identification agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    protocol: u8,
    ident: u16,
}

#[derive(Default)]
struct Datagram {
    /// Header of the offset-0 fragment, the only one sure to carry every option.
    header: Option<Vec<u8>>,
    /// Received payload pieces, sorted by offset and disjoint.
    pieces: Vec<(usize, Vec<u8>)>,
    /// Payload length, known once the MF=0 fragment arrived.
    end: Option<usize>,
    /// Payload bytes received.
    received: usize,
    /// Bytes charged against [`ReasmConfig::max_bytes`].
    charged: usize,
    /// Dropped: later fragments are discarded until the timeout frees the key.
    poisoned: bool,
    timer: Option<TimerId>,
}

/// Reassembles IPv4 datagrams from fragments, within the bounds of a [`ReasmConfig`].
pub struct Reassembler {
    config: ReasmConfig,
    datagrams: HashMap<Key, Datagram>,
    timers: TimerWheel<Key>,
    bytes: usize,
    stats: ReasmStats,
}

impl Reassembler {
    /// An empty reassembler.
    pub fn new(config: ReasmConfig) -> Self {
        Reassembler {
            config,
            datagrams: HashMap::new(),
            // 10 ms ticks: reassembly timeouts are seconds long.
            timers: TimerWheel::new(Duration::from_millis(10), 4),
            bytes: 0,
            stats: ReasmStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> &ReasmStats {
        &self.stats
    }

    /// Bytes held now, never more than [`ReasmConfig::max_bytes`].
    pub fn bytes_held(&self) -> usize {
        self.bytes
    }

    /// Datagrams in progress (poisoned ones included).
    pub fn datagrams_held(&self) -> usize {
        self.datagrams.len()
    }

    /// When [`Reassembler::poll`] next has a datagram to time out.
    #[inline]
    pub fn next_deadline(&self) -> Option<Time> {
        self.timers.next_deadline()
    }

    /// Gives up the datagrams whose timeout has passed, freeing what they hold.
    pub fn poll(&mut self, now: Time) {
        for (_, key) in self.timers.advance(now) {
            if let Some(d) = self.datagrams.remove(&key) {
                self.bytes -= d.charged;
                if !d.poisoned {
                    self.stats.timed_out += 1;
                }
            }
        }
    }

    /// Takes one received datagram, whose header checksum the caller has verified
    /// (as [`exonet_wire::Ipv4Repr::parse`] does). Expires old datagrams first (as
    /// [`Reassembler::poll`]).
    ///
    /// Returns `Ok(Some(datagram))` when `packet` completes a datagram (or is not a
    /// fragment at all: it is then returned as is), `Ok(None)` when it is held, and
    /// the cause when it is dropped. The reassembled datagram has the first fragment's
    /// header with MF cleared, offset 0, total length and checksum recomputed.
    pub fn input(
        &mut self,
        now: Time,
        packet: &Ipv4Packet<&[u8]>,
    ) -> Result<Option<Vec<u8>>, DropCause> {
        self.poll(now);
        if !packet.is_fragment() {
            let len = usize::from(packet.total_len());
            return Ok(Some(packet.clone().into_inner()[..len].to_vec()));
        }
        self.stats.fragments += 1;
        let r = self.fragment(now, packet);
        if let Err(cause) = r {
            self.stats.count(cause);
        }
        r
    }

    fn fragment(&mut self, now: Time, p: &Ipv4Packet<&[u8]>) -> Result<Option<Vec<u8>>, DropCause> {
        let payload = p.payload();
        let offset = usize::from(p.frag_offset());
        let end = offset + payload.len();
        let last = !p.more_frags();
        // Checks on the fragment alone, before it can touch any state.
        if payload.is_empty() {
            return Err(DropCause::Empty);
        }
        if p.header_len() + end > MAX_DATAGRAM {
            return Err(DropCause::TooLong);
        }
        // RFC 791: offsets count 8-byte units, so only the last piece may be ragged.
        if !last && !payload.len().is_multiple_of(8) {
            return Err(DropCause::Unaligned);
        }
        let key = Key {
            src: p.src_addr(),
            dst: p.dst_addr(),
            protocol: p.protocol(),
            ident: p.ident(),
        };
        if !self.datagrams.contains_key(&key) {
            if self.datagrams.len() >= self.config.max_datagrams {
                return Err(DropCause::TooManyDatagrams);
            }
            let timer = self.timers.insert(now + self.config.timeout, key);
            let d = Datagram {
                timer: Some(timer),
                ..Datagram::default()
            };
            self.datagrams.insert(key, d);
        }
        let d = self.datagrams.get_mut(&key).expect("inserted above");
        if d.poisoned {
            return Err(DropCause::Poisoned);
        }
        // Where it goes among the held pieces, and whether it collides with them.
        let at = d.pieces.partition_point(|(o, _)| *o < offset);
        if let Some((o, data)) = d.pieces.get(at) {
            if *o == offset && data[..] == *payload {
                return Err(DropCause::Duplicate);
            }
        }
        let overlaps_next = d.pieces.get(at).is_some_and(|(o, _)| *o < end);
        let overlaps_prev = at > 0 && {
            let (o, data) = &d.pieces[at - 1];
            o + data.len() > offset
        };
        let conflict = match d.end {
            Some(e) => end > e || (last && end != e),
            // A last fragment ending before data already held.
            None => last && d.pieces.last().is_some_and(|(o, x)| o + x.len() > end),
        };
        let fatal = if overlaps_next || overlaps_prev {
            Some(DropCause::Overlap)
        } else if conflict {
            Some(DropCause::LengthConflict)
        } else if d.pieces.len() >= self.config.max_fragments {
            Some(DropCause::TooManyFragments)
        } else {
            None
        };
        if let Some(cause) = fatal {
            self.bytes -= d.charged;
            *d = Datagram {
                poisoned: true,
                timer: d.timer,
                ..Datagram::default()
            };
            return Err(cause);
        }
        let header = (offset == 0).then(|| p.clone().into_inner()[..p.header_len()].to_vec());
        let charge = payload.len() + header.as_ref().map_or(0, Vec::len);
        if self.bytes + charge > self.config.max_bytes {
            return Err(DropCause::NoMemory);
        }
        self.bytes += charge;
        d.charged += charge;
        d.received += payload.len();
        d.pieces.insert(at, (offset, payload.to_vec()));
        if header.is_some() {
            d.header = header;
        }
        if last {
            d.end = Some(end);
        }
        match (&d.header, d.end) {
            (Some(_), Some(e)) if d.received == e => {}
            _ => return Ok(None),
        }
        let d = self.datagrams.remove(&key).expect("present");
        self.bytes -= d.charged;
        if let Some(t) = d.timer {
            self.timers.cancel(t);
        }
        let header = d.header.expect("checked above");
        let total = header.len() + d.received;
        if total > MAX_DATAGRAM {
            // Only possible when the first fragment has a longer header than the
            // one that set the length.
            return Err(DropCause::TooLong);
        }
        let mut out = header;
        out.reserve(d.received);
        for (_, data) in d.pieces {
            out.extend_from_slice(&data);
        }
        let mut v = Ipv4Packet::new_unchecked(&mut out[..]);
        let df = v.dont_frag();
        v.set_total_len(total as u16);
        v.set_frag(df, false, 0);
        v.fill_checksum();
        self.stats.reassembled += 1;
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exonet_wire::ipv4::protocol;
    use exonet_wire::rng::SplitMix64;
    use exonet_wire::Ipv4Repr;
    use proptest::prelude::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    /// A datagram of `len` payload bytes (a pattern of their offsets), or a fragment of
    /// one: the bytes at `offset`.
    fn frag(ident: u16, offset: usize, len: usize, more: bool) -> Vec<u8> {
        let repr = Ipv4Repr {
            ident,
            dont_frag: false,
            more_frags: more,
            frag_offset: offset as u16,
            ..Ipv4Repr::new(A, B, protocol::UDP, len)
        };
        let mut buf = vec![0; repr.total_len()];
        repr.emit(&mut buf).unwrap();
        for (i, b) in buf[20..].iter_mut().enumerate() {
            *b = (offset + i) as u8;
        }
        buf
    }

    fn feed(r: &mut Reassembler, now: Time, f: &[u8]) -> Result<Option<Vec<u8>>, DropCause> {
        r.input(now, &Ipv4Packet::new_checked(f).unwrap())
    }

    #[test]
    fn reassembles_out_of_order_and_passes_whole_datagrams() {
        let mut r = Reassembler::new(ReasmConfig::default());
        let t = Time::ZERO;
        assert_eq!(feed(&mut r, t, &frag(1, 16, 5, false)), Ok(None));
        assert_eq!(
            feed(&mut r, t, &frag(1, 16, 5, false)),
            Err(DropCause::Duplicate)
        );
        assert_eq!(r.bytes_held(), 5);
        assert_eq!(
            feed(&mut r, t, &frag(1, 0, 16, true)),
            Ok(Some(frag(1, 0, 21, false)))
        );
        assert_eq!((r.bytes_held(), r.datagrams_held()), (0, 0));
        let whole = frag(2, 0, 21, false);
        assert_eq!(feed(&mut r, t, &whole), Ok(Some(whole.clone())));
        assert_eq!(
            (
                r.stats().fragments,
                r.stats().reassembled,
                r.stats().duplicate
            ),
            (3, 1, 1)
        );
    }

    #[test]
    fn malformed_fragments_are_dropped_by_cause() {
        let mut r = Reassembler::new(ReasmConfig {
            max_fragments: 3,
            max_datagrams: 4,
            ..ReasmConfig::default()
        });
        let t = Time::ZERO;
        assert_eq!(feed(&mut r, t, &frag(1, 8, 0, true)), Err(DropCause::Empty));
        assert_eq!(
            feed(&mut r, t, &frag(1, 8, 7, true)),
            Err(DropCause::Unaligned)
        );
        assert_eq!(
            feed(&mut r, t, &frag(1, 65_512, 8, false)),
            Err(DropCause::TooLong)
        );
        assert_eq!(r.datagrams_held(), 0, "rejected before any state is made");
        // Two last fragments ending at different places.
        assert_eq!(feed(&mut r, t, &frag(2, 8, 8, false)), Ok(None));
        assert_eq!(
            feed(&mut r, t, &frag(2, 16, 8, false)),
            Err(DropCause::LengthConflict)
        );
        assert_eq!(
            feed(&mut r, t, &frag(2, 0, 8, true)),
            Err(DropCause::Poisoned)
        );
        // Data past a known end; a last fragment ending before held data.
        assert_eq!(feed(&mut r, t, &frag(3, 8, 8, false)), Ok(None));
        assert_eq!(
            feed(&mut r, t, &frag(3, 24, 8, true)),
            Err(DropCause::LengthConflict)
        );
        assert_eq!(feed(&mut r, t, &frag(4, 24, 8, true)), Ok(None));
        assert_eq!(
            feed(&mut r, t, &frag(4, 8, 8, false)),
            Err(DropCause::LengthConflict)
        );
        assert_eq!(feed(&mut r, t, &frag(5, 0, 8, true)), Ok(None));
        assert_eq!(
            feed(&mut r, t, &frag(6, 0, 8, true)),
            Err(DropCause::TooManyDatagrams)
        );
        for (i, o) in [8, 16].into_iter().enumerate() {
            assert_eq!(feed(&mut r, t, &frag(5, o, 8, true)), Ok(None), "{i}");
        }
        assert_eq!(
            feed(&mut r, t, &frag(5, 24, 8, false)),
            Err(DropCause::TooManyFragments)
        );
        assert_eq!(r.bytes_held(), 0);
        let s = r.stats();
        assert_eq!(
            (
                s.empty,
                s.unaligned,
                s.too_long,
                s.length_conflict,
                s.poisoned
            ),
            (1, 1, 1, 3, 1)
        );
        assert_eq!((s.too_many_datagrams, s.too_many_fragments), (1, 1));
    }

    #[test]
    fn overlap_poisons_until_timeout_then_the_key_is_free() {
        let cfg = ReasmConfig::default();
        let mut r = Reassembler::new(cfg);
        let t = Time::from_millis(1000);
        assert_eq!(feed(&mut r, t, &frag(7, 0, 16, true)), Ok(None));
        // Same start, different length: not a duplicate.
        assert_eq!(
            feed(&mut r, t, &frag(7, 0, 24, true)),
            Err(DropCause::Overlap)
        );
        assert_eq!(r.bytes_held(), 0, "the whole datagram is freed");
        assert_eq!(
            feed(&mut r, t, &frag(7, 16, 4, false)),
            Err(DropCause::Poisoned)
        );
        assert_eq!(r.next_deadline(), Some(t + cfg.timeout));
        r.poll(t + cfg.timeout);
        assert_eq!(r.datagrams_held(), 0);
        assert_eq!(
            r.stats().timed_out,
            0,
            "a poisoned datagram is not counted twice"
        );
        let t = t + cfg.timeout;
        assert_eq!(feed(&mut r, t, &frag(7, 0, 16, true)), Ok(None));
        assert_eq!(
            feed(&mut r, t, &frag(7, 8, 16, false)),
            Err(DropCause::Overlap)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Random cuts (multiples of 8) of a random datagram, in random order with
        /// exact duplicates, reassemble to exactly the datagram.
        #[test]
        fn random_fragments_in_random_order(len in 1usize..20_000, seed: u64) {
            let mut rng = SplitMix64::new(seed);
            let mut cuts = vec![0, len];
            for _ in 0..rng.below(40) {
                cuts.push((rng.below(len as u64) as usize) & !7);
            }
            cuts.sort_unstable();
            cuts.dedup();
            let mut frags: Vec<Vec<u8>> = cuts
                .windows(2)
                .map(|w| frag(9, w[0], w[1] - w[0], w[1] != len))
                .collect();
            for _ in 0..rng.below(4) {
                let dup = frags[rng.below(frags.len() as u64) as usize].clone();
                frags.push(dup);
            }
            rng.shuffle(&mut frags);
            let mut r = Reassembler::new(ReasmConfig::default());
            let want = frag(9, 0, len, false);
            let mut done = 0;
            for f in &frags {
                match feed(&mut r, Time::ZERO, f) {
                    Ok(Some(d)) => {
                        prop_assert_eq!(&d, &want);
                        done += 1;
                    }
                    Ok(None) => {}
                    Err(e) => prop_assert_eq!(e, DropCause::Duplicate),
                }
            }
            // More than once only when duplicates arrive after completion (they
            // start the datagram anew, or are whole datagrams themselves).
            prop_assert!(done >= 1);
        }

        /// A flood of random fragments with random ids never holds more than the
        /// bounds, and the timeout frees everything.
        #[test]
        fn flood_stays_within_bounds(seed: u64) {
            let cfg = ReasmConfig {
                max_bytes: 20_000,
                max_datagrams: 16,
                ..ReasmConfig::default()
            };
            let mut r = Reassembler::new(cfg);
            let mut rng = SplitMix64::new(seed);
            let mut now = Time::ZERO;
            for _ in 0..2_000 {
                now = now + Duration::from_millis(rng.below(20));
                let id = rng.below(64) as u16;
                let offset = (rng.below(8189) as usize) * 8;
                let more = rng.chance(0.8);
                let len = (rng.below(1480) as usize).min(65_515 - offset);
                let _ = feed(&mut r, now, &frag(id, offset, len, more));
                prop_assert!(r.bytes_held() <= cfg.max_bytes);
                prop_assert!(r.datagrams_held() <= cfg.max_datagrams);
            }
            r.poll(now + cfg.timeout);
            prop_assert_eq!((r.bytes_held(), r.datagrams_held()), (0, 0));
            prop_assert!(r.next_deadline().is_none());
        }
    }
}
