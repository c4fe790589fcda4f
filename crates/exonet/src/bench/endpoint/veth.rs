//! `raw-rtt-veth`: ping-pong of 64-byte UDP frames between two processes in
//! two network namespaces joined by a veth pair.
//!
//! - `exonet-afxdp`, `exonet-afpacket`, `exonet-afpacket-v2`: each process
//!   runs a [`Mux`] on its end of the pair (an [`AfXdp`] or [`AfPacket`]
//!   link) and an application
//!   on an in-process endpoint (`Segment::split`), privileged, with one
//!   channel: the socket filter and template of its UDP port, bound as a
//!   raw filter and template. The application writes whole frames (inline
//!   on tx) and reads them (inline on rx); one thread per process drives
//!   both, polling the multiplexer between looks at the rings. The UDP
//!   checksum is 0 ("none", allowed over IPv4) rather than recomputed for
//!   every message.
//!   `exonet-afpacket`'s round trip is bound by the TPACKET_V3 receive
//!   ring, which hands a block with a single frame to user space only when
//!   its retire timer fires (the link's `block_timeout_ms`, 1 ms).
//!   `exonet-afpacket-v2` is the same link in [`RxMode::Frames`]: a
//!   TPACKET_V2 ring, which hands each frame over as soon as it is written.
//! - `linux-udp`: two kernel UDP sockets on addresses of the same pair,
//!   non-blocking and busy-polled, with the same 22-byte payload (so the
//!   same 64-byte frames on the wire).
//!
//! The kernel's addresses are 10.77.90.1 and .2, exonet's 10.77.91.1 and .2
//! (which the kernel does not own, so frames that AF_PACKET shows to both
//! exonet and the kernel get no answer from the kernel). The MAC addresses
//! are fixed, so nobody needs ARP. The pinging process (namespace `a`)
//! probes until the other answers, then times round trips with
//! [`measure::ns_per_op`] and prints `rtt_ns <median>`; a stop message,
//! echoed too, ends both.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use exonet_link::afpacket::{self, AfPacket, RxMode};
use exonet_link::afxdp::AfXdp;
use exonet_link::Link;
use exonet_mux::registry::{socket_filter, socket_template};
use exonet_mux::{ChannelSpec, Mux, MuxConfig, Proto};
use exonet_shm::{AppEndpoint, Segment, SegmentConfig, INLINE_MAX};
use exonet_wire::{build, MacAddr};

use super::error;
use super::peer::{self, Patience, Peer, PATIENCE};
use crate::bench::measure::{self, Budget};
use crate::bench::report::{Fail, Outcome, Reporter};

pub const CASE: &str = "raw-rtt-veth";
const METRIC: &str = "us_rtt";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum System {
    ExonetAfxdp,
    ExonetAfpacket,
    #[value(name = "exonet-afpacket-v2")]
    ExonetAfpacketV2,
    LinuxUdp,
}

/// In the order of the table's columns.
pub const SYSTEMS: [System; 4] = [
    System::ExonetAfxdp,
    System::ExonetAfpacket,
    System::ExonetAfpacketV2,
    System::LinuxUdp,
];

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::ExonetAfxdp => "exonet-afxdp",
            System::ExonetAfpacket => "exonet-afpacket",
            System::ExonetAfpacketV2 => "exonet-afpacket-v2",
            System::LinuxUdp => "linux-udp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Sends, times, reports (namespace `a`).
    Ping,
    /// Echoes (namespace `b`).
    Pong,
}

/// One end of the veth pair.
pub struct End {
    pub mac: [u8; 6],
    pub kernel_ip: Ipv4Addr,
    pub exonet_ip: Ipv4Addr,
    pub port: u16,
}

pub const ENDS: [End; 2] = [
    End {
        mac: [0x02, 0x77, 0, 0, 0, 0x01],
        kernel_ip: Ipv4Addr::new(10, 77, 90, 1),
        exonet_ip: Ipv4Addr::new(10, 77, 91, 1),
        port: 47001,
    },
    End {
        mac: [0x02, 0x77, 0, 0, 0, 0x02],
        kernel_ip: Ipv4Addr::new(10, 77, 90, 2),
        exonet_ip: Ipv4Addr::new(10, 77, 91, 2),
        port: 47002,
    },
];

