//! TCP connections whose application goes (Thekkath §III-D): the
//! multiplexer resets what was abandoned and holds TIME-WAIT, checked on
//! the wire with etherparse.

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;
use etherparse::{Ipv4HeaderSlice, TcpSlice};
use exonet_link::memwire::MemWire;
use exonet_link::Link;
use exonet_mux::{
    ChannelId, ChannelSpec, EndpointId, Mux, MuxConfig, MuxError, Proto, QUIET_FIN_WAKE,
};
use exonet_shm::{AppEndpoint, Desc};
use exonet_wire::build;
use exonet_wire::tcp::flags::{ACK, FIN, RST, SYN};
use exonet_wire::tcp::TcpOption;
use proptest::prelude::*;

const PEER_PORT: u16 = 80;
/// Our initial sequence number, and the peer's.
const ISS: u32 = 1000;
const IRS: u32 = 5000;

fn tcp(local_port: u16, remote: Option<(Ipv4Addr, u16)>) -> ChannelSpec {
    ChannelSpec {
        proto: Proto::Tcp,
        local_addr: HOST,
        local_port,
        remote,
    }
}

/// What etherparse reads in a TCP segment on the wire.
#[derive(Debug, PartialEq, Eq)]
struct Wire {
    dst_mac: [u8; 6],
    from: (Ipv4Addr, u16),
    to: (Ipv4Addr, u16),
    flags: (bool, bool, bool, bool),
    seq: u32,
    ack: u32,
}

/// A segment from the peer's port `from` to our `port`, without options.
fn from_peer(from: u16, port: u16, fl: u8, seq: u32, ack: u32, data: &[u8]) -> Vec<u8> {
    build::tcp_frame(
        PEER_MAC,
        HOST_MAC,
        PEER,
        HOST,
        from,
        port,
        fl,
        seq,
        ack,
        &[],
        data,
    )
}

/// A segment from our `port` to the peer's, without options.
fn to_peer(port: u16, fl: u8, seq: u32, ack: u32, data: &[u8]) -> Vec<u8> {
    tcp_to_peer(port, PEER_PORT, fl, seq, ack, data)
}

/// Reads a segment, checking both checksums.
fn read(f: &[u8]) -> Wire {
    let ip = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
    assert_eq!(
        ip.to_header().calc_header_checksum(),
        ip.header_checksum(),
        "IP checksum"
    );
    assert_eq!(ip.protocol(), etherparse::IpNumber::TCP);
    let end = 14 + ip.total_len() as usize;
    let seg = TcpSlice::from_slice(&f[14 + ip.slice().len()..end]).unwrap();
    let sum = seg
        .calc_checksum_ipv4(ip.source(), ip.destination())
        .unwrap();
    assert_eq!(sum, seg.checksum(), "TCP checksum");
    assert!(seg.payload().is_empty());
    Wire {
        dst_mac: f[..6].try_into().unwrap(),
        from: (ip.source_addr(), seg.source_port()),
        to: (ip.destination_addr(), seg.destination_port()),
        flags: (seg.syn(), seg.fin(), seg.rst(), seg.ack()),
        seq: seg.sequence_number(),
        ack: seg.acknowledgment_number(),
    }
}

/// A segment from us to the peer, at `port`.
fn rst_from(port: u16, seq: u32) -> Wire {
    Wire {
        dst_mac: PEER_MAC.0,
        from: (HOST, port),
        to: (PEER, PEER_PORT),
        flags: (false, false, true, false),
        seq,
        ack: 0,
    }
}

fn ack_from(port: u16, seq: u32, ack: u32) -> Wire {
    Wire {
        flags: (false, false, false, true),
        ack,
        ..rst_from(port, seq)
    }
}

/// An application endpoint with TCP connection channels to [`PEER`].
struct App {
    ep: EndpointId,
    app: AppEndpoint,
    buf: u32,
}

struct Net {
    mux: Mux,
    wire: MemWire,
}

impl Net {
    fn new(config: MuxConfig) -> Net {
        let (mux, wire) = mux_with(config);
        Net { mux, wire }
    }

    /// With TIME-WAIT holds of 2 × `msl`.
    fn with_msl(msl: Duration) -> Net {
        Net::new(MuxConfig {
            msl,
            ..MuxConfig::default()
        })
    }

    fn app(&mut self) -> App {
        let (ep, app, bufs) = endpoint(&mut self.mux, 16, false);
        App {
            ep,
            app,
            buf: bufs[0],
        }
    }

    /// An application listening on `port`, and its listener's channel.
    fn listening(&mut self, port: u16) -> (App, ChannelId) {
        let a = self.app();
        let (listener, _) = self.mux.bind_socket(a.ep, tcp(port, None)).unwrap();
        (a, listener)
    }

    /// A connection channel to the peer's port `remote_port` (0: ephemeral local port).
    fn connect(&mut self, a: &App, port: u16, remote_port: u16) -> (ChannelId, u16) {
        self.mux
            .bind_socket(a.ep, tcp(port, Some((PEER, remote_port))))
            .unwrap()
    }

