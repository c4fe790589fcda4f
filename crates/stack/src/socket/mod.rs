//! Sockets: the protocol cores of this crate run over an endpoint of the
//! multiplexer, as a library linked into the application (Thekkath §III, U-Net §7).
//!
//! A [`Stack`] is one endpoint and its control connection; every socket made on it
//! is a channel of that endpoint, bound through the multiplexer's registry. Any
//! thread that needs data moves the endpoint's rings forward ("pumps") and sorts
//! what arrived into the sockets' queues by channel. Datagrams stay in the segment
//! buffers the multiplexer wrote them into until the application reads them: the
//! read is the one copy, and the UDP checksum is verified in that copy. A TCP
//! connection's send buffer is lent a slot of the segment's send area
//! ([`StackConfig::tcp_send_area`]): its segments go on the tx ring as chains,
//! the headers inline and the data named where it lies, and the multiplexer
//! reads it in place; a byte stays put until the chain that named it completes.
//!
//! Blocking follows the endpoint's sleep protocol: a thread spins for
//! [`StackConfig::busy_poll`], then one thread sleeps on the endpoint's doorbell and
//! wakes the others after each pump.

mod core;
mod icmp;
mod multiplexer;
mod poll;
mod tcp;
mod udp;
mod window;

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::os::fd::{BorrowedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use exonet_shm::control::{default_socket_path, Client, ControlError, HostInfo};
use exonet_shm::{Sleeper, Wakeup};

use crate::arp::ArpConfig;
use crate::reasm::ReasmConfig;
use crate::tcp::TcpConfig;
use crate::time::{earlier, Time};

pub use self::core::{SocketStats, StackStats, TcpSocketStats, TxStats};
pub use icmp::{Echo, IcmpSocket};
pub use multiplexer::Multiplexer;
pub use poll::{Event, Events, Interest, Poll, Token};
pub use tcp::{TcpInfo, TcpListener, TcpStream};
pub use udp::UdpSocket;
pub use window::Window;

use self::core::{lock, Inner, SendError};

/// How a [`Stack`] is set up.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// Frame buffers in the segment (2 KiB each); half receive, half send.
    pub frames: u32,
    /// How long a blocked call spins on the rings before it sleeps (as Linux's
    /// `SO_BUSY_POLL`); zero sleeps at once. After its first 10 µs the spin
    /// yields the CPU between rounds to any other thread that wants it.
    pub busy_poll: Duration,
    /// Largest IP datagram to send unfragmented; `None`: the link's MTU.
    pub mtu: Option<usize>,
    /// Datagrams a socket holds before it drops (its receive buffer).
    pub socket_queue: usize,
    /// Reassembly limits.
    pub reasm: ReasmConfig,
    /// Neighbour cache timing.
    pub arp: ArpConfig,
    /// What TCP connections are opened with (the MSS is cut to the path MTU).
    pub tcp: TcpConfig,
    /// How long connections the application closed get to deliver their data
    /// and FIN when the stack goes away (afterwards the multiplexer resets them).
    pub linger: Duration,
    /// Bytes of the segment set aside as the application's [`Window`]: the
    /// memory its handlers (ASH) may read and write. Rounded up to whole
    /// frame buffers, which are kept off the free ring; at most
    /// [`MAX_WINDOW`].
    pub window: usize,
    /// Bytes of the segment set aside for TCP send buffers (whole frame
    /// buffers kept off the free ring), lent to connections in slots of
    /// [`TcpConfig::send_buffer`](crate::tcp::TcpConfig::send_buffer) bytes:
    /// their segments name the data there and the multiplexer reads it in
    /// place, so neither sending nor retransmitting copies it. Connections
    /// beyond the slots, or with larger send buffers, keep theirs in the heap
    /// and copy. At most [`MAX_WINDOW`].
    pub tcp_send_area: usize,
    /// How long a connection accepted through a daemon stays on its
    /// listener's channel before it asks for its own. Most short ones (a
    /// request and an answer) end before: they never cost a bind, an unbind
    /// and a filter of their own, and the daemon follows them on the
    /// listener's channel. Connections a second through two daemons rose by
    /// a median 14% (5 interleaved pairs) with 5 ms. In process, a bind is a
    /// call: made at once.
    pub lazy_bind: Duration,
    /// Ask a daemon for a direct send port
    /// ([`Multiplexer::open_direct`](multiplexer::Multiplexer::open_direct)),
    /// and write to it the short segments of connections that have their
    /// own channels (not SYNs, FINs or RSTs) while the tx ring is empty: a
    /// round trip then waits for no hand-off to the daemon. Bulk stays on
    /// the ring, where the daemon sends it from its own CPU.
    pub direct: bool,
}

