//! The demo's sockets part: applications on the protocol library ([`Stack`])
//! talk through their multiplexers. A client on one host measures round trips
//! to the other: `ping` (answered by the far multiplexer itself), UDP echo
//! with both stacks busy-polling and with both sleeping, a full-size frame, a
//! 20 kB datagram that travels in fragments, and "connection refused" from an
//! ICMP port unreachable. The same client runs against Linux (`--veth`).

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exonet_shm::control::Client;
use exonet_stack::icmp::IcmpDrop;
use exonet_stack::ipv4_rx::Ipv4Drop;
use exonet_stack::{IcmpSocket, Stack, StackConfig, UdpSocket};

/// How long any one answer may take before the tour gives up on it.
const PATIENCE: Duration = Duration::from_secs(5);
/// The largest UDP payload in one frame of a 1500-byte MTU.
pub const FULL: usize = 1472;
/// A datagram that only fits in fragments.
pub const BIG: usize = 20_000;
/// A port nobody listens on.
pub const CLOSED_PORT: u16 = 9;

/// A stack that spins on its rings before it sleeps; on an idle machine the
/// spin covers a round trip, so between echoes it does not sleep.
pub fn busy() -> StackConfig {
    StackConfig {
        busy_poll: Duration::from_micros(100),
        ..StackConfig::default()
    }
}

/// A stack that sleeps on its doorbell as soon as it waits.
pub fn sleeping() -> StackConfig {
    StackConfig::default()
}

pub fn open(socket: &Path, config: &StackConfig) -> Result<Stack, String> {
    Stack::open_with(socket, config).map_err(|e| format!("stack on {}: {e}", socket.display()))
}

/// Round-trip times of one measurement.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub count: usize,
    pub min: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

impl Summary {
    pub fn of(mut samples: Vec<Duration>) -> Option<Summary> {
        samples.sort();
        let at = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
        (!samples.is_empty()).then(|| Summary {
            count: samples.len(),
            min: samples[0],
            p50: at(50),
            p99: at(99),
        })
    }
}

/// One line of the round-trip table: a summary per column.
pub struct Row {
    pub label: String,
    pub cells: Vec<Option<Summary>>,
}

/// Where the client sends: the peer's address and its echo's ports, one
/// answered by a busy-polling stack and one by a sleeping one (the same
/// port where the peer has only one kind).
pub struct Target {
    pub addr: Ipv4Addr,
    pub busy_port: u16,
    pub sleeping_port: u16,
}

/// The rows' labels, in the order [`client_rows`] measures them.
pub fn labels() -> [String; 5] {
    [
        "ping, 56 B".into(),
        "UDP 4 B, busy polling".into(),
        "UDP 4 B, sleeping".into(),
        format!("UDP {FULL} B"),
        format!("UDP {BIG} B (fragments)"),
    ]
}

/// Runs the client half of the tour against `t`, `n` round trips each (the
/// 20 kB datagram fewer), and returns one summary per [`labels`] entry.
pub fn client_rows(
    busy: &Stack,
    sleeping: &Stack,
    t: &Target,
    n: usize,
) -> Result<Vec<Option<Summary>>, String> {
    let busy_to = SocketAddrV4::new(t.addr, t.busy_port);
    let runs = [
        ping(busy, t.addr, n)?,
        udp_echo(busy, busy_to, 4, n)?,
        udp_echo(sleeping, SocketAddrV4::new(t.addr, t.sleeping_port), 4, n)?,
        udp_echo(busy, busy_to, FULL, n)?,
        udp_echo(busy, busy_to, BIG, big_count(n))?,
    ];
    Ok(runs.into_iter().map(Summary::of).collect())
}

/// The rows of stacks whose multiplexers run in process (busy-polling): ping
/// and 4-byte UDP echo to `addr`, where an echo listens on `port`.
pub fn in_process_rows(
    stack: &Stack,
    addr: Ipv4Addr,
    port: u16,
    n: usize,
) -> Result<Vec<Row>, String> {
    let to = SocketAddrV4::new(addr, port);
    Ok(vec![
        Row {
            label: "ping, in-process multiplexers".into(),
            cells: vec![Summary::of(ping(stack, addr, n)?)],
        },
        Row {
            label: "UDP 4 B, in-process, busy".into(),
            cells: vec![Summary::of(udp_echo(stack, to, 4, n)?)],
        },
    ])
}

