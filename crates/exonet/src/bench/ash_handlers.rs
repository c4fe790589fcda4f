//! The handler cases of `exonet bench ash`.
//!
//! - `remote-increment`, `us_rtt`, the mean (the ASH paper's Table 6 and
//!   Figure 5):
//!   a client sends a 4-byte request naming a counter in the server's
//!   window; the server increments it and replies with the new value (8
//!   bytes). Two hosts in this process, each a multiplexer daemon on a
//!   memwire cable, the server an application on host B. Systems
//!   `handler-N`: the reply comes from the `remote_increment` handler in
//!   B's multiplexer; `app-N`: from the server application's own thread,
//!   polling its socket (runnable, as the paper's polling process; a
//!   thread that sleeps in `recv_from` is woken ahead of CPU-bound ones by
//!   Linux's scheduler, the "more sophisticated scheduler" §5.2 mentions). N (0, 1, 2, 4, 8) CPU-bound processes compete
//!   for the CPUs meanwhile. The multiplexers and the client run at nice
//!   -20 (as a kernel's receive path and another host would), the server
//!   application and the competing processes at 0; without the right to
//!   raise priorities (root) the case is skipped. Goal: `handler-8` within
//!   1.2 times `handler-0` while the application's path grows.
//! - `handler-overhead`, `ns_per_frame`: one invocation as the multiplexer
//!   makes it, on a 128-byte UDP frame, for `empty` (a handler that
//!   returns at once); and for the Figure 3 remote write (its payload
//!   copied into the window), `remote-write-wasm` as a downloaded handler
//!   against `remote-write-native`, the same logic compiled into the
//!   multiplexer. Goal: the empty handler under 50 ns.
//! - `handler-udp-below`, `ns_per_frame`: a 1472-byte UDP datagram whose
//!   payload a handler copies into its window, its checksum verified:
//!   `checksum-in-loop` with UDP below the handler (§2.3: the checksum runs
//!   in the handler's copying loop), `checksum-separate` with the same check
//!   as a pass of its own before a handler that copies. Goal: in the loop
//!   no slower than separate.

use std::hint::black_box;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exonet_ash::handler::examples;
use exonet_ash::handler::{
    Below, Engine, Handler, HandlerConfig, Outbox, Outcome, Window, NULL_PIPE,
};
use exonet_ash::pipe::builtins;
use exonet_shm::control::HandlerSpec;
use exonet_stack::{Stack, StackConfig, UdpSocket};
use exonet_wire::MacAddr;

use crate::bench::endpoint::peer::Peer;
use crate::bench::measure::{self, median};
use crate::bench::report::{Fail, Outcome as Out, Reporter};
use crate::bench::RunOpts;
use exonet::hosts::{self, set_scheduler};

pub const REMOTE_INCREMENT: &str = "remote-increment";
pub const HANDLER_OVERHEAD: &str = "handler-overhead";
pub const UDP_BELOW: &str = "handler-udp-below";
/// The systems of `handler-udp-below`.
pub const UDP_BELOW_SYSTEMS: [&str; 2] = ["checksum-in-loop", "checksum-separate"];
/// Its payload: a full Ethernet MTU's datagram.
const UDP_BELOW_PAYLOAD: usize = 1472;
/// Competing processes on the server's side.
pub const LOADS: [usize; 5] = [0, 1, 2, 4, 8];
/// The systems of `handler-overhead`.
pub const OVERHEAD_SYSTEMS: [&str; 3] = ["empty", "remote-write-wasm", "remote-write-native"];

const PORT: u16 = 7100;
/// Real-time priorities: the multiplexers' and the client's, above the
/// user processes' round robin.
const KERNEL_PRIORITY: i32 = 2;
const USER_PRIORITY: i32 = 1;
/// The counter's place in the server's window.
const COUNTER: u32 = 64;

/// Where the reply comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Server {
    Handler,
    App,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Server::Handler => "handler",
            Server::App => "app",
        }
    }
}

