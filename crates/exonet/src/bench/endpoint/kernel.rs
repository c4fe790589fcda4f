//! `ring-rtt`'s peers: the same round trip between the same two processes
//! through the kernel. `unix-seqpacket`: a `socketpair(AF_UNIX,
//! SOCK_SEQPACKET)`; `pipe`: two pipes, one each way; `linux-udp-loopback`:
//! two UDP sockets on 127.0.0.1 connected to each other. All descriptors
//! are non-blocking. Both sides busy-poll them, as both sides of the rings
//! do, so that what differs is the path, not the waiting; the `-blocking`
//! systems sleep in `poll(2)` instead, as applications usually wait on
//! these descriptors.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use clap::Args;

use super::peer::{self, Patience, Peer, PATIENCE};
use super::{error, MSG};
use crate::bench::measure::{self, Budget};
use crate::bench::report::Fail;

/// First byte of the message that tells the child to stop (the others
/// start with 0x5a).
const STOP: u8 = 0xff;

/// The child's arguments: the descriptors it reads from and writes to
/// (the same one for a socket) and how long it may live.
#[derive(Debug, Args)]
pub struct EchoArgs {
    #[arg(long)]
    input: RawFd,
    #[arg(long)]
    output: RawFd,
    #[arg(long)]
    lifetime_ms: u64,
    /// Sleep in poll(2) while waiting instead of spinning.
    #[arg(long)]
    sleep: bool,
}

/// Both ends of a system's channel: ours to write and read, and the
/// child's (the same descriptor twice for a socket).
struct Wires {
    send: File,
    recv: File,
    child: Vec<OwnedFd>,
    child_in: RawFd,
    child_out: RawFd,
}

fn wires(system: &str) -> Result<Wires, Fail> {
    match system {
        "unix-seqpacket" => {
            let mut fds = [0; 2];
            // SAFETY: socketpair writes two descriptors into the live array.
            let r = unsafe {
                libc::socketpair(
                    libc::AF_UNIX,
                    libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    0,
                    fds.as_mut_ptr(),
                )
            };
            if r < 0 {
                return Err(error("socketpair")(std::io::Error::last_os_error()));
            }
            // SAFETY: two new descriptors that nothing else owns.
            let (ours, theirs) =
                unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            socket_wires(ours, theirs)
        }
        "pipe" => {
            let (child_reads, we_write) = pipe()?;
            let (we_read, child_writes) = pipe()?;
            Ok(Wires {
                send: File::from(we_write),
                recv: File::from(we_read),
                child_in: child_reads.as_raw_fd(),
                child_out: child_writes.as_raw_fd(),
                child: vec![child_reads, child_writes],
            })
        }
        "linux-udp-loopback" => {
            let bind = || UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(error("UDP socket"));
            let (ours, theirs) = (bind()?, bind()?);
            let addr = |s: &UdpSocket| s.local_addr().map_err(error("UDP socket"));
            ours.connect(addr(&theirs)?).map_err(error("connect"))?;
            theirs.connect(addr(&ours)?).map_err(error("connect"))?;
            for s in [&ours, &theirs] {
                s.set_nonblocking(true).map_err(error("UDP socket"))?;
            }
            socket_wires(File::from(OwnedFd::from(ours)), OwnedFd::from(theirs))
        }
        other => Err(Fail::Error(format!("no system {other}"))),
    }
}

fn socket_wires(ours: File, theirs: OwnedFd) -> Result<Wires, Fail> {
    Ok(Wires {
        recv: ours.try_clone().map_err(error("dup"))?,
        send: ours,
        child_in: theirs.as_raw_fd(),
        child_out: theirs.as_raw_fd(),
        child: vec![theirs],
    })
}

/// A non-blocking pipe: (read end, write end).
pub fn pipe() -> Result<(OwnedFd, OwnedFd), Fail> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the live array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
        return Err(error("pipe2")(std::io::Error::last_os_error()));
    }
    // SAFETY: two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Median round-trip time in nanoseconds of a [`MSG`]-byte message to a
