//! `exonet`'s side of a `udp` measurement: an exonet UDP socket, blocking,
//! sleeping at once while it waits (the library's default) or spinning for
//! [`BUSY_POLL`] first. Its endpoint is served by the daemon at a control
//! socket, or by a multiplexer in this process on a link of its own
//! (`exonet-inproc`), which the socket's calls drive.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::time::{Duration, Instant};

use exonet_mux::{InProcess, Mux, MuxConfig};
use exonet_stack::{Stack, StackConfig, UdpSocket};

use super::node::{Datagrams, BATCH, MAX_DATAGRAM};
use super::rig;
use crate::bench::endpoint::error;
use crate::bench::endpoint::peer::PATIENCE;
use crate::bench::report::Fail;

/// How long a busy socket spins before it sleeps: longer than a round
/// trip, so that a ping-pong on an idle machine never sleeps (the part
/// Linux's `SO_BUSY_POLL` plays).
const BUSY_POLL: Duration = Duration::from_micros(200);

/// Who serves the socket's endpoint.
#[derive(Clone, Copy)]
pub enum Serve<'a> {
    /// The daemon at this control socket.
    Daemon(&'a Path),
    /// A multiplexer of our own on this link (as `exonet daemon --link`).
    Link(&'a str),
}

impl<'a> Serve<'a> {
    /// From a node's `--socket` and `--link`: exactly one of them.
    pub fn of(socket: Option<&'a Path>, link: Option<&'a str>) -> Result<Serve<'a>, Fail> {
        match (socket, link) {
            (Some(path), None) => Ok(Serve::Daemon(path)),
            (None, Some(link)) => Ok(Serve::Link(link)),
            _ => Err(Fail::Error(
                "exonet needs --socket or --link (not both)".into(),
            )),
        }
    }
}

pub struct ExonetSocket {
    sock: UdpSocket,
    /// recv_many's buffers.
    bufs: Vec<[u8; MAX_DATAGRAM]>,
}

impl ExonetSocket {
    pub fn open(
        serve: Serve,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        busy: bool,
    ) -> Result<ExonetSocket, Fail> {
        let stack = open_stack(serve, *local.ip(), busy)?;
        let sock = UdpSocket::bind(&stack, local).map_err(error("bind"))?;
        sock.connect(remote).map_err(error("connect"))?;
        // A send that cannot get a buffer fails, as a lost wake-up would
        // otherwise hang it.
        sock.set_write_timeout(Some(PATIENCE))
            .map_err(error("write timeout"))?;
        Ok(ExonetSocket {
            sock,
            bufs: vec![[0; MAX_DATAGRAM]; BATCH],
        })
    }
}

/// An exonet stack on `ip`, served as `serve` says, spinning [`BUSY_POLL`]
/// before it sleeps if `busy`.
pub fn open_stack(serve: Serve, ip: Ipv4Addr, busy: bool) -> Result<Stack, Fail> {
    open_stack_with(serve, ip, stack_config(busy))
}

/// A stack's configuration, busy-polling or not.
pub fn stack_config(busy: bool) -> StackConfig {
    StackConfig {
        busy_poll: if busy { BUSY_POLL } else { Duration::ZERO },
        ..StackConfig::default()
    }
}

/// An exonet stack on `ip` with this configuration.
pub fn open_stack_with(serve: Serve, ip: Ipv4Addr, config: StackConfig) -> Result<Stack, Fail> {
    match serve {
        Serve::Daemon(path) => Stack::open_with(path, &config)
            .map_err(error(&format!("exonet stack at {}", path.display()))),
        Serve::Link(spec) => {
            // No control socket: only a memwire's rendezvous would use it.
            let link = rig::while_busy(|| {
                crate::daemon::open_link(spec, &[ip], Path::new("")).map_err(Fail::Error)
            })?;
            let mux = Mux::new(link, vec![ip], MuxConfig::default());
            Stack::over(Box::new(InProcess::new(mux, vec![(ip, 24)])), &config)
                .map_err(error("exonet stack in process"))
        }
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
        // the datagram itself was not sent. A peer still starting may not
        // answer ARP yet (in process, its multiplexer runs only once its
        // socket waits).
        // Refusals of earlier probes may still be on their way in while the
        // peer starts: each is reported once, so go on for a while.
        let start = Instant::now();
        loop {
            match self.sock.send(buf) {
                Ok(_) => return Ok(()),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionRefused | ErrorKind::HostUnreachable
                    ) && start.elapsed() < PATIENCE => {}
                Err(e) => return Err(error("send")(e)),
            }
        }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Fail> {
        match self.sock.recv(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if transient(&e) => Ok(None),
            Err(e) => Err(error("recv")(e)),
        }
    }

    /// `send_many`, the counterpart of Linux's `sendmmsg`.
    fn send_batch(&mut self, buf: &[u8], n: usize) -> Result<(), Fail> {
        let bufs = vec![buf; n];
        let mut done = 0;
        while done < n {
            match self.sock.send_many(&bufs[done..]) {
                Ok(k) => done += k,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(error("send_many")(e)),
            }
        }
        Ok(())
    }

    /// `recv_many`, the counterpart of Linux's `recvmmsg`.
    fn recv_batch(&mut self, _buf: &mut [u8]) -> Result<(usize, usize), Fail> {
        let mut bufs: Vec<&mut [u8]> = self.bufs.iter_mut().map(|b| &mut b[..]).collect();
        let mut meta = [(0, SocketAddr::from(([0, 0, 0, 0], 0))); BATCH];
        match self.sock.recv_many(&mut bufs, &mut meta) {
            Ok(k) => Ok((k, meta[..k].iter().map(|m| m.0).sum())),
            Err(e) if transient(&e) => Ok((0, 0)),
            Err(e) => Err(error("recv_many")(e)),
        }
    }

    fn set_timeout(&mut self, limit: Duration) -> Result<(), Fail> {
        self.sock
            .set_read_timeout(Some(limit))
            .map_err(error("read timeout"))
    }
}
