//! The neighbour cache of one endpoint. The library never speaks ARP itself: the
//! multiplexer resolves addresses for every application (and answers for the host),
//! so this cache only remembers what the multiplexer said, asks again on a backoff
//! while it does not know yet (it is asking the wire meanwhile), and holds a few
//! frames per unresolved neighbour, as RFC 1122 §2.3.2.2 asks ("SHOULD save at
//! least one (the latest) packet of every set of packets destined to the same
//! unresolved IP address").

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::time::Time;

/// Timing and bounds.
#[derive(Debug, Clone)]
pub struct ArpConfig {
    /// How long an answer is trusted before asking the multiplexer again (its own
    /// cache follows the wire; RFC 1122 §2.3.2.1 asks for timeouts on entries).
    pub reachable: Duration,
    /// First wait before asking again while the multiplexer does not know yet.
    pub first_retry: Duration,
    /// Longest wait between two asks (the backoff doubles up to it).
    pub max_retry: Duration,
    /// After this long unresolved, the neighbour is given up and its frames dropped.
    pub give_up: Duration,
    /// Frames held per unresolved neighbour (the oldest is dropped beyond it).
    pub pending_per_neighbor: usize,
    /// Unresolved neighbours held at once (a new one beyond it is refused).
    pub max_unresolved: usize,
}

impl Default for ArpConfig {
    fn default() -> Self {
        ArpConfig {
            reachable: Duration::from_secs(30),
            first_retry: Duration::from_millis(1),
            max_retry: Duration::from_millis(200),
            give_up: Duration::from_secs(3),
            pending_per_neighbor: 3,
            max_unresolved: 256,
        }
    }
}

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArpStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Questions put to the multiplexer.
    pub asks: u64,
    /// Neighbours resolved.
    pub resolved: u64,
    /// Neighbours given up after [`ArpConfig::give_up`].
    pub failed: u64,
    /// Frames dropped: displaced from a full pending queue, held for a neighbour
    /// that was given up, or refused because too many neighbours were unresolved.
    pub frames_dropped: u64,
}

#[derive(Debug)]
enum Entry<F> {
    Reachable {
        mac: [u8; 6],
        until: Time,
    },
    Incomplete {
        next_ask: Time,
        backoff: Duration,
        give_up: Time,
        pending: VecDeque<F>,
    },
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The neighbour's MAC.
    Hit([u8; 6]),
    /// Unknown or stale: ask the multiplexer now, then report with
    /// [`ArpCache::resolved`] or [`ArpCache::unknown`].
    Ask,
    /// Being resolved; an ask is not due yet.
    Wait,
}

/// The cache; `F` is a held frame as its user keeps it (with whatever it needs
/// to send it later).
#[derive(Debug)]
pub struct ArpCache<F = Vec<u8>> {
    config: ArpConfig,
    entries: HashMap<Ipv4Addr, Entry<F>>,
    /// The last neighbour found reachable, and until when: most sends go to the
    /// same peer, and this spares them the hash.
    last: Option<(Ipv4Addr, [u8; 6], Time)>,
    unresolved: usize,
    stats: ArpStats,
}

