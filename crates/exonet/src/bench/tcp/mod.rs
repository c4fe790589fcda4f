//! `exonet bench tcp`: TCP through exonet's sockets against Linux's.
//!
//! Output as every suite's (see [`crate::bench::report`]): one JSON line per
//! (case, system, metric), then on stderr a table with the ratio of every
//! value to exonet's and whether the goals are met.
//!
//! # Cases and systems
//!
//! Over a veth pair between two network namespaces (root only; skipped
//! otherwise), exonet ↔ exonet against Linux ↔ Linux:
//!
//! - `tcp-rtt-veth`, `us_rtt` and `us_rtt_p99`: a 4-byte ping-pong over an
//!   established connection with TCP_NODELAY (the papers' latency test).
//! - `tcp-tput-veth` (10 MB written in 8 KB writes, the papers' throughput
//!   test; the median of 5 transfers, each on a connection of its own, one
//!   with `--quick`) and `tcp-bulk-veth` (1 GB; 100 MB with `--quick`),
//!   `gbps` of data at the receiver from its first byte to the end.
//! - `tcp-cps-veth`, `cps`: connect, a 64-byte request and answer, close, one
//!   after the other. A sleeping exonet listener (`exonet`,
//!   `exonet-inproc`) has the link answer its SYNs with SYN cookies
//!   (`TcpConfig::link_syn_cookies`: the XDP program answers them), as Linux
//!   answers SYNs in softirq without waking the server; a spinning one
//!   answers them itself, which is cheaper for it.
//!
//! Systems: `exonet` (an `exonet daemon --link afxdp:IF` in each namespace,
//! at its default nice of -10 and kept on a CPU of its own, `--cpu 0` and
//! `--cpu 1`, as two hosts' multiplexers are, and an application on it,
//! left to the scheduler, which writes its short segments to its direct
//! send port), `exonet-nodirect` (round trips
//! and connections only: the same with `--no-direct`, every frame through
//! the daemon), `exonet-offload`
//! (throughput only: the same on `--link afpacket:IF:frames`, whose TCP
//! segmentation offload the stack uses: super-segments of up to 64 KB cross
//! the veth whole, as Linux's do with its offloads on), `exonet-inproc`
//! (each application runs its own multiplexer on its end of the pair),
//! `exonet-inproc-busy` (the same,
//! spinning 200 µs before a wait sleeps, yielding the CPU after the first
//! 10), and Linux's
//! kernel TCP: `linux` (sleeping), `linux-busy` (non-blocking, spun on;
//! round trips only). For throughput Linux runs twice, `linux-offload` with
//! the veth's segmentation offloads on (its default: TSO, GSO and GRO move
//! 64 KB at a time) and `linux-no-offload` with them off (`ethtool -K ... tso
//! off gso off gro off`), which is the same per-packet work as exonet's. The
//! MTU is the same, 1500, for all. The two sides of a busy-polling system
//! (`exonet-inproc-busy`, `linux-busy`) are kept on CPUs 0 and 1, as
//! spinning pollers are given cores of their own; unpinned, the scheduler
//! now and then put both on one CPU, where they take turns (round trips of
//! ~8.5 µs against ~6.2 for exonet's, ~12 against ~8 for Linux's).
//!
//! In this process, over an in-memory cable (no privileges needed), one
//! connection between two threads, each stack with its multiplexer in
//! process: `tcp-tput-memwire`, 100 MB (20 MB with `--quick`), and
//! `tcp-loss-memwire`, the same with 1% of the frames lost each way (goodput
//! and segments retransmitted), for CUBIC with SACK (`exonet-cubic`, the
//! default), NewReno with SACK (`exonet-newreno`) and CUBIC without SACK
//! (`exonet-nosack`); `tcp-cps-memwire`, connections per second
//! as `tcp-cps-veth` makes them; `tcp-rtt-memwire`, 4-byte round trips
//! (sleeping and busy).
//!
//! Goals: round trip at most 0.8× Linux's; throughput at least Linux's
//! without offloads (`exonet`, on AF_XDP, which has none) and half of Linux's
//! with them (`exonet-offload`); connection rate at least Linux's.
//!
//! Each veth measurement runs three times (`tcp-tput-veth`, the noisiest
//! and quickest, seven; once with `--quick`), all of a case's systems in
//! turn each time, and reports the median ([`RUNS`], [`TPUT_RUNS`]).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Subcommand;
use exonet_link::Faults;
use exonet_stack::tcp::Congestion;
use exonet_stack::StackConfig;

