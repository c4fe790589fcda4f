//! `exonet demo`: the tour that needs no privileges.
//!
//! One host (10.77.0.1) runs a handful of applications, each of which owns
//! its traffic through a DPF filter written in tcpdump syntax, as the
//! multiplexer will install them. A realistic mix of frames (connections,
//! new connections, DNS and NTP replies, RPC servers, pings, ARP, traffic for
//! other hosts, non-first fragments, IPv6) is classified by the JIT and by
//! the interpreter; the demo checks they agree and prints who got what and
//! how long a frame took. Then two such hosts talk over an in-memory cable:
//! first raw frames between two multiplexers on one thread ([`raw`]), then
//! applications on the protocol library's sockets, each host a multiplexer
//! daemon on its own thread ([`tour`]). With `--veth`, the sockets tour runs
//! against Linux instead ([`veth`]).

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use exonet::hosts::{in_process_pair, two_hosts, A, B};
use exonet_dpf::{tcpdump, Dpf, Engine, FilterId};
use exonet_wire::build;
use exonet_wire::ethernet::MacAddr;
use exonet_wire::rng::SplitMix64;
use exonet_wire::tcp::flags;

mod ash;
mod raw;
mod tcp;
mod tour;
mod veth;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Frames in the traffic mix.
    #[arg(long, default_value_t = 200_000)]
    pub frames: usize,
    /// Seed of the traffic mix.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Round trips of each measurement between the two hosts (pings, UDP
    /// echoes; the 20 kB datagram makes a twentieth as many).
    #[arg(long, default_value_t = 1_000)]
    pub round_trips: usize,
    /// Megabytes of the TCP transfer over the lossy cable.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub tcp_mb: u64,
    /// Run the sockets tour against Linux in a network namespace over a
    /// veth pair instead (needs root).
    #[arg(long)]
    pub veth: bool,
}

const HOST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const RPC_PORTS: u16 = 64;

/// The applications on the host and the filter each installs.
fn applications() -> Vec<(String, String)> {
    let mut apps = vec![
        (
            "web (listening)".to_string(),
            "tcp and dst host 10.77.0.1 and dst port 80".to_string(),
        ),
        (
            "web (10.77.1.5:40000)".to_string(),
            "tcp and src host 10.77.1.5 and src port 40000 and dst host 10.77.0.1 and dst port 80"
                .to_string(),
        ),
        (
            "ssh".to_string(),
            "tcp and dst host 10.77.0.1 and dst port 22".to_string(),
        ),
        (
            "dns client".to_string(),
            "udp and src port 53 and dst host 10.77.0.1 and dst port 33000".to_string(),
        ),
        (
            "ntp".to_string(),
            "udp and dst host 10.77.0.1 and dst port 123".to_string(),
        ),
        (
            "ping".to_string(),
            "icmp and dst host 10.77.0.1".to_string(),
        ),
        ("arp".to_string(), "arp and dst host 10.77.0.1".to_string()),
    ];
    for i in 0..RPC_PORTS {
        apps.push((
            format!("rpc server {}", 20000 + i),
            format!("udp and dst host 10.77.0.1 and dst port {}", 20000 + i),
        ));
    }
    apps
}