/// Round trips of the 20 kB datagram: each is 14 frames each way.
pub fn big_count(n: usize) -> usize {
    (n / 20).max(1)
}

fn ping(stack: &Stack, dst: Ipv4Addr, count: usize) -> Result<Vec<Duration>, String> {
    let sock = IcmpSocket::bind(stack, 0).map_err(|e| format!("ICMP socket: {e}"))?;
    sock.set_read_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    (0..count)
        .map(|i| {
            let seq = i as u16;
            let data = [seq as u8; 56];
            let t = Instant::now();
            sock.send_echo(dst, seq, &data)
                .map_err(|e| format!("ping {dst}: {e}"))?;
            let e = sock
                .recv_echo(&mut buf)
                .map_err(|e| format!("ping {dst}, seq {seq}: {e}"))?;
            let rtt = t.elapsed();
            // Each request is waited for, so any other answer is wrong.
            if (e.from, e.seq, &buf[..e.len]) != (dst, seq, &data[..]) {
                return Err(format!("ping {dst}, seq {seq}: a wrong reply {e:?}"));
            }
            Ok(rtt)
        })
        .collect()
}

fn udp_socket(stack: &Stack, to: SocketAddrV4) -> io::Result<UdpSocket> {
    let sock = UdpSocket::bind(stack, (Ipv4Addr::UNSPECIFIED, 0))?;
    sock.connect(to)?;
    sock.set_read_timeout(Some(PATIENCE))?;
    Ok(sock)
}

fn udp_echo(
    stack: &Stack,
    to: SocketAddrV4,
    size: usize,
    count: usize,
) -> Result<Vec<Duration>, String> {
    let sock = udp_socket(stack, to).map_err(|e| format!("UDP socket: {e}"))?;
    let mut msg: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    // One byte more than sent, to see an echo that grew.
    let mut buf = vec![0u8; size + 1];
    (0..count as u32)
        .map(|i| {
            // Each datagram differs, so a stale echo does not pass.
            let tag = i.to_be_bytes();
            let k = size.min(tag.len());
            msg[..k].copy_from_slice(&tag[..k]);
            let t = Instant::now();
            sock.send(&msg)
                .map_err(|e| format!("UDP {size} B to {to}: {e}"))?;
            let n = sock
                .recv(&mut buf)
                .map_err(|e| format!("UDP {size} B to {to}, round trip {i}: {e}"))?;
            let rtt = t.elapsed();
            if buf[..n] != msg[..] {
                return Err(format!(
                    "UDP {size} B to {to}, round trip {i}: the echo came back changed ({n} B)"
                ));
            }
            Ok(rtt)
        })
        .collect()
}

/// Sends from a connected socket to `to`, where nobody listens, and returns
/// the error the next receive reports: "connection refused", from the ICMP
/// port unreachable the far host answers.
pub fn refused(stack: &Stack, to: SocketAddrV4) -> Result<io::Error, String> {
    let sock = udp_socket(stack, to).map_err(|e| format!("UDP socket: {e}"))?;
    sock.send(b"anyone?")
        .map_err(|e| format!("UDP to {to}: {e}"))?;
    match sock.recv(&mut [0u8; 16]) {
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(e),
        Err(e) => Err(format!("UDP to {to}: expected connection refused, got {e}")),
        Ok(_) => Err(format!("{to} answered, yet nobody listens there")),
    }
}