use crate::bench::endpoint::peer::{self, PATIENCE};
use crate::bench::endpoint::veth::{Net, ENDS};
use crate::bench::report::{Fail, Outcome, Reporter};
use crate::bench::udp::exonet::Serve;
use crate::bench::udp::rig::{name, run_pair, two_cpus, Daemons, Phases, Scratch};
use crate::bench::{measure, RunOpts};
use node::{Role, Stack};

mod memwire;
mod node;

#[derive(Debug, clap::Args)]
pub struct TcpArgs {
    #[command(flatten)]
    pub opts: RunOpts,
}

const RTT: &str = "tcp-rtt-veth";
const TPUT: &str = "tcp-tput-veth";
const BULK: &str = "tcp-bulk-veth";
const CPS: &str = "tcp-cps-veth";
const MEMWIRE: &str = "tcp-tput-memwire";
const LOSS: &str = "tcp-loss-memwire";
const CPS_MEMWIRE: &str = "tcp-cps-memwire";
const RTT_MEMWIRE: &str = "tcp-rtt-memwire";
const CASES: [&str; 8] = [
    RTT,
    TPUT,
    BULK,
    CPS,
    RTT_MEMWIRE,
    MEMWIRE,
    LOSS,
    CPS_MEMWIRE,
];
/// In the order of the table's columns.
const SYSTEMS: [&str; 12] = [
    "exonet",
    "exonet-nodirect",
    "exonet-offload",
    "exonet-inproc",
    "exonet-inproc-busy",
    "linux",
    "linux-busy",
    "linux-offload",
    "linux-no-offload",
    "exonet-cubic",
    "exonet-newreno",
    "exonet-nosack",
];
const RTT_SIZE: usize = 4;
const WRITE_SIZE: usize = 8192;
const REQUEST_SIZE: usize = 64;

/// Ports of their own for each measurement (the previous one's connections
/// may linger in TIME-WAIT).
struct Ports(u16);

impl Ports {
    fn next(&mut self) -> u16 {
        self.0 += 1;
        self.0
    }
}

/// What one measurement runs: a case's roles and sizes.
struct Job {
    roles: [Role; 2],
    size: usize,
    bytes: u64,
    /// Transfers of `bytes`, each on a connection of its own: the
    /// measurement is their median.
    transfers: u32,
    phases: Phases,
}

/// Transfers of 10 MB in one `tcp-tput-veth` measurement (one with
/// `--quick`): one lasts 15–30 ms, and between runs of the same binary
/// it varied by half.
const TPUT_TRANSFERS: u32 = 5;

impl Job {
    fn of(case: &str, quick: bool) -> Job {
        let ms = Duration::from_millis;
        let phases = |w, d| Phases {
            warmup: ms(w),
            window: ms(d),
        };
        let none = phases(0, 0);
        match (case, quick) {
            (RTT, true) => Job::new([Role::Pong, Role::Ping], RTT_SIZE, 0, phases(50, 200)),
            (RTT, false) => Job::new([Role::Pong, Role::Ping], RTT_SIZE, 0, phases(200, 1000)),
            (TPUT, quick) => Job {
                transfers: if quick { 1 } else { TPUT_TRANSFERS },
                ..Job::new([Role::Sink, Role::Source], WRITE_SIZE, 10 << 20, none)
            },
            (BULK, true) => Job::new([Role::Sink, Role::Source], WRITE_SIZE, 100 << 20, none),
            (BULK, false) => Job::new([Role::Sink, Role::Source], WRITE_SIZE, 1 << 30, none),
            (_, true) => Job::new(
                [Role::Serve, Role::Client],
                REQUEST_SIZE,
                0,
                phases(50, 300),
            ),
            (_, false) => Job::new(
                [Role::Serve, Role::Client],
                REQUEST_SIZE,
                0,
                phases(200, 1000),
            ),
        }
    }

