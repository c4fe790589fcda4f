//! The demo's handler part (ASH): an application on host B installs the
//! remote-increment handler on its UDP socket, with a window of its segment
//! the handler may write; a client on A increments the counter, answered by
//! B's multiplexer without B's application running; then B answers the same
//! requests itself, for comparison. A handler that never ends is installed
//! on another socket: each of its frames runs out of fuel and is delivered
//! untouched, and the counters say so. Then a handler with UDP below it
//! (§2.3): it sees the payload only, and moves it into the window through a
//! byte swap in the loop that also verifies the UDP checksum. Last, a pipe
//! list (Internet checksum and byte swap, the paper's Figure 1) compiled
//! into one loop.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exonet::hosts::{TwoHosts, A, B};
use exonet_ash::handler::examples;
use exonet_ash::pipe::{builtins, PipeList};
use exonet_ash::Transfer;
use exonet_shm::control::{Below, Client, HandlerSpec};
use exonet_stack::{Stack, StackConfig, UdpSocket, Window};

use super::tour::{self, Summary};

const INCREMENT_PORT: u16 = 10;
const APP_PORT: u16 = 11;
const ENDLESS_PORT: u16 = 12;
const BELOW_PORT: u16 = 13;
/// Where the handler with UDP below it puts each payload in B's window.
const VECTORED: u32 = 1024;
/// Moves its message (the UDP payload) to window offset 1024 through pipe
/// list 0.
const VECTOR: &str = r#"(module
    (import "exonet" "consume_window" (func $cw (param i32 i32 i32) (result i32)))
    (func (export "ash_handle") (param $len i32) (result i32)
      (if (i32.lt_s (call $cw (i32.const 1024) (local.get $len) (i32.const 0)) (i32.const 0))
        (then (unreachable)))
      (i32.const 0)))"#;
/// The counter's place in B's window.
const COUNTER: u32 = 64;
/// A handler that loops until its fuel runs out.
const ENDLESS: &str = r#"(module (func (export "ash_handle") (param i32) (result i32)
    (loop $forever (br $forever)) (i32.const 0)))"#;

fn err(what: &'static str) -> impl Fn(std::io::Error) -> String {
    move |e| format!("{what}: {e}")
}

