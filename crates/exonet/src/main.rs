//! `exonet`: the one binary of exonet (see DESIGN.md "The parts").
//!
//! Each subcommand lives in its own module and is one variant of [`Command`];
//! `main` only parses the command line and dispatches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod daemon;
mod demo;
mod filter_cmd;
mod http_get;
mod http_serve;
mod ping;
mod raw_echo;
mod stats_cmd;
mod tcp_bulk;
mod tcp_pingpong;
mod tool;
mod udp_echo;
mod udp_send;

#[derive(Debug, Parser)]
#[command(name = "exonet", version, about = "User-level networking for Linux")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The tour: DPF on a realistic traffic mix, then two hosts on an
    /// in-memory cable with applications on sockets (needs no privileges;
    /// `--veth`, against Linux, needs root).
    Demo(demo::DemoArgs),
    /// Compile a filter (tcpdump or DPF syntax); explain it or run it over a
    /// capture file.
    Filter(filter_cmd::FilterArgs),
    /// Measure exonet and its peers side by side (JSON lines on stdout).
    Bench(bench::BenchArgs),
    /// Run the multiplexer on a link and serve applications over the
    /// control socket.
    Daemon(daemon::DaemonArgs),
    /// Print the daemon's counters per endpoint and per channel.
    Stats(stats_cmd::StatsArgs),
    /// An application that answers UDP frames on a port, raw.
    RawEcho(raw_echo::RawEchoArgs),
    /// Ping a host from an application (ICMP echo on the protocol library).
    Ping(ping::PingArgs),
    /// A UDP echo server on the protocol library; prints its counters as
    /// JSON when it stops.
    UdpEcho(udp_echo::UdpEchoArgs),
    /// Send numbered datagrams to a UDP echo server and measure round trips.
    UdpSend(udp_send::UdpSendArgs),
    /// TCP round trips: an echo server (`--listen`), or a client sending one
    /// message at a time and printing RTT percentiles.
    TcpPingpong(tcp_pingpong::TcpPingpongArgs),
    /// TCP throughput: `send` a checkable byte pattern, or `recv` (and
    /// `--verify`) it.
    TcpBulk(tcp_bulk::TcpBulkArgs),
    /// A static HTTP/1.1 file server (GET and HEAD, keep-alive).
    HttpServe(http_serve::HttpServeArgs),
    /// Fetch an http:// URL; the body to a file or stdout.
    HttpGet(http_get::HttpGetArgs),
    /// The other process of a two-process benchmark, started by `exonet
    /// bench`.
    #[command(hide = true)]
    BenchChild(bench::ChildArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Filter(args) => filter_cmd::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Daemon(args) => daemon::run(&args),
        Command::Stats(args) => stats_cmd::run(&args),
        Command::RawEcho(args) => raw_echo::run(&args),
        Command::Ping(args) => ping::run(&args),
        Command::UdpEcho(args) => udp_echo::run(&args),
        Command::UdpSend(args) => udp_send::run(&args),
        Command::TcpPingpong(args) => tcp_pingpong::run(&args),
        Command::TcpBulk(args) => tcp_bulk::run(&args),
        Command::HttpServe(args) => http_serve::run(&args),
        Command::HttpGet(args) => http_get::run(&args),
        Command::BenchChild(args) => bench::child(&args),
    }
}
