//! Benchmark output: one JSON object per line on stdout, and a summary table.
//!
//! A measured line is exactly
//! `{"suite":"dpf","case":"tcp10","system":"exonet-jit","metric":"ns_per_pkt","value":3.1}`;
//! a system that failed (e.g. classified a frame differently from the case's
//! filters) has `"error":"<why>"` in place of `"value"`, and a system that
//! could not run here (no root, no clang, the kernel refused) has
//! `"skipped":"<why>"` and no metric.

use std::fmt::Write as _;

/// How one (case, system) measurement ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Value(f64),
    Error(String),
    Skipped(String),
}

/// Why a system has no number for a case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    /// Something is wrong: reported as `"error"`, and the run fails.
    Error(String),
    /// The system cannot run here: reported as `"skipped"`.
    Skip(String),
}

impl Outcome {
    /// A measurement's result as a line's outcome.
    pub fn of(r: Result<f64, Fail>) -> Outcome {
        match r {
            Ok(v) => Outcome::Value(v),
            Err(Fail::Error(e)) => Outcome::Error(e),
            Err(Fail::Skip(s)) => Outcome::Skipped(s),
        }
    }
}

/// One line of output.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub suite: String,
    pub case: String,
    pub system: String,
    pub metric: String,
    pub outcome: Outcome,
}

impl Record {
    /// The record as one JSON object (no trailing newline).
    pub fn json(&self) -> String {
        let mut s = format!(
            "{{\"suite\":{},\"case\":{},\"system\":{}",
            json_string(&self.suite),
            json_string(&self.case),
            json_string(&self.system)
        );
        match &self.outcome {
            Outcome::Value(v) if v.is_finite() => {
                let _ = write!(
                    s,
                    ",\"metric\":{},\"value\":{}",
                    json_string(&self.metric),
                    json_number(*v)
                );
            }
            Outcome::Value(v) => {
                let _ = write!(
                    s,
                    ",\"metric\":{},\"error\":{}",
                    json_string(&self.metric),
                    json_string(&format!("not a finite number: {v}"))
                );
            }
            Outcome::Error(e) => {
                let _ = write!(
                    s,
                    ",\"metric\":{},\"error\":{}",
                    json_string(&self.metric),
                    json_string(e)
                );
            }
            Outcome::Skipped(r) => {
                let _ = write!(s, ",\"skipped\":{}", json_string(r));
            }
        }
        s.push('}');
        s
    }
}

/// A JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A finite number as a JSON number, rounded to three decimals
/// (`3.1`, `12`, `0.042`); never in exponent form.
pub fn json_number(v: f64) -> String {
    let r = (v * 1000.0).round() / 1000.0;
    // Rust's `Display` for f64 never uses an exponent; avoid "-0".
    if r == 0.0 {
        "0".to_string()
    } else {
        format!("{r}")
    }
}

/// Collects the records of one suite run, printing each as it arrives.
pub struct Reporter {
    suite: String,
    json_only: bool,
    records: Vec<Record>,
    notes: Vec<String>,
}

