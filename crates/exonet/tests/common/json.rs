//! The benchmarks' JSON lines, parsed and checked: shared by the tests that
//! run `exonet bench <suite>` (included with `#[path]`, so that the tests
//! that do not need it do not build it).

use std::collections::BTreeMap;
use std::process::Command;

/// Runs `exonet bench <args>`, which must succeed; its stdout.
pub fn bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_exonet"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[derive(Debug, PartialEq)]
pub enum Value {
    Str(String),
    Num(f64),
}

/// A flat JSON object of strings and numbers (all the benchmarks print),
/// parsed strictly enough to catch a malformed line.
pub fn parse(line: &str) -> Result<BTreeMap<String, Value>, String> {
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

/// Checks that `stdout` is exactly the lines `want` says, for `suite`: per
/// (case, system, metric, may be skipped) a well-formed line with a positive
/// value, or, where skipping is allowed, one "skipped" line for the case
/// and system instead of all of its metrics. The metrics named in `counts`
/// count events and may be zero.
pub fn check_suite(stdout: &str, suite: &str, want: &[(&str, &str, &str, bool)], counts: &[&str]) {
    let lines: Vec<BTreeMap<String, Value>> = stdout
        .lines()
        .map(|l| parse(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let str_of = |f: &BTreeMap<String, Value>, k: &str| match f.get(k) {
        Some(Value::Str(s)) => s.clone(),
        other => panic!("{k} is {other:?}"),
    };
    let mut expected = 0;
    for (i, &(case, system, metric, may_skip)) in want.iter().enumerate() {
        let of_it: Vec<&BTreeMap<String, Value>> = lines
            .iter()
            .filter(|f| str_of(f, "case") == case && str_of(f, "system") == system)
            .collect();
        assert!(!of_it.is_empty(), "no line for {case} {system}:\n{stdout}");
        for f in &of_it {
            assert_eq!(str_of(f, "suite"), suite);
        }
        if let [f] = of_it[..] {
            if f.contains_key("skipped") {
                assert!(may_skip, "{case} {system} skipped: {f:?}");
                let keys: Vec<&str> = f.keys().map(String::as_str).collect();
                assert_eq!(keys, ["case", "skipped", "suite", "system"]);
                assert!(!str_of(f, "skipped").is_empty());
                // One line for all the metrics of the case and system.
                let first = want[..i].iter().all(|w| (w.0, w.1) != (case, system));
                expected += usize::from(first);
                continue;
            }
        }
        expected += 1;
        let f = of_it
            .iter()
            .find(|f| f.get("metric") == Some(&Value::Str(metric.into())))
            .unwrap_or_else(|| panic!("no {metric} for {case} {system}:\n{stdout}"));
        let keys: Vec<&str> = f.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["case", "metric", "suite", "system", "value"],
            "{f:?}"
        );
        match f.get("value") {
            Some(Value::Num(v)) if counts.contains(&metric) => {
                assert!(*v >= 0.0, "{case} {system} {metric}: {v}")
            }
            Some(Value::Num(v)) => assert!(*v > 0.0, "{case} {system} {metric}: {v}"),
            other => panic!("{case} {system} {metric}: value {other:?}"),
        }
    }
    assert_eq!(lines.len(), expected, "{stdout}");
}
