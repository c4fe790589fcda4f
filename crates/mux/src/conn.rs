//! The multiplexer's part in TCP connections (Thekkath §III-D): "when the
//! application exits, the registry server inherits the connections and
//! ensures that the protocol specified delay period is maintained before
//! the connection is reused", and "to guard against an abnormal application
//! termination, the protocol server issues a reset message to the remote
//! peer".
//!
//! A connection channel (TCP with a remote) is followed from the segments
//! that pass through the multiplexer ([`ConnTrack`]), a few loads a frame:
//! on transmit (after the template check) the highest sequence number sent
//! (SND.MAX), the last acknowledgment sent, our FIN and RST; on receive the
//! peer's FIN, its highest acknowledgment, its latest timestamp and an
//! acceptable RST. No checksum is verified there: every conclusion rests on
//! an exact equality with a number the application itself sent (the peer's
//! FIN counts once our acknowledgment names it, a RST only at exactly our
//! RCV.NXT as RFC 5961 §3.2 asks), which a corrupted segment meets only by
//! chance. The timestamp is the exception: a corrupted one can only make a
//! hold refuse a new incarnation's SYN (RFC 6191) until its 2×MSL ends.
//!
//! When the channel goes (its endpoint removed, or the channel unbound) the
//! connection's fate follows ([`ConnTrack::fate`]): a finished one needs
//! nothing, one in TIME-WAIT is held here ([`TimeWaits`]) for what remains of
//! its 2×MSL, and any other is reset (RFC 9293 §3.10.5, ABORT).

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use exonet_link::direct::DirectSent;
use exonet_wire::ethernet::ethertype;
use exonet_wire::field::{get_u16, get_u32};
use exonet_wire::ipv4::protocol;
use exonet_wire::tcp::flags;
use exonet_wire::{EthernetFrame, Ipv4Packet, MacAddr, TcpPacket};

use crate::host::Host;

/// `a` comes after `b` in sequence space (RFC 9293 §3.4).
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// What the tracking reads of a segment.
struct Seg<'a> {
    flags: u8,
    seq: u32,
    ack: u32,
    /// Data bytes.
    len: u32,
    /// The options, read only when they are wanted (the timestamps of
    /// received segments).
    options: &'a [u8],
}

impl Seg<'_> {
    /// The sequence number after the data and SYN: a FIN's own.
    fn fin_seq(&self) -> u32 {
        self.seq
            .wrapping_add(self.len)
            .wrapping_add((self.flags & flags::SYN != 0) as u32)
    }

    fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// The timestamps option's TSval (RFC 7323 §3).
    fn tsval(&self) -> Option<u32> {
        exonet_wire::tcp::timestamps(self.options).map(|(v, _)| v)
    }
}

enum Read<'a> {
    Seg(Seg<'a>),
    /// A fragment: its length says nothing of the segment's, and a body
    /// fragment has no header. Not followed; a fragmented TCP segment is
    /// rare, and a RST that falls short of the peer's RCV.NXT only costs a
    /// challenge ACK, which the host answers with a RST at exactly that
    /// number (RFC 5961 §3.2, RFC 9293 §3.10.7.1).
    Fragment,
    Malformed,
}

/// Reads a TCP/IPv4 segment in an untagged Ethernet frame, bounds checked:
/// the frame comes from an untrusted application or the network. The
/// checks are those of [`Ipv4Packet::new_checked`] and
/// [`TcpPacket::new_checked`], on the bytes: this runs on every segment
/// either way, and the views' accessors each check again.
fn read(frame: &[u8]) -> Read<'_> {
    // RFC 791 §3.1: version 4, IHL at least 5 words, the header within the
    // total length and the total length within the frame.
    let Some(ip) = frame
        .get(14..)
        .filter(|ip| ip.len() >= 20 && ip[0] >> 4 == 4)
    else {
        return Read::Malformed;
    };
    let hl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(get_u16(ip, 2));
    if hl < 20 || total < hl || total > ip.len() || ip[9] != protocol::TCP {
        return Read::Malformed;
    }
    // MF, or a fragment offset.
    if get_u16(ip, 6) & 0x3fff != 0 {
        return Read::Fragment;
    }
    // RFC 9293 §3.1: a data offset of at least 5 words, within the segment.
    let tcp = &ip[hl..total];
    let Some(thl) = tcp
        .get(12)
        .map(|&o| usize::from(o >> 4) * 4)
        .filter(|&thl| thl >= 20 && thl <= tcp.len())
    else {
        return Read::Malformed;
    };
    Read::Seg(Seg {
        flags: tcp[13],
        seq: get_u32(tcp, 4),
        ack: get_u32(tcp, 8),
        len: (tcp.len() - thl) as u32,
        options: &tcp[20..thl],
    })
}

