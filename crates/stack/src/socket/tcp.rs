//! [`TcpListener`] and [`TcpStream`], shaped like std's.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::core::Inner;
use super::{v4, Handle, Look, Stack, Wait};
use crate::tcp::{Keepalive, TcpConfig, TcpState, TcpStats};

/// Listeners queue this many connections unless told otherwise (Linux's
/// `SOMAXCONN` before 5.4).
const DEFAULT_BACKLOG: usize = 128;

/// A TCP listener on a [`Stack`]: a channel of its endpoint on its port. Methods
/// are those of `std::net::TcpListener`. The handshake of a connection is done
/// in the library; `accept` takes connections whose handshake completed. At most
/// `backlog` connections wait in each of the SYN queue and the accept queue; SYNs
/// beyond get SYN cookies (RFC 4987 §3.6, [`TcpConfig::syn_cookies`], on by
/// default), which keep no state, or with cookies off are dropped (and counted):
/// a SYN flood costs bounded memory either way.
pub struct TcpListener {
    h: Handle,
}

impl TcpListener {
    /// Listens on `addr` (port 0: an ephemeral port) with the stack's TCP
    /// settings and a backlog of 128.
    pub fn bind(stack: &Stack, addr: impl ToSocketAddrs) -> io::Result<TcpListener> {
        let config = stack.shared().lock().tcp_config();
        TcpListener::bind_with(stack, addr, DEFAULT_BACKLOG, config)
    }

    /// Listens on `addr` with this backlog and these connection settings.
    pub fn bind_with(
        stack: &Stack,
        addr: impl ToSocketAddrs,
        backlog: usize,
        config: TcpConfig,
    ) -> io::Result<TcpListener> {
        let addr = v4(addr)?;
        let id = stack.shared().lock().tcp_listen(addr, backlog, config)?;
        stack.shared().start_keeper();
        Ok(TcpListener {
            h: Handle::from_id(stack, id),
        })
    }

    /// Waits for a connection (as the listener's mode says) and returns it with
    /// the peer's address.
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let wait = self.h.with(|s| Wait::new(s.nonblocking, s.read_timeout));
        let shared = self.h.stack().shared();
        let id = shared.wait_for(wait, |g| g.tcp_accept(self.h.id()))?;
        let stream = TcpStream {
            h: Handle::from_id(self.h.stack(), id),
        };
        let peer = stream.peer_addr()?;
        Ok((stream, peer))
    }

    /// Another handle on the listener, as std's `try_clone`.
    pub fn try_clone(&self) -> io::Result<TcpListener> {
        Ok(TcpListener {
            h: self.h.try_clone()?,
        })
    }

    /// Accepted connections, one by one.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<TcpStream>> + '_ {
        std::iter::repeat_with(|| self.accept().map(|(s, _)| s))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.h.with(|s| s.local).into())
    }

    /// In non-blocking mode, `accept` returns `WouldBlock` when no connection
    /// waits.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.h.set_nonblocking(on)
    }

    /// `accept` gives up after this (exonet's addition; std has none).
    pub fn set_accept_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.h.set_read_timeout(t)
    }

    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(self.h.with(|s| s.error.take()).map(io::Error::from))
    }

    /// The stack this listener is on.
    pub fn stack(&self) -> &Stack {
        self.h.stack()
    }

    pub(crate) fn id(&self) -> usize {
        self.h.id()
    }
}

impl std::fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpListener")
            .field("local", &self.h.with(|s| s.local))
            .finish()
    }
}

/// What [`TcpStream::info`] reports (as Linux's `TCP_INFO`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpInfo {
    pub state: TcpState,
    /// Data bytes per segment sent.
    pub mss: usize,
    pub srtt: Option<Duration>,
    pub rto: Duration,
    /// Congestion window and slow-start threshold, in bytes.
    pub cwnd: u32,
    pub ssthresh: u32,
    /// Bytes queued and not yet acknowledged.
    pub send_queue: usize,
    /// Bytes received and not yet read.
    pub recv_queue: usize,
    pub stats: TcpStats,
}

/// A TCP connection on a [`Stack`]: a channel of its endpoint bound to the
/// connection's addresses. Methods are those of `std::net::TcpStream`; reads and
/// writes go through [`Read`] and [`Write`]. Dropping it closes the connection
/// as the kernel does: queued data and a FIN go out in the background (a RST
/// instead if received data was left unread).
pub struct TcpStream {
    h: Handle,
}

impl TcpStream {
    /// Connects to `addr` with the stack's TCP settings, waiting as long as the
    /// SYN is retried.
    pub fn connect(stack: &Stack, addr: impl ToSocketAddrs) -> io::Result<TcpStream> {
        let config = stack.shared().lock().tcp_config();
        TcpStream::connect_with(stack, addr, None, config)
    }