/// child that echoes it, through `system`.
pub fn rtt(system: &str, budget: &Budget) -> Result<f64, Fail> {
    let (path, sleep) = match system.strip_suffix("-blocking") {
        Some(path) => (path, true),
        None => (system, false),
    };
    let w = wires(path)?;
    let mut cmd = peer::command(None)?;
    cmd.arg("fd-echo")
        .arg("--input")
        .arg(w.child_in.to_string())
        .arg("--output")
        .arg(w.child_out.to_string())
        .arg("--lifetime-ms")
        .arg(peer::lifetime(budget).as_millis().to_string());
    if sleep {
        cmd.arg("--sleep");
    }
    let mut child = Peer::spawn(cmd, &[w.child_in, w.child_out], system)?;
    // Only the child holds its ends now: if it dies, we read end-of-file.
    drop(w.child);
    let msg = [0x5au8; MSG];
    let mut back = [0u8; MSG];
    // The first answer also says the child is up.
    round_trip(&w.send, &w.recv, &msg, &mut back, sleep)?;
    let ns = measure::ns_per_op(budget, |n| {
        let t = Instant::now();
        for _ in 0..n {
            round_trip(&w.send, &w.recv, &msg, &mut back, sleep)?;
        }
        Ok(t.elapsed())
    })?;
    write_all(&w.send, &[STOP])?;
    child.finish(PATIENCE)?;
    Ok(ns)
}

fn round_trip(
    send: &File,
    recv: &File,
    msg: &[u8],
    back: &mut [u8],
    sleep: bool,
) -> Result<(), Fail> {
    write_all(send, msg)?;
    let mut got = 0;
    let mut p = Patience::new(PATIENCE);
    // A pipe is a byte stream: the echo may come in pieces.
    while got < msg.len() {
        match (&*recv).read(&mut back[got..]) {
            Ok(0) => return Err(Fail::Error("the echo process closed its end".into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                wait(recv, &mut p, sleep, "waiting for the echo")?
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(error("read")(e)),
        }
    }
    if back[..got] != *msg {
        return Err(Fail::Error("the echo is not the message".into()));
    }
    Ok(())
}

/// Waits for `f` to become readable: spinning once, or sleeping in poll(2)
/// for at most [`PATIENCE`].
fn wait(f: &File, p: &mut Patience, sleep: bool, what: &str) -> Result<(), Fail> {
    if !sleep {
        return p.spin(what);
    }
    let mut pfd = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd for the call's duration.
    let r = unsafe { libc::poll(&mut pfd, 1, PATIENCE.as_millis() as i32) };
    match r {
        0 => Err(Fail::Error(format!("timed out {what}"))),
        r if r < 0 && std::io::Error::last_os_error().kind() != ErrorKind::Interrupted => {
            Err(error("poll")(std::io::Error::last_os_error()))
        }
        _ => Ok(()),
    }
}

fn write_all(f: &File, data: &[u8]) -> Result<(), Fail> {
    let mut done = 0;
    let mut p = Patience::new(PATIENCE);
    while done < data.len() {
        match (&*f).write(&data[done..]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => p.spin("waiting to write")?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(error("write")(e)),
        }
    }
    Ok(())
}

/// `exonet bench-child fd-echo`: writes what it reads back, until told to
/// stop or the other end is closed.
pub fn echo(args: &EchoArgs) -> Result<(), Fail> {
    let (input, output) = if args.input == args.output {
        let fd = File::from(peer::adopt(&[args.input])?.remove(0));
        (fd.try_clone().map_err(error("dup"))?, fd)
    } else {
        let mut fds = peer::adopt(&[args.input, args.output])?;
        let output = File::from(fds.remove(1));
        (File::from(fds.remove(0)), output)
    };
    let deadline = Instant::now() + Duration::from_millis(args.lifetime_ms);
    let mut buf = [0u8; 2048];
    let mut count = 0u64;
    loop {
        let mut p = Patience::new(PATIENCE);
        let n = loop {
            match (&input).read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    wait(&input, &mut p, args.sleep, "waiting for a message")?
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(error("read")(e)),
            }
        };
        if n == 0 || buf[0] == STOP {
            return Ok(());
        }
        write_all(&output, &buf[..n])?;
        count += 1;
        if count.is_multiple_of(1024) {
            peer::check_lifetime(deadline)?;
        }
    }
}