fn traffic(n: usize, seed: u64) -> Vec<Vec<u8>> {
    // A deterministic traffic mix from the seed.
    let mut rng = SplitMix64::new(seed);
    let us = MacAddr([0x02, 0, 0, 0, 0, 1]);
    let them = MacAddr([0x02, 0, 0, 0, 0, 2]);
    let peer = |rng: &mut SplitMix64| Ipv4Addr::new(10, 77, 1, 2 + rng.below(200) as u8);
    let tcp = |src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, fl: u8| {
        build::tcp_frame(
            them,
            us,
            src,
            dst,
            sport,
            dport,
            fl,
            1,
            1,
            &[],
            b"GET / HTTP/1.1\r\n",
        )
    };
    let udp = |src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16| {
        build::udp_frame(them, us, src, dst, sport, dport, &[0u8; 48])
    };
    (0..n)
        .map(|_| {
            let roll = rng.below(100);
            match roll {
                0..=29 => tcp(Ipv4Addr::new(10, 77, 1, 5), HOST, 40000, 80, flags::ACK),
                30..=34 => {
                    let p = peer(&mut rng);
                    tcp(p, HOST, 30000 + rng.below(30000) as u16, 80, flags::SYN)
                }
                35..=39 => tcp(peer(&mut rng), HOST, 50022, 22, flags::ACK),
                40..=49 => udp(Ipv4Addr::new(10, 77, 0, 53), HOST, 53, 33000),
                50..=51 => udp(peer(&mut rng), HOST, 123, 123),
                52..=71 => {
                    let port = 20000 + rng.below(RPC_PORTS as u64) as u16;
                    udp(peer(&mut rng), HOST, 40000, port)
                }
                72..=74 => build::icmp_echo(them, us, peer(&mut rng), HOST, 7, 1, &[0; 56]),
                75..=76 => build::arp_request(them, peer(&mut rng), HOST),
                77..=86 => {
                    // Traffic for another host on the segment.
                    let other = Ipv4Addr::new(10, 77, 0, 99);
                    tcp(peer(&mut rng), other, 40000, 80, flags::ACK)
                }
                87..=89 => {
                    // A non-first fragment: no port is visible.
                    let mut f = udp(peer(&mut rng), HOST, 40000, 20000);
                    f[20] = 0x00;
                    f[21] = 0xb9;
                    f
                }
                90..=91 => {
                    let mut f = udp(peer(&mut rng), HOST, 40000, 20000);
                    f[12] = 0x86;
                    f[13] = 0xdd;
                    f
                }
                _ => {
                    // Nobody listens: the multiplexer answers RST / port unreachable.
                    let port = 1024 + rng.below(8000) as u16;
                    if roll & 1 == 0 {
                        tcp(peer(&mut rng), HOST, 40000, port, flags::SYN)
                    } else {
                        udp(peer(&mut rng), HOST, 40000, port)
                    }
                }
            }
        })
        .collect()
}