/// Runs `remote-increment` for every load and both servers.
pub fn remote_increment(opts: &RunOpts, rep: &mut Reporter) {
    let systems = LOADS
        .iter()
        .flat_map(|&n| [Server::Handler, Server::App].map(|s| format!("{}-{n}", s.name())));
    let skip = |rep: &mut Reporter, why: Fail| {
        for system in systems.clone() {
            let why = match &why {
                Fail::Skip(s) => Fail::Skip(s.clone()),
                Fail::Error(s) => Fail::Error(s.clone()),
            };
            rep.push(REMOTE_INCREMENT, &system, "us_rtt", Out::of(Err(why)));
        }
    };
    // Real-time policies need root (CAP_SYS_NICE): try on a thread of ours.
    let probe = std::thread::spawn(|| set_scheduler(0, libc::SCHED_FIFO, KERNEL_PRIORITY));
    if let Err(e) = probe
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the probe panicked")))
    {
        return skip(
            rep,
            Fail::Skip(format!(
                "needs root to set real-time scheduling policies ({e})"
            )),
        );
    }
    let kernel = Some((libc::SCHED_FIFO, KERNEL_PRIORITY));
    let hosts = match hosts::two_hosts_scheduled("bench-ash", kernel) {
        Ok(h) => h,
        Err(e) => return skip(rep, Fail::Error(format!("two hosts on memwire: {e}"))),
    };
    for (i, &load) in LOADS.iter().enumerate() {
        rep.progress(&format!("{REMOTE_INCREMENT}: {load} competing processes"));
        // Long enough for several round-robin turns of every process.
        let window = if opts.quick {
            Duration::from_millis(150 + 50 * load as u64)
        } else {
            Duration::from_millis(600 + 250 * load as u64)
        };
        let hogs: Result<Vec<Peer>, Fail> = (0..load).map(|_| hog()).collect();
        for server in [Server::Handler, Server::App] {
            let system = format!("{}-{load}", server.name());
            let port = PORT + (2 * i + (server == Server::App) as usize) as u16;
            let r = hogs
                .as_ref()
                .map_err(clone_fail)
                .and_then(|_| round_trips(&hosts, server, port, window));
            rep.push(REMOTE_INCREMENT, &system, "us_rtt", Out::of(r));
        }
    }
    let last = LOADS[LOADS.len() - 1];
    rep.goal(
        REMOTE_INCREMENT,
        "us_rtt",
        (&format!("handler-{last}"), "handler-0"),
        "<= 1.2",
        |r| r <= 1.2,
    );
    rep.goal(
        REMOTE_INCREMENT,
        "us_rtt",
        (&format!("app-{last}"), "app-0"),
        "> 1.2 (the application's path grows)",
        |r| r > 1.2,
    );
}

fn clone_fail(f: &Fail) -> Fail {
    match f {
        Fail::Skip(s) => Fail::Skip(s.clone()),
        Fail::Error(s) => Fail::Error(s.clone()),
    }
}

/// A CPU-bound user process in the round robin, killed when dropped.
fn hog() -> Result<Peer, Fail> {
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", "while :; do :; done"]);
    let p = Peer::spawn(cmd, &[], "competing")?;
    set_scheduler(p.pid() as i32, libc::SCHED_RR, USER_PRIORITY)
        .map_err(|e| Fail::Error(format!("scheduling a competing process: {e}")))?;
    Ok(p)
}

fn io_fail(what: &'static str) -> impl Fn(io::Error) -> Fail {
    move |e| Fail::Error(format!("{what}: {e}"))
}