    /// The application sends a segment on `ch`; it must reach the wire.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        a: &mut App,
        ch: ChannelId,
        port: u16,
        fl: u8,
        seq: u32,
        ack: u32,
        data: &[u8],
    ) {
        let f = to_peer(port, fl, seq, ack, data);
        self.send_raw(a, ch, &f);
        assert_eq!(drain_wire(&mut self.wire), vec![f]);
    }

    fn send_raw(&mut self, a: &mut App, ch: ChannelId, f: &[u8]) {
        send(&mut a.app, a.buf, f, ch.0);
        self.mux.poll_tx().unwrap();
        assert_eq!(completions(&mut a.app).len(), 1);
    }

    /// The peer sends a segment to `port`; it returns what the endpoint
    /// got.
    fn peer(&mut self, a: &mut App, port: u16, fl: u8, seq: u32, ack: u32, data: &[u8]) -> usize {
        let f = from_peer(PEER_PORT, port, fl, seq, ack, data);
        self.wire.send_batch(&[&f]).unwrap();
        self.mux.poll_rx().unwrap();
        drain_rx(&mut a.app).len()
    }

    /// The peer sends with nobody to read it but the multiplexer.
    fn peer_alone(&mut self, port: u16, fl: u8, seq: u32, ack: u32) -> Vec<Wire> {
        let f = from_peer(PEER_PORT, port, fl, seq, ack, &[]);
        self.wire.send_batch(&[&f]).unwrap();
        self.mux.poll_rx().unwrap();
        drain_wire(&mut self.wire).iter().map(|f| read(f)).collect()
    }

    /// An application with one connection to the peer, established: the
    /// start of most tests here.
    fn established_app(&mut self) -> (App, ChannelId, u16) {
        let mut a = self.app();
        let (ch, port) = self.connect(&a, 0, PEER_PORT);
        self.establish(&mut a, ch, port);
        (a, ch, port)
    }

    /// Three-way handshake and some data each way: our SND.MAX is
    /// ISS + 6, the peer's ISS + 1 + 3.
    fn establish(&mut self, a: &mut App, ch: ChannelId, port: u16) {
        self.send(a, ch, port, SYN, ISS, 0, &[]);
        assert_eq!(self.peer(a, port, SYN | ACK, IRS, ISS + 1, &[]), 1);
        self.send(a, ch, port, ACK, ISS + 1, IRS + 1, b"hello");
        // A retransmission of older data does not move SND.MAX back.
        self.send(a, ch, port, ACK, ISS + 1, IRS + 1, b"he");
        assert_eq!(self.peer(a, port, ACK, IRS + 1, ISS + 6, b"abc"), 1);
        self.send(a, ch, port, ACK, ISS + 6, IRS + 4, &[]);
    }

    /// An active close from an established connection: our FIN, its ACK,
    /// the peer's FIN and our ACK of it: TIME-WAIT.
    fn close_first(&mut self, a: &mut App, ch: ChannelId, port: u16) {
        self.send(a, ch, port, FIN | ACK, ISS + 6, IRS + 4, &[]);
        assert_eq!(self.peer(a, port, ACK, IRS + 4, ISS + 7, &[]), 1);
        assert_eq!(self.peer(a, port, FIN | ACK, IRS + 4, ISS + 7, &[]), 1);
        self.send(a, ch, port, ACK, ISS + 7, IRS + 5, &[]);
    }

    fn on_wire(&mut self) -> Vec<Wire> {
        drain_wire(&mut self.wire).iter().map(|f| read(f)).collect()
    }

    /// The application sends `f` on `ch` with [`Desc::QUIET`]; it must
    /// reach the wire.
    fn send_quiet(&mut self, a: &mut App, ch: ChannelId, f: Vec<u8>) {
        assert!(a.app.tx.push_inline_with(ch.0, &f, Desc::QUIET).unwrap());
        self.mux.poll_tx().unwrap();
        assert_eq!(drain_wire(&mut self.wire), vec![f]);
    }

    /// Frame `f` comes from the wire; whether it woke an application.
    fn arrives(&mut self, f: &[u8]) -> bool {
        self.wire.send_batch(&[f]).unwrap();
        self.mux.poll_rx().unwrap();
        self.mux.take_woken()
    }

    /// The endpoint's wake-ups for received frames, and its frames that
    /// came on quiet channels.
    fn upcalls(&self, a: &App) -> (u64, u64) {
        let s = self.mux.endpoint_stats(a.ep).unwrap();
        (s.rx_upcalls, s.rx_quiet)
    }
}

#[test]
fn established_connection_is_reset_when_its_endpoint_goes() {
    let mut n = Net::new(MuxConfig::default());
    let mut a = n.app();
    let (ch, port) = n.connect(&a, 0, PEER_PORT);
    // A listener on the same port and a UDP channel: nothing to reset.
    n.mux.bind_socket(a.ep, tcp(port, None)).unwrap();
    n.mux.bind_socket(a.ep, spec(0)).unwrap();
    n.establish(&mut a, ch, port);
    n.mux.remove_endpoint(a.ep).unwrap();
    assert_eq!(n.on_wire(), vec![rst_from(port, ISS + 6)]);
    let host = n.mux.stats().host;
    assert_eq!((host.tcp_aborted, host.time_wait_held), (1, 0));
    assert_eq!(n.mux.ports_of(a.ep), vec![]);
}

#[test]
fn established_connection_is_reset_when_unbound() {
    let mut n = Net::new(MuxConfig::default());
    let (a, ch, port) = n.established_app();
    n.mux.unbind_channel(ch).unwrap();
    assert_eq!(n.on_wire(), vec![rst_from(port, ISS + 6)]);
    // Gone once: the endpoint's removal sends nothing more.
    n.mux.remove_endpoint(a.ep).unwrap();
    assert!(n.on_wire().is_empty());
    assert_eq!(n.mux.stats().host.tcp_aborted, 1);
}

#[test]
fn half_closed_connections_are_reset() {
    let mut n = Net::new(MuxConfig::default());
    let mut a = n.app();
    // FIN-WAIT-2: our FIN acknowledged, the peer's not come.
    let (c1, p1) = n.connect(&a, 0, PEER_PORT);
    n.establish(&mut a, c1, p1);
    n.send(&mut a, c1, p1, FIN | ACK, ISS + 6, IRS + 4, &[]);
    assert_eq!(n.peer(&mut a, p1, ACK, IRS + 4, ISS + 7, &[]), 1);
    // CLOSE-WAIT: the peer's FIN acknowledged, ours not sent.
    let (c2, p2) = n.connect(&a, 0, PEER_PORT);
    n.establish(&mut a, c2, p2);
    assert_eq!(n.peer(&mut a, p2, FIN | ACK, IRS + 4, ISS + 6, &[]), 1);
    n.send(&mut a, c2, p2, ACK, ISS + 6, IRS + 5, &[]);
    n.mux.remove_endpoint(a.ep).unwrap();
    let mut got = n.on_wire();
    got.sort_by_key(|w| w.from.1);
    let mut want = vec![rst_from(p1, ISS + 7), rst_from(p2, ISS + 6)];
    want.sort_by_key(|w| w.from.1);
    assert_eq!(got, want);
}

