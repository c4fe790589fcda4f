//! Two connections back to back over a simulated network in simulated time, with
//! seeded loss, duplication, reordering, delay and bit corruption.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use exonet_wire::rng::SplitMix64;
use exonet_wire::tcp::{flags, write_options, TcpOption, TcpOptionIter};
use exonet_wire::{TcpPacket, TcpRepr};
use proptest::prelude::*;

use super::*;
use crate::Time;

const ADDR: [SocketAddrV4; 2] = [
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000),
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80),
];
const KEY: [u8; 16] = [0x5a; 16];

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Deterministic stream contents, different per direction.
fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 8) as u8 ^ salt)
        .collect()
}

#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    loss: f64,
    dup: f64,
    /// Chance that a segment takes an extra `jitter` × 3, overtaken by later ones.
    reorder: f64,
    delay: Duration,
    jitter: Duration,
    /// Time each segment occupies the link in its direction (a bandwidth), so
    /// segments sent together arrive one after another; 0 for infinitely fast.
    spacing: Duration,
    /// Chance that a segment arrives with one bit flipped.
    corrupt: f64,
    /// Segments waiting for the link (see `spacing`) beyond which a bottleneck
    /// router drops arrivals (drop-tail), so that its queue, and the delay,
    /// grows with what is in flight up to a loss; 0 for no limit.
    queue: usize,
}

/// A segment as sent, for assertions.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: Time,
    from: usize,
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    len: usize,
    /// The timestamps option as (TSval, TSecr).
    ts: Option<(u32, u32)>,
    /// SACK blocks, the present ones first.
    sack: [Option<(u32, u32)>; 4],
}

impl Sent {
    fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }
}

#[derive(Debug, Default)]
struct App {
    out: Vec<u8>,
    written: usize,
    close_when_written: bool,
    read: bool,
    /// Most bytes read per step (0: all there are), for a slow reader.
    read_chunk: usize,
    got: Vec<u8>,
}

struct InFlight {
    at: Time,
    order: u64,
    to: usize,
    bytes: Vec<u8>,
}

type Filter = Box<dyn FnMut(&Sent) -> bool>;

struct Net {
    now: Time,
    ends: [Option<Connection>; 2],
    apps: [App; 2],
    /// Config for a connection a SYN to the listener at end 1 creates; `None` is a
    /// closed port.
    listener: Option<TcpConfig>,
    /// The listener's ISS instead of RFC 6528's.
    listener_iss: Option<SeqNum>,
    /// The listener's SYN queue is full: it answers with SYN cookies only.
    cookies: bool,
    faults: Faults,
    rng: SplitMix64,
    wire: Vec<InFlight>,
    order: u64,
    log: Vec<Sent>,
    /// When each direction's link is free again (see [`Faults::spacing`]).
    link_free: [Time; 2],
    /// Returns false for segments the test drops on purpose.
    pass: Filter,
    /// Extra time a segment takes past the link (after [`Faults::spacing`]), so
    /// that later ones overtake it.
    hold: Box<dyn FnMut(&Sent) -> Duration>,
    /// Segments dropped on arrival for a bad checksum.
    corrupted: usize,
    /// Segments dropped by a full bottleneck queue (see [`Faults::queue`]).
    queue_drops: usize,
    /// Whether each end has been in TIME-WAIT.
    time_waited: [bool; 2],
    /// Memory of this size is lent to the end's send buffer once it exists.
    lend: [Option<usize>; 2],
    /// Segments sent with their data referenced and not yet reported done
    /// (as the multiplexer reads them later): when they are due, their data
    /// as sent, and the pieces, which must still hold that data then.
    referenced: [VecDeque<(Time, Vec<u8>, Pieces)>; 2],
    /// How long a referenced segment stays referenced after it was sent.
    reference_hold: Duration,
    /// The ends send through a link with segmentation offload: super-segments
    /// of up to 64 KB, cut into segments of 1480 bytes before the wire.
    tso: bool,
    /// Super-segments each end sent.
    supers: [usize; 2],
}

/// Memory lent to a send buffer, standing for part of a segment at `offset`.
struct TestMemory {
    offset: u32,
    bytes: Box<[u8]>,
}

impl SendMemory for TestMemory {
    fn segment_offset(&self) -> u32 {
        self.offset
    }
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    fn write(&mut self, at: usize, data: &[u8]) {
        self.bytes[at..at + data.len()].copy_from_slice(data);
    }
}

/// Where lent memory of end `i` pretends to lie in its segment: odd, so that
/// offsets are checked, not assumed.
const LENT_AT: [u32; 2] = [4097, 65_537];

/// A super-segment from end `from` cut as a link would (through
/// [`exonet_wire::tso`], in a frame made for it) into segments of `cut` bytes.
fn cut_super(from: usize, seg: &[u8], cut: usize) -> Vec<Vec<u8>> {
    let ip = exonet_wire::Ipv4Repr::new(*ADDR[from].ip(), *ADDR[1 - from].ip(), 6, seg.len());
    let mut frame = vec![0u8; 34];
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    ip.emit(&mut frame[14..]).expect("an IPv4 header");
    frame.extend_from_slice(seg);
    let mut out = Vec::new();
    exonet_wire::tso::segment(&mut frame, cut + 20, &mut |f| out.push(f[34..].to_vec()))
        .expect("a super-segment");
    out
}

/// The bytes `pieces` name in `c`'s lent send memory.
fn read_pieces(c: &Connection, pieces: &Pieces) -> Vec<u8> {
    let (base, mem) = c.lent_memory().expect("referenced only from lent memory");
    let mut data = Vec::new();
    for (at, len) in pieces.iter() {
        let at = (at - base) as usize;
        data.extend_from_slice(&mem[at..at + len as usize]);
    }
    data
}

impl Net {
    fn new(seed: u64, faults: Faults) -> Net {
        Net {
            now: Time::ZERO,
            ends: [None, None],
            apps: [App::default(), App::default()],
            listener: None,
            listener_iss: None,
            cookies: false,
            faults,
            rng: SplitMix64::new(seed),
            wire: Vec::new(),
            order: 0,
            log: Vec::new(),
            link_free: [Time::ZERO; 2],
            pass: Box::new(|_| true),
            hold: Box::new(|_| Duration::ZERO),
            corrupted: 0,
            queue_drops: 0,
            time_waited: [false; 2],
            lend: [None; 2],
            referenced: [VecDeque::new(), VecDeque::new()],
            reference_hold: Duration::ZERO,
            tso: false,
            supers: [0; 2],
        }
    }

    /// End 0 connects to a listener at end 1.
    fn client_server(seed: u64, faults: Faults, a: TcpConfig, b: TcpConfig) -> Net {
        let mut n = Net::new(seed, faults);
        let iss = initial_sequence_number(&KEY, ADDR[0], ADDR[1], n.now);
        let offset = timestamp_offset(&KEY, ADDR[0], ADDR[1]);
        n.ends[0] =
            Some(Connection::connect(a, ADDR[0], ADDR[1], iss).with_timestamp_offset(offset));
        n.listener = Some(b);
        n
    }

    fn conn(&self, i: usize) -> &Connection {
        self.ends[i].as_ref().expect("connection exists")
    }

    fn conn_mut(&mut self, i: usize) -> &mut Connection {
        self.ends[i].as_mut().expect("connection exists")
    }

    fn state(&self, i: usize) -> TcpState {
        self.ends[i]
            .as_ref()
            .map_or(TcpState::Closed, Connection::state)
    }

    fn run_apps(&mut self) {
        for i in 0..2 {
            let (Some(c), app) = (self.ends[i].as_mut(), &mut self.apps[i]) else {
                continue;
            };
            if app.written < app.out.len() {
                app.written += c.send(&app.out[app.written..]);
            }
            // Closing in SYN-SENT would abandon the connection (RFC 9293 §3.10.4).
            let connected = c.state() != TcpState::SynSent;
            if app.close_when_written && app.written == app.out.len() && connected {
                c.close();
                app.close_when_written = false;
            }
            if app.read {
                let mut buf = [0; 4096];
                let chunk = if app.read_chunk == 0 {
                    buf.len()
                } else {
                    app.read_chunk
                };
                loop {
                    let n = c.recv(&mut buf[..chunk]);
                    app.got.extend_from_slice(&buf[..n]);
                    if n == 0 || app.read_chunk != 0 {
                        break;
                    }
                }
            }
        }
    }

    fn flush(&mut self) {
        let mut buf = [0u8; 1600];
        for i in 0..2 {
            self.complete_referenced(i);
            let Some(c) = self.ends[i].as_mut() else {
                continue;
            };
            if c.sends_by_reference() {
                // A header buffer as the sockets use: the inline slot.
                let now = self.now;
                let (space, cut) = if self.tso {
                    (65_515, 1480)
                } else {
                    (1600, 1600)
                };
                while let Some((n, pieces)) = self.ends[i].as_mut().and_then(|c| {
                    let may = c.may_transmit();
                    let r = c.poll_transmit_offloaded(now, &mut buf[..96], space, cut, false);
                    assert!(may || r.is_none(), "may_transmit said no");
                    r
                }) {
                    let mut bytes = buf[..n].to_vec();
                    if let Some(p) = pieces {
                        let c = self.conn(i);
                        let data = read_pieces(c, &p);
                        bytes.extend_from_slice(&data);
                        self.referenced[i].push_back((now + self.reference_hold, data, p));
                    }
                    if bytes.len() > cut {
                        self.supers[i] += 1;
                        for seg in cut_super(i, &bytes, cut) {
                            self.put(i, seg);
                        }
                    } else {
                        self.put(i, bytes);
                    }
                }
                continue;
            }
            let now = self.now;
            while let Some(n) = self.ends[i].as_mut().and_then(|c| {
                let may = c.may_transmit();
                let r = c.poll_transmit(now, &mut buf);
                assert!(may || r.is_none(), "may_transmit said no");
                r
            }) {
                self.put(i, buf[..n].to_vec());
            }
        }
    }

    /// Lends memory to the send buffers of ends that get it and exist now,
    /// before the application writes.
    fn lend_memory(&mut self) {
        for ((end, lend), offset) in self.ends.iter_mut().zip(self.lend).zip(LENT_AT) {
            let (Some(c), Some(size)) = (end.as_mut(), lend) else {
                continue;
            };
            if !c.sends_by_reference() {
                let mem = TestMemory {
                    offset,
                    bytes: vec![0xee; size].into(),
                };
                assert!(c.lend_send_memory(Box::new(mem)).is_ok(), "lent too late");
            }
        }
    }

    /// Reports end `i`'s referenced segments that are due done, checking that
    /// their data stayed in place.
    fn complete_referenced(&mut self, i: usize) {
        while self.referenced[i].front().is_some_and(|r| r.0 <= self.now) {
            let (_, data, pieces) = self.referenced[i].pop_front().unwrap();
            let Some(c) = self.ends[i].as_mut() else {
                return;
            };
            assert!(
                read_pieces(c, &pieces) == data,
                "referenced data changed before its segment was done"
            );
            c.reference_done();
        }
    }

    fn put(&mut self, from: usize, bytes: Vec<u8>) {
        let p = TcpPacket::new_checked(&bytes[..]).expect("well-formed segment");
        let r = TcpRepr::parse(&p, *ADDR[from].ip(), *ADDR[1 - from].ip()).expect("checksum");
        // etherparse as an independent reading of the same bytes.
        let (h, payload) = etherparse::TcpHeader::from_slice(&bytes).expect("etherparse reads it");
        assert_eq!(
            (
                h.sequence_number,
                h.acknowledgment_number,
                h.window_size,
                h.syn,
                h.fin,
                h.rst
            ),
            (
                r.seq_number,
                r.ack_number,
                r.window,
                r.flags & flags::SYN != 0,
                r.flags & flags::FIN != 0,
                r.flags & flags::RST != 0
            )
        );
        let sum = h
            .calc_checksum_ipv4_raw(
                ADDR[from].ip().octets(),
                ADDR[1 - from].ip().octets(),
                payload,
            )
            .unwrap();
        assert_eq!(sum, h.checksum);
        // Every SYN carries the MSS option, read back by etherparse too.
        let mss = h.options_iterator().find_map(|o| match o {
            Ok(etherparse::TcpOptionElement::MaximumSegmentSize(m)) => Some(m),
            _ => None,
        });
        assert_eq!(mss.is_some(), h.syn);
        // Timestamps as we and etherparse read them.
        let ts = TcpOptionIter::new(r.options)
            .map(Result::unwrap)
            .find_map(|o| match o {
                TcpOption::Timestamps { tsval, tsecr } => Some((tsval, tsecr)),
                _ => None,
            });
        let ep_ts = h.options_iterator().find_map(|o| match o {
            Ok(etherparse::TcpOptionElement::Timestamp(v, e)) => Some((v, e)),
            _ => None,
        });
        assert_eq!(ts, ep_ts);
        // SACK blocks likewise.
        let sack = TcpOptionIter::new(r.options)
            .map(Result::unwrap)
            .find_map(|o| match o {
                TcpOption::Sack(b) => Some(b),
                _ => None,
            })
            .unwrap_or_default();
        let ep_sack = h.options_iterator().find_map(|o| match o {
            Ok(etherparse::TcpOptionElement::SelectiveAcknowledgement(first, rest)) => {
                Some([Some(first), rest[0], rest[1], rest[2]])
            }
            _ => None,
        });
        assert_eq!(sack, ep_sack.unwrap_or_default());
        assert!(r.options.len() <= 40);
        let sent = Sent {
            at: self.now,
            from,
            seq: r.seq_number,
            ack: r.ack_number,
            flags: r.flags,
            window: r.window,
            len: r.payload.len(),
            ts,
            sack,
        };
        self.log.push(sent);
        if !(self.pass)(&sent) || self.rng.chance(self.faults.loss) {
            return;
        }
        let copies = if self.rng.chance(self.faults.dup) {
            2
        } else {
            1
        };
        let hold = (self.hold)(&sent);
        for _ in 0..copies {
            let jitter = self.faults.jitter.as_nanos() as u64;
            let mut d = self.faults.delay + Duration::from_nanos(self.rng.below(jitter + 1));
            if self.rng.chance(self.faults.reorder) {
                d += self.faults.jitter * 3;
            }
            self.order += 1;
            let mut at = self.now + d;
            if self.faults.spacing > Duration::ZERO {
                let queued = self.faults.spacing * self.faults.queue as u32;
                if self.faults.queue > 0 && self.link_free[from] > at + queued {
                    self.queue_drops += 1;
                    continue;
                }
                at = at.max(self.link_free[from] + self.faults.spacing);
                self.link_free[from] = at;
            }
            at = at + hold;
            let mut bytes = bytes.clone();
            // Drawn only when asked for, so that other tests keep their sequences.
            if self.faults.corrupt > 0.0 && self.rng.chance(self.faults.corrupt) {
                let bit = self.rng.below(bytes.len() as u64 * 8) as usize;
                bytes[bit / 8] ^= 1 << (bit % 8);
            }
            self.wire.push(InFlight {
                at,
                order: self.order,
                to: 1 - from,
                bytes,
            });
        }
    }

    /// Hands a segment to end `to` as a receiver would: only if its header is
    /// sound and its checksum over the pseudo-header verifies.
    fn deliver(&mut self, to: usize, bytes: &[u8]) {
        let Ok(p) = TcpPacket::new_checked(bytes) else {
            self.corrupted += 1;
            return;
        };
        match TcpRepr::parse(&p, *ADDR[1 - to].ip(), *ADDR[to].ip()) {
            Ok(r) => self.inject(to, &r),
            Err(_) => self.corrupted += 1,
        }
    }

    /// Hands `r` to end `to`, or to its listener.
    fn inject(&mut self, to: usize, r: &TcpRepr) {
        let now = self.now;
        let open = self.ends[to]
            .as_ref()
            .is_some_and(|c| c.state() != TcpState::Closed);
        if let (Some(cfg), true, false) = (self.listener.clone(), self.cookies && to == 1, open) {
            self.cookie_listener(&cfg, r);
            return;
        }
        match (&mut self.ends[to], &self.listener) {
            (Some(c), _) if c.state() != TcpState::Closed => c.handle_segment(r, now),
            (_, Some(cfg)) if to == 1 => {
                let iss = self
                    .listener_iss
                    .unwrap_or_else(|| initial_sequence_number(&KEY, ADDR[1], ADDR[0], now));
                let offset = timestamp_offset(&KEY, ADDR[1], ADDR[0]);
                match Connection::accept(cfg.clone(), ADDR[1], ADDR[0], iss, r) {
                    Some(c) => self.ends[1] = Some(c.with_timestamp_offset(offset)),
                    None => self.reply_closed(to, r),
                }
            }
            _ => self.reply_closed(to, r),
        }
    }

    /// A listener at end 1 in SYN-cookie mode, as the socket layer's when its SYN
    /// queue is full: a SYN gets a SYN-ACK and leaves nothing behind, an ACK with
    /// a valid cookie makes the connection, anything else gets a RST.
    fn cookie_listener(&mut self, cfg: &TcpConfig, r: &TcpRepr) {
        let now = self.now;
        if r.flags & (flags::SYN | flags::ACK | flags::RST) == flags::SYN {
            let mut buf = [0u8; 60];
            let n =
                syn_cookie_reply(cfg, &KEY, ADDR[1], ADDR[0], r, now, &mut buf).expect("a SYN-ACK");
            self.put(1, buf[..n].to_vec());
        } else if let Some(c) = syn_cookie_accept(cfg.clone(), &KEY, ADDR[1], ADDR[0], r, now) {
            self.ends[1] = Some(c);
        } else {
            self.reply_closed(1, r);
        }
    }

    fn reply_closed(&mut self, at: usize, r: &TcpRepr) {
        if let Some(rst) = reset_for_closed(r) {
            let mut buf = vec![0; rst.buffer_len()];
            rst.emit(&mut buf, *ADDR[at].ip(), *ADDR[1 - at].ip())
                .unwrap();
            self.put(at, buf);
        }
    }

    /// Lets the applications act, sends what the ends have, then advances to the
    /// next event and handles it. False when nothing is left to happen.
    fn step(&mut self) -> bool {
        self.lend_memory();
        self.run_apps();
        self.flush();
        let next = self
            .wire
            .iter()
            .map(|s| s.at)
            .chain(
                self.ends
                    .iter()
                    .flatten()
                    .filter_map(Connection::poll_timeout),
            )
            .chain(
                self.referenced
                    .iter()
                    .filter_map(|r| r.front().map(|r| r.0)),
            )
            .min();
        let Some(next) = next else { return false };
        self.now = self.now.max(next);
        self.wire.sort_by_key(|s| (s.at, s.order));
        let due = self.wire.iter().take_while(|s| s.at <= self.now).count();
        for s in self.wire.drain(..due).collect::<Vec<_>>() {
            self.deliver(s.to, &s.bytes);
        }
        let now = self.now;
        for c in self.ends.iter_mut().flatten() {
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
        }
        for i in 0..2 {
            self.time_waited[i] |= self.state(i) == TcpState::TimeWait;
        }
        true
    }

    /// Steps until `done` holds (true) or nothing is left to do or the time passes
    /// `limit` (false).
    fn run_until(&mut self, limit: Time, done: impl Fn(&Net) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.now > limit || !self.step() {
                return done(self);
            }
        }
    }

    fn established(&self) -> bool {
        self.state(0) == TcpState::Established && self.state(1) == TcpState::Established
    }

    fn both_closed(&self) -> bool {
        self.state(0) == TcpState::Closed && self.state(1) == TcpState::Closed
    }
}

fn fast_config() -> TcpConfig {
    TcpConfig {
        min_rto: ms(200),
        initial_rto: ms(200),
        msl: secs(1),
        ..TcpConfig::default()
    }
}