/// The median round trip, in microseconds, of remote increments from host
/// A to a server on host B on `port`, over `window` after a warm-up.
fn round_trips(
    hosts: &hosts::TwoHosts,
    server: Server,
    port: u16,
    window: Duration,
) -> Result<f64, Fail> {
    // The application polls, as the paper's did: runnable, it waits for
    // its turn on a CPU with the competing processes.
    let config = StackConfig {
        window: 4096,
        busy_poll: match server {
            Server::App => Duration::from_millis(100),
            Server::Handler => Duration::ZERO,
        },
        ..StackConfig::default()
    };
    let b = Stack::open_with(hosts.b.socket(), &config).map_err(io_fail("server stack"))?;
    let sock =
        UdpSocket::bind(&b, SocketAddrV4::new(hosts::B, port)).map_err(io_fail("server socket"))?;
    let win = b
        .window()
        .ok_or_else(|| Fail::Error("the server stack has no window".into()))?;
    win.store_u64(COUNTER as usize, 0)
        .map_err(io_fail("window"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let app = match server {
        Server::Handler => {
            sock.install_handler(&HandlerSpec {
                module: examples::REMOTE_INCREMENT_WAT.as_bytes().to_vec(),
                window: Some((win.offset(), win.len() as u32)),
                ..HandlerSpec::default()
            })
            .map_err(io_fail("installing the handler"))?;
            None
        }
        Server::App => {
            let stop = stop.clone();
            let sock = sock.try_clone().map_err(io_fail("server socket"))?;
            Some(std::thread::spawn(move || {
                set_scheduler(0, libc::SCHED_RR, USER_PRIORITY)
                    .map_err(io_fail("server priority"))?;
                serve(&sock, &win, &stop)
            }))
        }
    };
    let client = std::thread::spawn({
        let socket = hosts.a.socket().to_path_buf();
        move || -> Result<f64, Fail> {
            set_scheduler(0, libc::SCHED_FIFO, KERNEL_PRIORITY)
                .map_err(io_fail("client priority"))?;
            let a = Stack::open(&socket).map_err(io_fail("client stack"))?;
            let c = UdpSocket::bind(&a, SocketAddrV4::new(hosts::A, 0))
                .map_err(io_fail("client socket"))?;
            c.connect(SocketAddrV4::new(hosts::B, port))
                .map_err(io_fail("client connect"))?;
            c.set_read_timeout(Some(Duration::from_secs(2)))
                .map_err(io_fail("client socket"))?;
            client(&c, window)
        }
    });
    let r = client
        .join()
        .unwrap_or_else(|_| Err(Fail::Error("the client panicked".into())));
    stop.store(true, Ordering::Relaxed);
    if let Some(app) = app {
        app.join()
            .unwrap_or_else(|_| Err(Fail::Error("the server panicked".into())))?;
    }
    r
}

/// The server application: answers remote increments itself, as the
/// handler does (`handlers/remote_increment.wat`), until `stop`.
fn serve(sock: &UdpSocket, win: &exonet_stack::Window, stop: &AtomicBool) -> Result<(), Fail> {
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(io_fail("server socket"))?;
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(Fail::Error(format!("server receive: {e}"))),
        };
        let Some(off) = buf[..n].first_chunk::<4>().map(|b| u32::from_le_bytes(*b)) else {
            continue;
        };
        let v = win
            .load_u64(off as usize)
            .and_then(|v| win.store_u64(off as usize, v + 1).map(|()| v + 1));
        if let Ok(v) = v {
            sock.send_to(&v.to_le_bytes(), from)
                .map_err(io_fail("server send"))?;
        }
    }
    Ok(())
}

