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
