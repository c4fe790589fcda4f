//! The TCP tools against real Linux peers over veth (root only; "skipped:
//! needs root" otherwise), on the rig of tests/veth.rs with Linux's
//! segmentation offloads off, and on: `curl` from `exonet http-serve`, `exonet
//! http-get` from Python's `http.server`, `nc` both ways with half-close,
//! 200 MB from Python to `exonet tcp-bulk recv --verify`, and
//! `tcp-pingpong` against `socat` and from `nc`; curl reconnecting from
//! one port through exonet's TIME-WAIT. Every Linux client runs
//! under `timeout` (servers are the Rig's to kill, so they are started
//! without one: `timeout` would leave them behind); each step's time is
//! printed.

mod common;

use std::fs::File;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use common::daemons::{exonet, finish, json_u64, logged, server, text};
use common::netns::{is_root, run, stat, Rig};
use common::{noise, until};

/// `program` in Linux's namespace, killed after a minute.
fn linux(rig: &Rig, program: &str) -> Command {
    let mut c = rig.linux("timeout");
    c.args(["60", program]);
    c
}

/// A shell command line in Linux's namespace, its program killed after a
/// minute.
fn sh(rig: &Rig, script: &str) -> Output {
    run(rig
        .linux("sh")
        .args(["-c", &format!("timeout 60 {script}")]))
}

/// A server in Linux's namespace, quiet, killed with the rig.
fn linux_server(rig: &mut Rig, program: &str, args: &[&str]) {
    let c = rig
        .linux(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    rig.procs.push(c);
}

fn tool(rig: &Rig, args: &[&str]) -> Output {
    exonet()
        .args(args)
        .arg("--socket")
        .arg(&rig.sock)
        .output()
        .unwrap()
}

/// The stream `tcp-bulk` sends and checks: byte i is i % 251.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn sha256(rig: &Rig, path: &Path) -> String {
    let out = run(rig.linux("sha256sum").arg(path));
    text(&out.stdout).split(' ').next().unwrap().to_string()
}

/// Runs `step`, printing how long it took.
fn timed<T>(what: &str, step: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = step();
    eprintln!("{what}: {:.2} s", t.elapsed().as_secs_f64());
    r
}

/// Waits until Linux listens on TCP `addr`.
fn listening(rig: &Rig, addr: &str) {
    until(&format!("Linux listens on {addr}"), || {
        text(&run(rig.linux("ss").args(["-tln"])).stdout).contains(addr)
    });
}

