//! What a `udp` measurement runs on: a scratch directory for control
//! sockets, two `exonet daemon`s joined by a link, and the two
//! `exonet bench-child udp-node` processes of a measurement.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::ValueEnum;
use exonet_shm::control::SeqPacket;

use super::exonet::Serve;
use super::node::{Role, Stack};
use crate::bench::endpoint::peer::{self, Peer, PATIENCE};
use crate::bench::endpoint::{error, kernel};
use crate::bench::report::Fail;

/// A directory of this run (`$TMPDIR/exonet-bench-udp-<pid>`), removed on
/// drop (or by the next run, if this one is killed).
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn create() -> Result<Scratch, Fail> {
        const PREFIX: &str = "exonet-bench-udp-";
        let tmp = std::env::temp_dir();
        // Those of runs that were killed go first.
        for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            if peer::left_by_dead_run(&entry.file_name().to_string_lossy(), PREFIX) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = tmp.join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(error("scratch directory"))?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two `exonet daemon`s, one per side, each with its control socket;
/// killed on drop.
pub struct Daemons {
    /// Held only to be killed and reaped on drop.
    _procs: Vec<Peer>,
    pub sockets: [PathBuf; 2],
}

impl Daemons {
    /// Starts `exonet daemon --link <links[i]> --ip <ips[i]>/24` in
    /// `netns[i]`, one after the other (the second daemon on a memwire
    /// joins the cable the first offers), each serving a socket named
    /// `<tag>-<i>.sock` in `dir`.
    pub fn start(
        dir: &Path,
        tag: &str,
        links: [String; 2],
        netns: [Option<&str>; 2],
        ips: [Ipv4Addr; 2],
    ) -> Result<Daemons, Fail> {
        Daemons::start_with(dir, tag, links, netns, ips, &[], false)
    }

    /// [`Daemons::start`], each daemon given `extra` arguments too, and
    /// with `pinned` (on a machine of two CPUs or more) daemon `i` kept on
    /// CPU `i` (`--cpu`): each host's multiplexer on a core of its own, as
    /// two hosts have.
    pub fn start_with(
        dir: &Path,
        tag: &str,
        links: [String; 2],
        netns: [Option<&str>; 2],
        ips: [Ipv4Addr; 2],
        extra: &[&str],
        pinned: bool,
    ) -> Result<Daemons, Fail> {
        let pinned = pinned && two_cpus();
        let sockets = [0, 1].map(|i| dir.join(format!("{tag}-{i}.sock")));
        let mut procs = Vec::new();
        for i in 0..2 {
            let daemon = while_busy(|| {
                let mut cmd = peer::exonet(netns[i])?;
                cmd.arg("daemon")
                    .arg("--link")
                    .arg(&links[i])
                    .arg("--ip")
                    .arg(format!("{}/24", ips[i]))
                    .arg("--socket")
                    .arg(&sockets[i])
                    .args(extra);
                if pinned {
                    cmd.arg("--cpu").arg(i.to_string());
                }
                let mut daemon = Peer::spawn(cmd, &[], &format!("daemon {}", links[i]))?;
                await_serving(&sockets[i], &mut daemon)?;
                Ok(daemon)
            })?;
            procs.push(daemon);
        }
        Ok(Daemons {
            _procs: procs,
            sockets,
        })
    }
}

/// Whether the machine has two CPUs or more, for the two sides of a
/// measurement to be kept on CPUs 0 and 1.
pub fn two_cpus() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
}

/// Runs `open` (of a link) again while it fails with "busy", for at most
/// [`PATIENCE`]: the kernel releases an interface's queue a little after
/// its previous owner (an earlier measurement's process) exited.
pub fn while_busy<T>(mut open: impl FnMut() -> Result<T, Fail>) -> Result<T, Fail> {
    const STEP: Duration = Duration::from_millis(10);
    let busy = std::io::Error::from_raw_os_error(libc::EBUSY).to_string();
    for _ in 0..PATIENCE.as_millis() / STEP.as_millis() {
        match open() {
            Err(Fail::Error(e)) if e.contains(&busy) => std::thread::sleep(STEP),
            r => return r,
        }
    }
    open()
}

/// Waits, at most [`PATIENCE`], until `daemon` accepts connections on
/// `socket` (its link is open by then).
fn await_serving(socket: &Path, daemon: &mut Peer) -> Result<(), Fail> {
    const STEP: Duration = Duration::from_millis(5);
    for _ in 0..PATIENCE.as_millis() / STEP.as_millis() {
        if SeqPacket::connect(socket).is_ok() {
            return Ok(());
        }
        if let Some(e) = daemon.failed() {
            return Err(e);
        }
        std::thread::sleep(STEP);
    }
    Err(Fail::Error(format!(
        "no daemon serving {} within {PATIENCE:?}",
        socket.display()
    )))
}

