//! `exonet bench udp`: UDP through exonet's sockets against Linux's.
//!
//! Output as every suite's (see [`crate::bench::report`]): one JSON line
//! per (case, system, metric), then on stderr a table with the ratio of
//! every value to exonet's, and whether the goals are met (`--json-only`
//! leaves only the JSON lines). Exit status 1 if any system reported an
//! error.
//!
//! # Cases and systems
//!
//! - `udp-rtt-memwire`, `us_rtt` and `us_rtt_p99`: round trip of a 4-byte
//!   datagram between two applications. `exonet`: two `exonet daemon
//!   --link memwire:RENDEZVOUS` on one in-memory cable, an application on
//!   each, all four separate processes, the applications' sockets sleeping
//!   at once while they wait (the library's default); `exonet-busy`: the
//!   same, spinning 200 us before they sleep; `linux-loopback`: two kernel
//!   UDP sockets on 127.0.0.1, for reference (the same two processes, no
//!   daemons, no wire).
//! - `udp-rtt-veth`, the same over a veth pair between two network
//!   namespaces: `exonet`, `exonet-busy`: an `exonet daemon --link
//!   afxdp:IFACE` and an application in each namespace; `linux`: kernel
//!   sockets, sleeping in the kernel while they wait; `linux-busy`: kernel
//!   sockets, non-blocking and busy-polled; `exonet-inproc`: no daemons,
//!   each application runs its own multiplexer on its end of the pair
//!   (`exonet_mux::InProcess`), driven by the socket's calls. Goal:
//!   exonet's median at most 0.8 times Linux's.
//! - `udp-tput-veth-64`, `udp-tput-veth-1472`, `mpps` and `gbps` (UDP
//!   payload bits): one-way throughput of 64- and 1472-byte datagrams over
//!   the same pair, counted by the receiver over a window after a warm-up;
//!   `exonet`, `exonet-inproc` as above, one datagram per call; `linux`
//!   sends with `sendmmsg` and receives with `recvmmsg`, batches of 32.
//!   The sender goes on until the receiver is done. Goal: exonet's packet rate of 64-byte datagrams at least twice
//!   Linux's.
//!
//! The veth cases need root; without it, or without veth pairs and
//! namespaces, they are reported as skipped. Nothing is pinned to a CPU.
//!
//! # Processes
//!
//! Both sides of a measurement are `exonet bench-child udp-node` processes
//! ([`node`]), in their namespaces; exonet's daemons are `exonet daemon`
//! processes ([`rig::Daemons`]), started for a case and killed after it.
//! All are reaped, killed if they outlive their time, and die with us. The
//! kernel's addresses on the pair are 10.77.90.1 and .2, exonet's 10.77.91.1
//! and .2 (each daemon's AF_XDP program takes only the frames of its
//! address and leaves Linux its own); over memwire exonet's are 10.77.92.1
//! and .2. Every measurement uses ports of its own, so that one never waits
//! for the previous one's to be reclaimed.
//!
//! # Measurement
//!
//! Round trips: after the first echo and a warm-up (0.2 s; 0.05 s with
//! `--quick`), every round trip of a window (1 s; 0.2 s) is timed with
//! `Instant`: the median and the 99th percentile. Throughput: the receiver
//! counts what arrives in a window (2 s; 0.3 s) that starts a warm-up
//! (0.3 s; 0.1 s) after its first datagram.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::bench::endpoint::veth::{Net, ENDS};
use crate::bench::report::{Fail, Outcome, Reporter};
use crate::bench::RunOpts;
use exonet::Serve;
use node::{Role, Stack};
use rig::{Daemons, Phases, Scratch, Side};

pub mod exonet;
mod node;
pub mod rig;

#[derive(Debug, Args)]
pub struct UdpArgs {
    #[command(flatten)]
    pub opts: RunOpts,
}