fn tcp_with_linux_peers(link: &str, suffix: &str, subnet: u8, offloads: bool) {
    let mut rig = Rig::new(link, suffix, subnet);
    if !offloads {
        rig.no_offloads();
    }
    let (exo, lin) = (rig.exo_ip.clone(), rig.linux_ip.clone());
    let dir = rig.dir().to_path_buf();
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let big = noise(10 << 20, 0x9e37_79b9_7f4a_7c15);
    std::fs::write(www.join("big.bin"), &big).unwrap();
    std::fs::write(www.join("index.html"), "<h1>exonet</h1>\n").unwrap();

    // curl from exonet's http-serve.
    let (serve, log) = server(
        &rig.sock,
        &["http-serve", www.to_str().unwrap(), "--port", "80"],
        "serving ",
    );
    rig.procs.push(serve);
    let got = dir.join("curl.bin");
    timed("curl 10 MB from exonet http-serve", || {
        sh(
            &rig,
            &format!("curl -sS --fail -o {} http://{exo}/big.bin", got.display()),
        )
    });
    assert_eq!(sha256(&rig, &got), sha256(&rig, &www.join("big.bin")));
    let out = sh(&rig, &format!("curl -sS --fail http://{exo}/"));
    assert_eq!(text(&out.stdout), "<h1>exonet</h1>\n");
    let out = linux(&rig, "curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://{exo}/nothing"))
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout), "404");
    logged(&log, "\"GET /big.bin HTTP/1.1\" 200 10485760");
    // Linux reconnects at once from the port of a connection that exonet
    // closed first (nc waits for the server's FIN, so Linux's side ends in
    // LAST-ACK, not TIME-WAIT): the multiplexer holds exonet's TIME-WAIT
    // once the server lets the connection go, and lets the new SYN in (RFC
    // 6191: Linux's timestamps grow from one connection to the next).
    // Refused, nc would give up after 5 s. Linux's last socket on the port
    // must first leave LAST-ACK (on our ACK of its FIN, which a loaded
    // machine may schedule late), or nc cannot bind the port.
    for i in 0..3 {
        until("Linux's last socket on port 40123 leaves LAST-ACK", || {
            let ss = rig
                .linux("ss")
                .args(["-Htan", "state", "last-ack", "sport = :40123"])
                .output()
                .unwrap();
            ss.stdout.is_empty()
        });
        let out = sh(
            &rig,
            &format!(
                "printf 'GET / HTTP/1.1\\r\\nHost: exonet\\r\\nConnection: close\\r\\n\\r\\n' | nc -w 5 -p 40123 {exo} 80"
            ),
        );
        assert!(
            text(&out.stdout).ends_with("<h1>exonet</h1>\n"),
            "connection {i} from one port: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }

    // exonet http-get from Python's http.server.
    let root = www.to_str().unwrap();
    linux_server(
        &mut rig,
        "/usr/bin/python3",
        &[
            "-m",
            "http.server",
            "8000",
            "--bind",
            &lin,
            "--directory",
            root,
        ],
    );
    listening(&rig, &format!("{lin}:8000"));
    let got = dir.join("get.bin");
    let url = format!("http://{lin}:8000/big.bin");
    let out = timed("exonet http-get 10 MB from python http.server", || {
        tool(&rig, &["http-get", &url, "-o", got.to_str().unwrap()])
    });
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read(&got).unwrap() == big, "the file differs");
    let out = tool(&rig, &["http-get", &format!("http://{lin}:8000/nothing")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    // nc sends (half-closing), exonet checks.
    let sent = dir.join("pattern.bin");
    std::fs::write(&sent, pattern(8 << 20)).unwrap();
    let (recv, _) = server(
        &rig.sock,
        &["tcp-bulk", "recv", "--verify", "--json"],
        "listening on ",
    );
    rig.procs.push(recv);
    timed("nc -N 8 MB to exonet tcp-bulk recv", || {
        sh(&rig, &format!("nc -N {exo} 5001 < {}", sent.display()))
    });
    let out = finish(&mut rig.procs);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}");
    assert_eq!(json_u64(&s, "bytes"), Some(8 << 20), "{s}");

    // exonet sends, nc receives until exonet's FIN and closes.
    let into = dir.join("from-exonet.bin");
    let nc = rig
        .linux("nc")
        .args(["-l", &lin, "5002"])
        .stdin(Stdio::null())
        .stdout(File::create(&into).unwrap())
        .spawn()
        .unwrap();
    rig.procs.push(nc);
    listening(&rig, &format!("{lin}:5002"));
    let out = timed("exonet tcp-bulk send 20 MB to nc -l", || {
        tool(
            &rig,
            &[
                "tcp-bulk",
                "send",
                &format!("{lin}:5002"),
                "--bytes",
                "20M",
                "--json",
            ],
        )
    });
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    eprintln!("  {s}");
    let status = finish(&mut rig.procs).status;
    assert!(status.success(), "nc: {status}");
    assert!(
        std::fs::read(&into).unwrap() == pattern(20_000_000),
        "nc's copy differs"
    );

    // 200 MB from Python, checked.
    let (recv, _) = server(
        &rig.sock,
        &["tcp-bulk", "recv", "--verify", "--json", "--port", "5003"],
        "listening on ",
    );
    rig.procs.push(recv);
    let sender = format!(
        "import socket\n\
         block = bytes(i % 251 for i in range(251 * 4096))\n\
         s = socket.create_connection(('{exo}', 5003))\n\
         left = 200_000_000\n\
         while left:\n    n = min(left, len(block))\n    s.sendall(block[:n])\n    left -= n\n\
         s.shutdown(socket.SHUT_WR)\n\
         assert s.recv(1) == b''\n"
    );
    timed("python 200 MB to exonet tcp-bulk recv --verify", || {
        run(linux(&rig, "/usr/bin/python3").args(["-c", &sender]))
    });
    let out = finish(&mut rig.procs);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}");
    assert_eq!(json_u64(&s, "bytes"), Some(200_000_000), "{s}");
    eprintln!("  {s}");

    // exonet tcp-pingpong against socat's echo.
    let listen = format!("TCP-LISTEN:7007,bind={lin},fork,reuseaddr");
    linux_server(&mut rig, "socat", &[&listen, "EXEC:cat"]);
    listening(&rig, &format!("{lin}:7007"));
    let out = timed("exonet tcp-pingpong to socat, 200 x 100 bytes", || {
        tool(
            &rig,
            &[
                "tcp-pingpong",
                &format!("{lin}:7007"),
                "--count",
                "200",
                "--size",
                "100",
                "--json",
            ],
        )
    });
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    assert_eq!(json_u64(&s, "count"), Some(200), "{s}");
    eprintln!("  {s}");
    // Where the kernel sends the link's frames, the pings went through the
    // direct send port, and still every echo matched. A ping waits on the
    // ring instead only behind a frame still in it (a pure ACK of an echo
    // that came in two parts, under load) or when the port's queue is full.
    if link != "tap" {
        let direct = json_u64(&s, "tx_direct").unwrap();
        let behind = json_u64(&s, "tx_direct_behind").unwrap();
        let failed = json_u64(&s, "tx_direct_failed").unwrap();
        assert!(direct + behind + failed >= 200, "{s}");
        assert!(direct >= 100, "{s}");
    }

    // Linux's nc against exonet's echo server: a word and 1 MB.
    let (echo, _) = server(
        &rig.sock,
        &["tcp-pingpong", "--listen", "--port", "7"],
        "listening on ",
    );
    rig.procs.push(echo);
    let out = sh(&rig, &format!("printf hello | nc -N {exo} 7"));
    assert_eq!(text(&out.stdout), "hello");
    let out = timed("nc -N 1 MB through exonet tcp-pingpong --listen", || {
        let one = dir.join("one.bin");
        std::fs::write(&one, &big[..1 << 20]).unwrap();
        sh(&rig, &format!("nc -N {exo} 7 < {}", one.display()))
    });
    assert!(
        out.stdout == big[..1 << 20],
        "echoed {} bytes",
        out.stdout.len()
    );
    assert!(rig.daemon_alive());
    if (offloads && link != "afxdp") || link == "tap" {
        // exonet's super-segments, cut by the kernel's GSO or taken whole.
        assert!(stat(&rig.sock, "link", "tx_super") > 0, "no tx_super");
    }
    if offloads && suffix != ":native" {
        // Linux's, cut by the link (a native program has Linux cut them).
        assert!(stat(&rig.sock, "link", "rx_super") > 0, "no rx_super");
    }
    if offloads {
        // Linux left its checksums to the veth, and the link finished them.
        assert!(stat(&rig.sock, "link", "rx_csum_completed") > 0);
    }
}