#[test]
fn finished_connections_get_no_rst() {
    let mut n = Net::new(MuxConfig::default());
    let mut a = n.app();
    // Closed by the peer first: LAST-ACK, then CLOSED.
    let (c1, p1) = n.connect(&a, 0, PEER_PORT);
    n.establish(&mut a, c1, p1);
    assert_eq!(n.peer(&mut a, p1, FIN | ACK, IRS + 4, ISS + 6, &[]), 1);
    n.send(&mut a, c1, p1, ACK, ISS + 6, IRS + 5, &[]);
    n.send(&mut a, c1, p1, FIN | ACK, ISS + 6, IRS + 5, &[]);
    assert_eq!(n.peer(&mut a, p1, ACK, IRS + 5, ISS + 7, &[]), 1);
    // Reset by the peer, at exactly RCV.NXT.
    let (c2, p2) = n.connect(&a, 0, PEER_PORT);
    n.establish(&mut a, c2, p2);
    assert_eq!(n.peer(&mut a, p2, RST, IRS + 4, 0, &[]), 1);
    // Reset by the application.
    let (c3, p3) = n.connect(&a, 0, PEER_PORT);
    n.establish(&mut a, c3, p3);
    n.send(&mut a, c3, p3, RST, ISS + 6, 0, &[]);
    // SYN-SENT: never synchronized (RFC 9293 §3.10.5: no RST).
    let (c4, p4) = n.connect(&a, 0, PEER_PORT);
    n.send(&mut a, c4, p4, SYN, ISS, 0, &[]);
    // Bound, nothing sent.
    n.connect(&a, 0, PEER_PORT);
    n.mux.remove_endpoint(a.ep).unwrap();
    assert!(n.on_wire().is_empty());
    let host = n.mux.stats().host;
    assert_eq!((host.tcp_aborted, host.time_wait_held), (0, 0));
}

#[test]
fn a_rst_off_rcv_nxt_does_not_finish() {
    let mut n = Net::new(MuxConfig::default());
    let (mut a, _, port) = n.established_app();
    // In the window but not at RCV.NXT: a blind reset (RFC 5961 §3.2).
    assert_eq!(n.peer(&mut a, port, RST, IRS + 100, 0, &[]), 1);
    n.mux.remove_endpoint(a.ep).unwrap();
    assert_eq!(n.on_wire(), vec![rst_from(port, ISS + 6)]);
}

#[test]
fn time_wait_is_held_then_expires() {
    let msl = Duration::from_millis(500);
    let mut n = Net::with_msl(msl);
    let (mut a, ch, port) = n.established_app();
    n.close_first(&mut a, ch, port);
    let closed = Instant::now();
    n.mux.remove_endpoint(a.ep).unwrap();
    assert!(n.on_wire().is_empty(), "no RST in TIME-WAIT");
    let host = n.mux.stats().host;
    assert_eq!(
        (host.tcp_aborted, host.time_wait_held, host.time_wait_now),
        (0, 1, 1)
    );

    // The peer's FIN again (our ACK was lost): acknowledged with the
    // tracked numbers, RFC 9293 §3.10.7.4.
    let got = n.peer_alone(port, FIN | ACK, IRS + 4, ISS + 7);
    assert_eq!(got, vec![ack_from(port, ISS + 7, IRS + 5)]);
    assert_eq!(n.mux.stats().host.time_wait_acks, 1);
    // A RST is ignored (RFC 1337): still held.
    assert!(n.peer_alone(port, RST, IRS + 5, 0).is_empty());
    assert_eq!(n.mux.stats().host.time_wait_rst_ignored, 1);

    // The 4-tuple is the multiplexer's: another endpoint may listen on the
    // port, but not connect from it to the same peer port.
    let mut b = n.app();
    assert_eq!(
        n.mux.bind_socket(b.ep, tcp(port, Some((PEER, PEER_PORT)))),
        Err(MuxError::InTimeWait {
            local: (HOST, port),
            remote: (PEER, PEER_PORT)
        })
    );
    let (listener, _) = n.mux.bind_socket(b.ep, tcp(port, None)).unwrap();
    let (elsewhere, _) = n.connect(&b, port, PEER_PORT + 1);
    // The old connection's segments do not reach the new listener.
    let got = n.peer_alone(port, ACK, IRS + 5, ISS + 7);
    assert_eq!(got, vec![ack_from(port, ISS + 7, IRS + 5)]);
    assert!(drain_rx(&mut b.app).is_empty());
    // A SYN on the old 4-tuple inside the old sequence space draws an ACK
    // (RFC 9293 §3.10.7.4); one from another peer port reaches the listener.
    let got = n.peer_alone(port, SYN, IRS + 2, 0);
    assert_eq!(got, vec![ack_from(port, ISS + 7, IRS + 5)]);
    assert!(drain_rx(&mut b.app).is_empty());
    let f = from_peer(PEER_PORT + 2, port, SYN, 9000, 0, &[]);
    n.wire.send_batch(&[&f]).unwrap();
    n.mux.poll_rx().unwrap();
    let rx = drain_rx(&mut b.app);
    assert_eq!(rx.len(), 1);
    assert_eq!(rx[0].0, listener.0);
    n.mux.unbind_channel(elsewhere).unwrap();

    // Held for 2×MSL from the peer's last FIN, then gone.
    n.mux.poll_rx_at(closed + msl).unwrap();
    assert_eq!(n.mux.stats().host.time_wait_now, 1);
    n.mux.poll_rx_at(Instant::now() + 2 * msl + msl).unwrap();
    let host = n.mux.stats().host;
    assert_eq!((host.time_wait_expired, host.time_wait_now), (1, 0));
    // Now the 4-tuple binds, and its segments go to its channel.
    let (again, _) = n.connect(&b, port, PEER_PORT);
    assert_eq!(n.peer(&mut b, port, ACK, IRS + 5, ISS + 7, &[]), 1);
    assert!(n.on_wire().is_empty());
    n.mux.unbind_channel(again).unwrap();
    n.mux.unbind_channel(listener).unwrap();
    assert_eq!(n.mux.ports_of(b.ep), vec![]);
}

#[test]
fn a_new_syn_beyond_the_old_sequence_space_reopens_the_4_tuple() {
    let mut n = Net::new(MuxConfig::default());
    let (mut a, ch, port) = n.established_app();
    n.close_first(&mut a, ch, port);
    n.mux.remove_endpoint(a.ep).unwrap();
    let mut b = n.app();
    let (listener, _) = n.mux.bind_socket(b.ep, tcp(port, None)).unwrap();
    // RFC 1122 §4.2.2.13: the client reuses its port at once, with an ISN
    // beyond the old connection's: the hold ends and the listener gets it.
    let f = from_peer(PEER_PORT, port, SYN, IRS + 100_000, 0, &[]);
    n.wire.send_batch(&[&f]).unwrap();
    n.mux.poll_rx().unwrap();
    let rx = drain_rx(&mut b.app);
    assert_eq!(rx.len(), 1);
    assert_eq!(rx[0].0, listener.0);
    assert!(n.on_wire().is_empty(), "no ACK from the old connection");
    let host = n.mux.stats().host;
    assert_eq!((host.time_wait_reused, host.time_wait_now), (1, 0));
    // The 4-tuple binds again.
    let (again, _) = n.connect(&b, port, PEER_PORT);
    n.mux.unbind_channel(again).unwrap();
}

