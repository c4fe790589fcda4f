//! The fragment pool (Expert §4.1.1): steers IPv4 fragments to the channel
//! their head fragment went to, without reassembling them.
//!
//! Only the head fragment (offset 0, MF set) carries the transport header,
//! so only it can be classified. A head a channel accepted opens an
//! association keyed on (source, destination, protocol, identification)
//! that sends the datagram's body fragments to that channel; a head no
//! channel accepted opens one that drops them at once, except the head of
//! an ICMP echo request to the host, whose datagram goes to the host's
//! reassembly ([`crate::host`]) to be answered. A body fragment is
//! never classified by the filters: it goes where its head went, or
//! nowhere. So an application receives another's fragments only if a
//! sender reuses an identification towards both within the association's
//! life, which no classifier could tell apart either.
//!
//! Body fragments that arrive before their head wait here, bounded in
//! bytes, in fragments per datagram, in datagrams and in time, and are
//! delivered right after the head, in order of arrival. Reordering,
//! overlaps and duplicates are the application library's job: a bug in
//! reassembly harms only the application whose library has it.
//!
//! An association closes when every byte of its datagram went through (the
//! last fragment gave the length, and the ranges seen cover it), else at its
//! deadline. Closing early keeps short the window in which a reused
//! identification would steer a new datagram's early body fragments to the
//! old one's channel, and frees the slot.
//!
//! Only untagged Ethernet/IPv4 frames are looked at; anything else is
//! classified whole.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use exonet_wire::ipv4::{protocol, MIN_HEADER_LEN};
use exonet_wire::Ipv4Packet;

use crate::{ChannelId, MuxConfig};

const ETH_HEADER_LEN: usize = 14;
/// Bytes a waiting fragment is charged beyond its own, for its bookkeeping,
/// so that tiny fragments cannot stretch the memory bound.
const HOLD_COST: usize = 64;
/// Most disjoint byte ranges an association tracks; past that it lives
/// until its deadline.
const MAX_RANGES: usize = 16;
/// Most data bytes an IPv4 datagram can carry.
const MAX_DATA: u32 = 65_535 - MIN_HEADER_LEN as u32;
/// Longest timeout honoured: far beyond any use, and safe to add to the clock.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Where a datagram's fragments go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum To {
    Channel(ChannelId),
    /// The host's reassembly of echo requests.
    Host,
    /// Dropped.
    Nobody,
}

/// What a frame is, as far as the pool is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FragKind {
    /// Not an IPv4 fragment (or not untagged IPv4): classified as is.
    Whole,
    /// Offset 0, MF set: carries the transport header.
    Head,
    /// Offset above 0.
    Body,
}

/// Looks at the flags and offset of an untagged IPv4 frame, and nothing
/// more: the whole cost for frames that are not fragments.
pub fn kind(frame: &[u8]) -> FragKind {
    match frame.get(12..22) {
        Some(h) if h[..2] == [0x08, 0x00] && (h[8] & 0x3f != 0 || h[9] != 0) => {
            if h[8] & 0x1f == 0 && h[9] == 0 {
                FragKind::Head
            } else {
                FragKind::Body
            }
        }
        _ => FragKind::Whole,
    }
}

/// What the pool did. Every fragment is counted once: in `heads`,
/// `unmatched_heads`, `host_heads`, `bad`, `bodies_forwarded` or one of the
/// drops — or
/// is still waiting (`held_frames`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FragStats {
    /// Head fragments a channel accepted; each opened an association.
    pub heads: u64,
    /// Head fragments no channel accepted; each opened an association that
    /// drops the datagram's body fragments (room permitting).
    pub unmatched_heads: u64,
    /// Head fragments of echo requests to the host; each opened an
    /// association that sends the datagram's body fragments to the host.
    pub host_heads: u64,
    /// Body fragments delivered to their head's channel or to the host, at
    /// once or after waiting.
    pub bodies_forwarded: u64,
    /// Body fragments that had to wait for their head.
    pub held: u64,
    /// Waiting body fragments dropped: their head did not come in time.
    pub orphans_timed_out: u64,
    /// Body fragments dropped for want of space: the waiting bytes or the
    /// datagrams were at their bound, or their datagram was evicted to make
    /// room for a head.
    pub dropped_no_memory: u64,
    /// Body fragments dropped: their datagram had the most fragments
    /// allowed waiting already.
    pub dropped_too_many: u64,
    /// Body fragments dropped: their head matched no channel (nor was for
    /// the host).
    pub dropped_unmatched_head: u64,
    /// Fragments with an impossible header (not IPv4, lengths, checksum,
    /// empty, past 64 KiB, not a multiple of 8 bytes but the last, or the
    /// TCP offset of 8 bytes of RFC 1858). Bodies are dropped; heads open no
    /// association and are classified as whole frames.
    pub bad: u64,
    /// Associations closed because every byte of their datagram went
    /// through.
    pub completed: u64,
    /// Datagrams (associations or fragments waiting) evicted to make room
    /// for a head's association.
    pub evicted: u64,
    /// Now: bytes charged for waiting fragments (each frame plus a fixed
    /// bookkeeping cost).
    pub held_bytes: u64,
    /// Now: fragments waiting for their head.
    pub held_frames: u64,
    /// Now: datagrams the pool knows (associations and datagrams waiting
    /// for their head).
    pub datagrams: u64,
}