    fn new(roles: [Role; 2], size: usize, bytes: u64, phases: Phases) -> Job {
        Job {
            roles,
            size,
            bytes,
            transfers: 1,
            phases,
        }
    }

    /// How long a measurement may take: its phases, starting, and the
    /// transfers at no less than 100 Mbit/s.
    fn limit(&self) -> Duration {
        let bytes = self.bytes * u64::from(self.transfers);
        self.phases.lifetime() + PATIENCE + Duration::from_secs(bytes / (100_000_000 / 8))
    }
}

fn metrics(case: &str) -> &'static [&'static str] {
    match case {
        RTT | RTT_MEMWIRE => &["us_rtt", "us_rtt_p99"],
        CPS | CPS_MEMWIRE => &["cps"],
        MEMWIRE | LOSS => &["gbps", "retransmitted", "timeouts"],
        _ => &["gbps"],
    }
}

fn systems(case: &str) -> &'static [&'static str] {
    match case {
        RTT => &[
            "exonet-inproc",
            "exonet-inproc-busy",
            "exonet",
            "exonet-nodirect",
            "linux",
            "linux-busy",
        ],
        TPUT | BULK => &[
            "exonet-inproc",
            "exonet-inproc-busy",
            "exonet",
            "exonet-offload",
            "linux-offload",
            "linux-no-offload",
        ],
        LOSS => &["exonet-cubic", "exonet-newreno", "exonet-nosack"],
        MEMWIRE | CPS_MEMWIRE => &["exonet"],
        RTT_MEMWIRE => &["exonet-inproc", "exonet-inproc-busy"],
        _ => &[
            "exonet-inproc",
            "exonet-inproc-busy",
            "exonet",
            "exonet-nodirect",
            "linux",
        ],
    }
}

fn stack_of(system: &str) -> Stack {
    match system {
        "exonet" | "exonet-nodirect" | "exonet-offload" => Stack::Exonet,
        "exonet-inproc" => Stack::ExonetInproc,
        "exonet-inproc-busy" => Stack::ExonetInprocBusy,
        "linux-busy" => Stack::LinuxBusy,
        _ => Stack::Linux,
    }
}

pub fn run(args: &TcpArgs) -> ExitCode {
    let opts = &args.opts;
    if let Some(bad) = opts.cases.iter().find(|c| !CASES.contains(&c.as_str())) {
        eprintln!("unknown case {bad}; the cases are: {}", CASES.join(" "));
        return ExitCode::from(2);
    }
    let cases: Vec<&str> = CASES.iter().copied().filter(|c| opts.wants(c)).collect();
    let mut rep = Reporter::new("tcp", opts.json_only);
    for case in cases.iter().filter(|c| c.ends_with("memwire")) {
        in_memory(case, opts.quick, &mut rep);
    }
    let cases: Vec<&str> = cases.into_iter().filter(|c| c.ends_with("veth")).collect();
    match Scratch::create() {
        Ok(scratch) if !cases.is_empty() => veth(opts.quick, &scratch, &cases, &mut rep),
        Ok(_) => {}
        Err(Fail::Error(e) | Fail::Skip(e)) => {
            for case in &cases {
                rep.push(case, "exonet", metrics(case)[0], Outcome::Error(e.clone()));
            }
        }
    }
    for pair in [
        ("exonet-inproc", "linux"),
        ("exonet-inproc-busy", "linux-busy"),
        ("exonet-inproc-busy", "linux"),
        ("exonet", "linux"),
    ] {
        rep.goal(RTT, "us_rtt", pair, "at most 0.8x", |r| r <= 0.8);
    }
    for case in [TPUT, BULK] {
        for system in ["exonet-inproc", "exonet-inproc-busy", "exonet"] {
            let no_offload = (system, "linux-no-offload");
            rep.goal(case, "gbps", no_offload, "at least 1x", |r| r >= 1.0);
        }
        let offload = ("exonet-offload", "linux-offload");
        rep.goal(case, "gbps", offload, "at least 0.5x", |r| r >= 0.5);
    }
    for system in ["exonet-inproc", "exonet-inproc-busy", "exonet"] {
        rep.goal(CPS, "cps", (system, "linux"), "at least 1x", |r| r >= 1.0);
    }
    rep.print_table(
        &format!(
            "tcp: (Nx) = ratio to exonet; us_rtt: median, us_rtt_p99: 99th percentile, lower is \
             better; gbps, cps: higher is better; {}",
            if opts.quick { "--quick" } else { "full run" }
        ),
        &SYSTEMS,
        "exonet",
    );
    rep.exit_code()
}

