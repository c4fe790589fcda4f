//! `exonet ping`: ICMP echo from an application, on the protocol library's
//! `IcmpSocket`, printing as Linux's ping does.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use exonet_stack::{Events, IcmpSocket, Interest, Poll, StackConfig, Token};

use crate::tool::{self, Rtts};

#[derive(Debug, Args)]
pub struct PingArgs {
    /// The host to ping (IPv4 address or name).
    #[arg(value_parser = tool::host)]
    host: Ipv4Addr,
    /// The daemon's control socket (default as for `exonet daemon`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Echo requests to send.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    count: u16,
    /// Data bytes per request (larger than the MTU allows: sent in fragments).
    #[arg(long, default_value_t = 56, value_parser = clap::value_parser!(u16).range(0..=65507))]
    size: u16,
    /// Milliseconds between requests.
    #[arg(long, default_value_t = 1000)]
    interval: u64,
    /// Milliseconds to wait for the last reply.
    #[arg(long, default_value_t = 1000)]
    timeout: u64,
    /// The echo identifier (default: one the daemon picks).
    #[arg(long)]
    ident: Option<u16>,
}

pub fn run(args: &PingArgs) -> ExitCode {
    match ping(args) {
        Ok(0) => ExitCode::FAILURE,
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exonet ping: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Pings; returns the number of replies.
fn ping(args: &PingArgs) -> io::Result<u64> {
    let stack = tool::open_stack(args.socket.as_ref(), &StackConfig::default())?;
    let sock = IcmpSocket::bind(&stack, args.ident.unwrap_or(0))?;
    // Non-blocking, so that neither a send waiting for ARP nor a late reply
    // shifts the schedule; replies are awaited in `Poll`.
    sock.set_nonblocking(true)?;
    let mut poll = Poll::new(&stack);
    poll.register(&sock, Token(0), Interest::READABLE)?;
    let mut events = Events::new();

    let size = usize::from(args.size);
    // Linux ping's pattern: byte i is i.
    let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut buf = vec![0u8; size + 1];
    let (host, interval) = (args.host, Duration::from_millis(args.interval));
    println!("PING {host} ({host}) {size}({}) bytes of data.", size + 28);
    let start = Instant::now();
    let mut outstanding: HashMap<u16, Instant> = HashMap::new();
    let mut rtts = Rtts::default();
    let mut transmitted = 0u64;
    for seq in 0..args.count {
        let sent = Instant::now();
        transmitted += 1;
        match sock.send_echo(host, seq, &data) {
            Ok(()) => {
                outstanding.insert(seq, sent);
            }
            Err(e) => eprintln!("exonet ping: icmp_seq={seq}: {e}"),
        }
        let last = seq + 1 == args.count;
        let until = if last {
            Instant::now() + Duration::from_millis(args.timeout)
        } else {
            sent + interval
        };
        loop {
            loop {
                let e = match sock.recv_echo(&mut buf) {
                    Ok(e) => e,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                };
                let Some(at) = outstanding.remove(&e.seq) else {
                    continue; // A duplicate, or a reply to an earlier run.
                };
                let rtt = at.elapsed();
                if buf[..e.len] != data[..] {
                    println!(
                        "{} bytes from {}: icmp_seq={} (wrong data)",
                        e.len + 8,
                        e.from,
                        e.seq
                    );
                    continue;
                }
                rtts.push(rtt);
                println!(
                    "{} bytes from {}: icmp_seq={} time={:.3} ms",
                    e.len + 8,
                    e.from,
                    e.seq,
                    tool::ms(rtt)
                );
            }
            let now = Instant::now();
            if now >= until || (last && outstanding.is_empty()) {
                break;
            }
            poll.poll(&mut events, Some(until - now))?;
        }
    }
    let received = rtts.len() as u64;
    println!("\n--- {host} ping statistics ---");
    println!(
        "{transmitted} packets transmitted, {received} received, {}% packet loss, time {}ms",
        tool::loss_pct(transmitted, received),
        start.elapsed().as_millis()
    );
    if let Some(s) = rtts.summary() {
        println!(
            "rtt min/avg/max/p50/p99 = {:.3}/{:.3}/{:.3}/{:.3}/{:.3} ms",
            tool::ms(s.min),
            tool::ms(s.avg),
            tool::ms(s.max),
            tool::ms(s.p50),
            tool::ms(s.p99)
        );
    }
    Ok(received)
}