impl FragStats {
    /// Every counter with its name, for `exonet stats`.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("heads", self.heads),
            ("unmatched_heads", self.unmatched_heads),
            ("host_heads", self.host_heads),
            ("bodies_forwarded", self.bodies_forwarded),
            ("held", self.held),
            ("orphans_timed_out", self.orphans_timed_out),
            ("dropped_no_memory", self.dropped_no_memory),
            ("dropped_too_many", self.dropped_too_many),
            ("dropped_unmatched_head", self.dropped_unmatched_head),
            ("bad", self.bad),
            ("completed", self.completed),
            ("evicted", self.evicted),
            ("held_bytes", self.held_bytes),
            ("held_frames", self.held_frames),
            ("datagrams", self.datagrams),
        ]
    }
}

/// What identifies the fragments of one datagram (RFC 791).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    ident: u16,
}

/// The data bytes a fragment carries, `start..end`.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u32,
    end: u32,
    last: bool,
}

/// The key and span of a fragment with a possible header.
fn parse(frame: &[u8]) -> Option<(Key, Span)> {
    let ip = Ipv4Packet::new_checked(frame.get(ETH_HEADER_LEN..)?).ok()?;
    // A corrupt header could name another datagram.
    if !ip.verify_checksum() {
        return None;
    }
    let start = u32::from(ip.frag_offset());
    let len = u32::from(ip.total_len()) - ip.header_len() as u32;
    let last = !ip.more_frags();
    let end = start + len;
    // RFC 1858 §3.2: a TCP fragment at offset 8 can only serve to rewrite
    // the header the filter saw.
    let tcp_overlay = ip.protocol() == protocol::TCP && start == 8;
    if len == 0 || end > MAX_DATA || (!last && !len.is_multiple_of(8)) || tcp_overlay {
        return None;
    }
    let key = Key {
        src: ip.src_addr(),
        dst: ip.dst_addr(),
        proto: ip.protocol(),
        ident: ip.ident(),
    };
    Some((key, Span { start, end, last }))
}

/// The byte ranges of a datagram that went through, merged, and its length
/// once the last fragment gave it.
#[derive(Debug, Default)]
struct Cover {
    ranges: Vec<(u32, u32)>,
    len: Option<u32>,
    /// Too scattered to follow: the association waits for its deadline.
    lost: bool,
}

impl Cover {
    fn add(&mut self, s: Span) {
        if s.last && self.len.is_none() {
            self.len = Some(s.end);
        }
        if self.lost {
            return;
        }
        self.ranges.push((s.start, s.end));
        self.ranges.sort_unstable();
        // Fold each range into the previous one it overlaps or touches.
        self.ranges.dedup_by(|next, prev| {
            let joins = next.0 <= prev.1;
            if joins {
                prev.1 = prev.1.max(next.1);
            }
            joins
        });
        if self.ranges.len() > MAX_RANGES {
            self.lost = true;
            self.ranges = Vec::new();
        }
    }

    /// Every byte up to the datagram's length went through.
    fn complete(&self) -> bool {
        matches!((self.ranges.first(), self.len), (Some(&(0, end)), Some(len)) if end >= len)
    }
}

enum State {
    /// Body fragments waiting for their head, in order of arrival.
    Waiting(Vec<(Span, Box<[u8]>)>),
    /// The head came: body fragments go `to` there.
    Open { to: To, cover: Cover },
}

struct Entry {
    deadline: Instant,
    seq: u64,
    state: State,
}

