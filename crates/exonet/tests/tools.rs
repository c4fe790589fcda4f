//! `exonet udp-echo`, `exonet udp-send` and `exonet ping` as a user runs
//! them: two daemons joined by a memwire cable, the echo server on one, the
//! clients on the other.

mod common;

use std::io::BufRead;
use std::path::Path;
use std::process::Output;

use common::daemons::{daemon, echo_stats, exonet, json_u64, stop_echo, text, udp_echo, Procs};

fn tool(sock: &Path, args: &[&str]) -> Output {
    exonet()
        .args(args)
        .arg("--socket")
        .arg(sock)
        .output()
        .unwrap()
}

#[test]
fn udp_echo_udp_send_and_ping_between_two_daemons() {
    let mut procs = Procs::new("tools");
    let dir = procs.1.clone();
    procs.0.push(daemon(&dir, "a", "10.77.9.1/24"));
    procs.0.push(daemon(&dir, "b", "10.77.9.2/24"));
    let (sa, sb) = (dir.join("a.sock"), dir.join("b.sock"));
    let (echo, mut echo_out) = udp_echo(&sa, &["--port", "7"]);
    procs.0.push(echo);

    // Ping-pong, small and fragmented.
    for size in ["64", "4000"] {
        let out = tool(
            &sb,
            &[
                "udp-send",
                "10.77.9.1:7",
                "--count",
                "20",
                "--size",
                size,
                "--json",
            ],
        );
        let s = text(&out.stdout);
        assert!(out.status.success(), "{s}{}", text(&out.stderr));
        assert_eq!(json_u64(&s, "received"), Some(20), "{s}");
        assert_eq!(json_u64(&s, "corrupt"), Some(0), "{s}");
        assert!(s.contains("\"rtt_p99_us\":"), "{s}");
    }
    // Paced, echoes collected concurrently; text output.
    let out = tool(
        &sb,
        &[
            "udp-send",
            "10.77.9.1:7",
            "--count",
            "200",
            "--rate",
            "2000",
        ],
    );
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    assert!(s.contains("200 received, 0 lost (0% loss)"), "{s}");
    assert!(s.contains("rtt us: min "), "{s}");

    // Nobody on port 9: every datagram is lost, the refusals counted.
    let out = tool(
        &sb,
        &[
            "udp-send",
            "10.77.9.1:9",
            "--count",
            "2",
            "--timeout",
            "200",
            "--json",
        ],
    );
    let s = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{s}");
    assert_eq!(json_u64(&s, "received"), Some(0), "{s}");
    assert_eq!(json_u64(&s, "refused"), Some(2), "{s}");
    assert!(s.contains("\"rtt_min_us\":null"), "{s}");

    // Ping the echo server's host, also with fragments.
    for size in ["56", "3000"] {
        let out = tool(
            &sb,
            &[
                "ping",
                "10.77.9.1",
                "--count",
                "3",
                "--interval",
                "20",
                "--size",
                size,
            ],
        );
        let s = text(&out.stdout);
        assert!(out.status.success(), "{s}{}", text(&out.stderr));
        let n: usize = size.parse().unwrap();
        assert!(
            s.contains(&format!("{} bytes from 10.77.9.1: icmp_seq=0 time=", n + 8)),
            "{s}"
        );
        assert!(
            s.contains("3 packets transmitted, 3 received, 0% packet loss"),
            "{s}"
        );
        assert!(s.contains("rtt min/avg/max/p50/p99 = "), "{s}");
    }
    // A host on the link that is not there.
    let out = tool(
        &sb,
        &[
            "ping",
            "10.77.9.3",
            "--count",
            "2",
            "--interval",
            "20",
            "--timeout",
            "100",
        ],
    );
    let s = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{s}");
    assert!(
        s.contains("2 packets transmitted, 0 received, 100% packet loss"),
        "{s}"
    );

    // SIGUSR1 reports, SIGTERM stops; nothing is left held.
    let echo = procs.0.pop().unwrap();
    let line = echo_stats(&echo, &mut echo_out);
    assert_eq!(json_u64(&line, "answered"), Some(240), "{line}");
    let line = stop_echo(echo, &mut echo_out);
    for (k, v) in [
        ("answered", 240),
        ("udp_delivered", 240),
        ("reassembled", 20),
        ("bad_checksum", 0),
        ("reasm_bytes", 0),
        ("queued", 0),
    ] {
        assert_eq!(json_u64(&line, k), Some(v), "{k}: {line}");
    }

    // --count: stops by itself after that many.
    let (mut echo, mut echo_out) = udp_echo(&sa, &["--port", "7", "--count", "5"]);
    let out = tool(&sb, &["udp-send", "10.77.9.1:7", "--count", "5"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(echo.wait().unwrap().success());
    let mut line = String::new();
    echo_out.read_line(&mut line).unwrap();
    assert_eq!(json_u64(&line, "answered"), Some(5), "{line}");
}

#[test]
fn bad_tool_command_lines_are_refused_clearly() {
    for (args, says) in [
        (&["udp-send", "nohost"][..], "HOST:PORT"),
        (&["udp-send", "10.77.9.1:7", "--size", "4"], "--size"),
        (&["udp-send", "10.77.9.1:7", "--count", "0"], "--count"),
        (&["ping"], "HOST"),
        (&["ping", "10.77.9.1", "--count", "x"], "--count"),
        (&["udp-echo", "--port", "70000"], "--port"),
        (
            &["ping", "10.77.9.1", "--socket", "/nonexistent/exonet.sock"],
            "exonet ping",
        ),
        (
            &["udp-echo", "--socket", "/nonexistent/exonet.sock"],
            "exonet udp-echo",
        ),
    ] {
        let out = exonet().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = text(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
