//! Handlers (ASH) installed through the protocol library: a UDP socket's
//! handler runs in the multiplexer (a daemon reached over its control
//! socket, the module passed in a memfd; or a multiplexer in the process),
//! writes into the stack's window, answers for the application or leaves
//! the datagram to it.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use exonet::hosts::{in_process_pair, two_hosts, A, B};
use exonet_ash::handler::examples::{self, CacheLayout};
use exonet_mux::Running;
use exonet_shm::control::HandlerSpec;
use exonet_stack::{Stack, StackConfig, UdpSocket, Window};

const T: Option<Duration> = Some(Duration::from_secs(5));

fn with_window(d: &Running) -> Stack {
    let config = StackConfig {
        window: 8192,
        ..StackConfig::default()
    };
    Stack::open_with(d.socket(), &config).unwrap()
}

fn bound(s: &Stack, port: u16) -> UdpSocket {
    let u = UdpSocket::bind(s, (Ipv4Addr::UNSPECIFIED, port)).unwrap();
    u.set_read_timeout(T).unwrap();
    u
}

fn spec(module: &str, w: &Window) -> HandlerSpec {
    HandlerSpec {
        module: module.as_bytes().to_vec(),
        window: Some((w.offset(), w.len() as u32)),
        ..HandlerSpec::default()
    }
}

fn ask(client: &UdpSocket, to: (Ipv4Addr, u16), req: &[u8]) -> Vec<u8> {
    client.send_to(req, to).unwrap();
    let mut buf = [0u8; 2048];
    let (n, from) = client.recv_from(&mut buf).unwrap();
    assert_eq!(from, SocketAddrV4::new(to.0, to.1).into());
    buf[..n].to_vec()
}

#[test]
fn remote_increment_through_a_daemon() {
    let h = two_hosts("ash-inc").unwrap();
    let (sa, sb) = (Stack::open(h.a.socket()).unwrap(), with_window(&h.b));
    let server = bound(&sb, 7100);
    let w = sb.window().expect("a window");
    assert!(w.len() >= 8192);
    w.store_u64(40, 41).unwrap();
    server
        .install_handler(&spec(examples::REMOTE_INCREMENT_WAT, &w))
        .unwrap();
    let client = bound(&sa, 0);
    for want in 42..47u64 {
        let r = ask(&client, (B, 7100), &40u32.to_le_bytes());
        assert_eq!(r, want.to_le_bytes());
    }
    // The application sees the handler's writes, and received nothing.
    assert_eq!(w.load_u64(40).unwrap(), 46);
    server.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(
        server.recv_from(&mut buf).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    // Removed, the requests reach the application.
    server.remove_handler().unwrap();
    server.set_nonblocking(false).unwrap();
    client.send_to(&40u32.to_le_bytes(), (B, 7100)).unwrap();
    let (n, _) = server.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], 40u32.to_le_bytes());
}

#[test]
fn cache_server_answers_hits_and_leaves_misses_to_the_application() {
    let h = two_hosts("ash-cache").unwrap();
    let (sa, sb) = (Stack::open(h.a.socket()).unwrap(), with_window(&h.b));
    let server = bound(&sb, 7200);
    let w = sb.window().unwrap();
    let layout = CacheLayout::new(8, 16, 64).unwrap();
    let mut cache = vec![0u8; layout.window_len()];
    assert!(layout.format(&mut cache));
    assert!(layout.insert(&mut cache, 3, b"apple", b"red"));
    assert!(layout.insert(&mut cache, 5, b"banana", b"yellow"));
    w.write(0, &cache).unwrap();
    server
        .install_handler(&spec(examples::CACHE_SERVER_WAT, &w))
        .unwrap();
    let client = bound(&sa, 0);
    assert_eq!(ask(&client, (B, 7200), b"apple"), b"red");
    assert_eq!(ask(&client, (B, 7200), b"banana"), b"yellow");
    // A miss: the handler aborts, the application gets the request.
    client.send_to(b"cherry", (B, 7200)).unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = server.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"cherry");
    server.send_to(b"dark red", from).unwrap();
    let (n, _) = client.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"dark red");
}

#[test]
fn bad_handlers_are_refused_with_the_reason() {
    let h = two_hosts("ash-bad").unwrap();
    let sb = with_window(&h.b);
    let server = bound(&sb, 7300);
    let w = sb.window().unwrap();
    let refused = |spec: HandlerSpec| {
        let e = server.install_handler(&spec).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        e.to_string()
    };
    let e = refused(HandlerSpec {
        module: b"(module)".to_vec(),
        ..HandlerSpec::default()
    });
    assert!(
        e.contains("handler refused") && e.contains("ash_handle"),
        "{e}"
    );
    let e = refused(HandlerSpec {
        module: examples::EMPTY_WAT.as_bytes().to_vec(),
        window: Some((w.offset() + w.len() as u32 - 8, 4096)),
        ..HandlerSpec::default()
    });
    assert!(e.contains("window"), "{e}");
    // A stack without a window grants none; the socket still works.
    let sa = Stack::open(h.a.socket()).unwrap();
    assert!(sa.window().is_none());
    let client = bound(&sa, 0);
    client.send_to(b"still here", (B, 7300)).unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = server.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"still here");
}

#[test]
fn udp_echo_in_process() {
    let config = StackConfig {
        window: 4096,
        ..StackConfig::default()
    };
    let (sa, sb) = in_process_pair(&config).unwrap();
    let server = bound(&sb, 7400);
    server
        .install_handler(&HandlerSpec {
            module: examples::UDP_ECHO_WAT.as_bytes().to_vec(),
            ..HandlerSpec::default()
        })
        .unwrap();
    // An in-process multiplexer runs when its stack's threads drive it:
    // here a thread waiting for datagrams the handler leaves (none).
    let stop = Arc::new(AtomicBool::new(false));
    let driver = std::thread::spawn({
        let (server, stop) = (server.try_clone().unwrap(), stop.clone());
        move || {
            server
                .set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let mut left = 0;
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                left += server.recv_from(&mut buf).is_ok() as usize;
            }
            left
        }
    });
    let client = bound(&sa, 0);
    assert_eq!(client.local_addr().unwrap().ip(), std::net::IpAddr::V4(A));
    for size in [0usize, 1, 100, 1472] {
        let msg: Vec<u8> = (0..size).map(|i| i as u8).collect();
        assert_eq!(ask(&client, (B, 7400), &msg), msg);
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(driver.join().unwrap(), 0, "the handler consumed them all");
}