impl<F> ArpCache<F> {
    /// An empty cache.
    pub fn new(config: ArpConfig) -> Self {
        ArpCache {
            config,
            entries: HashMap::new(),
            last: None,
            unresolved: 0,
            stats: ArpStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ArpConfig {
        &self.config
    }

    /// The counters.
    pub fn stats(&self) -> &ArpStats {
        &self.stats
    }

    /// Frames held for unresolved neighbours.
    pub fn pending_frames(&self) -> usize {
        self.entries
            .values()
            .map(|e| match e {
                Entry::Incomplete { pending, .. } => pending.len(),
                Entry::Reachable { .. } => 0,
            })
            .sum()
    }

    /// Looks `ip` up at `now`.
    pub fn lookup(&mut self, ip: Ipv4Addr, now: Time) -> Lookup {
        if let Some((last, mac, until)) = self.last {
            if last == ip && until > now {
                self.stats.hits += 1;
                return Lookup::Hit(mac);
            }
        }
        match self.entries.get(&ip) {
            Some(Entry::Reachable { mac, until }) if *until > now => {
                self.stats.hits += 1;
                self.last = Some((ip, *mac, *until));
                Lookup::Hit(*mac)
            }
            Some(Entry::Incomplete { next_ask, .. }) if *next_ask > now => Lookup::Wait,
            _ => {
                self.stats.asks += 1;
                Lookup::Ask
            }
        }
    }

    /// Whether `ip` has a MAC known at `now` (no counters move).
    pub fn reachable(&self, ip: Ipv4Addr, now: Time) -> bool {
        matches!(self.entries.get(&ip), Some(Entry::Reachable { until, .. }) if *until > now)
    }

    /// The multiplexer answered `mac` for `ip`: returns the frames held for it, to
    /// send now (their Ethernet destination still to fill in).
    pub fn resolved(&mut self, ip: Ipv4Addr, mac: [u8; 6], now: Time) -> Vec<F> {
        self.stats.resolved += 1;
        let until = now + self.config.reachable;
        self.last = None;
        match self.entries.insert(ip, Entry::Reachable { mac, until }) {
            Some(Entry::Incomplete { pending, .. }) => {
                self.unresolved -= 1;
                pending.into()
            }
            _ => Vec::new(),
        }
    }

    /// The multiplexer does not know `ip` yet (it has asked the wire): schedule the
    /// next ask, doubling the wait. False if the neighbour was refused because too
    /// many are unresolved already.
    pub fn unknown(&mut self, ip: Ipv4Addr, now: Time) -> bool {
        match self.entries.get_mut(&ip) {
            Some(Entry::Incomplete {
                next_ask, backoff, ..
            }) => {
                *backoff = (*backoff * 2).min(self.config.max_retry);
                *next_ask = now + *backoff;
                true
            }
            _ if self.unresolved >= self.config.max_unresolved => false,
            _ => {
                self.unresolved += 1;
                self.entries.insert(
                    ip,
                    Entry::Incomplete {
                        next_ask: now + self.config.first_retry,
                        backoff: self.config.first_retry,
                        give_up: now + self.config.give_up,
                        pending: VecDeque::new(),
                    },
                );
                true
            }
        }
    }

    /// Holds `frame` until `ip` resolves (after [`ArpCache::unknown`]); the oldest
    /// held frame goes if the queue is full. False (and the frame dropped) if `ip`
    /// is not being resolved.
    pub fn hold(&mut self, ip: Ipv4Addr, frame: F) -> bool {
        match self.entries.get_mut(&ip) {
            Some(Entry::Incomplete { pending, .. }) => {
                if pending.len() >= self.config.pending_per_neighbor {
                    pending.pop_front();
                    self.stats.frames_dropped += 1;
                }
                pending.push_back(frame);
                true
            }
            _ => {
                self.stats.frames_dropped += 1;
                false
            }
        }
    }

    /// Gives up the neighbours unresolved for too long (dropping their frames) and
    /// returns those whose next ask is due.
    pub fn due(&mut self, now: Time) -> Vec<Ipv4Addr> {
        let mut ask = Vec::new();
        let (stats, unresolved) = (&mut self.stats, &mut self.unresolved);
        self.entries.retain(|ip, e| match e {
            Entry::Incomplete {
                give_up, pending, ..
            } if *give_up <= now => {
                stats.failed += 1;
                stats.frames_dropped += pending.len() as u64;
                *unresolved -= 1;
                false
            }
            Entry::Incomplete { next_ask, .. } => {
                if *next_ask <= now {
                    ask.push(*ip);
                }
                true
            }
            Entry::Reachable { until, .. } => *until > now,
        });
        ask
    }

    /// The earliest time [`ArpCache::due`] has work.
    pub fn next_deadline(&self) -> Option<Time> {
        // Asked on every pump: with every neighbour resolved, no map walk.
        if self.unresolved == 0 {
            return None;
        }
        self.entries
            .values()
            .filter_map(|e| match e {
                Entry::Incomplete {
                    next_ask, give_up, ..
                } => Some((*next_ask).min(*give_up)),
                Entry::Reachable { .. } => None,
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);
    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];

    fn ms(n: u64) -> Time {
        Time::from_millis(n)
    }

    #[test]
    fn ask_hold_resolve_flush() {
        let mut c = ArpCache::new(ArpConfig::default());
        assert_eq!(c.lookup(IP, ms(0)), Lookup::Ask);
        assert!(c.unknown(IP, ms(0)));
        assert!(c.hold(IP, vec![1]));
        assert_eq!(c.lookup(IP, ms(0)), Lookup::Wait);
        assert_eq!(c.due(ms(0)), Vec::<Ipv4Addr>::new());
        assert_eq!(c.next_deadline(), Some(ms(1)));
        assert_eq!(c.due(ms(1)), vec![IP]);
        assert_eq!(c.lookup(IP, ms(1)), Lookup::Ask);
        assert!(c.unknown(IP, ms(1)));
        assert_eq!(c.next_deadline(), Some(ms(3)), "the backoff doubles");
        assert_eq!(c.resolved(IP, MAC, ms(2)), vec![vec![1]]);
        assert_eq!(c.lookup(IP, ms(3)), Lookup::Hit(MAC));
        assert_eq!(c.pending_frames(), 0);
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn stale_entries_are_asked_again() {
        let mut c: ArpCache = ArpCache::new(ArpConfig::default());
        c.resolved(IP, MAC, ms(0));
        assert_eq!(c.lookup(IP, ms(29_999)), Lookup::Hit(MAC));
        assert_eq!(c.lookup(IP, ms(30_000)), Lookup::Ask);
        c.due(ms(30_000));
        assert!(c.entries.is_empty());
    }

    #[test]
    fn unresolved_neighbours_are_given_up_and_bounded() {
        let config = ArpConfig {
            pending_per_neighbor: 2,
            max_unresolved: 1,
            ..ArpConfig::default()
        };
        let mut c = ArpCache::new(config);
        assert!(!c.hold(IP, vec![0]), "not being resolved");
        c.unknown(IP, ms(0));
        for i in 1..=3 {
            c.hold(IP, vec![i]);
        }
        assert_eq!(c.pending_frames(), 2);
        assert!(!c.unknown(Ipv4Addr::new(10, 0, 0, 10), ms(0)), "bound");
        let mut t = 0;
        while c.pending_frames() > 0 {
            for ip in c.due(ms(t)) {
                c.unknown(ip, ms(t));
            }
            t += 1;
            assert!(t < 10_000, "never given up");
        }
        assert!(t > 3000 && t <= 3001, "given up after 3 s, at {t} ms");
        assert_eq!(c.stats().failed, 1);
        assert_eq!(c.stats().frames_dropped, 1 + 1 + 2);
        assert!(c.unknown(Ipv4Addr::new(10, 0, 0, 10), ms(t)), "room again");
    }
}