/// What the multiplexer knows of one connection from the segments that
/// passed through it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ConnTrack {
    /// SND.MAX: the sequence number after the highest one sent (data, SYN
    /// and FIN count); meaningful once something was sent.
    snd_max: u32,
    sent: bool,
    /// The last acknowledgment number sent: RCV.NXT as the application had it.
    ack: Option<u32>,
    /// The sequence number of our FIN.
    fin: Option<u32>,
    /// The highest acknowledgment the peer sent that does not pass SND.MAX.
    peer_ack: Option<u32>,
    /// The sequence number of the peer's FIN, and when it (last) arrived:
    /// TIME-WAIT starts on processing it (RFC 9293 §3.10.7.4), which a
    /// library holding its own TIME-WAIT does no earlier, so a library that
    /// unbinds when its TIME-WAIT ends leaves nothing to hold here.
    peer_fin: Option<(u32, Instant)>,
    /// The latest TSval the peer sent (RFC 6191 §2's "last timestamp
    /// seen"), from segments whose ACK is acceptable.
    peer_ts: Option<u32>,
    /// We acknowledged the peer's FIN since it last arrived.
    peer_fin_acked: bool,
    /// Our FIN went before the peer's arrived: this side closed first (or
    /// both at once), so it is the one that ends in TIME-WAIT.
    closed_first: bool,
    /// A RST went either way.
    reset: bool,
    /// The destination MAC of the last segment sent: the next hop.
    next_hop: [u8; 6],
}

/// What becomes of a connection whose channel goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Finished, reset, or never synchronized: nothing to do.
    Done,
    /// Abandoned: `<SEQ=SND.MAX><CTL=RST>` to the next hop.
    Reset { seq: u32, to: MacAddr },
    /// In TIME-WAIT: to be held as [`Hold`] says.
    TimeWait(Hold),
}

/// What [`ConnTrack::on_received`] made of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// Not a segment it could read.
    Malformed,
    /// A segment, or a fragment (which it does not read).
    Segment,
    /// A segment with the peer's FIN, whose ACK the peer may be waiting for.
    Fin,
}

impl ConnTrack {
    /// A segment the application sent (template checked, taken by the
    /// link). False if it could not be read.
    pub fn on_sent(&mut self, frame: &[u8]) -> bool {
        let s = match read(frame) {
            Read::Seg(s) => s,
            Read::Fragment => return true,
            Read::Malformed => return false,
        };
        let fin_seq = s.fin_seq();
        let end = fin_seq.wrapping_add(s.has(flags::FIN) as u32);
        if !self.sent || after(end, self.snd_max) {
            self.snd_max = end;
            self.sent = true;
        }
        if s.has(flags::RST) {
            self.reset = true;
        }
        if s.has(flags::FIN) {
            self.fin = Some(fin_seq);
            self.closed_first |= self.peer_fin.is_none();
        }
        if s.has(flags::ACK) {
            self.ack = Some(s.ack);
            if let Some((f, _)) = self.peer_fin {
                self.peer_fin_acked |= s.ack == f.wrapping_add(1);
            }
        }
        self.next_hop.copy_from_slice(&frame[..6]);
        true
    }