/// UDP payload: 14 + 20 + 8 + 22 = a 64-byte frame. Sequence number in
/// bytes 0..4, 1 in byte 4 for "stop".
const PAYLOAD: usize = 22;
const PAYLOAD_AT: usize = 42;
const UDP_CHECKSUM_AT: usize = 40;
/// How long the pinging side waits for the answer to a probe before it
/// sends another.
const PROBE: Duration = Duration::from_millis(20);

fn message(seq: u32, stop: bool) -> [u8; PAYLOAD] {
    let mut m = [0x5a; PAYLOAD];
    m[..4].copy_from_slice(&seq.to_be_bytes());
    m[4] = stop.into();
    m
}

fn seq_of(m: &[u8; PAYLOAD]) -> u32 {
    u32::from_be_bytes([m[0], m[1], m[2], m[3]])
}

/// Measures every system, or reports them all skipped (not root, no veth
/// pair).
pub fn run(budget: &Budget, rep: &mut Reporter) {
    let skip_all = |rep: &mut Reporter, why: &str| {
        for s in SYSTEMS {
            rep.push(CASE, s.name(), METRIC, Outcome::Skipped(why.to_string()));
        }
    };
    let Some(net) = Net::for_bench(CASE, rep, skip_all) else {
        return;
    };
    for s in SYSTEMS {
        rep.progress(&format!("{CASE}: {}", s.name()));
        let r = ping_pong(&net, s, budget);
        rep.push(CASE, s.name(), METRIC, Outcome::of(r));
    }
}

/// Runs `ip` with `args`, at most [`PATIENCE`].
pub fn ip(args: &[&str]) -> Result<(), Fail> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    Peer::spawn(cmd, &[], &format!("ip {}", args.join(" ")))?
        .finish(PATIENCE)
        .map(drop)
}

/// Two network namespaces (`exo-bench-<pid>-a`, `-b`) with a veth pair
/// between them, the kernel's addresses of [`ENDS`] on its ends; deleted on
/// drop, with the pair (or by the next run, if this one is killed).
pub struct Net {
    pub namespaces: Vec<String>,
    pub ifnames: [String; 2],
}

