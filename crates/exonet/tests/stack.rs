//! The protocol library's sockets end to end: two hosts on a memwire, each a
//! multiplexer daemon (in this process) with applications on endpoints.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use exonet::hosts::{in_process_pair, two_hosts, A, B};
use exonet_mux::Running;
use exonet_stack::{IcmpSocket, Interest, Poll, Stack, StackConfig, Token, UdpSocket};

const T: Option<Duration> = Some(Duration::from_secs(5));

fn stack(d: &Running) -> Stack {
    Stack::open(d.socket()).unwrap()
}

fn bound(s: &Stack, port: u16) -> UdpSocket {
    let u = UdpSocket::bind(s, (Ipv4Addr::UNSPECIFIED, port)).unwrap();
    u.set_read_timeout(T).unwrap();
    u
}

#[test]
fn udp_round_trips_with_std_semantics() {
    let h = two_hosts("stack-rt").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    let server = bound(&sb, 7000);
    let client = bound(&sa, 0);
    let caddr = client.local_addr().unwrap();
    assert_eq!(caddr.ip(), std::net::IpAddr::V4(A));
    assert_ne!(caddr.port(), 0, "an ephemeral port from the registry");
    let mut buf = [0u8; 2048];
    for size in [0usize, 1, 4, 100, 1000, 1472] {
        let msg: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
        assert_eq!(client.send_to(&msg, (B, 7000)).unwrap(), size);
        let (n, from) = server
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("{size}: {e} {:#?} {:#?}", sa.stats(), sb.stats()));
        assert_eq!((&buf[..n], from), (&msg[..], caddr));
        server.send_to(&buf[..n], from).unwrap();
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &msg[..]);
        assert_eq!(from, SocketAddr::V4(SocketAddrV4::new(B, 7000)));
    }
    // Peek leaves the datagram; a short buffer truncates as std does.
    client.connect((B, 7000)).unwrap();
    client.send(b"hello world").unwrap();
    let (n, _) = server.peek_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello world");
    let mut small = [0u8; 5];
    assert_eq!(server.recv(&mut small).unwrap(), 5);
    assert_eq!(&small, b"hello");
    // The zero-copy read.
    server.send_to(b"in place", caddr).unwrap();
    let got = client.recv_with(|p, from| (p.to_vec(), from)).unwrap();
    assert_eq!(got.0, b"in place");
    let stats = sa.stats();
    assert_eq!(stats.sockets.bad_checksum, 0);
    assert!(stats.tx.inline > 0, "short frames go inline: {stats:?}");
}