    /// A segment the channel's filter took from the network, at `now`.
    pub fn on_received(&mut self, frame: &[u8], now: Instant) -> Received {
        let s = match read(frame) {
            Read::Seg(s) => s,
            Read::Fragment => return Received::Segment,
            Read::Malformed => return Received::Malformed,
        };
        if s.has(flags::RST) {
            // RFC 5961 §3.2: only a RST at exactly RCV.NXT resets; any other
            // draws a challenge ACK from the library.
            self.reset |= self.ack == Some(s.seq);
            return Received::Segment;
        }
        let acceptable = self.sent && !after(s.ack, self.snd_max);
        if s.has(flags::ACK) && acceptable && self.peer_ack.is_none_or(|a| after(s.ack, a)) {
            self.peer_ack = Some(s.ack);
        }
        if let Some(v) = (s.has(flags::ACK) && acceptable)
            .then(|| s.tsval())
            .flatten()
        {
            if self.peer_ts.is_none_or(|t| after(v, t)) {
                self.peer_ts = Some(v);
            }
        }
        if s.has(flags::FIN) {
            self.peer_fin = Some((s.fin_seq(), now));
            self.peer_fin_acked = false;
            return Received::Fin;
        }
        Received::Segment
    }

    /// Reset, or closed both ways with both FINs acknowledged: what is left
    /// is a TIME-WAIT at most, which the library hands to the multiplexer.
    pub fn finished(&self) -> bool {
        self.reset || (self.peer_fin.is_some() && self.fins_acked())
    }

    /// Our FIN acknowledged by the peer, and the peer's FIN by us.
    fn fins_acked(&self) -> bool {
        let ours = self
            .fin
            .is_some_and(|f| self.peer_ack == Some(f.wrapping_add(1)));
        ours && self.peer_fin_acked
    }

    /// What the application sent through its direct send port, which the
    /// multiplexer did not see: data and ACKs only (the port refuses SYN,
    /// FIN and RST), so it moves SND.MAX, the last acknowledgment sent and
    /// the next hop, and only forward.
    pub fn merge_direct(&mut self, d: DirectSent) {
        if !self.sent || after(d.snd_max, self.snd_max) {
            self.snd_max = d.snd_max;
            self.sent = true;
            self.next_hop = d.next_hop;
        }
        if self.ack.is_none_or(|a| after(d.ack, a)) {
            self.ack = Some(d.ack);
        }
    }

    /// What to do now that the channel goes, at `now`, TIME-WAIT lasting
    /// `time_wait` (2×MSL).
    pub fn fate(&self, now: Instant, time_wait: Duration) -> Fate {
        // Never acknowledged anything (nothing sent, or SYN-SENT): RFC 9293
        // §3.10.5 sends no RST; a late SYN-ACK meets the host's RST.
        if self.ack.is_none() || self.reset {
            return Fate::Done;
        }
        match self.peer_fin {
            Some((f, at)) if self.fins_acked() => {
                let until = at + time_wait;
                if self.closed_first && until > now {
                    Fate::TimeWait(Hold {
                        seq: self.snd_max,
                        ack: f.wrapping_add(1),
                        ts: self.peer_ts,
                        until,
                    })
                } else {
                    Fate::Done
                }
            }
            // Not finished: abandoned. RFC 9293 §3.10.5 sends nothing in
            // CLOSING and LAST-ACK, but there the peer may wait for a FIN
            // or an ACK that was lost, and one RST spares it the wait.
            _ => Fate::Reset {
                seq: self.snd_max,
                to: MacAddr(self.next_hop),
            },
        }
    }
}

/// The 4-tuple and flags of a TCP/IPv4 segment (`sent`: by us, so ours is
/// its source), bounds checked; `None` for anything else, or a fragment
/// after the first.
pub(crate) fn tuple(frame: &[u8], sent: bool) -> Option<(Tuple, u8)> {
    let ip = frame.get(14..).filter(|ip| ip.len() >= 20)?;
    let hl = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || ip[9] != protocol::TCP || get_u16(ip, 6) & 0x1fff != 0 {
        return None;
    }
    let tcp = ip.get(hl..hl + 14).filter(|_| hl >= 20)?;
    let addr = |at: usize| Ipv4Addr::from(get_u32(ip, at));
    let (src, dst) = ((addr(12), get_u16(tcp, 0)), (addr(16), get_u16(tcp, 2)));
    let (local, remote) = if sent { (src, dst) } else { (dst, src) };
    Some((Tuple { local, remote }, tcp[13]))
}