/// Median ns per frame of classifying `frames` with `dpf`: passes over a
/// window of frames that fits in cache, as a receive ring's would.
fn time_per_frame(dpf: &Dpf, frames: &[Vec<u8>]) -> f64 {
    let window = &frames[..frames.len().min(4096)];
    let passes = (1_000_000 / window.len()).max(1);
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..passes {
                for f in window {
                    black_box(dpf.demux(black_box(f)));
                }
            }
            t.elapsed().as_nanos() as f64 / (passes * window.len()) as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

pub fn run(args: &DemoArgs) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exonet demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_inner(args: &DemoArgs) -> Result<(), String> {
    let n = args.round_trips.max(1);
    if args.veth {
        return veth::tour(n);
    }
    dpf_tour(args)?;
    let raw = raw::tour(n)?;
    sockets(n, raw)?;
    let h = two_hosts("demo-ash").map_err(|e| format!("two hosts on a memwire: {e}"))?;
    ash::tour(&h, n)?;
    drop(h);
    tcp::lossy_transfer(args.tcp_mb << 20)?;
    println!("\nnext: `exonet demo --veth` (root) runs the sockets tour against Linux;");
    println!("      `exonet bench dpf` compares with libpcap, hand-written Rust and eBPF;");
    println!("      `exonet bench endpoint` times the rings against the kernel's paths;");
    println!("      `exonet filter 'tcp and dst port 80' --explain` shows the trie and code.");
    Ok(())
}

fn dpf_tour(args: &DemoArgs) -> Result<(), String> {
    let apps = applications();
    let mut jit = Dpf::with_engine(Engine::Jit);
    let mut interp = Dpf::with_engine(Engine::Interp);
    let mut ids: Vec<FilterId> = Vec::new();
    let t = Instant::now();
    for (name, expr) in &apps {
        let conj = tcpdump::compile(expr).map_err(|e| format!("{name}: {expr}: {e}"))?;
        let id = jit.insert_any(&conj).map_err(|e| e.to_string())?;
        interp.insert_any(&conj).map_err(|e| e.to_string())?;
        ids.push(id);
    }
    let install = t.elapsed();
    let frames = traffic(args.frames.max(1), args.seed);

    let mut counts = vec![0usize; apps.len()];
    let mut unmatched = 0usize;
    for f in &frames {
        let got = jit.demux(f);
        if got != interp.demux(f) {
            return Err(format!("JIT and interpreter disagree on frame {f:02x?}"));
        }
        match got.and_then(|id| ids.iter().position(|&i| i == id)) {
            Some(i) => counts[i] += 1,
            None => unmatched += 1,
        }
    }
    let jit_ns = time_per_frame(&jit, &frames);
    let interp_ns = time_per_frame(&interp, &frames);

    println!(
        "exonet demo: host {HOST}, {} applications, {} frames of mixed traffic\n",
        apps.len(),
        frames.len()
    );
    println!(
        "{:<26} {:>9} {:>7}  filter",
        "application", "frames", "share"
    );
    let share = |n: usize| 100.0 * n as f64 / frames.len() as f64;
    let mut rpc = (0usize, 0usize);
    for ((name, expr), &n) in apps.iter().zip(&counts) {
        if name.starts_with("rpc server") {
            rpc = (rpc.0 + 1, rpc.1 + n);
            continue;
        }
        println!("{name:<26} {n:>9} {:>6.1}%  {expr}", share(n));
    }
    println!(
        "{:<26} {:>9} {:>6.1}%  udp and dst host 10.77.0.1 and dst port 20000..{}",
        format!("rpc servers ({})", rpc.0),
        rpc.1,
        share(rpc.1),
        20000 + RPC_PORTS - 1
    );
    println!(
        "{:<26} {unmatched:>9} {:>6.1}%  (other hosts, fragments, IPv6, closed ports)",
        "no application",
        share(unmatched)
    );
    println!();
    println!(
        "installed {} filters in {:.2} ms ({} compiles, {} fast hash inserts); native code {} bytes",
        apps.len(),
        install.as_secs_f64() * 1e3,
        jit.stats().compiles,
        jit.stats().fast_updates,
        jit.code_size()
    );
    println!("classification, median of 5 passes:");
    println!("  exonet-jit     {jit_ns:>7.1} ns/frame");
    println!(
        "  exonet-interp  {interp_ns:>7.1} ns/frame   ({:.1}x the JIT)",
        interp_ns / jit_ns
    );
    println!("  JIT and interpreter agree on all {} frames", frames.len());
    Ok(())
}

/// The sockets tour between two in-process daemons on a memwire; `raw`, the
/// raw part's round trips, goes in the table as the floor.
fn sockets(n: usize, raw: Vec<std::time::Duration>) -> Result<(), String> {
    let h = two_hosts("demo").map_err(|e| format!("two hosts on a memwire: {e}"))?;
    let (a_busy, a_sleeping) = (
        tour::open(h.a.socket(), &tour::busy())?,
        tour::open(h.a.socket(), &tour::sleeping())?,
    );
    let (b_busy, b_sleeping) = (
        tour::open(h.b.socket(), &tour::busy())?,
        tour::open(h.b.socket(), &tour::sleeping())?,
    );
    println!(
        "\ntwo hosts on a memwire, each a multiplexer daemon on its own thread (A {A}, B {B});\n\
         applications on their own endpoints through the protocol library's sockets:\n\
         A pings B (B's multiplexer answers), then sends UDP to echo applications on B,\n\
         busy-polling (port {BUSY_PORT}) and sleeping (port {SLEEPING_PORT}), {n} round trips each"
    );
    let target = tour::Target {
        addr: B,
        busy_port: BUSY_PORT,
        sleeping_port: SLEEPING_PORT,
    };
    let echoes = [
        tour::Echo::start(&b_busy, BUSY_PORT)?,
        tour::Echo::start(&b_sleeping, SLEEPING_PORT)?,
    ];
    let measured = tour::client_rows(&a_busy, &a_sleeping, &target, n)?;
    for e in echoes {
        e.stop()?;
    }
    // The same sockets with the multiplexers inside the applications: no
    // daemon thread to hand frames to, the sockets' calls drive them.
    let (ia, ib) = in_process_pair(&tour::busy()).map_err(|e| format!("in process: {e}"))?;
    let inproc = {
        let echo = tour::Echo::start(&ib, BUSY_PORT)?;
        let rows = tour::in_process_rows(&ia, B, BUSY_PORT, n)?;
        echo.stop()?;
        rows
    };
    let closed = std::net::SocketAddrV4::new(B, tour::CLOSED_PORT);
    let refused = tour::refused(&a_sleeping, closed)?;
    println!(
        "a connected socket to {closed}, where nobody listens: \"{refused}\" \
         (B's multiplexer answered ICMP port unreachable)"
    );
    let mut rows: Vec<tour::Row> = tour::labels()
        .into_iter()
        .zip(measured)
        .map(|(label, s)| tour::Row {
            label,
            cells: vec![s],
        })
        .collect();
    rows.extend(inproc);
    rows.push(tour::Row {
        label: "UDP 4 B raw frames, one thread".into(),
        cells: vec![tour::Summary::of(raw)],
    });
    tour::print_rtts(&["A -> B"], &rows);
    tour::print_stacks(&[
        ("A busy", &a_busy),
        ("A sleeping", &a_sleeping),
        ("B busy", &b_busy),
        ("B sleeping", &b_sleeping),
        ("A in process", &ia),
        ("B in process", &ib),
    ]);
    tour::print_muxes(&[("A", h.a.socket()), ("B", h.b.socket())])
}

/// The echo applications' ports on B.
const BUSY_PORT: u16 = 7;
const SLEEPING_PORT: u16 = 8;
