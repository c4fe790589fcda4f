//! What the socket tools (`ping`, `udp-echo`, `udp-send`, `tcp-pingpong`,
//! `tcp-bulk`, `http-serve`, `http-get`) share: opening a stack on the
//! daemon, parsing hosts and sizes, RTT summaries, stopping on signals,
//! bounded connection threads, patient reads and HTTP message heads; and
//! keeping a thread on one CPU, as the daemon and the benchmarks do.

use std::io::{self, BufRead, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use exonet_shm::control::default_socket_path;
use exonet_stack::{Stack, StackConfig, TcpListener, TcpStream};

/// A stack on the daemon at `socket` (default: the daemon's default path).
/// Where an echo server answers, as `raw-echo` and `udp-echo` take it.
#[derive(Debug, Args)]
pub struct EchoAt {
    /// The daemon's control socket (default as for `exonet daemon`).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The UDP port to answer on.
    #[arg(long, default_value_t = 7)]
    pub port: u16,
    /// The address to bind (default: the daemon's first).
    #[arg(long)]
    pub ip: Option<Ipv4Addr>,
    /// Stop after answering this many.
    #[arg(long)]
    pub count: Option<u64>,
}

pub fn open_stack(socket: Option<&PathBuf>, config: &StackConfig) -> io::Result<Stack> {
    let path = socket.cloned().unwrap_or_else(default_socket_path);
    Stack::open_with(&path, config)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display())))
}

/// Keeps the calling thread, and the threads it starts after, on CPU `cpu`.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no CPU {cpu}"),
        ));
    }
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it (the
    // index is checked above), and sched_setaffinity reads it whole.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("CPU {cpu}: {e}")));
    }
    Ok(())
}

/// A `--busy-poll` value in microseconds as the stack's configuration.
pub fn busy_poll(us: u64) -> StackConfig {
    StackConfig {
        busy_poll: Duration::from_micros(us),
        ..StackConfig::default()
    }
}

/// Clap parser for `HOST`: an IPv4 address or a name that resolves to one.
pub fn host(s: &str) -> Result<Ipv4Addr, String> {
    if let Ok(ip) = s.parse() {
        return Ok(ip);
    }
    first_v4((s, 0).to_socket_addrs())
        .map(|a| *a.ip())
        .ok_or_else(|| format!("`{s}` is not an IPv4 address or a name that resolves to one"))
}

/// Clap parser for `HOST:PORT`.
pub fn host_port(s: &str) -> Result<SocketAddrV4, String> {
    first_v4(s.to_socket_addrs())
        .ok_or_else(|| format!("`{s}`: expected HOST:PORT with an IPv4 host, e.g. 10.77.1.1:7"))
}

fn first_v4(r: io::Result<impl Iterator<Item = SocketAddr>>) -> Option<SocketAddrV4> {
    r.ok()?.find_map(|a| match a {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(_) => None,
    })
}