/// The largest [`StackConfig::window`].
pub const MAX_WINDOW: usize = 64 << 20;

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            frames: 1024,
            busy_poll: Duration::ZERO,
            mtu: None,
            socket_queue: 256,
            reasm: ReasmConfig::default(),
            arp: ArpConfig::default(),
            tcp: TcpConfig {
                // Linux's floor (TCP_RTO_MIN); RFC 6298's 1 s suits paths of
                // unknown delay, not a LAN.
                min_rto: Duration::from_millis(200),
                recv_buffer: 256 * 1024,
                // A short delay (RFC 9293 §3.8.6.3; every second segment is
                // still acknowledged at once): an answer the application
                // writes at once carries the ACK, instead of a frame of its
                // own before it. U-Net §7.8's objection was to BSD's 200 ms.
                delayed_ack: Some(Duration::from_millis(1)),
                // As Linux's: a bulk receiver over veth sent 1 ACK per 2.1
                // segments against Linux's 1 per 7.3, each a frame through
                // both multiplexers and the sender's stack.
                ack_on_read: true,
                // The request a client writes after connecting carries the
                // handshake's ACK: through two daemons, connections a second
                // went from 9,100 to 10,900 (4 interleaved pairs).
                hold_handshake_ack: true,
                // A peer of these sockets whose application is away from its
                // stack has its delayed ACKs sent by the keeper, at its next
                // tick: a lone segment's probe that waited only for the 1 ms
                // bound was sent again for every answer that took the
                // application 2-10 ms.
                peer_ack_delay: Some(2 * KEEPER_TICK),
                ..TcpConfig::default()
            },
            linger: Duration::from_secs(2),
            window: 0,
            // 16 connections' worth of the default send buffer.
            tcp_send_area: 4 << 20,
            lazy_bind: Duration::from_millis(5),
            direct: true,
        }
    }
}

/// One endpoint of the multiplexer with the protocol library on it; cheap to clone
/// (all clones are the same endpoint). Sockets keep it alive.
#[derive(Clone)]
pub struct Stack {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    inner: Mutex<Inner>,
    /// Threads waiting while another sleeps on the doorbell.
    woken: Condvar,
    wake: Sleeper,
    /// The same multiplexer as `Inner::mux`, to drive it without `inner`'s lock.
    mux: Arc<Mutex<Box<dyn Multiplexer>>>,
    in_process: bool,
    /// Polled with the doorbell to notice the multiplexer go.
    hangup: Option<RawFd>,
    busy_poll: Duration,
    /// The keeper thread runs (see [`Shared::start_keeper`]).
    keeper: AtomicBool,
    /// Threads in [`Shared::wait_for`]: they pump (or sleep until their frames
    /// or timers), so the keeper keeps off the lock.
    waiting: AtomicUsize,
}

