//! `exonet`'s side of a `udp` measurement: an exonet UDP socket on an
//! endpoint of the daemon at the given control socket, blocking: sleeping
//! at once while it waits (the library's default), or spinning for
//! [`BUSY_POLL`] first.

use std::io::ErrorKind;
use std::net::SocketAddrV4;
use std::path::Path;
use std::time::Duration;

use exonet_stack::{Stack, StackConfig, UdpSocket};

use super::node::Datagrams;
use crate::bench::endpoint::error;
use crate::bench::report::Fail;

/// How long a busy socket spins before it sleeps: longer than a round
/// trip, so that a ping-pong on an idle machine never sleeps (the part
/// Linux's `SO_BUSY_POLL` plays).
const BUSY_POLL: Duration = Duration::from_micros(200);

pub struct ExonetSocket {
    sock: UdpSocket,
}

impl ExonetSocket {
    pub fn open(
        daemon: &Path,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        busy: bool,
    ) -> Result<ExonetSocket, Fail> {
        let config = StackConfig {
            busy_poll: if busy { BUSY_POLL } else { Duration::ZERO },
            ..StackConfig::default()
        };
        let stack = Stack::open_with(daemon, &config)
            .map_err(error(&format!("exonet stack at {}", daemon.display())))?;
        let sock = UdpSocket::bind(&stack, local).map_err(error("bind"))?;
        sock.connect(remote).map_err(error("connect"))?;
        Ok(ExonetSocket { sock })
    }
}

/// Not an error here: the timeout passed, or the ICMP "port unreachable"
/// of a datagram sent before the other side was up.
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::ConnectionRefused
    )
}

impl Datagrams for ExonetSocket {
    fn send(&mut self, buf: &[u8]) -> Result<(), Fail> {
        // A refusal is reported once, by the call after the ICMP error came;
        // the datagram itself was not sent.
        for _ in 0..2 {
            match self.sock.send(buf) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(error("send")(e)),
            }
        }
        Err(Fail::Error("send: refused twice".into()))
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Fail> {
        match self.sock.recv(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if transient(&e) => Ok(None),
            Err(e) => Err(error("recv")(e)),
        }
    }

    fn set_timeout(&mut self, limit: Duration) -> Result<(), Fail> {
        self.sock
            .set_read_timeout(Some(limit))
            .map_err(error("read timeout"))
    }
}