impl Net {
    /// The pair for a suite's veth cases, or `None` after reporting them all
    /// skipped through `skip_all` (not root, or no veth pair to be had).
    pub fn for_bench(
        label: &str,
        rep: &mut Reporter,
        skip_all: impl Fn(&mut Reporter, &str),
    ) -> Option<Net> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            skip_all(rep, "needs root");
            return None;
        }
        rep.progress(&format!(
            "{label}: a veth pair between two network namespaces"
        ));
        match Net::create() {
            Ok(net) => Some(net),
            Err(Fail::Error(e) | Fail::Skip(e)) => {
                skip_all(
                    rep,
                    &format!("no veth pair between network namespaces: {e}"),
                );
                None
            }
        }
    }

    pub fn create() -> Result<Net, Fail> {
        Net::sweep();
        let pid = std::process::id();
        let mut net = Net {
            namespaces: Vec::new(),
            ifnames: [format!("exb{pid}a"), format!("exb{pid}b")],
        };
        for tag in ["a", "b"] {
            let ns = format!("exo-bench-{pid}-{tag}");
            ip(&["netns", "add", &ns])?;
            net.namespaces.push(ns.clone());
            // Fewer stray frames (router solicitations, MLD) on the pair;
            // before it exists, so that it is created with IPv6 off.
            let _ = ip(&[
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ]);
        }
        let (ns, ifs) = (&net.namespaces, &net.ifnames);
        let mac = |e: &End| {
            e.mac
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        ip(&[
            "-n",
            &ns[0],
            "link",
            "add",
            &ifs[0],
            "address",
            &mac(&ENDS[0]),
            "type",
            "veth",
            "peer",
            "name",
            &ifs[1],
            "address",
            &mac(&ENDS[1]),
            "netns",
            &ns[1],
        ])?;
        for i in 0..2 {
            let addr = format!("{}/24", ENDS[i].kernel_ip);
            ip(&["-n", &ns[i], "addr", "add", &addr, "dev", &ifs[i]])?;
            ip(&["-n", &ns[i], "link", "set", &ifs[i], "up"])?;
        }
        Ok(net)
    }

    /// Deletes the namespaces (and so the pairs) of runs that were killed.
    fn sweep() {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "list"]);
        let Ok(list) = Peer::spawn(cmd, &[], "ip netns list").and_then(|mut p| p.finish(PATIENCE))
        else {
            return;
        };
        for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
            if peer::left_by_dead_run(ns, "exo-bench-") {
                let _ = ip(&["netns", "del", ns]);
            }
        }
    }

    /// The command that runs `role` of `system` at its end of the pair.
    fn node(&self, system: System, role: Role, budget: &Budget) -> Result<Command, Fail> {
        let end = match role {
            Role::Ping => 0,
            Role::Pong => 1,
        };
        let mut cmd = peer::command(Some(&self.namespaces[end]))?;
        cmd.arg("veth-node")
            .arg("--system")
            .arg(system.name())
            .arg("--role")
            .arg(match role {
                Role::Ping => "ping",
                Role::Pong => "pong",
            })
            .arg("--ifname")
            .arg(&self.ifnames[end])
            .arg("--per-case-ms")
            .arg(budget.per_case.as_millis().to_string())
            .arg("--reps")
            .arg(budget.reps.to_string())
            .arg("--lifetime-ms")
            .arg(peer::lifetime(budget).as_millis().to_string());
        Ok(cmd)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Median round trip of `system` in microseconds.
fn ping_pong(net: &Net, system: System, budget: &Budget) -> Result<f64, Fail> {
    let mut pong = Peer::spawn(net.node(system, Role::Pong, budget)?, &[], "pong")?;
    let mut ping = Peer::spawn(net.node(system, Role::Ping, budget)?, &[], "ping")?;
    let out = match ping.finish(peer::lifetime(budget) + PATIENCE) {
        Ok(out) => out,
        // The ping waited in vain if the pong could not start.
        Err(e) => return Err(pong.failed().unwrap_or(e)),
    };
    pong.finish(PATIENCE)?;
    let ns: f64 = out
        .trim()
        .strip_prefix("rtt_ns ")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Fail::Error(format!("the ping process said {out:?}")))?;
    Ok(ns / 1e3)
}

/// The child's arguments.
#[derive(Debug, Args)]
pub struct NodeArgs {
    #[arg(long, value_enum)]
    system: System,
    #[arg(long, value_enum)]
    role: Role,
    /// Its end of the veth pair.
    #[arg(long)]
    ifname: String,
    /// The measurement's budget (ping only).
    #[arg(long)]
    per_case_ms: u64,
    #[arg(long)]
    reps: usize,
    #[arg(long)]
    lifetime_ms: u64,
}

/// One side's way to send and receive the payload of a UDP datagram,
/// without ever blocking.
trait Wire {
    fn send(&mut self, m: &[u8; PAYLOAD]) -> Result<(), Fail>;
    /// A payload received now, if any (anything else received is dropped).
    fn recv(&mut self) -> Result<Option<[u8; PAYLOAD]>, Fail>;
    /// Counters that may say why nothing came back, as "; ...".
    fn describe(&self) -> String {
        String::new()
    }
}

/// `exonet bench-child veth-node`: one side of the ping-pong.
pub fn node(args: &NodeArgs) -> Result<(), Fail> {
    let (me, them) = match args.role {
        Role::Ping => (&ENDS[0], &ENDS[1]),
        Role::Pong => (&ENDS[1], &ENDS[0]),
    };
    let lifetime = Duration::from_millis(args.lifetime_ms);
    let deadline = Instant::now() + lifetime;
    let open = |r: std::io::Result<Box<dyn Link>>, what: &str| {
        r.map_err(|e| {
            let why = format!("{what} on {}: {e}", args.ifname);
            // A kernel without it is a skip; anything else is an error.
            match e.raw_os_error() {
                Some(libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT | libc::EOPNOTSUPP) => {
                    Fail::Skip(why)
                }
                _ => Fail::Error(why),
            }
        })
    };
    let mut wire: Box<dyn Wire> = match args.system {
        System::LinuxUdp => Box::new(KernelUdp::open(me, them)?),
        System::ExonetAfxdp => Box::new(Exonet::new(
            open(
                AfXdp::open(&args.ifname).map(|l| Box::new(l) as Box<dyn Link>),
                "AF_XDP",
            )?,
            me,
            them,
        )?),
        System::ExonetAfpacket | System::ExonetAfpacketV2 => {
            let rx_mode = match args.system {
                System::ExonetAfpacketV2 => RxMode::Frames,
                _ => RxMode::Blocks,
            };
            let cfg = afpacket::Config {
                rx_mode,
                ..afpacket::Config::default()
            };
            Box::new(Exonet::new(
                open(
                    AfPacket::with_config(&args.ifname, cfg).map(|l| Box::new(l) as Box<dyn Link>),
                    "AF_PACKET",
                )?,
                me,
                them,
            )?)
        }
    };
    match args.role {
        Role::Ping => ping(&mut *wire, args, deadline),
        Role::Pong => pong(&mut *wire, lifetime),
    }
}