/// Clap parser for a byte count: digits with an optional suffix, `K`, `M`,
/// `G` (powers of 1000) or `Ki`, `Mi`, `Gi` (powers of 1024), and an
/// optional `B`: `10M`, `1G`, `64KiB`.
pub fn byte_count(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}`: expected a byte count such as 1000, 10M, 1G or 64Ki");
    let t = s.strip_suffix(['B', 'b']).unwrap_or(s);
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1000,
        "m" => 1000 * 1000,
        "g" => 1000 * 1000 * 1000,
        "ki" => 1 << 10,
        "mi" => 1 << 20,
        "gi" => 1 << 30,
        _ => return Err(bad()),
    };
    n.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(bad)
}

/// Named counters as one flat JSON object, as the servers print them.
pub fn json_object(fields: &[(&str, u64)]) -> String {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!("{{{}}}", body.join(","))
}

/// Gigabits per second of `bytes` in `secs`.
pub fn gbps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e9
    } else {
        0.0
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Runs `handler` on `signal`.
pub fn on_signal(signal: libc::c_int, handler: extern "C" fn(libc::c_int)) -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the
    // handlers given here only store to an atomic, which is async-signal-safe.
    let r = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as libc::sighandler_t;
        // The control socket's calls go on; the doorbell's poll returns
        // (poll is never restarted), so the loops see the flag.
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(signal, &sa, std::ptr::null_mut())
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// SIGINT and SIGTERM set the flag [`stopped`] reads, for servers that stop
/// cleanly.
pub fn stop_on_signals() -> io::Result<()> {
    for s in [libc::SIGINT, libc::SIGTERM] {
        on_signal(s, on_stop)?;
    }
    Ok(())
}

pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// How often a blocked call looks at the stop flag.
pub const TICK: Duration = Duration::from_millis(50);

/// Accepts connections until a signal asks to stop or `serve` returns
/// `false`; `serve` gets each connection and its peer.
pub fn accept_loop(
    listener: &TcpListener,
    mut serve: impl FnMut(TcpStream, SocketAddr) -> io::Result<bool>,
) -> io::Result<()> {
    listener.set_accept_timeout(Some(TICK))?;
    while !stopped() {
        match listener.accept() {
            Ok((s, peer)) => {
                if !serve(s, peer)? {
                    break;
                }
            }
            // The tick passed, or that connection went before it was taken.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A server's connection threads, at most a bound of them at once.
#[derive(Debug, Clone)]
pub struct Slots {
    busy: Arc<AtomicUsize>,
    max: usize,
}

/// One connection thread's place among [`Slots`], given back on drop.
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Slots {
    pub fn new(max: usize) -> Slots {
        Slots {
            busy: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// A place, unless all are taken.
    pub fn take(&self) -> Option<Slot> {
        self.busy
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.busy.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads from a stream, waiting for data at most `idle` (`None`: forever)
/// and giving up when a signal asked to stop. Its read timeout is [`TICK`].
#[derive(Debug)]
pub struct Patient<'a> {
    stream: &'a TcpStream,
    idle: Option<Duration>,
}

impl<'a> Patient<'a> {
    pub fn new(stream: &'a TcpStream, idle: Option<Duration>) -> io::Result<Patient<'a>> {
        stream.set_read_timeout(Some(TICK))?;
        Ok(Patient { stream, idle })
    }
}

impl Read for Patient<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let since = Instant::now();
        loop {
            match (&mut &*self.stream).read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Not `Interrupted`: std's readers retry that.
                    if stopped() {
                        return Err(io::Error::other("stopped by a signal"));
                    }
                    if let Some(idle) = self.idle.filter(|&i| since.elapsed() >= i) {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no data from the peer for {:.1} s", idle.as_secs_f64()),
                        ));
                    }
                }
                r => return r,
            }
        }
    }
}

/// Why an HTTP message head could not be read.
#[derive(Debug)]
pub enum HeadError {
    Io(io::Error),
    /// The connection closed inside the head.
    Truncated,
    /// The first line is longer than allowed.
    LineTooLong,
    /// The head is larger than allowed.
    TooLarge,
}

/// Reads an HTTP message head (RFC 9112 §2.1) up to and including its empty
/// line, holding at most `head_max` bytes and a first line of at most
/// `line_max`; empty lines before it are skipped (§2.2). `None`: the
/// connection closed before the first byte.
pub fn read_head<R: BufRead>(
    r: &mut R,
    line_max: usize,
    head_max: usize,
) -> Result<Option<Vec<u8>>, HeadError> {
    let mut head = Vec::new();
    let mut line_start = 0;
    loop {
        let avail = r.fill_buf().map_err(HeadError::Io)?;
        if avail.is_empty() {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(HeadError::Truncated)
            };
        }
        let nl = avail.iter().position(|&b| b == b'\n');
        let take = nl.map_or(avail.len(), |i| i + 1);
        if line_start == 0 && head.len() + take > line_max {
            return Err(HeadError::LineTooLong);
        }
        if head.len() + take > head_max {
            return Err(HeadError::TooLarge);
        }
        head.extend_from_slice(&avail[..take]);
        r.consume(take);
        if nl.is_none() {
            continue;
        }
        if matches!(&head[line_start..], b"\r\n" | b"\n") {
            if line_start == 0 {
                head.clear();
                continue;
            }
            return Ok(Some(head));
        }
        line_start = head.len();
    }
}

/// The lines of a head without their terminators (CRLF, or LF as RFC 9112
/// §2.2 allows), the final empty line left out.
pub fn head_lines(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    head.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .take_while(|l| !l.is_empty())
}

/// Header fields in their order; names compare without case.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    /// Parses the field lines of a head (RFC 9110 §5, RFC 9112 §5): a token,
    /// a colon with no space before it, a value without control characters;
    /// no line folding; at most `max` of them.
    pub fn parse<'a>(lines: impl Iterator<Item = &'a [u8]>, max: usize) -> Result<Headers, String> {
        let mut fields = Vec::new();
        for line in lines {
            if fields.len() == max {
                return Err(format!("more than {max} header fields"));
            }
            let shown = String::from_utf8_lossy(line);
            let colon = line
                .iter()
                .position(|&b| b == b':')
                .ok_or_else(|| format!("header line without a colon: {shown:?}"))?;
            let (name, value) = (&line[..colon], &line[colon + 1..]);
            if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
                return Err(format!("bad header name: {shown:?}"));
            }
            if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                return Err(format!("control character in a header value: {shown:?}"));
            }
            let value = String::from_utf8_lossy(value.trim_ascii());
            // The name is ASCII: checked as a token.
            let name = String::from_utf8_lossy(name).into_owned();
            fields.push((name, value.into_owned()));
        }
        Ok(Headers(fields))
    }

    /// The first field named `name`.
    pub fn get<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        self.all(name).next()
    }

    /// Every field named `name`.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether a comma-separated field (as `Connection`) lists `token`.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.all(name)
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// `Content-Length` (RFC 9112 §6.3): digits only; repeated values must
    /// agree.
    pub fn content_length(&self) -> Result<Option<u64>, String> {
        let mut length = None;
        for v in self.all("content-length").flat_map(|v| v.split(',')) {
            let v = v.trim();
            let n = (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .then(|| v.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| format!("bad Content-Length {v:?}"))?;
            if length.is_some_and(|l| l != n) {
                return Err("conflicting Content-Length values".to_string());
            }
            length = Some(n);
        }
        Ok(length)
    }
}

/// A token character (RFC 9110 §5.6.2).
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Round-trip times, summarised at the end of a run.
#[derive(Debug, Default)]
pub struct Rtts(Vec<Duration>);

impl Rtts {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Minimum, mean, percentiles and maximum, or `None` without samples.
    pub fn summary(&mut self) -> Option<Summary> {
        if self.0.is_empty() {
            return None;
        }
        self.0.sort_unstable();
        let v = &self.0;
        // Nearest rank: the smallest sample with at least p% at or below it.
        let pct = |p: usize| v[(p * v.len()).div_ceil(100).clamp(1, v.len()) - 1];
        let total: Duration = v.iter().sum();
        Some(Summary {
            min: v[0],
            avg: total / v.len() as u32,
            p50: pct(50),
            p90: pct(90),
            p99: pct(99),
            max: v[v.len() - 1],
        })
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub min: Duration,
    pub avg: Duration,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

/// `"rtt_min_us":…,"rtt_p50_us":…,"rtt_p90_us":…,"rtt_p99_us":…,"rtt_max_us":…`
/// for a JSON line, `null`s without samples.
pub fn rtt_json(s: Option<&Summary>) -> String {
    let rtt =
        |d: fn(&Summary) -> Duration| s.map_or("null".to_string(), |s| format!("{:.1}", us(d(s))));
    format!(
        "\"rtt_min_us\":{},\"rtt_p50_us\":{},\"rtt_p90_us\":{},\"rtt_p99_us\":{},\"rtt_max_us\":{}",
        rtt(|s| s.min),
        rtt(|s| s.p50),
        rtt(|s| s.p90),
        rtt(|s| s.p99),
        rtt(|s| s.max)
    )
}

/// `rtt us: min … p50 … p90 … p99 … max …`.
pub fn rtt_text(s: &Summary) -> String {
    format!(
        "rtt us: min {:.1} p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}",
        us(s.min),
        us(s.p50),
        us(s.p90),
        us(s.p99),
        us(s.max)
    )
}

/// Lost as a percentage of `sent`, rounded to a tenth (`0` for none sent).
pub fn loss_pct(sent: u64, received: u64) -> f64 {
    if sent == 0 {
        return 0.0;
    }
    let lost = sent.saturating_sub(received) as f64;
    (lost * 1000.0 / sent as f64).round() / 10.0
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut r = Rtts::default();
        for i in (1..=100u64).rev() {
            r.push(Duration::from_micros(i));
        }
        let s = r.summary().unwrap();
        let us = |d: Duration| d.as_micros();
        assert_eq!(
            (us(s.min), us(s.p50), us(s.p90), us(s.p99), us(s.max)),
            (1, 50, 90, 99, 100)
        );
        assert_eq!(us(s.avg), 50);
        let mut one = Rtts::default();
        one.push(Duration::from_micros(7));
        assert_eq!(one.summary().unwrap().p99, Duration::from_micros(7));
        assert!(Rtts::default().summary().is_none());
    }

    #[test]
    fn loss_and_hosts() {
        assert_eq!(loss_pct(3, 2), 33.3);
        assert_eq!(loss_pct(4, 4), 0.0);
        assert_eq!(loss_pct(0, 0), 0.0);
        assert_eq!(host("10.77.1.1"), Ok(Ipv4Addr::new(10, 77, 1, 1)));
        assert!(host_port("nohost").is_err());
        assert_eq!(
            host_port("10.77.1.1:7"),
            Ok(SocketAddrV4::new(Ipv4Addr::new(10, 77, 1, 1), 7))
        );
    }

    #[test]
    fn byte_counts() {
        assert_eq!(byte_count("1000"), Ok(1000));
        assert_eq!(byte_count("10M"), Ok(10_000_000));
        assert_eq!(byte_count("1G"), Ok(1_000_000_000));
        assert_eq!(byte_count("64KiB"), Ok(65536));
        assert_eq!(byte_count("2mi"), Ok(2 << 20));
        for bad in ["", "M", "10Q", "1.5G", "-1", "99999999999G", "10 M"] {
            assert!(byte_count(bad).is_err(), "{bad}");
        }
    }
}
