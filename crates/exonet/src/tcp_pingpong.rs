//! `exonet tcp-pingpong`: TCP round trips. With `--listen` it is an echo
//! server (a thread per connection, bounded); otherwise it connects, sends
//! one message at a time, reads its full echo back and prints the round
//! trips' percentiles, as `udp-send` does for datagrams. The server prints
//! its stack's counters as one JSON line on SIGUSR1 and when it stops, as
//! `udp-echo` does.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use exonet_stack::tcp::TcpStats;
use exonet_stack::{Stack, TcpListener, TcpStream};

use crate::tool::{self, Patient, Rtts, Slots};

/// Connections an echo server serves at once; more are closed at once.
const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, Args)]
pub struct TcpPingpongArgs {
    /// The echo server (without --listen).
    #[arg(
        value_name = "HOST:PORT",
        value_parser = tool::host_port,
        required_unless_present = "listen",
        conflicts_with = "listen"
    )]
    target: Option<SocketAddrV4>,
    /// Be the echo server.
    #[arg(long)]
    listen: bool,
    /// The port to listen on (with --listen).
    #[arg(long, default_value_t = 7, requires = "listen")]
    port: u16,
    /// The address to listen on (default: all of the daemon's).
    #[arg(long, requires = "listen")]
    ip: Option<Ipv4Addr>,
    /// The daemon's control socket (default as for `exonet daemon`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Messages to send.
    #[arg(long, conflicts_with = "listen", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Bytes per message.
    #[arg(long, conflicts_with = "listen", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    size: u32,
    /// Milliseconds to wait for the connection and for each echo.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Microseconds a blocked call spins before it sleeps.
    #[arg(long, default_value_t = 0)]
    busy_poll: u64,
    /// One JSON object instead of text.
    #[arg(long, conflicts_with = "listen")]
    json: bool,
}

