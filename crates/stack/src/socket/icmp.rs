//! [`IcmpSocket`]: ICMP echo from an application, like Linux's unprivileged ping
//! sockets (`socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)`): the identifier is the
//! socket's "port", given by the registry, and the socket sees only replies to it.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use super::core::Kind;
use super::{Handle, Stack};

/// An echo reply as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Echo {
    /// Who answered.
    pub from: Ipv4Addr,
    /// The sequence number.
    pub seq: u16,
    /// Data bytes copied into the caller's buffer.
    pub len: usize,
}

/// An ICMP echo socket on a [`Stack`].
pub struct IcmpSocket {
    h: Handle,
}

impl IcmpSocket {
    /// Binds echo identifier `ident` (0: one the registry picks).
    pub fn bind(stack: &Stack, ident: u16) -> io::Result<IcmpSocket> {
        let local = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, ident);
        Ok(IcmpSocket {
            h: Handle::open(stack, Kind::Echo, local)?,
        })
    }

    /// The echo identifier.
    pub fn ident(&self) -> u16 {
        self.h
            .stack()
            .shared()
            .lock()
            .sock(self.h.id())
            .local
            .port()
    }

    /// Sends an echo request to `dst`. Data larger than the MTU allows is sent in
    /// fragments.
    pub fn send_echo(&self, dst: Ipv4Addr, seq: u16, data: &[u8]) -> io::Result<()> {
        self.h.stack().shared().send(self.h.id(), dst, |g| {
            g.send_echo(self.h.id(), dst, seq, data)
        })
    }

    /// Receives the next echo reply, its data copied into `buf` (truncated to it).
    pub fn recv_echo(&self, buf: &mut [u8]) -> io::Result<Echo> {
        let len = buf.len();
        self.h.wait_readable(|g, id| {
            g.take(id, true, |bytes, from, seq| {
                let n = bytes.len().min(len);
                buf[..n].copy_from_slice(&bytes[..n]);
                let echo = Echo {
                    from: *from.ip(),
                    seq,
                    len: n,
                };
                (echo, 0, 0)
            })
        })
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.h.set_read_timeout(t)
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.h.set_write_timeout(t)
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.h.set_nonblocking(on)
    }

    /// The stack this socket is on.
    pub fn stack(&self) -> &Stack {
        self.h.stack()
    }

    pub(crate) fn id(&self) -> usize {
        self.h.id()
    }
}
