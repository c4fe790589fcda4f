//! TCP sockets end to end: two hosts on a memwire, with the multiplexers as
//! daemons in this process and in the applications themselves.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4};
use std::thread;
use std::time::Duration;

use exonet::hosts::{in_process_pair, offloading_pair, two_hosts, A, B};
use exonet_link::Faults;
use exonet_mux::Running;
use exonet_stack::tcp::{syn_ack_shape, syn_cookie_accept, syn_cookie_reply, TcpConfig, TcpState};
use exonet_stack::{Interest, Poll, Stack, StackConfig, TcpListener, TcpStream, Time, Token};
use exonet_wire::build::tcp_frame;
use exonet_wire::tcp::{flags, write_options, SynAnswers, TcpOption};
use exonet_wire::{MacAddr, TcpPacket, TcpRepr};

mod common;

const T: Option<Duration> = Some(Duration::from_secs(10));

fn stack(d: &Running) -> Stack {
    Stack::open(d.socket()).unwrap()
}

/// A counter of the one endpoint the daemon `d` serves.
fn endpoint_stat(d: &Running, name: &str) -> u64 {
    let mut c = exonet_shm::control::Client::connect(d.socket()).unwrap();
    let stats = c.stats().unwrap();
    let ep = stats.iter().find(|r| r.kind == "endpoint").unwrap();
    ep.get(name).unwrap()
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 8) as u8 ^ salt)
        .collect()
}

/// A server on `sb` that echoes one connection, then half-closes after the
/// client did.
fn echo_once(listener: TcpListener) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(T).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut total = 0u64;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).unwrap();
            total += n as u64;
        }
        s.shutdown(Shutdown::Write).unwrap();
        total
    })
}

fn bulk_echo(sa: &Stack, sb: &Stack, len: usize) {
    let listener = TcpListener::bind(sb, (Ipv4Addr::UNSPECIFIED, 8080)).unwrap();
    let server = echo_once(listener);
    let c = TcpStream::connect_timeout(sa, (B, 8080), Duration::from_secs(5)).unwrap();
    c.set_read_timeout(T).unwrap();
    assert_eq!(c.peer_addr().unwrap(), SocketAddr::from((B, 8080)));
    assert_eq!(c.local_addr().unwrap().ip(), std::net::IpAddr::V4(A));
    let data = pattern(len, 7);
    let reader = {
        let c2: &TcpStream = &c;
        thread::scope(|sc| {
            let r = sc.spawn(move || {
                let mut got = Vec::with_capacity(len);
                let mut r: &TcpStream = c2;
                r.read_to_end(&mut got).unwrap();
                got
            });
            let mut w: &TcpStream = &c;
            for chunk in data.chunks(8192) {
                w.write_all(chunk).unwrap();
            }
            c.shutdown(Shutdown::Write).unwrap();
            r.join().unwrap()
        })
    };
    assert!(reader == data, "echoed {} of {} bytes", reader.len(), len);
    assert_eq!(server.join().unwrap(), len as u64);
}