/// Both ends send `sizes[i]` bytes and close; checks that everything arrives and that
/// both close cleanly, and returns the network afterwards.
fn transfer(seed: u64, faults: Faults, sizes: [usize; 2], a: TcpConfig, b: TcpConfig) -> Net {
    transfer_with(Net::client_server(seed, faults, a, b), sizes, 0)
}

/// [`transfer`] on a prepared network, reading at most `read_chunk` bytes per step.
fn transfer_with(mut n: Net, sizes: [usize; 2], read_chunk: usize) -> Net {
    for (i, app) in n.apps.iter_mut().enumerate() {
        app.read_chunk = read_chunk;
        app.out = pattern(sizes[i], i as u8 * 0x55);
        app.close_when_written = true;
        app.read = true;
    }
    let limit = Time::ZERO + secs(3600);
    assert!(
        n.run_until(limit, |n| n.both_closed() && n.ends[1].is_some()),
        "not closed: {:?} {:?} {:?} at {:?}",
        n.state(0),
        n.state(1),
        n.ends[0].as_ref().map(Connection::error),
        n.now,
    );
    // A slow reader still has data to take after the connection is gone.
    while n.ends.iter().flatten().any(|c| c.recv_queue_len() > 0) {
        n.run_apps();
    }
    for i in 0..2 {
        assert_eq!(n.conn(i).error(), None);
        assert!(
            n.apps[1 - i].got == n.apps[i].out,
            "stream from {i} damaged"
        );
    }
    n
}

#[test]
fn transfer_both_ways_and_clean_close() {
    let n = transfer(
        1,
        Faults {
            delay: ms(5),
            ..Faults::default()
        },
        [300_000, 100_000],
        fast_config(),
        fast_config(),
    );
    // The handshake: SYN, SYN-ACK, ACK, each SYN with an MSS option of 1460.
    let (syn, synack) = (n.log[0], n.log[1]);
    assert!(syn.has(flags::SYN) && !syn.has(flags::ACK) && syn.from == 0);
    assert!(synack.has(flags::SYN | flags::ACK) && synack.ack == syn.seq.wrapping_add(1));
    assert!(n.log.iter().filter(|s| s.len > 0).all(|s| s.len <= 1448));
    // 1460 less the 12 bytes of timestamps on every segment (RFC 6691).
    assert_eq!(n.conn(0).send_mss(), 1448);
    assert!(n.conn(0).timestamps() && n.conn(1).timestamps());
    // Nothing was lost, so nothing was sent twice.
    let data: Vec<_> = n.log.iter().filter(|s| s.len > 0).collect();
    let mut seqs: Vec<_> = data.iter().map(|s| (s.from, s.seq)).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), data.len());
    // 20 ms handshake RTT measured, RTO at its floor.
    assert_eq!(n.conn(0).srtt().map(|d| d >= ms(10)), Some(true));
}

/// A send buffer in lent memory: data goes out referenced, never copied
/// (beyond what fits the header buffer), through loss, reordering and
/// duplication, and across the ring's wrap at odd offsets; a referenced byte
/// stays as it was until its segment is done, although the peer acknowledged
/// it and the application writes on.
#[test]
fn lent_send_buffer_sends_by_reference() {
    let faults = Faults {
        loss: 0.03,
        dup: 0.02,
        reorder: 0.1,
        delay: ms(5),
        jitter: ms(2),
        spacing: Duration::from_micros(12),
        corrupt: 0.0,
        queue: 0,
    };
    for lend in [2_999, 65_536] {
        let mut n = Net::client_server(3, faults, fast_config(), fast_config());
        n.lend = [Some(lend), Some(lend + 1)];
        // Past the round trip: the peer's ACK comes first.
        n.reference_hold = ms(15);
        let n = transfer_with(n, [500_000, 300_000], 0);
        for i in 0..2 {
            let c = n.conn(i);
            assert!(c.sends_by_reference());
            assert!(c.stats().retransmitted > 0);
        }
        // Full segments were referenced: no copy of 1448 bytes fits 96.
        let full = n
            .log
            .iter()
            .filter(|s| s.from == 0 && s.len == 1448)
            .count();
        assert!(full > 200, "{full} full segments");
    }
}

/// Through a link with segmentation offload, bulk data leaves in
/// super-segments of whole segments, cut before the wire, and arrives intact
/// through loss, duplication and reordering; a peer whose MSS is below the
/// link's cut gets none (the cut would exceed it).
#[test]
fn super_segments_through_a_lossy_network() {
    let faults = Faults {
        loss: 0.02,
        dup: 0.01,
        reorder: 0.05,
        delay: ms(5),
        jitter: ms(1),
        spacing: Duration::from_micros(12),
        corrupt: 0.0,
        queue: 0,
    };
    let mut n = Net::client_server(11, faults, fast_config(), fast_config());
    n.lend = [Some(300_000), Some(300_001)];
    n.tso = true;
    let n = transfer_with(n, [2_000_000, 1_000_000], 0);
    assert!(n.supers[0] > 20 && n.supers[1] > 10, "{:?}", n.supers);
    assert!(n.conn(0).stats().retransmitted > 0);
    // Every segment on the wire fits the cut: 1480 − 32 bytes of data.
    assert!(n.log.iter().all(|s| s.len <= 1448));

    let small = TcpConfig {
        mss: 1000,
        ..fast_config()
    };
    let mut n = Net::client_server(12, quiet(), fast_config(), small);
    n.lend = [Some(300_000), None];
    n.tso = true;
    let n = transfer_with(n, [500_000, 0], 0);
    assert_eq!(n.supers[0], 0);
}

#[test]
fn lossy_network_delivers_intact() {
    let faults = Faults {
        loss: 0.05,
        dup: 0.03,
        reorder: 0.1,
        delay: ms(10),
        jitter: ms(4),
        spacing: Duration::from_micros(12),
        corrupt: 0.0,
        queue: 0,
    };
    let n = transfer(7, faults, [400_000, 200_000], fast_config(), fast_config());
    // Losses were repaired by sending again.
    let data: Vec<_> = n.log.iter().filter(|s| s.len > 0).collect();
    let mut seqs: Vec<_> = data.iter().map(|s| (s.from, s.seq)).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert!(seqs.len() < data.len());
    let st = n.conn(0).stats();
    assert!(st.retransmitted > 0 && st.fast_retransmits > 0);
    // With timestamps, the default: samples from the echoes all along.
    assert!(n.conn(0).timestamps() && st.ts_rtt_samples > 100);
    assert_eq!(
        st.segments_sent,
        n.log.iter().filter(|s| s.from == 0).count() as u64
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random loss, duplication and reordering never damage either stream.
    #[test]
    fn random_faults_never_damage_streams(
        seed: u64,
        loss in 0.0f64..0.25,
        dup in 0.0f64..0.2,
        reorder in 0.0f64..0.3,
        a_len in 0usize..40_000,
        b_len in 0usize..40_000,
        nagle: bool,
        delayed_ack: bool,
        ack_on_read: bool,
        hold_handshake_ack: bool,
        mss in 100u16..1460,
        recv_buffer in 200usize..300_000,
        read_chunk in 0usize..3000,
        iss: u32,
        spacing_us in 0u64..50,
        window_scaling: bool,
        timestamps in 0u8..4,
        sack in 0u8..4,
        rack: bool,
        cubic: bool,
        hystart: bool,
        corrupt in 0.0f64..0.05,
        lend in proptest::option::of(1usize..20_000),
        lend_b in proptest::option::of(1usize..20_000),
    ) {
        let spacing = Duration::from_micros(spacing_us);
        let faults = Faults {
            loss,
            dup,
            reorder,
            delay: ms(3),
            jitter: ms(2),
            spacing,
            corrupt,
            queue: 0,
        };
        let cfg = TcpConfig {
            nagle,
            mss,
            recv_buffer,
            delayed_ack: delayed_ack.then_some(ms(40)),
            ack_on_read,
            hold_handshake_ack,
            window_scaling,
            timestamps: timestamps & 1 != 0,
            sack: sack & 1 != 0,
            rack,
            congestion: if cubic { Congestion::Cubic } else { Congestion::NewReno },
            hystart,
            // A quarter of segments lost with two-segment windows costs a timeout
            // per loss: backoff to a minute would outlast the hour allowed, and
            // seven tries may not get a SYN and its SYN-ACK through.
            max_rto: secs(5),
            max_syn_retransmissions: 15,
            ..fast_config()
        };
        let cfg_b = TcpConfig {
            timestamps: timestamps & 2 != 0,
            sack: sack & 2 != 0,
            ..cfg.clone()
        };
        let mut n = Net::client_server(seed, faults, cfg, cfg_b);
        n.lend = [lend, lend_b];
        // Sequence numbers near the wrap, often.
        n.listener_iss = Some(SeqNum(iss | 0xffff_0000));
        // The simulated reader acts only when something happens, so one that takes
        // less than the SWS threshold per step would stall on the (correctly)
        // unannounced window; a real reader goes on reading between events.
        let read_chunk = match read_chunk {
            0 => 0,
            c => c.max(usize::from(mss).min(recv_buffer / 2)),
        };
        transfer_with(n, [a_len, b_len], read_chunk);
    }
}

fn at(s: Duration) -> Time {
    Time::ZERO + s
}

fn quiet() -> Faults {
    Faults {
        delay: ms(5),
        ..Faults::default()
    }
}

/// A connection set up over a 5 ms link and idle.
fn established_pair(a: TcpConfig, b: TcpConfig) -> Net {
    let mut n = Net::client_server(3, quiet(), a, b);
    n.apps[1].read = true;
    n.apps[0].read = true;
    assert!(n.run_until(at(secs(1)), Net::established));
    n.run_until(at(secs(1)), |n| n.wire.is_empty());
    n
}

/// The last segment end `i` sent.
fn last_from(n: &Net, i: usize) -> Sent {
    *n.log.iter().rev().find(|s| s.from == i).expect("a segment")
}

/// RCV.NXT and SND.NXT of end 1 of an idle pair, read off end 0's last segment.
fn b_view(n: &Net) -> (u32, u32) {
    let a = last_from(n, 0);
    (a.seq, a.ack)
}

/// A segment from end `from`'s port to the other's.
fn forged(from: usize, seq: u32, ack: u32, f: u8, payload: &[u8]) -> TcpRepr<'_> {
    TcpRepr {
        src_port: ADDR[from].port(),
        dst_port: ADDR[1 - from].port(),
        seq_number: seq,
        ack_number: ack,
        flags: f,
        window: 1000,
        urgent_ptr: 0,
        options: &[],
        payload,
    }
}

/// Injects `r` into end `to` and returns what it sends in reply.
fn answer(n: &mut Net, to: usize, r: &TcpRepr) -> Vec<Sent> {
    let before = n.log.len();
    n.inject(to, r);
    n.flush();
    n.log[before..].to_vec()
}

#[test]
fn half_close() {
    let mut n = Net::client_server(5, quiet(), fast_config(), fast_config());
    n.apps[0] = App {
        out: pattern(10_000, 1),
        close_when_written: true,
        read: true,
        ..App::default()
    };
    n.apps[1].read = true;
    assert!(
        n.run_until(at(secs(10)), |n| n.state(1) == TcpState::CloseWait
            && n.conn(1).recv_finished())
    );
    assert!(n.apps[1].got == n.apps[0].out);
    assert!(n.run_until(at(secs(10)), |n| n.state(0) == TcpState::FinWait2));
    // The half-closed end still takes data.
    n.apps[1].out = pattern(50_000, 2);
    n.apps[1].close_when_written = true;
    assert!(n.run_until(at(secs(20)), |n| n.state(0) == TcpState::TimeWait));
    let entered = n.now;
    n.run_apps();
    assert!(n.apps[0].got == n.apps[1].out);
    assert!(n.conn(0).recv_finished());
    // TIME-WAIT lasts exactly 2 × MSL.
    assert!(n.run_until(at(secs(60)), Net::both_closed));
    assert_eq!(n.now, entered + 2 * fast_config().msl);
    assert_eq!((n.conn(0).error(), n.conn(1).error()), (None, None));
}

#[test]
fn simultaneous_open() {
    let mut n = Net::new(9, quiet());
    for i in 0..2 {
        let iss = initial_sequence_number(&KEY, ADDR[i], ADDR[1 - i], n.now);
        n.ends[i] = Some(Connection::connect(
            fast_config(),
            ADDR[i],
            ADDR[1 - i],
            iss,
        ));
        n.apps[i] = App {
            out: pattern(20_000, i as u8),
            close_when_written: true,
            read: true,
            ..App::default()
        };
    }
    // Both SYNs cross; each end answers the other's with a SYN-ACK.
    assert!(
        n.run_until(at(secs(1)), |n| n.state(0) == TcpState::SynReceived
            && n.state(1) == TcpState::SynReceived)
    );
    assert!(n.run_until(at(secs(60)), Net::both_closed));
    let syns: Vec<_> = n.log.iter().filter(|s| s.has(flags::SYN)).collect();
    assert_eq!(syns.len(), 4);
    assert!(syns[..2].iter().all(|s| !s.has(flags::ACK)));
    assert!(syns[2..].iter().all(|s| s.has(flags::ACK)));
    for i in 0..2 {
        assert!(n.apps[1 - i].got == n.apps[i].out);
        assert_eq!(n.conn(i).error(), None);
    }
}

#[test]
fn simultaneous_close() {
    let mut n = established_pair(fast_config(), fast_config());
    n.conn_mut(0).close();
    n.conn_mut(1).close();
    assert_eq!(
        (n.state(0), n.state(1)),
        (TcpState::FinWait1, TcpState::FinWait1)
    );
    // The FINs cross: each end sees the other's before the ACK of its own.
    assert!(n.run_until(at(secs(2)), |n| n.state(0) == TcpState::Closing
        && n.state(1) == TcpState::Closing));
    assert!(
        n.run_until(at(secs(2)), |n| n.state(0) == TcpState::TimeWait
            && n.state(1) == TcpState::TimeWait)
    );
    let entered = n.now;
    assert!(n.run_until(at(secs(10)), Net::both_closed));
    assert_eq!(n.now, entered + 2 * fast_config().msl);
}

#[test]
fn rst_checks_follow_rfc5961() {
    let mut n = established_pair(fast_config(), fast_config());
    let (rcv_nxt, snd_nxt) = b_view(&n);
    // In the window but not exact: a challenge ACK, the connection stays.
    let reply = answer(
        &mut n,
        1,
        &forged(0, rcv_nxt.wrapping_add(1000), 0, flags::RST, &[]),
    );
    assert_eq!(reply.len(), 1);
    assert_eq!(
        (reply[0].flags, reply[0].seq, reply[0].ack),
        (flags::ACK, snd_nxt, rcv_nxt)
    );
    assert_eq!(n.state(1), TcpState::Established);
    // Outside the window, either side: ignored without a word.
    for seq in [
        rcv_nxt.wrapping_add(70_000),
        rcv_nxt.wrapping_sub(1),
        rcv_nxt ^ 0x8000_0000,
    ] {
        assert!(answer(&mut n, 1, &forged(0, seq, 0, flags::RST | flags::ACK, &[])).is_empty());
        assert_eq!(n.state(1), TcpState::Established);
    }
    // The challenge ACK reached the real peer, which takes it in stride.
    n.run_until(at(secs(2)), |n| n.wire.is_empty());
    assert!(n.established());
    // Exactly RCV.NXT: reset.
    assert!(answer(&mut n, 1, &forged(0, rcv_nxt, 0, flags::RST, &[])).is_empty());
    assert_eq!(
        (n.state(1), n.conn(1).error()),
        (TcpState::Closed, Some(TcpError::Reset))
    );
}

#[test]
fn syn_on_established_connection_gets_challenge_ack() {
    let mut n = established_pair(fast_config(), fast_config());
    let (rcv_nxt, snd_nxt) = b_view(&n);
    for seq in [rcv_nxt, rcv_nxt.wrapping_add(10), 12345] {
        let reply = answer(&mut n, 1, &forged(0, seq, 0, flags::SYN, &[]));
        assert_eq!(reply.len(), 1);
        assert_eq!(
            (reply[0].flags, reply[0].seq, reply[0].ack),
            (flags::ACK, snd_nxt, rcv_nxt)
        );
        assert_eq!(n.state(1), TcpState::Established);
    }
    n.run_until(at(secs(2)), |n| n.wire.is_empty());
    assert!(n.established());
}

#[test]
fn blind_data_and_acks_outside_the_window_are_dropped() {
    let mut n = established_pair(fast_config(), fast_config());
    let (rcv_nxt, snd_nxt) = b_view(&n);
    // Data outside the window and an ACK of data never sent: an ACK in reply,
    // nothing delivered.
    let out_of_window = forged(
        0,
        rcv_nxt.wrapping_add(100_000),
        snd_nxt,
        flags::ACK,
        b"evil",
    );
    let unsent = forged(0, rcv_nxt, snd_nxt.wrapping_add(5000), flags::ACK, b"evil");
    for r in [out_of_window, unsent] {
        let reply = answer(&mut n, 1, &r);
        assert_eq!(reply.len(), 1);
        assert_eq!((reply[0].seq, reply[0].ack), (snd_nxt, rcv_nxt));
    }
    assert_eq!(n.conn(1).recv_queue_len(), 0);
    assert!(n.established());
}

#[test]
fn closed_port_refuses() {
    let mut n = Net::new(2, quiet());
    let iss = SeqNum(1000);
    n.ends[0] = Some(Connection::connect(fast_config(), ADDR[0], ADDR[1], iss));
    assert!(n.run_until(at(secs(1)), |n| n.state(0) == TcpState::Closed));
    assert_eq!(n.conn(0).error(), Some(TcpError::Refused));
    let rst = last_from(&n, 1);
    assert_eq!(
        (rst.flags, rst.seq, rst.ack),
        (flags::RST | flags::ACK, 0, 1001)
    );
    // An unrelated RST with a wrong ACK in SYN-SENT is not believed.
    let mut c = Connection::connect(fast_config(), ADDR[0], ADDR[1], iss);
    let mut buf = [0; 100];
    c.poll_transmit(Time::ZERO, &mut buf).unwrap();
    c.handle_segment(
        &forged(1, 0, 5000, flags::RST | flags::ACK, &[]),
        Time::ZERO,
    );
    assert_eq!(c.state(), TcpState::SynSent);
}

#[test]
fn syn_retransmission_backoff_then_timeout() {
    let mut n = Net::client_server(4, quiet(), TcpConfig::default(), TcpConfig::default());
    n.pass = Box::new(|_| false);
    assert!(n.run_until(at(secs(1000)), |n| n.state(0) == TcpState::Closed));
    let times: Vec<u64> = n
        .log
        .iter()
        .map(|s| s.at.as_nanos() / 1_000_000_000)
        .collect();
    // RFC 6298: 1 s, doubling; six retransmissions (the default limit).
    assert_eq!(times, [0, 1, 3, 7, 15, 31, 63]);
    let st = n.conn(0).stats();
    assert_eq!((st.timeouts, st.retransmitted, st.segments_sent), (7, 6, 7));
    assert!(n.log.iter().all(|s| s.flags == flags::SYN));
    // The seventh timeout, after 60 s (the RTO's cap), gives up.
    assert_eq!(n.now, at(secs(123)));
    assert_eq!(n.conn(0).error(), Some(TcpError::TimedOut));
}

#[test]
fn data_retransmission_backoff_then_timeout() {
    // The timer alone: no tail loss probe ahead of it.
    let cfg = TcpConfig {
        max_rto: secs(10),
        max_retransmissions: 5,
        tail_loss_probe: false,
        ..TcpConfig::default()
    };
    let mut n = established_pair(cfg.clone(), cfg);
    n.pass = Box::new(|s| s.len == 0);
    n.apps[0].out = pattern(1000, 0);
    assert!(n.run_until(at(secs(1000)), |n| n.state(0) == TcpState::Closed));
    let data: Vec<Time> = n.log.iter().filter(|s| s.len > 0).map(|s| s.at).collect();
    let t0 = data[0];
    let offsets: Vec<u64> = data
        .iter()
        .map(|t| t.saturating_duration_since(t0).as_secs())
        .collect();
    // RTO floor 1 s (the measured RTT is 10 ms), doubled, capped at 10 s.
    assert_eq!(offsets, [0, 1, 3, 7, 15, 25]);
    assert_eq!(n.now, t0 + secs(35));
    assert_eq!(n.conn(0).error(), Some(TcpError::TimedOut));
}

