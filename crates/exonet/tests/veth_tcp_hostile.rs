//! TCP on the protocol library against hostile input and Linux's corner
//! cases over veth (root only; "skipped: needs root" otherwise), on the rig
//! of tests/veth.rs with Linux's offloads off. tests/scapy/tcp_hostile.py
//! forges segments on a live connection and floods the listener, which
//! answers the SYNs beyond its SYN queue with SYN cookies (RFC 4987 §3.6);
//! during the flood Linux's connections still succeed (through cookies),
//! afterwards the connection still works, new ones succeed, every drop is
//! counted and no connection is left. Then Linux's RST, zero-window probes and
//! keep-alive probes against exonet's tools, and exonet's persist probes
//! against a Linux receiver that stops reading.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::Instant;

use common::daemons::{echo_stats, exonet, finish, json_u64, logged, server, stop_echo, text};
use common::netns::{is_root, run, scapy_script, Rig};
use common::until;

/// SYNs in the flood; the listener's backlog (tcp-pingpong's, the
/// library's default) bounds the half-open connections they make, and the
/// rest get SYN cookies.
const FLOOD: u64 = 2000;
const BACKLOG: u64 = 128;
/// The port of the script's own connection.
const OWN_PORT: &str = "40000";

/// `exonet tcp-pingpong --listen` on port 7: the process and its stdout (its
/// counters), its stderr lines collected.
fn echo_server(
    rig: &mut Rig,
) -> (
    BufReader<ChildStdout>,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let (mut c, log) = server(
        &rig.sock,
        &["tcp-pingpong", "--listen", "--port", "7"],
        "listening on ",
    );
    let out = BufReader::new(c.stdout.take().unwrap());
    rig.procs.push(c);
    (out, log)
}

fn counters(rig: &Rig, out: &mut BufReader<ChildStdout>) -> String {
    echo_stats(rig.procs.last().unwrap(), out)
}

fn counter(line: &str, name: &str) -> u64 {
    json_u64(line, name).unwrap_or_else(|| panic!("no {name}: {line}"))
}

/// A shell command line in Linux's namespace, killed after a minute.
fn sh(rig: &Rig, script: &str) -> Output {
    run(rig
        .linux("sh")
        .args(["-c", &format!("timeout 60 {script}")]))
}

/// Python in Linux's namespace, killed after a minute.
fn python(rig: &Rig, code: &str) -> Command {
    let mut c = rig.linux("timeout");
    c.args(["60", "/usr/bin/python3", "-c", code]);
    c
}