fn ping(w: &mut dyn Wire, args: &NodeArgs, deadline: Instant) -> Result<(), Fail> {
    // The other side may still be setting up its link: probe until it
    // answers.
    let start = Instant::now();
    let mut seq = 0u32;
    loop {
        seq += 1;
        w.send(&message(seq, false))?;
        if await_echo(w, seq, PROBE)? {
            break;
        }
        if start.elapsed() > PATIENCE {
            return Err(Fail::Error(format!(
                "no answer to {seq} probes within {PATIENCE:?}{}",
                w.describe()
            )));
        }
    }
    let budget = Budget {
        per_case: Duration::from_millis(args.per_case_ms),
        reps: args.reps,
    };
    let ns = measure::ns_per_op(&budget, |n| {
        peer::check_lifetime(deadline)?;
        let t = Instant::now();
        for _ in 0..n {
            seq = seq.wrapping_add(1);
            round_trip(w, seq, false)?;
        }
        Ok(t.elapsed())
    })?;
    round_trip(w, seq.wrapping_add(1), true)?;
    println!("rtt_ns {ns}");
    Ok(())
}

fn round_trip(w: &mut dyn Wire, seq: u32, stop: bool) -> Result<(), Fail> {
    w.send(&message(seq, stop))?;
    if !await_echo(w, seq, PATIENCE)? {
        return Err(Fail::Error(format!(
            "no echo of message {seq} within {PATIENCE:?}{}",
            w.describe()
        )));
    }
    Ok(())
}

/// Waits at most `limit` for the echo of message `seq` (late echoes of
/// earlier probes are skipped); whether it came.
fn await_echo(w: &mut dyn Wire, seq: u32, limit: Duration) -> Result<bool, Fail> {
    let mut p = Patience::new(limit);
    loop {
        match w.recv()? {
            Some(m) if seq_of(&m) == seq => return Ok(true),
            Some(_) => {}
            None if p.wait() => {}
            None => return Ok(false),
        }
    }
}

/// Echoes every message until a stop message (echoed too).
fn pong(w: &mut dyn Wire, lifetime: Duration) -> Result<(), Fail> {
    let deadline = Instant::now() + lifetime;
    let mut p = Patience::new(lifetime);
    let mut count = 0u64;
    loop {
        let Some(m) = w.recv()? else {
            p.spin("waiting for the ping")?;
            continue;
        };
        w.send(&m)?;
        if m[4] == 1 {
            return Ok(());
        }
        p.reset();
        count += 1;
        if count.is_multiple_of(1024) {
            peer::check_lifetime(deadline)?;
        }
    }
}

/// A kernel UDP socket, connected to the other end's.
struct KernelUdp {
    sock: UdpSocket,
    buf: [u8; 64],
}

impl KernelUdp {
    fn open(me: &End, them: &End) -> Result<KernelUdp, Fail> {
        let sock = UdpSocket::bind((me.kernel_ip, me.port)).map_err(error("bind"))?;
        sock.connect((them.kernel_ip, them.port))
            .map_err(error("connect"))?;
        sock.set_nonblocking(true).map_err(error("UDP socket"))?;
        Ok(KernelUdp { sock, buf: [0; 64] })
    }
}

/// Not an error here: no room yet, a signal, or the ICMP "port
/// unreachable" of a probe sent before the other side was up.
pub fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::Interrupted | ErrorKind::ConnectionRefused
    )
}