/// A segment from the peer with the timestamps option.
fn from_peer_ts(port: u16, fl: u8, seq: u32, ack: u32, tsval: u32) -> Vec<u8> {
    let ts = TcpOption::Timestamps { tsval, tsecr: 0 };
    build::tcp_frame(
        PEER_MAC,
        HOST_MAC,
        PEER,
        HOST,
        PEER_PORT,
        port,
        fl,
        seq,
        ack,
        &[ts],
        &[],
    )
}

#[test]
fn with_timestamps_a_new_syn_reopens_by_its_tsval() {
    let mut n = Net::new(MuxConfig::default());
    let (mut a, ch, port) = n.established_app();
    // The peer's last TSval is 5000; a later one whose ACK is beyond
    // anything sent is not taken.
    let f = from_peer_ts(port, ACK, IRS + 4, ISS + 6, 5000);
    let g = from_peer_ts(port, ACK, IRS + 4, ISS + 99, 9000);
    n.wire.send_batch(&[&f, &g]).unwrap();
    n.mux.poll_rx().unwrap();
    drain_rx(&mut a.app);
    n.close_first(&mut a, ch, port);
    n.mux.remove_endpoint(a.ep).unwrap();
    let mut b = n.app();
    let (listener, _) = n.mux.bind_socket(b.ep, tcp(port, None)).unwrap();
    // RFC 6191 §2: beyond the old sequence space, but an older TSval: the
    // hold answers it as an old duplicate.
    let old = from_peer_ts(port, SYN, IRS + 100_000, 0, 4999);
    n.wire.send_batch(&[&old]).unwrap();
    n.mux.poll_rx().unwrap();
    assert!(drain_rx(&mut b.app).is_empty());
    assert_eq!(n.on_wire(), vec![ack_from(port, ISS + 7, IRS + 5)]);
    // A newer TSval reopens, though its sequence number is in the old space.
    let new = from_peer_ts(port, SYN, IRS, 0, 5001);
    n.wire.send_batch(&[&new]).unwrap();
    n.mux.poll_rx().unwrap();
    let rx = drain_rx(&mut b.app);
    assert_eq!(rx.len(), 1);
    assert_eq!(rx[0].0, listener.0);
    let host = n.mux.stats().host;
    assert_eq!((host.time_wait_reused, host.time_wait_now), (1, 0));
}

#[test]
fn time_wait_is_held_when_unbound() {
    let mut n = Net::new(MuxConfig::default());
    let (mut a, ch, port) = n.established_app();
    n.close_first(&mut a, ch, port);
    n.mux.unbind_channel(ch).unwrap();
    assert!(n.on_wire().is_empty());
    // The same endpoint may not reuse the 4-tuple either; a library sees
    // AddrInUse, as from a kernel.
    let refused = n
        .mux
        .bind_socket(a.ep, tcp(port, Some((PEER, PEER_PORT))))
        .unwrap_err();
    assert!(matches!(refused, MuxError::InTimeWait { .. }));
    assert_eq!(
        std::io::Error::from(refused).kind(),
        std::io::ErrorKind::AddrInUse
    );
    let got = n.peer_alone(port, FIN | ACK, IRS + 4, ISS + 7);
    assert_eq!(got, vec![ack_from(port, ISS + 7, IRS + 5)]);
    // The endpoint's removal leaves the hold as it was.
    n.mux.remove_endpoint(a.ep).unwrap();
    let host = n.mux.stats().host;
    assert_eq!((host.tcp_aborted, host.time_wait_now), (0, 1));
}

#[test]
fn simultaneous_close_is_held() {
    let mut n = Net::new(MuxConfig::default());
    let (mut a, ch, port) = n.established_app();
    // The FINs cross.
    n.send(&mut a, ch, port, FIN | ACK, ISS + 6, IRS + 4, &[]);
    assert_eq!(n.peer(&mut a, port, FIN | ACK, IRS + 4, ISS + 6, &[]), 1);
    n.send(&mut a, ch, port, ACK, ISS + 7, IRS + 5, &[]);
    // CLOSING until the peer acknowledges our FIN.
    assert_eq!(n.peer(&mut a, port, ACK, IRS + 5, ISS + 7, &[]), 1);
    n.mux.remove_endpoint(a.ep).unwrap();
    assert!(n.on_wire().is_empty());
    assert_eq!(n.mux.stats().host.time_wait_held, 1);
}

#[test]
fn time_wait_already_over_needs_nothing() {
    let mut n = Net::new(MuxConfig {
        msl: Duration::ZERO,
        ..MuxConfig::default()
    });
    let (mut a, ch, port) = n.established_app();
    n.close_first(&mut a, ch, port);
    n.mux.remove_endpoint(a.ep).unwrap();
    assert!(n.on_wire().is_empty());
    let host = n.mux.stats().host;
    assert_eq!((host.tcp_aborted, host.time_wait_held), (0, 0));
}

#[test]
fn the_cap_evicts_the_oldest() {
    let mut n = Net::new(MuxConfig {
        time_wait_max: 2,
        ..MuxConfig::default()
    });
    let mut a = n.app();
    let mut ports = Vec::new();
    for _ in 0..3 {
        let (ch, port) = n.connect(&a, 0, PEER_PORT);
        n.establish(&mut a, ch, port);
        n.close_first(&mut a, ch, port);
        n.mux.unbind_channel(ch).unwrap();
        ports.push(port);
    }
    let host = n.mux.stats().host;
    assert_eq!(
        (
            host.time_wait_held,
            host.time_wait_evicted,
            host.time_wait_now
        ),
        (3, 1, 2)
    );
    // The first is free again; the others are held.
    let b = n.app();
    n.connect(&b, ports[0], PEER_PORT);
    for &p in &ports[1..] {
        assert!(matches!(
            n.mux.bind_socket(b.ep, tcp(p, Some((PEER, PEER_PORT)))),
            Err(MuxError::InTimeWait { .. })
        ));
        let got = n.peer_alone(p, FIN | ACK, IRS + 4, ISS + 7);
        assert_eq!(got, vec![ack_from(p, ISS + 7, IRS + 5)]);
    }
}

