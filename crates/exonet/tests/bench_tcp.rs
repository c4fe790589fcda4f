//! `exonet bench tcp --quick --json-only` as a smoke test: stdout is JSON
//! lines only, one per (case, system, metric), each with a positive value
//! (counts of retransmissions and timeouts may be zero); the veth cases are
//! skipped without root ("skipped: needs root"), the memwire cases never
//! are. No timing thresholds: those belong to the benchmark, not to tests.

#[path = "common/json.rs"]
mod json;

use json::{bench, check_suite};

#[test]
fn quick_tcp_suite_reports_every_case_system_and_metric() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("skipped: needs root (the veth cases; the memwire cases run)");
    }
    let stdout = bench(&["tcp", "--quick", "--json-only"]);
    // (case, system, metric, may be skipped)
    let mut want = Vec::new();
    for system in ["exonet-inproc", "exonet-inproc-busy"] {
        for metric in ["us_rtt", "us_rtt_p99"] {
            want.push(("tcp-rtt-memwire", system, metric, false));
        }
    }
    for metric in ["gbps", "retransmitted", "timeouts"] {
        want.push(("tcp-tput-memwire", "exonet", metric, false));
        for system in ["exonet-cubic", "exonet-newreno", "exonet-nosack"] {
            want.push(("tcp-loss-memwire", system, metric, false));
        }
    }
    want.push(("tcp-cps-memwire", "exonet", "cps", false));
    // Without root they must be skipped; with root they may be (no veth
    // pairs or namespaces here).
    // Round trips and connections: each exonet system and Linux.
    let latency = [
        "exonet-inproc",
        "exonet-inproc-busy",
        "exonet",
        "exonet-nodirect",
        "linux",
    ];
    for system in latency.iter().chain(&["linux-busy"]) {
        for metric in ["us_rtt", "us_rtt_p99"] {
            want.push(("tcp-rtt-veth", system, metric, true));
        }
    }
    for case in ["tcp-tput-veth", "tcp-bulk-veth"] {
        for system in [
            "exonet-inproc",
            "exonet-inproc-busy",
            "exonet",
            "exonet-offload",
            "linux-offload",
            "linux-no-offload",
        ] {
            want.push((case, system, "gbps", true));
        }
    }
    for system in latency {
        want.push(("tcp-cps-veth", system, "cps", true));
    }
    check_suite(&stdout, "tcp", &want, &["retransmitted", "timeouts"]);
    if !root {
        assert!(
            stdout
                .lines()
                .filter(|l| l.contains("-veth"))
                .all(|l| l.contains(r#""skipped":"needs root""#)),
            "{stdout}"
        );
    }
}

/// A throughput measurement of several transfers: the source connects once
/// per transfer, the sink takes each connection and reports the whole count
/// of one transfer with the median time. Two processes, each stack with its
/// multiplexer on its end of a memwire cable (no privileges needed); a sink
/// that took fewer connections would leave the source's next connect
/// refused, and the source failing.
#[test]
fn a_sink_takes_every_transfer_and_reports_the_median() {
    let dir = std::env::temp_dir().join(format!("exonet-transfers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cable = format!("memwire:{}", dir.join("cable.sock").display());
    let node = |role: &str, local: &str, remote: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_exonet"))
            .args(["bench-child", "tcp-node", "--stack", "exonet-inproc"])
            .args(["--role", role, "--local", local, "--remote", remote])
            .args(["--size", "8192", "--bytes", "1048576", "--transfers", "3"])
            .args(["--warmup-ms", "0", "--window-ms", "0", "--link", &cable])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let sink = node("sink", "10.77.92.2:7000", "10.77.92.1:0");
    let source = node("source", "10.77.92.1:0", "10.77.92.2:7000");
    let (sink, source) = (
        sink.wait_with_output().unwrap(),
        source.wait_with_output().unwrap(),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(source.status.success(), "source: {source:?}");
    assert!(sink.status.success(), "sink: {sink:?}");
    let said = String::from_utf8(sink.stdout).unwrap();
    let words: Vec<&str> = said.split_whitespace().collect();
    assert_eq!(words[..2], ["received", "1048576"], "{said:?}");
    assert!(words[2].parse::<f64>().unwrap() > 0.0, "{said:?}");
}