#[test]
fn zero_window_probes_then_window_update() {
    let a = TcpConfig {
        max_rto: secs(2),
        max_retransmissions: 3,
        ..fast_config()
    };
    // Without auto-tuning the window scale is 0 and the window exact to the byte.
    let b = TcpConfig {
        recv_buffer: 4096,
        recv_buffer_max: 0,
        ..fast_config()
    };
    let mut n = established_pair(a, b);
    n.apps[1].read = false;
    n.apps[0].out = pattern(20_000, 3);
    n.apps[0].close_when_written = true;
    assert!(n.run_until(at(secs(2)), |n| n.conn(1).recv_queue_len() == 4096));
    n.flush();
    assert!(n.log.iter().any(|s| s.from == 1 && s.window == 0));
    // Probe for 20 s: far more probes than the retransmission limit, but each is
    // answered, so the connection lives (RFC 9293 §3.8.6.1).
    let start = n.log.len();
    let shut = n.now;
    n.run_until(shut + secs(20), |_| false);
    assert_eq!(n.state(0), TcpState::FinWait1);
    let probes: Vec<Time> = n.log[start..]
        .iter()
        .filter(|s| s.from == 0 && s.len == 1)
        .map(|s| s.at)
        .collect();
    let gaps: Vec<u64> = probes
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]).as_millis() as u64)
        .collect();
    assert_eq!(gaps[..4], [400, 800, 1600, 2000]);
    assert!(gaps[4..].iter().all(|&g| g == 2000));
    assert!(probes.len() > 5);
    // Every probe is answered with the zero window.
    assert!(n.log[start..]
        .iter()
        .filter(|s| s.from == 1)
        .all(|s| s.window == 0));
    // The application reads: a window update, and the rest flows.
    n.apps[1].read = true;
    n.apps[1].close_when_written = true;
    assert!(n.run_until(n.now + secs(10), Net::both_closed));
    assert!(n.apps[1].got == n.apps[0].out);
    assert_eq!(n.conn(0).error(), None);
}

#[test]
fn mss_option_and_clamping() {
    let small = TcpConfig {
        mss: 1000,
        ..fast_config()
    };
    let n = transfer(6, quiet(), [30_000, 30_000], small, fast_config());
    // The smaller MSS less the timestamps option.
    assert_eq!((n.conn(0).send_mss(), n.conn(1).send_mss()), (988, 988));
    assert_eq!(n.log.iter().map(|s| s.len).max(), Some(988));
    // No option: 536 (RFC 9293 §3.7.1); a tiny one is raised to the floor.
    let syn = forged(0, 1, 0, flags::SYN, &[]);
    let c = Connection::accept(fast_config(), ADDR[1], ADDR[0], SeqNum(9), &syn).unwrap();
    assert_eq!(c.send_mss(), 536);
    let opt = [2, 4, 0, 10];
    let c = Connection::accept(
        fast_config(),
        ADDR[1],
        ADDR[0],
        SeqNum(9),
        &TcpRepr {
            options: &opt,
            ..syn
        },
    )
    .unwrap();
    assert_eq!(c.send_mss(), 48);
    // Only a plain SYN opens a connection.
    assert!(Connection::accept(
        fast_config(),
        ADDR[1],
        ADDR[0],
        SeqNum(9),
        &forged(0, 1, 0, flags::SYN | flags::ACK, &[])
    )
    .is_none());
}

#[test]
fn delayed_ack() {
    // Alike on both ends, so that the sender's probe timeout waits for the delayed
    // ACK of a lone segment (RFC 8985 §7.2's WCDelAckT).
    let b = TcpConfig {
        delayed_ack: Some(ms(100)),
        ..fast_config()
    };
    let mut n = established_pair(b.clone(), b);
    // One segment: acknowledged when the delay runs out.
    n.apps[0].out = pattern(100, 0);
    n.step();
    n.run_until(n.now + secs(1), |n| {
        n.wire.is_empty() && n.conn(0).send_queue_len() == 0
    });
    let data = last_from(&n, 0);
    let ack = last_from(&n, 1);
    assert_eq!(ack.at, data.at + ms(5) + ms(100));
    // Two full segments: the second is acknowledged at once.
    let mss = n.conn(0).send_mss();
    n.apps[0].out.extend(pattern(2 * mss, 1));
    let before = n.log.len();
    n.step();
    n.run_until(n.now + secs(1), |n| {
        n.wire.is_empty() && n.conn(0).send_queue_len() == 0
    });
    let sent: Vec<_> = n.log[before..].to_vec();
    assert_eq!(
        sent.iter().filter(|s| s.from == 0 && s.len == mss).count(),
        2
    );
    let acks: Vec<_> = sent.iter().filter(|s| s.from == 1).collect();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].at, sent[0].at + ms(5));
    // A delay of a second is cut to under half a second.
    let slow = TcpConfig {
        delayed_ack: Some(secs(1)),
        ..fast_config()
    };
    // (The sender's RTO of 1 s outlasts the delay; a probe would not.)
    let sender = TcpConfig {
        tail_loss_probe: false,
        ..TcpConfig::default()
    };
    let mut n = established_pair(sender, slow);
    n.apps[0].out = pattern(100, 0);
    n.step();
    n.run_until(n.now + secs(2), |n| {
        n.wire.is_empty() && n.conn(0).send_queue_len() == 0
    });
    assert_eq!(last_from(&n, 1).at, last_from(&n, 0).at + ms(5) + ms(499));
}

/// End 1's ACKs (time since the send, ACK number) of three full segments
/// sent at once from end 0 and arriving 1 ms apart, with `ack_on_read` at
/// end 1, whose application starts to read at the first event `read_after`
/// the send or later (never: `None`); after a receive buffer's worth of
/// data if `warm`, else as the connection's first.
fn acks_of_three(
    ack_on_read: bool,
    read_after: Option<Duration>,
    warm: bool,
) -> Vec<(Duration, u32)> {
    let cfg = TcpConfig {
        // Under the sender's probe timeout (2·SRTT + 2 ms, 22 ms here) of a
        // flight of three.
        delayed_ack: Some(ms(10)),
        ack_on_read,
        ..fast_config()
    };
    let mut n = established_pair(cfg.clone(), cfg);
    if warm {
        // A receive buffer's worth, read: until then no ACK is held.
        let warm = n.conn(1).recv_buffer();
        n.apps[0].out = pattern(warm, 0);
        n.run_until(n.now + secs(5), |_| false);
        assert_eq!(n.apps[1].got.len(), warm);
    }
    n.faults.spacing = ms(1);
    n.apps[1].read = read_after == Some(Duration::ZERO);
    // Three segments: RFC 3390's initial window of 4380 bytes.
    let three = pattern(3 * n.conn(0).send_mss(), 1);
    n.apps[0].out.extend(three);
    let sent = n.now;
    let before = n.log.len();
    n.step();
    if let Some(after) = read_after {
        n.run_until(sent + secs(1), |n| n.now >= sent + after);
        n.apps[1].read = true;
    }
    n.run_until(n.now + secs(1), |n| {
        n.wire.is_empty() && n.conn(0).send_queue_len() == 0
    });
    n.log[before..]
        .iter()
        .filter(|s| s.from == 1)
        .map(|s| (s.at.saturating_duration_since(sent), s.ack))
        .collect()
}

/// `TcpConfig::ack_on_read`: the ACK owed for every second segment waits
/// for the application's read while it has not read what came (as Linux's),
/// and goes with that read, or at the delayed-ACK bound. A reader that keeps
/// up is acknowledged as without it, and so is the first receive buffer's
/// worth of a connection, while the sender's slow start needs the ACKs.
/// Off, every second segment at once.
#[test]
fn an_ack_waits_for_the_read_of_an_application_behind() {
    let strict = acks_of_three(false, None, true);
    let end = strict[1].1;
    let mss = 1448;
    // 5 ms of delay; the segments arrive at 5, 6 and 7 ms.
    assert_eq!(strict, [(ms(6), end - mss), (ms(17), end)], "{strict:?}");
    assert_eq!(acks_of_three(false, Some(Duration::ZERO), true), strict);
    assert_eq!(acks_of_three(true, Some(Duration::ZERO), true), strict);
    // Behind: nothing until the bound, or until the read.
    assert_eq!(acks_of_three(true, None, true), [(ms(15), end)]);
    assert_eq!(acks_of_three(true, Some(ms(7)), true), [(ms(7), end)]);
    // The connection's first segments: each full-sized one acknowledged at
    // once (quick ACKs), the odd last one of the flight too.
    let first = acks_of_three(true, None, false);
    let end = first[2].1;
    assert_eq!(
        first,
        [(ms(5), end - 2 * mss), (ms(6), end - mss), (ms(7), end)],
        "{first:?}"
    );
    assert_eq!(first, acks_of_three(false, None, false));
}

/// Quick ACKs end after `QUICK_ACKS` of them: a connection's first 40
/// full-sized segments, each arriving on its own, are acknowledged one by
/// one 16 times, then every second one, as later in a transfer.
#[test]
fn quick_acks_end_after_sixteen() {
    let cfg = TcpConfig {
        delayed_ack: Some(ms(10)),
        ack_on_read: true,
        ..fast_config()
    };
    let mut n = established_pair(cfg.clone(), cfg);
    n.faults.spacing = ms(1);
    n.apps[1].read = true;
    let mss = n.conn(0).send_mss();
    n.apps[0].out = pattern(40 * mss, 2);
    let before = n.log.len();
    n.run_until(n.now + secs(5), |n| n.apps[1].got.len() == 40 * mss);
    let acked: Vec<u32> = n.log[before..]
        .iter()
        .filter(|s| s.from == 1)
        .map(|s| s.ack)
        .collect();
    let steps: Vec<u32> = acked.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    let mss = mss as u32;
    assert!(steps[..15].iter().all(|&d| d == mss), "{steps:?}");
    assert!(steps[16..].iter().all(|&d| d == 2 * mss), "{steps:?}");
}

/// `TcpConfig::hold_handshake_ack`: the ACK of the peer's SYN-ACK waits for
/// the application's first write, 2 ms later here, whose segment carries
/// it; with nothing written it goes at the delayed-ACK bound, or at once
/// when the application turns to wait for the peer instead
/// (`release_held_ack`). Off, at once, and the data follows on its own.
#[test]
fn the_handshake_ack_waits_for_the_first_write() {
    // (hold, the application writes, it waits to read first)
    for (hold, write, release) in [
        (false, false, false),
        (false, true, false),
        (true, true, false),
        (true, false, false),
        (true, false, true),
    ] {
        let cfg = TcpConfig {
            delayed_ack: Some(ms(10)),
            hold_handshake_ack: hold,
            ..fast_config()
        };
        let mut n = Net::client_server(3, quiet(), cfg.clone(), cfg);
        n.apps[1].read = true;
        assert!(n.run_until(at(secs(1)), |n| n.state(0) == TcpState::Established));
        let established = n.now;
        if release {
            assert!(n.conn_mut(0).release_held_ack(), "nothing held");
        }
        n.flush();
        if write {
            n.now = established + ms(2);
            n.apps[0].out = pattern(100, 0);
        }
        n.run_until(at(secs(1)), |n| n.state(1) == TcpState::Established);
        n.run_until(n.now + secs(1), |n| {
            n.wire.is_empty() && n.apps[1].got.len() == n.apps[0].out.len()
        });
        let sent: Vec<(Time, usize)> = n
            .log
            .iter()
            .filter(|s| s.from == 0 && s.flags & flags::SYN == 0)
            .inspect(|s| assert!(s.flags & flags::ACK != 0))
            .map(|s| (s.at, s.len))
            .collect();
        let at_once = (established, 0);
        let with_write = (established + ms(2), 100);
        let expected = match (hold, write, release) {
            (false, false, _) | (true, false, true) => vec![at_once],
            (false, true, _) => vec![at_once, with_write],
            (true, true, _) => vec![with_write],
            (true, false, false) => vec![(established + ms(10), 0)],
        };
        assert_eq!(
            sent, expected,
            "hold {hold}, write {write}, release {release}"
        );
        assert_eq!(n.apps[1].got, n.apps[0].out);
    }
}

/// A receive buffer past the SYN's unscaled 64 KB: the window is already
/// more than twice what the peer knows after the handshake, which the first
/// read does not make news of (no pure ACK then: the delayed ACK carries
/// it). Reading a full buffer does: the zero-window tests.
#[test]
fn the_first_read_sends_no_window_update_of_its_own() {
    let b = TcpConfig {
        delayed_ack: Some(ms(100)),
        recv_buffer: 256 * 1024,
        ..fast_config()
    };
    let mut n = established_pair(b.clone(), b);
    n.apps[0].out = pattern(100, 0);
    let before = n.log.len();
    n.step();
    n.run_until(n.now + secs(1), |n| {
        n.wire.is_empty() && n.conn(0).send_queue_len() == 0
    });
    assert_eq!(n.apps[1].got, n.apps[0].out);
    let data = last_from(&n, 0);
    let acks: Vec<Sent> = n.log[before..]
        .iter()
        .filter(|s| s.from == 1)
        .copied()
        .collect();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(acks[0].at, data.at + ms(5) + ms(100));
    // The window it gives is the whole buffer, scaled.
    let scale = n.conn(1).recv_buffer() as u32 / u32::from(acks[0].window);
    assert!(scale > 1 && n.conn(1).recv_buffer() > 64 * 1024, "{scale}");
}

/// The ACK of the peer's FIN waits out the delayed-ACK bound (as Linux's
/// turn to delayed ACKs on a FIN): an application that closes meanwhile
/// sends one FIN+ACK instead of an ACK and a FIN. Without delayed ACKs, and
/// when the FIN closes our own side, at once.
#[test]
fn the_ack_of_a_fin_waits_for_the_applications_close() {
    for delay in [Some(ms(100)), None] {
        let cfg = TcpConfig {
            delayed_ack: delay,
            ..fast_config()
        };
        for closes in [false, true] {
            let mut n = established_pair(cfg.clone(), cfg.clone());
            n.apps[0].close_when_written = true;
            let before = n.log.len();
            assert!(n.run_until(n.now + secs(1), |n| n.state(1) == TcpState::CloseWait));
            let fin = last_from(&n, 0);
            assert!(fin.has(flags::FIN));
            if closes {
                n.conn_mut(1).close();
            }
            n.run_until(n.now + ms(300), |_| false);
            let from_b: Vec<Sent> = n.log[before..]
                .iter()
                .filter(|s| s.from == 1)
                .copied()
                .collect();
            let first = from_b[0];
            assert_eq!(first.ack, fin.seq + 1, "{delay:?} {closes}");
            match (delay, closes) {
                (Some(d), false) => {
                    assert_eq!(first.at, fin.at + ms(5) + d);
                    assert!(!first.has(flags::FIN));
                }
                (Some(_), true) => {
                    assert!(first.has(flags::FIN), "{from_b:?}");
                    assert_eq!(first.at, fin.at + ms(5));
                }
                (None, _) => assert_eq!(first.at, fin.at + ms(5)),
            }
        }
    }
    // A FIN that ends our side too (FIN-WAIT-2 to TIME-WAIT) is answered at
    // once: nothing of ours is left to carry it.
    let cfg = TcpConfig {
        delayed_ack: Some(ms(100)),
        ..fast_config()
    };
    let mut n = established_pair(cfg.clone(), cfg);
    n.apps[0].close_when_written = true;
    assert!(n.run_until(n.now + secs(1), |n| n.state(0) == TcpState::FinWait2));
    n.apps[1].close_when_written = true;
    assert!(n.run_until(n.now + secs(1), |n| n.state(0) == TcpState::TimeWait));
    let fin = last_from(&n, 1);
    n.run_until(n.now + ms(50), |_| false);
    let ack = last_from(&n, 0);
    assert_eq!((ack.ack, ack.at), (fin.seq + 1, fin.at + ms(5)));
}

#[test]
fn nagle_coalesces_small_writes() {
    for nagle in [true, false] {
        let cfg = TcpConfig {
            nagle,
            ..fast_config()
        };
        let mut n = established_pair(cfg.clone(), cfg);
        let before = n.log.len();
        for _ in 0..10 {
            assert_eq!(n.conn_mut(0).send(b"x"), 1);
            n.flush();
        }
        n.run_until(n.now + secs(1), |n| n.apps[1].got.len() == 10);
        let lens: Vec<usize> = n.log[before..]
            .iter()
            .filter(|s| s.from == 0 && s.len > 0)
            .map(|s| s.len)
            .collect();
        if nagle {
            assert_eq!(lens, [1, 9]);
        } else {
            assert_eq!(lens, [1; 10]);
        }
    }
}

#[test]
fn sequence_numbers_wrap_during_transfer() {
    let mut n = Net::client_server(8, quiet(), fast_config(), fast_config());
    n.ends[0] = Some(Connection::connect(
        fast_config(),
        ADDR[0],
        ADDR[1],
        SeqNum(u32::MAX - 5000),
    ));
    n.listener_iss = Some(SeqNum(u32::MAX - 100));
    let n = transfer_with(n, [300_000, 300_000], 0);
    for i in 0..2 {
        let data = n.log.iter().filter(|s| s.from == i && s.len > 0);
        assert!(data.clone().any(|s| s.seq > u32::MAX - 10_000));
        assert!(data.clone().any(|s| s.seq < 100_000));
    }
}

#[test]
fn lost_syn_ack_is_sent_again_and_rto_restarts_at_3s() {
    let mut n = Net::client_server(10, quiet(), TcpConfig::default(), TcpConfig::default());
    let mut dropped = false;
    n.pass = Box::new(move |s| {
        let first_synack = s.has(flags::SYN | flags::ACK) && s.from == 1 && !dropped;
        dropped |= first_synack;
        !first_synack
    });
    assert!(n.run_until(at(secs(10)), Net::established));
    let synacks: Vec<Time> = n
        .log
        .iter()
        .filter(|s| s.from == 1 && s.has(flags::SYN))
        .map(|s| s.at)
        .collect();
    // The client's SYN after 1 s finds the server in SYN-RECEIVED, which answers at
    // once instead of waiting for its own timer.
    assert_eq!(synacks, [at(ms(5)), at(ms(1005))]);
    assert_eq!(n.now, at(ms(1015)));
    // RFC 6298 §5.7: the client retransmitted its SYN, so its RTO is 3 s.
    assert_eq!(n.conn(0).rto(), secs(3));
    // The SYN-ACK echoes the second SYN's timestamp (the server took it as covering
    // Last.ACK.sent), so the client measured the true 10 ms, not 1010 ms.
    assert_eq!(n.conn(0).srtt(), Some(ms(10)));
    // RFC 5681 §3.1: and its initial window is one segment.
    n.apps[0].out = pattern(10_000, 0);
    n.run_until(n.now + secs(1), |n| n.apps[1].got.len() == 10_000);
    let data = data_from_a(&n);
    assert_eq!(data.iter().filter(|d| d.0 == data[0].0).count(), 1);
}