pub fn tour(h: &TwoHosts, n: usize) -> Result<(), String> {
    println!("\nhandlers (ASH): code B's application installs in B's multiplexer, run on each frame of its socket before delivery");
    let config = StackConfig {
        window: 4096,
        ..tour::busy()
    };
    let b = tour::open(h.b.socket(), &config)?;
    let a = tour::open(h.a.socket(), &tour::busy())?;
    let win = b.window().ok_or("B's stack has no window")?;
    win.store_u64(COUNTER as usize, 0).map_err(err("window"))?;
    let by_handler = UdpSocket::bind(&b, (B, INCREMENT_PORT)).map_err(err("bind"))?;
    by_handler
        .install_handler(&HandlerSpec {
            module: examples::REMOTE_INCREMENT_WAT.as_bytes().to_vec(),
            window: Some((win.offset(), win.len() as u32)),
            ..HandlerSpec::default()
        })
        .map_err(err("installing the remote-increment handler"))?;
    let client = UdpSocket::bind(&a, (A, 0)).map_err(err("bind"))?;
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(err("client"))?;
    let handler = increments(&client, INCREMENT_PORT, n)?;
    let app = {
        let sock = UdpSocket::bind(&b, (B, APP_PORT)).map_err(err("bind"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let server = std::thread::spawn({
            let (stop, win) = (stop.clone(), win.clone());
            move || serve(&sock, &win, &stop)
        });
        let r = increments(&client, APP_PORT, n);
        stop.store(true, Ordering::Relaxed);
        server
            .join()
            .map_err(|_| "the server thread panicked".to_string())??;
        r?
    };
    let counter = win.load_u64(COUNTER as usize).map_err(err("window"))?;
    println!("  remote increment, 4-byte request, 8-byte reply ({n} each; the counter, read by B's application from its window: {counter})");
    println!(
        "  {:<36}{:>8}{:>9}{:>9}",
        "round trips, µs", "min", "p50", "p99"
    );
    for (label, s) in [
        ("answered by B's handler", handler),
        ("answered by B's application", app),
    ] {
        println!(
            "  {label:<36}{:>8.1}{:>9.1}{:>9.1}",
            us(s.min),
            us(s.p50),
            us(s.p99)
        );
    }
    endless(h, &b, &client)?;
    below(&b, &win, &client)?;
    pipes()
}

/// A handler with UDP below it: B's multiplexer checks the headers, the
/// handler moves the payload into the window through a byte swap, and the
/// UDP checksum is computed in that same loop.
fn below(b: &Stack, win: &Window, client: &UdpSocket) -> Result<(), String> {
    let swap =
        PipeList::new(vec![builtins::byte_swap32()]).map_err(|e| format!("pipe list: {e}"))?;
    let sock = UdpSocket::bind(b, (B, BELOW_PORT)).map_err(err("bind"))?;
    sock.install_handler(&HandlerSpec {
        module: VECTOR.as_bytes().to_vec(),
        window: Some((win.offset(), win.len() as u32)),
        pipe_lists: vec![swap.encode()],
        below: Below::Udp,
        ..HandlerSpec::default()
    })
    .map_err(err("installing the handler with UDP below it"))?;
    let payload: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
    let want: Vec<u8> = payload
        .chunks(4)
        .flat_map(|w| w.iter().rev().copied().collect::<Vec<u8>>())
        .collect();
    client
        .send_to(&payload, SocketAddrV4::new(B, BELOW_PORT))
        .map_err(err("send"))?;
    // B's application only looks at its window: nothing is delivered.
    let start = Instant::now();
    let mut got = vec![0u8; payload.len()];
    loop {
        win.read(VECTORED as usize, &mut got)
            .map_err(err("window"))?;
        if got == want {
            break;
        }
        if start.elapsed() > Duration::from_secs(5) {
            return Err("the handler with UDP below it did not fill the window".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!(
        "  a handler with UDP below it (§2.3): a 1000-byte datagram's payload moved into B's window through a byte swap, its UDP checksum verified in the same loop (checked)"
    );
    Ok(())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `n` remote increments of B's counter through `port`, each checked.
fn increments(client: &UdpSocket, port: u16, n: usize) -> Result<Summary, String> {
    let to = SocketAddrV4::new(B, port);
    let mut buf = [0u8; 64];
    let mut last = None;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        client
            .send_to(&COUNTER.to_le_bytes(), to)
            .map_err(err("send"))?;
        let (k, _) = client.recv_from(&mut buf).map_err(err("no reply"))?;
        samples.push(t.elapsed());
        let v = buf[..k]
            .first_chunk::<8>()
            .map(|b| u64::from_le_bytes(*b))
            .ok_or(format!("a reply of {k} bytes"))?;
        if last.is_some_and(|l| v != l + 1) {
            return Err(format!("the counter went from {last:?} to {v}"));
        }
        last = Some(v);
    }
    Summary::of(samples).ok_or_else(|| "no round trips".to_string())
}

/// B's application answering remote increments itself, until `stop`.
fn serve(sock: &UdpSocket, win: &Window, stop: &AtomicBool) -> Result<(), String> {
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .map_err(err("server"))?;
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        let Ok((k, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let Some(off) = buf[..k].first_chunk::<4>().map(|b| u32::from_le_bytes(*b)) else {
            continue;
        };
        let off = off as usize;
        let v = win.load_u64(off).map_err(err("window"))? + 1;
        win.store_u64(off, v).map_err(err("window"))?;
        sock.send_to(&v.to_le_bytes(), from).map_err(err("reply"))?;
    }
    Ok(())
}

/// A handler that never ends: its frames still arrive, and the multiplexer
/// counts what happened.
fn endless(h: &TwoHosts, b: &Stack, client: &UdpSocket) -> Result<(), String> {
    let sock = UdpSocket::bind(b, (B, ENDLESS_PORT)).map_err(err("bind"))?;
    sock.install_handler(&HandlerSpec {
        module: ENDLESS.as_bytes().to_vec(),
        ..HandlerSpec::default()
    })
    .map_err(err("installing the endless handler"))?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(err("server"))?;
    let mut buf = [0u8; 64];
    for i in 0..3u8 {
        client
            .send_to(&[i], SocketAddrV4::new(B, ENDLESS_PORT))
            .map_err(err("send"))?;
        sock.recv_from(&mut buf)
            .map_err(err("the endless handler's frame"))?;
    }
    let records = Client::connect(h.b.socket())
        .and_then(|mut c| c.stats())
        .map_err(|e| format!("B's counters: {e}"))?;
    // The endless handler's channel: the one whose handler ran out of fuel.
    let ours = records
        .iter()
        .filter(|r| r.kind == "channel")
        .max_by_key(|r| r.get("handler_out_of_fuel"));
    let field = |name: &str| ours.and_then(|r| r.get(name)).unwrap_or(0);
    println!(
        "  a handler that never ends, on another socket: 3 datagrams, each delivered to the application after the handler ran out of fuel ({} runs, {} out of fuel); the other sockets never noticed",
        field("handler_runs"),
        field("handler_out_of_fuel"),
    );
    Ok(())
}

/// The paper's Figure 1: a checksum pipe and a byte-swap pipe composed at
/// run time and compiled into one copying loop.
fn pipes() -> Result<(), String> {
    let list = PipeList::new(vec![builtins::checksum(), builtins::byte_swap32()])
        .map_err(|e| format!("pipe list: {e}"))?;
    let mut compiled = list.compile().map_err(|e| format!("pipe list: {e}"))?;
    let src: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    compiled.transfer(&src, &mut dst);
    let sum = builtins::fold_checksum(compiled.reg(0, 0).unwrap_or(0));
    let want = builtins::fold_checksum(builtins::checksum_accumulate(0, &src));
    let swapped = dst
        .chunks(4)
        .zip(src.chunks(4))
        .all(|(d, s)| d.iter().eq(s.iter().rev()));
    println!(
        "  dynamic ILP: checksum + byte swap pipes compiled into one loop ({} bytes of code): 4096 bytes copied, swapped ({}) and summed (0x{sum:04x}, {})",
        compiled.code_size(),
        if swapped { "checked" } else { "WRONG" },
        if sum == want { "checked" } else { "WRONG" },
    );
    if !swapped || sum != want {
        return Err("the compiled pipe list disagrees with the reference".into());
    }
    Ok(())
}
