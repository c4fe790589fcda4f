//! `exonet daemon`: the multiplexer as a service. It owns one link and the
//! host's addresses and serves applications over the control socket until
//! SIGINT or SIGTERM.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use exonet_link::afpacket::{self, AfPacket, RxMode};
use exonet_link::direct::Rate;
use exonet_link::{afxdp, memwire, tap::Tap, Link, PcapCapture};
use exonet_mux::{Daemon, DaemonConfig, DirectConfig, Mux, MuxConfig, RunConfig};
use exonet_shm::control::{connect_or_remove_dead, default_socket_path, SeqListener, SeqPacket};
use exonet_wire::pcap::{PcapWriter, TsResolution};

use crate::tool;

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The link: `memwire[:RENDEZVOUS]` (an in-memory cable; the first
    /// daemon at RENDEZVOUS creates it, the second joins), `tap:NAME`,
    /// `afpacket:IFACE[:frames]` or `afxdp:IFACE[:QUEUE][:native|:generic]`
    /// (where its XDP program runs: by default generic on a veth, native
    /// elsewhere). AF_PACKET
    /// receives in blocks (TPACKET_V3: for throughput, but a lone frame
    /// waits up to 1 ms); `:frames` hands each frame over at once
    /// (TPACKET_V2: for latency). Where the interface has TSO on, AF_PACKET
    /// takes TCP super-segments of up to 64 KB for the kernel to cut, best
    /// with `:frames` (blocks hold the ACKs back).
    #[arg(long)]
    link: String,
    /// An address of this host with its prefix length (`10.0.0.1/24`);
    /// repeat for more.
    #[arg(long = "ip", required = true)]
    ips: Vec<String>,
    /// The control socket (default: `$EXONET_SOCKET`, else
    /// /run/exonet/control.sock for root, else $XDG_RUNTIME_DIR/exonet.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Longest sleep when idle, in microseconds: the latency bound for work
    /// nobody signals.
    #[arg(long, default_value_t = 1000)]
    latency_us: u64,
    /// Empty polls in a row before sleeping (busy-polling while there is
    /// work).
    #[arg(long, default_value_t = 64)]
    idle_spins: u32,
    /// Microseconds of polling, once idle, before sleeping (yielding the CPU
    /// between polls to any other thread that wants it): at least this.
    #[arg(long, default_value_t = 50)]
    idle_spin_us: u64,
    /// At most this: the polling grows to cover the recent gaps in the
    /// work that ended within it (an answer two wake-ups away), and shrinks
    /// back when they are longer.
    #[arg(long, default_value_t = 250)]
    idle_spin_max_us: u64,
    /// The multiplexer's scheduling priority (nice value, -20..=19). Ahead
    /// of the applications by default, as a kernel's receive path runs
    /// ahead of the processes it serves: at 0, an application sending UDP
    /// as fast as it could kept the daemons on its CPU from their frames,
    /// and its peer received 63,000 1472-byte datagrams a second over a
    /// veth, against 142,000 at -10. Going below 0 needs CAP_SYS_NICE;
    /// without it the daemon says so and runs at its own.
    #[arg(long, default_value_t = -10, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    nice: i32,
    /// Keep the multiplexer on this CPU, a core of its own as the fast
    /// paths of DPDK and TAS have. Two daemons on one 2-CPU machine (two
    /// hosts on veths) were put on one CPU by the scheduler, as each one's
    /// sends wake the other in its own context: the two hosts' networking
    /// then took turns, and 10 MB moved at 2.2–2.4 Gbit/s (medians of 5)
    /// against 2.6–3.6 with each on its own CPU. The applications stay
    /// where the scheduler puts them. Default: unpinned.
    #[arg(long, value_name = "N")]
    cpu: Option<usize>,
    /// Write every frame the link moves, both ways, into this pcap file
    /// (nanosecond timestamps; flushed when the daemon stops). tcpdump sees
    /// none of an AF_XDP socket's frames: they pass the kernel's taps by.
    /// Costs a write per frame, and with AF_XDP a copy per received one.
    #[arg(long, value_name = "FILE")]
    capture: Option<PathBuf>,
    /// Bytes kept of each captured frame (as tcpdump's `-s`).
    #[arg(long, value_name = "BYTES", default_value_t = MAX_SNAPLEN,
          value_parser = clap::value_parser!(u32).range(64..=MAX_SNAPLEN as i64))]
    capture_snaplen: u32,
    /// Give no application a direct send port. With one (on `afxdp` and
    /// `afpacket` links, where the kernel can check its frames), an
    /// application writes the frames of its connected TCP channels while
    /// its transmit ring is empty straight to a macvtap of its own on the
    /// interface, whose BPF program checks each against the application's
    /// channels as the transmit scan would: a round trip without the
    /// hand-off to the daemon. A capture (`--capture`) turns them off, as
    /// it would not see those frames.
    #[arg(long)]
    no_direct: bool,
    /// Each direct send port's token bucket, in Mbit/s (bursts of 256 KB):
    /// what an application may send past the transmit scheduler.
    #[arg(long, value_name = "MBIT", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    direct_rate: u64,
}