/// Counts a thread in [`Shared::wait_for`] while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(n: &'a AtomicUsize) -> Waiting<'a> {
        n.fetch_add(1, Ordering::Relaxed);
        Waiting(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How often the keeper looks at a stack no application thread is in.
const KEEPER_TICK: Duration = Duration::from_millis(5);
/// How long a busy poll spins before it yields the CPU between rounds.
const YIELD_AFTER: Duration = Duration::from_micros(10);

impl Stack {
    /// Connects to the multiplexer at `socket` (see `exonet daemon`) and creates an
    /// endpoint with the default configuration.
    pub fn open(socket: &Path) -> io::Result<Stack> {
        Stack::open_with(socket, &StackConfig::default())
    }

    /// Connects to the multiplexer at the default socket path.
    pub fn open_default() -> io::Result<Stack> {
        Stack::open(&default_socket_path())
    }

    /// Connects to the multiplexer at `socket` and creates an endpoint.
    pub fn open_with(socket: &Path, config: &StackConfig) -> io::Result<Stack> {
        let client = Client::connect(socket)?;
        Stack::over(Box::new(client), config)
    }

    /// A stack on an endpoint of `mux`: a daemon's [`Client`], or a multiplexer
    /// in this process.
    pub fn over(mut mux: Box<dyn Multiplexer>, config: &StackConfig) -> io::Result<Stack> {
        let info = mux.info()?;
        if info.addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                "the multiplexer's host has no IPv4 address",
            ));
        }
        let (hangup, in_process) = (mux.hangup_fd(), mux.in_process());
        let mux = Arc::new(Mutex::new(mux));
        let (inner, wake) = Inner::new(mux.clone(), info, config)?;
        Ok(Stack {
            shared: Arc::new(Shared {
                inner: Mutex::new(inner),
                woken: Condvar::new(),
                wake,
                mux,
                in_process,
                hangup,
                busy_poll: config.busy_poll,
                keeper: AtomicBool::new(false),
                waiting: AtomicUsize::new(0),
            }),
        })
    }

    /// The host's first address (what a socket bound to 0.0.0.0 gets).
    pub fn local_addr(&self) -> Ipv4Addr {
        self.shared.lock().info.addrs[0].0
    }

    /// The host as the multiplexer describes it.
    pub fn info(&self) -> HostInfo {
        self.shared.lock().info.clone()
    }

    /// The endpoint's id at the multiplexer.
    pub fn endpoint(&self) -> u32 {
        self.shared.lock().endpoint
    }

    /// The library's counters for this endpoint.
    pub fn stats(&self) -> StackStats {
        self.shared.lock().stats()
    }

    /// The part of the segment set aside for handlers
    /// ([`StackConfig::window`]), if any.
    pub fn window(&self) -> Option<Window> {
        self.shared.lock().window.clone()
    }

    /// Moves the rings forward and runs due timers without waiting (an event loop
    /// that polls other things calls this, or uses [`Poll`]).
    pub fn pump(&self) -> io::Result<()> {
        self.shared.drive()?;
        let mut g = self.shared.lock();
        let now = g.now();
        g.pump(now);
        Ok(())
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

/// The options every stream and datagram socket has, as std's sockets have
/// them: timeouts (`WouldBlock` after them, as std on Unix), non-blocking mode,
/// the pending error and the TTL. For a type whose [`Handle`] is its field `h`.
macro_rules! socket_options {
    () => {
        pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
            self.h.set_read_timeout(t)
        }

        pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
            self.h.set_write_timeout(t)
        }

        pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
            Ok(self.h.with(|s| s.read_timeout))
        }

        pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
            Ok(self.h.with(|s| s.write_timeout))
        }

        /// In non-blocking mode, calls that would wait return `WouldBlock`.
        pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
            self.h.set_nonblocking(on)
        }

        /// The pending asynchronous error (an ICMP error for a connected
        /// datagram socket; a reset or timeout for a stream), cleared.
        pub fn take_error(&self) -> io::Result<Option<io::Error>> {
            Ok(self.h.with(|s| s.error.take()).map(io::Error::from))
        }

        /// The TTL of the IP datagrams sent (1..=255).
        pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
            let ttl = u8::try_from(ttl).ok().filter(|t| *t > 0).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "TTL must be 1..=255")
            })?;
            self.h.with(|s| s.ttl = ttl);
            Ok(())
        }

        pub fn ttl(&self) -> io::Result<u32> {
            Ok(self.h.with(|s| s.ttl).into())
        }
    };
}
pub(crate) use socket_options;

/// What every kind of socket is: a socket of a stack, with the options all
/// kinds share. Dropping it closes the socket (its channel is unbound).
pub(crate) struct Handle {
    stack: Stack,
    id: usize,
}

impl Handle {
    /// Binds a channel of `kind` at `local` on `stack`.
    pub(crate) fn open(
        stack: &Stack,
        kind: self::core::Kind,
        local: SocketAddrV4,
    ) -> io::Result<Handle> {
        let id = stack.shared().lock().open(kind, local)?;
        Ok(Handle::from_id(stack, id))
    }