/// A bulk transfer over memwire: clean, or with 1% of frames lost each way.
fn in_memory(case: &str, quick: bool, rep: &mut Reporter) {
    let bytes: u64 = if quick { 20 << 20 } else { 100 << 20 };
    let faults = if case == LOSS {
        Faults {
            loss_rate: 0.01,
            ..Faults::default()
        }
    } else {
        Faults::default()
    };
    for &system in systems(case) {
        rep.progress(&format!("{case}: {system}"));
        let mut config = StackConfig::default();
        match system {
            "exonet-newreno" => config.tcp.congestion = Congestion::NewReno,
            "exonet-nosack" => config.tcp.sack = false,
            _ => {}
        }
        if system == "exonet-inproc-busy" {
            config.busy_poll = Duration::from_micros(200);
        }
        let r = if case == RTT_MEMWIRE {
            let count = if quick { 2_000 } else { 20_000 };
            memwire::round_trips(&config, count, RTT_SIZE).map(Vec::from)
        } else if case == CPS_MEMWIRE {
            let count = if quick { 2_000 } else { 20_000 };
            memwire::connections(&config, count, REQUEST_SIZE).map(|c| vec![c])
        } else {
            memwire::transfer(&config, faults, bytes, 1)
                .map(|t| vec![t.gbps, t.retransmitted as f64, t.timeouts as f64])
        };
        rep.push_all(case, system, metrics(case), r);
    }
}

/// Sets the segmentation offloads of both ends of the pair.
fn offloads(net: &Net, on: bool) -> Result<(), Fail> {
    let state = if on { "on" } else { "off" };
    for i in 0..2 {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &net.namespaces[i], "ethtool", "-K"])
            .arg(&net.ifnames[i])
            .args(["tso", state, "gso", state, "gro", state]);
        peer::Peer::spawn(cmd, &[], "ethtool -K")?.finish(PATIENCE)?;
    }
    Ok(())
}

/// How many times each veth measurement runs (once with `--quick`): every
/// system of a case in turn, then again, so that a shift of the shared
/// machine's speed between two systems' turns (its round trips move between
/// two levels, for Linux's as for ours) weighs on the ratios as little as
/// possible. The median of the runs is reported.
const RUNS: usize = 3;

/// [`RUNS`] for `tcp-tput-veth`: a run of it takes a few seconds, and its
/// values spread the most. Between runs a quarter apart was common, for
/// Linux's as for ours (Linux without offloads 1.94–3.36 Gbit/s in ten
/// runs in a row), so that a median of three still fell on either side of
/// a ratio of 1 that the ten medians put at 1.15.
const TPUT_RUNS: usize = 7;

/// How many times `case` runs (once with `--quick`).
fn runs_of(case: &str, quick: bool) -> usize {
    match (quick, case) {
        (true, _) => 1,
        (false, TPUT) => TPUT_RUNS,
        (false, _) => RUNS,
    }
}

/// The runs of one (case, system), as measured.
#[derive(Default)]
struct Runs(Vec<Result<Vec<f64>, Fail>>);

impl Runs {
    /// Each metric's median over the runs that gave a value; the first error
    /// when none did.
    fn median(self) -> Result<Vec<f64>, Fail> {
        let ok: Vec<Vec<f64>> = self
            .0
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .cloned()
            .collect();
        match self.0.into_iter().find_map(Result::err) {
            Some(e) if ok.is_empty() => Err(e),
            _ => {
                let width = ok.iter().map(Vec::len).min().unwrap_or(0);
                Ok((0..width)
                    .map(|m| measure::median(ok.iter().map(|r| r[m]).collect()))
                    .collect())
            }
        }
    }
}