/// The interface of a link whose frames a direct send port's check can
/// stand for: one the kernel transmits on.
fn direct_iface(spec: &str) -> Option<&str> {
    let (kind, rest) = spec.split_once(':')?;
    let iface = rest.split(':').next().filter(|i| !i.is_empty())?;
    matches!(kind, "afxdp" | "afpacket").then_some(iface)
}

/// The longest frame a capture keeps whole (tcpdump's own limit): a 64 KB
/// super-segment fits.
const MAX_SNAPLEN: u32 = 262_144;

/// `ADDR/LEN`.
pub fn parse_prefix(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (a, l) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}`: expected ADDR/LEN, e.g. 10.0.0.1/24"))?;
    let addr: Ipv4Addr = a
        .parse()
        .map_err(|_| format!("`{a}` is not an IPv4 address"))?;
    let len: u8 = l
        .parse()
        .ok()
        .filter(|&n| n <= 32)
        .ok_or_else(|| format!("`{l}` is not a prefix length (0..=32)"))?;
    Ok((addr, len))
}

pub fn run(args: &DaemonArgs) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exonet daemon: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &DaemonArgs) -> Result<(), String> {
    let prefixes = args
        .ips
        .iter()
        .map(|s| parse_prefix(s))
        .collect::<Result<Vec<_>, _>>()?;
    let addrs: Vec<Ipv4Addr> = prefixes.iter().map(|p| p.0).collect();
    let socket = args.socket.clone().unwrap_or_else(default_socket_path);
    // Before any thread starts: they inherit it.
    let nice = match set_nice(args.nice) {
        Ok(()) => format!("nice {}", args.nice),
        Err(e) => format!("nice unchanged (not {}: {e})", args.nice),
    };
    if let Some(cpu) = args.cpu {
        tool::pin_to_cpu(cpu).map_err(|e| format!("--cpu {cpu}: {e}"))?;
    }
    // Block the stop signals before any thread starts, so that only the
    // waiter below receives them.
    let signals = block_stop_signals().map_err(|e| format!("signals: {e}"))?;
    // The capture's file first: a refused path fails before the link opens.
    let capture = match &args.capture {
        Some(path) => Some(capture_file(path, args.capture_snaplen)?),
        None => None,
    };
    let mut link = open_link(&args.link, &addrs, &socket)?;
    if let Some(writer) = capture {
        link = Box::new(PcapCapture::new(link, writer));
    }
    let (mac, mtu) = (link.mac(), link.max_frame_len());
    let mut mux = Mux::new(link, addrs, MuxConfig::default());
    let direct = match direct_iface(&args.link) {
        Some(iface) if !args.no_direct && args.capture.is_none() => {
            // What a daemon that died left behind.
            match exonet_link::direct::remove_stale() {
                Ok(0) => {}
                Ok(n) => eprintln!("exonet daemon: removed {n} stale direct send ports"),
                Err(e) => eprintln!("exonet daemon: stale direct send ports: {e}"),
            }
            mux.enable_direct(DirectConfig {
                lower: iface.to_string(),
                rate: Rate {
                    bytes_per_sec: args.direct_rate * 125_000,
                    burst: 256 * 1024,
                },
            });
            format!("direct send ports on {iface}")
        }
        _ => "no direct send ports".to_string(),
    };
    let mut config = DaemonConfig::new(socket.clone(), prefixes.clone());
    config.run = RunConfig {
        idle_spins: args.idle_spins.max(1),
        idle_spin: Duration::from_micros(args.idle_spin_us),
        idle_spin_max: Duration::from_micros(args.idle_spin_max_us),
        latency: Duration::from_micros(args.latency_us.max(1)),
    };
    let mut daemon = Daemon::bind(mux, config)
        .map_err(|e| format!("control socket {}: {e}", socket.display()))?;
    let stop = daemon.stop_handle();
    on_stop_signal(signals, move || stop.stop());
    eprintln!(
        "exonet daemon: link {} (MAC {}, frames up to {mtu} bytes), addresses {}, control socket {}, {nice}{}, {direct}",
        args.link,
        mac.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
        prefixes
            .iter()
            .map(|(a, l)| format!("{a}/{l}"))
            .collect::<Vec<_>>()
            .join(" "),
        socket.display(),
        args.cpu.map_or(String::new(), |c| format!(", on CPU {c}"))
    );
    let r = daemon.run().map_err(|e| format!("multiplexer: {e}"));
    eprintln!("exonet daemon: stopped");
    r
}

/// A new pcap file at `path`, for the link's frames (see
/// [`DaemonArgs::capture`]).
fn capture_file(path: &Path, snaplen: u32) -> Result<PcapWriter<CaptureFile>, String> {
    let file =
        std::fs::File::create(path).map_err(|e| format!("--capture {}: {e}", path.display()))?;
    let out = CaptureFile {
        file: io::BufWriter::with_capacity(1 << 20, file),
        path: path.to_path_buf(),
        failed: false,
    };
    PcapWriter::with_options(out, TsResolution::Nano, snaplen)
        .map_err(|e| format!("--capture {}: {e}", path.display()))
}

/// The capture's file. Its first error is said on stderr (the capture then
/// stops, and the networking goes on), and it is flushed when the daemon
/// drops its link.
struct CaptureFile {
    file: io::BufWriter<std::fs::File>,
    path: PathBuf,
    failed: bool,
}

impl CaptureFile {
    fn said<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            if !std::mem::replace(&mut self.failed, true) {
                eprintln!(
                    "exonet daemon: capture to {}: {e}; the capture stops",
                    self.path.display()
                );
            }
        }
        r
    }
}

impl io::Write for CaptureFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let r = self.file.write(buf);
        self.said(r)
    }

    fn flush(&mut self) -> io::Result<()> {
        let r = self.file.flush();
        self.said(r)
    }
}

impl Drop for CaptureFile {
    fn drop(&mut self) {
        if !self.failed {
            let r = io::Write::flush(&mut self.file);
            let _ = self.said(r);
        }
    }
}

/// Sets this thread's nice value (on Linux a thread's own: threads started
/// after it inherit it).
fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: plain system call, no pointers.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The link `spec` names (see [`DaemonArgs::link`]), for a host with
/// `addrs` whose control socket is `socket`.
pub(crate) fn open_link(
    spec: &str,
    addrs: &[Ipv4Addr],
    socket: &Path,
) -> Result<Box<dyn Link>, String> {
    let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let need = |what: &str| {
        if rest.is_empty() {
            Err(format!("--link {kind}:{what}: the {what} is missing"))
        } else {
            Ok(rest)
        }
    };
    let opened: io::Result<Box<dyn Link>> = match kind {
        "memwire" => {
            let rendezvous = if rest.is_empty() {
                socket.with_file_name("exonet-memwire.sock")
            } else {
                PathBuf::from(rest)
            };
            return memwire_end(&rendezvous)
                .map_err(|e| format!("memwire at {}: {e}", rendezvous.display()));
        }
        "tap" => Tap::open(need("NAME")?).map(|l| Box::new(l) as Box<dyn Link>),
        "afpacket" => {
            let (iface, rx_mode) = match need("IFACE")?.split_once(':') {
                Some((i, "frames")) => (i, RxMode::Frames),
                Some((_, m)) => {
                    return Err(format!(
                        "--link {spec}: unknown AF_PACKET mode `{m}`: use afpacket:IFACE or afpacket:IFACE:frames"
                    ))
                }
                None => (rest, RxMode::Blocks),
            };
            let cfg = afpacket::Config {
                rx_mode,
                ..afpacket::Config::default()
            };
            AfPacket::with_config(iface, cfg).map(|l| Box::new(l) as Box<dyn Link>)
        }
        "afxdp" => {
            let (iface, cfg) =
                afxdp_spec(need("IFACE")?).map_err(|e| format!("--link {spec}: {e}"))?;
            // Only frames for our addresses come to us; Linux keeps the
            // rest of the interface's traffic.
            let cfg = afxdp::Config {
                steer: addrs.to_vec(),
                ..cfg
            };
            afxdp::AfXdp::with_config(iface, cfg).map(|l| Box::new(l) as Box<dyn Link>)
        }
        _ => {
            return Err(format!(
                "unknown link `{spec}`: use memwire[:PATH], tap:NAME, afpacket:IFACE[:frames] or afxdp:IFACE[:QUEUE][:native|:generic]"
            ))
        }
    };
    opened.map_err(|e| format!("--link {spec}: {e}"))
}

/// `IFACE[:QUEUE][:native|:generic]` of an `afxdp` link: the interface, and
/// its queue and XDP mode in a configuration.
fn afxdp_spec(rest: &str) -> Result<(&str, afxdp::Config), String> {
    let mut parts = rest.split(':');
    let iface = parts.next().unwrap_or_default();
    let mut cfg = afxdp::Config::default();
    for p in parts {
        match p {
            "native" => cfg.mode = afxdp::XdpMode::Native,
            "generic" => cfg.mode = afxdp::XdpMode::Generic,
            q => {
                cfg.queue = q.parse().map_err(|_| {
                    format!("`{q}` is neither a queue number nor an XDP mode (native, generic)")
                })?
            }
        }
    }
    Ok((iface, cfg))
}

/// One end of a memwire cable shared through a rendezvous socket: joins
/// the cable offered there, or creates one and offers its far end to the
/// next daemon that comes.
fn memwire_end(rendezvous: &Path) -> io::Result<Box<dyn Link>> {
    // Two ends started together may both find no cable and both try to offer
    // one: the one that loses the (exclusive) bind joins the winner's. A
    // rendezvous left by an end that died is removed on the way.
    for _ in 0..100 {
        if let Some(s) = connect_or_remove_dead(rendezvous)? {
            return join_cable(&s);
        }
        match SeqListener::bind_exclusive(rendezvous) {
            Ok(listener) => return offer_cable(listener, rendezvous),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "the rendezvous is taken but offers no cable",
    ))
}

fn join_cable(s: &SeqPacket) -> io::Result<Box<dyn Link>> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = [0u8; 16];
    let (_, fds) = s.recv(&mut buf)?;
    let fds: [OwnedFd; 3] = fds.try_into().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the rendezvous did not send a cable",
        )
    })?;
    Ok(Box::new(memwire::FarEnd::from_fds(fds).open()?))
}

fn offer_cable(listener: SeqListener, rendezvous: &Path) -> io::Result<Box<dyn Link>> {
    let (end, far) = memwire::cable(memwire::Config::default())?;
    let path = rendezvous.to_path_buf();
    std::thread::Builder::new()
        .name("exonet-memwire".into())
        .spawn(move || {
            // The far end goes to the first daemon that asks; after that the
            // rendezvous is done. The file goes before the listener, so that
            // a refused connect only ever means a dead one.
            if let Ok(peer) = listener.accept() {
                let fds = far.into_fds();
                let borrowed: Vec<_> = fds.iter().map(std::os::fd::AsFd::as_fd).collect();
                let _ = peer.send(b"cable", &borrowed);
            }
            let _ = std::fs::remove_file(&path);
            drop(listener);
        })?;
    Ok(Box::new(end))
}

pub(crate) fn block_stop_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: the set is initialised by sigemptyset before use; the calls
    // take pointers to live locals only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(set)
    }
}

/// A thread that waits for SIGINT or SIGTERM (blocked in every thread by
/// [`block_stop_signals`]) and then runs `f`.
pub(crate) fn on_stop_signal(set: libc::sigset_t, f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: `set` is a valid signal set; `sig` is a live local.
        unsafe { libc::sigwait(&set, &mut sig) };
        f();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn afpacket_spec_refuses_an_unknown_mode() {
        // Refused before any socket is opened: no privileges needed.
        let Err(e) = open_link("afpacket:lo:fast", &[], Path::new("/nonexistent")) else {
            panic!("afpacket:lo:fast accepted");
        };
        assert!(e.contains("unknown AF_PACKET mode `fast`"), "{e}");
    }

    #[test]
    fn afxdp_spec_takes_a_queue_and_a_mode() {
        use afxdp::XdpMode::{Auto, Generic, Native};
        for (rest, queue, mode) in [
            ("eth0", 0, Auto),
            ("eth0:3", 3, Auto),
            ("eth0:native", 0, Native),
            ("eth0:2:generic", 2, Generic),
        ] {
            let (iface, cfg) = afxdp_spec(rest).unwrap();
            assert_eq!(
                (iface, cfg.queue, cfg.mode),
                ("eth0", queue, mode),
                "{rest}"
            );
        }
        let Err(e) = open_link("afxdp:lo:fast", &[], Path::new("/nonexistent")) else {
            panic!("afxdp:lo:fast accepted");
        };
        assert!(
            e.contains("`fast` is neither a queue number nor an XDP mode"),
            "{e}"
        );
    }
}