/// The fragment pool. The caller classifies heads and delivers; the pool
/// remembers where each datagram goes and keeps early body fragments.
pub struct FragPool {
    timeout: Duration,
    max_bytes: usize,
    max_per_datagram: usize,
    max_datagrams: usize,
    entries: HashMap<Key, Entry>,
    /// Entries by (deadline, insertion), for expiry and eviction of the
    /// oldest without a scan.
    by_deadline: BTreeMap<(Instant, u64), Key>,
    seq: u64,
    held_bytes: usize,
    held_frames: usize,
    stats: FragStats,
}

impl FragPool {
    /// A pool with the bounds of `config` (`frag_timeout`, `frag_memory`,
    /// `frag_per_datagram`, `frag_datagrams`).
    pub fn new(config: &MuxConfig) -> FragPool {
        FragPool {
            timeout: config.frag_timeout.min(MAX_TIMEOUT),
            max_bytes: config.frag_memory,
            max_per_datagram: config.frag_per_datagram,
            // A head must always find room for its association.
            max_datagrams: config.frag_datagrams.max(1),
            entries: HashMap::new(),
            by_deadline: BTreeMap::new(),
            seq: 0,
            held_bytes: 0,
            held_frames: 0,
            stats: FragStats::default(),
        }
    }

    /// The counters, with the present occupancy.
    pub fn stats(&self) -> FragStats {
        FragStats {
            held_bytes: self.held_bytes as u64,
            held_frames: self.held_frames as u64,
            datagrams: self.entries.len() as u64,
            ..self.stats
        }
    }

    /// Bytes charged for waiting fragments now (at most `frag_memory`).
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// A head fragment, going `to` a channel, the host or nowhere. Opens
    /// its datagram's association, replacing any older one (the sender
    /// reused the identification), and returns the body fragments that
    /// waited for it, to go the same way after it in this order; if the
    /// head goes nowhere they are dropped instead. A head with an
    /// impossible header opens nothing.
    pub fn head(&mut self, frame: &[u8], to: To, now: Instant) -> Vec<Box<[u8]>> {
        let Some((key, span)) = parse(frame) else {
            self.stats.bad += 1;
            return Vec::new();
        };
        let waited = match self.take(key) {
            Some(State::Waiting(w)) => w,
            _ => Vec::new(),
        };
        let n = waited.len() as u64;
        match to {
            To::Channel(_) => self.stats.heads += 1,
            To::Host => self.stats.host_heads += 1,
            To::Nobody => self.stats.unmatched_heads += 1,
        }
        match to {
            To::Nobody => self.stats.dropped_unmatched_head += n,
            _ => self.stats.bodies_forwarded += n,
        }
        let mut cover = Cover::default();
        cover.add(span);
        for &(s, _) in &waited {
            cover.add(s);
        }
        if cover.complete() {
            self.stats.completed += 1;
        } else if matches!(to, To::Channel(_)) || self.entries.len() < self.max_datagrams {
            // A refused head evicts nothing: its association only saves
            // holding body fragments that would be dropped anyway. Nor does
            // a ping's: anyone may send those, and a flood of them must not
            // cost applications their datagrams.
            if self.entries.len() >= self.max_datagrams {
                self.evict_oldest();
            }
            self.insert(key, State::Open { to, cover }, now);
        }
        match to {
            To::Nobody => Vec::new(),
            _ => waited.into_iter().map(|(_, f)| f).collect(),
        }
    }

    /// A body fragment: where it goes now, or [`To::Nobody`] if it waits
    /// for its head or was dropped (counted either way).
    pub fn body(&mut self, frame: &[u8], now: Instant) -> To {
        let Some((key, span)) = parse(frame) else {
            self.stats.bad += 1;
            return To::Nobody;
        };
        let cost = frame.len() + HOLD_COST;
        let fits = self.held_bytes + cost <= self.max_bytes;
        let room = self.entries.len() < self.max_datagrams;
        match self.entries.get_mut(&key).map(|e| &mut e.state) {
            Some(State::Open { to, cover }) => {
                let to = *to;
                cover.add(span);
                let done = cover.complete();
                match to {
                    To::Nobody => self.stats.dropped_unmatched_head += 1,
                    _ => self.stats.bodies_forwarded += 1,
                }
                if done {
                    self.take(key);
                    self.stats.completed += 1;
                }
                return to;
            }
            Some(State::Waiting(w)) if w.len() >= self.max_per_datagram => {
                self.stats.dropped_too_many += 1;
                return To::Nobody;
            }
            Some(State::Waiting(w)) if fits => w.push((span, frame.into())),
            None if fits && room && self.max_per_datagram > 0 => {
                self.insert(key, State::Waiting(vec![(span, frame.into())]), now);
            }
            None if self.max_per_datagram == 0 => {
                self.stats.dropped_too_many += 1;
                return To::Nobody;
            }
            _ => {
                self.stats.dropped_no_memory += 1;
                return To::Nobody;
            }
        }
        self.held_bytes += cost;
        self.held_frames += 1;
        self.stats.held += 1;
        To::Nobody
    }

