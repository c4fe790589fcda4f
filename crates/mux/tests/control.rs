//! The control socket: endpoints and channels requested by applications,
//! ownership, reclaim on close and on kill -9, hostile messages,
//! unprivileged confinement, and "disconnected" when the daemon goes.

mod common;

use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use exonet_link::memwire::{self, MemWire};
use exonet_link::Link;
use exonet_mux::{Daemon, DaemonConfig, Mux, MuxConfig, StopHandle};
use exonet_shm::control::{
    Client, ControlError, ErrorCode, HandlerSpec, Record, Reply, Request, SeqPacket, WireField,
    CONTROL_VERSION, PROTO_ICMP, PROTO_TCP, PROTO_UDP,
};
use exonet_shm::{AppEndpoint, Desc, Segment};
use exonet_wire::build;
use exonet_wire::tcp::flags::{ACK, RST, SYN};

struct TestDaemon {
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
    wire: MemWire,
}

impl TestDaemon {
    fn start(name: &str) -> TestDaemon {
        TestDaemon::start_with(name, |_| {})
    }

    fn start_with(name: &str, tune: impl FnOnce(&mut DaemonConfig) + Send + 'static) -> TestDaemon {
        let path =
            std::env::temp_dir().join(format!("exonet-test-{}-{name}.sock", std::process::id()));
        let (a, wire) = memwire::pair().unwrap();
        let (tx, rx) = mpsc::channel();
        let p = path.clone();
        let thread = std::thread::spawn(move || {
            let mux = Mux::new(Box::new(a), vec![HOST], MuxConfig::default());
            let mut config = DaemonConfig::new(p, vec![(HOST, 24)]);
            tune(&mut config);
            let mut d = Daemon::bind(mux, config).unwrap();
            tx.send(d.stop_handle()).unwrap();
            d.run().unwrap();
        });
        let stop = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        TestDaemon {
            stop,
            thread: Some(thread),
            path,
            wire,
        }
    }

    fn client(&self) -> Client {
        Client::connect(&self.path).unwrap()
    }

    fn stop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn udp_to(port: u16, payload: &[u8]) -> Vec<u8> {
    build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 7777, port, payload)
}

fn udp_from(sport: u16, payload: &[u8]) -> Vec<u8> {
    build::udp_frame(HOST_MAC, PEER_MAC, HOST, PEER, sport, 7777, payload)
}

/// An endpoint with half its buffers on the free ring; returns the rest
/// for sending.
fn endpoint(c: &mut Client) -> (u32, AppEndpoint, Vec<u32>) {
    let (id, mut app) = c.create_endpoint(&small_segment()).unwrap();
    let all: Vec<u32> = app.frames.layout().buffers().collect();
    let half = all.len() / 2;
    for &b in &all[..half] {
        assert!(app.free.push(Desc::buffer(b, 0, 0)).unwrap());
    }
    app.kick.notify_if_sleeping().unwrap();
    (id, app, all[half..].to_vec())
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn records(c: &mut Client, kind: &str) -> Vec<Record> {
    c.stats()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == kind)
        .collect()
}

