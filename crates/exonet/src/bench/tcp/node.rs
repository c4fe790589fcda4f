//! `exonet bench-child tcp-node`: one side of a `tcp` measurement, on TCP
//! sockets (exonet's or Linux's).
//!
//! - `pong` accepts one connection and echoes `--size`-byte messages until
//!   the peer closes; `ping` connects (retrying while the other side
//!   starts), runs round trips for the warm-up, times each one of the
//!   window and prints `rtt_ns <median> <p99>`.
//! - `sink` accepts one connection, reads to its end and prints `received
//!   <bytes> <seconds>` (from the first byte to the end); `source` connects,
//!   writes `--bytes` in `--size`-byte writes, shuts down writing and waits
//!   for the sink to close.
//! - `serve` accepts connections, each a request of `--size` bytes answered
//!   with as many, then closed, until a request starting with "stop";
//!   `client` runs connect, request, answer, close for the warm-up, counts
//!   them over the window and prints `cps <connections per second>`.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddrV4};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};

use crate::bench::endpoint::error;
use crate::bench::endpoint::peer::PATIENCE;
use crate::bench::measure;
use crate::bench::report::Fail;
use crate::bench::udp::exonet::{open_stack_with, stack_config, Serve};

/// Round trips timed at most (bounds the memory of the samples).
const MAX_SAMPLES: usize = 1 << 22;
/// How long a connect is retried while the other side starts.
const RETRY: Duration = Duration::from_millis(10);

/// Whose TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Stack {
    /// exonet's, through the daemon at `--socket`, sleeping while it waits.
    Exonet,
    /// exonet's, its endpoint served by a multiplexer in this process on
    /// the link `--link`, sleeping while it waits.
    ExonetInproc,
    /// The same, spinning a while before it sleeps.
    ExonetInprocBusy,
    /// Linux's, sleeping in the kernel while it waits.
    Linux,
    /// Linux's, non-blocking and busy-polled.
    LinuxBusy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Ping,
    Pong,
    Source,
    Sink,
    Client,
    Serve,
}

#[derive(Debug, Args)]
pub struct TcpNodeArgs {
    #[arg(long, value_enum)]
    pub stack: Stack,
    #[arg(long, value_enum)]
    pub role: Role,
    #[arg(long)]
    pub local: SocketAddrV4,
    #[arg(long)]
    pub remote: SocketAddrV4,
    /// The daemon's control socket (`exonet`).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The link of our own multiplexer (`exonet-inproc`).
    #[arg(long)]
    pub link: Option<String>,
    /// Bytes of a message, a write, a request.
    #[arg(long)]
    pub size: usize,
    /// Bytes a source sends.
    #[arg(long, default_value_t = 0)]
    pub bytes: u64,
    /// Transfers of `bytes` a source makes, each on a connection of its
    /// own; a sink reports the median time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub transfers: u32,
    /// The CPU to keep this process on (its threads with it).
    #[arg(long)]
    pub cpu: Option<usize>,
    #[arg(long)]
    pub warmup_ms: u64,
    #[arg(long)]
    pub window_ms: u64,
    /// exonet: the link answers the listener's SYNs with SYN cookies
    /// (`TcpConfig::link_syn_cookies`).
    #[arg(long)]
    pub link_syn_cookies: bool,
}

/// A byte stream, blocking or spun on.
trait Stream: Read + Write + Send {
    fn shutdown_write(&self) -> io::Result<()>;
}

impl Stream for exonet_stack::TcpStream {
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

impl Stream for std::net::TcpStream {
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

/// A non-blocking Linux stream, spun on (as `SO_BUSY_POLL` would).
struct Spin(std::net::TcpStream);

impl Read for Spin {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.0.read(buf) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                r => return r,
            }
        }
    }
}

