//! [`UdpSocket`], shaped like `std::net::UdpSocket`.

use std::io;
use std::net::{SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::time::Duration;

use super::core::{Kind, SendError, MAX_UDP_PAYLOAD};
use super::{v4, Handle, Stack};
use exonet_shm::control::HandlerSpec;
use exonet_wire::checksum::copy_and_sum;

/// A UDP socket on a [`Stack`]: a channel of its endpoint, bound through the
/// multiplexer's registry. Methods are those of `std::net::UdpSocket`; timeouts and
/// non-blocking mode report `WouldBlock` as std does on Unix. Closing (dropping)
/// unbinds the channel.
///
/// A socket bound to 0.0.0.0 gets the host's first address: the multiplexer binds
/// one address per channel.
pub struct UdpSocket {
    h: Handle,
}

impl UdpSocket {
    /// Binds to `addr` (port 0: an ephemeral port from the registry).
    pub fn bind(stack: &Stack, addr: impl ToSocketAddrs) -> io::Result<UdpSocket> {
        Ok(UdpSocket {
            h: Handle::open(stack, Kind::Udp, v4(addr)?)?,
        })
    }

    /// Another handle on the same socket, as std's `try_clone`; it closes
    /// when the last handle drops.
    pub fn try_clone(&self) -> io::Result<UdpSocket> {
        Ok(UdpSocket {
            h: self.h.try_clone()?,
        })
    }

    /// The stack this socket is on.
    pub fn stack(&self) -> &Stack {
        self.h.stack()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.h.with(|s| s.local).into())
    }

    /// The peer of a connected socket (`NotConnected` otherwise).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.h
            .with(|s| s.peer)
            .map(SocketAddr::V4)
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }

    /// Sends only to `addr` and receives only from it from now on (datagrams from
    /// others are dropped and counted).
    pub fn connect(&self, addr: impl ToSocketAddrs) -> io::Result<()> {
        let addr = v4(addr)?;
        self.h.with(|s| {
            s.peer = Some(addr);
            s.error = None;
        });
        Ok(())
    }

    /// Sends `buf` to the connected peer.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let peer = self.h.with(|s| s.peer).ok_or(io::ErrorKind::NotConnected)?;
        self.send_v4(buf, peer)
    }

    /// Sends `buf` to `addr`.
    pub fn send_to(&self, buf: &[u8], addr: impl ToSocketAddrs) -> io::Result<usize> {
        self.send_v4(buf, v4(addr)?)
    }

    fn send_v4(&self, buf: &[u8], to: SocketAddrV4) -> io::Result<usize> {
        if buf.len() > MAX_UDP_PAYLOAD {
            return Err(too_long(buf.len()));
        }
        self.h
            .stack()
            .shared()
            .send(self.h.id(), *to.ip(), |g| g.send_udp(self.h.id(), to, buf))?;
        Ok(buf.len())
    }

    /// Sends several datagrams to the connected peer in one call, as
    /// `sendmmsg(2)` does: returns how many went, which is all of them unless
    /// the socket is non-blocking (or its write timeout passes) and the send
    /// buffers run out after the first. An in-process multiplexer is driven once
    /// for the whole batch.
    pub fn send_many(&self, bufs: &[&[u8]]) -> io::Result<usize> {
        let shared = self.h.stack().shared();
        let (peer, nonblocking) = {
            let g = shared.lock();
            let s = g.sock(self.h.id());
            (s.peer.ok_or(io::ErrorKind::NotConnected)?, s.nonblocking)
        };
        if let Some(b) = bufs.iter().find(|b| b.len() > MAX_UDP_PAYLOAD) {
            return Err(too_long(b.len()));
        }
        let mut sent = 0;
        let r = shared.send(self.h.id(), *peer.ip(), |g| {
            while let Some(b) = bufs.get(sent) {
                match g.send_udp(self.h.id(), peer, b) {
                    Ok(()) => sent += 1,
                    Err(SendError::Full) if sent > 0 && nonblocking => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        });
        match r {
            Err(_) if sent > 0 => Ok(sent),
            r => r.map(|()| sent),
        }
    }

    /// Receives up to `bufs.len()` datagrams, as `recvmmsg(2)` does: waits for the
    /// first as [`recv_from`](Self::recv_from), then takes those already queued.
    /// Each one's length and sender go to `meta`; returns how many came.
    pub fn recv_many(
        &self,
        bufs: &mut [&mut [u8]],
        meta: &mut [(usize, SocketAddr)],
    ) -> io::Result<usize> {
        let max = bufs.len().min(meta.len());
        if max == 0 {
            return Ok(0);
        }
        let mut got = 0;
        self.h.wait_readable(|g, id| {
            while got < max {
                let buf = &mut *bufs[got];
                let len = buf.len();
                let r = g.take(id, true, |bytes, from, _| copy_out(buf, len, bytes, from));
                match r {
                    Some(m) => {
                        meta[got] = m;
                        got += 1;
                    }
                    None => break,
                }
            }
            (got > 0).then_some(got)
        })
    }

    /// Receives one datagram into `buf` (the rest of a longer one is discarded, as
    /// std does) and returns its length and sender.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.read(buf, true)
    }

    /// As [`recv_from`](Self::recv_from), leaving the datagram queued.
    pub fn peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.read(buf, false)
    }

    /// Receives one datagram (on a connected socket: from the peer).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf, true).map(|(n, _)| n)
    }

    /// As [`recv`](Self::recv), leaving the datagram queued.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf, false).map(|(n, _)| n)
    }

    fn read(&self, buf: &mut [u8], consume: bool) -> io::Result<(usize, SocketAddr)> {
        let len = buf.len();
        self.h.wait_readable(|g, id| {
            g.take(id, consume, |bytes, from, _| {
                copy_out(buf, len, bytes, from)
            })
        })
    }

    /// Receives one datagram and hands its payload to `f` where it lies in the
    /// segment, with no copy at all; the checksum is verified first (one read
    /// pass). `f` runs with the stack locked, so it must not use this stack; the
    /// buffer goes back when it returns.
    pub fn recv_with<R>(&self, f: impl FnOnce(&[u8], SocketAddr) -> R) -> io::Result<R> {
        let mut f = Some(f);
        self.h.wait_readable(|g, id| {
            g.take(id, true, |bytes, from, _| {
                let sum = exonet_wire::checksum::sum(bytes);
                let r = f.take().map(|f| f(bytes, SocketAddr::V4(from)));
                (r, sum, bytes.len())
            })
            .flatten()
        })
    }

    super::socket_options!();

    /// Allows sending to broadcast addresses (`SO_BROADCAST`).
    pub fn set_broadcast(&self, on: bool) -> io::Result<()> {
        self.h.with(|s| s.broadcast = on);
        Ok(())
    }

    pub fn broadcast(&self) -> io::Result<bool> {
        Ok(self.h.with(|s| s.broadcast))
    }

    /// Installs a handler (ASH) on this socket's channel, replacing any it
    /// had: the multiplexer runs it on every datagram for this socket
    /// before delivery, and what it does not consume arrives here as usual.
    /// Its window, if any, is the stack's [`Window`](super::Window)
    /// (`(window.offset(), window.len())`) or a part of it.
    pub fn install_handler(&self, spec: &HandlerSpec) -> io::Result<()> {
        let g = self.h.stack().shared().lock();
        g.set_handler(self.h.id(), Some(spec))
    }

    /// Removes this socket's handler.
    pub fn remove_handler(&self) -> io::Result<()> {
        let g = self.h.stack().shared().lock();
        g.set_handler(self.h.id(), None)
    }

    pub(crate) fn id(&self) -> usize {
        self.h.id()
    }
}

impl std::fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.h.stack().shared().lock();
        let s = g.sock(self.h.id());
        f.debug_struct("UdpSocket")
            .field("local", &s.local)
            .field("peer", &s.peer)
            .field("channel", &s.channel)
            .finish()
    }
}

/// The receive copy: as much of `bytes` as fits the first `len` bytes of
/// `buf`, with the sum of what was copied (the rest is summed by `take`).
fn copy_out(
    buf: &mut [u8],
    len: usize,
    bytes: &[u8],
    from: SocketAddrV4,
) -> ((usize, SocketAddr), u16, usize) {
    let n = bytes.len().min(len);
    let sum = copy_and_sum(&mut buf[..n], &bytes[..n]);
    ((n, SocketAddr::V4(from)), sum, n)
}

fn too_long(len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{len} bytes exceed a UDP datagram's {MAX_UDP_PAYLOAD}"),
    )
}