fn refused(r: Result<impl std::fmt::Debug, ControlError>) -> ErrorCode {
    match r {
        Err(ControlError::Refused { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn endpoint_over_the_control_socket_carries_frames() {
    let mut d = TestDaemon::start("frames");
    let mut c = d.client();
    let info = c.info().unwrap();
    assert_eq!(info.addrs, vec![(HOST, 24)]);
    assert_eq!(info.mac, HOST_MAC.0);
    let (ep, mut app, bufs) = endpoint(&mut c);
    let (ch, port) = c.bind_socket(ep, PROTO_UDP, (HOST, 7000), None).unwrap();
    assert_eq!(port, 7000);

    d.wire.send_batch(&[&udp_to(7000, b"hello")]).unwrap();
    let mut got = Vec::new();
    until("the frame reaches the application", || {
        c.wait(&app, Some(Duration::from_millis(50)), || {
            app.rx.has_pending()
        })
        .unwrap();
        got.extend(drain_rx(&mut app));
        !got.is_empty()
    });
    assert_eq!(got, vec![(ch, udp_to(7000, b"hello"))]);

    send(&mut app, bufs[0], &udp_from(7000, b"back"), ch);
    let mut out = Vec::new();
    until("the reply reaches the wire", || {
        out.extend(drain_wire(&mut d.wire));
        !out.is_empty()
    });
    assert_eq!(out, vec![udp_from(7000, b"back")]);
    let eps = records(&mut c, "endpoint");
    assert_eq!(eps.len(), 1);
    assert_eq!(eps[0].get("rx_frames"), Some(1));
    assert_eq!(eps[0].get("tx_frames"), Some(1));
    let chans = records(&mut c, "channel");
    assert_eq!(chans[0].get("rx_frames"), Some(1));
    assert_eq!(chans[0].get("tx_frames"), Some(1));
}

#[test]
fn requests_reach_only_what_the_connection_holds() {
    let d = TestDaemon::start("owner");
    let mut a = d.client();
    let mut b = d.client();
    let (ea, _app_a, _) = endpoint(&mut a);
    let (cha, _) = a.bind_socket(ea, PROTO_UDP, (HOST, 7001), None).unwrap();
    let (eb, _app_b, _) = endpoint(&mut b);
    assert_eq!(refused(b.destroy_endpoint(ea)), ErrorCode::NoSuchEndpoint);
    assert_eq!(refused(b.unbind(cha)), ErrorCode::NoSuchChannel);
    assert_eq!(
        refused(b.bind_socket(ea, PROTO_UDP, (HOST, 7002), None)),
        ErrorCode::NoSuchEndpoint
    );
    assert_eq!(
        refused(b.bind_socket(eb, PROTO_UDP, (HOST, 7001), None)),
        ErrorCode::PortInUse
    );
    assert_eq!(
        refused(b.bind_socket(eb, PROTO_UDP, (Ipv4Addr::new(10, 9, 9, 9), 7003), None)),
        ErrorCode::NotOurAddress
    );
    assert_eq!(
        refused(b.bind_channel(eb, &["nonsense".into()], &[])),
        ErrorCode::BadFilter
    );
    assert_eq!(
        refused(b.bind_socket(eb, 2, (HOST, 9), None)),
        ErrorCode::BadRequest
    );
    // An ICMP echo socket: identifier 9 is not privileged, and not a's UDP
    // port 7001's space.
    let (_, ident) = b.bind_socket(eb, PROTO_ICMP, (HOST, 9), None).unwrap();
    assert_eq!(ident, 9);
    b.bind_socket(eb, PROTO_ICMP, (HOST, 7001), None).unwrap();
    let host = records(&mut b, "host");
    assert!(host[0]
        .fields
        .iter()
        .any(|(n, _)| n == "icmp_errors_delivered"));
    // Unbinding frees the port for the other connection.
    a.unbind(cha).unwrap();
    b.bind_socket(eb, PROTO_UDP, (HOST, 7001), None).unwrap();
    b.destroy_endpoint(eb).unwrap();
    assert_eq!(refused(b.destroy_endpoint(eb)), ErrorCode::NoSuchEndpoint);
}

#[test]
fn closing_the_connection_reclaims_everything() {
    let d = TestDaemon::start("close");
    let mut watcher = d.client();
    {
        let mut a = d.client();
        let (e1, _app1, _) = endpoint(&mut a);
        let (e2, _app2, _) = endpoint(&mut a);
        a.bind_socket(e1, PROTO_UDP, (HOST, 7010), None).unwrap();
        a.bind_socket(e2, PROTO_UDP, (HOST, 0), None).unwrap();
        assert_eq!(records(&mut watcher, "endpoint").len(), 2);
        assert_eq!(records(&mut watcher, "channel").len(), 2);
    }
    until("the endpoints are reclaimed", || {
        records(&mut watcher, "endpoint").is_empty()
    });
    assert!(records(&mut watcher, "channel").is_empty());
    let (e, _app, _) = endpoint(&mut watcher);
    watcher
        .bind_socket(e, PROTO_UDP, (HOST, 7010), None)
        .unwrap();
}

#[test]
fn closing_the_connection_resets_its_tcp_connections() {
    let mut d = TestDaemon::start("tcp");
    let mut watcher = d.client();
    let port = {
        let mut a = d.client();
        let (ep, mut app, bufs) = endpoint(&mut a);
        let (ch, port) = a
            .bind_socket(ep, PROTO_TCP, (HOST, 0), Some((PEER, 80)))
            .unwrap();
        let ours = |fl, seq, ack, data: &[u8]| tcp_to_peer(port, 80, fl, seq, ack, data);
        let mut out = Vec::new();
        send(&mut app, bufs[0], &ours(SYN, 100, 0, &[]), ch);
        let syn_ack = build::tcp_frame(
            PEER_MAC,
            HOST_MAC,
            PEER,
            HOST,
            80,
            port,
            SYN | ACK,
            900,
            101,
            &[],
            &[],
        );
        d.wire.send_batch(&[&syn_ack]).unwrap();
        until("the SYN-ACK reaches the application", || {
            wait_rx(&mut a, &app);
            !drain_rx(&mut app).is_empty()
        });
        send(&mut app, bufs[1], &ours(ACK, 101, 901, b"data"), ch);
        until("both segments reach the wire", || {
            out.extend(drain_wire(&mut d.wire));
            out.len() == 2
        });
        port
    };
    let mut rst = Vec::new();
    until("the multiplexer resets the connection", || {
        rst.extend(drain_wire(&mut d.wire));
        !rst.is_empty()
    });
    let want = build::tcp_frame(
        HOST_MAC,
        PEER_MAC,
        HOST,
        PEER,
        port,
        80,
        RST,
        105,
        0,
        &[],
        &[],
    );
    assert_eq!(rst, vec![want]);
    let host = records(&mut watcher, "host");
    assert_eq!(host[0].get("tcp_aborted"), Some(1));
    assert_eq!(host[0].get("time_wait_now"), Some(0));
}

fn wait_rx(c: &mut Client, app: &AppEndpoint) {
    c.wait(app, Some(Duration::from_millis(50)), || {
        app.rx.has_pending()
    })
    .unwrap();
}

/// A raw connection that says hello.
fn raw(d: &TestDaemon) -> (SeqPacket, Vec<u8>) {
    let s = SeqPacket::connect(&d.path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (s, vec![0; 70_000])
}

fn ask(s: &SeqPacket, buf: &mut [u8], bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> Reply {
    s.send(bytes, fds).unwrap();
    let (n, _) = s.recv(buf).unwrap();
    assert!(n > 0, "the daemon hung up");
    Reply::decode(&buf[..n]).unwrap()
}

fn code(r: Reply) -> ErrorCode {
    match r {
        Reply::Error { code, .. } => code,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn hostile_messages_get_errors_not_crashes() {
    let d = TestDaemon::start("hostile");
    let (s, mut buf) = raw(&d);
    let info = Request::Info.encode();
    assert_eq!(
        code(ask(&s, &mut buf, &info, &[])),
        ErrorCode::BadRequest,
        "before hello"
    );
    let hello = Request::Hello { version: 1 }.encode();
    assert!(matches!(
        ask(&s, &mut buf, &hello, &[]),
        Reply::Hello { .. }
    ));
    for garbage in [
        &[0xff][..],
        &[5, 1, 2],
        &[6, 0, 0, 0, 0, 255, 255, 255, 255],
    ] {
        assert_eq!(code(ask(&s, &mut buf, garbage, &[])), ErrorCode::BadRequest);
    }
    // Too long for any message.
    let big = vec![2u8; 69_000];
    assert_eq!(code(ask(&s, &mut buf, &big, &[])), ErrorCode::BadRequest);
    // Descriptors where none belong, and the wrong ones for an endpoint.
    let f = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(
        code(ask(&s, &mut buf, &info, &[f.as_fd()])),
        ErrorCode::BadRequest
    );
    let create = Request::CreateEndpoint.encode();
    assert_eq!(code(ask(&s, &mut buf, &create, &[])), ErrorCode::BadSegment);
    let five = [f.as_fd(), f.as_fd(), f.as_fd(), f.as_fd(), f.as_fd()];
    assert_eq!(
        code(ask(&s, &mut buf, &create, &five)),
        ErrorCode::BadSegment
    );
    // A real segment with files where the doorbells belong.
    let seg = Segment::create(&small_segment()).unwrap();
    let with_files = [seg.fd(), f.as_fd(), f.as_fd(), f.as_fd(), f.as_fd()];
    assert_eq!(
        code(ask(&s, &mut buf, &create, &with_files)),
        ErrorCode::BadSegment
    );
    // A template field longer than allowed; a bind for an endpoint that is
    // not ours.
    let bind = Request::BindChannel {
        endpoint: 0,
        filters: vec![],
        template: vec![WireField {
            offset: 0,
            bytes: vec![0; 65],
            mask: vec![0; 65],
        }],
    }
    .encode();
    assert_eq!(code(ask(&s, &mut buf, &bind, &[])), ErrorCode::BadRequest);
    let unbind = Request::Unbind { channel: 12345 }.encode();
    assert_eq!(
        code(ask(&s, &mut buf, &unbind, &[])),
        ErrorCode::NoSuchChannel
    );
    // The connection and the daemon still serve.
    assert!(matches!(ask(&s, &mut buf, &info, &[]), Reply::Info { .. }));
    // An empty message reads as end of stream: that connection closes,
    // nobody else notices.
    s.send(&[], &[]).unwrap();
    assert_eq!(s.recv(&mut buf).unwrap().0, 0);
    let mut c = d.client();
    endpoint(&mut c);
}

#[test]
fn applications_see_disconnected_when_the_daemon_exits() {
    let mut d = TestDaemon::start("exit");
    let mut c = d.client();
    let (_, app, _) = endpoint(&mut c);
    d.stop();
    assert!(matches!(c.info(), Err(ControlError::Disconnected)));
    assert!(!c.is_connected());
    assert!(matches!(
        c.wait(&app, Some(Duration::from_secs(5)), || false),
        Err(ControlError::Disconnected)
    ));
    assert!(!d.path.exists(), "the socket file is removed");
}

/// Runs `child` in a forked process (holding none of the parent's
/// descriptors) and returns its pid.
fn fork(child: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child only closes descriptors, runs `child` (our code,
    // fresh connections) and leaves with `_exit`, never returning into the
    // test harness; glibc's malloc is fork-safe.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
            libc::_exit(code);
        }
        pid
    }
}

fn reap(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
}

#[test]
fn kill_9_mid_stream_is_reclaimed_and_others_keep_being_served() {
    let mut d = TestDaemon::start("kill9");
    let mut other = d.client();
    let (oe, mut oapp, _) = endpoint(&mut other);
    let (och, _) = other
        .bind_socket(oe, PROTO_UDP, (HOST, 7020), None)
        .unwrap();

    let path = d.path.clone();
    let pid = fork(move || {
        let mut c = Client::connect(&path).unwrap();
        let (ep, mut app, bufs) = endpoint(&mut c);
        let (ch, _) = c.bind_socket(ep, PROTO_UDP, (HOST, 7021), None).unwrap();
        let frame = udp_from(7021, &[0x42; 200]);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut i = 0;
        // Stream until killed (bounded, should the kill never come).
        while Instant::now() < deadline {
            while app.completion.pop().ok().flatten().is_some() {}
            app.frames.write(bufs[i % bufs.len()], &frame).unwrap();
            if app
                .tx
                .push(Desc::buffer(bufs[i % bufs.len()], frame.len() as u32, ch))
                .unwrap()
            {
                i += 1;
            }
            app.kick.notify_if_sleeping().unwrap();
        }
        0
    });
    let mut streamed = 0;
    until("the child streams", || {
        streamed += drain_wire(&mut d.wire).len();
        streamed > 100
    });
    // SAFETY: kills our own child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let status = reap(pid);
    assert!(libc::WIFSIGNALED(status), "the child was killed");
    until("the killed application's endpoint is reclaimed", || {
        records(&mut other, "endpoint").len() == 1
    });
    // Its port is free again, and the survivor is still served.
    let (e2, _app2, _) = endpoint(&mut other);
    other
        .bind_socket(e2, PROTO_UDP, (HOST, 7021), None)
        .unwrap();
    d.wire.send_batch(&[&udp_to(7020, b"still here")]).unwrap();
    let mut got = Vec::new();
    until("the survivor receives", || {
        got.extend(drain_rx(&mut oapp));
        !got.is_empty()
    });
    assert_eq!(got, vec![(och, udp_to(7020, b"still here"))]);
    d.stop();
}

/// An application without root gets an unprivileged endpoint: no ports
/// below 1024, no filter or template beyond what it owns, no weights.
#[test]
fn unprivileged_applications_are_confined() {
    let d = TestDaemon::start("unpriv");
    let path = d.path.clone();
    let checks = move || -> i32 {
        let mut c = Client::connect(&path).unwrap();
        let (ep, _app, _) = endpoint(&mut c);
        let r = [
            refused(c.bind_socket(ep, PROTO_UDP, (HOST, 80), None)),
            refused(c.bind_channel(ep, &["12:16 == 0x800".into()], &[])),
            refused(c.set_weight(ep, 5)),
        ];
        assert_eq!(r, [ErrorCode::NotPermitted; 3]);
        c.bind_socket(ep, PROTO_UDP, (HOST, 5000), None).unwrap();
        0
    };
    as_nobody(checks);
}

/// Runs `checks` as an unprivileged user: in a child that drops to
/// nobody when we are root, here otherwise; it must return 0.
fn as_nobody(checks: impl FnOnce() -> i32) {
    // SAFETY: geteuid touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        assert_eq!(checks(), 0);
        return;
    }
    let pid = fork(move || {
        // SAFETY: drops privileges in the child only.
        unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return 2;
            }
        }
        checks()
    });
    let status = reap(pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "unprivileged checks failed: status {status:#x}"
    );
}

#[test]
fn root_endpoints_may_monitor() {
    // SAFETY: geteuid touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let d = TestDaemon::start("root");
    let mut c = d.client();
    let (ep, _app, _) = endpoint(&mut c);
    c.bind_channel(ep, &["12:16 == 0x800".into()], &[]).unwrap();
    c.set_weight(ep, 4).unwrap();
    let eps = records(&mut c, "endpoint");
    assert_eq!(eps[0].get("privileged"), Some(1));
    assert_eq!(eps[0].get("weight"), Some(4));
}

#[test]
fn per_connection_limits_hold() {
    let d = TestDaemon::start_with("limits", |c| {
        c.max_endpoints = 2;
        c.max_channels = 3;
        c.max_segment_bytes = 1 << 20;
    });
    let mut c = d.client();
    let (e1, _a1, _) = endpoint(&mut c);
    let (_e2, _a2, _) = endpoint(&mut c);
    assert_eq!(
        refused(c.create_endpoint(&small_segment()).map(|(id, _)| id)),
        ErrorCode::Limit
    );
    for port in 7100..7103 {
        c.bind_socket(e1, PROTO_UDP, (HOST, port), None).unwrap();
    }
    assert_eq!(
        refused(c.bind_socket(e1, PROTO_UDP, (HOST, 7103), None)),
        ErrorCode::Limit
    );
    // Another connection has limits of its own.
    let mut other = d.client();
    let big = exonet_shm::SegmentConfig {
        frame_size: 4096,
        frame_count: 1024,
        ring_entries: [64; 4],
    };
    assert_eq!(
        refused(other.create_endpoint(&big).map(|(id, _)| id)),
        ErrorCode::Limit
    );
    endpoint(&mut other);
}

/// One user cannot take every connection; root is not limited this way.
#[test]
fn connections_are_limited_per_user() {
    let d = TestDaemon::start_with("peruid", |c| c.max_connections_per_uid = 2);
    let path = d.path.clone();
    let checks = move || -> i32 {
        let a = Client::connect(&path).unwrap();
        let b = Client::connect(&path).unwrap();
        assert!(matches!(
            Client::connect(&path),
            Err(ControlError::Disconnected)
        ));
        drop(a);
        // The slot comes back once the daemon has seen the close.
        until("a slot frees", || Client::connect(&path).is_ok());
        drop(b);
        0
    };
    // Root's own connections count against no user's limit.
    let clients: Vec<Client> = (0..4).map(|_| d.client()).collect();
    as_nobody(checks);
    drop(clients);
}

/// One user's endpoints share a budget of segment bytes across its
/// connections, and a destroyed endpoint's bytes come back; root's count
/// against no budget.
#[test]
fn segment_bytes_are_budgeted_per_user() {
    let size = segment(&small_segment()).layout().segment_size();
    // Two small segments fit, a third does not.
    let d = TestDaemon::start_with("segbudget", move |c| {
        c.max_segment_bytes_per_uid = 2 * size + size / 2;
    });
    // SAFETY: geteuid touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    let mut c = d.client();
    let held: Vec<_> = (0..if root { 3 } else { 0 })
        .map(|_| endpoint(&mut c))
        .collect();
    let path = d.path.clone();
    let checks = move || -> i32 {
        let mut a = Client::connect(&path).unwrap();
        let mut b = Client::connect(&path).unwrap();
        let (e1, _app1) = a.create_endpoint(&small_segment()).unwrap();
        let (_e2, _app2) = b.create_endpoint(&small_segment()).unwrap();
        match b.create_endpoint(&small_segment()).map(|(id, _)| id) {
            Err(ControlError::Refused { code, message }) => {
                assert_eq!(code, ErrorCode::Limit);
                assert!(message.contains("budget"), "{message}");
            }
            other => panic!("a third segment was not refused: {other:?}"),
        }
        a.destroy_endpoint(e1).unwrap();
        b.create_endpoint(&small_segment()).unwrap();
        0
    };
    as_nobody(checks);
    drop(held);
}

#[test]
fn handler_installs_over_the_socket_are_checked() {
    let d = TestDaemon::start("ash-install");
    let mut c = d.client();
    let (ep, _app, _) = endpoint(&mut c);
    let (ch, _) = c.bind_socket(ep, PROTO_UDP, (HOST, 5000), None).unwrap();
    // A good one, through the library's memfd.
    let module = br#"(module (func (export "ash_handle") (param i32) (result i32) (i32.const 1)))"#;
    let spec = HandlerSpec {
        module: module.to_vec(),
        ..HandlerSpec::default()
    };
    c.install_handler(ch, &spec).unwrap();
    let channel = records(&mut c, "channel");
    assert_eq!(channel[0].get("handler"), Some(1));
    c.remove_handler(ch).unwrap();
    // A module that does not compile: refused with the reason.
    let bad = HandlerSpec {
        module: b"\0asm\x01\0\0\0\x05".to_vec(),
        ..HandlerSpec::default()
    };
    match c.install_handler(ch, &bad) {
        Err(ControlError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::BadHandler);
            assert!(message.contains("handler refused"), "{message}");
        }
        other => panic!("installed: {other:?}"),
    }
    // Someone else's channel is not there for this connection.
    let install = |channel: u32, module_len: u32| Request::InstallHandler {
        channel,
        module_len,
        spec: HandlerSpec::default(),
    };
    let blob = exonet_shm::blob_memfd(module).unwrap();
    let mut other = d.client();
    match other.request(&install(ch, module.len() as u32), &[blob.as_fd()]) {
        Err(ControlError::Refused { code, .. }) => assert_eq!(code, ErrorCode::NoSuchChannel),
        r => panic!("{r:?}"),
    }
    // On its own channel the descriptor is looked at: there must be one,
    // a memfd, as long as it says.
    let (ep2, _app2, _) = endpoint(&mut other);
    let (ch2, _) = other
        .bind_socket(ep2, PROTO_UDP, (HOST, 5001), None)
        .unwrap();
    let (tx, _rx) = std::os::unix::net::UnixDatagram::pair().unwrap();
    let len = module.len() as u32;
    for (fds, len, want) in [
        (vec![], len, ErrorCode::BadRequest),
        (vec![tx.as_fd()], len, ErrorCode::BadHandler),
        (vec![blob.as_fd()], len + 1, ErrorCode::BadHandler),
    ] {
        match other.request(&install(ch2, len), &fds) {
            Err(ControlError::Refused { code, .. }) => assert_eq!(code, want),
            r => panic!("{r:?}"),
        }
    }
    assert!(matches!(
        other.request(&install(ch2, len), &[blob.as_fd()]),
        Ok(Reply::Ok)
    ));
}

fn mux_record(c: &mut Client) -> Record {
    records(c, "mux").remove(0)
}

/// An unbind nobody waits for is done before the connection's next
/// request: the port is free for it with no round trip in between.
#[test]
fn an_unanswered_unbind_frees_the_port_before_the_next_request() {
    let d = TestDaemon::start("unbind-async");
    let mut a = d.client();
    let (ep, _app, _) = endpoint(&mut a);
    for round in 0..20 {
        let (ch, _) = a
            .bind_socket(ep, PROTO_TCP, (HOST, 7200), Some((PEER, 80)))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        a.unbind_async(ch).unwrap();
    }
    let (ch, _) = a.bind_socket(ep, PROTO_UDP, (HOST, 7201), None).unwrap();
    a.unbind_async(ch).unwrap();
    // Another connection finds it free once this one has had an answer
    // since.
    let mut b = d.client();
    let (eb, _app_b, _) = endpoint(&mut b);
    a.info().unwrap();
    b.bind_socket(eb, PROTO_UDP, (HOST, 7201), None).unwrap();
    assert_eq!(records(&mut a, "channel").len(), 1);
    assert_eq!(mux_record(&mut a).get("unanswered_refused"), Some(0));
}

/// An unanswered unbind of a channel the connection does not own changes
/// nothing for the owner; it is counted, and the sender's connection goes
/// on with its answers in step.
#[test]
fn an_unanswered_unbind_of_another_channel_is_counted_and_ignored() {
    let d = TestDaemon::start("unbind-async-hostile");
    let mut a = d.client();
    let mut b = d.client();
    let (ea, _app_a, _) = endpoint(&mut a);
    let (cha, _) = a.bind_socket(ea, PROTO_UDP, (HOST, 7210), None).unwrap();
    let (eb, _app_b, _) = endpoint(&mut b);
    b.unbind_async(cha).unwrap();
    b.unbind_async(12345).unwrap();
    b.post(&Request::DestroyEndpoint { endpoint: ea }).unwrap();
    // b's next answer is its own, not a refusal of those.
    assert_eq!(
        refused(b.bind_socket(eb, PROTO_UDP, (HOST, 7210), None)),
        ErrorCode::PortInUse
    );
    let (chb, _) = b.bind_socket(eb, PROTO_UDP, (HOST, 7211), None).unwrap();
    assert_ne!(chb, cha);
    assert_eq!(mux_record(&mut b).get("unanswered_refused"), Some(3));
    assert_eq!(records(&mut a, "channel").len(), 2);
    assert_eq!(records(&mut a, "endpoint").len(), 2);
    // a's channel still works, and is still a's to unbind.
    a.unbind(cha).unwrap();
}

/// Requests sent ahead without reading are answered in order, whether the
/// multiplexer thread answers them (Info, refusals) or the control thread
/// (hello, what does not decode), and the unanswered one not at all.
#[test]
fn pipelined_requests_are_answered_in_order() {
    let d = TestDaemon::start("pipeline");
    let (s, mut buf) = raw(&d);
    let hello = Request::Hello {
        version: CONTROL_VERSION,
    }
    .encode();
    assert!(matches!(
        ask(&s, &mut buf, &hello, &[]),
        Reply::Hello { .. }
    ));
    let unbind = Request::Unbind { channel: 999 };
    let sent: Vec<Vec<u8>> = vec![
        Request::Info.encode(),
        vec![0xff],
        unbind.encode(),
        unbind.encode_unanswered().unwrap(),
        hello.clone(),
        Request::Stats { from: 0 }.encode(),
        vec![5, 1],
        Request::Info.encode(),
        Request::DestroyEndpoint { endpoint: 3 }.encode(),
        hello,
    ];
    for round in 0..20 {
        for m in &sent {
            s.send(m, &[]).unwrap();
        }
        let mut got = Vec::new();
        for _ in 0..sent.len() - 1 {
            let (n, _) = s.recv(&mut buf).unwrap();
            assert!(n > 0, "round {round}: the daemon hung up");
            got.push(match Reply::decode(&buf[..n]).unwrap() {
                Reply::Info { .. } => "info".to_string(),
                Reply::Hello { .. } => "hello".to_string(),
                Reply::Stats { .. } => "stats".to_string(),
                Reply::Error { code, .. } => format!("{code:?}"),
                other => format!("{other:?}"),
            });
        }
        assert_eq!(
            got,
            [
                "info",
                "BadRequest",
                "NoSuchChannel",
                "hello",
                "stats",
                "BadRequest",
                "info",
                "NoSuchEndpoint",
                "hello"
            ],
            "round {round}"
        );
    }
    let mut c = d.client();
    assert_eq!(mux_record(&mut c).get("unanswered_refused"), Some(20));
}

/// A client that sends requests and never reads the answers cannot block
/// the multiplexer nor grow its queue: its connection is cut once its
/// socket takes no more answers, and reclaimed; others are served all
/// along.
#[test]
fn a_client_that_reads_no_answers_is_cut_and_reclaimed() {
    let d = TestDaemon::start("flood");
    let mut other = d.client();
    let (s, mut buf) = raw(&d);
    let hello = Request::Hello {
        version: CONTROL_VERSION,
    }
    .encode();
    assert!(matches!(
        ask(&s, &mut buf, &hello, &[]),
        Reply::Hello { .. }
    ));
    // The flooder's endpoint, reclaimed with it.
    let seg = Segment::create(&small_segment()).unwrap();
    let bells = exonet_shm::Doorbells::new().unwrap();
    let (app_rx, app_tx) = bells.app.fds();
    let (mux_rx, mux_tx) = bells.mux.fds();
    let create = Request::CreateEndpoint.encode();
    let fds = [seg.fd(), app_rx, app_tx, mux_rx, mux_tx];
    assert!(matches!(
        ask(&s, &mut buf, &create, &fds),
        Reply::Endpoint { .. }
    ));
    s.set_nonblocking(true).unwrap();
    let stats = Request::Stats { from: 0 }.encode();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut sent = 0u64;
    let mut served_meanwhile = 0;
    loop {
        assert!(Instant::now() < deadline, "never cut after {sent} requests");
        // Another client is served all along: while the flood waits (or is
        // being cut), and between its requests, as a daemon that reads
        // them as fast as they come fills the flooder's socket with answers
        // before the flooder's own socket ever fills (CI saw that).
        match s.send(&stats, &[]) {
            Ok(()) => {
                sent += 1;
                if sent.is_multiple_of(4) {
                    assert!(mux_record(&mut other).get("connections").is_some());
                    served_meanwhile += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(mux_record(&mut other).get("connections").is_some());
                served_meanwhile += 1;
            }
            // Cut: the daemon shut the connection.
            Err(_) => break,
        }
    }
    assert!(
        served_meanwhile > 0,
        "no other client was asked during the flood"
    );
    until("the flooder is reclaimed", || {
        mux_record(&mut other).get("connections_cut") == Some(1)
    });
    assert_eq!(mux_record(&mut other).get("connections"), Some(1));
    assert!(records(&mut other, "endpoint").is_empty());
    // What it reads is answers, then end of stream; "reset" once, as the
    // daemon closed with requests unread.
    s.set_nonblocking(false).unwrap();
    let mut answers = 0;
    let mut resets = 0;
    loop {
        let n = match s.recv(&mut buf) {
            Ok((n, _)) => n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && resets == 0 => {
                resets += 1;
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        if n == 0 {
            break;
        }
        assert!(matches!(
            Reply::decode(&buf[..n]).unwrap(),
            Reply::Stats { .. }
        ));
        answers += 1;
    }
    assert!(answers > 0 && answers < sent, "{answers} of {sent}");
    let (e, _app, _) = endpoint(&mut other);
    other.bind_socket(e, PROTO_UDP, (HOST, 7220), None).unwrap();
}
