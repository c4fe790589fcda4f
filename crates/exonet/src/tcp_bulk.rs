//! `exonet tcp-bulk`: TCP throughput. `send` writes a stream whose byte i is
//! `i % 251` (a prime, so that the pattern never lines up with chunk or
//! segment sizes and a Linux-side script can check it), half-closes and
//! waits for the peer to close; `recv` accepts connections, reads each to
//! its end (checking the pattern with `--verify`) and closes it. Both print
//! bytes, seconds, Gbit/s and the connection's retransmissions.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use exonet_stack::{TcpInfo, TcpListener, TcpStream};

use crate::tool::{self, Patient};

const PERIOD: usize = 251;
/// The longest slice compared against or copied from [`pattern`] at once.
const RUN: usize = 64 * 1024;

#[derive(Debug, Args)]
pub struct TcpBulkArgs {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Connect and send the pattern, then wait for the peer to close.
    Send(SendArgs),
    /// Accept connections and read each to its end.
    Recv(RecvArgs),
}

#[derive(Debug, Args)]
struct Common {
    /// The daemon's control socket (default as for `exonet daemon`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Seconds without progress after which a connection is given up.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// One JSON line per connection instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct SendArgs {
    /// The receiver.
    #[arg(value_name = "HOST:PORT", value_parser = tool::host_port)]
    target: SocketAddrV4,
    /// Bytes to send (suffixes K, M, G as powers of 1000; Ki, Mi, Gi of 1024).
    #[arg(long, default_value = "100M", value_parser = tool::byte_count)]
    bytes: u64,
    /// Bytes per write.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..=1 << 24))]
    chunk: u32,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct RecvArgs {
    /// The port to listen on.
    #[arg(long, default_value_t = 5001)]
    port: u16,
    /// The address to listen on (default: all of the daemon's).
    #[arg(long)]
    ip: Option<Ipv4Addr>,
    /// Connections to receive, one after the other, before exiting.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Check that byte i of each stream is i % 251.
    #[arg(long)]
    verify: bool,
    /// Milliseconds to leave each connection unread after accepting it, so
    /// that the window closes and the sender probes it.
    #[arg(long, default_value_t = 0)]
    read_delay: u64,
    #[command(flatten)]
    common: Common,
}

pub fn run(args: &TcpBulkArgs) -> ExitCode {
    let (what, r) = match &args.mode {
        Mode::Send(a) => ("send", send(a)),
        Mode::Recv(a) => ("recv", recv(a)),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exonet tcp-bulk {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Bytes `offset % 251 ..` of the pattern, at least [`RUN`] of them.
fn pattern(offset: u64) -> &'static [u8] {
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| (0..PERIOD + RUN).map(|i| (i % PERIOD) as u8).collect());
    &table[(offset % PERIOD as u64) as usize..]
}

/// The offset in `buf` of the first byte that is not the pattern's, `buf`
/// starting at stream offset `offset`.
fn mismatch(buf: &[u8], offset: u64) -> Option<usize> {
    let mut at = 0;
    for run in buf.chunks(RUN) {
        let want = &pattern(offset + at as u64)[..run.len()];
        if run != want {
            return run
                .iter()
                .zip(want)
                .position(|(a, b)| a != b)
                .map(|i| at + i);
        }
        at += run.len();
    }
    None
}

/// What one connection moved.
struct Moved {
    peer: SocketAddr,
    bytes: u64,
    secs: f64,
    info: TcpInfo,
}

impl Moved {
    fn print(&self, role: &str, json: bool) {
        let gbps = tool::gbps(self.bytes, self.secs);
        let s = &self.info.stats;
        if json {
            println!(
                "{{\"role\":\"{role}\",\"peer\":\"{}\",\"bytes\":{},\"secs\":{:.6},\"gbps\":{gbps:.3},\
                 \"retransmitted\":{},\"timeouts\":{},\"fast_retransmits\":{},\
                 \"rack_losses\":{},\"rack_timeouts\":{},\
                 \"css_entries\":{},\"hystart_exits\":{},\
                 \"segments_sent\":{},\"segments_received\":{},\"mss\":{}}}",
                self.peer,
                self.bytes,
                self.secs,
                s.retransmitted,
                s.timeouts,
                s.fast_retransmits,
                s.rack_losses,
                s.rack_timeouts,
                s.css_entries,
                s.hystart_exits,
                s.segments_sent,
                s.segments_received,
                self.info.mss,
            );
        } else {
            println!(
                "exonet tcp-bulk {role}: {}: {} bytes in {:.3} s, {gbps:.3} Gbit/s, \
                 {} retransmitted ({} timeouts, {} fast retransmits, {} RACK losses){}",
                self.peer,
                self.bytes,
                self.secs,
                s.retransmitted,
                s.timeouts,
                s.fast_retransmits,
                s.rack_losses,
                if s.hystart_exits > 0 {
                    ", slow start left by HyStart++"
                } else {
                    ""
                }
            );
        }
    }
}

fn send(args: &SendArgs) -> io::Result<()> {
    let c = &args.common;
    let stack = tool::open_stack(c.socket.as_ref(), &tool::busy_poll(0))?;
    let idle = Duration::from_secs(c.timeout);
    let s = TcpStream::connect_timeout(&stack, args.target, idle)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot connect to {}: {e}", args.target)))?;
    s.set_write_timeout(Some(idle))?;
    let started = Instant::now();
    let chunk = args.chunk as usize;
    let mut buf = vec![0u8; chunk];
    let mut sent = 0u64;
    let mut w = &s;
    while sent < args.bytes {
        let n = chunk.min((args.bytes - sent) as usize);
        let mut filled = 0;
        while filled < n {
            let m = (n - filled).min(RUN);
            buf[filled..filled + m].copy_from_slice(&pattern(sent + filled as u64)[..m]);
            filled += m;
        }
        w.write_all(&buf[..n])
            .map_err(|e| io::Error::new(e.kind(), format!("after {sent} bytes: {e}")))?;
        sent += n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    // The peer closes once it has read everything: the end of the transfer.
    let mut r = Patient::new(&s, Some(idle))?;
    let mut extra = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        extra += n as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    if extra > 0 {
        eprintln!("exonet tcp-bulk send: the peer sent {extra} bytes (ignored)");
    }
    let moved = Moved {
        peer: SocketAddr::V4(args.target),
        bytes: sent,
        secs,
        info: s.info()?,
    };
    moved.print("send", c.json);
    Ok(())
}

fn recv(args: &RecvArgs) -> io::Result<()> {
    tool::stop_on_signals()?;
    let c = &args.common;
    let stack = tool::open_stack(c.socket.as_ref(), &tool::busy_poll(0))?;
    let ip = args.ip.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let listener = TcpListener::bind(&stack, (ip, args.port))?;
    eprintln!(
        "exonet tcp-bulk recv: listening on {}",
        listener.local_addr()?
    );
    let idle = Duration::from_secs(c.timeout);
    let mut done = 0;
    tool::accept_loop(&listener, |s, peer| {
        std::thread::sleep(Duration::from_millis(args.read_delay));
        let moved = receive(&s, peer, args.verify, idle)
            .map_err(|e| io::Error::new(e.kind(), format!("{peer}: {e}")))?;
        moved.print("recv", c.json);
        done += 1;
        Ok(done < args.count)
    })?;
    if done < args.count {
        return Err(io::Error::other(format!(
            "stopped after {done} of {} connections",
            args.count
        )));
    }
    Ok(())
}

/// Reads `s` to its end, checking the pattern if asked, and closes it.
fn receive(s: &TcpStream, peer: SocketAddr, verify: bool, idle: Duration) -> io::Result<Moved> {
    let started = Instant::now();
    let mut r = Patient::new(s, Some(idle))?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| io::Error::new(e.kind(), format!("after {bytes} bytes: {e}")))?;
        if n == 0 {
            break;
        }
        if verify {
            if let Some(i) = mismatch(&buf[..n], bytes) {
                let at = bytes + i as u64;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "byte {at} of the stream is {:#04x}, the pattern has {:#04x}",
                        buf[i],
                        pattern(at)[0]
                    ),
                ));
            }
        }
        bytes += n as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    let info = s.info()?;
    s.shutdown(Shutdown::Write)?;
    Ok(Moved {
        peer,
        bytes,
        secs,
        info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_wraps_at_251_and_mismatches_are_placed() {
        let stream: Vec<u8> = (0..200_000u64).map(|i| (i % 251) as u8).collect();
        assert_eq!(&pattern(0)[..3], &[0, 1, 2]);
        assert_eq!(pattern(251 * 1000 + 250)[..2], [250, 0]);
        assert!(pattern(250).len() >= RUN);
        for (from, to) in [(0, 200_000), (1000, 1001), (250, 140_000), (77, 77)] {
            assert_eq!(mismatch(&stream[from..to], from as u64), None);
        }
        let mut bad = stream.clone();
        bad[150_001] ^= 0x10;
        assert_eq!(mismatch(&bad[100..], 100), Some(150_001 - 100));
        assert_eq!(mismatch(&stream[1..], 0), Some(0));
    }
}
