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
    for system in [
        "exonet-inproc",
        "exonet-inproc-busy",
        "exonet",
        "linux",
        "linux-busy",
    ] {
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
    for system in ["exonet-inproc", "exonet-inproc-busy", "exonet", "linux"] {
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