    /// Drops what is past its deadline: associations, and fragments whose
    /// head did not come (orphans).
    /// Whether the pool holds nothing (no association, nothing waiting).
    pub fn is_empty(&self) -> bool {
        self.by_deadline.is_empty()
    }

    pub fn expire(&mut self, now: Instant) {
        while let Some(first) = self.by_deadline.first_entry() {
            if first.key().0 > now {
                break;
            }
            let key = first.remove();
            if let Some(State::Waiting(w)) = self.take(key) {
                self.stats.orphans_timed_out += w.len() as u64;
            }
        }
    }

    /// A channel went away: its associations drop what comes next.
    pub fn forget_channel(&mut self, ch: ChannelId) {
        for e in self.entries.values_mut() {
            if let State::Open { to, .. } = &mut e.state {
                if *to == To::Channel(ch) {
                    *to = To::Nobody;
                }
            }
        }
    }

    fn insert(&mut self, key: Key, state: State, now: Instant) {
        self.seq += 1;
        let deadline = now + self.timeout;
        self.by_deadline.insert((deadline, self.seq), key);
        let e = Entry {
            deadline,
            seq: self.seq,
            state,
        };
        self.entries.insert(key, e);
    }

    /// Forgets a datagram; what waited is no longer charged.
    fn take(&mut self, key: Key) -> Option<State> {
        let e = self.entries.remove(&key)?;
        self.by_deadline.remove(&(e.deadline, e.seq));
        if let State::Waiting(w) = &e.state {
            self.held_frames -= w.len();
            self.held_bytes -= w.iter().map(|(_, f)| f.len() + HOLD_COST).sum::<usize>();
        }
        Some(e.state)
    }

    fn evict_oldest(&mut self) {
        let Some((_, key)) = self.by_deadline.pop_first() else {
            return;
        };
        self.stats.evicted += 1;
        if let Some(State::Waiting(w)) = self.take(key) {
            self.stats.dropped_no_memory += w.len() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: u32, end: u32, last: bool) -> Span {
        Span { start, end, last }
    }

    #[test]
    fn cover_merges_overlaps_and_completes_only_when_whole() {
        let mut c = Cover::default();
        c.add(span(16, 24, false));
        c.add(span(0, 8, false));
        assert!(!c.complete());
        c.add(span(32, 40, true));
        assert_eq!(c.ranges, vec![(0, 8), (16, 24), (32, 40)]);
        assert!(!c.complete());
        // Overlapping and touching ranges fold together.
        c.add(span(4, 20, false));
        c.add(span(24, 32, false));
        assert_eq!(c.ranges, vec![(0, 40)]);
        assert!(c.complete());
    }

    #[test]
    fn scattered_cover_gives_up_rather_than_grow() {
        let mut c = Cover::default();
        for i in 0..=MAX_RANGES as u32 {
            c.add(span(16 * i + 8, 16 * i + 16, false));
        }
        assert!(c.lost && c.ranges.is_empty());
        c.add(span(0, 8, false));
        assert!(!c.complete());
    }

    #[test]
    fn kind_reads_flags_and_offset_only() {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(kind(&f), FragKind::Whole);
        f[20] = 0x40; // DF alone
        assert_eq!(kind(&f), FragKind::Whole);
        f[20] = 0x20; // MF, offset 0
        assert_eq!(kind(&f), FragKind::Head);
        f[21] = 1;
        assert_eq!(kind(&f), FragKind::Body);
        f[20] = 0x00; // last fragment
        assert_eq!(kind(&f), FragKind::Body);
        f[12] = 0x86;
        assert_eq!(kind(&f), FragKind::Whole);
        assert_eq!(kind(&f[..21]), FragKind::Whole);
    }
}