/// A UDP echo application: a thread with a socket on a stack, answering
/// until stopped.
pub struct Echo {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl Echo {
    pub fn start(stack: &Stack, port: u16) -> Result<Echo, String> {
        let sock = UdpSocket::bind(stack, (Ipv4Addr::UNSPECIFIED, port))
            .map_err(|e| format!("echo on port {port}: {e}"))?;
        // How often the thread looks for the stop: it bounds the wait at the
        // end, not any round trip.
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("echo-{port}"))
            .spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stopped.load(Ordering::Relaxed) {
                    match sock.recv_from(&mut buf) {
                        Ok((n, from)) => {
                            sock.send_to(&buf[..n], from)?;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        Ok(Echo {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and reports how it ended.
    pub fn stop(mut self) -> Result<(), String> {
        self.halt()
    }

    fn halt(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r.map_err(|e| format!("echo: {e}")),
            Some(Err(_)) => Err("the echo thread panicked".into()),
            None => Ok(()),
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_nanos() as f64 / 1e3)
}

/// Prints the round-trip table, one group of columns per `columns` entry.
pub fn print_rtts(columns: &[&str], rows: &[Row]) {
    // Two applications and two multiplexers spin at once while busy-polling.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 4 {
        println!(
            "\n(this machine has {cores} cores: busy-polling threads take them from the \
             threads with work, so its numbers suffer)"
        );
    }
    const CELL: usize = 32;
    let label_w = rows.iter().map(|r| r.label.len()).max().unwrap_or(0);
    let mut head = format!("\n{:<label_w$}", "round trips, µs");
    let mut sub = format!("{:<label_w$}", "");
    for c in columns {
        head.push_str(&format!("  {c:^CELL$}"));
        sub.push_str(&format!(
            "  {:>6} {:>8} {:>8} {:>8}",
            "n", "min", "p50", "p99"
        ));
    }
    println!("{head}\n{sub}");
    for r in rows {
        let mut line = format!("{:<label_w$}", r.label);
        for c in &r.cells {
            match c {
                Some(s) => line.push_str(&format!(
                    "  {:>6} {:>8} {:>8} {:>8}",
                    s.count,
                    us(s.min),
                    us(s.p50),
                    us(s.p99)
                )),
                None => line.push_str(&format!("  {:^CELL$}", "-")),
            }
        }
        println!("{line}");
    }
}

/// Prints what each stack sent and how, and what it took apart and put back
/// together.
pub fn print_stacks(stacks: &[(&str, &Stack)]) {
    const HEAD: &str = "stack";
    let name_w = stacks
        .iter()
        .map(|s| s.0.len())
        .fold(HEAD.len(), usize::max);
    println!(
        "\n{:<name_w$} {:>10} {:>10} {:>8} {:>10} {:>11} {:>11} {:>11}",
        HEAD,
        "datagrams",
        "tx frames",
        "inline",
        "fragmented",
        "reassembled",
        "cksum drops",
        "icmp errors"
    );
    for (name, s) in stacks {
        let st = s.stats();
        let cksum = st.sockets.bad_checksum
            + st.ipv4.dropped(Ipv4Drop::BadChecksum)
            + st.icmp.dropped(IcmpDrop::BadChecksum);
        println!(
            "{name:<name_w$} {:>10} {:>10} {:>8} {:>10} {:>11} {:>11} {:>11}",
            st.tx.datagrams,
            st.tx.frames,
            st.tx.inline,
            st.tx.fragmented,
            st.reasm.reassembled,
            cksum,
            st.sockets.icmp_errors
        );
    }
}

/// Multiplexer counters, as `exonet stats` names them: (header, record
/// kind, field).
const MUX_COLUMNS: &[(&str, &str, &str)] = &[
    ("link rx", "link", "rx_frames"),
    ("link tx", "link", "tx_frames"),
    ("arp replies", "host", "arp_replies_sent"),
    ("echo replies", "host", "echo_replies"),
    ("unreachables", "host", "udp_unreachables"),
    ("frag heads", "frag", "heads"),
    ("frag bodies", "frag", "bodies_forwarded"),
];

/// Prints each multiplexer's counters, asked of its daemon over the control
/// socket as `exonet stats` does.
pub fn print_muxes(muxes: &[(&str, &Path)]) -> Result<(), String> {
    const HEAD: &str = "multiplexer";
    let name_w = muxes.iter().map(|m| m.0.len()).fold(HEAD.len(), usize::max);
    let mut head = format!("\n{HEAD:<name_w$}");
    for (h, _, _) in MUX_COLUMNS {
        head.push_str(&format!(" {h:>12}"));
    }
    println!("{head}");
    for (name, socket) in muxes {
        let records = Client::connect(socket)
            .and_then(|mut c| c.stats())
            .map_err(|e| format!("stats of {}: {e}", socket.display()))?;
        let mut line = format!("{name:<name_w$}");
        for (_, kind, field) in MUX_COLUMNS {
            let v: u64 = records
                .iter()
                .filter(|r| r.kind == *kind)
                .filter_map(|r| r.get(field))
                .sum();
            line.push_str(&format!(" {v:>12}"));
        }
        println!("{line}");
    }
    Ok(())
}
