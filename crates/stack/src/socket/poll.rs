//! [`Poll`]: readiness over many sockets of one [`Stack`], in the shape of
//! `epoll` and mio (register with a token and an interest, then wait for events).
//! Readiness is level-triggered: a readable socket is reported until its queue is
//! empty.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use super::core::TcpSock;
use super::icmp::IcmpSocket;
use super::tcp::{TcpListener, TcpStream};
use super::udp::UdpSocket;
use super::{Stack, Wait};

/// Names a registered socket in events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub usize);

/// What to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    readable: bool,
    writable: bool,
}

impl Interest {
    pub const READABLE: Interest = Interest {
        readable: true,
        writable: false,
    };
    pub const WRITABLE: Interest = Interest {
        readable: false,
        writable: true,
    };

    /// Both.
    pub const fn add(self, other: Interest) -> Interest {
        Interest {
            readable: self.readable || other.readable,
            writable: self.writable || other.writable,
        }
    }
}

/// One ready socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub token: Token,
    /// A datagram (or a pending error) is waiting.
    pub readable: bool,
    /// A send would not wait for buffers.
    pub writable: bool,
    /// A pending error (from ICMP) is waiting; the next call returns it.
    pub error: bool,
}

/// The events of one [`Poll::poll`].
#[derive(Debug, Default)]
pub struct Events {
    list: Vec<Event>,
}

impl Events {
    pub fn new() -> Events {
        Events::default()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Event> {
        self.list.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }
}

/// Sockets that can be registered with a [`Poll`].
pub trait Source {
    #[doc(hidden)]
    fn socket_id(&self) -> (usize, &Stack);
}

impl Source for UdpSocket {
    fn socket_id(&self) -> (usize, &Stack) {
        (self.id(), self.stack())
    }
}

impl Source for TcpStream {
    fn socket_id(&self) -> (usize, &Stack) {
        (self.id(), self.stack())
    }
}

impl Source for TcpListener {
    fn socket_id(&self) -> (usize, &Stack) {
        (self.id(), self.stack())
    }
}

impl Source for IcmpSocket {
    fn socket_id(&self) -> (usize, &Stack) {
        (self.id(), self.stack())
    }
}

/// Readiness over the sockets of one stack.
pub struct Poll {
    stack: Stack,
    registered: HashMap<usize, (Token, Interest)>,
}

impl Poll {
    pub fn new(stack: &Stack) -> Poll {
        Poll {
            stack: stack.clone(),
            registered: HashMap::new(),
        }
    }

    /// Registers `s`, or changes its token and interest.
    pub fn register(
        &mut self,
        s: &impl Source,
        token: Token,
        interest: Interest,
    ) -> io::Result<()> {
        let (id, stack) = s.socket_id();
        if !std::sync::Arc::ptr_eq(stack.shared(), self.stack.shared()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the socket belongs to another stack",
            ));
        }
        self.registered.insert(id, (token, interest));
        Ok(())
    }

    pub fn deregister(&mut self, s: &impl Source) -> io::Result<()> {
        let (id, _) = s.socket_id();
        self.registered
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "socket not registered"))
    }

    /// Waits until a registered socket is ready or `timeout` passes (then
    /// `events` is empty); `Some(ZERO)` only looks.
    pub fn poll(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
        events.list.clear();
        let wait = match timeout {
            Some(Duration::ZERO) => Wait::NonBlocking,
            t => Wait::new(false, t),
        };
        let registered = &self.registered;
        let list = &mut events.list;
        let r = self.stack.shared().wait_for(wait, |g| {
            let writable = g.writable();
            for (&id, &(token, interest)) in registered {
                if interest.readable {
                    g.tcp_waits_to_read(id);
                }
                let Some(s) = g.sock_opt(id) else { continue };
                let writable = match s.tcp.as_ref() {
                    Some(TcpSock::Conn(c)) => c.writable(),
                    Some(TcpSock::Listener(_)) => false,
                    None => writable,
                };
                let e = Event {
                    token,
                    readable: interest.readable && s.readable(),
                    writable: interest.writable && writable,
                    error: s.error.is_some(),
                };
                if e.readable || e.writable || e.error {
                    list.push(e);
                }
            }
            (!list.is_empty()).then_some(Ok(()))
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            r => r,
        }
    }
}
