//! `exonet bench-child udp-node`: one side of a `udp` measurement, on a UDP
//! socket (exonet's or Linux's) connected to the other side's.
//!
//! - `ping` sends a datagram carrying a sequence number and waits for its
//!   echo: probes until the other side answers, round trips for the
//!   warm-up, then times each round trip of the window and prints
//!   `rtt_ns <median> <p99>`; a stop message (echoed too) ends both sides.
//! - `pong` echoes every datagram until the stop message.
//! - `send` sends datagrams of `--size` bytes, in batches, until the
//!   parent closes the pipe `--stop-fd` (once the receiver is done).
//! - `recv` waits for the first datagram, then counts what arrives in the
//!   window that follows the warm-up and prints `received <datagrams>
//!   <bytes> <seconds>`.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};

use super::exonet::{ExonetSocket, Serve};
use crate::bench::endpoint::error;
use crate::bench::endpoint::peer::{self, Patience, PATIENCE};
use crate::bench::endpoint::veth::transient;
use crate::bench::measure;
use crate::bench::report::Fail;

/// Datagrams per `sendmmsg`/`recvmmsg` call, and per check of the clock.
pub const BATCH: usize = 32;
/// How long the pinging side waits for the answer to a probe before it
/// sends another.
const PROBE: Duration = Duration::from_millis(20);
/// Sequence number of the stop message.
const STOP: u32 = u32::MAX;
/// Round trips timed at most (bounds the memory of the samples).
const MAX_SAMPLES: usize = 1 << 22;
/// Largest datagram received.
pub const MAX_DATAGRAM: usize = 2048;

/// Whose UDP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Stack {
    /// exonet's, through the daemon at `--socket`, sleeping at once while
    /// it waits.
    Exonet,
    /// exonet's, spinning a while before it sleeps.
    ExonetBusy,
    /// exonet's, its endpoint served by a multiplexer in this process on
    /// the link `--link`, sleeping at once while it waits.
    ExonetInproc,
    /// The same, spinning a while before it sleeps.
    ExonetInprocBusy,
    /// Linux's, sleeping in the kernel while it waits.
    Linux,
    /// Linux's, non-blocking and busy-polled.
    LinuxBusy,
}