impl Wire for KernelUdp {
    fn send(&mut self, m: &[u8; PAYLOAD]) -> Result<(), Fail> {
        let mut p = Patience::new(PATIENCE);
        loop {
            match self.sock.send(m) {
                Ok(_) => return Ok(()),
                Err(e) if transient(&e) => p.spin("sending")?,
                Err(e) => return Err(error("send")(e)),
            }
        }
    }

    fn recv(&mut self) -> Result<Option<[u8; PAYLOAD]>, Fail> {
        match self.sock.recv(&mut self.buf) {
            Ok(n) => Ok(self.buf[..n].try_into().ok()),
            Err(e) if transient(&e) => Ok(None),
            Err(e) => Err(error("recv")(e)),
        }
    }
}

/// A multiplexer on a link and an application on an in-process endpoint,
/// driven by one thread.
struct Exonet {
    mux: Mux,
    app: AppEndpoint,
    channel: u32,
    /// The frame to send, rewritten with each payload.
    frame: Vec<u8>,
    inline: [u8; INLINE_MAX],
}

impl Exonet {
    fn new(link: Box<dyn Link>, me: &End, them: &End) -> Result<Exonet, Fail> {
        let mut mux = Mux::new(link, vec![me.exonet_ip], MuxConfig::default());
        // No buffers on the free ring: every frame of the ping-pong travels
        // inline, and anything larger is not ours.
        let (app, ep) = Segment::create(&SegmentConfig {
            frame_size: 2048,
            frame_count: 16,
            ring_entries: [64; 4],
        })
        .map_err(error("segment"))?
        .split()
        .map_err(error("segment"))?;
        let id = mux.add_endpoint(ep, 0, true);
        let spec = ChannelSpec {
            proto: Proto::Udp,
            local_addr: me.exonet_ip,
            local_port: me.port,
            remote: Some((them.exonet_ip, them.port)),
        };
        let channel = mux
            .bind_channel(
                id,
                &[socket_filter(&spec)],
                socket_template(mux.mac(), &spec),
            )
            .map_err(error("bind_channel"))?
            .0;
        let mut frame = build::udp_frame(
            MacAddr(mux.mac()),
            MacAddr(them.mac),
            me.exonet_ip,
            them.exonet_ip,
            me.port,
            them.port,
            &[0; PAYLOAD],
        );
        frame[UDP_CHECKSUM_AT..UDP_CHECKSUM_AT + 2].fill(0);
        Ok(Exonet {
            mux,
            app,
            channel,
            frame,
            inline: [0; INLINE_MAX],
        })
    }
}

impl Wire for Exonet {
    fn send(&mut self, m: &[u8; PAYLOAD]) -> Result<(), Fail> {
        self.frame[PAYLOAD_AT..].copy_from_slice(m);
        let mut p = Patience::new(PATIENCE);
        while !self
            .app
            .tx
            .push_inline(self.channel, &self.frame)
            .map_err(error("tx"))?
        {
            self.mux.poll().map_err(error("mux"))?;
            p.spin("waiting for room on tx")?;
        }
        self.app.kick.notify_if_sleeping().map_err(error("kick"))?;
        // What the multiplexer would find on its next poll, sent now.
        self.mux.poll_tx().map_err(error("mux"))?;
        Ok(())
    }

    fn recv(&mut self) -> Result<Option<[u8; PAYLOAD]>, Fail> {
        self.mux.poll().map_err(error("mux"))?;
        let Some(d) = self
            .app
            .rx
            .pop_frame(&mut self.inline)
            .map_err(error("rx"))?
        else {
            return Ok(None);
        };
        if !d.is_inline() {
            return Err(Fail::Error(format!("a frame not inline: {d:?}")));
        }
        Ok(self
            .inline
            .get(PAYLOAD_AT..d.len as usize)
            .and_then(|p| p.try_into().ok()))
    }

    fn describe(&self) -> String {
        let stats = self.mux.stats();
        format!(
            "; link {:?}; endpoint {:?}; unmatched {}",
            self.mux.link().stats(),
            stats.endpoints.first().map(|e| e.stats),
            stats.rx_unmatched
        )
    }
}
