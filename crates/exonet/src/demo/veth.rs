//! `exonet demo --veth`: the sockets tour against Linux. Two network
//! namespaces joined by a veth pair: in one, a multiplexer daemon on a thread
//! of this process owns its end through AF_PACKET (a frame at a time, for
//! latency) and applications use it through the protocol library; in the
//! other, Linux itself. Each side pings the other and sends UDP to the other's
//! echo, so the table puts exonet's numbers beside Linux's. The namespaces go
//! on the way out: on success, on error and on Ctrl-C.

use std::io::{self, BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exonet_mux::{Daemon, DaemonConfig, Mux, MuxConfig, Running};

use super::tour;
use crate::daemon::{block_stop_signals, on_stop_signal, open_link};

const EXO: Ipv4Addr = Ipv4Addr::new(10, 77, 9, 1);
const LINUX: Ipv4Addr = Ipv4Addr::new(10, 77, 9, 2);
/// Ports of the echoes on the exonet host (busy-polling, sleeping) and on
/// Linux's.
const BUSY_PORT: u16 = 7;
const SLEEPING_PORT: u16 = 8;
const LINUX_PORT: u16 = 7;

/// Linux's UDP echo.
const PY_ECHO: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(65535)
    s.sendto(data, peer)
"#;

/// Linux's UDP client: prints each round trip in ns, or "refused".
const PY_CLIENT: &str = r#"
import socket, sys, time
host, port, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.connect((host, port))
msg = bytes(i % 251 for i in range(size))
out = []
try:
    for i in range(count):
        t = time.perf_counter_ns()
        s.send(msg)
        got = s.recv(65536)
        out.append(time.perf_counter_ns() - t)
        if got != msg:
            sys.exit("the echo came back changed")
except ConnectionRefusedError:
    print("refused")
    sys.exit(0)
print(" ".join(map(str, out)))
"#;

/// Everything the demo made outside itself, torn down once, by whichever
/// comes first: the end of the tour or a stop signal.
struct Rig {
    namespaces: Mutex<Vec<String>>,
    children: Mutex<Vec<Child>>,
    /// The daemon's control socket, which a stop signal leaves behind.
    socket: PathBuf,
}

impl Rig {
    fn teardown(&self) {
        for mut c in std::mem::take(&mut *lock(&self.children)) {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The veth goes with its namespace.
        for ns in std::mem::take(&mut *lock(&self.namespaces)) {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tears the rig down when the tour returns, however it returns.
struct Teardown(Arc<Rig>);

impl Drop for Teardown {
    fn drop(&mut self) {
        self.0.teardown();
    }
}

fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A command with the stop signals unblocked again: this process blocks
/// them for its signal thread, and a child would inherit the mask and
/// outlive a Ctrl-C.
fn command(program: &str) -> Command {
    let mut c = Command::new(program);
    // SAFETY: the closure only calls sigemptyset and sigprocmask, which are
    // async-signal-safe, on a local set.
    unsafe {
        c.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c
}

fn run(c: &mut Command) -> Result<String, String> {
    let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{c:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<(), String> {
    run(command("ip").args(args)).map(drop)
}

fn in_ns(ns: &str, program: &str) -> Command {
    let mut c = command("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

/// Moves the calling thread into namespace `ns` (the rest of the process
/// stays where it is).
fn enter_netns(ns: &str) -> io::Result<()> {
    let f = std::fs::File::open(Path::new("/run/netns").join(ns))?;
    // SAFETY: a valid descriptor for the call's duration.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn tour(n: usize) -> Result<(), String> {
    if !is_root() {
        return Err(
            "--veth needs root (it creates network namespaces and opens AF_PACKET \
                    sockets); run it with sudo, or run `exonet demo` without --veth"
                .into(),
        );
    }
    for (tool, path) in [
        ("ip", "ip"),
        ("ping", "ping"),
        ("python3", "/usr/bin/python3"),
    ] {
        if Command::new(path).arg("-V").output().is_err() {
            return Err(format!(
                "--veth needs {tool} (apt-get install iproute2 iputils-ping python3)"
            ));
        }
    }
    // Before any thread starts, so that only the signal thread gets them.
    let signals = block_stop_signals().map_err(|e| format!("signals: {e}"))?;
    let pid = std::process::id();
    let rig = Arc::new(Rig {
        namespaces: Mutex::new(Vec::new()),
        children: Mutex::new(Vec::new()),
        socket: std::env::temp_dir().join(format!("exonet-demo-{pid}-veth.sock")),
    });
    let on_signal = rig.clone();
    on_stop_signal(signals, move || {
        on_signal.teardown();
        eprintln!("exonet demo: interrupted; namespaces removed");
        std::process::exit(130);
    });
    let _teardown = Teardown(rig.clone());
    let (exo_ns, linux_ns) = (
        format!("exonet-demo-{pid}-x"),
        format!("exonet-demo-{pid}-l"),
    );
    // Interface names are at most 15 bytes.
    let (vx, vl) = (
        format!("exd{}x", pid % 1_000_000),
        format!("exd{}l", pid % 1_000_000),
    );
    for ns in [&exo_ns, &linux_ns] {
        ip(&["netns", "add", ns])?;
        lock(&rig.namespaces).push(ns.clone());
    }
    ip(&["link", "add", &vx, "type", "veth", "peer", "name", &vl])?;
    ip(&["link", "set", &vx, "netns", &exo_ns])?;
    ip(&["link", "set", &vl, "netns", &linux_ns])?;
    for ns in [&exo_ns, &linux_ns] {
        // IPv6's own chatter would only be noise here.
        let _ = run(in_ns(ns, "sysctl").args(["-qw", "net.ipv6.conf.all.disable_ipv6=1"]));
    }
    ip(&["-n", &exo_ns, "link", "set", &vx, "up"])?;
    ip(&[
        "-n",
        &linux_ns,
        "addr",
        "add",
        &format!("{LINUX}/24"),
        "dev",
        &vl,
    ])?;
    ip(&["-n", &linux_ns, "link", "set", &vl, "up"])?;
    ip(&["-n", &linux_ns, "link", "set", "lo", "up"])?;

    let daemon = spawn_daemon(&exo_ns, &vx, rig.socket.clone())?;
    start_linux_echo(&rig, &linux_ns)?;
    println!(
        "exonet demo --veth: namespaces {exo_ns} (exonet {EXO}, a multiplexer daemon on \
         AF_PACKET {vx}) and {linux_ns} (Linux {LINUX} on {vl}); {n} round trips each way"
    );
    let stacks = [
        tour::open(daemon.socket(), &tour::busy())?,
        tour::open(daemon.socket(), &tour::sleeping())?,
        tour::open(daemon.socket(), &tour::busy())?,
        tour::open(daemon.socket(), &tour::sleeping())?,
    ];
    let [client_busy, client_sleeping, echo_busy, echo_sleeping] = &stacks;
    let to_linux = tour::Target {
        addr: LINUX,
        busy_port: LINUX_PORT,
        sleeping_port: LINUX_PORT,
    };
    let ours = tour::client_rows(client_busy, client_sleeping, &to_linux, n)?;
    let echoes = [
        tour::Echo::start(echo_busy, BUSY_PORT)?,
        tour::Echo::start(echo_sleeping, SLEEPING_PORT)?,
    ];
    let theirs = linux_rows(&linux_ns, n)?;
    for e in echoes {
        e.stop()?;
    }
    let closed = SocketAddrV4::new(LINUX, tour::CLOSED_PORT);
    let refused = tour::refused(client_sleeping, closed)?;
    println!("exonet, a connected socket to {closed} where nobody listens: \"{refused}\"");
    let out = linux_client(&linux_ns, tour::CLOSED_PORT, 4, 1)?;
    if out.trim() != "refused" {
        return Err(format!(
            "Linux to {EXO}:{}: not refused: {out}",
            tour::CLOSED_PORT
        ));
    }
    println!(
        "Linux, a connected socket to {EXO}:{}: \"connection refused\" \
         (exonet's multiplexer answered port unreachable)",
        tour::CLOSED_PORT
    );

    let rows: Vec<tour::Row> = tour::labels()
        .into_iter()
        .zip(ours.into_iter().zip(theirs))
        .map(|(label, (o, t))| tour::Row {
            label,
            cells: vec![o, t],
        })
        .collect();
    tour::print_rtts(&["exonet -> Linux", "Linux -> exonet"], &rows);
    tour::print_stacks(&[
        ("exonet client, busy", client_busy),
        ("exonet client, sleeping", client_sleeping),
        ("exonet echo, busy", echo_busy),
        ("exonet echo, sleeping", echo_sleeping),
    ]);
    print_linux_counters(&linux_ns)?;
    tour::print_muxes(&[(&format!("exonet {EXO}"), daemon.socket())])
}

fn spawn_daemon(ns: &str, iface: &str, socket: PathBuf) -> Result<Running, String> {
    let (ns, spec) = (ns.to_string(), format!("afpacket:{iface}:frames"));
    let path = socket.clone();
    Daemon::spawn(
        move || {
            // The AF_PACKET socket belongs to the namespace of the thread
            // that opens it; the control socket is a path, seen from all.
            enter_netns(&ns)?;
            let link = open_link(&spec, &[EXO], &path).map_err(io::Error::other)?;
            Ok(Mux::new(link, vec![EXO], MuxConfig::default()))
        },
        DaemonConfig::new(socket, vec![(EXO, 24)]),
    )
    .map_err(|e| format!("the multiplexer on {iface}: {e}"))
}

/// Starts Linux's echo and waits until it listens.
fn start_linux_echo(rig: &Rig, ns: &str) -> Result<(), String> {
    let mut child = in_ns(ns, "/usr/bin/python3")
        .args(["-c", PY_ECHO, &LINUX_PORT.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("Linux's echo: {e}"))?;
    let stdout = child.stdout.take();
    lock(&rig.children).push(child);
    let mut line = String::new();
    if let Some(s) = stdout {
        BufReader::new(s)
            .read_line(&mut line)
            .map_err(|e| format!("Linux's echo: {e}"))?;
    }
    if line.trim() != "ready" {
        return Err("Linux's echo did not start".into());
    }
    Ok(())
}

fn linux_client(ns: &str, port: u16, size: usize, count: usize) -> Result<String, String> {
    run(in_ns(ns, "/usr/bin/python3").args([
        "-c",
        PY_CLIENT,
        &EXO.to_string(),
        &port.to_string(),
        &size.to_string(),
        &count.to_string(),
    ]))
}

fn parse_ns(out: &str) -> Result<Vec<Duration>, String> {
    out.split_whitespace()
        .map(|w| {
            w.parse()
                .map(Duration::from_nanos)
                .map_err(|_| format!("Linux's client printed `{w}`"))
        })
        .collect()
}

/// Linux's side of the table, in [`tour::labels`] order: its `ping`
/// against exonet's multiplexer, its UDP client against exonet's echoes.
fn linux_rows(ns: &str, n: usize) -> Result<Vec<Option<tour::Summary>>, String> {
    // `ping` sends on a clock, not on each reply: one per millisecond.
    let pings = n.min(1000);
    let out = run(in_ns(ns, "ping").args([
        "-n",
        "-c",
        &pings.to_string(),
        "-i",
        "0.001",
        "-W",
        "5",
        &EXO.to_string(),
    ]))?;
    let ping: Vec<Duration> = out
        .lines()
        .filter_map(|l| l.split("time=").nth(1)?.split(' ').next()?.parse().ok())
        .map(|ms: f64| Duration::from_nanos((ms * 1e6) as u64))
        .collect();
    let udp = |port, size, count| -> Result<Vec<Duration>, String> {
        parse_ns(&linux_client(ns, port, size, count)?)
    };
    Ok(vec![
        tour::Summary::of(ping),
        tour::Summary::of(udp(BUSY_PORT, 4, n)?),
        tour::Summary::of(udp(SLEEPING_PORT, 4, n)?),
        tour::Summary::of(udp(BUSY_PORT, tour::FULL, n)?),
        tour::Summary::of(udp(BUSY_PORT, tour::BIG, tour::big_count(n))?),
    ])
}

/// Linux's counters that match the stacks' columns, from its SNMP table.
fn print_linux_counters(ns: &str) -> Result<(), String> {
    let snmp = run(in_ns(ns, "cat").arg("/proc/net/snmp"))?;
    // Each protocol is a line of names followed by a line of values.
    let lines: Vec<&str> = snmp.lines().collect();
    let get = |proto: &str, name: &str| -> u64 {
        lines
            .chunks(2)
            .filter(|p| p.len() == 2 && p[0].starts_with(&format!("{proto}:")))
            .find_map(|p| {
                let i = p[0].split_whitespace().position(|w| w == name)?;
                p[1].split_whitespace().nth(i)?.parse().ok()
            })
            .unwrap_or(0)
    };
    println!(
        "Linux {LINUX}: {} UDP datagrams sent, {} fragments created, {} datagrams \
         reassembled, {} UDP checksum errors, {} ICMP unreachables sent",
        get("Udp", "OutDatagrams"),
        get("Ip", "FragCreates"),
        get("Ip", "ReasmOKs"),
        get("Udp", "InCsumErrors"),
        get("Icmp", "OutDestUnreachs")
    );
    Ok(())
}
