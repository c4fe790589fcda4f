//! The client's requests without a reply: sent in order with the others,
//! and the client does not wait for them (a fake multiplexer here answers
//! only what asks for an answer, so a client that waited would hang).

use exonet_shm::control::{
    Client, ControlError, Reply, Request, SeqPacket, CONTROL_VERSION, MAX_MESSAGE, PROTO_TCP,
};

#[test]
fn unanswered_requests_go_in_order_without_waiting() {
    let (ours, theirs) = SeqPacket::pair().unwrap();
    let multiplexer = std::thread::spawn(move || {
        let mut buf = vec![0; MAX_MESSAGE];
        let mut got = Vec::new();
        loop {
            let (n, _) = theirs.recv(&mut buf).unwrap();
            if n == 0 {
                return got;
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
            got.push((req, answer));
        }
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