#[test]
fn karn_takes_no_sample_from_retransmitted_data() {
    // Without timestamps: with them, every ACK is a sample (see
    // `timestamps_time_retransmitted_segments`).
    let cfg = TcpConfig {
        timestamps: false,
        tail_loss_probe: false,
        ..fast_config()
    };
    let mut n = established_pair(cfg.clone(), cfg);
    let srtt = n.conn(0).srtt();
    let mut dropped = false;
    n.pass = Box::new(move |s| {
        let first_data = s.from == 0 && s.len > 0 && !dropped;
        dropped |= first_data;
        !first_data
    });
    n.apps[0].out = pattern(100, 0);
    n.step();
    assert!(n.run_until(n.now + secs(5), |n| n.apps[1].got.len() == 100
        && n.conn(0).send_queue_len() == 0));
    // The one segment went twice, so its ACK measured nothing; the backoff stays.
    assert_eq!(n.log.iter().filter(|s| s.len > 0).count(), 2);
    assert_eq!(n.conn(0).srtt(), srtt);
    assert_eq!(n.conn(0).rto(), ms(400));
    // The next segment, sent once, gives a sample and clears the backoff.
    n.apps[0].out.extend(pattern(100, 1));
    n.step();
    assert!(n.run_until(n.now + secs(5), |n| n.conn(0).send_queue_len() == 0));
    assert_eq!(n.conn(0).rto(), ms(200));
}

#[test]
fn abort_resets_the_peer() {
    let mut n = established_pair(fast_config(), fast_config());
    n.conn_mut(0).send(b"unsent data is dropped");
    n.conn_mut(0).abort();
    assert_eq!((n.state(0), n.conn(0).error()), (TcpState::Closed, None));
    assert!(n.run_until(at(secs(2)), |n| n.state(1) == TcpState::Closed));
    assert_eq!(n.conn(1).error(), Some(TcpError::Reset));
    let rst = last_from(&n, 0);
    assert_eq!(rst.flags, flags::RST);
    assert!(n.apps[1].got.is_empty());
}

#[test]
fn time_wait_acks_a_retransmitted_fin_and_restarts() {
    let mut n = established_pair(fast_config(), fast_config());
    n.conn_mut(0).close();
    assert!(n.run_until(at(secs(2)), |n| n.state(1) == TcpState::CloseWait));
    n.conn_mut(1).close();
    // The ACK of B's FIN is lost once: B sends the FIN again, A in TIME-WAIT
    // acknowledges it and waits 2 MSL from then.
    let mut dropped = false;
    n.pass = Box::new(move |s| {
        let drop = s.from == 0 && !dropped;
        dropped |= drop;
        !drop
    });
    assert!(n.run_until(at(secs(5)), |n| n.state(0) == TcpState::TimeWait));
    let first = n.now;
    assert!(n.run_until(at(secs(5)), |n| n.state(1) == TcpState::Closed));
    let fins: Vec<_> = n
        .log
        .iter()
        .filter(|s| s.from == 1 && s.has(flags::FIN))
        .collect();
    assert_eq!(fins.len(), 2);
    let again = fins[1].at + ms(5);
    assert!(again > first);
    assert!(n.run_until(at(secs(10)), Net::both_closed));
    assert_eq!(n.now, again + 2 * fast_config().msl);
}

#[test]
fn close_before_the_handshake() {
    // In SYN-SENT, CLOSE just forgets the connection.
    let mut c = Connection::connect(fast_config(), ADDR[0], ADDR[1], SeqNum(1));
    c.close();
    assert_eq!(c.state(), TcpState::Closed);
    assert_eq!(c.poll_transmit(Time::ZERO, &mut [0; 100]), None);
    // In SYN-RECEIVED, the FIN waits for the handshake; data on the SYN is not taken.
    let mut n = Net::client_server(11, quiet(), fast_config(), fast_config());
    let mut b = None;
    while b.is_none() {
        n.step();
        b = n.ends[1].take();
    }
    let mut b = b.unwrap();
    b.close();
    assert_eq!(b.state(), TcpState::SynReceived);
    n.ends[1] = Some(b);
    n.apps[0].read = true;
    assert!(
        n.run_until(at(secs(2)), |n| n.state(1) == TcpState::FinWait2
            && n.state(0) == TcpState::CloseWait)
    );
    let syn = forged(0, 7, 0, flags::SYN, b"early");
    let mut c = Connection::accept(fast_config(), ADDR[1], ADDR[0], SeqNum(1), &syn).unwrap();
    let mut buf = [0; 100];
    let len = c.poll_transmit(Time::ZERO, &mut buf).unwrap();
    let p = TcpPacket::new_checked(&buf[..len]).unwrap();
    assert_eq!((p.ack_number(), c.recv_queue_len()), (8, 0));
}

#[test]
fn challenge_acks_are_rate_limited() {
    let cfg = TcpConfig {
        challenge_ack_limit: 10,
        ..fast_config()
    };
    let mut n = established_pair(fast_config(), cfg);
    let (rcv_nxt, _) = b_view(&n);
    let flood = |n: &mut Net| {
        (0..50u32)
            .map(|k| {
                answer(
                    n,
                    1,
                    &forged(0, rcv_nxt.wrapping_add(1 + k), 0, flags::RST, &[]),
                )
                .len()
            })
            .sum::<usize>()
    };
    assert_eq!(flood(&mut n), 10);
    assert_eq!(flood(&mut n), 0);
    let st = n.conn(1).stats();
    assert_eq!((st.challenge_acks, st.challenge_acks_suppressed), (10, 90));
    // A second later the allowance is back.
    n.now = n.now + secs(1);
    assert_eq!(flood(&mut n), 10);
    // Bare ACKs outside the window draw on the same allowance, so two ends that
    // disagree cannot ping-pong ACKs without end.
    n.now = n.now + secs(1);
    let (_, snd_nxt) = b_view(&n);
    let old = forged(0, rcv_nxt.wrapping_sub(5000), snd_nxt, flags::ACK, &[]);
    let replies: usize = (0..50).map(|_| answer(&mut n, 1, &old).len()).sum();
    assert_eq!(replies, 10);
    assert!(n.established());
}

#[test]
fn keepalive_probes_idle_peer_then_times_out() {
    let cfg = TcpConfig {
        keepalive: Some(Keepalive {
            idle: secs(10),
            interval: secs(1),
            probes: 3,
        }),
        ..fast_config()
    };
    let mut n = established_pair(cfg, fast_config());
    // The SYN-ACK, the last the client heard, took 5 ms.
    let heard = last_from(&n, 1).at + ms(5);
    let before = n.log.len();
    // A live peer answers each probe, which restarts the idle time.
    n.run_until(heard + secs(25), |_| false);
    let probes: Vec<Sent> = n.log[before..]
        .iter()
        .filter(|s| s.from == 0)
        .copied()
        .collect();
    let answers = n.log[before..].iter().filter(|s| s.from == 1).count();
    assert_eq!(probes.len(), 2);
    assert_eq!(answers, 2);
    assert_eq!(probes[0].at, heard + secs(10));
    assert_eq!(probes[1].at, heard + secs(20) + ms(10));
    // SND.NXT − 1: the client has sent only its SYN, at the ISS.
    assert_eq!(probes[0].seq, n.log[0].seq);
    assert_eq!(probes[0].len, 0);
    assert!(n.established());
    // A dead peer: three probes a second apart, then the connection fails.
    n.pass = Box::new(|_| false);
    let heard = heard + secs(20) + ms(10) + ms(10);
    let before = n.log.len();
    assert!(n.run_until(heard + secs(60), |n| n.state(0) == TcpState::Closed));
    let times: Vec<Time> = n.log[before..].iter().map(|s| s.at).collect();
    assert_eq!(
        times,
        [heard + secs(10), heard + secs(11), heard + secs(12)]
    );
    assert_eq!(n.now, heard + secs(13));
    assert_eq!(n.conn(0).error(), Some(TcpError::TimedOut));
}

/// Data segments end 0 sent: (time, seq, len).
fn data_from_a(n: &Net) -> Vec<(Time, u32, usize)> {
    n.log
        .iter()
        .filter(|s| s.from == 0 && s.len > 0)
        .map(|s| (s.at, s.seq, s.len))
        .collect()
}

#[test]
fn slow_start_from_the_initial_window() {
    // RFC 6928's 10 segments, and RFC 5681's 3 for 1448-byte segments.
    for (large_initial_window, expected) in [(true, [10, 20, 40, 80]), (false, [3, 6, 12, 24])] {
        let cfg = TcpConfig {
            large_initial_window,
            ..TcpConfig::default()
        };
        let mut n = established_pair(cfg.clone(), cfg);
        // Segments of a flight arrive apart, each acknowledged on its own.
        n.faults.spacing = Duration::from_micros(10);
        let size = 200 * n.conn(0).send_mss();
        n.apps[0].out = pattern(size, 0);
        n.step();
        assert!(n.run_until(n.now + secs(5), |n| n.apps[1].got.len() == size));
        // Flights a round trip (10 ms) apart: the initial window, then each
        // ACK releases two.
        let data = data_from_a(&n);
        let t0 = data[0].0;
        let flights: Vec<usize> = (0..4)
            .map(|k| {
                data.iter()
                    .filter(|d| {
                        d.0.saturating_duration_since(t0) >= ms(10 * k)
                            && d.0.saturating_duration_since(t0) < ms(10 * (k + 1))
                    })
                    .count()
            })
            .collect();
        assert_eq!(flights, expected, "{large_initial_window}");
    }
}

#[test]
fn the_window_restarts_from_the_initial_one_after_an_idle_rto() {
    // RFC 5681 §4.1. The round trip is 10 ms and the RTO at least 1 s.
    let mut n = established_pair(TcpConfig::default(), TcpConfig::default());
    n.faults.spacing = Duration::from_micros(10);
    let mss = n.conn(0).send_mss();
    let burst = |n: &mut Net, k: u8| {
        let start = n.log.len();
        n.apps[0].out.extend(pattern(200 * mss, k));
        let want = n.apps[0].out.len();
        n.step();
        assert!(n.run_until(n.now + secs(5), |n| n.apps[1].got.len() == want));
        assert!(n.run_until(n.now + secs(1), |n| n.wire.is_empty()));
        // Segments in the first round trip of the burst.
        let data: Vec<Time> = n.log[start..]
            .iter()
            .filter(|s| s.from == 0 && s.len > 0)
            .map(|s| s.at)
            .collect();
        data.iter().filter(|&&t| t < data[0] + ms(10)).count()
    };
    assert_eq!(burst(&mut n, 0), 10);
    // Half a second later the window is as the burst left it.
    n.now = n.now + ms(500);
    assert!(burst(&mut n, 1) > 100);
    // Two seconds later it starts again from 10 segments.
    n.now = n.now + secs(2);
    assert_eq!(burst(&mut n, 2), 10);
}

/// Drops the first transmission of end 0's data segments with these indices in the
/// stream, then checks that the transfer needed no timeout: every loss resent
/// within a second (the RTO floor), and nothing else sent twice.
fn recover_without_timeout(losses: &'static [u32], cfg: TcpConfig, spacing: Duration) -> Net {
    let mut n = established_pair(cfg.clone(), cfg);
    n.faults.spacing = spacing;
    let first = last_from(&n, 0).seq;
    let mss = n.conn(0).send_mss() as u32;
    let mut dropped = Vec::new();
    n.pass = Box::new(move |s| {
        let index = s.seq.wrapping_sub(first) / mss;
        let drop = s.from == 0 && s.len > 0 && losses.contains(&index) && !dropped.contains(&index);
        if drop {
            dropped.push(index);
        }
        !drop
    });
    n.apps[0].out = pattern(200_000, 0);
    n.step();
    assert!(n.run_until(n.now + secs(60), |n| n.apps[1].got.len() == 200_000));
    assert!(n.apps[1].got == n.apps[0].out);
    let data = data_from_a(&n);
    assert_eq!(
        data.len(),
        200_000usize.div_ceil(mss as usize) + losses.len()
    );
    let st = n.conn(0).stats();
    assert_eq!((st.timeouts, st.retransmitted), (0, losses.len() as u64));
    assert_eq!(st.fast_retransmits, losses.len() as u64);
    for &i in losses {
        let seq = first.wrapping_add(i * mss);
        let sent: Vec<Time> = data.iter().filter(|d| d.1 == seq).map(|d| d.0).collect();
        assert_eq!(sent.len(), 2);
        assert!(sent[1].saturating_duration_since(sent[0]) < secs(1));
    }
    n
}

fn no_sack() -> TcpConfig {
    TcpConfig {
        sack: false,
        ..TcpConfig::default()
    }
}

/// When end 0 sent the data segment at `seq` again.
fn resent_at(n: &Net, seq: u32) -> Time {
    let sends: Vec<Time> = data_from_a(n)
        .iter()
        .filter(|d| d.1 == seq)
        .map(|d| d.0)
        .collect();
    sends[1]
}

#[test]
fn fast_retransmit_repairs_a_loss() {
    recover_without_timeout(&[10], TcpConfig::default(), Duration::ZERO);
    recover_without_timeout(&[10], no_sack(), Duration::ZERO);
}

#[test]
fn newreno_repairs_several_losses_in_one_window() {
    // 10 and 13 in one window (a partial ACK), 17 just after recovery with a window
    // too small for three duplicate ACKs but for Limited Transmit.
    recover_without_timeout(&[10, 13, 17], no_sack(), Duration::ZERO);
}

/// Seconds between the first and last retransmission of three losses in one
/// flight of segments arriving 10 µs apart, each acknowledged on its own.
fn repair_span(cfg: TcpConfig) -> Duration {
    let n = recover_without_timeout(&[30, 33, 36], cfg, Duration::from_micros(10));
    let first = n.log.iter().find(|s| s.from == 0 && s.len > 0).unwrap().seq;
    let mss = n.conn(0).send_mss() as u32;
    let at = |i: u32| resent_at(&n, first.wrapping_add(i * mss));
    at(36).saturating_duration_since(at(30))
}

#[test]
fn newreno_repairs_one_hole_per_round_trip() {
    // A partial ACK a round trip (10 ms) after each retransmission shows the next
    // hole.
    assert!(repair_span(no_sack()) >= ms(20));
}

#[test]
fn sack_repairs_several_losses_in_one_round_trip() {
    let n = recover_without_timeout(&[10, 13, 17], TcpConfig::default(), Duration::ZERO);
    assert!(n.conn(0).sack() && n.conn(1).sack());
    assert!(n.conn(0).stats().sack_blocks_received > 0);
    assert_eq!(n.conn(0).stats().sack_blocks_ignored, 0);
    // The scoreboard shows each hole once three segments above it are SACKed
    // (RFC 6675 IsLost): all go out within the round trip.
    assert!(repair_span(TcpConfig::default()) < ms(10));
}

#[test]
fn sack_blocks_report_the_latest_arrival_first() {
    for timestamps in [true, false] {
        let cfg = TcpConfig {
            timestamps,
            ..TcpConfig::default()
        };
        let mut n = established_pair(cfg.clone(), cfg);
        let (rcv_nxt, b_nxt) = b_view(&n);
        let data = [7u8; 100];
        let block = |k: u32| {
            let s = rcv_nxt.wrapping_add(200 * k);
            (s, s + 100)
        };
        // Islands of 100 bytes at 200, 400, ..., 1000 beyond a hole at RCV.NXT.
        let mut reports = vec![];
        for k in 1..=5 {
            let seg = forged(0, block(k).0, b_nxt, flags::ACK, &data);
            let acks = answer(&mut n, 1, &seg);
            assert_eq!(acks.len(), 1);
            assert_eq!(acks[0].ack, rcv_nxt);
            reports.push(acks[0].sack);
        }
        let most = if timestamps { 3 } else { 4 };
        for (i, r) in reports.iter().enumerate() {
            // RFC 2018 §4: the newest island first, then the ones reported before.
            let want: Vec<_> = (1..=i as u32 + 1)
                .rev()
                .take(most)
                .map(|k| Some(block(k)))
                .collect();
            assert_eq!(&r[..want.len()], &want[..], "{timestamps}");
            assert!(r[want.len()..].iter().all(Option::is_none));
        }
        // A segment joining islands 2 and 3 reports the joined block first.
        let seg = forged(0, block(2).1, b_nxt, flags::ACK, &data);
        let acks = answer(&mut n, 1, &seg);
        let joined = Some((block(2).0, block(3).1));
        assert_eq!(acks[0].sack[0], joined);
        assert!(!acks[0].sack[1..].contains(&joined));
        // Holes filled one by one: blocks delivered in order drop out.
        let hole = |k: u32| (block(k).0.wrapping_sub(100), block(k).0);
        let fill = |n: &mut Net, k: u32| {
            let seg = forged(0, hole(k).0, b_nxt, flags::ACK, &data);
            let acks = answer(n, 1, &seg);
            (acks[0].ack, acks[0].sack)
        };
        assert_eq!(fill(&mut n, 1).0, rcv_nxt);
        let seg = forged(0, rcv_nxt, b_nxt, flags::ACK, &data);
        let acks = answer(&mut n, 1, &seg);
        assert_eq!((acks[0].ack, acks[0].sack[0]), (block(1).1, joined));
        assert_eq!(
            fill(&mut n, 2),
            (block(3).1, [Some(block(5)), Some(block(4)), None, None])
        );
        assert_eq!(
            fill(&mut n, 4),
            (block(4).1, [Some(block(5)), None, None, None])
        );
        assert_eq!(fill(&mut n, 5), (block(5).1, [None; 4]));
    }
}

#[test]
fn sack_negotiation() {
    for (a, b) in [(true, true), (true, false), (false, true)] {
        let mk = |sack| TcpConfig {
            sack,
            ..TcpConfig::default()
        };
        let n = established_pair(mk(a), mk(b));
        assert_eq!(n.conn(0).sack(), a && b);
        assert_eq!(n.conn(1).sack(), a && b);
    }
}

#[test]
fn sack_blocks_outside_the_flight_are_ignored() {
    let mut n = established_pair(TcpConfig::default(), TcpConfig::default());
    n.apps[0].out = pattern(20_000, 0);
    n.step();
    // Data in flight; end 1's ACKs forged with hostile blocks.
    let (una, max) = (last_from(&n, 1).ack, last_from(&n, 0).seq);
    let before = n.conn(0).stats().clone();
    let (tsval, tsecr) = last_from(&n, 1).ts.unwrap();
    for (l, r) in [
        (una.wrapping_sub(5000), una),
        (max.wrapping_add(2000), max.wrapping_add(3000)),
        (una.wrapping_add(3000), una.wrapping_add(1000)),
        (una.wrapping_add(0x8000_0000), una.wrapping_add(0x8000_1000)),
    ] {
        let mut opts = [0u8; 40];
        let len = write_options(
            &[
                TcpOption::NoOp,
                TcpOption::NoOp,
                TcpOption::Timestamps { tsval, tsecr },
                TcpOption::NoOp,
                TcpOption::NoOp,
                TcpOption::Sack([Some((l, r)), None, None, None]),
            ],
            &mut opts,
        )
        .unwrap();
        let window = last_from(&n, 1).window;
        let mut r = forged(1, last_from(&n, 0).ack, una, flags::ACK, &[]);
        r.options = &opts[..len];
        r.window = window;
        let now = n.now;
        n.conn_mut(0).handle_segment(&r, now);
    }
    let st = n.conn(0).stats();
    assert_eq!(st.sack_blocks_ignored, before.sack_blocks_ignored + 4);
    assert_eq!(st.sack_blocks_received, before.sack_blocks_received);
    assert_eq!(st.fast_retransmits, 0);
    // The transfer goes on undisturbed.
    assert!(n.run_until(n.now + secs(10), |n| n.apps[1].got.len() == 20_000));
    assert_eq!(n.conn(0).stats().retransmitted, 0);
}