impl Stack {
    pub fn is_exonet(self) -> bool {
        matches!(
            self,
            Stack::Exonet | Stack::ExonetBusy | Stack::ExonetInproc | Stack::ExonetInprocBusy
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Ping,
    Pong,
    Send,
    Recv,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[arg(long, value_enum)]
    pub stack: Stack,
    #[arg(long, value_enum)]
    pub role: Role,
    #[arg(long)]
    pub local: SocketAddrV4,
    #[arg(long)]
    pub remote: SocketAddrV4,
    /// The daemon's control socket (`exonet`, `exonet-busy`).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The link of our own multiplexer (`exonet-inproc`).
    #[arg(long)]
    pub link: Option<String>,
    /// Payload bytes of every datagram.
    #[arg(long)]
    pub size: usize,
    #[arg(long)]
    pub warmup_ms: u64,
    /// How long round trips are timed (ping) or datagrams counted (recv).
    #[arg(long)]
    pub window_ms: u64,
    #[arg(long)]
    pub lifetime_ms: u64,
    /// The read end of a pipe whose closing tells the sender to stop.
    #[arg(long)]
    pub stop_fd: Option<RawFd>,
}

/// A connected UDP socket as the measurements use it.
pub trait Datagrams {
    /// Sends one datagram, waiting for room.
    fn send(&mut self, buf: &[u8]) -> Result<(), Fail>;
    /// Receives one datagram, waiting at most the last
    /// [`set_timeout`](Self::set_timeout); its length, or `None` if none came.
    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Fail>;
    fn set_timeout(&mut self, limit: Duration) -> Result<(), Fail>;
    /// Sends `n` datagrams of `buf`.
    fn send_batch(&mut self, buf: &[u8], n: usize) -> Result<(), Fail> {
        (0..n).try_for_each(|_| self.send(buf))
    }
    /// Receives at least one datagram (waiting as [`recv`](Self::recv))
    /// and whatever else has arrived, up to [`BATCH`]: (datagrams, bytes),
    /// (0, 0) if none came.
    fn recv_batch(&mut self, buf: &mut [u8]) -> Result<(usize, usize), Fail> {
        Ok(self.recv(buf)?.map_or((0, 0), |n| (1, n)))
    }
}

/// `exonet bench-child udp-node`.
pub fn node(args: &NodeArgs) -> Result<(), Fail> {
    let deadline = Instant::now() + Duration::from_millis(args.lifetime_ms);
    let mut sock: Box<dyn Datagrams> = match args.stack {
        Stack::Exonet | Stack::ExonetBusy | Stack::ExonetInproc | Stack::ExonetInprocBusy => {
            let serve = Serve::of(args.socket.as_deref(), args.link.as_deref())?;
            let busy = matches!(args.stack, Stack::ExonetBusy | Stack::ExonetInprocBusy);
            Box::new(ExonetSocket::open(serve, args.local, args.remote, busy)?)
        }
        Stack::Linux => Box::new(Kernel::open(args, false)?),
        Stack::LinuxBusy => Box::new(Kernel::open(args, true)?),
    };
    let w = &mut *sock;
    match args.role {
        Role::Ping => ping(w, args, deadline),
        Role::Pong => pong(w, deadline),
        Role::Send => send(w, args, deadline),
        Role::Recv => recv(w, args),
    }
}

fn message(seq: u32, size: usize) -> Vec<u8> {
    let mut m = vec![0x5a; size.max(4)];
    m[..4].copy_from_slice(&seq.to_be_bytes());
    m
}

fn seq_of(m: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(m.get(..4)?.try_into().ok()?))
}

fn ping(w: &mut dyn Datagrams, args: &NodeArgs, deadline: Instant) -> Result<(), Fail> {
    let mut buf = [0u8; MAX_DATAGRAM];
    // The other side may still be starting: probe until it answers.
    w.set_timeout(PROBE)?;
    let start = Instant::now();
    let mut seq = 0u32;
    loop {
        seq += 1;
        w.send(&message(seq, args.size))?;
        if await_echo(w, seq, &mut buf)? {
            break;
        }
        if start.elapsed() > PATIENCE {
            return Err(Fail::Error(format!(
                "no answer to {seq} probes within {PATIENCE:?}"
            )));
        }
    }
    w.set_timeout(PATIENCE)?;
    let mut msg = message(0, args.size);
    let mut round_trip = |w: &mut dyn Datagrams, seq: u32| -> Result<(), Fail> {
        msg[..4].copy_from_slice(&seq.to_be_bytes());
        w.send(&msg)?;
        if await_echo(w, seq, &mut buf)? {
            Ok(())
        } else {
            Err(Fail::Error(format!(
                "no echo of message {seq} within {PATIENCE:?}"
            )))
        }
    };
    let warm_end = Instant::now() + Duration::from_millis(args.warmup_ms);
    while Instant::now() < warm_end {
        seq += 1;
        round_trip(w, seq)?;
    }
    peer::check_lifetime(deadline)?;
    let end = Instant::now() + Duration::from_millis(args.window_ms);
    let mut samples = Vec::new();
    loop {
        seq += 1;
        let t = Instant::now();
        round_trip(w, seq)?;
        samples.push(t.elapsed().as_nanos() as f64);
        if t >= end || samples.len() >= MAX_SAMPLES {
            break;
        }
    }
    round_trip(w, STOP)?;
    let p99 = measure::percentile(&mut samples, 99.0);
    println!("rtt_ns {} {p99}", measure::median(samples));
    Ok(())
}

/// Receives until the echo of message `seq` (late echoes of earlier probes
/// are skipped); whether it came before the socket's timeout.
fn await_echo(w: &mut dyn Datagrams, seq: u32, buf: &mut [u8]) -> Result<bool, Fail> {
    // Each late echo answers one probe, and there are at most PATIENCE /
    // PROBE of those.
    for _ in 0..=PATIENCE.as_millis() / PROBE.as_millis() {
        match w.recv(buf)? {
            Some(n) if seq_of(&buf[..n]) == Some(seq) => return Ok(true),
            Some(_) => {}
            None => return Ok(false),
        }
    }
    Err(Fail::Error(format!(
        "too many stray datagrams before {seq}"
    )))
}

/// Echoes every datagram until the stop message (echoed too).
fn pong(w: &mut dyn Datagrams, deadline: Instant) -> Result<(), Fail> {
    let mut buf = [0u8; MAX_DATAGRAM];
    w.set_timeout(PATIENCE)?;
    let mut count = 0u64;
    loop {
        let n = w
            .recv(&mut buf)?
            .ok_or_else(|| Fail::Error(format!("no message within {PATIENCE:?}")))?;
        w.send(&buf[..n])?;
        if seq_of(&buf[..n]) == Some(STOP) {
            return Ok(());
        }
        count += 1;
        if count.is_multiple_of(1024) {
            peer::check_lifetime(deadline)?;
        }
    }
}

fn send(w: &mut dyn Datagrams, args: &NodeArgs, deadline: Instant) -> Result<(), Fail> {
    let stop = args
        .stop_fd
        .ok_or_else(|| Fail::Error("send needs --stop-fd".into()))?;
    let stop = File::from(peer::adopt(&[stop])?.remove(0));
    let msg = vec![0x5a; args.size];
    loop {
        // The pipe is non-blocking: nothing to read means "go on", its end
        // (or a byte) means "stop".
        match (&stop).read(&mut [0u8; 1]) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            _ => return Ok(()),
        }
        peer::check_lifetime(deadline)?;
        w.send_batch(&msg, BATCH)?;
    }
}