impl Reporter {
    pub fn new(suite: &str, json_only: bool) -> Reporter {
        Reporter {
            suite: suite.to_string(),
            json_only,
            records: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Prints the record's JSON line (flushed at once) and keeps it for the
    /// table. Errors are also told on stderr, even with `--json-only`.
    pub fn push(&mut self, case: &str, system: &str, metric: &str, outcome: Outcome) {
        let r = Record {
            suite: self.suite.clone(),
            case: case.to_string(),
            system: system.to_string(),
            metric: metric.to_string(),
            outcome,
        };
        // stdout is line-buffered: each line goes out as it is printed.
        println!("{}", r.json());
        if let Outcome::Error(e) = &r.outcome {
            eprintln!("error: {}/{}/{}: {e}", r.suite, r.case, r.system);
        }
        self.records.push(r);
    }

    /// One line per metric of a measurement that yields several values (in
    /// the order of `metrics`); one line for all if it was skipped.
    pub fn push_all(
        &mut self,
        case: &str,
        system: &str,
        metrics: &[&str],
        r: Result<impl IntoIterator<Item = f64>, Fail>,
    ) {
        match r {
            Ok(values) => {
                for (m, v) in metrics.iter().zip(values) {
                    self.push(case, system, m, Outcome::Value(v));
                }
            }
            Err(Fail::Skip(why)) => self.push(case, system, metrics[0], Outcome::Skipped(why)),
            Err(Fail::Error(e)) => {
                for m in metrics {
                    self.push(case, system, m, Outcome::Error(e.clone()));
                }
            }
        }
    }

    /// A footer line: `system`'s `metric` over `peer`'s in `case`, against the
    /// goal `want` (`met` judges the ratio); nothing if either is missing.
    pub fn goal(
        &mut self,
        case: &str,
        metric: &str,
        (system, peer): (&str, &str),
        want: &str,
        met: impl Fn(f64) -> bool,
    ) {
        if let (Some(v), Some(p)) = (
            self.value(case, system, metric),
            self.value(case, peer, metric),
        ) {
            let r = v / p;
            self.note(format!(
                "goal {case} {metric}: {system}/{peer} = {} (want {want}): {}",
                ratio(r),
                if met(r) { "met" } else { "not met" }
            ));
        }
    }

    /// The suite's exit status: failure if any system reported an error.
    pub fn exit_code(&self) -> std::process::ExitCode {
        if self.failed() {
            std::process::ExitCode::FAILURE
        } else {
            std::process::ExitCode::SUCCESS
        }
    }

    /// A progress note on stderr, unless `--json-only`.
    pub fn progress(&self, msg: &str) {
        if !self.json_only {
            eprintln!("{}: {msg}", self.suite);
        }
    }

    /// A line for the table's footer.
    pub fn note(&mut self, line: String) {
        self.notes.push(line);
    }

    /// The value `system` measured for `case` in `metric`, if it did.
    pub fn value(&self, case: &str, system: &str, metric: &str) -> Option<f64> {
        self.records.iter().find_map(|r| match r.outcome {
            Outcome::Value(v) if r.case == case && r.system == system && r.metric == metric => {
                Some(v)
            }
            _ => None,
        })
    }

    /// Whether any system reported an error.
    pub fn failed(&self) -> bool {
        self.records.iter().any(|r| {
            !matches!(r.outcome, Outcome::Value(v) if v.is_finite())
                && !matches!(r.outcome, Outcome::Skipped(_))
        })
    }

    /// Prints the table on stderr, unless `--json-only`.
    pub fn print_table(&self, title: &str, systems: &[&str], baseline: &str) {
        if !self.json_only {
            eprint!("{}", self.table(title, systems, baseline));
        }
    }

    /// Per case (rows, in the order measured) each system's value and its
    /// ratio to `baseline`; then the reasons of errors and skips. Only the
    /// records of `systems` count (a suite whose cases compare different
    /// systems prints a table per group); empty if there are none.
    pub fn table(&self, title: &str, systems: &[&str], baseline: &str) -> String {
        let records: Vec<&Record> = self
            .records
            .iter()
            .filter(|r| systems.contains(&r.system.as_str()))
            .collect();
        // A case that reports several metrics has a row for each; a skip
        // shows in every row of its case.
        let mut cases: Vec<(&str, &str)> = Vec::new();
        for r in &records {
            if !cases.iter().any(|c| c.0 == r.case && c.1 == r.metric) {
                cases.push((&r.case, &r.metric));
            }
        }
        if cases.is_empty() {
            return String::new();
        }
        let find = |case: &str, metric: &str, system: &str| {
            records.iter().find(|r| {
                r.case == case
                    && r.system == system
                    && (r.metric == metric || matches!(r.outcome, Outcome::Skipped(_)))
            })
        };
        let mut rows: Vec<Vec<String>> = Vec::new();
        let mut head = vec!["case".to_string(), "metric".to_string()];
        head.extend(systems.iter().map(|s| s.to_string()));
        rows.push(head);
        for (case, metric) in &cases {
            let base = match find(case, metric, baseline).map(|r| &r.outcome) {
                Some(Outcome::Value(v)) if *v > 0.0 => Some(*v),
                _ => None,
            };
            let mut row = vec![case.to_string(), metric.to_string()];
            for system in systems {
                row.push(match find(case, metric, system).map(|r| &r.outcome) {
                    None => "-".to_string(),
                    Some(Outcome::Value(v)) => match base {
                        Some(b) if *system != baseline => {
                            format!("{} ({})", human(*v), ratio(v / b))
                        }
                        _ => human(*v),
                    },
                    Some(Outcome::Error(_)) => "error".to_string(),
                    Some(Outcome::Skipped(_)) => "skipped".to_string(),
                });
            }
            rows.push(row);
        }
        let ncol = rows[0].len();
        let widths: Vec<usize> = (0..ncol)
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        let _ = writeln!(out, "\n{title}");
        for row in &rows {
            for (c, cell) in row.iter().enumerate() {
                if c < 2 {
                    let _ = write!(out, "{cell:<w$}  ", w = widths[c]);
                } else {
                    let _ = write!(out, "{cell:>w$}  ", w = widths[c]);
                }
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
        }
        // Reasons, grouped so that one cause (e.g. "needs root") is told once.
        let mut notes: Vec<(String, String, Vec<String>)> = Vec::new();
        for r in &records {
            let (kind, why) = match &r.outcome {
                Outcome::Error(e) => ("error", e),
                Outcome::Skipped(s) => ("skipped", s),
                Outcome::Value(_) => continue,
            };
            let key = format!("{} {kind}", r.system);
            match notes.iter_mut().find(|n| n.0 == key && n.1 == *why) {
                Some(n) => n.2.push(r.case.clone()),
                None => notes.push((key, why.clone(), vec![r.case.clone()])),
            }
        }
        for (key, why, cases) in notes {
            let _ = writeln!(out, "  {key} ({}): {why}", cases.join(", "));
        }
        // A note about a case goes with that case's table; one about no
        // case with every table.
        let about = |n: &str, case: &str| n.split_whitespace().any(|w| w == case);
        for n in &self.notes {
            let ours = cases.iter().any(|(c, _)| about(n, c));
            let general = !self.records.iter().any(|r| about(n, &r.case));
            if ours || general {
                let _ = writeln!(out, "  {n}");
            }
        }
        out
    }
}

/// A ratio for the table: `0.52x`, `7.18x`, `27.8x`, `1229x`.
pub fn ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}x")
    } else if r >= 10.0 {
        format!("{r:.1}x")
    } else {
        format!("{r:.2}x")
    }
}

