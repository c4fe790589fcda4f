//! `exonet bench ash --quick --json-only` as a smoke test: stdout is JSON
//! lines only, one per (case, system, metric), each with a positive value
//! (`separate-uncached` may be skipped off x86-64). No timing thresholds:
//! those belong to the benchmark, not to tests.

#[path = "common/json.rs"]
mod json;

use json::{bench, check_suite};

#[test]
fn quick_ash_suite_reports_every_case_system_and_metric() {
    let cases = ["ilp-copy-cksum", "ilp-copy-cksum-bswap"];
    let mut args = vec!["ash", "--quick", "--json-only"];
    for case in cases {
        args.extend(["--case", case]);
    }
    let stdout = bench(&args);
    let mut want = Vec::new();
    for case in cases {
        for system in ["exonet-dilp", "hand-integrated", "separate", "memcpy"] {
            want.push((case, system, "gbps", false));
        }
        want.push((
            case,
            "separate-uncached",
            "gbps",
            cfg!(not(target_arch = "x86_64")),
        ));
    }
    check_suite(&stdout, "ash", &want, &[]);
}

/// The handler cases: the invocation costs, and the remote increment with
/// competing processes (skipped without root, which its real-time
/// scheduling needs).
#[test]
fn quick_ash_handler_cases_report_every_system() {
    let stdout = bench(&[
        "ash",
        "--quick",
        "--json-only",
        "--case",
        "handler-overhead",
        "--case",
        "handler-udp-below",
        "--case",
        "remote-increment",
    ]);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut want = Vec::new();
    for system in ["empty", "remote-write-wasm", "remote-write-native"] {
        want.push((
            "handler-overhead",
            system.to_string(),
            "ns_per_frame",
            false,
        ));
    }
    for system in ["checksum-in-loop", "checksum-separate"] {
        want.push((
            "handler-udp-below",
            system.to_string(),
            "ns_per_frame",
            false,
        ));
    }
    for n in [0, 1, 2, 4, 8] {
        for server in ["handler", "app"] {
            want.push(("remote-increment", format!("{server}-{n}"), "us_rtt", !root));
        }
    }
    let want: Vec<(&str, &str, &str, bool)> = want
        .iter()
        .map(|(c, s, m, k)| (*c, s.as_str(), *m, *k))
        .collect();
    check_suite(&stdout, "ash", &want, &[]);
}
