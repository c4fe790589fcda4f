//! The IP identification of fragmented datagrams, which the multiplexer
//! owns.
//!
//! Every application sends from the host's addresses, and the receiver
//! reassembles on (source, destination, protocol, identification) (RFC 791
//! §3.2). Two applications that picked the same identification towards the
//! same destination would corrupt each other's datagrams, and a hostile one
//! could inject body fragments into another's. So the multiplexer rewrites
//! the identification of every fragment an application sends: a head
//! fragment (offset 0, MF set) opens a transmit association of its channel,
//! keyed on (destination, the application's identification), that maps to
//! an identification drawn from one host-wide counter ([`Idents`], which
//! the host's own fragmented replies use too); the datagram's body
//! fragments take that identification, and a body fragment whose channel
//! has no such association is dropped.
//!
//! The head must be sent first. RFC 791 allows any order, but only the head
//! shows the ports the channel's template checks, so a body fragment is
//! trusted only as part of a datagram whose head this channel already sent
//! (the protocol library always sends the head first).
//!
//! Unfragmented datagrams keep the application's identification: it only
//! matters for fragments (RFC 6864 §4.1).

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use exonet_wire::checksum;

/// Offsets in an untagged Ethernet/IPv4 frame.
const IP_IDENT: usize = 14 + 4;
const IP_CHECKSUM: usize = 14 + 10;
const IP_DST: usize = 14 + 16;
/// The end of an IPv4 header without options: where the transport header
/// of a head fragment starts.
pub(crate) const IP_END: usize = 14 + 20;

/// The host-wide counter of identifications for fragmented datagrams.
#[derive(Debug)]
pub(crate) struct Idents {
    next: u16,
}

impl Idents {
    /// Starts from the clock, so that a restarted multiplexer does not reuse
    /// the identifications whose fragments a receiver may still hold.
    pub fn new() -> Idents {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Idents {
            next: (nanos >> 8) as u16,
        }
    }

    pub fn take(&mut self) -> u16 {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        id
    }
}

#[derive(Clone, Copy, Debug)]
struct Assoc {
    dst: [u8; 4],
    app: u16,
    ours: u16,
    expires: Instant,
}

/// One channel's transmit associations, oldest first (they all live the
/// same time, so that is also expiry order). Few enough to search linearly.
#[derive(Debug)]
pub(crate) struct TxFrags {
    assocs: VecDeque<Assoc>,
    max: usize,
    timeout: Duration,
}

impl TxFrags {
    pub fn new(max: usize, timeout: Duration) -> TxFrags {
        TxFrags {
            assocs: VecDeque::new(),
            // A head must always find room for its association.
            max: max.max(1),
            timeout,
        }
    }

    /// A head fragment to `dst` with the application's identification
    /// `app`: a fresh identification for its datagram. An older association
    /// with the same key is replaced (the application reused `app`: a new
    /// datagram); the oldest is evicted when the table is full.
    pub fn head(&mut self, dst: [u8; 4], app: u16, idents: &mut Idents, now: Instant) -> u16 {
        self.expire(now);
        self.assocs.retain(|a| (a.dst, a.app) != (dst, app));
        if self.assocs.len() >= self.max {
            self.assocs.pop_front();
        }
        let ours = idents.take();
        self.assocs.push_back(Assoc {
            dst,
            app,
            ours,
            expires: now + self.timeout,
        });
        ours
    }

    /// A body fragment: the identification of its datagram, if this
    /// channel sent the head recently.
    pub fn body(&mut self, dst: [u8; 4], app: u16, now: Instant) -> Option<u16> {
        self.expire(now);
        self.assocs
            .iter()
            .find(|a| (a.dst, a.app) == (dst, app))
            .map(|a| a.ours)
    }

    fn expire(&mut self, now: Instant) {
        while self.assocs.front().is_some_and(|a| a.expires <= now) {
            self.assocs.pop_front();
        }
    }
}

/// The destination and identification of an IPv4 frame at least
/// [`IP_END`] bytes long.
pub(crate) fn key(frame: &[u8]) -> ([u8; 4], u16) {
    let mut dst = [0; 4];
    dst.copy_from_slice(&frame[IP_DST..IP_DST + 4]);
    (
        dst,
        u16::from_be_bytes([frame[IP_IDENT], frame[IP_IDENT + 1]]),
    )
}

/// Writes `ident` into an IPv4 frame at least [`IP_END`] bytes long,
/// updating the header checksum incrementally (RFC 1624 eqn. 3), so that a
/// header the application summed right stays right.
pub(crate) fn set_ident(frame: &mut [u8], ident: u16) {
    let word = |f: &[u8], at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    let (old, sum) = (word(frame, IP_IDENT), word(frame, IP_CHECKSUM));
    let sum = checksum::update(sum, old, ident);
    frame[IP_IDENT..IP_IDENT + 2].copy_from_slice(&ident.to_be_bytes());
    frame[IP_CHECKSUM..IP_CHECKSUM + 2].copy_from_slice(&sum.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use exonet_wire::build;
    use exonet_wire::{Ipv4Addr, Ipv4Packet, MacAddr};

    #[test]
    fn rewriting_the_ident_keeps_the_checksum_valid() {
        let mut f = build::udp_frame(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            1,
            2,
            b"data",
        );
        for id in [0, 1, 0x1234, 0xffff, 0xfffe] {
            set_ident(&mut f, id);
            let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
            assert!(ip.verify_checksum() && ip.ident() == id);
            assert_eq!(key(&f), ([10, 0, 0, 2], id));
        }
    }

    #[test]
    fn associations_are_bounded_replaced_and_expire() {
        let t0 = Instant::now();
        let mut ids = Idents { next: 0xffff };
        let mut t = TxFrags::new(2, Duration::from_secs(5));
        let d = [10, 0, 0, 2];
        assert_eq!(t.body(d, 7, t0), None);
        assert_eq!(t.head(d, 7, &mut ids, t0), 0xffff);
        assert_eq!(t.body(d, 7, t0), Some(0xffff));
        assert_eq!(t.body([10, 0, 0, 3], 7, t0), None);
        // A reused identification is a new datagram.
        assert_eq!(t.head(d, 7, &mut ids, t0), 0);
        assert_eq!(t.body(d, 7, t0), Some(0));
        t.head(d, 8, &mut ids, t0);
        t.head(d, 9, &mut ids, t0);
        assert_eq!(t.body(d, 7, t0), None, "the oldest was evicted");
        assert_eq!(t.body(d, 9, t0), Some(2));
        assert_eq!(t.body(d, 9, t0 + Duration::from_secs(5)), None);
        assert!(t.assocs.is_empty());
    }
}