impl Write for Spin {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match self.0.write(buf) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                r => return r,
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stream for Spin {
    fn shutdown_write(&self) -> io::Result<()> {
        self.0.shutdown(Shutdown::Write)
    }
}

/// Connects and accepts on one stack.
enum Net {
    Exonet(exonet_stack::Stack),
    Linux { busy: bool },
}

enum Listener {
    Exonet(exonet_stack::TcpListener),
    Linux(std::net::TcpListener, bool),
}

impl Net {
    fn listen(&self, at: SocketAddrV4) -> Result<Listener, Fail> {
        Ok(match self {
            Net::Exonet(s) => {
                Listener::Exonet(exonet_stack::TcpListener::bind(s, at).map_err(error("listen"))?)
            }
            Net::Linux { busy } => Listener::Linux(
                std::net::TcpListener::bind(at).map_err(error("listen"))?,
                *busy,
            ),
        })
    }

    fn connect(&self, to: SocketAddrV4) -> io::Result<Box<dyn Stream>> {
        Ok(match self {
            Net::Exonet(s) => {
                let c = exonet_stack::TcpStream::connect_timeout(s, to, PATIENCE)?;
                c.set_nodelay(true)?;
                Box::new(c)
            }
            Net::Linux { busy } => linux(std::net::TcpStream::connect(to)?, *busy)?,
        })
    }