fn veth(quick: bool, scratch: &Scratch, cases: &[&str], rep: &mut Reporter) {
    let skip_all = |rep: &mut Reporter, why: &str| {
        for case in cases {
            for system in systems(case) {
                let skipped = Outcome::Skipped(why.to_string());
                rep.push(case, system, metrics(case)[0], skipped);
            }
        }
    };
    let Some(net) = Net::for_bench("veth", rep, skip_all) else {
        return;
    };
    let netns = [0, 1].map(|i| net.namespaces[i].as_str());
    let exonet_ips = [ENDS[0].exonet_ip, ENDS[1].exonet_ip];
    let kernel_ips = [ENDS[0].kernel_ip, ENDS[1].kernel_ip];
    let links = [0, 1].map(|i| format!("afxdp:{}", net.ifnames[i]));
    // Segmentation offload through AF_PACKET (frame by frame: a block's
    // hand-over timer would hold the ACKs back).
    let offload_links = [0, 1].map(|i| format!("afpacket:{}:frames", net.ifnames[i]));
    let mut ports = Ports(47300);
    for &case in cases {
        let job = Job::of(case, quick);
        let runs = runs_of(case, quick);
        let mut measured: Vec<(&str, Runs)> = systems(case)
            .iter()
            .map(|&system| (system, Runs::default()))
            .collect();
        let mut record = |system: &str, r: Result<Vec<f64>, Fail>| {
            if let Some((_, runs)) = measured.iter_mut().find(|(s, _)| *s == system) {
                runs.0.push(r);
            }
        };
        // An application on each of a pair of daemons.
        let on_daemons = |d: &Daemons, ports: &mut Ports| {
            let serve = [0, 1].map(|i| Some(Serve::Daemon(&d.sockets[i])));
            measure(Stack::Exonet, netns, exonet_ips, serve, ports, &job)
        };
        for run in 0..runs {
            let mut order: Vec<&str> = systems(case)
                .iter()
                .copied()
                .filter(|s| s.starts_with("exonet") && *s != "exonet-offload")
                .collect();
            // The daemons with and without direct send ports take turns at
            // running right after the busy-polling systems: whichever did
            // made a third fewer connections a second in some runs, with
            // the same daemons.
            let at = |order: &[&str], s: &str| order.iter().position(|&x| x == s);
            if let (1, Some(a), Some(b)) =
                (run % 2, at(&order, "exonet"), at(&order, "exonet-nodirect"))
            {
                order.swap(a, b);
            }
            for system in order {
                rep.progress(&format!("{case}: {system} (run {} of {runs})", run + 1));
                let r = match system {
                    // Daemons of their own, gone before the next system runs
                    // (an XDP program on the pair changes the kernel's path).
                    "exonet" | "exonet-nodirect" => {
                        let extra: &[&str] = match system {
                            "exonet" => &[],
                            _ => &["--no-direct"],
                        };
                        Daemons::start_with(
                            scratch.path(),
                            system,
                            links.clone(),
                            netns.map(Some),
                            exonet_ips,
                            extra,
                            true,
                        )
                        .and_then(|d| on_daemons(&d, &mut ports))
                    }
                    _ => {
                        let serve = [0, 1].map(|i| Some(Serve::Link(&links[i])));
                        measure(stack_of(system), netns, exonet_ips, serve, &mut ports, &job)
                    }
                };
                record(system, r);
            }
            if systems(case).contains(&"exonet-offload") {
                // Daemons of their own, once the others are gone.
                let system = "exonet-offload";
                rep.progress(&format!("{case}: {system} (run {} of {runs})", run + 1));
                let r = Daemons::start_with(
                    scratch.path(),
                    "tcp-offload",
                    offload_links.clone(),
                    netns.map(Some),
                    exonet_ips,
                    &[],
                    true,
                )
                .and_then(|d| on_daemons(&d, &mut ports));
                record(system, r);
            }
            for &system in systems(case).iter().filter(|s| s.starts_with("linux")) {
                rep.progress(&format!("{case}: {system} (run {} of {runs})", run + 1));
                let off = system == "linux-no-offload";
                let r = offloads(&net, !off).and_then(|()| {
                    measure(
                        stack_of(system),
                        netns,
                        kernel_ips,
                        [None; 2],
                        &mut ports,
                        &job,
                    )
                });
                if off {
                    // Back to the veth's default for what follows.
                    let _ = offloads(&net, true);
                }
                record(system, r);
            }
        }
        for (system, runs) in measured {
            rep.push_all(case, system, metrics(case), runs.median());
        }
    }
}