pub fn run(args: &TcpPingpongArgs) -> ExitCode {
    let r = match args.target {
        Some(target) => ping_pong(args, target),
        None => serve(args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exonet tcp-pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

static DUMP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_dump(_: libc::c_int) {
    DUMP.store(true, Ordering::Relaxed);
}

/// The server's connections, for the counters only `TcpStream::info` has
/// (challenge ACKs, PAWS): the live ones by number, and the sums of those
/// that ended.
#[derive(Default)]
struct Conns {
    live: HashMap<u64, Arc<TcpStream>>,
    next: u64,
    ended: ConnCounts,
}

#[derive(Debug, Default, Clone, Copy)]
struct ConnCounts {
    challenge_acks: u64,
    challenge_acks_suppressed: u64,
    paws_rejected: u64,
}

impl ConnCounts {
    fn add(&mut self, s: &TcpStats) {
        self.challenge_acks += s.challenge_acks;
        self.challenge_acks_suppressed += s.challenge_acks_suppressed;
        self.paws_rejected += s.paws_rejected;
    }
}

impl Conns {
    fn add(&mut self, s: Arc<TcpStream>) -> u64 {
        self.next += 1;
        self.live.insert(self.next, s);
        self.next
    }

    fn end(&mut self, id: u64) {
        if let Some(s) = self.live.remove(&id) {
            // A connection that was reset may have no state left to report.
            if let Ok(i) = s.info() {
                self.ended.add(&i.stats);
            }
        }
    }

    fn counts(&self) -> ConnCounts {
        let mut c = self.ended;
        for s in self.live.values() {
            if let Ok(i) = s.info() {
                c.add(&i.stats);
            }
        }
        c
    }
}

/// The stack's TCP counters and the connections' own, as one flat JSON
/// object (the names as `udp-echo`'s).
fn json(stack: &Stack, conns: &Mutex<Conns>) -> String {
    let c = conns.lock().unwrap_or_else(|e| e.into_inner()).counts();
    let s = stack.stats();
    let t = &s.tcp;
    let fields: [(&str, u64); 23] = [
        ("tcp_segments", t.segments),
        ("tcp_bad_checksum", t.bad_checksum),
        ("tcp_malformed", t.malformed),
        ("tcp_resets_sent", t.resets_sent),
        ("tcp_syn_dropped", t.syn_dropped),
        ("tcp_syn_cookies_sent", t.syn_cookies_sent),
        ("tcp_syn_cookies_accepted", t.syn_cookies_accepted),
        ("tcp_syn_cookies_rejected", t.syn_cookies_rejected),
        ("tcp_accept_overflow", t.accept_overflow),
        ("tcp_accepts", t.accepts),
        ("tcp_failed", t.failed),
        ("tcp_open", t.open as u64),
        ("tcp_retransmitted", t.retransmitted),
        ("tcp_timeouts", t.timeouts),
        ("tcp_challenge_acks", c.challenge_acks),
        ("tcp_challenge_acks_suppressed", c.challenge_acks_suppressed),
        ("tcp_paws_rejected", c.paws_rejected),
        ("ipv4_received", s.ipv4.received),
        ("ipv4_dropped", s.ipv4.total_dropped()),
        ("arp_failed", s.arp.failed),
        ("tx_direct", s.tx.direct),
        ("tx_direct_behind", s.tx.direct_behind),
        ("tx_direct_failed", s.tx.direct_failed),
    ];
    tool::json_object(&fields)
}

fn serve(args: &TcpPingpongArgs) -> io::Result<()> {
    tool::stop_on_signals()?;
    tool::on_signal(libc::SIGUSR1, on_dump)?;
    let stack = tool::open_stack(args.socket.as_ref(), &tool::busy_poll(args.busy_poll))?;
    let ip = args.ip.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let listener = TcpListener::bind(&stack, (ip, args.port))?;
    eprintln!(
        "exonet tcp-pingpong: listening on {}",
        listener.local_addr()?
    );
    let conns = Arc::new(Mutex::new(Conns::default()));
    // The accept loop only wakes for connections: the counters have a
    // thread of their own.
    let (dump_stack, dump_conns) = (stack.clone(), conns.clone());
    std::thread::spawn(move || loop {
        std::thread::sleep(tool::TICK);
        if DUMP.swap(false, Ordering::Relaxed) {
            println!("{}", json(&dump_stack, &dump_conns));
        }
    });
    let slots = Slots::new(MAX_CONNECTIONS);
    tool::accept_loop(&listener, |s, peer| {
        let Some(slot) = slots.take() else {
            eprintln!("exonet tcp-pingpong: {peer}: refused, {MAX_CONNECTIONS} connections busy");
            return Ok(true);
        };
        let s = Arc::new(s);
        let id = conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(s.clone());
        let conns = conns.clone();
        std::thread::spawn(move || {
            let _slot = slot;
            match echo(&s) {
                Ok(n) => eprintln!("exonet tcp-pingpong: {peer}: {n} bytes echoed"),
                Err(e) => eprintln!("exonet tcp-pingpong: {peer}: {e}"),
            }
            conns.lock().unwrap_or_else(|e| e.into_inner()).end(id);
        });
        Ok(true)
    })?;
    eprintln!("exonet tcp-pingpong: stopped");
    println!("{}", json(&stack, &conns));
    Ok(())
}

/// Echoes what arrives until the peer closes; returns the bytes echoed.
fn echo(s: &TcpStream) -> io::Result<u64> {
    s.set_nodelay(true)?;
    let mut r = Patient::new(s, None)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        (&mut &*s).write_all(&buf[..n])?;
        total += n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    Ok(total)
}

/// Message `seq`: bytes that differ from one message to the next, so that a
/// stale or shifted echo shows.
fn message(seq: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(7).wrapping_add(i) as u8;
    }
}

fn ping_pong(args: &TcpPingpongArgs, target: SocketAddrV4) -> io::Result<()> {
    let stack = tool::open_stack(args.socket.as_ref(), &tool::busy_poll(args.busy_poll))?;
    let timeout = Duration::from_millis(args.timeout);
    let started = Instant::now();
    let s = TcpStream::connect_timeout(&stack, target, timeout)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot connect to {target}: {e}")))?;
    let connect = started.elapsed();
    s.set_nodelay(true)?;
    let mut r = Patient::new(&s, Some(timeout))?;
    let size = args.size as usize;
    let (mut out, mut back) = (vec![0u8; size], vec![0u8; size]);
    let mut rtts = Rtts::default();
    for seq in 0..args.count {
        message(seq, &mut out);
        let t = Instant::now();
        (&mut &s).write_all(&out)?;
        r.read_exact(&mut back).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => io::Error::new(
                e.kind(),
                format!("{target} closed the connection before echo {seq} was complete"),
            ),
            _ => io::Error::new(e.kind(), format!("echo {seq}: {e}")),
        })?;
        rtts.push(t.elapsed());
        if let Some(i) = out.iter().zip(&back).position(|(a, b)| a != b) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("echo {seq} differs from what was sent at byte {i}"),
            ));
        }
    }
    let info = s.info()?;
    s.shutdown(std::net::Shutdown::Write)?;
    // The server closes after our FIN; anything more it sent is an error.
    let mut rest = [0u8; 1];
    if r.read(&mut rest)? != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{target} sent more than the echoes"),
        ));
    }
    let summary = rtts.summary();
    let peer = SocketAddr::V4(target);
    if args.json {
        let tx = stack.stats().tx;
        println!(
            "{{\"target\":\"{peer}\",\"size\":{size},\"count\":{},\"connect_us\":{:.1},{},\
             \"retransmitted\":{},\"timeouts\":{},\"tx_direct\":{},\"tx_direct_behind\":{},\"tx_direct_failed\":{}}}",
            rtts.len(),
            tool::us(connect),
            tool::rtt_json(summary.as_ref()),
            info.stats.retransmitted,
            info.stats.timeouts,
            tx.direct,
            tx.direct_behind,
            tx.direct_failed,
        );
    } else {
        println!(
            "exonet tcp-pingpong: {peer}: {} messages of {size} bytes echoed (connected in {:.1} us, \
             {} retransmitted)",
            rtts.len(),
            tool::us(connect),
            info.stats.retransmitted,
        );
        if let Some(s) = summary {
            println!("{}", tool::rtt_text(&s));
        }
    }
    Ok(())
}
