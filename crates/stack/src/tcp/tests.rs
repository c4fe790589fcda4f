//! Two connections back to back over a simulated network in simulated time, with
//! seeded loss, duplication, reordering and delay.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use exonet_wire::rng::SplitMix64;
use exonet_wire::tcp::flags;
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
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ (i >> 8) as u8 ^ salt).collect()
}

#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    loss: f64,
    dup: f64,
    /// Chance that a segment takes an extra `jitter` × 3, overtaken by later ones.
    reorder: f64,
    delay: Duration,
    jitter: Duration,
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
    faults: Faults,
    rng: SplitMix64,
    wire: Vec<InFlight>,
    order: u64,
    log: Vec<Sent>,
    /// Returns false for segments the test drops on purpose.
    pass: Filter,
}

impl Net {
    fn new(seed: u64, faults: Faults) -> Net {
        Net {
            now: Time::ZERO,
            ends: [None, None],
            apps: [App::default(), App::default()],
            listener: None,
            faults,
            rng: SplitMix64::new(seed),
            wire: Vec::new(),
            order: 0,
            log: Vec::new(),
            pass: Box::new(|_| true),
        }
    }

    /// End 0 connects to a listener at end 1.
    fn client_server(seed: u64, faults: Faults, a: TcpConfig, b: TcpConfig) -> Net {
        let mut n = Net::new(seed, faults);
        let iss = initial_sequence_number(&KEY, ADDR[0], ADDR[1], n.now);
        n.ends[0] = Some(Connection::connect(a, ADDR[0], ADDR[1], iss));
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
        self.ends[i].as_ref().map_or(TcpState::Closed, Connection::state)
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
                loop {
                    let n = c.recv(&mut buf);
                    if n == 0 {
                        break;
                    }
                    app.got.extend_from_slice(&buf[..n]);
                }
            }
        }
    }

    fn flush(&mut self) {
        let mut buf = [0u8; 1600];
        for i in 0..2 {
            while let Some(n) = self.ends[i]
                .as_mut()
                .and_then(|c| c.poll_transmit(self.now, &mut buf))
            {
                self.put(i, buf[..n].to_vec());
            }
        }
    }

    fn put(&mut self, from: usize, bytes: Vec<u8>) {
        let p = TcpPacket::new_checked(&bytes[..]).expect("well-formed segment");
        let r = TcpRepr::parse(&p, *ADDR[from].ip(), *ADDR[1 - from].ip()).expect("checksum");
        // etherparse as an independent reading of the same bytes.
        let (h, payload) = etherparse::TcpHeader::from_slice(&bytes).expect("etherparse reads it");
        assert_eq!(
            (h.sequence_number, h.acknowledgment_number, h.window_size, h.syn, h.fin, h.rst),
            (r.seq_number, r.ack_number, r.window, r.flags & flags::SYN != 0, r.flags & flags::FIN != 0, r.flags & flags::RST != 0)
        );
        let sum = h
            .calc_checksum_ipv4_raw(ADDR[from].ip().octets(), ADDR[1 - from].ip().octets(), payload)
            .unwrap();
        assert_eq!(sum, h.checksum);
        let sent = Sent {
            at: self.now,
            from,
            seq: r.seq_number,
            ack: r.ack_number,
            flags: r.flags,
            window: r.window,
            len: r.payload.len(),
        };
        self.log.push(sent);
        if !(self.pass)(&sent) || self.rng.chance(self.faults.loss) {
            return;
        }
        let copies = if self.rng.chance(self.faults.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let jitter = self.faults.jitter.as_nanos() as u64;
            let mut d = self.faults.delay + Duration::from_nanos(self.rng.below(jitter + 1));
            if self.rng.chance(self.faults.reorder) {
                d += self.faults.jitter * 3;
            }
            self.order += 1;
            self.wire.push(InFlight {
                at: self.now + d,
                order: self.order,
                to: 1 - from,
                bytes: bytes.clone(),
            });
        }
    }

    fn deliver(&mut self, to: usize, bytes: &[u8]) {
        let p = TcpPacket::new_checked(bytes).unwrap();
        let r = TcpRepr::parse(&p, *ADDR[1 - to].ip(), *ADDR[to].ip()).unwrap();
        self.inject(to, &r);
    }

    /// Hands `r` to end `to`, or to its listener.
    fn inject(&mut self, to: usize, r: &TcpRepr) {
        let now = self.now;
        match (&mut self.ends[to], &self.listener) {
            (Some(c), _) if c.state() != TcpState::Closed => c.handle_segment(r, now),
            (_, Some(cfg)) if to == 1 => {
                let iss = initial_sequence_number(&KEY, ADDR[1], ADDR[0], now);
                match Connection::accept(cfg.clone(), ADDR[1], ADDR[0], iss, r) {
                    Some(c) => self.ends[1] = Some(c),
                    None => self.reply_closed(to, r),
                }
            }
            _ => self.reply_closed(to, r),
        }
    }

    fn reply_closed(&mut self, at: usize, r: &TcpRepr) {
        if let Some(rst) = reset_for_closed(r) {
            let mut buf = vec![0; rst.buffer_len()];
            rst.emit(&mut buf, *ADDR[at].ip(), *ADDR[1 - at].ip()).unwrap();
            self.put(at, buf);
        }
    }

    /// Lets the applications act, sends what the ends have, then advances to the
    /// next event and handles it. False when nothing is left to happen.
    fn step(&mut self) -> bool {
        self.run_apps();
        self.flush();
        let next = self
            .wire
            .iter()
            .map(|s| s.at)
            .chain(self.ends.iter().flatten().filter_map(Connection::poll_timeout))
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
    let mut n = Net::client_server(seed, faults, a, b);
    for (i, app) in n.apps.iter_mut().enumerate() {
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
    for i in 0..2 {
        assert_eq!(n.conn(i).error(), None);
        assert!(n.apps[1 - i].got == n.apps[i].out, "stream from {i} damaged");
    }
    n
}

#[test]
fn transfer_both_ways_and_clean_close() {
    let n = transfer(1, Faults { delay: ms(5), ..Faults::default() }, [300_000, 100_000], fast_config(), fast_config());
    // The handshake: SYN, SYN-ACK, ACK, each SYN with an MSS option of 1460.
    let (syn, synack) = (n.log[0], n.log[1]);
    assert!(syn.has(flags::SYN) && !syn.has(flags::ACK) && syn.from == 0);
    assert!(synack.has(flags::SYN | flags::ACK) && synack.ack == syn.seq.wrapping_add(1));
    assert!(n.log.iter().filter(|s| s.len > 0).all(|s| s.len <= 1460));
    assert_eq!(n.conn(0).send_mss(), 1460);
    // Nothing was lost, so nothing was sent twice.
    let data: Vec<_> = n.log.iter().filter(|s| s.len > 0).collect();
    let mut seqs: Vec<_> = data.iter().map(|s| (s.from, s.seq)).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), data.len());
    // 20 ms handshake RTT measured, RTO at its floor.
    assert_eq!(n.conn(0).srtt().map(|d| d >= ms(10)), Some(true));
}

#[test]
fn lossy_network_delivers_intact() {
    let faults = Faults {
        loss: 0.05,
        dup: 0.03,
        reorder: 0.1,
        delay: ms(10),
        jitter: ms(4),
    };
    let n = transfer(7, faults, [400_000, 200_000], fast_config(), fast_config());
    // Losses were repaired by sending again.
    let data: Vec<_> = n.log.iter().filter(|s| s.len > 0).collect();
    let mut seqs: Vec<_> = data.iter().map(|s| (s.from, s.seq)).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert!(seqs.len() < data.len());
    println!("{} data segments, {} distinct, done at {:?}", data.len(), seqs.len(), n.now);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

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
        mss in 100u16..1460,
    ) {
        let faults = Faults { loss, dup, reorder, delay: ms(3), jitter: ms(2) };
        let cfg = TcpConfig { nagle, mss, recv_buffer: 8192, ..fast_config() };
        transfer(seed, faults, [a_len, b_len], cfg.clone(), cfg);
    }
}