    /// Takes charge of socket `id` of `stack`.
    pub(crate) fn from_id(stack: &Stack, id: usize) -> Handle {
        Handle {
            stack: stack.clone(),
            id,
        }
    }

    pub(crate) fn stack(&self) -> &Stack {
        &self.stack
    }

    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// Runs `f` on the socket's state, under the stack's lock.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut self::core::Sock) -> R) -> R {
        f(self.stack.shared().lock().sock_mut(self.id))
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.with(|s| s.read_timeout = t);
        Ok(())
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.with(|s| s.write_timeout = t);
        Ok(())
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.with(|s| s.nonblocking = on);
        Ok(())
    }

    /// Waits (as the socket's mode and read timeout say) until `take` gets
    /// something from the socket's queue; a pending error comes first.
    pub(crate) fn wait_readable<R>(
        &self,
        mut take: impl FnMut(&mut Inner, usize) -> Option<R>,
    ) -> io::Result<R> {
        let shared = self.stack.shared();
        let wait = self.with(|s| Wait::new(s.nonblocking, s.read_timeout));
        shared.wait_for(wait, |g| {
            if let Some(e) = g.sock_mut(self.id).error.take() {
                return Some(Err(e.into()));
            }
            take(g, self.id).map(Ok)
        })
    }
}

impl Handle {
    /// Another handle on the same socket (std's `try_clone`): the socket
    /// closes when the last one drops.
    pub(crate) fn try_clone(&self) -> io::Result<Handle> {
        self.with(|s| s.handles += 1);
        Ok(Handle::from_id(&self.stack, self.id))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let shared = self.stack.shared();
        let mut g = shared.lock();
        let s = g.sock_mut(self.id);
        s.handles -= 1;
        if s.handles == 0 {
            // What has arrived is taken in first, as a kernel's softirq would
            // have: a FIN the peer sent is then acknowledged by our FIN
            // (LAST-ACK), one segment, instead of crossing it (a simultaneous
            // close: an ACK more, and TIME-WAIT at both ends).
            drop(g);
            let _ = shared.drive();
            g = shared.lock();
            let now = g.now();
            let id = self.id;
            g.pump_with(now, |g| g.close(id));
        }
    }
}

/// std refuses a zero timeout the same way.
fn check_timeout(t: Option<Duration>) -> io::Result<()> {
    if t == Some(Duration::ZERO) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot set a 0 duration timeout",
        ));
    }
    Ok(())
}

/// What a blocking call's first look at the stack follows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// A run of an in-process multiplexer: what it has for the stack is
    /// seen at once (a read's data).
    AfterDriving,
    /// The rings as they are: a call that can nearly always go ahead (a
    /// write with room) spares the multiplexer's run; it runs if the call
    /// has to wait.
    AsTheyAre,
}

/// When a blocking call gives up.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// Return `WouldBlock` at once.
    NonBlocking,
    /// For this long from the call's first look (`WouldBlock` after, as
    /// std's sockets on Unix); that look's clock read starts it, so a call
    /// that need not wait reads the clock once.
    Within(Duration),
    Forever,
}