#[test]
fn timeouts_nonblocking_and_errors() {
    let h = two_hosts("stack-err").unwrap();
    let sa = stack(&h.a);
    let s = bound(&sa, 0);
    let mut buf = [0u8; 16];
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    assert_eq!(s.recv(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
    s.set_nonblocking(true).unwrap();
    assert_eq!(s.recv(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
    assert!(s.set_read_timeout(Some(Duration::ZERO)).is_err());
    assert_eq!(s.send(b"x").unwrap_err().kind(), ErrorKind::NotConnected);
    let far = s
        .send_to(b"x", (Ipv4Addr::new(192, 0, 2, 1), 9))
        .unwrap_err();
    assert_eq!(far.kind(), ErrorKind::NetworkUnreachable);
    let bcast = s.send_to(b"x", (Ipv4Addr::BROADCAST, 9)).unwrap_err();
    assert_eq!(bcast.kind(), ErrorKind::PermissionDenied);
    assert!(s.send_to(&vec![0; 70_000], (B, 9)).is_err());
    // Nobody listens on B:9: B's multiplexer answers port unreachable, A's routes
    // it to this socket, and a connected socket reports it (RFC 1122 §4.1.3.3).
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(T).unwrap();
    s.connect((B, 9)).unwrap();
    s.send(b"anyone?").unwrap();
    assert_eq!(
        s.recv(&mut buf).unwrap_err().kind(),
        ErrorKind::ConnectionRefused
    );
    assert_eq!(sa.stats().sockets.icmp_errors, 1);
    // A neighbour that never answers ARP: a blocking send gives up after
    // the ARP bound, and says why.
    let mut config = StackConfig::default();
    config.arp.give_up = Duration::from_millis(300);
    let quick = Stack::open_with(h.a.socket(), &config).unwrap();
    let s = bound(&quick, 0);
    let started = std::time::Instant::now();
    let nobody = Ipv4Addr::new(A.octets()[0], A.octets()[1], A.octets()[2], 77);
    let e = s.send_to(b"x", (nobody, 9)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::HostUnreachable, "{e}");
    assert!(e.to_string().contains("did not answer ARP"), "{e}");
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[test]
fn ports_are_the_registrys() {
    let h = two_hosts("stack-ports").unwrap();
    let sa = stack(&h.a);
    let s = bound(&sa, 5000);
    assert_eq!(
        UdpSocket::bind(&sa, (A, 5000)).unwrap_err().kind(),
        ErrorKind::AddrInUse
    );
    // Another application on the same host cannot take it either.
    let other = stack(&h.a);
    assert!(UdpSocket::bind(&other, (A, 5000)).is_err());
    drop(s);
    UdpSocket::bind(&other, (A, 5000)).expect("free again once closed");
    assert!(UdpSocket::bind(&sa, (Ipv4Addr::new(10, 77, 0, 99), 0)).is_err());
}

#[test]
fn ping_through_icmp_sockets() {
    let h = two_hosts("stack-ping").unwrap();
    let sa = stack(&h.a);
    let ping = IcmpSocket::bind(&sa, 0).unwrap();
    ping.set_read_timeout(T).unwrap();
    let mut buf = [0u8; 256];
    for seq in 0..5u16 {
        let data = [seq as u8; 56];
        ping.send_echo(B, seq, &data).unwrap();
        let e = ping.recv_echo(&mut buf).unwrap();
        assert_eq!((e.from, e.seq, &buf[..e.len]), (B, seq, &data[..]));
    }
}

#[test]
fn poll_over_many_sockets_and_threads() {
    let h = two_hosts("stack-poll").unwrap();
    let cfg = StackConfig {
        busy_poll: Duration::from_micros(50),
        ..StackConfig::default()
    };
    let sa = Stack::open_with(h.a.socket(), &cfg).unwrap();
    let sb = stack(&h.b);
    let socks: Vec<UdpSocket> = (0..4).map(|i| bound(&sb, 6000 + i)).collect();
    let mut poll = Poll::new(&sb);
    for (i, s) in socks.iter().enumerate() {
        poll.register(s, Token(i), Interest::READABLE).unwrap();
    }
    let mut events = exonet_stack::Events::new();
    poll.poll(&mut events, Some(Duration::ZERO)).unwrap();
    assert!(events.is_empty());
    // A sender thread; the receiver waits in poll.
    let sender = std::thread::spawn(move || {
        let c = bound(&sa, 0);
        for port in [6001u16, 6003, 6003] {
            c.send_to(&port.to_be_bytes(), (B, port)).unwrap();
        }
    });
    let mut seen = Vec::new();
    let mut buf = [0u8; 8];
    while seen.len() < 3 {
        poll.poll(&mut events, T).unwrap();
        assert!(!events.is_empty(), "poll timed out");
        for e in events.iter() {
            assert!(e.readable);
            let s = &socks[e.token.0];
            s.set_nonblocking(true).unwrap();
            while let Ok(n) = s.recv(&mut buf) {
                seen.push((e.token.0, u16::from_be_bytes([buf[0], buf[1]]), n));
            }
        }
    }
    sender.join().unwrap();
    seen.sort();
    assert_eq!(seen, vec![(1, 6001, 2), (3, 6003, 2), (3, 6003, 2)]);
}

#[test]
fn blocked_reader_and_writer_threads_share_a_stack() {
    let h = two_hosts("stack-threads").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    let echo = bound(&sb, 7);
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..200 {
            let (n, from) = echo.recv_from(&mut buf).unwrap();
            echo.send_to(&buf[..n], from).unwrap();
        }
    });
    // Two client sockets on one stack, each in its own thread.
    let clients: Vec<_> = (0..2u8)
        .map(|k| {
            let s = bound(&sa, 0);
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                for i in 0..100u8 {
                    s.send_to(&[k, i], (B, 7)).unwrap();
                    let n = s.recv(&mut buf).unwrap();
                    assert_eq!(&buf[..n], &[k, i]);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    server.join().unwrap();
}

#[test]
fn a_20k_datagram_goes_in_fragments_and_comes_back_whole() {
    let h = two_hosts("stack-frag").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    let server = bound(&sb, 7100);
    let client = bound(&sa, 0);
    let msg: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    client.send_to(&msg, (B, 7100)).unwrap();
    let mut buf = vec![0u8; 65536];
    let (n, from) = server.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], &msg[..]);
    server.send_to(&buf[..n], from).unwrap();
    let n = client.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &msg[..]);
    assert_eq!(sa.stats().tx.fragmented, 1);
    assert_eq!(sb.stats().reasm.reassembled, 1);
    assert_eq!(sb.stats().reasm_bytes, 0);
}

#[test]
fn in_process_multiplexers_serve_the_same_sockets() {
    // Multiplexers in this process, driven by the sockets' threads.
    let (sa, sb) = in_process_pair(&StackConfig::default()).unwrap();
    let server = bound(&sb, 7);
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for _ in 0..300 {
            let (n, from) = server.recv_from(&mut buf).unwrap();
            server.send_to(&buf[..n], from).unwrap();
        }
    });
    let c = bound(&sa, 0);
    c.connect((B, 7)).unwrap();
    let mut buf = [0u8; 2048];
    for i in 0..300u32 {
        let msg = vec![i as u8; (i as usize * 5) % 1400];
        c.send(&msg).unwrap();
        let n = c.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &msg[..]);
    }
    echo.join().unwrap();
    // B's multiplexer answers ping only while B's stack drives it.
    let ping = IcmpSocket::bind(&sa, 0).unwrap();
    ping.set_read_timeout(T).unwrap();
    let keep = bound(&sb, 0);
    let driver = std::thread::spawn(move || {
        keep.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let _ = keep.recv(&mut [0u8; 8]);
    });
    ping.send_echo(B, 1, b"in process").unwrap();
    let e = ping.recv_echo(&mut buf).unwrap();
    assert_eq!((e.from, e.seq, &buf[..e.len]), (B, 1, &b"in process"[..]));
    driver.join().unwrap();
}