#[test]
fn no_room_no_hold() {
    let mut n = Net::new(MuxConfig {
        time_wait_max: 0,
        ..MuxConfig::default()
    });
    let (mut a, ch, port) = n.established_app();
    n.close_first(&mut a, ch, port);
    n.mux.remove_endpoint(a.ep).unwrap();
    assert!(n.on_wire().is_empty());
    let host = n.mux.stats().host;
    assert_eq!((host.time_wait_evicted, host.time_wait_now), (1, 0));
    // Nobody holds it: the host refuses the peer's FIN.
    let got = n.peer_alone(port, FIN | ACK, IRS + 4, ISS + 7);
    assert_eq!(got, vec![rst_from(port, ISS + 7)]);
}

#[test]
fn malformed_segments_are_counted() {
    let mut n = Net::new(MuxConfig::default());
    let (mut a, ch, port) = n.established_app();
    let good = to_peer(port, ACK, ISS + 6, IRS + 4, b"xyz");
    // Cut short of its IP length, past the ports the template pins.
    n.send_raw(&mut a, ch, &good[..40]);
    // A TCP data offset beyond the segment, and below 5.
    let mut long = good.clone();
    long[14 + 20 + 12] = 0xf0;
    n.send_raw(&mut a, ch, &long);
    let mut short = good.clone();
    short[14 + 20 + 12] = 0x10;
    n.send_raw(&mut a, ch, &short);
    assert_eq!(drain_wire(&mut n.wire).len(), 3);
    // From the peer: a data offset beyond the segment.
    let mut bad = from_peer(PEER_PORT, port, FIN | ACK, IRS + 4, ISS + 6, &[]);
    bad[14 + 20 + 12] = 0xf0;
    n.wire.send_batch(&[&bad]).unwrap();
    n.mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut a.app).len(), 1);
    assert_eq!(n.mux.channel_stats(ch).unwrap().tcp_malformed, 4);
    // None of it moved the tracking.
    n.mux.remove_endpoint(a.ep).unwrap();
    assert_eq!(n.on_wire(), vec![rst_from(port, ISS + 6)]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any bytes after the ports, either way, on a tracked connection and a
    /// held one: no panic, and at most one segment of the multiplexer's own
    /// when the endpoint goes.
    #[test]
    fn arbitrary_segments_never_panic(
        out in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..6),
        inn in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..6),
        close in any::<bool>(),
    ) {
        let mut n = Net::new(MuxConfig::default());
        let mut a = n.app();
        let (ch, port) = n.connect(&a, 0, PEER_PORT);
        n.establish(&mut a, ch, port);
        if close {
            n.close_first(&mut a, ch, port);
        }
        let head = |from_us: bool| {
            let f = if from_us {
                build::tcp_frame(HOST_MAC, PEER_MAC, HOST, PEER, port, PEER_PORT, 0, 0, 0, &[], &[])
            } else {
                build::tcp_frame(PEER_MAC, HOST_MAC, PEER, HOST, PEER_PORT, port, 0, 0, 0, &[], &[])
            };
            f[..38].to_vec()
        };
        for tail in &out {
            let f = [head(true), tail.clone()].concat();
            send(&mut a.app, a.buf, &f, ch.0);
            n.mux.poll_tx().unwrap();
            completions(&mut a.app);
        }
        drain_wire(&mut n.wire);
        for tail in &inn {
            n.wire.send_batch(&[&[head(false), tail.clone()].concat()]).unwrap();
            n.mux.poll_rx().unwrap();
            drain_rx(&mut a.app);
        }
        drain_wire(&mut n.wire);
        n.mux.remove_endpoint(a.ep).unwrap();
        prop_assert!(drain_wire(&mut n.wire).len() <= 1);
        for tail in &inn {
            n.wire.send_batch(&[&[head(false), tail.clone()].concat()]).unwrap();
            n.mux.poll_rx().unwrap();
        }
    }
}

/// A connection accepted at a listener sends on the listener's channel
/// until the library learns of its own channel (the bind is not waited
/// for): what it sends there once its channel is bound is followed on that
/// channel, so its TIME-WAIT is held and its reset carries SND.MAX.
#[test]
fn an_accepted_connection_is_followed_on_its_listeners_channel() {
    const PORT: u16 = 8080;
    let mut n = Net::new(MuxConfig::default());
    let (mut a, listener) = n.listening(PORT);
    // The handshake, all on the listener's channel.
    assert_eq!(n.peer(&mut a, PORT, SYN, IRS, 0, &[]), 1);
    n.send(&mut a, listener, PORT, SYN | ACK, ISS, IRS + 1, &[]);
    assert_eq!(n.peer(&mut a, PORT, ACK, IRS + 1, ISS + 1, b"abc"), 1);
    // Accepted: its channel is bound, but it goes on sending on the
    // listener's until it takes the answer.
    let (ch, _) = n.connect(&a, PORT, PEER_PORT);
    n.send(&mut a, listener, PORT, ACK, ISS + 1, IRS + 4, b"hello");
    n.send(&mut a, listener, PORT, FIN | ACK, ISS + 6, IRS + 4, &[]);
    assert_eq!(n.peer(&mut a, PORT, ACK, IRS + 4, ISS + 7, &[]), 1);
    assert_eq!(n.peer(&mut a, PORT, FIN | ACK, IRS + 4, ISS + 7, &[]), 1);
    n.send(&mut a, listener, PORT, ACK, ISS + 7, IRS + 5, &[]);
    n.mux.unbind_channel(ch).unwrap();
    assert!(n.on_wire().is_empty(), "no RST in TIME-WAIT");
    assert_eq!(n.mux.stats().host.time_wait_held, 1);
    let got = n.peer_alone(PORT, FIN | ACK, IRS + 4, ISS + 7);
    assert_eq!(got, vec![ack_from(PORT, ISS + 7, IRS + 5)]);

    // Another, abandoned after data sent on the listener's channel: reset
    // at the SND.MAX it reached there.
    let mut b = n.app();
    let (listener, _) = n.mux.bind_socket(b.ep, tcp(PORT + 1, None)).unwrap();
    assert_eq!(n.peer(&mut b, PORT + 1, SYN, IRS, 0, &[]), 1);
    n.send(&mut b, listener, PORT + 1, SYN | ACK, ISS, IRS + 1, &[]);
    assert_eq!(n.peer(&mut b, PORT + 1, ACK, IRS + 1, ISS + 1, &[]), 1);
    n.connect(&b, PORT + 1, PEER_PORT);
    n.send(&mut b, listener, PORT + 1, ACK, ISS + 1, IRS + 1, b"hello");
    n.mux.remove_endpoint(b.ep).unwrap();
    assert_eq!(n.on_wire(), vec![rst_from(PORT + 1, ISS + 6)]);
}