impl Wait {
    pub(crate) fn new(nonblocking: bool, timeout: Option<Duration>) -> Wait {
        match (nonblocking, timeout) {
            (true, _) => Wait::NonBlocking,
            (false, Some(t)) => Wait::Within(t),
            (false, None) => Wait::Forever,
        }
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Starts the keeper: a thread that moves the stack forward while no
    /// application thread is in it, so that TCP completes handshakes, answers,
    /// retransmits and closes while the application computes (a kernel would),
    /// and an in-process multiplexer answers ARP. It stays out of the way of
    /// application threads: it acts only when nobody has pumped for a tick, and
    /// it ends with the stack.
    pub(crate) fn start_keeper(self: &Arc<Self>) {
        if self.keeper.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("exonet-keeper".into())
            .spawn(move || keep(weak));
        if spawned.is_err() {
            self.keeper.store(false, Ordering::Release);
        }
    }

    /// One look of the keeper.
    fn keep_once(&self) {
        // Not even a try of the lock while an application thread waits in the
        // stack: a busy-polling one would stall on it now and then.
        if self.waiting.load(Ordering::Relaxed) > 0 {
            return;
        }
        let Ok(g) = self.inner.try_lock() else {
            return;
        };
        let now = g.now();
        // After a tick without a pump, or once a timer is due (a delayed ACK
        // due now goes at this tick, not the next).
        let idle = !g.sleeping
            && g.followers == 0
            && (now.saturating_duration_since(g.clock) >= KEEPER_TICK
                || g.next_deadline().is_some_and(|t| t <= now));
        drop(g);
        if idle {
            let _ = self.drive();
            let mut g = self.lock();
            let now = g.now();
            g.pump(now);
        }
    }

    /// Runs an in-process multiplexer once, unless another thread is at it.
    pub(crate) fn drive(&self) -> io::Result<usize> {
        if !self.in_process {
            return Ok(0);
        }
        match self.mux.try_lock() {
            Ok(mut m) => m.drive(),
            Err(_) => Ok(0),
        }
    }

    /// Pumps and asks `ready` until it answers, waiting as `wait` says.
    pub(crate) fn wait_for<T>(
        &self,
        wait: Wait,
        ready: impl FnMut(&mut Inner) -> Option<io::Result<T>>,
    ) -> io::Result<T> {
        self.wait_with(Look::AfterDriving, |_| wait, ready)
    }

    /// [`Shared::wait_for`] with the wait told by the stack's state (a
    /// socket's mode and timeout), asked only if the call has to wait, and
    /// the first look taken as `look` says.
    pub(crate) fn wait_with<T>(
        &self,
        look: Look,
        wait: impl FnOnce(&Inner) -> Wait,
        mut ready: impl FnMut(&mut Inner) -> Option<io::Result<T>>,
    ) -> io::Result<T> {
        let _waiting = Waiting::enter(&self.waiting);
        if look == Look::AfterDriving {
            self.drive()?;
        }
        let mut g = self.lock();
        let mut wait = Some(wait);
        // Set by the first round's clock read, when the call has to wait.
        let mut limits: Option<(Wait, Option<Time>, Time, Time)> = None;
        loop {
            // One clock read per round, the cores' time.
            let now = g.now();
            g.pump(now);
            if let Some(r) = ready(&mut g) {
                return r;
            }
            if let Some(how) = wait.take() {
                let how = how(&g);
                let until = match how {
                    Wait::Within(d) => Some(now + d),
                    _ => None,
                };
                limits = Some((how, until, now + self.busy_poll, now + YIELD_AFTER));
            }
            let (wait, until, spin_until, yield_from) = limits.expect("set in the first round");
            let until = match wait {
                Wait::NonBlocking => return Err(io::ErrorKind::WouldBlock.into()),
                Wait::Within(_) if until.is_some_and(|d| now >= d) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "timed out (the socket's timeout passed)",
                    ))
                }
                Wait::Within(_) => until,
                Wait::Forever => None,
            };
            if now < spin_until {
                drop(g);
                if self.drive()? == 0 {
                    // A spin that never yields holds the CPU for its whole
                    // length from whoever else waits for it (the peer, on a
                    // shared CPU); past YIELD_AFTER the answer is not
                    // imminent, and each round yields.
                    if now >= yield_from {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                g = self.lock();
                continue;
            }
            // Sleep no longer than the library's own next timer.
            g.tcp_settle_timers();
            let until = earlier(until, g.next_deadline());
            let timeout = until.map(|u| u.saturating_duration_since(now));
            if g.sleeping {
                // Another thread sleeps on the doorbell and wakes us after it pumps;
                // the cap covers its leaving without data for us. A send of ours
                // that waits for the multiplexer to take frames needs the
                // sleeper woken for that too.
                // Its frames may have been taken just before the clear, with
                // no signal: a look at the rings comes first.
                if g.tx_blocked() && !self.in_process && self.wake.set_rx_only(false) {
                    continue;
                }
                let cap = Duration::from_millis(10);
                let d = timeout.map_or(cap, |x| x.min(cap));
                g.followers += 1;
                g = self
                    .woken
                    .wait_timeout(g, d)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                g.followers -= 1;
                continue;
            }
            g.sleeping = true;
            let rx_only = !g.tx_blocked();
            drop(g);
            let slept = if self.in_process {
                // Nobody else moves the frames: sleep on the link and the
                // endpoints (a send of another thread kicks), then drive.
                // Frames the pump just queued (ACKs, a SYN-ACK) end the sleep
                // at once: the multiplexer does not sleep on a pending ring.
                let cap = Duration::from_millis(100);
                let mut m = lock(&self.mux);
                m.sleep(timeout.map_or(cap, |t| t.min(cap)))
                    .and_then(|()| m.drive().map(drop))
            } else {
                // Nothing waits for room on the tx ring or for buffers: the
                // multiplexer taking our frames need not wake us (a request's
                // completion would wake us before its answer).
                let _ = self.wake.set_rx_only(rx_only);
                self.sleep(timeout)
            };
            g = self.lock();
            g.sleeping = false;
            if g.followers > 0 {
                self.woken.notify_all();
            }
            slept?;
        }
    }