/// A sender that fills the tx ring with inline frames and sleeps must be woken
/// when the multiplexer takes them: inline frames come back on no completion
/// ring, so only the ring's own room can tell (a lost wake-up here stalled a
/// sender until its write timeout).
#[test]
fn a_sender_sleeping_on_a_full_tx_ring_wakes() {
    let h = two_hosts("stack-blast").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    let rx = bound(&sb, 7300);
    let tx = bound(&sa, 0);
    tx.connect((B, 7300)).unwrap();
    tx.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let counter = std::thread::spawn(move || {
        rx.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 64];
        let mut n = 0u64;
        while rx.recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    });
    let msg = [5u8; 18];
    let batch = vec![&msg[..]; 32];
    for _ in 0..3000 {
        assert_eq!(tx.send_many(&batch).unwrap(), 32, "a sender stalled");
    }
    let got = counter.join().unwrap();
    // Datagrams may be dropped (the receiver's queue is bounded); none may
    // be stuck.
    assert!(got > 0);
}

#[test]
fn udp_try_clone_shares_the_socket() {
    let h = two_hosts("stack-clone").unwrap();
    let (sa, sb) = (stack(&h.a), stack(&h.b));
    let server = bound(&sb, 7300);
    let client = bound(&sa, 0);
    let sender = client.try_clone().unwrap();
    assert_eq!(sender.local_addr().unwrap(), client.local_addr().unwrap());
    sender.send_to(b"ping", (B, 7300)).unwrap();
    let mut buf = [0u8; 8];
    let (n, from) = server.recv_from(&mut buf).unwrap();
    server.send_to(&buf[..n], from).unwrap();
    drop(sender);
    // The original still holds the port and gets the answer.
    let n = client.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"ping");
}