fn recv(w: &mut dyn Datagrams, args: &NodeArgs) -> Result<(), Fail> {
    let mut buf = [0u8; MAX_DATAGRAM];
    w.set_timeout(PATIENCE)?;
    if w.recv_batch(&mut buf)?.0 == 0 {
        return Err(Fail::Error(format!("nothing within {PATIENCE:?}")));
    }
    let from = Instant::now() + Duration::from_millis(args.warmup_ms);
    let window = Duration::from_millis(args.window_ms);
    let until = from + window;
    let (mut count, mut bytes) = (0u64, 0u64);
    loop {
        let (n, b) = w.recv_batch(&mut buf)?;
        if n == 0 {
            return Err(Fail::Error(format!(
                "the sender stopped: nothing within {PATIENCE:?}"
            )));
        }
        if b != n * args.size {
            return Err(Fail::Error(format!(
                "{n} datagrams of {b} bytes, not {} each",
                args.size
            )));
        }
        let now = Instant::now();
        if now >= until {
            break;
        }
        if now >= from {
            count += n as u64;
            bytes += b as u64;
        }
    }
    println!("received {count} {bytes} {}", window.as_secs_f64());
    Ok(())
}

/// A Linux UDP socket, connected; blocking with a timeout, or non-blocking
/// and busy-polled.
struct Kernel {
    sock: UdpSocket,
    busy: bool,
    timeout: Duration,
    /// recvmmsg's buffers.
    bufs: Vec<[u8; MAX_DATAGRAM]>,
}

impl Kernel {
    fn open(args: &NodeArgs, busy: bool) -> Result<Kernel, Fail> {
        let sock = UdpSocket::bind(args.local).map_err(error("bind"))?;
        sock.connect(args.remote).map_err(error("connect"))?;
        sock.set_nonblocking(busy).map_err(error("UDP socket"))?;
        Ok(Kernel {
            sock,
            busy,
            timeout: PATIENCE,
            bufs: vec![[0; MAX_DATAGRAM]; BATCH],
        })
    }