/// Most data bytes end 0 sent within any `span`.
fn max_sent_within(n: &Net, span: Duration) -> usize {
    let data = data_from_a(n);
    (0..data.len())
        .map(|i| {
            data[i..]
                .iter()
                .take_while(|d| d.0.saturating_duration_since(data[i].0) < span)
                .map(|d| d.2)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn window_scaling_opens_windows_past_64k() {
    let big = TcpConfig {
        recv_buffer: 1 << 20,
        ..TcpConfig::default()
    };
    let rtt = ms(100);
    let faults = Faults {
        delay: rtt / 2,
        spacing: Duration::from_micros(10),
        ..Faults::default()
    };
    for scaling in [true, false] {
        let b = TcpConfig {
            window_scaling: scaling,
            ..big.clone()
        };
        let n = transfer(12, faults, [2_000_000, 0], big.clone(), b);
        let fields: Vec<u16> = n
            .log
            .iter()
            .filter(|s| s.from == 1)
            .map(|s| s.window)
            .collect();
        let most = max_sent_within(&n, rtt);
        if scaling {
            // 1 MiB needs a shift of 5: fields are 32 KiB at most, meaning 1 MiB.
            assert!(fields[1..].iter().all(|&w| w <= 32768));
            assert!(most > 200_000, "{most}");
        } else {
            assert!(fields.contains(&65535));
            assert!(most <= 65535, "{most}");
        }
    }
}

/// End 0 sends 3 MB to end 1 over a 100 ms path; returns the network and the
/// most bytes end 0 sent within one round trip.
fn bulk_over_long_path(b: TcpConfig, read_chunk: usize) -> (Net, usize) {
    let a = TcpConfig {
        send_buffer: 4 << 20,
        ..b.clone()
    };
    let rtt = ms(100);
    let faults = Faults {
        delay: rtt / 2,
        spacing: Duration::from_micros(10),
        ..Faults::default()
    };
    let n = transfer_with(
        Net::client_server(5, faults, a, b),
        [3_000_000, 0],
        read_chunk,
    );
    let most = max_sent_within(&n, rtt);
    (n, most)
}

#[test]
fn auto_tuning_grows_the_window_for_a_fast_reader() {
    for timestamps in [true, false] {
        let cfg = TcpConfig {
            timestamps,
            ..TcpConfig::default()
        };
        let (n, most) = bulk_over_long_path(cfg.clone(), 0);
        // From 64 KiB towards the 4 MiB ceiling: the receiver's RTT comes from
        // the echoes, or from the time a window takes.
        let b = n.conn(1);
        assert!(
            b.recv_buffer() > 1 << 20,
            "{timestamps}: {}",
            b.recv_buffer()
        );
        // In steps, as the sender's rate climbs round trip by round trip.
        assert!(
            b.stats().recv_buffer_growths >= 2,
            "{timestamps}: {:?}",
            b.stats()
        );
        assert!(most > 500_000, "{timestamps}: {most}");
        // Without auto-tuning the first window is the last.
        let fixed = TcpConfig {
            recv_buffer_max: 0,
            ..cfg
        };
        let (n, most) = bulk_over_long_path(fixed, 0);
        assert_eq!(n.conn(1).recv_buffer(), 65535);
        assert!(most <= 65535, "{most}");
    }
}

#[test]
fn auto_tuning_leaves_a_stalled_reader_alone() {
    let a = TcpConfig {
        send_buffer: 4 << 20,
        ..TcpConfig::default()
    };
    let mut n = established_pair(a, TcpConfig::default());
    n.faults.spacing = Duration::from_micros(10);
    n.apps[1].read = false;
    n.apps[0].out = pattern(3_000_000, 0);
    // The reader does not read: the buffer fills and stays as it was.
    n.run_until(n.now + secs(3), |_| false);
    let b = n.conn(1);
    // (Full but for less than 2^7, the granularity of the window scaled for
    // the 4 MiB ceiling.)
    assert!(b.recv_queue_len() > 65535 - 128);
    assert_eq!(b.recv_buffer(), 65535);
    assert_eq!(b.stats().recv_buffer_growths, 0);
    // It reads again, and keeps up: the buffer grows.
    n.apps[1].read = true;
    assert!(n.run_until(n.now + secs(30), |n| n.apps[1].got.len() == 3_000_000));
    assert!(n.conn(1).recv_buffer() > 65535);
}

#[test]
fn window_scale_option_negotiation() {
    let cfg = TcpConfig {
        recv_buffer: 1 << 20,
        recv_buffer_max: 0,
        ..fast_config()
    };
    let synack_of = |cfg: &TcpConfig, syn: &TcpRepr| {
        let mut c = Connection::accept(cfg.clone(), ADDR[1], ADDR[0], SeqNum(9), syn).unwrap();
        let mut buf = [0; 100];
        let len = c.poll_transmit(Time::ZERO, &mut buf).unwrap();
        let p = TcpPacket::new_checked(buf[..len].to_vec()).unwrap();
        let ws = p.options_iter().find_map(|o| match o {
            Ok(exonet_wire::TcpOption::WindowScale(s)) => Some(s),
            _ => None,
        });
        (ws, p.window())
    };
    // Offered (a shift of 20 is taken as 14): answered with ours, 5 for 1 MiB, and
    // the SYN-ACK's own window unscaled.
    let opts = [3, 3, 20, 0];
    let syn = TcpRepr {
        options: &opts,
        ..forged(0, 1, 0, flags::SYN, &[])
    };
    assert_eq!(synack_of(&cfg, &syn), (Some(5), 65535));
    // Not offered: not answered.
    assert_eq!(
        synack_of(&cfg, &forged(0, 1, 0, flags::SYN, &[])),
        (None, 65535)
    );
    // With auto-tuning the shift covers the ceiling: 7 for 4 MiB, though the
    // buffer starts at 64 KiB.
    assert_eq!(synack_of(&TcpConfig::default(), &syn), (Some(7), 65535));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Blind injection (RFC 5961): forged segments with guessed sequence numbers,
    /// any control bits and ACK numbers from outside the acceptable range, sprayed
    /// at both ends during a transfer, damage nothing and stop nothing.
    #[test]
    fn blind_injection_changes_nothing(seed: u64, forgeries in 50usize..400) {
        let mut n = Net::client_server(seed, quiet(), fast_config(), fast_config());
        for (i, app) in n.apps.iter_mut().enumerate() {
            app.out = pattern(100_000, i as u8);
            app.close_when_written = true;
            app.read = true;
        }
        assert!(n.run_until(at(secs(1)), |n| n.ends[1].is_some()
            && n.state(0) != TcpState::SynSent
            && n.state(1) != TcpState::SynReceived));
        let mut rng = SplitMix64::new(seed ^ 0xdead);
        for _ in 0..forgeries {
            n.step();
            let to = rng.below(2) as usize;
            let Some(c) = n.ends[to].as_ref() else { continue };
            if c.state() == TcpState::Closed {
                continue;
            }
            // The victim's SND.NXT as its peer last heard it: a forged ACK half the
            // sequence space away is never acceptable.
            let snd = last_from(&n, to).seq;
            let ack = snd.wrapping_add(0x8000_0000);
            let f = rng.pick(&[
                flags::RST,
                flags::RST | flags::ACK,
                flags::SYN,
                flags::SYN | flags::ACK,
                flags::ACK,
                flags::ACK | flags::PSH,
                flags::FIN | flags::ACK,
                flags::FIN,
                0,
            ]);
            let payload = if rng.chance(0.5) { &b"forged data"[..] } else { &[][..] };
            let seq = rng.next_u64() as u32;
            let r = forged(1 - to, seq, ack, f, payload);
            n.inject(to, &r);
        }
        let limit = n.now + secs(600);
        assert!(n.run_until(limit, Net::both_closed));
        for i in 0..2 {
            prop_assert_eq!(n.conn(i).error(), None);
            prop_assert!(n.apps[1 - i].got == n.apps[i].out);
        }
        // The forgeries were seen, and answered within the limit.
        let challenged: u64 = (0..2).map(|i| n.conn(i).stats().challenge_acks).sum();
        prop_assert!(challenged > 0);
    }
}

#[test]
fn urgent_data_is_delivered_inline() {
    // RFC 9293 §3.8.5 (and RFC 6093): urgent data is tolerated and, as with
    // SO_OOBINLINE, read in sequence with the rest.
    let mut n = established_pair(fast_config(), fast_config());
    let (rcv_nxt, snd_nxt) = b_view(&n);
    let r = TcpRepr {
        urgent_ptr: 3,
        ..forged(
            0,
            rcv_nxt,
            snd_nxt,
            flags::ACK | flags::URG | flags::PSH,
            b"urgent!",
        )
    };
    let reply = answer(&mut n, 1, &r);
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].ack, rcv_nxt.wrapping_add(7));
    let mut buf = [0; 16];
    assert_eq!(n.conn_mut(1).recv(&mut buf), 7);
    assert_eq!(&buf[..7], b"urgent!");
}

/// The timestamps option as on the wire: two NOPs, then the option.
fn ts_opts(tsval: u32, tsecr: u32) -> [u8; 12] {
    let mut b = [0; 12];
    let opts = [
        TcpOption::NoOp,
        TcpOption::NoOp,
        TcpOption::Timestamps { tsval, tsecr },
    ];
    assert_eq!(write_options(&opts, &mut b).unwrap(), 12);
    b
}

#[test]
fn timestamp_negotiation_on_off_and_one_sided() {
    for (a_ts, b_ts) in [(true, true), (true, false), (false, true), (false, false)] {
        let a = TcpConfig {
            timestamps: a_ts,
            ..fast_config()
        };
        let b = TcpConfig {
            timestamps: b_ts,
            ..fast_config()
        };
        let n = transfer(11, quiet(), [20_000, 5_000], a, b);
        let both = a_ts && b_ts;
        assert_eq!(
            (n.conn(0).timestamps(), n.conn(1).timestamps()),
            (both, both)
        );
        let (syn, synack) = (n.log[0], n.log[1]);
        assert!(syn.has(flags::SYN) && synack.has(flags::SYN | flags::ACK));
        // Offered in the SYN by config; in the SYN-ACK only in answer to an offer.
        assert_eq!(syn.ts.is_some(), a_ts, "{a_ts} {b_ts}");
        assert_eq!(synack.ts.is_some(), both, "{a_ts} {b_ts}");
        // Then on every segment, or on none.
        assert!(n.log[2..].iter().all(|s| s.ts.is_some() == both));
        assert_eq!(n.conn(0).send_mss(), if both { 1448 } else { 1460 });
        if !both {
            assert_eq!(n.conn(0).stats().ts_rtt_samples, 0);
            continue;
        }
        let offsets = [
            timestamp_offset(&KEY, ADDR[0], ADDR[1]),
            timestamp_offset(&KEY, ADDR[1], ADDR[0]),
        ];
        assert_ne!(offsets[0], offsets[1]);
        for s in &n.log {
            // TSval: the caller's millisecond clock plus the connection's offset.
            let (tsval, tsecr) = s.ts.unwrap();
            let ms = (s.at.as_nanos() / 1_000_000) as u32;
            assert_eq!(tsval, ms.wrapping_add(offsets[s.from]));
            // TSecr: 0 on the SYN, else a TSval the other end sent earlier.
            if s.has(flags::ACK) {
                assert!(n
                    .log
                    .iter()
                    .any(|o| o.from != s.from && o.at <= s.at && o.ts.unwrap().0 == tsecr));
            } else {
                assert_eq!(tsecr, 0);
            }
        }
        assert_eq!(synack.ts.unwrap().1, syn.ts.unwrap().0);
        // A sample from every ACK of new data (RFC 7323 §4.1): on this lossless
        // link, every segment of end 1's that moved its ACK forward.
        let mut high: Option<u32> = None;
        let mut new_acks = 0;
        for s in n.log.iter().filter(|s| s.from == 1 && s.has(flags::ACK)) {
            if high.is_none_or(|h| (s.ack.wrapping_sub(h) as i32) > 0) {
                new_acks += 1;
                high = Some(s.ack);
            }
        }
        assert_eq!(n.conn(0).stats().ts_rtt_samples, new_acks);
        assert_eq!(n.conn(0).srtt(), Some(ms(10)));
    }
}

#[test]
fn timestamps_time_retransmitted_segments() {
    let cfg = TcpConfig {
        tail_loss_probe: false,
        ..fast_config()
    };
    let mut n = established_pair(cfg.clone(), cfg);
    assert_eq!(n.conn(0).srtt(), Some(ms(10)));
    let samples = n.conn(0).stats().ts_rtt_samples;
    let mut dropped = false;
    n.pass = Box::new(move |s| {
        let first_data = s.from == 0 && s.len > 0 && !dropped;
        dropped |= first_data;
        !first_data
    });
    n.apps[0].out = pattern(100, 0);
    n.step();
    assert!(n.run_until(n.now + secs(5), |n| n.apps[1].got.len() == 100
        && n.conn(0).send_queue_len() == 0));
    let data: Vec<_> = n.log.iter().filter(|s| s.len > 0).copied().collect();
    assert_eq!(data.len(), 2);
    assert_eq!(n.conn(0).stats().timeouts, 1);
    // The ACK echoes the retransmission's TSval (RFC 7323 §4.3), so it is a true
    // 10 ms sample (not the 210 ms since the first copy), and it clears the backoff
    // at once, where Karn's rule would keep the doubled RTO.
    let ack = last_from(&n, 1);
    assert_eq!(ack.ts.unwrap().1, data[1].ts.unwrap().0);
    assert_eq!(n.conn(0).stats().ts_rtt_samples, samples + 1);
    assert_eq!(n.conn(0).srtt(), Some(ms(10)));
    assert_eq!(n.conn(0).rto(), ms(200));
}

/// A transfer from end 0 into which, once `at_bytes` arrived, a segment at end 1's
/// RCV.NXT with bad data and (if timestamps are on) an old TSval is injected: an old
/// duplicate of a previous incarnation or of a wrapped sequence space. Returns the
/// network after the transfer and end 1's answer to the injection.
fn old_duplicate_during_transfer(cfg: TcpConfig, at_bytes: usize) -> (Net, Vec<Sent>) {
    let mut n = established_pair(cfg.clone(), cfg);
    n.apps[0].out = pattern(200_000, 3);
    n.apps[0].close_when_written = true;
    n.apps[1].close_when_written = true;
    assert!(n.run_until(n.now + secs(5), |n| n.apps[1].got.len() >= at_bytes));
    n.flush();
    let (b_nxt, b_rcv_nxt) = (last_from(&n, 1).seq, last_from(&n, 1).ack);
    let junk = vec![0xee; 500];
    // A TSval from 100 s ago: older than TS.Recent, within 2^31.
    let old = last_from(&n, 0).ts.map(|t| t.0.wrapping_sub(100_000));
    let opts = old.map(|v| ts_opts(v, 0));
    let mut r = forged(0, b_rcv_nxt, b_nxt, flags::ACK, &junk);
    if let Some(o) = &opts {
        r.options = o;
    }
    let reply = answer(&mut n, 1, &r);
    assert!(n.run_until(n.now + secs(60), Net::both_closed));
    n.run_apps();
    (n, reply)
}

#[test]
fn paws_drops_an_old_duplicate_during_a_transfer() {
    let (n, reply) = old_duplicate_during_transfer(fast_config(), 50_000);
    let st = n.conn(1).stats();
    assert_eq!(st.paws_rejected, 1);
    // Dropped and answered with an ACK of what end 1 really has (RFC 7323 §5.3 R1),
    // which echoes the real TS.Recent, not the old TSval.
    assert_eq!(reply.len(), 1);
    assert!(reply[0].has(flags::ACK) && reply[0].len == 0);
    assert!(n.apps[1].got == n.apps[0].out, "stream damaged");
    assert_eq!(n.conn(0).error(), None);
    // Without timestamps nothing tells the duplicate from new data: it is taken.
    let no_ts = TcpConfig {
        timestamps: false,
        ..fast_config()
    };
    let (n, _) = old_duplicate_during_transfer(no_ts, 50_000);
    assert_eq!(n.conn(1).stats().paws_rejected, 0);
    assert_eq!(n.apps[1].got.len(), n.apps[0].out.len());
    assert!(n.apps[1].got != n.apps[0].out);
}

#[test]
fn rst_is_not_subject_to_paws() {
    let mut n = established_pair(fast_config(), fast_config());
    let (b_nxt, b_rcv_nxt) = (last_from(&n, 1).seq, last_from(&n, 1).ack);
    let old = last_from(&n, 0).ts.unwrap().0.wrapping_sub(1_000);
    let opts = ts_opts(old, 0);
    // A bare ACK with the old TSval is dropped (and answered)...
    let mut r = forged(0, b_rcv_nxt, b_nxt, flags::ACK, &[]);
    r.options = &opts;
    let reply = answer(&mut n, 1, &r);
    assert_eq!(n.conn(1).stats().paws_rejected, 1);
    assert_eq!(reply.len(), 1);
    // ... but a RST with it still resets (RFC 7323 §5.3).
    let mut r = forged(0, b_rcv_nxt, 0, flags::RST, &[]);
    r.options = &opts;
    answer(&mut n, 1, &r);
    assert_eq!(n.state(1), TcpState::Closed);
    assert_eq!(n.conn(1).error(), Some(TcpError::Reset));
}

#[test]
fn paws_ts_recent_expires_after_24_idle_days() {
    let mut n = established_pair(fast_config(), fast_config());
    let (b_nxt, b_rcv_nxt) = (last_from(&n, 1).seq, last_from(&n, 1).ack);
    let recent = last_from(&n, 0).ts.unwrap().0;
    // A peer whose clock went back (it rebooted, or wrapped after 24 days).
    let old = recent.wrapping_sub(5_000);
    let opts = ts_opts(old, 0);
    let mut r = forged(0, b_rcv_nxt, b_nxt, flags::ACK | flags::PSH, b"hello");
    r.options = &opts;
    // Idle 23 days: TS.Recent still valid, the segment is dropped.
    n.now = n.now + secs(23 * 24 * 3600);
    let reply = answer(&mut n, 1, &r);
    assert_eq!(n.conn(1).stats().paws_rejected, 1);
    assert_eq!(n.conn(1).recv_queue_len(), 0);
    assert_eq!(reply[0].ts.unwrap().1, recent);
    // Idle past 24 days (RFC 7323 §5.5): TS.Recent is invalid, the segment taken,
    // its TSval the new TS.Recent.
    n.now = n.now + secs(2 * 24 * 3600);
    let reply = answer(&mut n, 1, &r);
    assert_eq!(n.conn(1).stats().paws_rejected, 1);
    assert_eq!(n.conn(1).recv_queue_len(), 5);
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].ack, b_rcv_nxt.wrapping_add(5));
    assert_eq!(reply[0].ts.unwrap().1, old);
}

/// A connection on the one 4-tuple starting at `start`, with the ISSs of every
/// incarnation alike (as if the ISN clock had come round): sequence numbers alone
/// cannot tell incarnations apart.
fn incarnation(cfg: TcpConfig, start: Time) -> Net {
    let mut n = Net::new(9, quiet());
    n.now = start;
    let offset = timestamp_offset(&KEY, ADDR[0], ADDR[1]);
    let c = Connection::connect(cfg.clone(), ADDR[0], ADDR[1], SeqNum(0x1234_5678));
    n.ends[0] = Some(c.with_timestamp_offset(offset));
    n.listener = Some(cfg);
    n.listener_iss = Some(SeqNum(0x9abc_def0));
    n
}

/// Replays a data segment of one incarnation, byte for byte, into the next one's
/// transfer, where its sequence number lies ahead in the window; returns the second
/// incarnation after its transfer.
fn replay_into_next_incarnation(cfg: TcpConfig) -> Net {
    let old = transfer_with(incarnation(cfg.clone(), Time::ZERO), [60_000, 0], 0);
    let first = 0x1234_5679u32;
    let dup = *old
        .log
        .iter()
        .find(|s| s.from == 0 && s.len > 0 && s.seq.wrapping_sub(first) >= 30_000)
        .unwrap();
    let off = dup.seq.wrapping_sub(first) as usize;
    let payload = old.apps[0].out[off..off + dup.len].to_vec();
    // The next incarnation, once TIME-WAIT is over.
    let mut n = incarnation(cfg, old.now + secs(1));
    n.apps[0].out = pattern(100_000, 3);
    for app in &mut n.apps {
        app.close_when_written = true;
        app.read = true;
    }
    assert!(n.run_until(n.now + secs(5), |n| n.apps[1].got.len() >= 10_000));
    n.flush();
    let rcv_nxt = last_from(&n, 1).ack.wrapping_sub(first) as usize;
    assert!(rcv_nxt < off && off + dup.len <= rcv_nxt + 65_535);
    assert_ne!(payload, n.apps[0].out[off..off + dup.len]);
    let opts = dup.ts.map(|(v, e)| ts_opts(v, e));
    let mut r = forged(0, dup.seq, dup.ack, dup.flags, &payload);
    r.window = dup.window;
    if let Some(o) = &opts {
        r.options = o;
    }
    n.inject(1, &r);
    assert!(n.run_until(n.now + secs(60), Net::both_closed));
    n.run_apps();
    n
}