#[test]
fn bulk_echo_over_daemons() {
    let h = two_hosts("tcp-bulk").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    bulk_echo(&sa, &sb, 1 << 20);
    // The server's connection ends with the ACK of its FIN.
    for _ in 0..500 {
        if sb.stats().tcp.open == 0 {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let (a, b) = (sa.stats(), sb.stats());
    assert_eq!(a.tcp.bad_checksum + b.tcp.bad_checksum, 0, "{a:#?} {b:#?}");
    assert_eq!(a.tcp.connects, 1);
    assert_eq!(b.tcp.accepts, 1);
    // Both sent from the send area: full segments as chains whose data the
    // multiplexer read in place; the slots went back once the FINs were
    // acknowledged.
    for s in [&a, &b] {
        assert!(s.tx.referenced > 700, "{s:#?}");
        assert_eq!(s.tcp.send_slots, 0, "{s:#?}");
    }
    // The client half-closed and went on reading: its channel never went
    // quiet, or the echo would have waited for its timers.
    assert_eq!(endpoint_stat(&h.a, "rx_quiet"), 0);
}

/// A receiver's window offers no more than its endpoint's receive buffers
/// hold in full segments: a sender filling it while the application is away
/// from its stack loses nothing at the multiplexer.
#[test]
fn the_window_fits_the_endpoints_receive_buffers() {
    let h = two_hosts("tcp-rx-bound").unwrap();
    let sa = stack(&h.a);
    // 64 frames: 32 receive buffers, a window of 32 full segments (46 KB)
    // against the 256 KB receive buffer asked for.
    let config = StackConfig {
        frames: 64,
        ..StackConfig::default()
    };
    let sb = Stack::open_with(h.b.socket(), &config).unwrap();
    let l = TcpListener::bind(&sb, (B, 9)).unwrap();
    let data = pattern(1 << 20, 5);
    let sender = {
        let data = data.clone();
        thread::spawn(move || {
            let mut c = TcpStream::connect_timeout(&sa, (B, 9), Duration::from_secs(5)).unwrap();
            c.set_write_timeout(T).unwrap();
            c.write_all(&data).unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            c.info().unwrap().stats
        })
    };
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(T).unwrap();
    // Away: the sender fills what the window offers.
    thread::sleep(Duration::from_millis(100));
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert!(got == data, "read {} of {} bytes", got.len(), data.len());
    // A probe may have been sent meanwhile; nothing was lost.
    let sent = sender.join().unwrap();
    let lost = endpoint_stat(&h.b, "rx_ring_full") + endpoint_stat(&h.b, "rx_no_buffer");
    assert_eq!(lost, 0, "{sent:#?}");
}

#[test]
fn send_area_slots_go_back_and_are_lent_again() {
    // Two slots, ten connections one after the other: each sends by reference
    // from a slot the ones before gave back.
    let config = StackConfig {
        tcp_send_area: 2 * StackConfig::default().tcp.send_buffer,
        ..StackConfig::default()
    };
    let (sa, sb) = in_process_pair(&config).unwrap();
    for _ in 0..10 {
        bulk_echo(&sa, &sb, 256 << 10);
    }
    let a = sa.stats();
    assert!(a.tx.referenced > 10 * 150, "{a:#?}");
    assert_eq!(a.tcp.send_slots, 0, "{a:#?}");
}

#[test]
fn bulk_echo_copying_without_a_send_area() {
    let config = StackConfig {
        tcp_send_area: 0,
        ..StackConfig::default()
    };
    let (sa, sb) = in_process_pair(&config).unwrap();
    bulk_echo(&sa, &sb, 1 << 20);
    let a = sa.stats();
    assert_eq!(a.tx.referenced, 0, "{a:#?}");
    assert!(a.tx.frames > 700, "{a:#?}");
}

#[test]
fn bulk_echo_in_process() {
    let (sa, sb) = in_process_pair(&StackConfig::default()).unwrap();
    bulk_echo(&sa, &sb, 4 << 20);
}

/// Over links with segmentation offload (the stacks' own multiplexers, each on
/// a memwire behind a [`exonet_link::Segmenter`]): bulk data goes in
/// super-segments, far fewer frames than segments, every segment the link cut
/// arriving with valid checksums; and through loss, duplication, reordering
/// and corruption of the cut segments, every byte arrives.
#[test]
fn bulk_echo_with_segmentation_offload() {
    let (sa, sb) = offloading_pair(&StackConfig::default(), Faults::default(), 0).unwrap();
    let len = 4 << 20;
    bulk_echo(&sa, &sb, len);
    let (a, b) = (sa.stats(), sb.stats());
    assert_eq!(a.tcp.bad_checksum + b.tcp.bad_checksum, 0, "{a:#?} {b:#?}");
    let segments = (len / 1448) as u64;
    assert!(
        a.tx.frames < segments / 4,
        "{} frames for {segments} segments",
        a.tx.frames
    );

    let faults = Faults {
        loss_rate: 0.01,
        duplicate_rate: 0.005,
        corrupt_rate: 0.002,
        reorder_rate: 0.01,
        ..Faults::default()
    };
    let (sa, sb) = offloading_pair(&StackConfig::default(), faults, 7).unwrap();
    bulk_echo(&sa, &sb, 2 << 20);
    let a = sa.stats();
    assert!(a.tcp.retransmitted > 0, "{a:#?}");
}

/// Connections one after another to one server, over daemons: a client's
/// connect after the second finds its channel bound ahead, and a server's
/// connection is accepted before its own channel's bind is answered. The
/// daemons follow every connection all the same: the server closed each
/// first, and its daemon holds their TIME-WAITs once they go. Each side's
/// channel went quiet with its FIN (the socket closed): the peer's last
/// ACK waited for a wake-up instead of causing one, and still ended the
/// connection. (The client closes a little after it read the end, so that
/// its delayed ACK of the server's FIN goes before its own FIN instead of
/// riding on it; no segment is sent twice meanwhile.)
#[test]
fn repeated_connections_bind_ahead_and_are_followed_by_the_daemons() {
    const N: usize = 12;
    let h = two_hosts("tcp-ahead").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    let l = TcpListener::bind(&sb, (B, 8080)).unwrap();
    let server = thread::spawn(move || {
        for _ in 0..N {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(T).unwrap();
            let mut req = [0u8; 4];
            s.read_exact(&mut req).unwrap();
            s.write_all(&[req[0] + 1; 8]).unwrap();
        }
        l
    });
    for i in 0..N {
        let mut c = TcpStream::connect_timeout(&sa, (B, 8080), Duration::from_secs(5)).unwrap();
        c.set_read_timeout(T).unwrap();
        c.write_all(&[i as u8; 4]).unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        assert_eq!(got, [i as u8 + 1; 8], "connection {i}");
        // Past the delay, run out by the stack's keeper (a tick of 5 ms).
        thread::sleep(Duration::from_millis(30));
    }
    let _l = server.join().unwrap();
    let (a, b) = (sa.stats(), sb.stats());
    // The server's FIN is not probed while the client's ACK of it is delayed
    // (it was for 11-12 of 12 when the probe allowed only 2 ms for it); a
    // keeper late by more than 10 ms on a loaded machine may still cause one.
    assert!(
        a.tcp.retransmitted + b.tcp.retransmitted <= 2,
        "{:?} {:?}",
        a.tcp,
        b.tcp
    );
    assert_eq!(
        (a.tcp.connects, a.tcp.connects_bound_ahead),
        (N as u64, N as u64 - 2)
    );
    assert_eq!(b.tcp.accepts, N as u64);
    // A connect to another peer port gives the spare back.
    let l2 = TcpListener::bind(&sb, (B, 8081)).unwrap();
    let c = TcpStream::connect_timeout(&sa, (B, 8081), Duration::from_secs(5)).unwrap();
    drop(l2.accept().unwrap());
    drop(c);
    let mut ca = exonet_shm::control::Client::connect(h.a.socket()).unwrap();
    let mut cb = exonet_shm::control::Client::connect(h.b.socket()).unwrap();
    let mut last = (usize::MAX, 0);
    for _ in 0..500 {
        // The client's channels to port 8080: none left (its connections
        // closed, the spare given back); the server's TIME-WAITs held.
        let to_8080 = ca
            .stats()
            .unwrap()
            .iter()
            .filter(|r| r.kind == "channel" && r.label.contains("8080"))
            .count();
        let held = cb
            .stats()
            .unwrap()
            .iter()
            .find(|r| r.kind == "host")
            .and_then(|r| r.get("time_wait_held"))
            .unwrap_or(0);
        last = (to_8080, held);
        if last == (0, N as u64) {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        last,
        (0, N as u64),
        "(client channels to 8080, server TIME-WAITs held)"
    );
    // At least the server's ACK of each FIN came quietly to the client.
    let quiet = endpoint_stat(&h.a, "rx_quiet");
    assert!(
        quiet >= N as u64,
        "{quiet} quiet frames for {N} connections"
    );
    // And the client's ACK of the server's FIN to the server, though most
    // servers closed before they learnt of their connection's own channel:
    // the FIN, on the listener's channel, quieted that channel. (Only an ACK
    // that came before the daemon bound the channel is not quiet; when a
    // FIN on the listener's channel quieted nothing, 1-5 of 12 were.)
    let quiet = endpoint_stat(&h.b, "rx_quiet");
    assert!(
        quiet >= N as u64 - 2,
        "{quiet} quiet frames at the server for {N} connections"
    );
}

/// A server that closed first and then sleeps in `accept` acknowledges the
/// client's late FIN at once: its channel went quiet with its own FIN, so
/// the client's ACK of that wakes nobody, but the client's FIN does. (An
/// orphan in FIN-WAIT-2 has no timer, and the client's probe of its FIN
/// would go into the same quiet channel.)
#[test]
fn a_sleeping_server_acknowledges_a_late_fin_on_its_quiet_channel() {
    let h = two_hosts("tcp-quiet").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    let l = TcpListener::bind(&sb, (B, 8060)).unwrap();
    let socket_b = h.b.socket().to_path_buf();
    let server = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        // The connection's own channel bound, so that the client's ACK of
        // the FIN cannot come on the listener's channel before it, and the
        // answer come back.
        let mut cb = exonet_shm::control::Client::connect(&socket_b).unwrap();
        for _ in 0..250 {
            let channels = cb.stats().unwrap();
            if channels.iter().filter(|r| r.kind == "channel").count() >= 2 {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        thread::sleep(Duration::from_millis(20));
        s.write_all(b"bye").unwrap();
        drop(s);
        // Asleep in the stack until the next connection.
        drop(l.accept().unwrap());
    });
    let mut c = TcpStream::connect_timeout(&sa, (B, 8060), Duration::from_secs(5)).unwrap();
    c.set_read_timeout(T).unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");
    thread::sleep(Duration::from_millis(100));
    drop(c);
    for _ in 0..250 {
        if sa.stats().tcp.open == 0 {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let a = sa.stats();
    assert_eq!(a.tcp.open, 0, "the client is still in LAST-ACK: {a:#?}");
    // Acknowledged before the client's tail loss probe sent the FIN again.
    assert_eq!(a.tcp.retransmitted, 0, "{a:#?}");
    let quiet = endpoint_stat(&h.b, "rx_quiet");
    assert!(quiet >= 1, "{quiet}: the ACK of the server's FIN");
    drop(TcpStream::connect_timeout(&sa, (B, 8060), Duration::from_secs(5)).unwrap());
    server.join().unwrap();
}

#[test]
fn refused_and_reset() {
    let h = two_hosts("tcp-refused").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    let e = TcpStream::connect(&sa, (B, 9)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    // A connection closed with unread data is reset (RFC 2525 §2.17).
    let l = TcpListener::bind(&sb, (B, 9000)).unwrap();
    let mut c = TcpStream::connect(&sa, (B, 9000)).unwrap();
    let (s, _) = l.accept().unwrap();
    c.write_all(b"unread").unwrap();
    thread::sleep(Duration::from_millis(50));
    drop(s);
    c.set_read_timeout(T).unwrap();
    let mut buf = [0u8; 8];
    let e = c.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert!(c.write(b"more").is_err());
}

/// Data that comes after the application closed its socket is answered
/// with a RST (RFC 1122 §4.2.2.13), as Linux answers it: the peer, which
/// may go on sending after a FIN, learns that nobody reads it.
#[test]
fn data_after_close_is_reset() {
    let (sa, sb) = in_process_pair(&StackConfig::default()).unwrap();
    let l = TcpListener::bind(&sb, (B, 7100)).unwrap();
    let mut c = TcpStream::connect(&sa, (B, 7100)).unwrap();
    let (s, _) = l.accept().unwrap();
    drop(s);
    c.set_read_timeout(T).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(c.read(&mut buf).unwrap(), 0, "the server's FIN");
    c.write_all(b"too late").unwrap();
    let mut reset = None;
    for _ in 0..500 {
        match c.write_all(b"more") {
            Ok(_) => thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                reset = Some(e.kind());
                break;
            }
        }
    }
    assert_eq!(reset, Some(ErrorKind::ConnectionReset));
    assert_eq!(sb.stats().tcp.open, 0);
}

#[test]
fn half_close_and_nonblocking() {
    let (sa, sb) = in_process_pair(&StackConfig::default()).unwrap();
    let l = TcpListener::bind(&sb, (B, 7)).unwrap();
    l.set_nonblocking(true).unwrap();
    assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    l.set_nonblocking(false).unwrap();
    let mut c = TcpStream::connect(&sa, (B, 7)).unwrap();
    let (mut s, peer) = l.accept().unwrap();
    assert_eq!(peer, c.local_addr().unwrap());
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(s.read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(T).unwrap();
    c.set_nodelay(true).unwrap();
    assert!(c.nodelay().unwrap());
    c.write_all(b"request").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"request");
    // The server still writes after the client's FIN.
    s.write_all(b"response").unwrap();
    drop(s);
    c.set_read_timeout(T).unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"response");
    assert_eq!(c.peek(&mut buf).unwrap(), 0);
}

/// A read that empties a full receive buffer tells the peer at once (a
/// window update rides on the read), so the transfer never waits for a
/// persist probe. One thread: the stacks move only in the sockets' calls.
#[test]
fn a_read_that_opens_a_shut_window_updates_the_peer() {
    let mut config = StackConfig::default();
    config.tcp.recv_buffer = 4096;
    config.tcp.recv_buffer_max = 4096;
    let (sa, sb) = in_process_pair(&config).unwrap();
    let l = TcpListener::bind(&sb, (B, 9)).unwrap();
    let mut c = TcpStream::connect(&sa, (B, 9)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    c.set_nonblocking(true).unwrap();
    s.set_nonblocking(true).unwrap();
    let data = pattern(64 * 1024, 3);
    let (mut sent, mut got) = (0, Vec::new());
    let mut buf = [0u8; 1024];
    while got.len() < data.len() {
        if sent < data.len() {
            match c.write(&data[sent..]) {
                Ok(n) => sent += n,
                Err(e) => assert_eq!(e.kind(), ErrorKind::WouldBlock),
            }
        }
        // Moves the client's stack on (the peer's ACKs and updates).
        assert_eq!(c.read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
        loop {
            match s.read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert_eq!(got, data);
    assert_eq!(c.info().unwrap().stats.timeouts, 0);
}

#[test]
fn poll_over_streams() {
    let (sa, sb) = in_process_pair(&StackConfig::default()).unwrap();
    let l = TcpListener::bind(&sb, (B, 80)).unwrap();
    let mut poll = Poll::new(&sb);
    poll.register(&l, Token(0), Interest::READABLE).unwrap();
    let mut clients: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&sa, (B, 80)).unwrap())
        .collect();
    let mut events = exonet_stack::Events::new();
    let mut accepted = Vec::new();
    while accepted.len() < 4 {
        poll.poll(&mut events, T).unwrap();
        assert!(!events.is_empty());
        while let Ok((s, _)) = {
            l.set_nonblocking(true).unwrap();
            l.accept()
        } {
            poll.register(&s, Token(1 + accepted.len()), Interest::READABLE)
                .unwrap();
            accepted.push(s);
        }
    }
    for (i, c) in clients.iter_mut().enumerate() {
        c.write_all(&[i as u8; 3]).unwrap();
    }
    let mut seen = [false; 4];
    while seen.iter().any(|s| !s) {
        poll.poll(&mut events, T).unwrap();
        for e in events.iter() {
            if e.token.0 == 0 {
                continue;
            }
            let s = &accepted[e.token.0 - 1];
            let mut buf = [0u8; 3];
            let mut r: &TcpStream = s;
            r.read_exact(&mut buf).unwrap();
            seen[usize::from(buf[0])] = true;
        }
    }
    let info = clients[0].info().unwrap();
    assert_eq!(info.state, exonet_stack::tcp::TcpState::Established);
    assert!(info.srtt.is_some());
}

#[test]
fn keepalive_keeps_an_idle_connection_and_finds_a_vanished_peer() {
    let exonet::hosts::TwoHosts { a, b } = two_hosts("tcp-keepalive").unwrap();
    let (sa, sb) = (stack(&a), stack(&b));
    let l = TcpListener::bind(&sb, (B, 7100)).unwrap();
    let mut c = TcpStream::connect(&sa, (B, 7100)).unwrap();
    let (s, _) = l.accept().unwrap();
    // The server waits in a read, which answers the probes.
    let server = thread::spawn(move || {
        let mut r: &TcpStream = &s;
        r.set_read_timeout(T).unwrap();
        let mut buf = [0u8; 8];
        let _ = r.read(&mut buf);
    });
    let ka = exonet_stack::tcp::Keepalive {
        idle: Duration::from_millis(150),
        interval: Duration::from_millis(100),
        probes: 3,
    };
    c.set_keepalive(Some(ka)).unwrap();
    assert_eq!(c.keepalive().unwrap(), Some(ka));
    let before = c.info().unwrap().stats.segments_sent;
    thread::sleep(Duration::from_millis(700));
    let info = c.info().unwrap();
    assert_eq!(info.state, exonet_stack::tcp::TcpState::Established);
    assert!(
        info.stats.segments_sent >= before + 3,
        "probes went out: {before} -> {}",
        info.stats.segments_sent
    );
    // The peer's host goes away without a word: the unanswered probes end
    // the connection (RFC 1122 §4.2.3.6).
    b.stop().unwrap();
    c.set_read_timeout(T).unwrap();
    let mut buf = [0u8; 8];
    let e = c.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    drop(server);
    drop(a);
}

#[test]
fn try_clone_shares_the_connection_until_the_last_handle_goes() {
    let (sa, sb) = in_process_pair(&StackConfig::default()).unwrap();
    let l = TcpListener::bind(&sb, (B, 7200)).unwrap();
    let l2 = l.try_clone().unwrap();
    drop(l);
    let c = TcpStream::connect(&sa, (B, 7200)).unwrap();
    // The listener lives on in its clone.
    let (mut s, _) = l2.accept().unwrap();
    s.set_read_timeout(T).unwrap();
    let mut reader = c.try_clone().unwrap();
    reader.set_read_timeout(T).unwrap();
    let mut writer = c;
    writer.write_all(b"one").unwrap();
    let mut buf = [0u8; 3];
    s.read_exact(&mut buf).unwrap();
    s.write_all(b"two").unwrap();
    reader.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"two");
    // One handle gone: the connection stays.
    drop(writer);
    s.write_all(b"three").unwrap();
    let mut got = [0u8; 5];
    reader.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"three");
    // The last one gone: the peer sees the end.
    drop(reader);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

#[test]
fn a_stream_sends_with_its_ttl() {
    let (sa, sb) = in_process_pair(&StackConfig::default()).unwrap();
    let l = TcpListener::bind(&sb, (B, 7400)).unwrap();
    let c = TcpStream::connect(&sa, (B, 7400)).unwrap();
    let (s, _) = l.accept().unwrap();
    assert_eq!(c.ttl().unwrap(), 64);
    assert!(c.set_ttl(0).is_err());
    c.set_ttl(7).unwrap();
    assert_eq!(c.ttl().unwrap(), 7);
    let mut w: &TcpStream = &c;
    w.write_all(b"x").unwrap();
    let mut r: &TcpStream = &s;
    r.set_read_timeout(T).unwrap();
    let mut b = [0u8; 1];
    r.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"x");
}

/// An in-process multiplexer that answers a begun bind only at its next
/// round of work, as a daemon answers between batches (or at once, when
/// the stack waits for it), and notes the most binds begun and unanswered.
struct AnswersLater {
    inner: exonet_mux::InProcess,
    begun: std::collections::VecDeque<std::io::Result<(u32, u16)>>,
    done: std::collections::VecDeque<std::io::Result<(u32, u16)>>,
    most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl exonet_stack::Multiplexer for AnswersLater {
    fn info(&mut self) -> std::io::Result<exonet_shm::control::HostInfo> {
        self.inner.info()
    }
    fn create_endpoint(
        &mut self,
        config: &exonet_shm::SegmentConfig,
    ) -> std::io::Result<(u32, exonet_shm::AppEndpoint)> {
        self.inner.create_endpoint(config)
    }
    fn bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> std::io::Result<(u32, u16)> {
        self.inner.bind_socket(endpoint, proto, local, remote)
    }
    fn begin_bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> std::io::Result<()> {
        let r = self.inner.bind_socket(endpoint, proto, local, remote);
        self.begun.push_back(r);
        let n = self.begun.len() + self.done.len();
        self.most.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn bound_socket(&mut self, wait: bool) -> Option<std::io::Result<(u32, u16)>> {
        match self.done.pop_front() {
            Some(r) => Some(r),
            None if wait => self.begun.pop_front(),
            None => None,
        }
    }
    fn unbind(&mut self, channel: u32) -> std::io::Result<()> {
        self.inner.unbind(channel)
    }
    fn install_handler(
        &mut self,
        channel: u32,
        spec: &exonet_shm::control::HandlerSpec,
    ) -> std::io::Result<()> {
        self.inner.install_handler(channel, spec)
    }
    fn remove_handler(&mut self, channel: u32) -> std::io::Result<()> {
        self.inner.remove_handler(channel)
    }
    fn resolve(&mut self, ip: Ipv4Addr) -> std::io::Result<Option<[u8; 6]>> {
        self.inner.resolve(ip)
    }
    fn in_process(&self) -> bool {
        true
    }
    fn drive(&mut self) -> std::io::Result<usize> {
        self.done.extend(self.begun.drain(..));
        self.inner.drive()
    }
    fn sleep(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.inner.sleep(timeout)
    }
}

/// Connections accepted while their channels' binds go unanswered send on
/// the listener's channel and move to their own once answered; a burst of
/// handshakes (two hundred clients at once, completed by one pump) begins
/// no more than 32 binds ahead of their answers, which a daemon's control
/// socket could not hold in any number (the daemon cuts an application
/// whose socket takes no more answers).
#[test]
fn a_burst_of_handshakes_keeps_the_binds_ahead_bounded() {
    use exonet_link::memwire;
    use exonet_mux::{InProcess, Mux, MuxConfig};
    const N: usize = 200;
    let (x, y) = memwire::pair().unwrap();
    let config = StackConfig::default();
    let client = Stack::over(
        Box::new(InProcess::new(
            Mux::new(Box::new(x), vec![A], MuxConfig::default()),
            vec![(A, 24)],
        )),
        &config,
    )
    .unwrap();
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let server = Stack::over(
        Box::new(AnswersLater {
            inner: InProcess::new(
                Mux::new(Box::new(y), vec![B], MuxConfig::default()),
                vec![(B, 24)],
            ),
            begun: Default::default(),
            done: Default::default(),
            most: most.clone(),
        }),
        &config,
    )
    .unwrap();
    let l = TcpListener::bind_with(
        &server,
        (B, 8090),
        256,
        exonet_stack::tcp::TcpConfig::default(),
    )
    .unwrap();
    thread::scope(|s| {
        let clients: Vec<_> = (0..N)
            .map(|i| {
                let client = &client;
                s.spawn(move || {
                    let mut c =
                        TcpStream::connect_timeout(client, (B, 8090), Duration::from_secs(10))
                            .unwrap();
                    c.set_read_timeout(T).unwrap();
                    c.write_all(&[i as u8; 4]).unwrap();
                    let mut got = [0u8; 4];
                    c.read_exact(&mut got).unwrap();
                    assert_eq!(got, [i as u8; 4]);
                })
            })
            .collect();
        for _ in 0..N {
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(T).unwrap();
            let mut req = [0u8; 4];
            c.read_exact(&mut req).unwrap();
            c.write_all(&req).unwrap();
        }
        for c in clients {
            c.join().unwrap();
        }
    });
    let most = most.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (1..=32).contains(&most),
        "{most} binds ahead of their answers"
    );
    assert_eq!(server.stats().tcp.accepts, N as u64);
}

/// A ping-pong over daemons: the pinging application's sleeps wait for
/// received frames only (`RX_ONLY`), so the multiplexer taking its requests
/// never signals it; it is woken for what it receives.
#[test]
fn a_ping_pong_wakes_the_application_for_what_it_receives_only() {
    const N: usize = 200;
    let h = two_hosts("tcp-upcalls").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    ping_pong(&sa, &sb, 8070, N, Duration::ZERO);
    let mut ca = exonet_shm::control::Client::connect(h.a.socket()).unwrap();
    let ep = ca
        .stats()
        .unwrap()
        .into_iter()
        .find(|r| r.kind == "endpoint")
        .unwrap();
    assert_eq!(ep.get("tx_upcalls"), Some(0), "{ep:?}");
    let rx = ep.get("rx_upcalls").unwrap();
    assert!(
        (1..=3 * N as u64).contains(&rx),
        "{rx} wake-ups for {N} answers"
    );
}

fn monotonic() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the live `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The XDP program's SYN-ACK is the stack's own cookie SYN-ACK: the same ISS,
/// window and options, a TSval the stack's clock gave between just before and
/// just after, and the peer's ACK makes the connection in the stack, with the
/// MSS, window scale and SACK the SYN offered.
#[test]
fn syns_answered_by_xdp_are_the_stacks_own_cookies() {
    if !common::netns::is_root() {
        println!("skipped: needs root");
        return;
    }
    let config = TcpConfig::default();
    let (window, wscale, sack) = syn_ack_shape(&config).unwrap();
    let key: [u8; 16] = *b"exonet-xdp-syn!!";
    // An epoch in the past, so that the listener's clock is well past zero.
    let epoch = monotonic() - 3_600_000_000_000;
    let local = SocketAddrV4::new(Ipv4Addr::new(10, 77, 5, 2), 8080);
    let listener = exonet_link::SynListener {
        ip: *local.ip(),
        port: local.port(),
        answers: SynAnswers {
            key,
            epoch,
            mss: config.mss,
            window,
            wscale,
            sack,
            ttl: 64,
        },
    };
    let mut cases = 0;
    for i in 0..64u32 {
        let remote = SocketAddrV4::new(
            Ipv4Addr::new(10, 77, 5 + (i % 3) as u8, 10 + i as u8),
            30000 + (i * 977 % 30000) as u16,
        );
        let isn = i.wrapping_mul(0x9e37_79b9);
        let peer_mss = [40u16, 256, 536, 1000, 1440, 1460, 9000, 65535][i as usize % 8];
        let peer_ws = (i % 16) as u8;
        let tsval = i.wrapping_mul(7919);
        let mss = TcpOption::Mss(peer_mss);
        let ts = TcpOption::Timestamps { tsval, tsecr: 0 };
        let ws = TcpOption::WindowScale(peer_ws);
        let (sp, nop) = (TcpOption::SackPermitted, TcpOption::NoOp);
        // Linux's order, then exonet's.
        let order = if i % 2 == 0 {
            [mss, sp, ts, nop, ws]
        } else {
            [mss, nop, ws, sp, ts]
        };
        let frame = tcp_frame(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            *remote.ip(),
            *local.ip(),
            remote.port(),
            local.port(),
            flags::SYN,
            isn,
            0,
            &order,
            &[],
        );
        assert_eq!(frame.len(), 74, "20 option bytes");
        let before = Time(monotonic() - epoch);
        let (action, out) =
            exonet_link::afxdp::test_run(&[], std::slice::from_ref(&listener), &frame).unwrap();
        let after = Time(monotonic() - epoch);
        assert_eq!(action, 4, "XDP_REDIRECT");
        let packet = TcpPacket::new_checked(&out[34..]).unwrap();
        let got = TcpRepr::parse(&packet, *local.ip(), *remote.ip()).unwrap();
        let syn_packet = TcpPacket::new_checked(&frame[34..]).unwrap();
        let syn = TcpRepr::parse(&syn_packet, *remote.ip(), *local.ip()).unwrap();
        let reply_at = |now| {
            let mut seg = [0u8; 60];
            let n = syn_cookie_reply(&config, &key, local, remote, &syn, now, &mut seg).unwrap();
            seg[..n].to_vec()
        };
        let (early, late) = (reply_at(before), reply_at(after));
        let early = TcpPacket::new_checked(&early[..]).unwrap();
        let late = TcpPacket::new_checked(&late[..]).unwrap();
        assert!(
            [early.seq_number(), late.seq_number()].contains(&got.seq_number),
            "the cookie"
        );
        assert_eq!(got.ack_number, isn.wrapping_add(1));
        assert_eq!(got.window, early.window());
        let ts_of = |o: &[u8]| u32::from_be_bytes(o[12..16].try_into().unwrap());
        let (t0, t1, t) = (
            ts_of(early.options()),
            ts_of(late.options()),
            ts_of(got.options),
        );
        assert!(t.wrapping_sub(t0) <= t1.wrapping_sub(t0), "{t0} {t} {t1}");
        // Everything else in the options is the stack's byte for byte.
        let mask = |o: &[u8]| [&o[..12], &o[16..]].concat();
        assert_eq!(mask(got.options), mask(early.options()));
        // The peer's ACK, echoing the TSval, makes the connection.
        let mut ack_options = [0u8; 12];
        let n = write_options(
            &[
                TcpOption::NoOp,
                TcpOption::NoOp,
                TcpOption::Timestamps {
                    tsval: tsval.wrapping_add(1),
                    tsecr: t,
                },
            ],
            &mut ack_options,
        )
        .unwrap();
        let ack = TcpRepr {
            src_port: remote.port(),
            dst_port: local.port(),
            seq_number: isn.wrapping_add(1),
            ack_number: got.seq_number.wrapping_add(1),
            flags: flags::ACK,
            window: 502,
            urgent_ptr: 0,
            options: &ack_options[..n],
            payload: &[],
        };
        let c = syn_cookie_accept(config.clone(), &key, local, remote, &ack, after)
            .expect("the ACK returns a valid cookie");
        assert_eq!(c.state(), TcpState::Established);
        let table = [48usize, 256, 536, 1220, 1400, 1440, 1460, 8960];
        let expect = table
            .iter()
            .rev()
            .find(|&&m| m <= usize::from(peer_mss.min(config.mss)))
            .copied()
            .unwrap_or(48);
        // The cookie's MSS index (RFC 4987 §3.6's 3 bits) is the table's.
        let index = (got.seq_number >> 24) & 7;
        assert_eq!(table[index as usize], expect, "MSS {peer_mss}");
        // Less the timestamps option, on every segment.
        assert_eq!(c.send_mss(), (expect - 12).max(48), "MSS {peer_mss}");
        // A tampered cookie makes nothing.
        let forged = TcpRepr {
            ack_number: ack.ack_number ^ 0x100,
            ..ack
        };
        assert!(syn_cookie_accept(config.clone(), &key, local, remote, &forged, after).is_none());
        cases += 1;
    }
    assert_eq!(cases, 64);
}

/// A server that takes a few milliseconds to answer, away from its stack:
/// its keeper sends the delayed ACK of each request at its next tick, and
/// the client's probe of the lone request allows for that
/// (`TcpConfig::peer_ack_delay`), so nothing is sent twice. With a probe
/// that waited only for the 1 ms bound, one request in five was.
#[test]
fn a_slow_answer_draws_no_probe() {
    let h = two_hosts("tcp-slow").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    ping_pong(&sa, &sb, 8071, 5, Duration::from_millis(8));
    let st = sa.stats().tcp;
    assert_eq!(st.retransmitted, 0, "{st:#?}");
}

/// `n` 4-byte round trips from a client on `sa` to a server on `sb` at
/// `port`, which answers each `answer_after` it read it.
fn ping_pong(sa: &Stack, sb: &Stack, port: u16, n: usize, answer_after: Duration) {
    let l = TcpListener::bind(sb, (B, port)).unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(T).unwrap();
        let mut b = [0u8; 4];
        for _ in 0..n {
            s.read_exact(&mut b).unwrap();
            thread::sleep(answer_after);
            s.write_all(&b).unwrap();
        }
    });
    let mut c = TcpStream::connect_timeout(sa, (B, port), Duration::from_secs(5)).unwrap();
    c.set_read_timeout(T).unwrap();
    for i in 0..n {
        c.write_all(&[i as u8; 4]).unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        assert_eq!(b, [i as u8; 4]);
    }
    server.join().unwrap();
}
