//! `exonet bench endpoint --quick --json-only` as a smoke test: stdout is
//! JSON lines only, one per (case, system), each with a positive value, or
//! skipped where that is allowed (the veth case without root). No timing
//! thresholds: those belong to the benchmark, not to tests.

#[path = "common/json.rs"]
mod json;

use json::{bench, check_suite, parse};

#[test]
fn parser_refuses_malformed_lines() {
    assert!(parse(r#"{"a":"x\"y","b":-1.5}"#).is_ok());
    for bad in [
        r#"{"a":1"#,
        r#"{"a":1,}"#,
        r#"{"a":.5}"#,
        r#"{"a":1}x"#,
        r#"{"a":1,"a":2}"#,
        r#"{"a":NaN}"#,
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn quick_endpoint_suite_reports_every_case_and_system() {
    let stdout = bench(&["endpoint", "--quick", "--json-only"]);
    // (case, system, metric, may be skipped)
    let want = [
        ("ring-rtt", "exonet", "ns_rtt", false),
        ("ring-rtt", "unix-seqpacket", "ns_rtt", false),
        ("ring-rtt", "pipe", "ns_rtt", false),
        ("ring-rtt", "linux-udp-loopback", "ns_rtt", false),
        ("ring-rtt", "exonet-blocking", "ns_rtt", false),
        ("ring-rtt", "unix-seqpacket-blocking", "ns_rtt", false),
        ("ring-rtt", "pipe-blocking", "ns_rtt", false),
        ("ring-rtt", "linux-udp-loopback-blocking", "ns_rtt", false),
        ("ring-mpps", "exonet", "mpps", false),
        ("raw-rtt-veth", "exonet-afxdp", "us_rtt", true),
        ("raw-rtt-veth", "exonet-afpacket", "us_rtt", true),
        ("raw-rtt-veth", "exonet-afpacket-v2", "us_rtt", true),
        ("raw-rtt-veth", "linux-udp", "us_rtt", true),
    ];
    check_suite(&stdout, "endpoint", &want, &[]);
}