#[test]
fn paws_drops_a_duplicate_from_a_previous_incarnation() {
    // The same timestamp offset for the 4-tuple keeps TSvals rising across
    // incarnations, so the old segment's TSval is older than TS.Recent.
    let n = replay_into_next_incarnation(fast_config());
    assert_eq!(n.conn(1).stats().paws_rejected, 1);
    assert!(n.apps[1].got == n.apps[0].out, "stream damaged");
    // Without timestamps the old data is taken for new.
    let n = replay_into_next_incarnation(TcpConfig {
        timestamps: false,
        ..fast_config()
    });
    assert_eq!(n.conn(1).stats().paws_rejected, 0);
    assert_eq!(n.apps[1].got.len(), n.apps[0].out.len());
    assert!(n.apps[1].got != n.apps[0].out);
}

/// Two identical connections but for header prediction, established with data in
/// flight both ways.
fn prediction_pair(hp: bool) -> Net {
    let cfg = TcpConfig {
        header_prediction: hp,
        ..TcpConfig::default()
    };
    let mut n = established_pair(cfg.clone(), cfg);
    // Small buffers keep the fingerprints short.
    n.apps[0].out = pattern(12_000, 0);
    n.apps[1].out = pattern(6_000, 1);
    n.apps[0].read = false;
    for _ in 0..8 {
        n.step();
    }
    n
}

/// Drains end 0's segments.
fn drain(n: &mut Net) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut buf = [0u8; 1600];
    let now = n.now;
    while let Some(len) = n.conn_mut(0).poll_transmit(now, &mut buf) {
        out.push(buf[..len].to_vec());
    }
    out
}

