//! `exonet bench endpoint --quick --json-only` as a smoke test: stdout is
//! JSON lines only, one per (case, system), each with a positive value, or
//! skipped where that is allowed (the veth case without root). No timing
//! thresholds: those belong to the benchmark, not to tests.

use std::collections::BTreeMap;
use std::process::Command;

#[derive(Debug, PartialEq)]
enum Value {
    Str(String),
    Num(f64),
}

/// A flat JSON object of strings and numbers (all the benchmarks print),
/// parsed strictly enough to catch a malformed line.
fn parse(line: &str) -> Result<BTreeMap<String, Value>, String> {
    let mut p = line.chars().peekable();
    let mut fields = BTreeMap::new();
    let expect = |p: &mut std::iter::Peekable<std::str::Chars>, c: char| match p.next() {
        Some(got) if got == c => Ok(()),
        got => Err(format!("expected {c:?}, found {got:?}")),
    };
    let string = |p: &mut std::iter::Peekable<std::str::Chars>| -> Result<String, String> {
        expect(p, '"')?;
        let mut s = String::new();
        loop {
            match p.next().ok_or("unterminated string")? {
                '"' => return Ok(s),
                '\\' => match p.next().ok_or("unterminated escape")? {
                    'n' => s.push('\n'),
                    'r' => s.push('\r'),
                    't' => s.push('\t'),
                    'u' => {
                        let hex: String = p.by_ref().take(4).collect();
                        let code = u32::from_str_radix(&hex, 16).map_err(|e| e.to_string())?;
                        s.push(char::from_u32(code).ok_or("bad \\u escape")?);
                    }
                    c @ ('"' | '\\' | '/') => s.push(c),
                    c => return Err(format!("bad escape \\{c}")),
                },
                c if (c as u32) < 0x20 => return Err("control character in a string".into()),
                c => s.push(c),
            }
        }
    };
    expect(&mut p, '{')?;
    loop {
        let key = string(&mut p)?;
        expect(&mut p, ':')?;
        let value = if p.peek() == Some(&'"') {
            Value::Str(string(&mut p)?)
        } else {
            let mut num = String::new();
            while let Some(&c) = p.peek() {
                if !(c.is_ascii_digit() || c == '-' || c == '.') {
                    break;
                }
                num.push(c);
                p.next();
            }
            let ok = !num.is_empty()
                && !num.ends_with('.')
                && !num.starts_with('.')
                && !num.starts_with("-.");
            match num.parse::<f64>() {
                Ok(v) if ok => Value::Num(v),
                _ => return Err(format!("bad number {num:?}")),
            }
        };
        if fields.insert(key.clone(), value).is_some() {
            return Err(format!("{key} twice"));
        }
        match p.next() {
            Some(',') => continue,
            Some('}') => break,
            got => return Err(format!("expected , or }}, found {got:?}")),
        }
    }
    match p.next() {
        None => Ok(fields),
        Some(c) => Err(format!("{c:?} after the object")),
    }
}

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
    let out = Command::new(env!("CARGO_BIN_EXE_exonet"))
        .args(["bench", "endpoint", "--quick", "--json-only"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // (case, system, metric, may be skipped)
    let want = [
        ("ring-rtt", "exonet", "ns_rtt", false),
        ("ring-rtt", "unix-seqpacket", "ns_rtt", false),
        ("ring-rtt", "pipe", "ns_rtt", false),
        ("ring-rtt", "linux-udp-loopback", "ns_rtt", false),
        ("ring-rtt", "unix-seqpacket-blocking", "ns_rtt", false),
        ("ring-rtt", "pipe-blocking", "ns_rtt", false),
        ("ring-rtt", "linux-udp-loopback-blocking", "ns_rtt", false),
        ("ring-mpps", "exonet", "mpps", false),
        ("raw-rtt-veth", "exonet-afxdp", "us_rtt", true),
        ("raw-rtt-veth", "exonet-afpacket", "us_rtt", true),
        ("raw-rtt-veth", "exonet-afpacket-v2", "us_rtt", true),
        ("raw-rtt-veth", "linux-udp", "us_rtt", true),
    ];
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), want.len(), "{stdout}");
    let str_of = |f: &BTreeMap<String, Value>, k: &str| match f.get(k) {
        Some(Value::Str(s)) => s.clone(),
        other => panic!("{k} is {other:?}"),
    };
    for (case, system, metric, may_skip) in want {
        let fields = lines
            .iter()
            .map(|l| parse(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .find(|f| str_of(f, "case") == case && str_of(f, "system") == system)
            .unwrap_or_else(|| panic!("no line for {case} {system}:\n{stdout}"));
        assert_eq!(str_of(&fields, "suite"), "endpoint");
        let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
        if fields.contains_key("skipped") {
            assert!(may_skip, "{case} {system} skipped: {fields:?}");
            assert_eq!(keys, ["case", "skipped", "suite", "system"]);
            assert!(!str_of(&fields, "skipped").is_empty());
        } else {
            assert_eq!(keys, ["case", "metric", "suite", "system", "value"]);
            assert_eq!(str_of(&fields, "metric"), metric);
            match fields.get("value") {
                Some(Value::Num(v)) => assert!(*v > 0.0, "{case} {system}: {v}"),
                other => panic!("{case} {system}: value {other:?}"),
            }
        }
    }
}
