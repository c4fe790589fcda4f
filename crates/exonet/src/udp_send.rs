//! `exonet udp-send`: sends numbered, timestamped datagrams to a UDP echo
//! server and measures their round trips. Without `--rate` one datagram is
//! outstanding at a time (ping-pong); with it, sends are paced and echoes
//! collected as they come.

use std::io;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use exonet_stack::{Events, Interest, Poll, Token, UdpSocket};

use crate::tool::{self, Rtts};

/// Sequence number and send time, each 8 bytes.
const HEADER: usize = 16;

#[derive(Debug, Args)]
pub struct UdpSendArgs {
    /// The echo server.
    #[arg(value_name = "HOST:PORT", value_parser = tool::host_port)]
    target: SocketAddrV4,
    /// The daemon's control socket (default as for `exonet daemon`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Datagrams to send.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Payload bytes per datagram (16 at least: sequence number and send
    /// time).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(16..=65507))]
    size: u16,
    /// Datagrams per second, echoes collected concurrently (default: one
    /// outstanding at a time).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    rate: Option<u64>,
    /// Milliseconds to wait for an echo (after the last send, with --rate).
    #[arg(long, default_value_t = 1000)]
    timeout: u64,
    /// Microseconds a blocked call spins before it sleeps.
    #[arg(long, default_value_t = 0)]
    busy_poll: u64,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &UdpSendArgs) -> ExitCode {
    match send(args) {
        Ok(mut r) => {
            r.print(args);
            if r.received == args.count {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("exonet udp-send: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What came back.
#[derive(Debug, Default)]
struct Report {
    sent: u64,
    received: u64,
    /// Echoes of the wrong length or with other bytes than were sent.
    corrupt: u64,
    /// Port unreachable answers.
    refused: u64,
    rtts: Rtts,
}

/// The datagrams of one run and the echoes seen.
struct Run {
    start: Instant,
    size: usize,
    /// Per sequence number, whether its echo came.
    seen: Vec<bool>,
    report: Report,
}

impl Run {
    fn datagram(&self, seq: u64, buf: &mut [u8]) {
        buf[..8].copy_from_slice(&seq.to_be_bytes());
        let t = self.start.elapsed().as_nanos() as u64;
        buf[8..HEADER].copy_from_slice(&t.to_be_bytes());
        for (i, b) in buf[HEADER..].iter_mut().enumerate() {
            *b = (seq as usize + i) as u8;
        }
    }

    /// Takes an echo; returns its sequence number if it is a good first copy.
    fn echo(&mut self, bytes: &[u8]) -> Option<u64> {
        let seq = (bytes.len() == self.size)
            .then(|| u64::from_be_bytes(bytes[..8].try_into().unwrap_or_default()))
            .filter(|&s| s < self.seen.len() as u64)
            .filter(|&s| {
                let mut filler = bytes[HEADER..].iter().enumerate();
                filler.all(|(i, &b)| b == (s as usize + i) as u8)
            });
        let Some(seq) = seq else {
            self.report.corrupt += 1;
            return None;
        };
        if std::mem::replace(&mut self.seen[seq as usize], true) {
            return None; // A duplicate.
        }
        let sent = u64::from_be_bytes(bytes[8..HEADER].try_into().unwrap_or_default());
        let now = self.start.elapsed().as_nanos() as u64;
        self.report
            .rtts
            .push(Duration::from_nanos(now.saturating_sub(sent)));
        self.report.received += 1;
        Some(seq)
    }

    /// Counts a port unreachable; any other error ends the run.
    fn error(&mut self, e: io::Error) -> io::Result<()> {
        match e.kind() {
            io::ErrorKind::ConnectionRefused => {
                self.report.refused += 1;
                Ok(())
            }
            _ => Err(e),
        }
    }
}

fn send(args: &UdpSendArgs) -> io::Result<Report> {
    let stack = tool::open_stack(args.socket.as_ref(), &tool::busy_poll(args.busy_poll))?;
    let sock = UdpSocket::bind(&stack, ("0.0.0.0", 0))?;
    // Connected: only the server's datagrams count, and its port
    // unreachable comes back as an error.
    sock.connect(args.target)?;
    let mut run = Run {
        start: Instant::now(),
        size: usize::from(args.size),
        seen: vec![false; args.count as usize],
        report: Report::default(),
    };
    let timeout = Duration::from_millis(args.timeout);
    match args.rate {
        None => ping_pong(&sock, &mut run, timeout)?,
        Some(rate) => paced(&sock, &mut run, rate, timeout)?,
    }
    Ok(run.report)
}

fn ping_pong(sock: &UdpSocket, run: &mut Run, timeout: Duration) -> io::Result<()> {
    let (mut out, mut buf) = (vec![0u8; run.size], vec![0u8; run.size + 1]);
    for seq in 0..run.seen.len() as u64 {
        run.datagram(seq, &mut out);
        // A refusal that came after its read gave up is reported here.
        while let Err(e) = sock.send(&out) {
            run.error(e)?;
        }
        run.report.sent += 1;
        let until = Instant::now() + timeout;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            sock.set_read_timeout(Some(left))?;
            match sock.recv(&mut buf) {
                // A late echo of an earlier datagram still counts.
                Ok(n) if run.echo(&buf[..n]) == Some(seq) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    run.error(e)?;
                    break;
                }
            }
        }
    }
    Ok(())
}

fn paced(sock: &UdpSocket, run: &mut Run, rate: u64, timeout: Duration) -> io::Result<()> {
    sock.set_nonblocking(true)?;
    let mut poll = Poll::new(sock.stack());
    let mut events = Events::new();
    let (mut out, mut buf) = (vec![0u8; run.size], vec![0u8; run.size + 1]);
    let count = run.seen.len() as u64;
    let gap = Duration::from_secs(1) / rate.min(1_000_000_000) as u32;
    let mut next = Instant::now();
    let mut last_send = next;
    while run.report.received < count {
        let now = Instant::now();
        let mut blocked = false;
        // Catch up with the schedule if it fell behind.
        while run.report.sent < count && now >= next {
            run.datagram(run.report.sent, &mut out);
            match sock.send(&out) {
                Ok(_) => {
                    run.report.sent += 1;
                    next += gap;
                    last_send = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    blocked = true;
                    break;
                }
                Err(e) => run.error(e)?,
            }
        }
        loop {
            match sock.recv(&mut buf) {
                Ok(n) => {
                    run.echo(&buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => run.error(e)?,
            }
        }
        let deadline = if run.report.sent < count {
            next
        } else {
            last_send + timeout
        };
        let now = Instant::now();
        if run.report.sent == count && now >= deadline {
            break;
        }
        // Out of send buffers: wait for one as well as for echoes.
        let interest = if blocked {
            Interest::READABLE.add(Interest::WRITABLE)
        } else {
            Interest::READABLE
        };
        poll.register(sock, Token(0), interest)?;
        poll.poll(&mut events, Some(deadline.saturating_duration_since(now)))?;
    }
    Ok(())
}

impl Report {
    fn print(&mut self, args: &UdpSendArgs) {
        let lost = self.sent.saturating_sub(self.received);
        let loss = tool::loss_pct(self.sent, self.received);
        let s = self.rtts.summary();
        if args.json {
            println!(
                "{{\"target\":\"{}\",\"size\":{},\"sent\":{},\"received\":{},\"lost\":{lost},\
                 \"loss_pct\":{loss},\"corrupt\":{},\"refused\":{},{}}}",
                args.target,
                args.size,
                self.sent,
                self.received,
                self.corrupt,
                self.refused,
                tool::rtt_json(s.as_ref()),
            );
            return;
        }
        println!(
            "exonet udp-send: {}: {} datagrams of {} bytes sent, {} received, {lost} lost ({loss}% loss)",
            args.target, self.sent, args.size, self.received
        );
        if self.corrupt > 0 || self.refused > 0 {
            println!(
                "  {} corrupt echoes, {} port unreachable",
                self.corrupt, self.refused
            );
        }
        if let Some(s) = s {
            println!("{}", tool::rtt_text(&s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_are_checked_and_counted_once() {
        let mut run = Run {
            start: Instant::now(),
            size: 40,
            seen: vec![false; 3],
            report: Report::default(),
        };
        let mut d = vec![0u8; 40];
        run.datagram(2, &mut d);
        assert_eq!(run.echo(&d), Some(2));
        assert_eq!(run.echo(&d), None, "a duplicate");
        let mut bad = d.clone();
        bad[30] ^= 1;
        assert_eq!(run.echo(&bad), None);
        assert_eq!(run.echo(&d[..39]), None);
        run.datagram(7, &mut d);
        assert_eq!(run.echo(&d), None, "not a sequence number sent");
        let r = &run.report;
        assert_eq!((r.received, r.corrupt, r.rtts.len()), (1, 3, 1));
    }
}