#[test]
fn tcp_with_linux_peers_over_afpacket() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_with_linux_peers("afpacket", "", 61, false);
}

#[test]
fn tcp_with_linux_peers_over_afxdp() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_with_linux_peers("afxdp", "", 62, false);
}

/// The same with Linux's segmentation offloads on, as a veth has them by
/// default: Linux sends 64 KB super-segments, which the link cuts, and
/// exonet sends its own (the link's segmentation offload, frame by frame).
#[test]
fn tcp_with_linux_peers_with_offloads_over_afpacket() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_with_linux_peers("afpacket", ":frames", 68, true);
}

/// The same over AF_XDP, its XDP program generic (on the skb, as on a veth
/// by default): Linux's super-segments come to the socket in several chunks
/// (`XDP_USE_SG`), which the link gathers and cuts.
#[test]
fn tcp_with_linux_peers_with_offloads_over_afxdp() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_with_linux_peers("afxdp", "", 81, true);
}

/// The same over AF_XDP with its XDP program in the veth's driver
/// (`afxdp:IFACE:native`) and Linux's end as a veth comes: the veth then has
/// Linux cut its own super-segments (it takes segmentation offload from the
/// peer of a native XDP program), and the link finishes the checksums Linux
/// leaves to the veth, which AF_XDP does not flag.
#[test]
fn tcp_with_linux_peers_with_offloads_over_afxdp_native() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_with_linux_peers("afxdp", ":native", 80, true);
}

/// The same over a TAP with offloads (Linux on its kernel side): Linux's
/// super-segments are read whole and cut, exonet's go up Linux's stack
/// whole, and the checksums Linux leaves are finished.
#[test]
fn tcp_with_linux_peers_over_tap() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_with_linux_peers("tap", "", 82, true);
}