const RTT_MEMWIRE: &str = "udp-rtt-memwire";
const RTT_VETH: &str = "udp-rtt-veth";
/// The throughput cases and their payload sizes.
const TPUT: [(&str, usize); 2] = [("udp-tput-veth-64", 64), ("udp-tput-veth-1472", 1472)];
const CASES: [&str; 4] = [RTT_MEMWIRE, RTT_VETH, TPUT[0].0, TPUT[1].0];
/// In the order of the table's columns.
const SYSTEMS: [&str; 7] = [
    "exonet",
    "exonet-inproc",
    "exonet-inproc-busy",
    "exonet-busy",
    "linux",
    "linux-busy",
    "linux-loopback",
];
const RTT_METRICS: [&str; 2] = ["us_rtt", "us_rtt_p99"];
const TPUT_METRICS: [&str; 2] = ["mpps", "gbps"];
/// Round trips carry a sequence number and nothing else.
const RTT_SIZE: usize = 4;
const MEMWIRE_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 77, 92, 1), Ipv4Addr::new(10, 77, 92, 2)];

/// How long the phases of each kind of measurement last.
struct Plan {
    rtt: Phases,
    tput: Phases,
}

impl Plan {
    fn of(opts: &RunOpts) -> Plan {
        let ms = Duration::from_millis;
        if opts.quick {
            Plan {
                rtt: Phases {
                    warmup: ms(50),
                    window: ms(200),
                },
                tput: Phases {
                    warmup: ms(100),
                    window: ms(300),
                },
            }
        } else {
            Plan {
                rtt: Phases {
                    warmup: ms(200),
                    window: ms(1000),
                },
                tput: Phases {
                    warmup: ms(300),
                    window: ms(2000),
                },
            }
        }
    }
}

/// Ports of their own for each measurement's two sides.
struct Ports(u16);

impl Ports {
    fn next(&mut self) -> [u16; 2] {
        self.0 += 2;
        [self.0, self.0 + 1]
    }
}

pub fn run(args: &UdpArgs) -> ExitCode {
    let opts = &args.opts;
    if let Some(bad) = opts.cases.iter().find(|c| !CASES.contains(&c.as_str())) {
        eprintln!("unknown case {bad}; the cases are: {}", CASES.join(" "));
        return ExitCode::from(2);
    }
    let plan = Plan::of(opts);
    let mut rep = Reporter::new("udp", opts.json_only);
    let mut ports = Ports(47100);
    match Scratch::create() {
        Ok(scratch) => {
            if opts.wants(RTT_MEMWIRE) {
                memwire(&plan, &scratch, &mut ports, &mut rep);
            }
            let veth_cases: Vec<&str> = CASES[1..]
                .iter()
                .copied()
                .filter(|c| opts.wants(c))
                .collect();
            if !veth_cases.is_empty() {
                veth(&plan, &scratch, &mut ports, &veth_cases, &mut rep);
            }
        }
        Err(Fail::Error(e) | Fail::Skip(e)) => {
            for case in CASES.iter().filter(|c| opts.wants(c)) {
                rep.push(case, "exonet", "us_rtt", Outcome::Error(e.clone()));
            }
        }
    }
    goal(&mut rep, RTT_VETH, "us_rtt", "at most 0.8x", |r| r <= 0.8);
    goal(&mut rep, TPUT[0].0, "mpps", "at least 2x", |r| r >= 2.0);
    rep.print_table(
        &format!(
            "udp: (Nx) = ratio to exonet; us_rtt: median, us_rtt_p99: 99th percentile, \
             lower is better; mpps, gbps (UDP payload): higher is better; {}",
            if opts.quick { "--quick" } else { "full run" }
        ),
        &SYSTEMS,
        "exonet",
    );
    rep.exit_code()
}

/// Footer lines: each exonet system's `metric` over Linux's in `case`,
/// against the goal; sleeping systems against sleeping Linux, busy-polling
/// ones against busy-polling Linux (and against sleeping Linux, the kernel's
/// default), so that like is compared with like.
fn goal(rep: &mut Reporter, case: &str, metric: &str, want: &str, met: impl Fn(f64) -> bool) {
    let pairs = [
        ("exonet", "linux"),
        ("exonet-inproc", "linux"),
        ("exonet-inproc-busy", "linux-busy"),
        ("exonet-inproc-busy", "linux"),
    ];
    for pair in pairs {
        rep.goal(case, metric, pair, want, &met);
    }
}

