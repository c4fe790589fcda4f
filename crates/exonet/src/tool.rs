//! What the socket tools (`ping`, `udp-echo`, `udp-send`) share: opening a
//! stack on the daemon, parsing hosts, RTT summaries.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use exonet_shm::control::default_socket_path;
use exonet_stack::{Stack, StackConfig};

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
}