/// The same with the TAP's kernel side stripped of its offloads (`ethtool
/// -K`): Linux's frames come whole and checked, behind headers that say
/// nothing, while exonet's super-segments still go up whole.
#[test]
fn tcp_with_linux_peers_over_tap_without_linux_offloads() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tcp_with_linux_peers("tap", "", 87, false);
}

/// Linux connects to a listener whose SYNs the daemon's XDP program answers
/// with cookies (`http-serve --link-syn-cookies`): every connection is made
/// by its ACK, the server never sees a SYN, and the link counts them. A SYN
/// without timestamps (Linux's `tcp_timestamps = 0`) goes on to the stack,
/// which answers it as before.
#[test]
fn linux_connects_to_a_listener_whose_syns_the_link_answers() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut rig = Rig::new("afxdp", "", 67);
    rig.no_offloads();
    // A veth passes redirected frames only to a peer that polls.
    run(rig.linux("ethtool").args(["-K", &rig.vl, "gro", "on"]));
    let exo = rig.exo_ip.clone();
    let www = rig.dir().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), "cookie\n").unwrap();
    let (serve, _log) = server(
        &rig.sock,
        &[
            "http-serve",
            www.to_str().unwrap(),
            "--port",
            "80",
            "--link-syn-cookies",
        ],
        "serving ",
    );
    rig.procs.push(serve);
    let answered = |rig: &Rig| {
        let s = text(&tool(rig, &["stats", "--json"]).stdout);
        json_u64(&s, "syns_answered").expect("the link's syns_answered")
    };
    let curl_20 = |rig: &Rig| {
        let out = sh(
            rig,
            &format!("sh -c 'for i in $(seq 20); do curl -sS --fail http://{exo}/; done'"),
        );
        assert_eq!(text(&out.stdout), "cookie\n".repeat(20));
    };
    curl_20(&rig);
    let first = answered(&rig);
    assert!(first >= 20, "{first} SYNs answered by the link");
    run(rig
        .linux("sysctl")
        .args(["-w", "net.ipv4.tcp_timestamps=0"]));
    curl_20(&rig);
    assert_eq!(
        answered(&rig),
        first,
        "SYNs without timestamps are the stack's"
    );
    assert!(rig.daemon_alive());
}

/// An application killed mid-connection, its segments sent through its
/// direct send port (the multiplexer saw only its SYN): the multiplexer
/// resets the connection with the sequence number the port recorded, which
/// Linux accepts (RFC 5961 §3.2: only a RST at exactly RCV.NXT resets).
/// Without the port's record, the multiplexer would have seen no ACK of
/// ours and sent nothing, and a stale sequence number would draw a
/// challenge ACK instead.
#[test]
fn a_killed_application_is_reset_after_sending_directly() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let rig = Rig::new("afxdp", "", 69);
    rig.no_offloads();
    let lin = rig.linux_ip.clone();
    // Echoes until the connection ends; says how it ended.
    let echo = format!(
        "import socket\n\
         l = socket.create_server(('{lin}', 7100))\n\
         print('listening', flush=True)\n\
         c, _ = l.accept()\n\
         c.settimeout(20)\n\
         try:\n    while True:\n        d = c.recv(4096)\n        if not d:\n            print('eof', flush=True)\n            break\n        c.sendall(d)\n\
         except ConnectionResetError:\n    print('reset', flush=True)\n\
         except socket.timeout:\n    print('timeout', flush=True)\n"
    );
    let py = rig
        .linux("timeout")
        .args(["30", "/usr/bin/python3", "-c", &echo])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    listening(&rig, &format!("{lin}:7100"));
    let mut client = exonet()
        .args([
            "tcp-pingpong",
            &format!("{lin}:7100"),
            "--count",
            "100000000",
            "--size",
            "4",
            "--socket",
        ])
        .arg(&rig.sock)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Pings flowing: Linux's socket has taken some.
    until("the pings flow", || {
        let ss = run(rig.linux("ss").args(["-Htni", "sport = :7100"]));
        text(&ss.stdout).contains("bytes_received:")
            && !text(&ss.stdout).contains("bytes_received:0 ")
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    client.kill().unwrap();
    client.wait().unwrap();
    let out = py.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "listening\nreset\n");
    assert!(stat(&rig.sock, "host", "tcp_aborted") >= 1);
}