/// Where one side of a measurement runs and what it binds.
pub struct Side<'a> {
    pub netns: Option<&'a str>,
    pub addr: SocketAddrV4,
    /// Who serves its endpoint (exonet only).
    pub serve: Option<Serve<'a>>,
}

/// How long a measurement's phases last.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    pub warmup: Duration,
    pub window: Duration,
}

impl Phases {
    /// How long a node may live: starting, waiting for the other, its
    /// phases, and the sender's wait for the receiver to finish.
    pub fn lifetime(&self) -> Duration {
        self.warmup + self.window + PATIENCE * 3
    }
}

fn node(
    stack: Stack,
    role: Role,
    me: &Side,
    them: &Side,
    size: usize,
    ph: Phases,
) -> Result<Command, Fail> {
    let mut cmd = peer::command(me.netns)?;
    cmd.arg("udp-node")
        .arg("--stack")
        .arg(name(stack))
        .arg("--role")
        .arg(name(role))
        .arg("--local")
        .arg(me.addr.to_string())
        .arg("--remote")
        .arg(them.addr.to_string())
        .arg("--size")
        .arg(size.to_string())
        .arg("--warmup-ms")
        .arg(ph.warmup.as_millis().to_string())
        .arg("--window-ms")
        .arg(ph.window.as_millis().to_string())
        .arg("--lifetime-ms")
        .arg(ph.lifetime().as_millis().to_string());
    match me.serve {
        Some(Serve::Daemon(socket)) => cmd.arg("--socket").arg(socket),
        Some(Serve::Link(link)) => cmd.arg("--link").arg(link),
        None => &mut cmd,
    };
    Ok(cmd)
}

/// A value's name on the command line.
pub fn name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// Runs `passive` on `sides[1]` (pong, recv), then `active` on `sides[0]`
/// (ping, send), each bound to its side's address and sending to the
/// other's; both must succeed. A sender is told to stop once the receiver
/// is done. Their stdout: (passive, active).
pub fn pair(
    stack: Stack,
    [passive, active]: [Role; 2],
    sides: [&Side; 2],
    size: usize,
    ph: Phases,
) -> Result<(String, String), Fail> {
    run_pair(
        (
            node(stack, passive, sides[1], sides[0], size, ph)?,
            &name(passive),
        ),
        (
            node(stack, active, sides[0], sides[1], size, ph)?,
            &name(active),
        ),
        active == Role::Send,
        ph.lifetime() + PATIENCE,
    )
}

/// Runs the `passive` process, then the `active` one; both must succeed
/// within `limit`. With `stop`, the active one runs until the passive one
/// is done, told by the closing of the pipe given as `--stop-fd`. Their
/// stdout: (passive, active).
pub fn run_pair(
    (passive, pname): (Command, &str),
    (mut active, aname): (Command, &str),
    stop: bool,
    limit: Duration,
) -> Result<(String, String), Fail> {
    let mut p = Peer::spawn(passive, &[], pname)?;
    if !stop {
        let mut a = Peer::spawn(active, &[], aname)?;
        // When both fail, one may have waited in vain for the other: tell
        // both.
        let out_a = a.finish(limit).map_err(|e| match p.failed() {
            Some(pe) => both(pe, e),
            None => e,
        })?;
        return Ok((p.finish(limit)?, out_a));
    }
    let (stop_rx, stop_tx) = kernel::pipe()?;
    active.arg("--stop-fd").arg(stop_rx.as_raw_fd().to_string());
    let mut a = Peer::spawn(active, &[stop_rx.as_raw_fd()], aname)?;
    drop(stop_rx);
    let out_p = p.finish(limit).map_err(|e| match a.failed() {
        Some(ae) => both(e, ae),
        None => e,
    })?;
    drop(stop_tx);
    let out_a = a.finish(PATIENCE)?;
    Ok((out_p, out_a))
}

/// Two failures as one: an error if either is.
fn both(a: Fail, b: Fail) -> Fail {
    match (a, b) {
        (Fail::Skip(x), Fail::Skip(y)) => Fail::Skip(format!("{x}; {y}")),
        (Fail::Error(x) | Fail::Skip(x), Fail::Error(y) | Fail::Skip(y)) => {
            Fail::Error(format!("{x}; {y}"))
        }
    }
}