/// Three significant digits, for the table.
pub fn human(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(outcome: Outcome) -> Record {
        Record {
            suite: "dpf".into(),
            case: "tcp10".into(),
            system: "exonet-jit".into(),
            metric: "ns_per_pkt".into(),
            outcome,
        }
    }

    #[test]
    fn json_line_is_exactly_the_documented_format() {
        assert_eq!(
            rec(Outcome::Value(3.1)).json(),
            r#"{"suite":"dpf","case":"tcp10","system":"exonet-jit","metric":"ns_per_pkt","value":3.1}"#
        );
        assert_eq!(
            rec(Outcome::Value(2.0 / 3.0)).json(),
            r#"{"suite":"dpf","case":"tcp10","system":"exonet-jit","metric":"ns_per_pkt","value":0.667}"#
        );
        assert_eq!(
            rec(Outcome::Value(1.5e7)).json(),
            r#"{"suite":"dpf","case":"tcp10","system":"exonet-jit","metric":"ns_per_pkt","value":15000000}"#
        );
        assert_eq!(
            rec(Outcome::Error("frame 3: \"x\"\n".into())).json(),
            r#"{"suite":"dpf","case":"tcp10","system":"exonet-jit","metric":"ns_per_pkt","error":"frame 3: \"x\"\n"}"#
        );
        assert_eq!(
            rec(Outcome::Skipped("needs root".into())).json(),
            r#"{"suite":"dpf","case":"tcp10","system":"exonet-jit","skipped":"needs root"}"#
        );
        // Non-finite values are not JSON numbers: they become errors.
        assert!(rec(Outcome::Value(f64::NAN)).json().contains("\"error\""));
        assert_eq!(json_string("a\u{1}b"), "\"a\\u0001b\"");
    }

    #[test]
    fn table_shows_ratios_to_the_baseline_and_reasons() {
        let mut r = Reporter::new("dpf", true);
        r.push("tcp10", "exonet-jit", "ns_per_pkt", Outcome::Value(2.0));
        r.push("tcp10", "libpcap", "ns_per_pkt", Outcome::Value(50.0));
        r.push(
            "tcp10",
            "linux-ebpf",
            "ns_per_pkt",
            Outcome::Skipped("needs root".into()),
        );
        r.push("depth-1", "exonet-jit", "ns_per_pkt", Outcome::Value(1.0));
        r.push(
            "depth-1",
            "linux-ebpf",
            "ns_per_pkt",
            Outcome::Skipped("needs root".into()),
        );
        let t = r.table("t", &["exonet-jit", "libpcap", "linux-ebpf"], "exonet-jit");
        assert!(t.contains("50.0 (25.0x)"), "{t}");
        assert!(
            t.contains("linux-ebpf skipped (tcp10, depth-1): needs root"),
            "{t}"
        );
        assert!(!r.failed());
        // A table of some systems shows only their cases and reasons.
        let t = r.table("t", &["exonet-jit", "libpcap"], "exonet-jit");
        assert!(
            t.contains("50.0 (25.0x)") && !t.contains("linux-ebpf"),
            "{t}"
        );
        assert_eq!(r.table("t", &["nobody"], "nobody"), "");
        r.push(
            "depth-1",
            "libpcap",
            "ns_per_pkt",
            Outcome::Error("disagrees".into()),
        );
        assert!(r.failed());
    }

    #[test]
    fn table_has_a_row_per_metric_of_a_case() {
        let mut r = Reporter::new("udp", true);
        r.push("rtt", "exonet", "us_rtt", Outcome::Value(10.0));
        r.push("rtt", "exonet", "us_rtt_p99", Outcome::Value(20.0));
        r.push("rtt", "linux", "us_rtt", Outcome::Value(15.0));
        r.push("rtt", "linux", "us_rtt_p99", Outcome::Value(60.0));
        r.push("rtt", "busy", "us_rtt", Outcome::Skipped("no".into()));
        let t = r.table("t", &["exonet", "linux", "busy"], "exonet");
        let rows: Vec<&str> = t.lines().filter(|l| l.starts_with("rtt")).collect();
        assert_eq!(rows.len(), 2, "{t}");
        assert!(
            rows[0].contains("us_rtt ") && rows[0].contains("15.0 (1.50x)"),
            "{t}"
        );
        assert!(
            rows[1].contains("us_rtt_p99") && rows[1].contains("60.0 (3.00x)"),
            "{t}"
        );
        assert!(rows.iter().all(|r| r.ends_with("skipped")), "{t}");
        assert_eq!(r.value("rtt", "linux", "us_rtt_p99"), Some(60.0));
        assert_eq!(r.value("rtt", "busy", "us_rtt"), None);
    }

    #[test]
    fn a_note_goes_with_its_cases_table() {
        let mut r = Reporter::new("ash", true);
        r.push("ilp", "dilp", "gbps", Outcome::Value(2.0));
        r.push("ilp", "separate", "gbps", Outcome::Value(1.0));
        r.push("rtt", "handler-0", "us_rtt", Outcome::Value(5.0));
        r.goal("ilp", "gbps", ("dilp", "separate"), "at least 1.4x", |x| {
            x >= 1.4
        });
        r.note("floor: 1 ns".into());
        let ilp = r.table("t", &["dilp", "separate"], "dilp");
        let rtt = r.table("t", &["handler-0"], "handler-0");
        assert!(
            ilp.contains("goal ilp gbps") && !rtt.contains("goal ilp"),
            "{ilp}{rtt}"
        );
        assert!(ilp.contains("floor") && rtt.contains("floor"), "{ilp}{rtt}");
    }
}