fn measure(
    stack: Stack,
    netns: [&str; 2],
    ips: [Ipv4Addr; 2],
    serve: [Option<Serve>; 2],
    ports: &mut Ports,
    job: &Job,
) -> Result<Vec<f64>, Fail> {
    let port = ports.next();
    // Side 1 listens; side 0 connects from an ephemeral port.
    let addr = [0, 1].map(|i| SocketAddrV4::new(ips[i], if i == 1 { port } else { 0 }));
    // A busy poller's CPU is its own (as DPDK's or Onload's spinning cores):
    // the two spinning sides on CPUs of their own, never one taking turns
    // with the other; the sleeping systems are left to the scheduler.
    let pinned = matches!(stack, Stack::ExonetInprocBusy | Stack::LinuxBusy) && two_cpus();
    let cmd = |i: usize, role: Role| -> Result<Command, Fail> {
        let mut c = peer::command(Some(netns[i]))?;
        c.arg("tcp-node")
            .arg("--stack")
            .arg(name(stack))
            .arg("--role")
            .arg(name(role))
            .arg("--local")
            .arg(addr[i].to_string())
            .arg("--remote")
            .arg(addr[1 - i].to_string())
            .arg("--size")
            .arg(job.size.to_string())
            .arg("--bytes")
            .arg(job.bytes.to_string())
            .arg("--transfers")
            .arg(job.transfers.to_string())
            .arg("--warmup-ms")
            .arg(job.phases.warmup.as_millis().to_string())
            .arg("--window-ms")
            .arg(job.phases.window.as_millis().to_string());
        if pinned {
            c.arg("--cpu").arg(i.to_string());
        }
        // A sleeping exonet listener has its SYNs answered below it, as
        // Linux's are in softirq. A spinning one answers them at no wake-up,
        // cheaper than the cookie it would check (20-25k against 18-20k
        // cps, interleaved).
        if role == Role::Serve && serve[i].is_some() && stack != Stack::ExonetInprocBusy {
            c.arg("--link-syn-cookies");
        }
        match serve[i] {
            Some(Serve::Daemon(socket)) => c.arg("--socket").arg(socket),
            Some(Serve::Link(link)) => c.arg("--link").arg(link),
            None => &mut c,
        };
        Ok(c)
    };
    let [passive, active] = job.roles;
    let (out_p, out_a) = run_pair(
        (cmd(1, passive)?, &name(passive)),
        (cmd(0, active)?, &name(active)),
        false,
        job.limit(),
    )?;
    let out = if passive == Role::Sink { out_p } else { out_a };
    let words: Vec<&str> = out.split_whitespace().collect();
    let nums: Vec<f64> = words
        .iter()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    match (words.first().copied(), &nums[..]) {
        (Some("rtt_ns"), [median, p99]) => Ok(vec![median / 1e3, p99 / 1e3]),
        (Some("received"), [bytes, secs]) if *secs > 0.0 && *bytes as u64 == job.bytes => {
            Ok(vec![bytes * 8.0 / secs / 1e9])
        }
        (Some("cps"), [cps]) => Ok(vec![*cps]),
        _ => Err(Fail::Error(format!("the measuring process said {out:?}"))),
    }
}

/// The suite's roles of `exonet bench-child` (see [`crate::bench::child`]).
#[derive(Debug, Subcommand)]
pub enum ChildRole {
    /// One side of a `tcp` measurement.
    TcpNode(node::TcpNodeArgs),
}

pub fn child(role: &ChildRole) -> Result<(), Fail> {
    match role {
        ChildRole::TcpNode(a) => node::node(a),
    }
}