    /// Connects, giving up after `timeout` with `TimedOut`.
    pub fn connect_timeout(
        stack: &Stack,
        addr: impl ToSocketAddrs,
        timeout: Duration,
    ) -> io::Result<TcpStream> {
        if timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot set a 0 duration timeout",
            ));
        }
        let config = stack.shared().lock().tcp_config();
        TcpStream::connect_with(stack, addr, Some(timeout), config)
    }

    /// Connects with these connection settings and an optional timeout.
    pub fn connect_with(
        stack: &Stack,
        addr: impl ToSocketAddrs,
        timeout: Option<Duration>,
        config: TcpConfig,
    ) -> io::Result<TcpStream> {
        let remote = v4(addr)?;
        let shared = stack.shared();
        let (id, give_up) = {
            let mut g = shared.lock();
            (g.tcp_connect(remote, config)?, g.arp_give_up())
        };
        // Closes (resets) the attempt if it fails.
        let stream = TcpStream {
            h: Handle::from_id(stack, id),
        };
        shared.start_keeper();
        shared.drive()?;
        let started = Instant::now();
        let wait = Wait::new(false, timeout);
        match shared.wait_for(wait, |g| g.tcp_connected(id, started, give_up)) {
            Ok(()) => Ok(stream),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting to {remote} timed out"),
            )),
            Err(e) => Err(e),
        }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.h
            .with(|s| s.peer)
            .map(SocketAddr::V4)
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.h.with(|s| s.local).into())
    }

    /// Another handle on the same connection, as std's `try_clone` (e.g. one
    /// thread reads while another writes); the connection closes when the
    /// last handle drops.
    pub fn try_clone(&self) -> io::Result<TcpStream> {
        Ok(TcpStream {
            h: self.h.try_clone()?,
        })
    }

    /// Shuts the reading half (what arrives is discarded, reads return 0), the
    /// writing half (a FIN follows what is queued) or both.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let (read, write) = match how {
            Shutdown::Read => (true, false),
            Shutdown::Write => (false, true),
            Shutdown::Both => (true, true),
        };
        let shared = self.h.stack().shared();
        shared.lock().tcp_shutdown(self.h.id(), read, write)?;
        shared.drive()?;
        Ok(())
    }

    /// Reads without taking the data off the stream.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_inner(buf, true)
    }

    fn read_inner(&self, buf: &mut [u8], peek: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let shared = self.h.stack().shared();
        let id = self.h.id();
        let wait = |g: &Inner| {
            let s = g.sock(id);
            Wait::new(s.nonblocking, s.read_timeout)
        };
        let mut queued = false;
        let n = shared.wait_with(Look::AfterDriving, wait, |g| {
            let n = g.tcp_read(id, buf, peek);
            queued = g.tx_queued();
            n
        })?;
        // A window update may wait on the ring; nearly always nothing does,
        // and the multiplexer is not run for nothing.
        if queued {
            shared.drive()?;
        }
        Ok(n)
    }

    fn write_inner(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let shared = self.h.stack().shared();
        let id = self.h.id();
        let wait = |g: &Inner| {
            let s = g.sock(id);
            Wait::new(s.nonblocking, s.write_timeout)
        };
        let n = shared.wait_with(Look::AsTheyAre, wait, |g| g.tcp_write(id, buf))?;
        // In process, the segments leave when the multiplexer next runs: now.
        shared.drive()?;
        Ok(n)
    }

    /// TCP_NODELAY: with it, small writes go at once instead of waiting for the
    /// ACK of what is in flight (Nagle's algorithm, RFC 9293 §3.7.4).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.update_conn(|c| c.set_nagle(!on))
    }

    pub fn nodelay(&self) -> io::Result<bool> {
        self.with_conn(|c| !c.nagle())
    }

    /// Keep-alive probing of an idle connection (RFC 1122 §4.2.3.6); `None`
    /// turns it off.
    pub fn set_keepalive(&self, keepalive: Option<Keepalive>) -> io::Result<()> {
        self.update_conn(|c| c.set_keepalive(keepalive))
    }

    pub fn keepalive(&self) -> io::Result<Option<Keepalive>> {
        self.with_conn(|c| c.keepalive())
    }

    super::socket_options!();

    /// The connection's state, timers and counters.
    pub fn info(&self) -> io::Result<TcpInfo> {
        self.with_conn(|c| TcpInfo {
            state: c.state(),
            mss: c.send_mss(),
            srtt: c.srtt(),
            rto: c.rto(),
            cwnd: c.cwnd(),
            ssthresh: c.ssthresh(),
            send_queue: c.send_queue_len(),
            recv_queue: c.recv_queue_len(),
            stats: c.stats().clone(),
        })
    }

    /// The stack this stream is on.
    pub fn stack(&self) -> &Stack {
        self.h.stack()
    }

    pub(crate) fn id(&self) -> usize {
        self.h.id()
    }

    /// Changes the connection, then lets it act on the change at once (a
    /// timer to arm, data Nagle held back).
    fn update_conn(&self, f: impl FnOnce(&mut crate::tcp::Connection)) -> io::Result<()> {
        let shared = self.h.stack().shared();
        {
            let mut g = shared.lock();
            let c = g.conn_mut(self.h.id()).ok_or(io::ErrorKind::NotConnected)?;
            f(&mut c.conn);
            g.tcp_touch(self.h.id());
        }
        shared.drive()?;
        Ok(())
    }

    fn with_conn<R>(&self, f: impl FnOnce(&mut crate::tcp::Connection) -> R) -> io::Result<R> {
        let mut g = self.h.stack().shared().lock();
        let c = g.conn_mut(self.h.id()).ok_or(io::ErrorKind::NotConnected)?;
        Ok(f(&mut c.conn))
    }
}

impl Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_inner(buf, false)
    }
}

impl Read for &TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_inner(buf, false)
    }
}

impl Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_inner(buf)
    }

    /// Data is on its way once written, as with std's sockets.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_inner(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (local, peer) = self.h.with(|s| (s.local, s.peer));
        f.debug_struct("TcpStream")
            .field("local", &local)
            .field("peer", &peer)
            .finish()
    }
}
