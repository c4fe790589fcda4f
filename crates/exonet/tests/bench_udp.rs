//! `exonet bench udp --quick --json-only` as a smoke test: stdout is JSON
//! lines only, one per (case, system, metric), each with a positive value;
//! the veth cases are skipped without root ("skipped: needs root"), the
//! memwire case never is. No timing thresholds: those belong to the
//! benchmark, not to tests.

#[path = "common/json.rs"]
mod json;

use json::{bench, check_suite};

#[test]
fn quick_udp_suite_reports_every_case_system_and_metric() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("skipped: needs root (the veth cases; the memwire case runs)");
    }
    let stdout = bench(&["udp", "--quick", "--json-only"]);
    // (case, system, metric, may be skipped)
    let mut want = Vec::new();
    for system in [
        "exonet-inproc",
        "exonet-inproc-busy",
        "exonet",
        "exonet-busy",
        "linux-loopback",
    ] {
        for metric in ["us_rtt", "us_rtt_p99"] {
            want.push(("udp-rtt-memwire", system, metric, false));
        }
    }
    // Without root they must be skipped; with root they may be (no veth
    // pairs or namespaces here).
    for system in [
        "exonet-inproc",
        "exonet-inproc-busy",
        "exonet",
        "exonet-busy",
        "linux",
        "linux-busy",
    ] {
        for metric in ["us_rtt", "us_rtt_p99"] {
            want.push(("udp-rtt-veth", system, metric, true));
        }
    }
    for case in ["udp-tput-veth-64", "udp-tput-veth-1472"] {
        for system in [
            "exonet-inproc",
            "exonet-inproc-busy",
            "exonet",
            "linux",
            "linux-busy",
        ] {
            for metric in ["mpps", "gbps"] {
                want.push((case, system, metric, true));
            }
        }
    }
    check_suite(&stdout, "udp", &want, &[]);
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