/// Most connections one endpoint has followed on its listeners' channels.
pub(crate) const MAX_FOLLOWED: usize = 1024;

/// Connections accepted at listeners, followed on the listener's channel
/// until their own channel is bound (a library does not wait for that
/// bind, and sends on the listener's channel meanwhile; through a daemon,
/// it binds only connections that last) or until they finish. One is
/// started only by a segment its application sends without SYN, past the
/// handshake, so a SYN flood starts none; an endpoint has at most
/// [`MAX_FOLLOWED`].
#[derive(Default)]
pub(crate) struct Followed {
    /// By 4-tuple.
    by_tuple: HashMap<Tuple, FollowedConn>,
    /// How many each endpoint has.
    count: HashMap<u32, usize>,
    /// Connections that finished while followed ([`ConnTrack::finished`]),
    /// taken out for the multiplexer to hold their TIME-WAIT.
    finished: Vec<(Tuple, ConnTrack)>,
}

/// One connection [`Followed`] on a listener's channel.
struct FollowedConn {
    /// The endpoint that accepted it.
    owner: u32,
    /// What is known of it.
    conn: ConnTrack,
    /// A segment it sent asked for its own channel to be quiet.
    quiet: bool,
}

impl Followed {
    pub fn is_empty(&self) -> bool {
        self.by_tuple.is_empty()
    }

    /// A segment endpoint `ep` sent on a listener's channel, `quiet` or
    /// not. False if it was one to follow and could not be: the endpoint
    /// has its most.
    pub fn on_sent(&mut self, ep: u32, t: Tuple, fl: u8, frame: &[u8], quiet: bool) -> bool {
        if let Some(f) = self.by_tuple.get_mut(&t) {
            if f.owner == ep {
                f.conn.on_sent(frame);
                f.quiet |= quiet;
                if f.conn.finished() {
                    self.finish(ep, t);
                }
            }
            return true;
        }
        if fl & (flags::SYN | flags::RST) != 0 {
            return true;
        }
        let n = self.count.entry(ep).or_default();
        if *n >= MAX_FOLLOWED {
            return false;
        }
        *n += 1;
        let mut conn = ConnTrack::default();
        conn.on_sent(frame);
        self.by_tuple.insert(
            t,
            FollowedConn {
                owner: ep,
                conn,
                quiet,
            },
        );
        true
    }

    /// A frame a channel of endpoint `ep` without connection tracking (a
    /// listener's) took, at `now`: what it was, and whether it is for a
    /// connection whose application asked for quiet. Read only while
    /// something is followed.
    pub fn on_received(&mut self, ep: u32, frame: &[u8], now: Instant) -> (Received, bool) {
        let none = (Received::Segment, false);
        if self.is_empty() {
            return none;
        }
        let Some((t, _)) = tuple(frame, false) else {
            return none;
        };
        let Some(f) = self.by_tuple.get_mut(&t).filter(|f| f.owner == ep) else {
            return none;
        };
        let seen = (f.conn.on_received(frame, now), f.quiet);
        if f.conn.finished() {
            self.finish(ep, t);
        }
        seen
    }

    /// Connection `t` of endpoint `ep` finished: out, for the multiplexer.
    fn finish(&mut self, ep: u32, t: Tuple) {
        self.forget(ep);
        if let Some(f) = self.by_tuple.remove(&t) {
            self.finished.push((t, f.conn));
        }
    }

    /// The connections that finished since the last call.
    pub fn take_finished(&mut self) -> Vec<(Tuple, ConnTrack)> {
        std::mem::take(&mut self.finished)
    }

    /// Whether connections finished since the last [`Followed::take_finished`].
    pub fn any_finished(&self) -> bool {
        !self.finished.is_empty()
    }

