//! `exonet tcp-pingpong`, `exonet tcp-bulk`, `exonet http-serve` and
//! `exonet http-get` as a user runs them: two daemons joined by a memwire
//! cable, the servers on one, the clients on the other; raw clients on the
//! protocol library's sockets where the test must see the wire's bytes
//! (keep-alive, malformed requests, a corrupt bulk stream).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::daemons::{
    daemon, echo_stats, exonet, finish, json_u64, logged, server, signal, text, Procs,
};
use common::noise;
use exonet_stack::{Stack, TcpStream};

const A: &str = "10.77.19.1";

fn tool(sock: &Path, args: &[&str]) -> Output {
    exonet()
        .args(args)
        .arg("--socket")
        .arg(sock)
        .output()
        .unwrap()
}

/// A raw HTTP client's view of one response: status, head, body.
fn response(r: &mut BufReader<&TcpStream>) -> (u16, String, Vec<u8>) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "closed in a head: {head}"
        );
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let status = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    let mut body = vec![0u8; length];
    r.read_exact(&mut body).unwrap();
    (status, head, body)
}

fn connect(stack: &Stack, port: u16) -> TcpStream {
    let s = TcpStream::connect_timeout(stack, (A, port), Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Whether the peer closed (after anything it still sent, which is
/// returned).
fn rest(mut s: &TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    got
}

#[test]
fn tcp_tools_between_two_daemons() {
    let mut procs = Procs::new("tools-tcp");
    let dir = procs.1.clone();
    procs.0.push(daemon(&dir, "a", "10.77.19.1/24"));
    procs.0.push(daemon(&dir, "b", "10.77.19.2/24"));
    let (sa, sb) = (dir.join("a.sock"), dir.join("b.sock"));

    // Ping-pong: small and multi-segment messages, JSON and text.
    let (echo, log) = server(
        &sa,
        &["tcp-pingpong", "--listen", "--port", "7"],
        "listening on 10.77.19.1:7",
    );
    procs.0.push(echo);
    let target = format!("{A}:7");
    for size in ["64", "5000"] {
        let out = tool(
            &sb,
            &[
                "tcp-pingpong",
                &target,
                "--count",
                "100",
                "--size",
                size,
                "--json",
            ],
        );
        let s = text(&out.stdout);
        assert!(out.status.success(), "{s}{}", text(&out.stderr));
        assert_eq!(json_u64(&s, "count"), Some(100), "{s}");
        assert_eq!(json_u64(&s, "size"), Some(size.parse().unwrap()), "{s}");
        assert!(
            s.contains("\"rtt_p50_us\":") && s.contains("\"rtt_p99_us\":"),
            "{s}"
        );
    }
    let out = tool(&sb, &["tcp-pingpong", &target, "--count", "10"]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    assert!(s.contains("10 messages of 64 bytes echoed"), "{s}");
    assert!(s.contains("rtt us: min "), "{s}");
    logged(&log, "500000 bytes echoed");
    // The server's counters on SIGUSR1: three connections, nothing dropped.
    let echo = &mut procs.0[2];
    let mut counters = BufReader::new(echo.stdout.take().unwrap());
    let c = echo_stats(echo, &mut counters);
    assert!(json_u64(&c, "tcp_accepts") >= Some(3), "{c}");
    for k in [
        "tcp_bad_checksum",
        "tcp_malformed",
        "tcp_syn_dropped",
        "tcp_syn_cookies_sent",
        "tcp_syn_cookies_rejected",
        "tcp_challenge_acks",
    ] {
        assert_eq!(json_u64(&c, k), Some(0), "{k}: {c}");
    }
    // Nobody on port 8: refused.
    let out = tool(&sb, &["tcp-pingpong", &format!("{A}:8"), "--count", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("cannot connect to"),
        "{}",
        text(&out.stderr)
    );

    // Bulk: 20 MB checked byte by byte.
    let (recv, _) = server(
        &sa,
        &["tcp-bulk", "recv", "--verify", "--json", "--count", "2"],
        "listening on 10.77.19.1:5001",
    );
    procs.0.push(recv);
    let bulk = format!("{A}:5001");
    let out = tool(
        &sb,
        &["tcp-bulk", "send", &bulk, "--bytes", "20M", "--json"],
    );
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    assert_eq!(json_u64(&s, "bytes"), Some(20_000_000), "{s}");
    assert!(
        s.contains("\"gbps\":") && s.contains("\"retransmitted\":"),
        "{s}"
    );
    // Odd chunks, text output.
    let out = tool(
        &sb,
        &[
            "tcp-bulk", "send", &bulk, "--bytes", "1Mi", "--chunk", "1000",
        ],
    );
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    assert!(s.contains("1048576 bytes in "), "{s}");
    let out = finish(&mut procs.0);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.len(), 2, "{s}");
    assert_eq!(json_u64(lines[0], "bytes"), Some(20_000_000), "{s}");
    assert_eq!(json_u64(lines[1], "bytes"), Some(1 << 20), "{s}");

    // A stream with one wrong byte is refused, at its offset.
    let stack = Stack::open(&sb).unwrap();
    let (recv, log) = server(
        &sa,
        &["tcp-bulk", "recv", "--verify", "--port", "5002"],
        "listening on",
    );
    procs.0.push(recv);
    let c = connect(&stack, 5002);
    let mut bad: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    bad[4321] ^= 0x40;
    (&c).write_all(&bad).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert!(!finish(&mut procs.0).status.success());
    logged(&log, "byte 4321 of the stream is 0x");
    drop(c);

    http(&mut procs, &sa, &sb, &stack);
}

fn http(procs: &mut Procs, sa: &Path, sb: &Path, stack: &Stack) {
    let www = procs.1.join("www");
    std::fs::create_dir_all(www.join("sub")).unwrap();
    let big = noise(10 << 20, 7);
    std::fs::write(www.join("big.bin"), &big).unwrap();
    std::fs::write(www.join("index.html"), "<h1>exonet</h1>\n").unwrap();
    std::fs::write(procs.1.join("secret"), "not served").unwrap();
    let (serve, log) = server(
        sa,
        &["http-serve", www.to_str().unwrap(), "--port", "8080"],
        "serving ",
    );
    procs.0.push(serve);
    let url = |p: &str| format!("http://{A}:8080{p}");

    // 10 MB intact, to a file.
    let got = procs.1.join("got.bin");
    let out = tool(
        sb,
        &["http-get", &url("/big.bin"), "-o", got.to_str().unwrap()],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("200 OK, 10485760 bytes in "), "{err}");
    assert!(std::fs::read(&got).unwrap() == big, "the file differs");
    // `/` is index.html, to stdout.
    let out = tool(sb, &["http-get", &url("/")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "<h1>exonet</h1>\n");
    // Missing: 404 and a failure.
    let out = tool(sb, &["http-get", &url("/missing.txt")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("answered 404 Not Found"),
        "{}",
        text(&out.stderr)
    );
    logged(&log, "\"GET /missing.txt HTTP/1.1\" 404");
    // A directory without its slash is redirected; not followed.
    let out = tool(sb, &["http-get", &url("/sub")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("Location: /sub/"),
        "{}",
        text(&out.stderr)
    );

    // Keep-alive: three requests on one connection, the last one closing it.
    let c = connect(stack, 8080);
    let mut r = BufReader::new(&c);
    let get = |p: &str, extra: &str| format!("GET {p} HTTP/1.1\r\nHost: {A}\r\n{extra}\r\n");
    (&c).write_all(get("/index.html", "").as_bytes()).unwrap();
    let (status, head, body) = response(&mut r);
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("Connection: keep-alive\r\n"), "{head}");
    assert!(head.contains("Content-Type: text/html"), "{head}");
    assert_eq!(body, b"<h1>exonet</h1>\n");
    // Two at once (pipelined), then a HEAD.
    let two = get("/big.bin", "") + &get("/../secret", "");
    (&c).write_all(two.as_bytes()).unwrap();
    let (status, _, body) = response(&mut r);
    assert!(status == 200 && body == big);
    let (status, _, _) = response(&mut r);
    assert_eq!(status, 403, "a path out of the directory");
    (&c).write_all(b"HEAD /big.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut head = String::new();
    r.read_to_string(&mut head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Length: 10485760\r\n"), "{head}");
    assert!(
        head.contains("Connection: close\r\n") && head.ends_with("\r\n\r\n"),
        "{head}"
    );
    drop(r);
    drop(c);
    let peer_lines = |port: &str| -> Vec<String> {
        let log = log.lock().unwrap();
        log.iter().filter(|l| l.contains(port)).cloned().collect()
    };
    // The server's log reaches the test through a reader thread: wait for it.
    logged(&log, "\"HEAD /big.bin");
    let local = {
        // The three requests of that connection came from one port.
        let log = log.lock().unwrap();
        let l = log.iter().find(|l| l.contains("\"HEAD /big.bin")).unwrap();
        l.split(' ').next().unwrap().to_string()
    };
    assert_eq!(
        peer_lines(&format!("{local} ")).len(),
        4,
        "{:#?}",
        log.lock().unwrap()
    );

    // Malformed, oversized, other methods: answered and closed.
    for (request, want) in [
        (
            "GARBAGE\r\n\r\n".to_string(),
            "HTTP/1.1 400 Bad Request\r\n",
        ),
        ("GET / HTTP/1.1\r\n\r\n".to_string(), "HTTP/1.1 400 "),
        (
            format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(9000)),
            "HTTP/1.1 414 ",
        ),
        (
            format!(
                "GET / HTTP/1.1\r\nHost: x\r\n{}\r\n",
                "X-Pad: 0123456789\r\n".repeat(2000)
            ),
            "HTTP/1.1 431 ",
        ),
        ("GET / HTTP/3.0\r\n\r\n".to_string(), "HTTP/1.1 505 "),
    ] {
        let c = connect(stack, 8080);
        (&c).write_all(request.as_bytes()).unwrap();
        let got = text(&rest(&c));
        assert!(got.starts_with(want), "{want}: {got}");
        assert!(got.contains("Connection: close\r\n"), "{got}");
    }
    let c = connect(stack, 8080);
    (&c).write_all(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        .unwrap();
    let mut r = BufReader::new(&c);
    let (status, head, _) = response(&mut r);
    assert_eq!(status, 405);
    assert!(head.contains("Allow: GET, HEAD\r\n"), "{head}");
    drop(r);
    drop(c);
    logged(&log, "\"GARBAGE\" 400");

    // HTTP/1.0 closes unless asked to keep alive.
    let c = connect(stack, 8080);
    (&c).write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let got = text(&rest(&c));
    assert!(
        got.starts_with("HTTP/1.1 200 OK\r\n") && got.ends_with("<h1>exonet</h1>\n"),
        "{got}"
    );

    // SIGTERM stops it cleanly.
    signal(procs.0.last().unwrap(), libc::SIGTERM);
    let status = finish(&mut procs.0).status;
    assert!(status.success(), "{status}");
    logged(&log, "exonet http-serve: stopped after ");

    // One connection at most: a second one is answered 503; the first,
    // idle, is closed after a second.
    let (serve, _) = server(
        sa,
        &[
            "http-serve",
            www.to_str().unwrap(),
            "--port",
            "8081",
            "--max-connections",
            "1",
            "--idle-timeout",
            "1",
        ],
        "serving ",
    );
    procs.0.push(serve);
    let first = TcpStream::connect_timeout(stack, (A, 8081), Duration::from_secs(5)).unwrap();
    (&first).write_all(get("/", "").as_bytes()).unwrap();
    let mut r = BufReader::new(&first);
    assert_eq!(response(&mut r).0, 200);
    let second = TcpStream::connect_timeout(stack, (A, 8081), Duration::from_secs(5)).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (&second).write_all(get("/", "").as_bytes()).unwrap();
    let got = text(&rest(&second));
    assert!(
        got.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{got}"
    );
}

#[test]
fn bad_tcp_tool_command_lines_are_refused_clearly() {
    for (args, says) in [
        (&["tcp-pingpong"][..], "HOST:PORT"),
        (&["tcp-pingpong", "nohost"], "HOST:PORT"),
        (&["tcp-pingpong", "10.77.19.1:7", "--listen"], "--listen"),
        (&["tcp-pingpong", "10.77.19.1:7", "--size", "0"], "--size"),
        (&["tcp-pingpong", "--listen", "--count", "3"], "--count"),
        (&["tcp-bulk"], "Usage"),
        (&["tcp-bulk", "send"], "HOST:PORT"),
        (
            &["tcp-bulk", "send", "10.77.19.1:5001", "--bytes", "10Q"],
            "byte count",
        ),
        (
            &[
                "tcp-bulk",
                "send",
                "10.77.19.1:5001",
                "--bytes",
                "99999999999G",
            ],
            "byte count",
        ),
        (&["tcp-bulk", "recv", "--count", "0"], "--count"),
        (&["http-serve"], "DIR"),
        (&["http-get"], "URL"),
        (&["http-get", "ftp://10.77.19.1/"], "only http://"),
        (&["http-get", "http://10.77.19.1:70000/"], "bad port"),
        (&["http-get", "10.77.19.1/x"], "expected a URL"),
        (
            &[
                "http-serve",
                "/nonexistent/www",
                "--socket",
                "/nonexistent/s",
            ],
            "cannot serve /nonexistent/www",
        ),
        (
            &[
                "http-get",
                "http://10.77.19.1/",
                "--socket",
                "/nonexistent/s",
            ],
            "exonet http-get: cannot open",
        ),
        (
            &["tcp-bulk", "recv", "--socket", "/nonexistent/s"],
            "exonet tcp-bulk recv: cannot open",
        ),
    ] {
        let out = exonet().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = text(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
