//! What a `udp` measurement runs on: a scratch directory for control
//! sockets, two `exonet daemon`s joined by a link, and the two
//! `exonet bench-child udp-node` processes of a measurement.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::ValueEnum;
use exonet_shm::control::SeqPacket;

use super::node::{Role, Stack, SEND_SLACK};
use crate::bench::endpoint::error;
use crate::bench::endpoint::peer::{self, Peer, PATIENCE};
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
        let sockets = [0, 1].map(|i| dir.join(format!("{tag}-{i}.sock")));
        let mut procs = Vec::new();
        for i in 0..2 {
            let mut cmd = peer::exonet(netns[i])?;
            cmd.arg("daemon")
                .arg("--link")
                .arg(&links[i])
                .arg("--ip")
                .arg(format!("{}/24", ips[i]))
                .arg("--socket")
                .arg(&sockets[i]);
            let mut daemon = Peer::spawn(cmd, &[], &format!("daemon {}", links[i]))?;
            await_serving(&sockets[i], &mut daemon)?;
            procs.push(daemon);
        }
        Ok(Daemons {
            _procs: procs,
            sockets,
        })
    }
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
    /// Its daemon's control socket (exonet only).
    pub socket: Option<&'a Path>,
}

/// How long a measurement's phases last.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    pub warmup: Duration,
    pub window: Duration,
}

impl Phases {
    /// How long a node may live: starting, its phases, the sender's slack
    /// and its waits.
    fn lifetime(&self) -> Duration {
        self.warmup + self.window + SEND_SLACK + PATIENCE * 2
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
    if let Some(s) = me.socket {
        cmd.arg("--socket").arg(s);
    }
    Ok(cmd)
}

/// A value's name on the command line.
fn name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// Runs `passive` on `sides[1]` (pong, recv), then `active` on `sides[0]`
/// (ping, send), each bound to its side's address and sending to the
/// other's; both must succeed. Their stdout: (passive, active).
pub fn pair(
    stack: Stack,
    [passive, active]: [Role; 2],
    sides: [&Side; 2],
    size: usize,
    ph: Phases,
) -> Result<(String, String), Fail> {
    let mut p = Peer::spawn(
        node(stack, passive, sides[1], sides[0], size, ph)?,
        &[],
        &name(passive),
    )?;
    let mut a = Peer::spawn(
        node(stack, active, sides[0], sides[1], size, ph)?,
        &[],
        &name(active),
    )?;
    let limit = ph.lifetime() + PATIENCE;
    // One that waited in vain for its partner blames the partner.
    let out_a = a.finish(limit).map_err(|e| p.failed().unwrap_or(e))?;
    let out_p = p.finish(limit).map_err(|e| a.failed().unwrap_or(e))?;
    Ok((out_p, out_a))
}