    /// What endpoint `ep` followed of connection `t`, whose own channel it
    /// now has, and whether that channel is to be quiet.
    pub fn take(&mut self, ep: u32, t: &Tuple) -> Option<(ConnTrack, bool)> {
        if self.by_tuple.get(t).is_none_or(|f| f.owner != ep) {
            return None;
        }
        self.forget(ep);
        self.by_tuple.remove(t).map(|f| (f.conn, f.quiet))
    }

    /// Endpoint `ep`'s connections on `local` (all of them for `None`),
    /// taken out: their channel, or their endpoint, goes.
    pub fn drain(&mut self, ep: u32, local: Option<(Ipv4Addr, u16)>) -> Vec<(Tuple, ConnTrack)> {
        if !self.count.contains_key(&ep) {
            return Vec::new();
        }
        let gone: Vec<Tuple> = self
            .by_tuple
            .iter()
            .filter(|(t, f)| f.owner == ep && local.is_none_or(|l| t.local == l))
            .map(|(t, _)| *t)
            .collect();
        gone.into_iter()
            .filter_map(|t| {
                self.forget(ep);
                self.by_tuple.remove(&t).map(|f| (t, f.conn))
            })
            .collect()
    }

    fn forget(&mut self, ep: u32) {
        if let Some(n) = self.count.get_mut(&ep) {
            *n -= 1;
            if *n == 0 {
                self.count.remove(&ep);
            }
        }
    }
}

/// A connection's addresses: ours, then the peer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Tuple {
    pub local: (Ipv4Addr, u16),
    pub remote: (Ipv4Addr, u16),
}

/// One connection in TIME-WAIT, held for its 4-tuple by a filter of the
/// multiplexer's own.
struct Held {
    tuple: Tuple,
    hold: Hold,
    /// Tie-breaker among equal deadlines, in order of holding.
    order: u64,
}

/// A connection in TIME-WAIT until `until`, answering with
/// `<SEQ=seq><ACK=ack><CTL=ACK>`; `ts`, the peer's last TSval, decides on a
/// new incarnation (RFC 6191).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hold {
    /// SND.MAX and RCV.NXT of the old connection.
    pub seq: u32,
    pub ack: u32,
    pub ts: Option<u32>,
    pub until: Instant,
}

/// Connections in TIME-WAIT whose application is gone, by the id of the
/// filter that holds their 4-tuple, with a bound on their number.
pub(crate) struct TimeWaits {
    max: usize,
    held: HashMap<u32, Held>,
    by_tuple: HashMap<Tuple, u32>,
    /// By (deadline, order), for expiry and eviction of the oldest without
    /// a scan.
    by_deadline: BTreeMap<(Instant, u64), u32>,
    order: u64,
}