/// Times remote increments: a warm-up, then the mean round trip over
/// `window` (the paper's "microseconds per roundtrip"). Not the median: a
/// closed loop has one request waiting while the server is off the CPU,
/// one sample however long the wait, so the median would hide the waits.
/// Each reply must be the counter one above the last.
fn client(c: &UdpSocket, window: Duration) -> Result<f64, Fail> {
    let mut last = None;
    let mut buf = [0u8; 64];
    let mut once = || -> Result<(), Fail> {
        c.send(&COUNTER.to_le_bytes())
            .map_err(io_fail("client send"))?;
        let n = c.recv(&mut buf).map_err(io_fail("client receive"))?;
        let v = buf[..n]
            .first_chunk::<8>()
            .map(|b| u64::from_le_bytes(*b))
            .ok_or_else(|| Fail::Error(format!("a reply of {n} bytes")))?;
        if let Some(l) = last {
            if v != l + 1 {
                return Err(Fail::Error(format!("the counter went from {l} to {v}")));
            }
        }
        last = Some(v);
        Ok(())
    };
    let warm = Instant::now() + window / 4;
    while Instant::now() < warm {
        once()?;
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < window {
        once()?;
        n += 1;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Runs `handler-overhead` for its three systems.
pub fn overhead(opts: &RunOpts, rep: &mut Reporter) {
    let frame = remote_write_frame(64);
    let budget = opts.budget();
    for system in OVERHEAD_SYSTEMS {
        rep.progress(&format!("{HANDLER_OVERHEAD}: {system}"));
        let r = per_frame(system, &frame, budget);
        rep.push(HANDLER_OVERHEAD, system, "ns_per_frame", Out::of(r));
    }
    if let Some(v) = rep.value(HANDLER_OVERHEAD, "empty", "ns_per_frame") {
        rep.note(format!(
            "goal {HANDLER_OVERHEAD} ns_per_frame: empty = {v:.1} ns (want < 50): {}",
            if v < 50.0 { "met" } else { "not met" }
        ));
    }
    rep.goal(
        HANDLER_OVERHEAD,
        "ns_per_frame",
        ("remote-write-wasm", "remote-write-native"),
        "(for reference)",
        |_| true,
    );
}

/// Runs `handler-udp-below` for its two systems.
pub fn udp_below(opts: &RunOpts, rep: &mut Reporter) {
    let payload: Vec<u8> = (0..UDP_BELOW_PAYLOAD).map(|i| (i * 31) as u8).collect();
    let frame = udp_frame(&payload);
    let budget = opts.budget();
    for system in UDP_BELOW_SYSTEMS {
        rep.progress(&format!("{UDP_BELOW}: {system}"));
        let r = vector_per_frame(system == UDP_BELOW_SYSTEMS[0], &frame, budget);
        rep.push(UDP_BELOW, system, "ns_per_frame", Out::of(r));
    }
    rep.goal(
        UDP_BELOW,
        "ns_per_frame",
        (UDP_BELOW_SYSTEMS[0], UDP_BELOW_SYSTEMS[1]),
        "at most 1x",
        |r| r <= 1.0,
    );
}

/// Copies its message, from `$from` on, into the window at 0.
fn vector_wat(from: usize) -> String {
    format!(
        r#"(module
        (import "exonet" "consume_window" (func $cw (param i32 i32 i32) (result i32)))
        (import "exonet" "skip" (func $skip (param i32) (result i32)))
        (func (export "ash_handle") (param $len i32) (result i32)
          (drop (call $skip (i32.const {from})))
          (if (i32.lt_s (call $cw (i32.const 0) (i32.sub (local.get $len) (i32.const {from})) (i32.const {NULL_PIPE})) (i32.const 0))
            (then (unreachable)))
          (i32.const 0)))"#
    )
}

/// Nanoseconds per datagram vectored into a window with its checksum
/// verified: in the handler's loop (UDP below it), or in a pass before it.
fn vector_per_frame(in_loop: bool, frame: &[u8], budget: measure::Budget) -> Result<f64, Fail> {
    const HEADERS: usize = 14 + 20 + 8;
    let mut window = vec![0u8; 4096];
    let mut out = Outbox::new(4, 2048);
    let engine = Engine::new().map_err(|e| Fail::Error(e.to_string()))?;
    let (wat, below) = if in_loop {
        (vector_wat(0), Below::Udp)
    } else {
        (vector_wat(HEADERS), Below::Nothing)
    };
    // SAFETY: `window` outlives the handler, which is dropped at the end
    // of this function, before it.
    let win = unsafe { Window::new(window.as_mut_ptr(), window.len()) };
    let config = HandlerConfig {
        below,
        ..HandlerConfig::default()
    };
    let mut h = Handler::install(&engine, wat.as_bytes(), Vec::new(), Some(win), config)
        .map_err(|e| Fail::Error(format!("{UDP_BELOW}: {e}")))?;
    // The separate pass: the UDP checksum over the pseudo-header and the
    // datagram, as a layer below would check it before the handler runs.
    let separate = |frame: &[u8]| {
        let mut pseudo = [0u8; 12];
        pseudo[..8].copy_from_slice(&frame[26..34]);
        pseudo[9] = 17;
        pseudo[10..12].copy_from_slice(&frame[38..40]);
        let acc = builtins::checksum_accumulate(0, &pseudo);
        builtins::fold_checksum(builtins::checksum_accumulate(acc, &frame[34..])) == 0
    };
    let mut once = |frame: &[u8], out: &mut Outbox| {
        out.clear();
        if !in_loop && !separate(frame) {
            return Outcome::Dropped;
        }
        h.run(frame, out).outcome
    };
    let first = once(frame, &mut out);
    if first != Outcome::Consumed {
        return Err(Fail::Error(format!("{UDP_BELOW}: {first:?}")));
    }
    let mut batch = |n: u64| {
        let t = Instant::now();
        for _ in 0..n {
            black_box(once(black_box(frame), &mut out));
        }
        t.elapsed()
    };
    Ok(time_batches(&mut batch, budget))
}

/// A UDP frame from the client to the server's port.
fn udp_frame(payload: &[u8]) -> Vec<u8> {
    exonet_wire::build::udp_frame(
        MacAddr([2, 0, 0, 0, 0, 1]),
        MacAddr([2, 0, 0, 0, 0, 2]),
        Ipv4Addr::new(10, 77, 93, 1),
        Ipv4Addr::new(10, 77, 93, 2),
        5000,
        PORT,
        payload,
    )
}

/// A UDP frame whose payload is a Figure 3 remote write: window offset,
/// length, then `len` bytes.
fn remote_write_frame(len: usize) -> Vec<u8> {
    let mut payload = Vec::with_capacity(8 + len);
    payload.extend_from_slice(&0u32.to_le_bytes());
    payload.extend_from_slice(&(len as u32).to_le_bytes());
    payload.extend((0..len).map(|i| i as u8));
    udp_frame(&payload)
}

/// The native remote write: what the handler does, in Rust.
fn native_remote_write(frame: &[u8], window: &mut [u8]) -> Outcome {
    let Some(ihl) = frame.get(14).map(|b| ((b & 0x0f) as usize) * 4) else {
        return Outcome::Deliver;
    };
    let p = 14 + ihl + 8;
    let (Some(off), Some(len)) = (frame.get(p..p + 4), frame.get(p + 4..p + 8)) else {
        return Outcome::Deliver;
    };
    let off = u32::from_le_bytes(off.try_into().unwrap_or_default()) as usize;
    let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
    match (
        frame.get(p + 8..p + 8 + len),
        window.get_mut(off..off + len),
    ) {
        (Some(src), Some(dst)) => {
            dst.copy_from_slice(src);
            Outcome::Consumed
        }
        _ => Outcome::Deliver,
    }
}

/// Nanoseconds per invocation of `system` on `frame`.
fn per_frame(system: &str, frame: &[u8], budget: measure::Budget) -> Result<f64, Fail> {
    let mut window = vec![0u8; 4096];
    let mut out = Outbox::new(4, 2048);
    if system == "remote-write-native" {
        let mut batch = |n: u64| {
            let t = Instant::now();
            for _ in 0..n {
                out.clear();
                black_box(native_remote_write(black_box(frame), &mut window));
            }
            t.elapsed()
        };
        return Ok(time_batches(&mut batch, budget));
    }
    let engine = Engine::new().map_err(|e| Fail::Error(e.to_string()))?;
    let (wat, want) = match system {
        "empty" => (examples::EMPTY_WAT, Outcome::Deliver),
        _ => (examples::REMOTE_WRITE_WAT, Outcome::Consumed),
    };
    // SAFETY: `window` outlives the handler, which is dropped at the end
    // of this function, before it.
    let win = unsafe { Window::new(window.as_mut_ptr(), window.len()) };
    let mut h = Handler::install(
        &engine,
        wat.as_bytes(),
        Vec::new(),
        Some(win),
        HandlerConfig::default(),
    )
    .map_err(|e| Fail::Error(format!("{system}: {e}")))?;
    out.clear();
    let first = h.run(frame, &mut out).outcome;
    if first != want {
        return Err(Fail::Error(format!("{system}: {first:?}, not {want:?}")));
    }
    let mut batch = |n: u64| {
        let t = Instant::now();
        for _ in 0..n {
            out.clear();
            black_box(h.run(black_box(frame), &mut out));
        }
        t.elapsed()
    };
    Ok(time_batches(&mut batch, budget))
}

/// The median of the budget's repetitions, in ns per call.
fn time_batches(batch: &mut impl FnMut(u64) -> Duration, budget: measure::Budget) -> f64 {
    let n = measure::calibrate(budget.per_rep(), batch);
    batch(n);
    let reps = (0..budget.reps)
        .map(|_| batch(n).as_nanos() as f64 / n as f64)
        .collect();
    median(reps)
}
