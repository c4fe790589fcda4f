//! `exonet bench <suite>`: benchmarks that measure exonet and its peers side by
//! side in one run (DESIGN.md "Tests and measurements").
//!
//! Every suite prints one JSON object per line on stdout as each measurement
//! finishes ([`report`]), e.g.
//! `{"suite":"dpf","case":"tcp10","system":"exonet-jit","metric":"ns_per_pkt","value":3.1}`,
//! so stdout is always plain JSON lines; progress and the human-readable table
//! go to stderr (`--json-only` silences them). The exit status is 1 when any
//! system reported an `"error"` line (e.g. it classified a frame differently
//! from the others), 0 otherwise; `"skipped"` lines are not failures.
//!
//! Layout:
//! - [`report`]: the JSON line format and the summary table;
//! - [`measure`]: adaptive timing (warm-up, batches, median of repetitions);
//! - [`frames`]: a small Ethernet/IPv4/TCP frame builder;
//! - [`bpf`]: a minimal eBPF ELF loader over the raw bpf(2) syscall;
//! - [`dpf`]: the `dpf` suite (DPF against libpcap, hand-written Rust, eBPF);
//! - [`endpoint`]: the `endpoint` suite (the rings between two processes
//!   against Unix sockets, pipes and UDP; raw frames over veth with AF_XDP
//!   and AF_PACKET against kernel UDP), and the processes it starts;
//! - [`udp`]: the `udp` suite (exonet's UDP sockets against Linux's, over
//!   memwire and veth);
//! - [`tcp`]: the `tcp` suite (exonet's TCP against Linux's over veth);
//! - [`ash`]: the `ash` suite (dynamic ILP against separate and
//!   hand-integrated loops).

use std::process::ExitCode;

use clap::{Args, Subcommand};

use report::Fail;

pub mod ash;
pub mod ash_handlers;
pub mod bpf;
pub mod dpf;
pub mod endpoint;
pub mod frames;
pub mod measure;
pub mod report;
pub mod tcp;
pub mod udp;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub suite: Suite,
}

#[derive(Debug, Subcommand)]
pub enum Suite {
    /// Packet demultiplexing: DPF (JIT, interpreter) against libpcap,
    /// hand-written Rust and a hand-written eBPF program.
    Dpf(dpf::DpfArgs),
    /// The endpoint: its rings between two processes against Unix sockets,
    /// pipes and UDP over loopback; raw frames between two multiplexers over
    /// veth (AF_XDP, AF_PACKET) against kernel UDP.
    Endpoint(endpoint::EndpointArgs),
    /// UDP through exonet's sockets (a daemon and an application on each
    /// side) against Linux's: round trips over memwire and veth, packet
    /// and bit rates over veth.
    Udp(udp::UdpArgs),
    /// TCP through exonet's sockets against Linux's kernel TCP over veth:
    /// round trips, throughput (with and without Linux's offloads) and
    /// connections per second.
    Tcp(tcp::TcpArgs),
    /// Application-specific handlers: dynamic ILP (a pipe list compiled
    /// into one copying loop) against separate passes, a hand-integrated
    /// loop and memcpy (the ASH paper's Table 5).
    Ash(ash::AshArgs),
}

/// Options every suite takes.
#[derive(Debug, Clone, Args)]
pub struct RunOpts {
    /// A short run (about 30 ms per case and system instead of 200 ms).
    #[arg(long)]
    pub quick: bool,
    /// Print only the JSON lines: no progress, no table (errors still go to stderr).
    #[arg(long)]
    pub json_only: bool,
    /// Run only these cases (exact names; may be repeated).
    #[arg(long = "case", value_name = "NAME")]
    pub cases: Vec<String>,
}

impl RunOpts {
    /// Whether the case `name` was selected.
    pub fn wants(&self, name: &str) -> bool {
        self.cases.is_empty() || self.cases.iter().any(|c| c == name)
    }

    /// The time budget of one (case, system) measurement.
    pub fn budget(&self) -> measure::Budget {
        if self.quick {
            measure::Budget::quick()
        } else {
            measure::Budget::normal()
        }
    }
}

pub fn run(args: &BenchArgs) -> ExitCode {
    match &args.suite {
        Suite::Dpf(a) => dpf::run(a),
        Suite::Endpoint(a) => endpoint::run(a),
        Suite::Udp(a) => udp::run(a),
        Suite::Tcp(a) => tcp::run(a),
        Suite::Ash(a) => ash::run(a),
    }
}

/// `exonet bench-child`: the other process of a measurement.
#[derive(Debug, Args)]
pub struct ChildArgs {
    #[command(subcommand)]
    role: ChildRole,
}

#[derive(Debug, Subcommand)]
enum ChildRole {
    #[command(flatten)]
    Endpoint(endpoint::ChildRole),
    #[command(flatten)]
    Udp(udp::ChildRole),
    #[command(flatten)]
    Tcp(tcp::ChildRole),
}

/// Runs a child's role. Exit status 0, [`endpoint::peer::EXIT_SKIP`] if it
/// cannot run here, 1 on any other failure; the reason on stderr.
pub fn child(args: &ChildArgs) -> ExitCode {
    let r = match &args.role {
        ChildRole::Endpoint(role) => endpoint::child(role),
        ChildRole::Udp(role) => udp::child(role),
        ChildRole::Tcp(role) => tcp::child(role),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Skip(why)) => {
            eprintln!("{why}");
            ExitCode::from(endpoint::peer::EXIT_SKIP)
        }
        Err(Fail::Error(e)) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