impl TimeWaits {
    pub fn new(max: usize) -> TimeWaits {
        TimeWaits {
            max,
            held: HashMap::new(),
            by_tuple: HashMap::new(),
            by_deadline: BTreeMap::new(),
            order: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// At most this many are held.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Whether `filter` is one of ours.
    pub fn holds(&self, filter: u32) -> bool {
        self.held.contains_key(&filter)
    }

    pub fn contains(&self, t: &Tuple) -> bool {
        self.by_tuple.contains_key(t)
    }

    /// Holds `t` by `filter` until `until`. The caller made room.
    pub fn insert(&mut self, filter: u32, t: Tuple, hold: Hold) {
        let order = self.order;
        self.order += 1;
        self.by_deadline.insert((hold.until, order), filter);
        self.by_tuple.insert(t, filter);
        let h = Held {
            tuple: t,
            hold,
            order,
        };
        self.held.insert(filter, h);
    }

    fn remove(&mut self, filter: u32) -> Option<(u32, Tuple)> {
        let h = self.held.remove(&filter)?;
        self.by_deadline.remove(&(h.hold.until, h.order));
        self.by_tuple.remove(&h.tuple);
        Some((filter, h.tuple))
    }

    /// Stops holding `t`: its filter.
    pub fn remove_tuple(&mut self, t: &Tuple) -> Option<(u32, Tuple)> {
        let filter = *self.by_tuple.get(t)?;
        self.remove(filter)
    }

    /// The one that expires first, taken out to make room.
    pub fn pop_oldest(&mut self) -> Option<(u32, Tuple)> {
        let (_, &filter) = self.by_deadline.first_key_value()?;
        self.remove(filter)
    }

    /// One whose hold ended by `now`, taken out.
    pub fn pop_expired(&mut self, now: Instant) -> Option<(u32, Tuple)> {
        match self.by_deadline.first_key_value() {
            Some((&(until, _), &filter)) if until <= now => self.remove(filter),
            _ => None,
        }
    }

    /// A segment the held connection's filter took, at `now`: RFC 9293
    /// §3.10.7.4 in TIME-WAIT. Every segment but a RST is acknowledged
    /// (out of the window, or the peer's FIN again, whose ACK was lost), and
    /// the peer's FIN restarts the hold for `time_wait`. A RST is ignored
    /// (RFC 1337): the hold is there to keep old duplicates away from the
    /// 4-tuple's next incarnation, and a RST that ended it early would let
    /// them in; it costs only an entry, bounded, until the hold expires.
    /// The ACKs draw on the host's refusal budget (anyone may send
    /// segments here). Counted in the host's stats.
    pub fn on_segment(
        &mut self,
        filter: u32,
        frame: &[u8],
        now: Instant,
        time_wait: Duration,
        host: &mut Host,
    ) {
        match self.answer(filter, frame, now, time_wait) {
            Some(Answer::Ack {
                to,
                tuple,
                seq,
                ack,
            }) => {
                if host.take_token(now) && host.send_tcp(to, tuple, flags::ACK, seq, ack) {
                    host.stats.time_wait_acks += 1;
                }
            }
            Some(Answer::RstIgnored) => host.stats.time_wait_rst_ignored += 1,
            None => host.stats.unmatched_dropped += 1,
        }
    }

    /// A new connection's SYN for held `filter` that may end the hold, so
    /// that a client that reuses its port at once is not refused for
    /// 2×MSL. RFC 6191 §2: where both the SYN and the old connection carry
    /// timestamps (the library takes timestamps a SYN offers), the SYN's
    /// TSval must come after the last one the peer sent; otherwise, as
    /// RFC 1122 §4.2.2.13, its sequence number must be beyond the old
    /// connection's. Returns the hold, taken out, for the caller to release
    /// and deliver the SYN.
    pub fn reopen(&mut self, filter: u32, frame: &[u8]) -> Option<(u32, Tuple)> {
        let h = self.held.get(&filter)?;
        let tcp = checked_tcp(frame)?;
        let syn_only = tcp.flags() & (flags::SYN | flags::ACK | flags::RST) == flags::SYN;
        let newer = match (tcp.timestamps(), h.hold.ts) {
            (Some((tsval, _)), Some(last)) => after(tsval, last),
            // At or after RCV.NXT of the old one.
            _ => tcp.seq_number() == h.hold.ack || after(tcp.seq_number(), h.hold.ack),
        };
        if !(syn_only && newer) {
            return None;
        }
        self.remove(filter)
    }

    /// What a readable segment to a held connection draws; `None` if it is
    /// unreadable or corrupt.
    fn answer(
        &mut self,
        filter: u32,
        frame: &[u8],
        now: Instant,
        time_wait: Duration,
    ) -> Option<Answer> {
        let h = self.held.get_mut(&filter)?;
        let tcp = checked_tcp(frame)?;
        let to = EthernetFrame::new_checked(frame).ok()?.src_addr();
        if tcp.rst() {
            return Some(Answer::RstIgnored);
        }
        let s = Seg {
            flags: tcp.flags(),
            seq: tcp.seq_number(),
            ack: 0,
            len: tcp.payload().len() as u32,
            options: &[],
        };
        if s.has(flags::FIN) && s.fin_seq().wrapping_add(1) == h.hold.ack {
            self.by_deadline.remove(&(h.hold.until, h.order));
            h.hold.until = now + time_wait;
            self.by_deadline.insert((h.hold.until, h.order), filter);
        }
        Some(Answer::Ack {
            to,
            tuple: h.tuple,
            seq: h.hold.seq,
            ack: h.hold.ack,
        })
    }
}

/// The TCP segment of a frame to a held connection, checked in full (the
/// multiplexer answers these itself, rarely): unicast Ethernet, IPv4 with a
/// good checksum and no fragmenting, TCP with a good checksum.
fn checked_tcp(frame: &[u8]) -> Option<TcpPacket<&[u8]>> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != ethertype::IPV4 || !eth.src_addr().is_unicast() {
        return None;
    }
    let ip = Ipv4Packet::new_checked(&frame[14..]).ok()?;
    if !ip.verify_checksum() || ip.more_frags() || ip.frag_offset() != 0 {
        return None;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let header = ip.header_len();
    let total = usize::from(ip.total_len());
    let tcp = TcpPacket::new_checked(&frame[14 + header..14 + total]).ok()?;
    tcp.verify_checksum(src, dst).then_some(tcp)
}

/// What a readable segment to a held connection draws.
enum Answer {
    /// `<SEQ=seq><ACK=ack><CTL=ACK>` to `to`.
    Ack {
        to: MacAddr,
        tuple: Tuple,
        seq: u32,
        ack: u32,
    },
    /// Nothing (RFC 1337).
    RstIgnored,
}

#[cfg(test)]
mod tests {
    use super::*;
    use exonet_wire::build;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const MA: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const MB: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const TW: Duration = Duration::from_secs(60);

    fn out(fl: u8, seq: u32, ack: u32, data: &[u8]) -> Vec<u8> {
        build::tcp_frame(MA, MB, A, B, 4000, 80, fl, seq, ack, &[], data)
    }

    fn inn(fl: u8, seq: u32, ack: u32, data: &[u8]) -> Vec<u8> {
        build::tcp_frame(MB, MA, B, A, 80, 4000, fl, seq, ack, &[], data)
    }

    /// A connection after the handshake: ISS 1000 ours, 5000 the peer's.
    fn established(t0: Instant) -> ConnTrack {
        let mut c = ConnTrack::default();
        assert!(c.on_sent(&out(flags::SYN, 1000, 0, &[])));
        assert_eq!(
            c.on_received(&inn(flags::SYN | flags::ACK, 5000, 1001, &[]), t0),
            Received::Segment
        );
        assert!(c.on_sent(&out(flags::ACK, 1001, 5001, &[])));
        c
    }

    #[test]
    fn syn_sent_is_not_reset() {
        let mut c = ConnTrack::default();
        assert_eq!(c.fate(Instant::now(), TW), Fate::Done);
        c.on_sent(&out(flags::SYN, 7, 0, &[]));
        assert_eq!(c.fate(Instant::now(), TW), Fate::Done);
    }

    #[test]
    fn snd_max_counts_data_syn_fin_and_wraps() {
        let t0 = Instant::now();
        let mut c = established(t0);
        c.on_sent(&out(flags::ACK, 1001, 5001, b"hello"));
        // A retransmission of older data does not move SND.MAX back.
        c.on_sent(&out(flags::ACK, 1001, 5001, b"he"));
        let Fate::Reset { seq, to } = c.fate(t0, TW) else {
            panic!("not reset")
        };
        assert_eq!((seq, to), (1006, MB));
        let mut c = ConnTrack::default();
        c.on_sent(&out(flags::SYN | flags::ACK, u32::MAX - 1, 9, &[]));
        c.on_sent(&out(flags::ACK | flags::FIN, u32::MAX, 9, b"ab"));
        assert!(matches!(c.fate(t0, TW), Fate::Reset { seq: 2, .. }));
    }

    #[test]
    fn what_went_direct_moves_the_reset_forward_only() {
        let t0 = Instant::now();
        // The handshake's ACK and data went through the direct send port:
        // the multiplexer saw the SYN alone, and would not reset.
        let mut c = ConnTrack::default();
        c.on_sent(&out(flags::SYN, 1000, 0, &[]));
        assert_eq!(c.fate(t0, TW), Fate::Done);
        let hop = [2, 0, 0, 0, 0, 9];
        c.merge_direct(DirectSent {
            snd_max: 1501,
            ack: 5001,
            next_hop: hop,
        });
        assert_eq!(
            c.fate(t0, TW),
            Fate::Reset {
                seq: 1501,
                to: MacAddr(hop)
            }
        );
        // Older than what the multiplexer sent itself: no change.
        c.on_sent(&out(flags::ACK, 1501, 5001, b"abc"));
        c.merge_direct(DirectSent {
            snd_max: 1400,
            ack: 4000,
            next_hop: hop,
        });
        assert!(matches!(c.fate(t0, TW), Fate::Reset { seq: 1504, .. }));
    }

    #[test]
    fn only_an_exact_rst_resets() {
        let t0 = Instant::now();
        let mut c = established(t0);
        c.on_received(&inn(flags::RST, 5002, 0, &[]), t0);
        assert!(matches!(c.fate(t0, TW), Fate::Reset { .. }));
        c.on_received(&inn(flags::RST, 5001, 0, &[]), t0);
        assert_eq!(c.fate(t0, TW), Fate::Done);
    }

    #[test]
    fn closing_sides() {
        let t0 = Instant::now();
        // Active close: FIN, its ACK, the peer's FIN, our ACK: TIME-WAIT.
        let mut c = established(t0);
        c.on_sent(&out(flags::ACK | flags::FIN, 1001, 5001, &[]));
        c.on_received(&inn(flags::ACK, 5001, 1002, &[]), t0);
        assert!(matches!(c.fate(t0, TW), Fate::Reset { seq: 1002, .. }));
        assert_eq!(
            c.on_received(&inn(flags::ACK | flags::FIN, 5001, 1002, &[]), t0),
            Received::Fin
        );
        // The FIN not yet acknowledged by us: still abandoned.
        assert!(matches!(c.fate(t0, TW), Fate::Reset { .. }));
        c.on_sent(&out(flags::ACK, 1002, 5002, &[]));
        let want = Fate::TimeWait(Hold {
            seq: 1002,
            ack: 5002,
            ts: None,
            until: t0 + TW,
        });
        assert_eq!(c.fate(t0, TW), want);
        assert_eq!(c.fate(t0 + TW, TW), Fate::Done);
        // Passive close: the peer's FIN first; LAST-ACK then CLOSED.
        let mut c = established(t0);
        c.on_received(&inn(flags::ACK | flags::FIN, 5001, 1001, &[]), t0);
        c.on_sent(&out(flags::ACK, 1001, 5002, &[]));
        c.on_sent(&out(flags::ACK | flags::FIN, 1001, 5002, &[]));
        assert!(matches!(c.fate(t0, TW), Fate::Reset { seq: 1002, .. }));
        // An ACK beyond what was sent is not taken.
        c.on_received(&inn(flags::ACK, 5002, 1003, &[]), t0);
        assert!(matches!(c.fate(t0, TW), Fate::Reset { .. }));
        c.on_received(&inn(flags::ACK, 5002, 1002, &[]), t0);
        assert_eq!(c.fate(t0, TW), Fate::Done);
    }

    #[test]
    fn malformed_and_fragments() {
        let t0 = Instant::now();
        let mut c = established(t0);
        let good = out(flags::ACK, 1001, 5001, b"abc");
        for cut in 0..good.len() - 3 {
            assert!(!c.on_sent(&good[..cut]));
            assert_eq!(c.on_received(&good[..cut], t0), Received::Malformed);
        }
        let mut bad = good.clone();
        bad[14 + 20 + 12] = 0x20; // data offset 2 words
        assert!(!c.on_sent(&bad));
        let mut frag = good.clone();
        frag[14 + 6] = 0x20; // MF
        assert!(c.on_sent(&frag));
        assert!(matches!(c.fate(t0, TW), Fate::Reset { seq: 1001, .. }));
    }
}
