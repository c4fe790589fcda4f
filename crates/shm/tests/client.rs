//! The client's requests without a reply: sent in order with the others,
//! and the client does not wait for them (a fake multiplexer here answers
//! only what asks for an answer, so a client that waited would hang). And
//! its begun requests, whose answers it takes later, in order.

use std::net::Ipv4Addr;
use std::sync::mpsc;

use exonet_shm::control::{
    Client, ControlError, ErrorCode, Reply, Request, SeqPacket, CONTROL_VERSION, MAX_MESSAGE,
    PROTO_TCP,
};

/// Answers what asks for an answer (hello, else port 9) and tells `seen`
/// each request and whether it asked, until the client hangs up.
fn fake_multiplexer(theirs: SeqPacket, mut seen: impl FnMut((Request, bool))) {
    let mut buf = vec![0; MAX_MESSAGE];
    loop {
        let (n, _) = theirs.recv(&mut buf).unwrap();
        if n == 0 {
            return;
        }
        let (req, answer) = Request::decode(&buf[..n]).unwrap();
        if answer {
            let reply = match req {
                Request::Hello { .. } => Reply::Hello {
                    version: CONTROL_VERSION,
                },
                _ => Reply::Port { port: 9 },
            };
            theirs.send(&reply.encode(), &[]).unwrap();
        }
        seen((req, answer));
    }
}

#[test]
fn unanswered_requests_go_in_order_without_waiting() {
    let (ours, theirs) = SeqPacket::pair().unwrap();
    let multiplexer = std::thread::spawn(move || {
        let mut got = Vec::new();
        fake_multiplexer(theirs, |r| got.push(r));
        got
    });
    let mut c = Client::over(ours).unwrap();
    c.unbind_async(3).unwrap();
    c.unbind_async(4).unwrap();
    // A request whose answer carries something cannot go unanswered; it is
    // not sent.
    match c.post(&Request::Info) {
        Err(ControlError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput),
        other => panic!("posted: {other:?}"),
    }
    assert_eq!(c.allocate_port(1, PROTO_TCP, 0).unwrap(), 9);
    drop(c);
    assert_eq!(
        multiplexer.join().unwrap(),
        vec![
            (
                Request::Hello {
                    version: CONTROL_VERSION
                },
                true
            ),
            (Request::Unbind { channel: 3 }, false),
            (Request::Unbind { channel: 4 }, false),
            (
                Request::AllocatePort {
                    endpoint: 1,
                    proto: PROTO_TCP,
                    port: 0
                },
                true
            ),
        ]
    );
}

/// Binds begun without waiting are answered in the order begun; the answer
/// is `None` until it comes (unless waited for), and a request that waits
/// for its own reply between keeps theirs for later.
#[test]
fn begun_binds_are_answered_in_order_around_waited_requests() {
    let (ours, theirs) = SeqPacket::pair().unwrap();
    // Each bind is answered only once the test says so.
    let (go, gate) = mpsc::channel::<()>();
    let multiplexer = std::thread::spawn(move || {
        let mut buf = vec![0; MAX_MESSAGE];
        let mut channel = 10;
        loop {
            let (n, _) = theirs.recv(&mut buf).unwrap();
            if n == 0 {
                return;
            }
            let reply = match Request::decode(&buf[..n]).unwrap().0 {
                Request::Hello { .. } => Reply::Hello {
                    version: CONTROL_VERSION,
                },
                Request::BindSocket { local_port: 0, .. } => Reply::Error {
                    code: ErrorCode::NoPortsLeft,
                    message: "none".into(),
                },
                Request::BindSocket { local_port, .. } => {
                    gate.recv().unwrap();
                    channel += 1;
                    Reply::Bound {
                        channel,
                        port: local_port,
                    }
                }
                _ => Reply::Port { port: 9 },
            };
            theirs.send(&reply.encode(), &[]).unwrap();
        }
    });
    let ip = Ipv4Addr::new(10, 77, 0, 1);
    let mut c = Client::over(ours).unwrap();
    assert!(c.bound_socket(false).is_none(), "nothing begun");
    c.begin_bind_socket(1, PROTO_TCP, (ip, 100), Some((ip, 80)))
        .unwrap();
    c.begin_bind_socket(1, PROTO_TCP, (ip, 101), None).unwrap();
    assert_eq!(c.unanswered(), 2);
    assert!(c.bound_socket(false).is_none(), "not answered yet");
    go.send(()).unwrap();
    assert_eq!(c.bound_socket(true).unwrap().unwrap(), (11, 100));
    go.send(()).unwrap();
    // Waits past the second bind's answer, which it keeps.
    assert_eq!(c.allocate_port(1, PROTO_TCP, 0).unwrap(), 9);
    assert_eq!(c.unanswered(), 1);
    assert_eq!(c.bound_socket(false).unwrap().unwrap(), (12, 101));
    assert!(c.bound_socket(false).is_none());
    // A refusal is the answer's.
    c.begin_bind_socket(1, PROTO_TCP, (ip, 0), None).unwrap();
    match c.bound_socket(true) {
        Some(Err(ControlError::Refused { code, .. })) => assert_eq!(code, ErrorCode::NoPortsLeft),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.unanswered(), 0);
    drop(c);
    multiplexer.join().unwrap();
}

/// Deferred requests (a connection's unbind) are not sent until the next
/// request or a flush, and then go first, in order.
#[test]
fn deferred_requests_go_with_the_next_request_or_a_flush() {
    let (ours, theirs) = SeqPacket::pair().unwrap();
    let (seen, heard) = mpsc::channel();
    let multiplexer = std::thread::spawn(move || {
        fake_multiplexer(theirs, |r| seen.send(r).unwrap());
    });
    let mut c = Client::over(ours).unwrap();
    assert!(matches!(heard.recv().unwrap().0, Request::Hello { .. }));
    assert!(c.deferred_since().is_none());
    c.unbind_async(1).unwrap();
    c.unbind_async(2).unwrap();
    assert!(c.deferred_since().is_some());
    let quiet = heard.recv_timeout(std::time::Duration::from_millis(50));
    assert!(quiet.is_err(), "sent before its time: {quiet:?}");
    c.flush().unwrap();
    assert!(c.deferred_since().is_none());
    let unbind = |channel| (Request::Unbind { channel }, false);
    assert_eq!(heard.recv().unwrap(), unbind(1));
    assert_eq!(heard.recv().unwrap(), unbind(2));
    c.unbind_async(3).unwrap();
    assert_eq!(c.allocate_port(1, PROTO_TCP, 0).unwrap(), 9);
    assert_eq!(heard.recv().unwrap(), unbind(3));
    assert!(matches!(
        heard.recv().unwrap(),
        (Request::AllocatePort { .. }, true)
    ));
    c.unbind_async(4).unwrap();
    c.begin(&Request::Info).unwrap();
    assert_eq!(heard.recv().unwrap(), unbind(4));
    assert_eq!(heard.recv().unwrap(), (Request::Info, true));
    assert!(matches!(c.answer(true), Some(Ok(Reply::Port { port: 9 }))));
    drop(c);
    multiplexer.join().unwrap();
}