/// The whole connection can pass on the listener's channel (a library binds
/// its own channel late, or never): it is followed there from the first
/// segment past the handshake. Finished there, its TIME-WAIT is held at
/// once, and a late bind of its 4-tuple is refused; one still open when its
/// endpoint goes is reset. SYN-ACKs start nothing.
#[test]
fn an_accepted_connection_is_followed_before_its_channel_is_bound() {
    const PORT: u16 = 8080;
    let mut n = Net::new(MuxConfig::default());
    let (mut a, listener) = n.listening(PORT);
    // A SYN flood answered with SYN-ACKs: nothing followed.
    for i in 0..50u16 {
        let f = from_peer(2000 + i, PORT, SYN, IRS, 0, &[]);
        n.wire.send_batch(&[&f]).unwrap();
        n.mux.poll_rx().unwrap();
        let syn_ack = build::tcp_frame(
            HOST_MAC,
            PEER_MAC,
            HOST,
            PEER,
            PORT,
            2000 + i,
            SYN | ACK,
            ISS,
            IRS + 1,
            &[],
            &[],
        );
        n.send_raw(&mut a, listener, &syn_ack);
    }
    drain_rx(&mut a.app);
    drain_wire(&mut n.wire);
    n.mux.remove_endpoint(a.ep).unwrap();
    assert!(
        n.on_wire().is_empty(),
        "half-open connections are not followed"
    );

    let (mut a, listener) = n.listening(PORT);
    assert_eq!(n.peer(&mut a, PORT, SYN, IRS, 0, &[]), 1);
    n.send(&mut a, listener, PORT, SYN | ACK, ISS, IRS + 1, &[]);
    assert_eq!(n.peer(&mut a, PORT, ACK, IRS + 1, ISS + 1, b"abc"), 1);
    n.send(&mut a, listener, PORT, ACK, ISS + 1, IRS + 4, b"hello");
    n.send(&mut a, listener, PORT, FIN | ACK, ISS + 6, IRS + 4, &[]);
    assert_eq!(n.peer(&mut a, PORT, ACK, IRS + 4, ISS + 7, &[]), 1);
    assert_eq!(n.peer(&mut a, PORT, FIN | ACK, IRS + 4, ISS + 7, &[]), 1);
    n.send(&mut a, listener, PORT, ACK, ISS + 7, IRS + 5, &[]);
    // Finished on the listener's channel (the library lets go of it in
    // TIME-WAIT, with no channel to unbind): held at once, and a bind of
    // its 4-tuple that comes late is refused.
    assert!(n.on_wire().is_empty(), "no RST in TIME-WAIT");
    assert_eq!(n.mux.stats().host.time_wait_held, 1);
    assert!(matches!(
        n.mux.bind_socket(a.ep, tcp(PORT, Some((PEER, PEER_PORT)))),
        Err(MuxError::InTimeWait { .. })
    ));
    // The hold answers the peer's FIN again with our last ACK.
    let again = from_peer(PEER_PORT, PORT, FIN | ACK, IRS + 4, ISS + 7, &[]);
    n.wire.send_batch(&[&again]).unwrap();
    n.mux.poll_rx().unwrap();
    let acks = n.on_wire();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(drain_rx(&mut a.app).len(), 0, "the hold took it");

    // Established on the listener's channel, its channel never bound: reset
    // when the endpoint goes.
    assert_eq!(
        n.peer(&mut a, PORT, SYN, IRS, 0, &[]),
        0,
        "the old 4-tuple is held"
    );
    let f = from_peer(PEER_PORT + 1, PORT, SYN, IRS, 0, &[]);
    n.wire.send_batch(&[&f]).unwrap();
    n.mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut a.app).len(), 1);
    let to = |fl, seq, ack, data: &[u8]| {
        build::tcp_frame(
            HOST_MAC,
            PEER_MAC,
            HOST,
            PEER,
            PORT,
            PEER_PORT + 1,
            fl,
            seq,
            ack,
            &[],
            data,
        )
    };
    n.send_raw(&mut a, listener, &to(SYN | ACK, ISS, IRS + 1, &[]));
    n.send_raw(&mut a, listener, &to(ACK, ISS + 1, IRS + 1, b"hello"));
    drain_wire(&mut n.wire);
    n.mux.remove_endpoint(a.ep).unwrap();
    let got = n.on_wire();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].to, got[0].flags.2, got[0].seq),
        ((PEER, PEER_PORT + 1), true, ISS + 6)
    );
}

/// Connections that end on the listener's channel leave the followed ones,
/// so an endpoint that never binds its accepted connections (as a library
/// behind a daemon does with short ones) follows any number of them in
/// turn. Those its application made quiet deliver quietly there too: the
/// peer's ACK of our FIN wakes nobody.
#[test]
fn connections_finished_on_the_listeners_channel_are_followed_no_more() {
    const PORT: u16 = 8080;
    let mut n = Net::new(MuxConfig::default());
    let (mut a, listener) = n.listening(PORT);
    for i in 0..1100u16 {
        let peer = 20000 + i;
        let to = |fl, seq, ack, data: &[u8]| tcp_to_peer(PORT, peer, fl, seq, ack, data);
        let from = |fl, seq, ack| from_peer(peer, PORT, fl, seq, ack, &[]);
        // Our answer, then our FIN (quiet, as a closed socket's), the
        // peer's ACK of it, its FIN and our ACK of that: TIME-WAIT, held.
        n.send_raw(&mut a, listener, &to(ACK, ISS + 1, IRS + 4, b"hello"));
        let fin = to(FIN | ACK, ISS + 6, IRS + 4, &[]);
        assert!(a
            .app
            .tx
            .push_inline_with(listener.0, &fin, Desc::QUIET)
            .unwrap());
        n.mux.poll_tx().unwrap();
        if i == 0 {
            a.app.wake.announce_sleep();
            assert!(!n.arrives(&from(ACK, IRS + 4, ISS + 7)), "the ACK woke");
            a.app.wake.end_sleep();
        } else {
            n.arrives(&from(ACK, IRS + 4, ISS + 7));
        }
        n.arrives(&from(FIN | ACK, IRS + 4, ISS + 7));
        n.send_raw(&mut a, listener, &to(ACK, ISS + 7, IRS + 5, &[]));
        drain_rx(&mut a.app);
        drain_wire(&mut n.wire);
    }
    let e = n.mux.endpoint_stats(a.ep).unwrap();
    assert_eq!(e.tcp_unfollowed, 0);
    assert_eq!(n.mux.stats().host.time_wait_held, 1100);
    // Nothing followed is left to reset.
    n.mux.remove_endpoint(a.ep).unwrap();
    assert!(n.on_wire().is_empty());
}