    /// Connects, retrying while the other side is not listening yet.
    fn connect_retrying(&self, to: SocketAddrV4) -> Result<Box<dyn Stream>, Fail> {
        let start = Instant::now();
        loop {
            match self.connect(to) {
                Ok(s) => return Ok(s),
                Err(e)
                    if e.kind() == ErrorKind::ConnectionRefused && start.elapsed() < PATIENCE =>
                {
                    std::thread::sleep(RETRY)
                }
                Err(e) => return Err(error(&format!("connect to {to}"))(e)),
            }
        }
    }
}

fn linux(s: std::net::TcpStream, busy: bool) -> io::Result<Box<dyn Stream>> {
    s.set_nodelay(true)?;
    if busy {
        s.set_nonblocking(true)?;
        Ok(Box::new(Spin(s)))
    } else {
        Ok(Box::new(s))
    }
}

impl Listener {
    fn accept(&self) -> io::Result<Box<dyn Stream>> {
        match self {
            Listener::Exonet(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Ok(Box::new(s))
            }
            Listener::Linux(l, busy) => linux(l.accept()?.0, *busy),
        }
    }
}

/// Reads a stream to its end: the bytes, and the seconds from the first to
/// the end.
pub fn drain(s: &mut impl Read) -> Result<(u64, f64), Fail> {
    let mut buf = vec![0u8; 1 << 16];
    let (mut total, mut first) = (0u64, None);
    loop {
        let n = s.read(&mut buf).map_err(error("read"))?;
        if n == 0 {
            return Ok((
                total,
                first.map_or(0.0, |t: Instant| t.elapsed().as_secs_f64()),
            ));
        }
        first.get_or_insert_with(Instant::now);
        total += n as u64;
    }
}

/// `exonet bench-child tcp-node`.
pub fn node(args: &TcpNodeArgs) -> Result<(), Fail> {
    // First, so that every thread of the stack inherits it.
    if let Some(cpu) = args.cpu {
        crate::tool::pin_to_cpu(cpu).map_err(error("pin"))?;
    }
    let net = match args.stack {
        Stack::Exonet | Stack::ExonetInproc | Stack::ExonetInprocBusy => {
            let serve = Serve::of(args.socket.as_deref(), args.link.as_deref())?;
            let mut config = stack_config(args.stack == Stack::ExonetInprocBusy);
            config.tcp.link_syn_cookies = args.link_syn_cookies;
            Net::Exonet(open_stack_with(serve, *args.local.ip(), config)?)
        }
        Stack::Linux => Net::Linux { busy: false },
        Stack::LinuxBusy => Net::Linux { busy: true },
    };
    let window = Duration::from_millis(args.window_ms);
    let warmup = Duration::from_millis(args.warmup_ms);
    match args.role {
        Role::Pong => {
            let mut s = net.listen(args.local)?.accept().map_err(error("accept"))?;
            let mut buf = vec![0u8; args.size];
            loop {
                match s.read_exact(&mut buf) {
                    Ok(()) => s.write_all(&buf).map_err(error("echo"))?,
                    Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(error("read")(e)),
                }
            }
        }
        Role::Ping => {
            let mut s = net.connect_retrying(args.remote)?;
            let mut msg = vec![0x5au8; args.size];
            let mut round_trip = |s: &mut dyn Stream| -> Result<Duration, Fail> {
                let t = Instant::now();
                s.write_all(&msg).map_err(error("send"))?;
                s.read_exact(&mut msg).map_err(error("echo"))?;
                Ok(t.elapsed())
            };
            let warm_end = Instant::now() + warmup;
            while Instant::now() < warm_end {
                round_trip(&mut *s)?;
            }
            let mut rtts = Vec::new();
            let end = Instant::now() + window;
            while Instant::now() < end && rtts.len() < MAX_SAMPLES {
                rtts.push(round_trip(&mut *s)?.as_nanos() as f64);
            }
            s.shutdown_write().map_err(error("shutdown"))?;
            if rtts.is_empty() {
                return Err(Fail::Error("no round trip in the window".into()));
            }
            let p99 = measure::percentile(&mut rtts, 99.0);
            let median = measure::median(rtts);
            println!("rtt_ns {median} {p99}");
            Ok(())
        }
        Role::Sink => {
            let l = net.listen(args.local)?;
            let mut times = Vec::new();
            for _ in 0..args.transfers {
                let mut s = l.accept().map_err(error("accept"))?;
                let (total, secs) = drain(&mut s)?;
                if total != args.bytes {
                    // Said as it is: the harness refuses the count.
                    println!("received {total} {secs}");
                    return Ok(());
                }
                times.push(secs);
            }
            println!("received {} {}", args.bytes, measure::median(times));
            Ok(())
        }
        Role::Source => {
            let chunk = vec![0x5au8; args.size.max(1)];
            for _ in 0..args.transfers {
                let mut s = net.connect_retrying(args.remote)?;
                let mut left = args.bytes;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    s.write_all(&chunk[..n]).map_err(error("write"))?;
                    left -= n as u64;
                }
                s.shutdown_write().map_err(error("shutdown"))?;
                let mut rest = [0u8; 64];
                while s.read(&mut rest).map_err(error("read"))? > 0 {}
            }
            Ok(())
        }
        Role::Serve => {
            let l = net.listen(args.local)?;
            let mut req = vec![0u8; args.size.max(4)];
            loop {
                let mut s = l.accept().map_err(error("accept"))?;
                // A client gone before its request costs only its connection.
                if s.read_exact(&mut req).is_err() {
                    continue;
                }
                if req.starts_with(b"stop") {
                    return Ok(());
                }
                let _ = s.write_all(&req);
            }
        }
        Role::Client => {
            let mut req = vec![0x5au8; args.size.max(4)];
            let once = |req: &mut [u8]| -> Result<(), Fail> {
                let mut s = net.connect_retrying(args.remote)?;
                s.write_all(req).map_err(error("request"))?;
                s.read_exact(req).map_err(error("answer"))?;
                Ok(())
            };
            let warm_end = Instant::now() + warmup;
            while Instant::now() < warm_end {
                once(&mut req)?;
            }
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < window {
                once(&mut req)?;
                n += 1;
            }
            let secs = start.elapsed().as_secs_f64();
            req[..4].copy_from_slice(b"stop");
            let mut s = net.connect_retrying(args.remote)?;
            s.write_all(&req).map_err(error("stop"))?;
            println!("cps {}", n as f64 / secs);
            Ok(())
        }
    }
}
