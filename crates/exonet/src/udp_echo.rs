//! `exonet udp-echo`: a UDP echo server (RFC 862) on the protocol library's
//! `UdpSocket`. It stops on SIGINT or SIGTERM (or after `--count` datagrams)
//! and prints its stack's counters as one JSON line; SIGUSR1 prints them
//! without stopping, so a test can watch memory drain.

use std::io;
use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use exonet_shm::control::{Below, HandlerSpec};
use exonet_stack::ipv4_rx::Ipv4Drop;
use exonet_stack::{StackStats, UdpSocket};

use crate::tool;

#[derive(Debug, Args)]
pub struct UdpEchoArgs {
    #[command(flatten)]
    at: tool::EchoAt,
    /// Microseconds a blocked read spins before it sleeps.
    #[arg(long, default_value_t = 0)]
    busy_poll: u64,
    /// Milliseconds an incomplete fragmented datagram is kept (default: the
    /// library's, 30 s).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    reasm_timeout: Option<u64>,
    /// A handler (ASH) to install on the socket: a WebAssembly module,
    /// binary or text (e.g. crates/ash/handlers/udp_echo.wat); what it
    /// leaves is echoed as usual.
    #[arg(long, value_name = "FILE")]
    handler: Option<std::path::PathBuf>,
    /// Bytes of the segment to grant the handler as its window.
    #[arg(long, default_value_t = 0, requires = "handler")]
    window: usize,
    /// Protocol layers the multiplexer runs below the handler: with `udp`
    /// it checks the headers, the handler sees the payload (e.g.
    /// crates/ash/handlers/udp_echo_payload.wat), and a datagram whose
    /// checksum fails is dropped.
    #[arg(long, value_enum, default_value_t = BelowArg::Nothing, requires = "handler")]
    below: BelowArg,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum BelowArg {
    Nothing,
    Udp,
}

static DUMP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_dump(_: libc::c_int) {
    DUMP.store(true, Ordering::Relaxed);
}

/// How long an echo may wait for its sender's address to resolve before it
/// is dropped (a spoofed source must not stall the server for ARP's give-up).
const SEND_WAIT: Duration = Duration::from_millis(500);

pub fn run(args: &UdpEchoArgs) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exonet udp-echo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &UdpEchoArgs) -> io::Result<()> {
    tool::stop_on_signals()?;
    tool::on_signal(libc::SIGUSR1, on_dump)?;
    let mut config = tool::busy_poll(args.busy_poll);
    if let Some(ms) = args.reasm_timeout {
        config.reasm.timeout = Duration::from_millis(ms);
    }
    config.window = args.window;
    let stack = tool::open_stack(args.at.socket.as_ref(), &config)?;
    let ip = args.at.ip.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let sock = UdpSocket::bind(&stack, (ip, args.at.port))?;
    if let Some(path) = &args.handler {
        let module = std::fs::read(path)
            .map_err(|e| io::Error::new(e.kind(), format!("handler {}: {e}", path.display())))?;
        let window = stack.window().map(|w| (w.offset(), w.len() as u32));
        let below = match args.below {
            BelowArg::Nothing => Below::Nothing,
            BelowArg::Udp => Below::Udp,
        };
        sock.install_handler(&HandlerSpec {
            module,
            window,
            below,
            ..HandlerSpec::default()
        })?;
    }
    sock.set_read_timeout(Some(tool::TICK))?;
    sock.set_write_timeout(Some(SEND_WAIT))?;
    match &args.handler {
        Some(path) => eprintln!(
            "exonet udp-echo: listening on {}, handler {} installed",
            sock.local_addr()?,
            path.display()
        ),
        None => eprintln!("exonet udp-echo: listening on {}", sock.local_addr()?),
    }
    let limit = args.at.count.unwrap_or(u64::MAX);
    let mut counts = Counts::default();
    let mut buf = vec![0u8; 65536];
    while counts.answered < limit && !tool::stopped() {
        if DUMP.swap(false, Ordering::Relaxed) {
            println!("{}", json(&counts, &stack.stats()));
        }
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if fatal(&e) => return Err(e),
            // The tick passed, or a signal came.
            Err(_) => continue,
        };
        match sock.send_to(&buf[..n], from) {
            Ok(_) => counts.answered += 1,
            Err(e) if fatal(&e) => return Err(e),
            // The peer did not resolve, or no buffer came in time: that
            // echo is lost, as on a busy host.
            Err(_) => counts.send_errors += 1,
        }
    }
    println!("{}", json(&counts, &stack.stats()));
    Ok(())
}

/// Errors that end the server: the daemon went away, or the endpoint broke.
/// Others concern one datagram or one peer.
fn fatal(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotConnected | io::ErrorKind::Other)
}

#[derive(Debug, Default)]
struct Counts {
    answered: u64,
    send_errors: u64,
}

fn drop_name(d: Ipv4Drop) -> &'static str {
    match d {
        Ipv4Drop::Truncated => "ipv4_truncated",
        Ipv4Drop::NotIpv4 => "ipv4_not_ipv4",
        Ipv4Drop::BadVersion => "ipv4_bad_version",
        Ipv4Drop::BadHeaderLen => "ipv4_bad_header_len",
        Ipv4Drop::BadTotalLen => "ipv4_bad_total_len",
        Ipv4Drop::BadChecksum => "ipv4_bad_checksum",
        Ipv4Drop::BadSource => "ipv4_bad_source",
        Ipv4Drop::NotForUs => "ipv4_not_for_us",
        Ipv4Drop::LinkBroadcastUnicast => "ipv4_link_broadcast_unicast",
    }
}

/// The counters as one flat JSON object.
fn json(c: &Counts, s: &StackStats) -> String {
    let r = &s.reasm;
    let mut fields: Vec<(&str, u64)> = vec![
        ("answered", c.answered),
        ("send_errors", c.send_errors),
        ("udp_received", s.udp.received),
        ("udp_delivered", s.udp.delivered),
        ("udp_bad_length", s.udp.bad_length),
        ("udp_no_port", s.udp.no_port),
        ("bad_checksum", s.sockets.bad_checksum),
        ("queue_full", s.sockets.queue_full),
        ("not_peer", s.sockets.not_peer),
        ("no_socket", s.sockets.no_socket),
        ("icmp_received", s.icmp.received),
        ("icmp_errors", s.icmp.errors),
        ("icmp_errors_unclaimed", s.sockets.icmp_errors_unclaimed),
        ("ipv4_received", s.ipv4.received),
        ("ipv4_delivered", s.ipv4.delivered),
        ("ipv4_dropped", s.ipv4.total_dropped()),
    ];
    fields.extend(
        Ipv4Drop::ALL
            .iter()
            .map(|&d| (drop_name(d), s.ipv4.dropped(d))),
    );
    fields.extend([
        ("fragments", r.fragments),
        ("reassembled", r.reassembled),
        ("reasm_timed_out", r.timed_out),
        ("reasm_overlap", r.overlap),
        ("reasm_poisoned", r.poisoned),
        ("reasm_duplicate", r.duplicate),
        ("reasm_too_long", r.too_long),
        ("reasm_unaligned", r.unaligned),
        ("reasm_length_conflict", r.length_conflict),
        ("reasm_empty", r.empty),
        ("reasm_no_memory", r.no_memory),
        ("reasm_too_many_datagrams", r.too_many_datagrams),
        ("reasm_too_many_fragments", r.too_many_fragments),
        ("reasm_bytes", s.reasm_bytes as u64),
        ("queued", s.queued as u64),
    ]);
    tool::json_object(&fields)
}