/// An application that sends on its listener's channel for connections it
/// never binds has at most 1024 followed; the rest are counted, and another
/// application's connections are followed all the same.
#[test]
fn an_endpoint_follows_a_bounded_number_of_connections() {
    const PORT: u16 = 8080;
    let mut n = Net::new(MuxConfig::default());
    let (mut a, listener) = n.listening(PORT);
    for i in 0..1100u16 {
        let f = build::tcp_frame(
            HOST_MAC,
            PEER_MAC,
            HOST,
            PEER,
            PORT,
            10000 + i,
            ACK,
            ISS,
            IRS,
            &[],
            b"x",
        );
        n.send_raw(&mut a, listener, &f);
    }
    drain_wire(&mut n.wire);
    let unfollowed = |n: &Net, ep| {
        let s = n.mux.stats();
        s.endpoints
            .iter()
            .find(|e| e.id == ep)
            .unwrap()
            .stats
            .tcp_unfollowed
    };
    assert_eq!(unfollowed(&n, a.ep), 1100 - 1024);
    let mut b = n.app();
    let (other, _) = n.mux.bind_socket(b.ep, tcp(PORT + 1, None)).unwrap();
    let f = build::tcp_frame(
        HOST_MAC,
        PEER_MAC,
        HOST,
        PEER,
        PORT + 1,
        PEER_PORT,
        ACK,
        ISS,
        IRS,
        &[],
        b"x",
    );
    n.send_raw(&mut b, other, &f);
    drain_wire(&mut n.wire);
    assert_eq!(unfollowed(&n, b.ep), 0);
    n.mux.remove_endpoint(b.ep).unwrap();
    assert_eq!(
        n.on_wire(),
        vec![Wire {
            to: (PEER, PEER_PORT),
            ..rst_from(PORT + 1, ISS + 1)
        }]
    );
    // The followed ones are reset when the endpoint goes.
    n.mux.remove_endpoint(a.ep).unwrap();
    assert_eq!(n.on_wire().len(), 1024);
}

/// A memwire end that records which listeners it is asked to answer SYNs for.
struct Answering {
    wire: MemWire,
    listeners: std::sync::Arc<std::sync::Mutex<Vec<(Ipv4Addr, u16)>>>,
}

impl Link for Answering {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8]), max: usize) -> std::io::Result<usize> {
        self.wire.recv_batch(f, max)
    }
    fn send_with(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> std::io::Result<usize> {
        self.wire.send_with(fill)
    }
    fn mtu(&self) -> usize {
        self.wire.mtu()
    }
    fn mac(&self) -> [u8; 6] {
        self.wire.mac()
    }
    fn as_raw_fd(&self) -> Option<std::os::fd::RawFd> {
        self.wire.as_raw_fd()
    }
    fn stats(&self) -> exonet_link::LinkStats {
        self.wire.stats()
    }
    fn answer_syns(&mut self, l: &exonet_link::SynListener) -> std::io::Result<()> {
        self.listeners.lock().unwrap().push((l.ip, l.port));
        Ok(())
    }
    fn stop_answering_syns(&mut self, ip: Ipv4Addr, port: u16) {
        self.listeners.lock().unwrap().retain(|&l| l != (ip, port));
    }
}

/// Only a TCP listener's SYNs are answered by the link, and only while its
/// channel lives: the link
/// stops when the channel is unbound or its endpoint goes. A link that
/// cannot answer refuses, and nothing is left registered.
#[test]
fn the_link_answers_a_listeners_syns_while_its_channel_lives() {
    let listeners = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (a, _b) = exonet_link::memwire::pair().unwrap();
    let second = Ipv4Addr::new(10, 0, 0, 9);
    let link = Answering {
        wire: a,
        listeners: listeners.clone(),
    };
    let mut mux = Mux::new(Box::new(link), vec![HOST, second], MuxConfig::default());
    let (ep, _app, _) = endpoint(&mut mux, 8, false);
    let answers = exonet_shm::control::SynAnswers {
        mss: 1460,
        ttl: 64,
        ..Default::default()
    };
    let (conn, _) = mux
        .bind_socket(ep, tcp(0, Some((PEER, PEER_PORT))))
        .unwrap();
    assert!(matches!(
        mux.answer_syns(conn, &answers),
        Err(MuxError::NotPermitted(_))
    ));
    let (udp, _) = mux
        .bind_socket(
            ep,
            ChannelSpec {
                proto: Proto::Udp,
                ..tcp(5353, None)
            },
        )
        .unwrap();
    assert!(mux.answer_syns(udp, &answers).is_err());
    assert!(listeners.lock().unwrap().is_empty());

    let (one, _) = mux.bind_socket(ep, tcp(8080, None)).unwrap();
    mux.answer_syns(one, &answers).unwrap();
    assert_eq!(*listeners.lock().unwrap(), [(HOST, 8080)]);
    let (all, _) = mux
        .bind_socket(
            ep,
            ChannelSpec {
                local_addr: second,
                ..tcp(8081, None)
            },
        )
        .unwrap();
    mux.answer_syns(all, &answers).unwrap();
    assert_eq!(*listeners.lock().unwrap(), [(HOST, 8080), (second, 8081)]);
    mux.unbind_channel(one).unwrap();
    assert_eq!(*listeners.lock().unwrap(), [(second, 8081)]);
    mux.remove_endpoint(ep).unwrap();
    assert!(listeners.lock().unwrap().is_empty());

    // A memwire cannot: refused, as the link said.
    let (mut plain, _wire) = mux_with(MuxConfig::default());
    let (ep, _app, _) = endpoint(&mut plain, 8, false);
    let (l, _) = plain.bind_socket(ep, tcp(8080, None)).unwrap();
    assert!(matches!(
        plain.answer_syns(l, &answers),
        Err(MuxError::Link(_))
    ));
}