    /// Runs a send of socket `id` to `dst`, waiting for buffers (and, for a
    /// blocking socket, for the neighbour to resolve) as the socket's mode and
    /// write timeout say. A pending error is returned first, as the kernel does.
    pub(crate) fn send(
        &self,
        id: usize,
        dst: Ipv4Addr,
        mut send: impl FnMut(&mut Inner) -> Result<(), SendError>,
    ) -> io::Result<()> {
        let (wait, give_up) = {
            let mut g = self.lock();
            if let Some(e) = g.sock_mut(id).error.take() {
                return Err(e.into());
            }
            let s = g.sock(id);
            (Wait::new(s.nonblocking, s.write_timeout), g.arp_give_up())
        };
        // From the first answer that the neighbour is unresolved, not per
        // try: a UDP sender retrying for buffers (1472-byte datagrams through
        // a daemon) spent a seventh of its samples reading the clock, here
        // and in the pump.
        let mut started = None;
        let sent = self.wait_for(wait, |g| match send(g) {
            Ok(()) => Some(Ok(())),
            Err(SendError::Full) => None,
            Err(SendError::Unresolved)
                if started.get_or_insert_with(Instant::now).elapsed() < give_up =>
            {
                None
            }
            Err(SendError::Unresolved) => Some(Err(io::Error::new(
                io::ErrorKind::HostUnreachable,
                format!("{dst} did not answer ARP"),
            ))),
            Err(SendError::Fatal(e)) => Some(Err(e)),
        });
        // In process, the frame leaves when the multiplexer next runs: now.
        if sent.is_ok() {
            self.drive()?;
        }
        sent
    }

    /// One sleep on the doorbell, by the endpoint's protocol: flag, re-check,
    /// block, clear. Also wakes if the multiplexer goes away.
    fn sleep(&self, timeout: Option<Duration>) -> io::Result<()> {
        // SAFETY: the hang-up descriptor belongs to the multiplexer handle,
        // which this `Shared` keeps alive longer than the borrow.
        #[allow(unsafe_code)]
        let hangup = self.hangup.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) });
        match self
            .wake
            .sleep_or_hangup(timeout, hangup, || self.lock().has_work())?
        {
            Wakeup::HangUp => Err(ControlError::Disconnected.into()),
            _ => Ok(()),
        }
    }
}

fn keep(weak: Weak<Shared>) {
    loop {
        std::thread::sleep(KEEPER_TICK);
        let Some(shared) = weak.upgrade() else {
            return;
        };
        shared.keep_once();
    }
}

/// The first IPv4 address `addr` resolves to.
pub(crate) fn v4(addr: impl ToSocketAddrs) -> io::Result<SocketAddrV4> {
    addr.to_socket_addrs()?
        .find_map(|a| match a {
            SocketAddr::V4(a) => Some(a),
            SocketAddr::V6(_) => None,
        })
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "no IPv4 address (exonet speaks IPv4 only)",
            )
        })
}