    /// Calls `op` until it does something other than "not yet": at once
    /// when blocking (the kernel waited), spinning for at most the timeout
    /// when busy. `None` if it never did.
    fn wait<T>(
        &self,
        what: &str,
        mut op: impl FnMut() -> std::io::Result<T>,
    ) -> Result<Option<T>, Fail> {
        let mut p = Patience::new(self.timeout);
        loop {
            match op() {
                Ok(v) => return Ok(Some(v)),
                Err(e) if e.kind() == ErrorKind::TimedOut => return Ok(None),
                Err(e) if transient(&e) => {
                    // A blocking socket that says "would block" timed out;
                    // a refusal (the other side not up yet) is news, not
                    // an error.
                    if !self.busy && e.kind() == ErrorKind::WouldBlock {
                        return Ok(None);
                    }
                    if !p.wait() {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(error(what)(e)),
            }
        }
    }
}

impl Datagrams for Kernel {
    fn send(&mut self, buf: &[u8]) -> Result<(), Fail> {
        let sock = &self.sock;
        self.wait("send", || sock.send(buf))?
            .map(drop)
            .ok_or_else(|| Fail::Error(format!("no room to send within {:?}", self.timeout)))
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Fail> {
        let sock = &self.sock;
        self.wait("recv", || sock.recv(buf))
    }

    fn set_timeout(&mut self, limit: Duration) -> Result<(), Fail> {
        self.timeout = limit;
        if !self.busy {
            self.sock
                .set_read_timeout(Some(limit))
                .map_err(error("SO_RCVTIMEO"))?;
        }
        Ok(())
    }

    fn send_batch(&mut self, buf: &[u8], n: usize) -> Result<(), Fail> {
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: an all-zero mmsghdr is valid (no name, no control).
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        let n = n.min(BATCH);
        let iov: *mut libc::iovec = &mut iov;
        for h in &mut hdrs[..n] {
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
        }
        let (fd, flags) = (self.sock.as_raw_fd(), 0);
        let mut sent = 0;
        while sent < n {
            let rest = &mut hdrs[sent..n];
            let r = self.wait("sendmmsg", || {
                // SAFETY: `rest` is live and each header points at `iov`,
                // which points at `buf`; the kernel only reads them (and
                // writes msg_len).
                let r = unsafe { libc::sendmmsg(fd, rest.as_mut_ptr(), rest.len() as u32, flags) };
                if r < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(r as usize)
                }
            })?;
            sent += r.ok_or_else(|| Fail::Error("no room to send".into()))?;
        }
        Ok(())
    }

    fn recv_batch(&mut self, _buf: &mut [u8]) -> Result<(usize, usize), Fail> {
        let mut iovs: Vec<libc::iovec> = self
            .bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: an all-zero mmsghdr is valid (no name, no control).
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (h, iov) in hdrs.iter_mut().zip(&mut iovs) {
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
        }
        // Blocking: sleep until the first datagram, then take what is there.
        let flags = if self.busy {
            libc::MSG_DONTWAIT
        } else {
            libc::MSG_WAITFORONE
        };
        let fd = self.sock.as_raw_fd();
        let got = self.wait("recvmmsg", || {
            // SAFETY: `hdrs` is live, each header points at its own iovec
            // and each iovec at its own buffer of `bufs`, all of which
            // outlive the call.
            let r = unsafe {
                libc::recvmmsg(
                    fd,
                    hdrs.as_mut_ptr(),
                    BATCH as u32,
                    flags,
                    std::ptr::null_mut(),
                )
            };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        })?;
        Ok(got.map_or((0, 0), |n| {
            (n, hdrs[..n].iter().map(|h| h.msg_len as usize).sum())
        }))
    }
}