/// A connection channel quieted by the application's FIN: the peer's ACK of
/// it goes on the rx ring without waking the sleeping application, and so
/// does the peer's FIN. The peer waits for the ACK of its FIN, so the FIN
/// wakes the application `QUIET_FIN_WAKE` later if it is still unread by
/// then; read before (the application woke for something else), it wakes
/// nobody.
#[test]
fn a_quiet_channel_wakes_for_the_peers_fin_late_and_only_if_unread() {
    for read_first in [false, true] {
        let mut n = Net::new(MuxConfig::default());
        let (mut a, ch, port) = n.established_app();
        n.send_quiet(&mut a, ch, to_peer(port, FIN | ACK, ISS + 6, IRS + 4, &[]));
        let before = n.upcalls(&a).0;
        a.app.wake.announce_sleep();
        let ack = from_peer(PEER_PORT, port, ACK, IRS + 4, ISS + 7, &[]);
        assert!(!n.arrives(&ack), "the ACK of our FIN woke the application");
        assert_eq!(n.upcalls(&a), (before, 1));
        let t0 = Instant::now();
        let peer_fin = from_peer(PEER_PORT, port, FIN | ACK, IRS + 4, ISS + 7, &[]);
        n.wire.send_batch(&[&peer_fin]).unwrap();
        n.mux.poll_rx_at(t0).unwrap();
        assert!(!n.mux.take_woken(), "the peer's FIN woke at once");
        assert_eq!(n.upcalls(&a), (before, 2));
        if read_first {
            assert_eq!(drain_rx(&mut a.app).len(), 2);
        }
        n.mux
            .poll_rx_at(t0 + QUIET_FIN_WAKE - Duration::from_micros(1))
            .unwrap();
        assert!(!n.mux.take_woken(), "woken before the bound");
        n.mux.poll_rx_at(t0 + QUIET_FIN_WAKE).unwrap();
        assert_eq!(n.mux.take_woken(), !read_first, "read first: {read_first}");
        let s = n.mux.endpoint_stats(a.ep).unwrap();
        assert_eq!(s.rx_fin_wakes, u64::from(!read_first));
        assert_eq!(s.rx_upcalls, before + u64::from(!read_first));
        // Owed once: later polls wake nobody.
        n.mux.poll_rx_at(t0 + 2 * QUIET_FIN_WAKE).unwrap();
        assert!(!n.mux.take_woken());
        a.app.wake.end_sleep();
        assert_eq!(drain_rx(&mut a.app).len(), if read_first { 0 } else { 2 });
    }
}

/// An accepted connection closed before its own channel's bind is answered
/// says "quiet" on the listener's channel: that quiets its own channel,
/// whether bound before or after the segment, and never the listener's.
#[test]
fn a_quiet_segment_on_the_listeners_channel_quiets_the_connections_own_channel() {
    const PORT: u16 = 8080;
    let mut n = Net::new(MuxConfig::default());
    for (i, bound_first) in [(0u16, false), (1, true)] {
        let port = PORT + i;
        let mut a = n.app();
        let (listener, _) = n.mux.bind_socket(a.ep, tcp(port, None)).unwrap();
        assert_eq!(n.peer(&mut a, port, SYN, IRS, 0, &[]), 1);
        n.send(&mut a, listener, port, SYN | ACK, ISS, IRS + 1, &[]);
        assert_eq!(n.peer(&mut a, port, ACK, IRS + 1, ISS + 1, b"abc"), 1);
        let own = bound_first.then(|| n.connect(&a, port, PEER_PORT).0);
        n.send(&mut a, listener, port, ACK, ISS + 1, IRS + 4, b"hello");
        let fin = to_peer(port, FIN | ACK, ISS + 6, IRS + 4, &[]);
        n.send_quiet(&mut a, listener, fin);
        let own = own.unwrap_or_else(|| n.connect(&a, port, PEER_PORT).0);
        let before = n.upcalls(&a).0;
        a.app.wake.announce_sleep();
        // The peer's ACK of our FIN, on the connection's channel: quiet.
        let ack = from_peer(PEER_PORT, port, ACK, IRS + 4, ISS + 7, &[]);
        assert!(!n.arrives(&ack), "the ACK of our FIN woke (case {i})");
        assert_eq!(n.upcalls(&a), (before, 1));
        // Another peer's SYN, on the listener's channel: it still wakes.
        let syn = from_peer(PEER_PORT + 1, port, SYN, IRS, 0, &[]);
        assert!(n.arrives(&syn), "the listener went quiet (case {i})");
        a.app.wake.end_sleep();
        let got: Vec<u32> = drain_rx(&mut a.app).iter().map(|r| r.0).collect();
        assert_eq!(got, vec![own.0, listener.0]);
    }
}

/// A spinning loop's empty polls read the clock for the TIME-WAIT holds
/// only now and then (every 64th), and the first poll after a sleep reads
/// it: a hold still ends within 64 polls of its deadline, or at once after
/// a wait.
#[test]
fn held_time_waits_expire_under_spinning_and_after_a_wait() {
    let msl = Duration::from_millis(5);
    let mut n = Net::with_msl(msl);
    for after_wait in [false, true] {
        let (mut a, ch, port) = n.established_app();
        n.close_first(&mut a, ch, port);
        n.mux.remove_endpoint(a.ep).unwrap();
        assert_eq!(n.mux.stats().host.time_wait_now, 1);
        // Spinning meanwhile: the countdown runs.
        for _ in 0..10 {
            n.mux.poll().unwrap();
        }
        std::thread::sleep(3 * msl);
        let polls = if after_wait {
            n.mux.wait(Duration::ZERO).unwrap();
            n.mux.poll().unwrap();
            1
        } else {
            (1..=64)
                .find(|_| {
                    n.mux.poll().unwrap();
                    n.mux.stats().host.time_wait_now == 0
                })
                .unwrap_or(65)
        };
        let host = n.mux.stats().host;
        assert_eq!(host.time_wait_now, 0, "still held after {polls} polls");
    }
}
