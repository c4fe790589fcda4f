//! `exonet bench endpoint`: the endpoint's rings between two processes,
//! against the kernel's ways for two processes to talk, and raw frames
//! between two multiplexers over a veth pair, against kernel UDP.
//!
//! Output as every suite's (see [`crate::bench::report`]): one JSON line per
//! (case, system), then on stderr two tables, each with the ratio of every
//! value to the group's exonet system (`--json-only` leaves only the JSON
//! lines). Exit status 1 if any system reported an error.
//!
//! # Cases and systems
//!
//! - `ring-rtt`, `ns_rtt`: round-trip time of a 64-byte message between
//!   two processes. `exonet`: the multiplexer's side of a segment here, the
//!   application's side in a child process, the message inline on rx and
//!   back inline on tx ([`ring`]); `unix-seqpacket`, `pipe`,
//!   `linux-udp-loopback`: the same between the same two processes through
//!   the kernel ([`kernel`]). Everyone busy-polls; the `-blocking` systems
//!   sleep while they wait instead: `exonet-blocking` as a stack through a
//!   daemon and an idle daemon do (the application in `FUTEX_WAIT`, woken
//!   by the multiplexer's notify; the multiplexer on its doorbell, rung by
//!   the application's kick), the kernel's in `poll`.
//! - `ring-mpps`, `mpps`: millions of descriptors (of 64-byte frames) per
//!   second from this process to a child through the rx ring, their buffers
//!   coming back on the free ring, in batches ([`ring`]). System `exonet`.
//! - `raw-rtt-veth`, `us_rtt`: round-trip time of a 64-byte UDP frame
//!   between two processes in two network namespaces joined by a veth pair:
//!   `exonet-afxdp`, `exonet-afpacket` (TPACKET_V3), `exonet-afpacket-v2`
//!   (TPACKET_V2) (a multiplexer and an application in each process),
//!   `linux-udp` (kernel sockets) ([`veth`]). Needs root; without it, or
//!   without veth pairs and namespaces, all four are reported as skipped.
//!
//! # Processes
//!
//! The other process is this binary again, run as the hidden `exonet
//! bench-child <role>` ([`ChildArgs`]), with the descriptors it needs left
//! open under their numbers (given as arguments), SIGKILL as its
//! parent-death signal, and a lifetime it checks itself; we always reap
//! it, and kill it if it does not finish in time ([`peer::Peer`]). Every
//! busy-wait, on either side, gives up after a few seconds without
//! progress ([`peer::Patience`]). Nothing is pinned to a CPU: with two
//! busy-polling processes on a machine of two CPUs, the scheduler places
//! them.
//!
//! # Measurement
//!
//! [`measure::ns_per_op`]: after a first exchange (which also says the
//! child is up), batches of round trips (descriptors) timed with `Instant`,
//! the batch length calibrated so that each (case, system) takes about
//! 200 ms (30 ms with `--quick`), after a warm-up batch; the median over 7
//! (5) repetitions. For `raw-rtt-veth` the pinging child times itself the
//! same way and prints its median.
//!
//! [`measure::ns_per_op`]: crate::bench::measure::ns_per_op

use std::fmt;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::bench::report::{Fail, Outcome, Reporter};
use crate::bench::RunOpts;

pub mod kernel;
pub mod peer;
mod ring;
pub mod veth;

#[derive(Debug, Args)]
pub struct EndpointArgs {
    #[command(flatten)]
    pub opts: RunOpts,
}

/// Bytes of a `ring-rtt` message and of a `ring-mpps` frame.
const MSG: usize = 64;

const CASES: [&str; 3] = ["ring-rtt", "ring-mpps", veth::CASE];
/// `ring-rtt`'s systems, in the order of the table's columns: the kernel
/// paths busy-polled like the rings, then sleeping in `poll` as
/// applications usually wait on them.
const RING_SYSTEMS: [&str; 8] = [
    "exonet",
    "unix-seqpacket",
    "pipe",
    "linux-udp-loopback",
    "exonet-blocking",
    "unix-seqpacket-blocking",
    "pipe-blocking",
    "linux-udp-loopback-blocking",
];

/// For `map_err`: any error as `Fail::Error("<what>: <e>")`.
pub fn error<E: fmt::Display>(what: &str) -> impl FnOnce(E) -> Fail + '_ {
    move |e| Fail::Error(format!("{what}: {e}"))
}

pub fn run(args: &EndpointArgs) -> ExitCode {
    let opts = &args.opts;
    if let Some(bad) = opts.cases.iter().find(|c| !CASES.contains(&c.as_str())) {
        eprintln!("unknown case {bad}; the cases are: {}", CASES.join(" "));
        return ExitCode::from(2);
    }
    let budget = opts.budget();
    let mut rep = Reporter::new("endpoint", opts.json_only);
    if opts.wants("ring-rtt") {
        for system in RING_SYSTEMS {
            rep.progress(&format!("ring-rtt: {system}"));
            let r = match system {
                "exonet" => ring::rtt(&budget, false),
                "exonet-blocking" => ring::rtt(&budget, true),
                peer => kernel::rtt(peer, &budget),
            };
            rep.push("ring-rtt", system, "ns_rtt", Outcome::of(r));
        }
    }
    if opts.wants("ring-mpps") {
        rep.progress("ring-mpps: exonet");
        rep.push(
            "ring-mpps",
            "exonet",
            "mpps",
            Outcome::of(ring::mpps(&budget)),
        );
    }
    if opts.wants(veth::CASE) {
        veth::run(&budget, &mut rep);
    }
    rep.print_table(
        &format!(
            "endpoint, between two processes: median of {} repetitions; (Nx) = ratio to exonet; \
             ns_rtt: lower is better, mpps: higher is better",
            budget.reps
        ),
        &RING_SYSTEMS,
        "exonet",
    );
    rep.print_table(
        &format!(
            "endpoint, over veth: median of {} repetitions; (Nx) = ratio to exonet-afxdp; \
             lower is better",
            budget.reps
        ),
        &veth::SYSTEMS.map(veth::System::name),
        "exonet-afxdp",
    );
    rep.exit_code()
}

/// The suite's roles of `exonet bench-child` (see [`crate::bench::child`]).
#[derive(Debug, Subcommand)]
pub enum ChildRole {
    /// `ring-rtt`, `exonet`: the application, echoing rx to tx.
    RingEcho(ring::RingArgs),
    /// `ring-mpps`: the application, giving the buffers of rx back on free.
    RingSink(ring::RingArgs),
    /// `ring-rtt`'s kernel peers: echoing one descriptor to another.
    FdEcho(kernel::EchoArgs),
    /// `raw-rtt-veth`: one side of the ping-pong, in its namespace.
    VethNode(veth::NodeArgs),
}

pub fn child(role: &ChildRole) -> Result<(), Fail> {
    match role {
        ChildRole::RingEcho(a) => ring::echo(a),
        ChildRole::RingSink(a) => ring::sink(a),
        ChildRole::FdEcho(a) => kernel::echo(a),
        ChildRole::VethNode(a) => veth::node(a),
    }
}