/// One step of the prediction test on end 0, driven by `op`.
fn prediction_step(n: &mut Net, op: (u8, u16, u16, u8, u16), our_tsval: u32) {
    let (kind, a, b, c, len) = op;
    let (rcv_nxt, una, max, wfield, ts_recent) = n.conn(0).view();
    match kind % 8 {
        0 => {
            let mut buf = vec![0; usize::from(a % 5000)];
            n.conn_mut(0).recv(&mut buf);
        }
        1 => {
            n.conn_mut(0).send(&pattern(usize::from(a % 4000), 9));
        }
        2 => {
            n.now = n.now + Duration::from_micros(u64::from(a) * 10);
            let now = n.now;
            if n.conn(0).poll_timeout().is_some_and(|t| t <= now) {
                n.conn_mut(0).handle_timeout(now);
            }
        }
        _ => {
            let seq = match c % 8 {
                0..=4 => rcv_nxt,
                5 => rcv_nxt.wrapping_add(u32::from(a % 3000)),
                6 => rcv_nxt.wrapping_sub(u32::from(a % 3000)),
                _ => rcv_nxt.wrapping_add(u32::from(a)),
            };
            let flight = max.wrapping_sub(una);
            let ack = match b % 8 {
                0 | 1 => una,
                2 | 3 => max,
                4 => una.wrapping_add(u32::from(a) % (flight + 1)),
                5 => una.wrapping_add(1448 * u32::from(a % 4)),
                6 => max.wrapping_add(u32::from(a % 2000)),
                _ => una.wrapping_sub(u32::from(a % 2000)),
            };
            let f = match (c >> 3) % 8 {
                0..=3 => flags::ACK,
                4 => flags::ACK | flags::PSH,
                5 => flags::ACK | flags::FIN,
                6 => [flags::RST, flags::SYN, flags::ACK | flags::URG, 0][usize::from(a % 4)],
                _ => flags::ACK | flags::RST,
            };
            let window = match (b >> 4) % 6 {
                0..=3 => wfield,
                4 => 0,
                _ => wfield.wrapping_add(a % 300),
            };
            let tsval = ts_recent
                .wrapping_add(u32::from(b >> 8) % 6)
                .wrapping_sub(1);
            let sack_l = una.wrapping_add(u32::from(a % 3) * 1448);
            let sack_r = sack_l.wrapping_add(u32::from(b % 3000));
            let ts = TcpOption::Timestamps {
                tsval,
                tsecr: our_tsval,
            };
            let sack = TcpOption::Sack([Some((sack_l, sack_r)), None, None, None]);
            let unknown = TcpOption::Unknown {
                kind: 30,
                data: &[1, 2],
            };
            let opts: &[TcpOption] = match (c >> 6) % 4 {
                0 | 1 => &[TcpOption::NoOp, TcpOption::NoOp, ts],
                2 => match a % 3 {
                    0 => &[],
                    1 => &[
                        TcpOption::NoOp,
                        TcpOption::NoOp,
                        ts,
                        TcpOption::NoOp,
                        TcpOption::NoOp,
                        sack,
                    ],
                    _ => &[ts, unknown],
                },
                _ => &[TcpOption::NoOp, TcpOption::NoOp, ts],
            };
            let mut obuf = [0u8; 40];
            let olen = write_options(opts, &mut obuf).unwrap();
            let data = pattern(
                if len % 2 == 0 {
                    0
                } else {
                    usize::from(len % 1449)
                },
                7,
            );
            let mut r = forged(1, seq, ack, f, &data);
            r.window = window;
            r.options = &obuf[..olen];
            let now = n.now;
            n.conn_mut(0).handle_segment(&r, now);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The fast path changes nothing but the counter: the same segments, reads,
    /// writes and timeouts give the same state and the same output as the general
    /// path, and the fast path is taken.
    #[test]
    fn header_prediction_matches_the_general_path(
        ops in prop::collection::vec((any::<u8>(), any::<u16>(), any::<u16>(), any::<u8>(), any::<u16>()), 1..120),
    ) {
        let mut fast = prediction_pair(true);
        let mut slow = prediction_pair(false);
        prop_assert_eq!(fast.conn(0).fingerprint(), slow.conn(0).fingerprint());
        let mut our_tsval = last_from(&fast, 0).ts.unwrap().0;
        for &op in &ops {
            prediction_step(&mut fast, op, our_tsval);
            prediction_step(&mut slow, op, our_tsval);
            let out = drain(&mut fast);
            prop_assert_eq!(&out, &drain(&mut slow));
            prop_assert_eq!(fast.conn(0).fingerprint(), slow.conn(0).fingerprint());
            if let Some(last) = out.last() {
                let p = TcpPacket::new_checked(&last[..]).unwrap();
                let ts = p.options_iter().find_map(|o| match o {
                    Ok(TcpOption::Timestamps { tsval, .. }) => Some(tsval),
                    _ => None,
                });
                our_tsval = ts.unwrap_or(our_tsval);
            }
        }
        prop_assert_eq!(slow.conn(0).stats().header_predicted, 0);
    }
}

/// End 0 sends 300 KB to end 1 while both are ESTABLISHED (neither closes).
fn one_way_established(cfg: TcpConfig) -> Net {
    let mut n = established_pair(cfg.clone(), cfg);
    n.faults.spacing = Duration::from_micros(10);
    n.apps[0].out = pattern(300_000, 0);
    assert!(n.run_until(n.now + secs(10), |n| n.apps[1].got.len() == 300_000));
    assert!(n.apps[1].got == n.apps[0].out);
    n
}

#[test]
fn header_prediction_takes_most_segments_of_a_transfer() {
    // Data segments acknowledge nothing new, ACKs carry no data: both ends take
    // most segments on the fast path.
    let n = one_way_established(TcpConfig::default());
    for i in 0..2 {
        let st = n.conn(i).stats();
        assert!(
            st.header_predicted * 10 > st.segments_received * 8,
            "{st:?}"
        );
    }
    let m = one_way_established(TcpConfig {
        header_prediction: false,
        ..TcpConfig::default()
    });
    assert_eq!(m.conn(0).stats().header_predicted, 0);
    // The same segments either way.
    assert_eq!(n.log.len(), m.log.len());
    assert!(n.log.iter().zip(&m.log).all(
        |(x, y)| (x.at, x.seq, x.ack, x.len, x.window) == (y.at, y.seq, y.ack, y.len, y.window)
    ));
}

/// The six senders of the fault matrix: NewReno and CUBIC; without SACK, with
/// SACK and RACK, with SACK alone.
fn matrix_configs(base: TcpConfig) -> Vec<TcpConfig> {
    let mut out = vec![];
    for congestion in [Congestion::NewReno, Congestion::Cubic] {
        for (sack, rack) in [(false, false), (true, true), (true, false)] {
            out.push(TcpConfig {
                congestion,
                sack,
                rack,
                ..base.clone()
            });
        }
    }
    out
}

/// 200 KB and 100 KB both ways under `faults`, for every configuration of
/// [`matrix_configs`] on both ends; each stream must arrive intact (compared byte
/// for byte) and both ends must send a FIN and close without error.
fn fault_matrix(seed: u64, faults: Faults, base: TcpConfig, read_chunk: usize) -> Vec<Net> {
    matrix_configs(base)
        .into_iter()
        .map(|cfg| {
            let n = Net::client_server(seed, faults, cfg.clone(), cfg.clone());
            let n = transfer_with(n, [200_000, 100_000], read_chunk);
            for i in 0..2 {
                assert_eq!(n.conn(i).sack(), cfg.sack);
                assert!(n.log.iter().any(|s| s.from == i && s.has(flags::FIN)));
            }
            // The end whose FIN went first waited out TIME-WAIT (both, if the FINs
            // crossed); the other closed from LAST-ACK.
            let fin_at = |i| {
                n.log
                    .iter()
                    .find(|s| s.from == i && s.has(flags::FIN))
                    .unwrap()
                    .at
            };
            let first = if fin_at(0) <= fin_at(1) { 0 } else { 1 };
            assert!(n.time_waited[first]);
            n
        })
        .collect()
}

fn lossy(loss: f64) -> Faults {
    Faults {
        loss,
        delay: ms(10),
        jitter: ms(2),
        spacing: Duration::from_micros(12),
        ..Faults::default()
    }
}

#[test]
fn faults_loss() {
    for (seed, loss) in [(21, 0.01), (22, 0.03), (23, 0.05)] {
        for n in fault_matrix(seed, lossy(loss), fast_config(), 0) {
            let st = n.conn(0).stats();
            assert!(st.retransmitted > 0);
            // Most losses are repaired without waiting for the timer.
            assert!(st.fast_retransmits > st.timeouts, "{st:?}");
        }
    }
}

#[test]
fn faults_reordering() {
    let faults = Faults {
        reorder: 0.1,
        jitter: ms(3),
        ..lossy(0.0)
    };
    for n in fault_matrix(24, faults, fast_config(), 0) {
        // Reordering past three segments looks like loss; nothing is lost, so
        // there is nothing to time out.
        assert_eq!(n.conn(0).stats().timeouts, 0);
    }
}

#[test]
fn faults_duplication() {
    let faults = Faults {
        dup: 0.05,
        ..lossy(0.0)
    };
    for n in fault_matrix(25, faults, fast_config(), 0) {
        assert_eq!(n.conn(0).stats().timeouts, 0);
    }
}

#[test]
fn faults_bit_corruption() {
    let faults = Faults {
        corrupt: 0.03,
        ..lossy(0.0)
    };
    for n in fault_matrix(26, faults, fast_config(), 0) {
        // Every flipped bit was caught by the checksum: the streams are intact
        // and what was dropped was sent again.
        assert!(n.corrupted > 0);
        assert!(n.conn(0).stats().retransmitted + n.conn(1).stats().retransmitted > 0);
    }
}

#[test]
fn faults_zero_windows_from_a_slow_reader() {
    let cfg = TcpConfig {
        recv_buffer: 4096,
        ..fast_config()
    };
    for n in fault_matrix(27, lossy(0.01), cfg, 300) {
        // The 4 KB buffers fill: zero windows, and the transfer still completes.
        assert!(n
            .log
            .iter()
            .any(|s| s.window == 0 && !s.has(flags::SYN | flags::RST)));
    }
}

#[test]
fn faults_tiny_mss() {
    let cfg = TcpConfig {
        mss: 64,
        ..fast_config()
    };
    for n in fault_matrix(28, lossy(0.02), cfg, 0) {
        // 64 less 12 bytes of timestamps; less when SACK blocks ride along.
        assert_eq!(n.conn(0).send_mss(), 52);
        assert!(n.log.iter().all(|s| s.len <= 52));
    }
}

#[test]
fn faults_long_delay() {
    let faults = Faults {
        delay: ms(250),
        jitter: ms(5),
        loss: 0.02,
        spacing: Duration::from_micros(12),
        ..Faults::default()
    };
    for n in fault_matrix(29, faults, fast_config(), 0) {
        // A 500 ms round trip measured, the RTO above it.
        let srtt = n.conn(0).srtt().unwrap();
        assert!(srtt >= ms(500) && srtt < ms(600), "{srtt:?}");
        assert!(n.conn(0).rto() > srtt);
    }
}

/// Data bytes end 0 sent more than once.
fn resent_bytes(n: &Net) -> usize {
    let data = data_from_a(n);
    let mut seen = std::collections::HashSet::new();
    data.iter().filter(|d| !seen.insert(d.1)).map(|d| d.2).sum()
}

/// End 0 sends 300 KB, segments arriving 10 µs apart; the first transmissions of
/// segments 30, 32, 34, 36 and 38 are lost, and the first retransmission of 34.
fn burst_losses(cfg: TcpConfig) -> Net {
    let mut n = established_pair(cfg.clone(), cfg);
    n.faults.spacing = Duration::from_micros(10);
    let first = last_from(&n, 0).seq;
    let mss = n.conn(0).send_mss() as u32;
    let mut sends = std::collections::HashMap::new();
    n.pass = Box::new(move |s| {
        let i = s.seq.wrapping_sub(first) / mss;
        if s.from != 0 || s.len == 0 || !(30..=38).contains(&i) || i % 2 == 1 {
            return true;
        }
        let k = sends.entry(i).or_insert(0);
        *k += 1;
        !(*k == 1 || (i == 34 && *k == 2))
    });
    n.apps[0].out = pattern(300_000, 0);
    assert!(n.run_until(n.now + secs(60), |n| n.apps[1].got.len() == 300_000));
    assert!(n.apps[1].got == n.apps[0].out);
    n
}

#[test]
fn sack_resends_less_than_newreno_after_losses_in_one_window() {
    // The RTO repairs the lost retransmission here (see
    // `probe_timer_repairs_a_lost_retransmission` for the probe timer).
    let off = |cfg| TcpConfig {
        tail_loss_probe: false,
        rack: false,
        ..cfg
    };
    let sack = burst_losses(off(TcpConfig::default()));
    let newreno = burst_losses(off(no_sack()));
    let mss = sack.conn(0).send_mss();
    // SACK: the five holes, then 34 again after its retransmission was lost too
    // (a timeout; RFC 6675 does not detect lost retransmissions).
    assert_eq!(resent_bytes(&sack), 6 * mss);
    // NewReno finds one hole per round trip, so 36 and 38 are still missing
    // when the lost retransmission costs a timeout; going back from 34 it sends
    // again segments the receiver already holds.
    let nr = resent_bytes(&newreno);
    assert!(nr >= 9 * mss, "{nr} vs {}", 6 * mss);
    assert_eq!(newreno.conn(0).stats().timeouts, 1);
    assert_eq!(sack.conn(0).stats().timeouts, 1);
}

#[test]
fn probe_timer_repairs_a_lost_retransmission() {
    // RACK off: with it, RACK finds the lost retransmission first (see
    // `rack_repairs_a_lost_retransmission_without_a_timeout`).
    let sack = TcpConfig {
        rack: false,
        ..TcpConfig::default()
    };
    for cfg in [sack, no_sack()] {
        let n = burst_losses(cfg.clone());
        let st = n.conn(0).stats();
        // No ACK of new data for a PTO after the last retransmission: the one of
        // 34 was lost, and goes again (RFC 8985 §7 in place of RACK's detection),
        // long before the 1 s RTO. Nothing else is sent twice.
        assert_eq!((st.timeouts, st.tlp_recoveries), (0, 1), "{st:?}");
        assert_eq!(resent_bytes(&n), 6 * n.conn(0).send_mss());
        let data = data_from_a(&n);
        let span = data.last().unwrap().0.saturating_duration_since(data[0].0);
        assert!(span < ms(200), "{span:?}");
        let off = burst_losses(TcpConfig {
            tail_loss_probe: false,
            ..cfg
        });
        let data = data_from_a(&off);
        assert!(data.last().unwrap().0.saturating_duration_since(data[0].0) > secs(1));
    }
}

#[test]
fn cubic_window_follows_the_curve_after_a_loss() {
    let a = TcpConfig {
        send_buffer: 16 << 20,
        ..TcpConfig::default()
    };
    let b = TcpConfig {
        recv_buffer: 4 << 20,
        ..TcpConfig::default()
    };
    let mut n = established_pair(a, b);
    let rtt = ms(100);
    n.faults.delay = rtt / 2;
    n.faults.spacing = Duration::from_micros(10);
    let first = last_from(&n, 0).seq;
    let mss = n.conn(0).send_mss() as u32;
    // One loss, in slow start's seventh flight (about 100 segments).
    let mut dropped = false;
    n.pass = Box::new(move |s| {
        let hit = !dropped && s.from == 0 && s.seq == first.wrapping_add(100 * mss);
        dropped |= hit;
        !hit
    });
    n.apps[0].out = pattern(24 << 20, 0);
    // (time, cwnd, ssthresh) at every event.
    let mut trace = vec![];
    let end = n.now + secs(8);
    while n.now < end && n.step() {
        trace.push((n.now, n.conn(0).cwnd(), n.conn(0).ssthresh()));
    }
    // W_max: the window when the loss was found, ssthresh = β × W_max (§4.6).
    let ssthresh = trace.iter().map(|t| t.2).find(|&s| s != u32::MAX).unwrap();
    let w_max = f64::from(ssthresh) / 0.7 / f64::from(mss);
    let k = (w_max * 0.3 / 0.4).cbrt();
    // The epoch starts with congestion avoidance: cwnd back at ssthresh.
    let reduced = trace.iter().position(|t| t.2 != u32::MAX).unwrap();
    let t0 = trace[reduced..]
        .iter()
        .find(|t| t.1 >= ssthresh && t.0 > trace[reduced].0 + rtt)
        .unwrap()
        .0;
    let mut checked = 0;
    for &(t, cwnd, s) in &trace {
        let secs = t.saturating_duration_since(t0).as_secs_f64();
        if t < t0 + rtt || secs > 1.8 * k {
            continue;
        }
        assert_eq!(s, ssthresh, "a second loss");
        // W_cubic(t) of RFC 9438 §4.2; cwnd aims one RTT ahead of it.
        let (now, ahead) = (
            0.4 * (secs - k).powi(3) + w_max,
            0.4 * (secs + 0.1 - k).powi(3) + w_max,
        );
        let w = f64::from(cwnd) / f64::from(mss);
        assert!(
            w >= now.min(ahead) * 0.95 - 2.0 && w <= now.max(ahead) * 1.05 + 2.0,
            "t = {secs:.2} s: cwnd {w:.1} segments, W_cubic {now:.1}"
        );
        checked += 1;
    }
    assert!(checked > 1000, "{checked}");
    // Flat near W_max around K, then probing beyond it.
    let at = |s: f64| {
        trace
            .iter()
            .find(|t| t.0 >= t0 + Duration::from_secs_f64(s))
            .unwrap()
            .1 as f64
            / f64::from(mss)
    };
    assert!((at(k) - w_max).abs() < 0.05 * w_max);
    assert!(at(1.7 * k) > 1.1 * w_max);
}

/// End 0 sends 30 segments over the 10 ms round trip of [`established_pair`]; the
/// first transmissions of the segments with these indices are lost. Returns the
/// network once everything arrived.
fn tail_losses(cfg: TcpConfig, losses: &'static [u32]) -> Net {
    let mut n = established_pair(cfg.clone(), cfg);
    let first = last_from(&n, 0).seq;
    let mss = n.conn(0).send_mss() as u32;
    let mut dropped = Vec::new();
    n.pass = Box::new(move |s| {
        let index = s.seq.wrapping_sub(first) / mss;
        let drop = s.from == 0 && s.len > 0 && losses.contains(&index) && !dropped.contains(&index);
        if drop {
            dropped.push(index);
        }
        !drop
    });
    let size = 30 * mss as usize;
    n.apps[0].out = pattern(size, 0);
    n.step();
    assert!(
        n.run_until(n.now + secs(10), |n| n.apps[1].got.len() == size
            && n.conn(0).send_queue_len() == 0)
    );
    assert!(n.apps[1].got == n.apps[0].out);
    n
}

/// The four ways of [`tail_losses`]: SACK and timestamps on and off.
fn tlp_configs() -> Vec<TcpConfig> {
    let mut out = vec![];
    for sack in [true, false] {
        for timestamps in [true, false] {
            out.push(TcpConfig {
                sack,
                timestamps,
                ..fast_config()
            });
        }
    }
    out
}

#[test]
fn tail_loss_probe_repairs_a_lost_last_segment() {
    for cfg in tlp_configs() {
        let n = tail_losses(cfg.clone(), &[29]);
        let st = n.conn(0).stats();
        assert_eq!(
            (st.timeouts, st.tlp_probes, st.retransmitted),
            (0, 1, 1),
            "{cfg:?}"
        );
        // The probe is the last segment again, 2·SRTT + 2 ms (RFC 8985 §7.2) after
        // the last ACK came in (sent 5 ms before), not the 200 ms RTO.
        let data = data_from_a(&n);
        let (probe, last_ack, srtt) = probe_timing(&n);
        assert_eq!(data.iter().filter(|d| d.1 == probe.1).count(), 2);
        assert_eq!(srtt, ms(10));
        assert_eq!(probe.0, last_ack + ms(5) + 2 * srtt + ms(2), "{cfg:?}");
        // Its ACK shows it repaired a loss (the echo is the probe's, or there is
        // no telling): cwnd reduced as for fast recovery (§7.4.2).
        assert_eq!(st.tlp_recoveries, 1);
        assert!(n.conn(0).ssthresh() < u32::MAX);
        // Without the probe, the timer.
        let off = tail_losses(
            TcpConfig {
                tail_loss_probe: false,
                ..cfg
            },
            &[29],
        );
        let st = off.conn(0).stats();
        assert_eq!((st.timeouts, st.tlp_probes), (1, 0));
        let resent = data_from_a(&off).last().unwrap().0;
        assert!(resent >= probe.0 + ms(150));
    }
}

/// The probe of a lone segment waits for the peer's ACK delay as configured
/// (`peer_ack_delay`, RFC 8985 §7.2's WCDelAckT) instead of 2 ms.
#[test]
fn tail_loss_probe_waits_for_the_peers_ack_delay() {
    let cfg = TcpConfig {
        peer_ack_delay: Some(ms(10)),
        ..fast_config()
    };
    let n = tail_losses(cfg, &[29]);
    let st = n.conn(0).stats();
    assert_eq!((st.timeouts, st.tlp_probes), (0, 1));
    let (probe, last_ack, srtt) = probe_timing(&n);
    assert_eq!(probe.0, last_ack + ms(5) + 2 * srtt + ms(10));
}

/// The last data segment end 0 sent (a probe), when end 1 sent the last ACK
/// before it, and end 0's SRTT.
fn probe_timing(n: &Net) -> ((Time, u32, usize), Time, Duration) {
    let probe = *data_from_a(n).last().unwrap();
    let last_ack = n
        .log
        .iter()
        .rfind(|s| s.from == 1 && s.at < probe.0)
        .unwrap()
        .at;
    (probe, last_ack, n.conn(0).srtt().unwrap())
}

#[test]
fn tail_loss_probe_starts_recovery_for_several_tail_losses() {
    for cfg in tlp_configs() {
        // The last four: the probe (the last segment again) repairs one, and its
        // ACK (a SACK of it, or a duplicate ACK) starts recovery for the others.
        let n = tail_losses(cfg.clone(), &[26, 27, 28, 29]);
        let st = n.conn(0).stats();
        assert_eq!(
            (st.timeouts, st.tlp_probes, st.tlp_recoveries),
            (0, 1, 1),
            "{cfg:?}"
        );
        assert_eq!(st.fast_retransmits, 3, "{cfg:?}");
    }
}

#[test]
fn tail_loss_probe_answered_by_the_original_is_no_loss() {
    // The ACK of the last segment is lost, not the segment: the probe draws an
    // ACK echoing the original's timestamp, so cwnd stays (RFC 8985 §7.4.2, with
    // timestamps in place of D-SACK).
    let mut n = established_pair(fast_config(), fast_config());
    let size = 30 * n.conn(0).send_mss();
    let end = last_from(&n, 0).seq.wrapping_add(size as u32);
    let mut dropped = false;
    n.pass = Box::new(move |s| {
        let hit = !dropped && s.from == 1 && s.ack == end;
        dropped |= hit;
        !hit
    });
    n.apps[0].out = pattern(size, 0);
    n.step();
    assert!(n.run_until(n.now + secs(10), |n| n.conn(0).send_queue_len() == 0));
    let st = n.conn(0).stats();
    assert_eq!(
        (st.timeouts, st.tlp_probes, st.tlp_recoveries),
        (0, 1, 0),
        "{st:?}"
    );
    assert_eq!(n.conn(0).ssthresh(), u32::MAX);
}

/// Timeouts of both ends, probes, and the time from the first data segment to
/// the last, summed over transfers of 20 KB both ways with 1% loss each way on a
/// 100 µs round trip: short flights, so many losses are at a tail.
fn short_rtt_loss(tail_loss_probe: bool, rack: bool) -> (u64, u64, Duration) {
    let faults = Faults {
        loss: 0.01,
        delay: Duration::from_micros(50),
        spacing: Duration::from_micros(12),
        ..Faults::default()
    };
    // Short flights (RFC 5681's initial window: 3, then 6, 12...) put many
    // losses at a tail.
    let cfg = TcpConfig {
        tail_loss_probe,
        rack,
        large_initial_window: false,
        ..fast_config()
    };
    let (mut timeouts, mut probes, mut took) = (0, 0, Duration::ZERO);
    for seed in 40..100 {
        let n = transfer(seed, faults, [20_000, 20_000], cfg.clone(), cfg.clone());
        for i in 0..2 {
            timeouts += n.conn(i).stats().timeouts;
            probes += n.conn(i).stats().tlp_probes;
        }
        let data: Vec<Time> = n.log.iter().filter(|s| s.len > 0).map(|s| s.at).collect();
        took += data[data.len() - 1].saturating_duration_since(data[0]);
    }
    (timeouts, probes, took)
}

#[test]
fn tail_loss_probe_saves_timeouts_on_a_short_lossy_path() {
    let (with, probes, took_with) = short_rtt_loss(true, false);
    let (without, none, took_without) = short_rtt_loss(false, false);
    let counts = format!(
        "{with} timeouts, {probes} probes, {took_with:?}; without: {without}, {took_without:?}"
    );
    assert_eq!(none, 0);
    assert!(probes > 0, "{counts}");
    assert!(with * 3 <= without, "{counts}");
    // Without the probe timer each of those waits 200 ms.
    assert!(took_with * 10 <= took_without, "{counts}");
}

#[test]
fn rack_repairs_a_lost_retransmission_without_a_timeout() {
    // `burst_losses`: five holes, and the first retransmission of 34 lost too.
    // The probe timer off, so that only RACK can find it before the RTO.
    let cfg = |rack| TcpConfig {
        tail_loss_probe: false,
        rack,
        ..TcpConfig::default()
    };
    let rack = burst_losses(cfg(true));
    let st = rack.conn(0).stats();
    let mss = rack.conn(0).send_mss();
    // The retransmissions of 36 and 38, sent after the lost one of 34, are
    // SACKed: 34 is lost again (RFC 8985 §6.2) and goes a third time, within
    // the round trip, no timeout.
    assert_eq!((st.timeouts, st.tlp_recoveries), (0, 0), "{st:?}");
    assert_eq!(st.rack_losses, 6, "{st:?}");
    assert_eq!(st.fast_retransmits, 6);
    assert_eq!(resent_bytes(&rack), 6 * mss);
    let data = data_from_a(&rack);
    assert!(data.last().unwrap().0.saturating_duration_since(data[0].0) < ms(200));
    // Without RACK the same pattern waits for the RTO (at least a second).
    let off = burst_losses(cfg(false));
    let st = off.conn(0).stats();
    assert_eq!((st.timeouts, st.rack_losses), (1, 0), "{st:?}");
    let data = data_from_a(&off);
    assert!(data.last().unwrap().0.saturating_duration_since(data[0].0) > secs(1));
}

/// End 0 sends 300 KB over the 10 ms round trip of [`established_pair`], its
/// segments 10 µs apart on the link; segment 60 arrives 15 µs late (overtaken by
/// the next one: reordering seen, nothing resent), segment 150 `late` late.
/// With `dsack`, end 0 first gets an ACK with a D-SACK block (RFC 2883 §4: below
/// the cumulative ACK).
fn reordered(cfg: TcpConfig, late: Duration, dsack: bool) -> Net {
    let mut n = established_pair(cfg.clone(), cfg);
    if dsack {
        let (una, seq, window) = (
            last_from(&n, 1).ack,
            last_from(&n, 0).ack,
            last_from(&n, 1).window,
        );
        let mut opts = [0u8; 40];
        let block = (una.wrapping_sub(100), una);
        let sack = [
            TcpOption::NoOp,
            TcpOption::NoOp,
            TcpOption::Sack([Some(block), None, None, None]),
        ];
        let len = write_options(&sack, &mut opts).unwrap();
        let mut r = forged(1, seq, una, flags::ACK, &[]);
        r.options = &opts[..len];
        r.window = window;
        let now = n.now;
        n.conn_mut(0).handle_segment(&r, now);
        assert_eq!(n.conn(0).stats().dsacks_received, 1);
    }
    n.faults.spacing = Duration::from_micros(10);
    let first = last_from(&n, 0).seq;
    let mss = n.conn(0).send_mss() as u32;
    let mut held = Vec::new();
    n.hold = Box::new(move |s| {
        let i = s.seq.wrapping_sub(first) / mss;
        if s.from != 0 || s.len == 0 || held.contains(&i) {
            return Duration::ZERO;
        }
        held.push(i);
        match i {
            60 => Duration::from_micros(15),
            150 => late,
            _ => Duration::ZERO,
        }
    });
    n.apps[0].out = pattern(300_000, 0);
    assert!(n.run_until(n.now + secs(60), |n| n.apps[1].got.len() == 300_000));
    assert!(n.apps[1].got == n.apps[0].out);
    n
}

#[test]
fn rack_waits_out_reordering_within_its_window() {
    // 1 ms late, under min_RTT / 4 = 2.5 ms: no retransmission with RACK, as
    // reordering was seen before (RFC 8985 §6.2 step 4), though dozens of
    // segments overtook it. The RACK timer was armed, and disarmed by the ACK.
    let n = reordered(TcpConfig::default(), ms(1), false);
    let st = n.conn(0).stats();
    assert_eq!(
        (
            st.retransmitted,
            st.rack_losses,
            st.rack_timeouts,
            st.timeouts
        ),
        (0, 0, 0, 0),
        "{st:?}"
    );
    assert!(st.sack_blocks_received > 20, "{st:?}");
    // DupThresh (RFC 6675) resends it at the third SACK.
    let off = reordered(
        TcpConfig {
            rack: false,
            ..TcpConfig::default()
        },
        ms(1),
        false,
    );
    let st = off.conn(0).stats();
    assert_eq!((st.retransmitted, st.fast_retransmits), (1, 1), "{st:?}");
    // 5 ms late, beyond the window: lost to RACK, resent once.
    let n = reordered(TcpConfig::default(), ms(5), false);
    let st = n.conn(0).stats();
    assert_eq!(
        (st.retransmitted, st.rack_losses, st.timeouts),
        (1, 1, 0),
        "{st:?}"
    );
}

#[test]
fn rack_timer_finds_losses_fewer_than_dupthresh_segments_show() {
    for timestamps in [true, false] {
        let cfg = |rack, tail_loss_probe| TcpConfig {
            timestamps,
            rack,
            tail_loss_probe,
            ..fast_config()
        };
        // 26 and 27 of 30 lost: only 28 and 29 SACKed, too few for DupThresh.
        let n = tail_losses(cfg(true, true), &[26, 27]);
        let st = n.conn(0).stats();
        assert_eq!(
            (st.timeouts, st.tlp_probes, st.tlp_recoveries),
            (0, 0, 0),
            "{st:?}"
        );
        assert_eq!((st.rack_timeouts, st.rack_losses), (1, 2), "{st:?}");
        assert_eq!(st.fast_retransmits, 2);
        // The reordering timer: the ACK SACKing 29 came (5 ms after it was sent)
        // a round trip after the flight left at one instant, so 26 and 27 were
        // due RACK.reo_wnd = min_RTT / 4 later (§6.3).
        let first = n.log.iter().find(|s| s.from == 0 && s.len > 0).unwrap().seq;
        let mss = n.conn(0).send_mss() as u32;
        let sack29 = n
            .log
            .iter()
            .find(|s| s.from == 1 && s.sack[0].is_some_and(|b| b.1 == first.wrapping_add(30 * mss)))
            .unwrap()
            .at
            + ms(5);
        assert_eq!(
            resent_at(&n, first.wrapping_add(26 * mss)),
            sack29 + ms(10) / 4
        );
        // Without RACK the probe timer stands in, two round trips later; without
        // either, the RTO.
        let tlp = tail_losses(cfg(false, true), &[26, 27]);
        let st = tlp.conn(0).stats();
        assert_eq!(
            (st.timeouts, st.tlp_recoveries, st.rack_timeouts),
            (0, 1, 0)
        );
        assert!(resent_at(&tlp, first.wrapping_add(26 * mss)) >= sack29 + ms(20));
        let neither = tail_losses(cfg(false, false), &[26, 27]);
        assert_eq!(neither.conn(0).stats().timeouts, 1);
    }
}

#[test]
fn rack_and_without_it_long_lossy_reordering_transfers_arrive_intact() {
    // A megabyte each way under loss, reordering past the window and
    // duplication, RACK on and off: both streams intact, clean close.
    let faults = Faults {
        loss: 0.02,
        dup: 0.01,
        reorder: 0.05,
        delay: ms(10),
        jitter: ms(2),
        spacing: Duration::from_micros(12),
        ..Faults::default()
    };
    for seed in 60..64 {
        let mut timeouts = [0; 2];
        for (k, rack) in [true, false].into_iter().enumerate() {
            let cfg = TcpConfig {
                rack,
                ..fast_config()
            };
            let n = transfer(seed, faults, [1 << 20, 1 << 20], cfg.clone(), cfg);
            for i in 0..2 {
                let st = n.conn(i).stats();
                assert_eq!(st.rack_losses > 0, rack, "{st:?}");
                timeouts[k] += st.timeouts;
            }
        }
        assert!(timeouts[0] <= timeouts[1], "{timeouts:?}");
    }
}

#[test]
fn dsack_widens_the_reordering_window() {
    // 4 ms late: beyond min_RTT / 4, within twice that, to which a D-SACK
    // widens the window (RFC 8985 §6.2 step 4).
    let plain = reordered(TcpConfig::default(), ms(4), false);
    let st = plain.conn(0).stats();
    assert_eq!((st.retransmitted, st.rack_losses), (1, 1), "{st:?}");
    let widened = reordered(TcpConfig::default(), ms(4), true);
    let st = widened.conn(0).stats();
    assert_eq!((st.retransmitted, st.rack_losses), (0, 0), "{st:?}");
    // The D-SACK block went into no scoreboard.
    assert_eq!((st.sack_blocks_ignored, st.dsacks_received), (1, 1));
}

#[test]
fn an_ack_moving_snd_una_and_sacking_new_data_is_a_duplicate() {
    // RFC 6675 §2 and §5. The receiver takes a whole flight in one step and
    // answers each segment after it, so only the first ACK SACKs anything
    // new, and it also moves SND.UNA: to 5 for a loss of 5 (within the first
    // flight, 0 to 9), to 22 for 22 (after 21, the third flight's first).
    // Fast retransmit, not the RTO, must repair the loss all the same.
    let cfg = TcpConfig {
        rack: false,
        tail_loss_probe: false,
        ..fast_config()
    };
    for loss in [&[5][..], &[22]] {
        let n = tail_losses(cfg.clone(), loss);
        let st = n.conn(0).stats();
        assert_eq!(
            (st.timeouts, st.fast_retransmits, st.retransmitted),
            (0, 1, 1),
            "{loss:?}: {st:?}"
        );
    }
}

#[test]
fn an_ack_sacking_new_data_with_a_new_window_is_a_duplicate() {
    // RFC 6675 §2, where the window changes alone: a receiver reading while
    // it holds out-of-order data announces a new window with each ACK.
    let cfg = TcpConfig {
        timestamps: false,
        rack: false,
        tail_loss_probe: false,
        ..fast_config()
    };
    let mut n = established_pair(cfg.clone(), cfg);
    let (first, b_seq) = b_view(&n);
    let mss = n.conn(0).send_mss() as u32;
    n.pass = Box::new(|s| !(s.from == 0 && s.len > 0));
    n.apps[0].out = pattern(10 * mss as usize, 0);
    n.run_apps();
    n.flush();
    // Segments 1 to 4 SACKed, 0 missing, and a window unlike the last one.
    let mut options = vec![1, 1, 5, 10];
    options.extend(first.wrapping_add(mss).to_be_bytes());
    options.extend(first.wrapping_add(5 * mss).to_be_bytes());
    let ack = TcpRepr {
        options: &options,
        ..forged(1, b_seq, first, flags::ACK, &[])
    };
    let sent = answer(&mut n, 0, &ack);
    // Fast retransmit at once, no time having passed.
    assert!(sent.iter().any(|s| s.seq == first && s.len > 0), "{sent:?}");
    assert_eq!(n.conn(0).stats().timeouts, 0);
}

#[test]
fn rescue_retransmission_repairs_a_tail_loss_in_recovery() {
    // 22 and 29 lost in the last flight, the probe timer off: recovery for 22
    // begins with 29 outstanding beyond the highest SACKed byte, no segment
    // sent after it.
    let cfg = |rack| TcpConfig {
        rack,
        tail_loss_probe: false,
        ..fast_config()
    };
    let n = tail_losses(cfg(false), &[22, 29]);
    let st = n.conn(0).stats();
    // Rules (1)–(3) have nothing to send after 22: the rescue (RFC 6675 NextSeg
    // rule (4)) resends 29 at once (without it, DupThresh never marks 29 and the
    // RTO repairs it).
    assert_eq!(
        (st.timeouts, st.retransmitted, st.rescue_retransmits),
        (0, 2, 1),
        "{st:?}"
    );
    let first = n.log.iter().find(|s| s.from == 0 && s.len > 0).unwrap().seq;
    let mss = n.conn(0).send_mss() as u32;
    let at = |n: &Net, i: u32| resent_at(n, first.wrapping_add(i * mss));
    assert_eq!(at(&n, 22), at(&n, 29));
    // RACK needs no rescue: 22's retransmission, delivered, shows 29 lost a
    // round trip later (RACK.reo_wnd is zero in recovery while no reordering
    // was seen).
    let n = tail_losses(cfg(true), &[22, 29]);
    let st = n.conn(0).stats();
    assert_eq!(
        (st.timeouts, st.rescue_retransmits, st.rack_losses),
        (0, 0, 2),
        "{st:?}"
    );
    assert_eq!(at(&n, 29), at(&n, 22) + ms(10));
}

/// A bulk transfer of 8 MB from end 0 through a bottleneck: 10 ms each way, a
/// segment per 100 µs (a bandwidth-delay product of 200 segments) and a queue of
/// `queue` segments; the receiver acknowledges every second segment, so that its
/// ACKs do not queue. Returns the sender's counters at the first drop at the
/// queue (or the end, if none), and the network after the whole transfer.
fn through_bottleneck(
    congestion: Congestion,
    hystart: bool,
    queue: usize,
    (timestamps, sack): (bool, bool),
) -> (TcpStats, Net) {
    let cfg = TcpConfig {
        congestion,
        hystart,
        timestamps,
        sack,
        send_buffer: 8 << 20,
        recv_buffer: 8 << 20,
        recv_buffer_max: 8 << 20,
        delayed_ack: Some(ms(1)),
        ..fast_config()
    };
    let faults = Faults {
        delay: ms(10),
        spacing: Duration::from_micros(100),
        queue,
        ..Faults::default()
    };
    let size = 8 << 20;
    let mut n = Net::client_server(11, faults, cfg.clone(), cfg);
    n.apps[0].out = pattern(size, 0);
    n.apps[1].read = true;
    n.run_until(at(secs(60)), |n| {
        n.queue_drops > 0 || n.apps[1].got.len() == size
    });
    let at_first_drop = n.conn(0).stats().clone();
    (at_first_drop, transfer_with(n, [size, 0], 0))
}

/// [`through_bottleneck`] with and without HyStart++: the counters at the first
/// drop with it, both networks after, and the counts compared for messages.
fn bottleneck_with_and_without(
    congestion: Congestion,
    queue: usize,
) -> (TcpStats, Net, Net, String) {
    let (first_drop, with) = through_bottleneck(congestion, true, queue, (true, true));
    let (first_drop_off, without) = through_bottleneck(congestion, false, queue, (true, true));
    let (st, st_off) = (with.conn(0).stats(), without.conn(0).stats());
    // Without HyStart++ slow start ends by the loss.
    assert_eq!((first_drop_off.css_entries, st_off.css_entries), (0, 0));
    assert_eq!(st_off.hystart_exits, 0);
    let counts = format!(
        "{congestion:?}, a queue of {queue}: {} drops, {} retransmitted, {} timeouts; \
         without HyStart++: {}, {}, {}",
        with.queue_drops,
        st.retransmitted,
        st.timeouts,
        without.queue_drops,
        st_off.retransmitted,
        st_off.timeouts
    );
    (first_drop, with, without, counts)
}

#[test]
fn hystart_leaves_slow_start_before_the_queue_overflows() {
    // A deep buffer (5 × BDP, 100 ms): slow start overshoots it by hundreds of
    // segments, while the RTT rises long before.
    for congestion in [Congestion::Cubic, Congestion::NewReno] {
        let (first_drop, with, without, counts) = bottleneck_with_and_without(congestion, 1000);
        let (st, st_off) = (with.conn(0).stats(), without.conn(0).stats());
        // Slow start ended by HyStart++ before anything was lost. CSS may be
        // left and entered again first: its baseline is the minimum of part of
        // a round, and a lower sample later in that round ends it (RFC 9406
        // §4.3; FreeBSD's implementation notes the same oscillation).
        assert!(first_drop.css_entries >= 1, "{counts}");
        assert_eq!(first_drop.hystart_exits, 1, "{counts}");
        assert_eq!(first_drop.retransmitted, 0, "{counts}");
        // Fewer losses, fewer segments sent again.
        assert!(with.queue_drops * 10 < without.queue_drops, "{counts}");
        assert!(st.retransmitted * 10 < st_off.retransmitted, "{counts}");
        assert_eq!(st.timeouts, st_off.timeouts, "{counts}");
    }
}

#[test]
fn hystart_loss_in_css_still_fewer_losses() {
    // A buffer of 1.5 × BDP: the RTT rises a round or two before the queue
    // overflows, too late to leave CSS first; the loss ends it (RFC 9406 §4.2),
    // but growing at a quarter of the rate meanwhile overflows it by less.
    let (first_drop, with, without, counts) = bottleneck_with_and_without(Congestion::Cubic, 300);
    let (st, st_off) = (with.conn(0).stats(), without.conn(0).stats());
    // In CSS, entered once or more (see above), and never left for
    // congestion avoidance: the loss ended it.
    assert!(first_drop.css_entries >= 1, "{counts}");
    assert_eq!(first_drop.hystart_exits, 0, "{counts}");
    assert_eq!(st.css_entries, first_drop.css_entries, "{counts}");
    assert_eq!(st.hystart_exits, 0, "{counts}");
    assert!(with.queue_drops * 2 < without.queue_drops, "{counts}");
    assert!(st.retransmitted * 2 < st_off.retransmitted, "{counts}");
}

#[test]
fn hystart_changes_nothing_while_rtt_is_flat() {
    // Without a queue the RTT never rises: the same segments at the same times
    // with HyStart++ as without.
    let run = |hystart| {
        let cfg = TcpConfig {
            hystart,
            ..fast_config()
        };
        let faults = Faults {
            loss: 0.01,
            delay: ms(10),
            ..Faults::default()
        };
        let n = transfer(5, faults, [2_000_000, 50_000], cfg.clone(), cfg);
        let log: Vec<_> = n
            .log
            .iter()
            .map(|s| (s.at, s.from, s.seq, s.ack, s.len))
            .collect();
        (log, n.conn(0).stats().clone())
    };
    let (with, st) = run(true);
    let (without, st_off) = run(false);
    assert!(st.ts_rtt_samples > 100 && st.retransmitted > 0, "{st:?}");
    assert_eq!(st.css_entries, 0);
    assert_eq!(st, st_off);
    assert!(with == without);
}

/// A client at end 0 and a listener at end 1 that answers with SYN cookies only.
fn cookie_pair(faults: Faults, a: TcpConfig, b: TcpConfig) -> Net {
    let mut n = Net::client_server(11, faults, a, b);
    n.cookies = true;
    n
}

#[test]
fn syn_cookie_connection_agrees_options_and_carries_data_both_ways() {
    let n = transfer_with(
        cookie_pair(quiet(), fast_config(), fast_config()),
        [300_000, 200_000],
        0,
    );
    // One SYN-ACK, its ISS the cookie, and the connection made by the ACK.
    let synacks: Vec<&Sent> = n
        .log
        .iter()
        .filter(|s| s.from == 1 && s.has(flags::SYN))
        .collect();
    assert_eq!(synacks.len(), 1);
    let ts = synacks[0].ts.expect("timestamps on the SYN-ACK").0;
    // The peer's window scale (7, for 4 MiB) and SACK-permitted in the low bits.
    assert_eq!(ts & 0x1f, 7 | 0x10);
    for c in [n.conn(0), n.conn(1)] {
        assert!(c.timestamps() && c.sack());
        assert_eq!(c.window_scales(), Some((7, 7)));
    }
    // 1460 offered, 1460 in the table, less the timestamps.
    assert_eq!(n.conn(1).send_mss(), 1460 - 12);
}

#[test]
fn syn_cookie_without_timestamps_goes_without_window_scaling_and_sack() {
    let a = TcpConfig {
        timestamps: false,
        mss: 1400,
        ..fast_config()
    };
    let n = transfer_with(
        cookie_pair(quiet(), a, fast_config()),
        [100_000, 100_000],
        0,
    );
    for c in [n.conn(0), n.conn(1)] {
        assert!(!c.timestamps() && !c.sack());
        assert_eq!(c.window_scales(), None);
    }
    assert_eq!(n.conn(1).send_mss(), 1400);
}

#[test]
fn syn_cookie_mss_is_the_tables_below_the_offer() {
    let a = TcpConfig {
        mss: 1300,
        ..fast_config()
    };
    let n = transfer_with(cookie_pair(quiet(), a, fast_config()), [50_000, 50_000], 0);
    // 1220 is the largest entry not above 1300.
    assert_eq!(n.conn(1).send_mss(), 1220 - 12);
}

#[test]
fn syn_cookie_survives_a_lost_syn_ack_and_a_lost_ack() {
    let mut n = cookie_pair(quiet(), fast_config(), fast_config());
    let (mut synacks, mut acks) = (0, 0);
    n.pass = Box::new(move |s| {
        if s.from == 1 && s.has(flags::SYN) {
            synacks += 1;
            return synacks > 1;
        }
        if s.from == 0 && s.flags == flags::ACK && s.len == 0 {
            acks += 1;
            return acks > 1;
        }
        true
    });
    // The SYN sent again gets a cookie again; the lost ACK is made good by the
    // first data segment, which acknowledges the SYN-ACK as well.
    let n = transfer_with(n, [20_000, 20_000], 0);
    let synacks = n.log.iter().filter(|s| s.from == 1 && s.has(flags::SYN));
    assert_eq!(synacks.count(), 2);
}

#[test]
fn forged_acks_to_a_cookie_listener_make_nothing() {
    let mut n = cookie_pair(quiet(), fast_config(), fast_config());
    let mut rng = SplitMix64::new(99);
    for _ in 0..10_000 {
        let (seq, ack) = (rng.next_u64() as u32, rng.next_u64() as u32);
        let sent: Vec<Sent> = answer(&mut n, 1, &forged(0, seq, ack, flags::ACK, b"data"))
            .into_iter()
            .filter(|s| s.from == 1)
            .collect();
        assert!(n.ends[1].is_none());
        // RFC 9293 §3.10.7.2: LISTEN answers an ACK with <SEQ=SEG.ACK><CTL=RST>.
        assert_eq!(sent.len(), 1);
        assert!(sent[0].has(flags::RST) && sent[0].seq == ack);
    }
}

/// End 0 sends 8 MB over a 100 ms round trip, a segment per 2 µs on the link;
/// 0.5% of its data segments (retransmissions too) are dropped. Returns the
/// network and how many were.
fn random_data_losses(rack: bool) -> (Net, u64) {
    let cfg = TcpConfig {
        rack,
        send_buffer: 16 << 20,
        recv_buffer: 4 << 20,
        ..fast_config()
    };
    let faults = Faults {
        delay: ms(50),
        spacing: Duration::from_micros(2),
        ..Faults::default()
    };
    let mut n = Net::client_server(3, faults, cfg.clone(), cfg);
    let mut rng = SplitMix64::new(9);
    let dropped = std::rc::Rc::new(std::cell::Cell::new(0));
    let count = dropped.clone();
    n.pass = Box::new(move |s| {
        let drop = s.from == 0 && s.len > 0 && rng.chance(0.005);
        count.set(count.get() + u64::from(drop));
        !drop
    });
    let n = transfer_with(n, [8 << 20, 0], 0);
    let dropped = dropped.get();
    (n, dropped)
}

#[test]
fn rack_resends_exactly_the_lost_segments() {
    // Without reordering RACK marks lost just what was dropped, lost
    // retransmissions included, and nothing waits for the RTO.
    let (n, dropped) = random_data_losses(true);
    let st = n.conn(0).stats();
    assert!(dropped > 20, "{dropped}");
    assert_eq!(
        (st.retransmitted, st.rack_losses, st.timeouts),
        (dropped, dropped, 0),
        "{dropped} dropped: {st:?}"
    );
    // Without RACK, a lost retransmission waits for the RTO.
    let (n, dropped_off) = random_data_losses(false);
    let st = n.conn(0).stats();
    assert_eq!(dropped_off, dropped);
    assert!(st.timeouts >= 1, "{st:?}");
}

/// RFC 2883 §4: data that arrives twice is reported by the next ACK's first
/// SACK block, below the cumulative ACK, once; the sender counts it as a
/// D-SACK. Without SACK nothing is reported.
#[test]
fn duplicated_data_draws_dsacks() {
    let faults = Faults {
        dup: 0.05,
        delay: ms(5),
        spacing: Duration::from_micros(12),
        ..Faults::default()
    };
    let n = transfer(21, faults, [300_000, 0], fast_config(), fast_config());
    let (sender, receiver) = (n.conn(0).stats(), n.conn(1).stats());
    assert!(receiver.dsacks_sent > 0, "{receiver:?}");
    assert!(sender.dsacks_received >= receiver.dsacks_sent, "{sender:?}");
    // Each D-SACK block (below the ACK it rides on, or inside the second
    // block) names data that end 0 did send.
    let dsacks: Vec<_> = n
        .log
        .iter()
        .filter(|s| s.from == 1)
        .filter_map(|s| match (s.sack[0], s.sack[1]) {
            (Some((l, r)), second)
                if SeqNum(r) <= SeqNum(s.ack)
                    || second.is_some_and(|(sl, sr)| {
                        SeqNum(sl) <= SeqNum(l) && SeqNum(r) <= SeqNum(sr)
                    }) =>
            {
                Some((l, r))
            }
            _ => None,
        })
        .collect();
    assert_eq!(dsacks.len() as u64, receiver.dsacks_sent);
    for (l, r) in dsacks {
        assert!(SeqNum(l) < SeqNum(r));
        assert!(n.log.iter().any(|s| s.from == 0 && s.seq == l && s.len > 0));
    }

    let no_sack = TcpConfig {
        sack: false,
        ..fast_config()
    };
    let n = transfer(21, faults, [300_000, 0], no_sack.clone(), no_sack);
    assert_eq!(n.conn(1).stats().dsacks_sent, 0);
}

/// RFC 2883 §4 (example 5): a duplicate of data held beyond a hole is reported
/// as the first SACK block, the block that holds it second; once.
#[test]
fn a_duplicate_beyond_a_hole_is_reported_before_its_block() {
    let mut n = established_pair(fast_config(), fast_config());
    let (rcv_nxt, snd_nxt) = b_view(&n);
    let ahead = rcv_nxt.wrapping_add(1000);
    let data = [7u8; 100];
    let acks =
        |sent: Vec<Sent>| -> Vec<Sent> { sent.into_iter().filter(|s| s.from == 1).collect() };
    let first = acks(answer(
        &mut n,
        1,
        &forged(0, ahead, snd_nxt, flags::ACK, &data),
    ));
    assert_eq!(first[0].sack[0], Some((ahead, ahead + 100)));
    assert_eq!(first[0].sack[1], None);
    let again = forged(0, ahead + 20, snd_nxt, flags::ACK, &data[..50]);
    let second = acks(answer(&mut n, 1, &again));
    assert_eq!(second[0].sack[0], Some((ahead + 20, ahead + 70)));
    assert_eq!(second[0].sack[1], Some((ahead, ahead + 100)));
    assert_eq!(n.conn(1).stats().dsacks_sent, 1);
    // New data beyond the hole: a plain SACK again.
    let more = forged(0, ahead + 100, snd_nxt, flags::ACK, &data);
    let third = acks(answer(&mut n, 1, &more));
    assert_eq!(third[0].sack[0], Some((ahead, ahead + 200)));
    assert_eq!(n.conn(1).stats().dsacks_sent, 1);
}

/// Without timestamps, HyStart++ takes its per-ACK RTT samples from RACK's
/// send times (segments sent once), with SACK or without it (the send times
/// are kept for HyStart++ alone then): it still leaves slow start before the
/// queue overflows.
#[test]
fn hystart_without_timestamps_samples_rtt_from_rack() {
    for sack in [true, false] {
        let (first_drop, with) = through_bottleneck(Congestion::Cubic, true, 1000, (false, sack));
        let (_, without) = through_bottleneck(Congestion::Cubic, false, 1000, (false, sack));
        assert!(!with.conn(0).timestamps());
        assert_eq!(with.conn(0).sack(), sack);
        let counts = format!(
            "SACK {sack}: {} drops with HyStart++, {} without",
            with.queue_drops, without.queue_drops
        );
        assert_eq!(first_drop.hystart_exits, 1, "{counts}");
        assert_eq!(first_drop.retransmitted, 0, "{counts}");
        assert!(with.queue_drops * 10 < without.queue_drops, "{counts}");
    }
}

/// `winding_down` (what lets a closed socket's channel go quiet) holds once
/// the FIN is sent with at most one segment of data unacknowledged before
/// it: at once for a short answer and its FIN, only at the end for a bulk.
#[test]
fn winding_down_waits_for_the_fin_and_a_short_flight() {
    let mut n = established_pair(fast_config(), fast_config());
    n.apps[0].out = pattern(100, 3);
    n.apps[0].close_when_written = true;
    n.run_apps();
    n.flush();
    assert_eq!(n.state(0), TcpState::FinWait1);
    assert!(n.conn(0).winding_down(), "a short answer and its FIN");
    assert!(!n.conn(1).winding_down(), "the peer sent no FIN");
    assert!(n.run_until(at(secs(5)), |n| n.state(1) == TcpState::CloseWait));

    let mut n = established_pair(fast_config(), fast_config());
    n.apps[0].out = pattern(40_000, 4);
    n.apps[0].close_when_written = true;
    let mss = n.conn(0).send_mss() as u32;
    let (long, short) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    assert!(n.run_until(at(secs(10)), |n| {
        let c = n.conn(0);
        let (_, una, max, _, _) = c.view();
        let fin_sent = n
            .log
            .iter()
            .any(|s| s.from == 0 && s.flags & flags::FIN != 0);
        let flight = max.wrapping_sub(una);
        assert_eq!(c.winding_down(), fin_sent && flight <= mss + 1, "{flight}");
        if fin_sent {
            let seen = if flight > mss + 1 { &long } else { &short };
            seen.set(seen.get() + 1);
        }
        n.state(0) == TcpState::FinWait2
    }));
    // The FIN went with a long flight before it, which shrank to the end.
    assert!(long.get() > 0 && short.get() > 0, "{long:?} {short:?}");
}

/// An abandoned connection (its socket closed) whose peer never closes
/// leaves FIN-WAIT-2 after `fin_wait2_timeout`, abandoned before or after it
/// got there; one whose application only shut down writing waits for the
/// peer's FIN as long as it takes.
#[test]
fn fin_wait2_of_an_abandoned_connection_is_bounded() {
    let cfg = TcpConfig {
        fin_wait2_timeout: secs(60),
        ..fast_config()
    };
    for abandon in [None, Some(false), Some(true)] {
        let mut n = established_pair(cfg.clone(), cfg.clone());
        n.conn_mut(0).close();
        let now = n.now;
        if abandon == Some(false) {
            n.conn_mut(0).abandon(now);
        }
        assert!(n.run_until(at(secs(5)), |n| n.state(0) == TcpState::FinWait2));
        let mut from = n.now;
        if abandon == Some(true) {
            assert!(!n.run_until(from + secs(10), |n| n.state(0) != TcpState::FinWait2));
            from = n.now;
            n.conn_mut(0).abandon(from);
        }
        let gone = n.run_until(from + secs(120), |n| n.state(0) == TcpState::Closed);
        if abandon.is_some() {
            assert!(gone, "{abandon:?}");
            assert_eq!(n.now, from + secs(60), "{abandon:?}");
            assert_eq!(n.conn(0).error(), Some(TcpError::TimedOut));
        } else {
            assert!(!gone);
            assert_eq!(n.state(0), TcpState::FinWait2);
        }
        assert_eq!(n.state(1), TcpState::CloseWait);
    }
}