/// A counter of Linux's TCP in its namespace (`nstat`, absolute).
fn linux_counter(rig: &Rig, name: &str) -> u64 {
    let out = run(rig.linux("nstat").args(["-asz", name]));
    text(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(name)).then(|| w.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {name} in nstat's output"))
}

fn tcp_hostile_input(link: &str, suffix: &str, subnet: u8) {
    let started = Instant::now();
    let mut rig = Rig::new(link, suffix, subnet);
    rig.no_offloads();
    let (mut out, log) = echo_server(&mut rig);
    let mut py: Child = rig
        .linux("timeout")
        .args(["120", "/usr/bin/python3"])
        .arg(scapy_script("tcp_hostile.py"))
        .args([&rig.vl, &rig.exo_ip, &rig.exo_mac(), "7"])
        .args([&FLOOD.to_string(), OWN_PORT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = Vec::new();
    let mut lines = BufReader::new(py.stdout.take().unwrap()).lines();
    for l in lines.by_ref() {
        let l = l.unwrap();
        let flooded = l.starts_with("flooded");
        said.push(l);
        if flooded {
            break;
        }
    }
    assert!(
        said.last().is_some_and(|l| l.starts_with("flooded")),
        "{said:#?}"
    );
    // While the flood's half-open connections last, the SYN queue bounds
    // them; the rest of the SYNs are answered with cookies, which keep no
    // state, and none is dropped.
    let mut during = String::new();
    until("the flood is answered", || {
        during = counters(&rig, &mut out);
        counter(&during, "tcp_syn_cookies_sent") >= FLOOD - BACKLOG
    });
    eprintln!("during the flood: {during}");
    assert!(counter(&during, "tcp_open") <= BACKLOG + 2, "{during}");
    assert_eq!(counter(&during, "tcp_syn_dropped"), 0, "{during}");
    // Linux connects with the SYN queue full: a cookie makes the connection,
    // which echoes 1 MiB intact (tcp-pingpong closes after the client's FIN).
    let echoed = python(
        &rig,
        &format!(
            "import os, socket, threading\n\
             data = os.urandom(1 << 20)\n\
             s = socket.create_connection(('{}', 7), timeout=10)\n\
             def send():\n    s.sendall(data)\n    s.shutdown(socket.SHUT_WR)\n\
             t = threading.Thread(target=send)\n\
             t.start()\n\
             got = bytearray()\n\
             while True:\n    b = s.recv(1 << 16)\n    if not b: break\n    got += b\n\
             t.join()\n\
             print(len(got), got == data)\n",
            rig.exo_ip
        ),
    )
    .output()
    .unwrap();
    assert_eq!(
        text(&echoed.stdout),
        "1048576 True\n",
        "{}",
        text(&echoed.stderr)
    );
    let got = sh(&rig, &format!("printf during | nc -N {} 7", rig.exo_ip));
    assert_eq!(text(&got.stdout), "during");
    let now = counters(&rig, &mut out);
    eprintln!("after Linux's connections during the flood: {now}");
    assert!(counter(&now, "tcp_syn_cookies_accepted") >= 2, "{now}");
    assert!(counter(&now, "tcp_open") <= BACKLOG + 2, "{now}");
    writeln!(py.stdin.as_mut().unwrap(), "go").unwrap();
    said.extend(lines.map_while(Result::ok));
    let status = py.wait().unwrap();
    eprintln!("{}", said.join("\n"));
    assert!(status.success(), "tcp_hostile.py: {status}");
    assert_eq!(said.last().map(String::as_str), Some("result ok"));

    // New connections from Linux still succeed.
    let got = sh(&rig, &format!("printf hello | nc -N {} 7", rig.exo_ip));
    assert_eq!(text(&got.stdout), "hello");
    logged(&log, "5 bytes echoed");
    // The script's own connection ended in its RST.
    logged(&log, "connection reset");
    // The flood's connections went with their RSTs; nothing is left.
    let mut now = String::new();
    until("no TCP connection is left", || {
        now = counters(&rig, &mut out);
        counter(&now, "tcp_open") == 0
    });
    let last = stop_echo(rig.procs.pop().unwrap(), &mut out);
    eprintln!("after: {last}");
    // Six segments deserved a challenge ACK: three RSTs in the window, two
    // SYNs, data with an old ACK (RFC 5961 §3-§5).
    assert!(counter(&last, "tcp_challenge_acks") >= 6, "{last}");
    assert_eq!(counter(&last, "tcp_challenge_acks_suppressed"), 0, "{last}");
    assert!(counter(&last, "tcp_paws_rejected") >= 1, "{last}");
    assert!(counter(&last, "tcp_bad_checksum") >= 1, "{last}");
    // Data offsets beyond the segment and below the header, a header cut
    // short.
    assert!(counter(&last, "tcp_malformed") >= 3, "{last}");
    assert_eq!(counter(&last, "tcp_syn_dropped"), 0, "{last}");
    assert!(
        counter(&last, "tcp_syn_cookies_sent") >= FLOOD - BACKLOG,
        "{last}"
    );
    assert_eq!(counter(&last, "tcp_open"), 0, "{last}");
    assert!(rig.daemon_alive());
    eprintln!(
        "tcp_hostile_input over {link}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn tcp_hostile_input_over_afpacket() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_hostile_input("afpacket", "", 63);
}

#[test]
fn tcp_hostile_input_over_afxdp() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_hostile_input("afxdp", "", 64);
}

/// The same over a TAP, whose frames come with a `virtio_net_hdr`.
#[test]
fn tcp_hostile_input_over_tap() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_hostile_input("tap", "", 84);
}

/// The stream `tcp-bulk` sends and checks, for Python: byte i is i % 251.
const PATTERN_PY: &str = "block = bytes(i % 251 for i in range(251 * 4096))\n";

fn linux_rst_zero_window_keepalive(link: &str, suffix: &str, subnet: u8) {
    let mut rig = Rig::new(link, suffix, subnet);
    rig.no_offloads();
    let (exo, lin) = (rig.exo_ip.clone(), rig.linux_ip.clone());

    // (a) Linux resets: SO_LINGER 0 then close.
    let (mut out, log) = echo_server(&mut rig);
    let reset = format!(
        "import socket, struct\n\
         s = socket.create_connection(('{exo}', 7), timeout=5)\n\
         s.sendall(b'ping')\n\
         assert s.recv(4) == b'ping'\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))\n\
         s.close()\n"
    );
    run(&mut python(&rig, &reset));
    logged(&log, "connection reset");
    let mut now = String::new();
    until("the reset connection is gone", || {
        now = counters(&rig, &mut out);
        counter(&now, "tcp_open") == 0
    });
    assert_eq!(counter(&now, "tcp_failed"), 1, "{now}");

    // (c) Linux's keep-alive probes on an idle connection are answered: with
    // 3 probes a second apart unanswered, Linux would give up within 4 s.
    let probes = linux_counter(&rig, "TcpExtTCPKeepAlive");
    let keepalive = format!(
        "import socket, time\n\
         s = socket.create_connection(('{exo}', 7), timeout=5)\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)\n\
         s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)\n\
         s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)\n\
         s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)\n\
         s.sendall(b'before')\n\
         assert s.recv(6) == b'before'\n\
         time.sleep(5.5)\n\
         s.sendall(b'after')\n\
         assert s.recv(5) == b'after'\n\
         s.shutdown(socket.SHUT_WR)\n\
         assert s.recv(1) == b''\n"
    );
    let t = Instant::now();
    run(&mut python(&rig, &keepalive));
    let probes = linux_counter(&rig, "TcpExtTCPKeepAlive") - probes;
    eprintln!(
        "keep-alive: {probes} probes from Linux answered, idle connection up {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(probes >= 4, "{probes} keep-alive probes");
    stop_echo(rig.procs.pop().unwrap(), &mut out);

    // (b) Linux sends to an exonet receiver that leaves the data unread for
    // 3 s: the window closes, Linux probes it, the transfer completes intact.
    let (recv, _) = server(
        &rig.sock,
        &[
            "tcp-bulk",
            "recv",
            "--verify",
            "--json",
            "--read-delay",
            "3000",
        ],
        "listening on ",
    );
    rig.procs.push(recv);
    let probes = linux_counter(&rig, "TcpExtTCPWinProbe");
    let sender = format!(
        "import socket\n{PATTERN_PY}\
         s = socket.create_connection(('{exo}', 5001))\n\
         left = 4_000_000\n\
         while left:\n    n = min(left, len(block))\n    s.sendall(block[:n])\n    left -= n\n\
         s.shutdown(socket.SHUT_WR)\n\
         assert s.recv(1) == b''\n"
    );
    let t = Instant::now();
    run(&mut python(&rig, &sender));
    let out = finish(&mut rig.procs);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    assert_eq!(json_u64(&s, "bytes"), Some(4_000_000), "{s}");
    let probes = linux_counter(&rig, "TcpExtTCPWinProbe") - probes;
    eprintln!(
        "zero window to Linux: {probes} probes, 4 MB in {:.1} s: {s}",
        t.elapsed().as_secs_f64()
    );
    assert!(probes >= 1, "Linux sent no zero-window probe");

    // And exonet sends to a Linux receiver that reads nothing for 3 s.
    let receiver = format!(
        "import socket, time\n{PATTERN_PY}\
         l = socket.socket()\n\
         l.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)\n\
         l.bind(('{lin}', 5002))\n\
         l.listen(1)\n\
         print('listening', flush=True)\n\
         c, _ = l.accept()\n\
         time.sleep(3)\n\
         got = bytearray()\n\
         while True:\n    b = c.recv(1 << 16)\n    if not b: break\n    got += b\n\
         c.close()\n\
         want = (block * (len(got) // len(block) + 1))[:len(got)]\n\
         print(len(got), got == want, flush=True)\n"
    );
    let mut rx = python(&rig, &receiver)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rx_out = BufReader::new(rx.stdout.take().unwrap());
    let mut line = String::new();
    rx_out.read_line(&mut line).unwrap();
    assert_eq!(line, "listening\n");
    let t = Instant::now();
    let send = exonet()
        .args(["tcp-bulk", "send", &format!("{lin}:5002")])
        .args(["--bytes", "4M", "--json", "--socket"])
        .arg(&rig.sock)
        .output()
        .unwrap();
    let s = text(&send.stdout);
    assert!(send.status.success(), "{s}{}", text(&send.stderr));
    line.clear();
    rx_out.read_line(&mut line).unwrap();
    assert!(rx.wait().unwrap().success());
    eprintln!(
        "zero window from Linux: 4 MB in {:.1} s: {s}",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(line, "4000000 True\n");
    assert!(counter(&s, "timeouts") >= 1, "no persist probe: {s}");
    assert!(rig.daemon_alive());
}

#[test]
fn linux_rst_zero_window_keepalive_over_afpacket() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    linux_rst_zero_window_keepalive("afpacket", "", 65);
}

#[test]
fn linux_rst_zero_window_keepalive_over_afxdp() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    linux_rst_zero_window_keepalive("afxdp", "", 66);
}

#[test]
fn linux_rst_zero_window_keepalive_over_tap() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    linux_rst_zero_window_keepalive("tap", "", 85);
}

/// Direct send ports keep to their endpoints: endpoint A's port refuses a
/// frame of endpoint B's connection (and one of A's own with SYN, or from
/// another MAC), counted against A; only A's own connection's frame passes.
/// The frames are written straight to the port's descriptor, as a hostile
/// application would, not through the protocol library.
#[test]
fn a_direct_port_passes_only_its_own_endpoints_connections() {
    use std::os::fd::AsRawFd;

    use exonet_shm::control::{Client, PROTO_TCP};
    use exonet_shm::SegmentConfig;
    use exonet_wire::build::tcp_frame;
    use exonet_wire::tcp::flags;
    use exonet_wire::MacAddr;

    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let rig = Rig::new("afxdp", "", 72);
    let exo: std::net::Ipv4Addr = rig.exo_ip.parse().unwrap();
    let lin: std::net::Ipv4Addr = rig.linux_ip.parse().unwrap();
    let mut c = Client::connect(&rig.sock).unwrap();
    let mac = MacAddr(c.info().unwrap().mac);
    let seg = SegmentConfig {
        frame_size: 2048,
        frame_count: 64,
        ring_entries: [64; 4],
    };
    let (a, _a_end) = c.create_endpoint(&seg).unwrap();
    let (b, _b_end) = c.create_endpoint(&seg).unwrap();
    let remote = Some((lin, 9));
    let (_, a_port) = c.bind_socket(a, PROTO_TCP, (exo, 0), remote).unwrap();
    let (_, b_port) = c.bind_socket(b, PROTO_TCP, (exo, 0), remote).unwrap();
    let port = c.open_direct(a).unwrap();
    let frame = |from: MacAddr, sport: u16, fl: u8| {
        tcp_frame(
            from,
            MacAddr([2; 6]),
            exo,
            lin,
            sport,
            9,
            fl,
            1,
            1,
            &[],
            b"hi",
        )
    };
    let write = |f: &[u8]| {
        // SAFETY: a live descriptor and a live buffer of that length.
        let n = unsafe { libc::write(port.fd.as_raw_fd(), f.as_ptr().cast(), f.len()) };
        assert_eq!(n, f.len() as isize, "{}", std::io::Error::last_os_error());
    };
    let ack = flags::ACK | flags::PSH;
    write(&frame(mac, b_port, ack));
    write(&frame(mac, a_port, flags::SYN));
    write(&frame(MacAddr([2, 0, 0, 0, 0, 0x66]), a_port, ack));
    write(&frame(mac, a_port, ack));
    let of = |ep: u32, name: &str| {
        let records = Client::connect(&rig.sock).unwrap().stats().unwrap();
        records
            .iter()
            .find(|r| r.kind == "endpoint" && r.id == ep)
            .and_then(|r| r.get(name))
            .unwrap()
    };
    until("the port's counters", || of(a, "direct_refused") == 3);
    assert_eq!(of(a, "direct_frames"), 1);
    assert_eq!((of(b, "direct_frames"), of(b, "direct_refused")), (0, 0));
    // Unbound, A's own connection is refused too.
    let a_channel = c
        .bind_socket(a, PROTO_TCP, (exo, 0), Some((lin, 10)))
        .unwrap();
    c.unbind(a_channel.0).unwrap();
    let closed = tcp_frame(
        mac,
        MacAddr([2; 6]),
        exo,
        lin,
        a_channel.1,
        10,
        ack,
        1,
        1,
        &[],
        b"x",
    );
    write(&closed);
    until("the closed connection's frame refused", || {
        of(a, "direct_refused") == 4
    });
}