/// The two sides: namespaces (if any), addresses, ports, who serves
/// exonet's endpoints.
fn sides<'a>(
    netns: [Option<&'a str>; 2],
    ips: [Ipv4Addr; 2],
    ports: [u16; 2],
    serve: [Option<Serve<'a>>; 2],
) -> [Side<'a>; 2] {
    [0, 1].map(|i| Side {
        netns: netns[i],
        addr: SocketAddrV4::new(ips[i], ports[i]),
        serve: serve[i],
    })
}

/// The daemons' sockets, as who serves each side.
fn by_daemons(d: &Daemons) -> [Option<Serve<'_>>; 2] {
    [0, 1].map(|i| Some(Serve::Daemon(&d.sockets[i])))
}

/// Median and 99th percentile round trip, in microseconds.
fn rtt(stack: Stack, sides: &[Side; 2], plan: &Plan) -> Result<[f64; 2], Fail> {
    let (_, out) = rig::pair(
        stack,
        [Role::Pong, Role::Ping],
        [&sides[0], &sides[1]],
        RTT_SIZE,
        plan.rtt,
    )?;
    let v: Vec<f64> = out
        .trim()
        .strip_prefix("rtt_ns ")
        .map(|v| v.split(' ').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    match v[..] {
        [median, p99] => Ok([median / 1e3, p99 / 1e3]),
        _ => Err(Fail::Error(format!("the ping process said {out:?}"))),
    }
}

/// Millions of datagrams and gigabits of payload per second at the
/// receiver.
fn tput(stack: Stack, sides: &[Side; 2], size: usize, plan: &Plan) -> Result<[f64; 2], Fail> {
    let (out, _) = rig::pair(
        stack,
        [Role::Recv, Role::Send],
        [&sides[0], &sides[1]],
        size,
        plan.tput,
    )?;
    let v: Vec<f64> = out
        .trim()
        .strip_prefix("received ")
        .map(|v| v.split(' ').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    match v[..] {
        [datagrams, bytes, secs] if secs > 0.0 && datagrams > 0.0 => {
            Ok([datagrams / secs / 1e6, bytes * 8.0 / secs / 1e9])
        }
        _ => Err(Fail::Error(format!("the receiving process said {out:?}"))),
    }
}

fn memwire(plan: &Plan, scratch: &Scratch, ports: &mut Ports, rep: &mut Reporter) {
    let rendezvous = scratch.path().join("memwire.sock");
    let link = format!("memwire:{}", rendezvous.display());
    let mut daemons = Lazy::new(|| {
        Daemons::start(
            scratch.path(),
            "memwire",
            [link.clone(), link.clone()],
            [None, None],
            MEMWIRE_IPS,
        )
    });
    let systems = [
        ("exonet-inproc", Stack::ExonetInproc),
        ("exonet-inproc-busy", Stack::ExonetInprocBusy),
        ("exonet", Stack::Exonet),
        ("exonet-busy", Stack::ExonetBusy),
        ("linux-loopback", Stack::Linux),
    ];
    for (n, (system, stack)) in systems.into_iter().enumerate() {
        rep.progress(&format!("{RTT_MEMWIRE}: {system}"));
        // In process, each side's multiplexer opens the cable itself: a
        // cable of their own, met at a rendezvous of its own.
        let own = scratch.path().join(format!("inproc-{n}.sock"));
        let own = format!("memwire:{}", own.display());
        let r = if matches!(stack, Stack::ExonetInproc | Stack::ExonetInprocBusy) {
            let s = sides(
                [None, None],
                MEMWIRE_IPS,
                ports.next(),
                [0, 1].map(|_| Some(Serve::Link(&own))),
            );
            rtt(stack, &s, plan)
        } else if stack.is_exonet() {
            daemons.get().and_then(|d| {
                let s = sides([None, None], MEMWIRE_IPS, ports.next(), by_daemons(d));
                rtt(stack, &s, plan)
            })
        } else {
            let s = sides(
                [None, None],
                [Ipv4Addr::LOCALHOST; 2],
                ports.next(),
                [None; 2],
            );
            rtt(stack, &s, plan)
        };
        rep.push_all(RTT_MEMWIRE, system, &RTT_METRICS, r);
    }
}

/// Daemons started when first needed, then shared (or their failure
/// told again).
pub struct Lazy<F> {
    start: F,
    daemons: Option<Result<Daemons, Fail>>,
}

impl<F: FnMut() -> Result<Daemons, Fail>> Lazy<F> {
    pub fn new(start: F) -> Lazy<F> {
        Lazy {
            start,
            daemons: None,
        }
    }

    pub fn get(&mut self) -> Result<&Daemons, Fail> {
        self.daemons
            .get_or_insert_with(&mut self.start)
            .as_ref()
            .map_err(Fail::clone)
    }
}

/// The systems of a veth case. `exonet-inproc` comes first: its link
/// cannot attach while the daemons' are attached to the same interfaces.
fn veth_systems(case: &str) -> &'static [(&'static str, Stack)] {
    if case == RTT_VETH {
        &[
            ("exonet-inproc", Stack::ExonetInproc),
            ("exonet-inproc-busy", Stack::ExonetInprocBusy),
            ("exonet", Stack::Exonet),
            ("exonet-busy", Stack::ExonetBusy),
            ("linux", Stack::Linux),
            ("linux-busy", Stack::LinuxBusy),
        ]
    } else {
        &[
            ("exonet-inproc", Stack::ExonetInproc),
            ("exonet-inproc-busy", Stack::ExonetInprocBusy),
            ("exonet", Stack::Exonet),
            ("linux", Stack::Linux),
            ("linux-busy", Stack::LinuxBusy),
        ]
    }
}

fn veth(plan: &Plan, scratch: &Scratch, ports: &mut Ports, cases: &[&str], rep: &mut Reporter) {
    let skip_all = |rep: &mut Reporter, why: &str| {
        for case in cases {
            for (system, _) in veth_systems(case) {
                let skipped = Outcome::Skipped(why.to_string());
                rep.push(case, system, metrics(case)[0], skipped);
            }
        }
    };
    let Some(net) = Net::for_bench("veth", rep, skip_all) else {
        return;
    };
    let netns = [0, 1].map(|i| Some(net.namespaces[i].as_str()));
    let exonet_ips = [ENDS[0].exonet_ip, ENDS[1].exonet_ip];
    let kernel_ips = [ENDS[0].kernel_ip, ENDS[1].kernel_ip];
    let links = [0, 1].map(|i| format!("afxdp:{}", net.ifnames[i]));
    for &case in cases {
        // Daemons for the case's exonet systems, gone before the next
        // case's exonet-inproc.
        let mut daemons =
            Lazy::new(|| Daemons::start(scratch.path(), "veth", links.clone(), netns, exonet_ips));
        for &(system, stack) in veth_systems(case) {
            rep.progress(&format!("{case}: {system}"));
            let mut measure = |ips, serve| {
                let s = sides(netns, ips, ports.next(), serve);
                match TPUT.iter().find(|t| t.0 == case) {
                    Some(&(_, size)) => tput(stack, &s, size, plan),
                    None => rtt(stack, &s, plan),
                }
            };
            let r = match stack {
                Stack::ExonetInproc | Stack::ExonetInprocBusy => {
                    measure(exonet_ips, [0, 1].map(|i| Some(Serve::Link(&links[i]))))
                }
                Stack::Exonet | Stack::ExonetBusy => daemons
                    .get()
                    .and_then(|d| measure(exonet_ips, by_daemons(d))),
                Stack::Linux | Stack::LinuxBusy => measure(kernel_ips, [None; 2]),
            };
            rep.push_all(case, system, &metrics(case), r);
        }
    }
}

fn metrics(case: &str) -> [&'static str; 2] {
    if case.starts_with("udp-rtt") {
        RTT_METRICS
    } else {
        TPUT_METRICS
    }
}

/// The suite's roles of `exonet bench-child` (see [`crate::bench::child`]).
#[derive(Debug, Subcommand)]
pub enum ChildRole {
    /// One side of a `udp` measurement, on a UDP socket.
    UdpNode(node::NodeArgs),
}

pub fn child(role: &ChildRole) -> Result<(), Fail> {
    match role {
        ChildRole::UdpNode(a) => node::node(a),
    }
}
