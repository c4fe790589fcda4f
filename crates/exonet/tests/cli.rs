//! The binary's commands, run as a user would run them.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use exonet_wire::build;
use exonet_wire::ethernet::MacAddr;
use exonet_wire::pcap::PcapWriter;
use exonet_wire::tcp::flags;

fn exonet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_exonet"))
}

/// A capture with a mix of TCP, UDP, ICMP, ARP, fragments and IP options.
fn write_capture(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("exonet-cli-{}-{name}.pcap", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    let mut w = PcapWriter::new(std::io::BufWriter::new(file)).unwrap();
    let a = MacAddr([2, 0, 0, 0, 0, 1]);
    let b = MacAddr([2, 0, 0, 0, 0, 2]);
    let hosts = [
        Ipv4Addr::new(10, 77, 0, 1),
        Ipv4Addr::new(10, 77, 0, 2),
        Ipv4Addr::new(10, 77, 3, 9),
    ];
    let ports = [22u16, 53, 80, 443, 8080];
    let mut n = 0u32;
    for (i, &src) in hosts.iter().enumerate() {
        for (j, &dst) in hosts.iter().enumerate() {
            for &sp in &ports {
                for &dp in &ports {
                    let k = (i * 7 + j * 3 + sp as usize + dp as usize) % 6;
                    let mut frame = match k {
                        0 | 1 => {
                            build::tcp_frame(a, b, src, dst, sp, dp, flags::SYN, 1, 0, &[], b"")
                        }
                        2 | 3 => build::udp_frame(a, b, src, dst, sp, dp, b"hello"),
                        4 => build::icmp_echo(a, b, src, dst, sp, dp, b"ping"),
                        _ => build::arp_request(a, src, dst),
                    };
                    if n % 11 == 5 && k < 4 {
                        // A non-first fragment: ports are not visible.
                        frame[20] = 0x00;
                        frame[21] = 0x10;
                    }
                    w.write_packet(Duration::from_millis(n as u64), &frame)
                        .unwrap();
                    n += 1;
                }
            }
        }
    }
    w.flush().unwrap();
    path
}

/// Runs `exonet demo` with `args`; returns its output, failing on an error.
fn demo(args: &[&str]) -> String {
    let out = exonet().arg("demo").args(args).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    assert!(!err.contains("exonet demo:"), "{err}");
    text
}

/// The round-trip table: every row, with numbers.
fn assert_rtt_table(text: &str, columns: usize) {
    assert!(text.contains("round trips, µs"), "{text}");
    for row in [
        "ping, 56 B",
        "UDP 4 B, busy polling",
        "UDP 4 B, sleeping",
        "UDP 1472 B",
        "UDP 20000 B (fragments)",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no row {row}: {text}"));
        let numbers = line[row.len()..]
            .split_whitespace()
            .filter(|w| w.parse::<f64>().is_ok())
            .count();
        assert_eq!(numbers, 4 * columns, "{line}");
    }
    assert!(text.contains("connection refused"), "{text}");
}

#[test]
fn demo_runs_and_engines_agree() {
    let text = demo(&["--frames", "20000", "--round-trips", "200"]);
    assert!(
        text.contains("JIT and interpreter agree on all 20000 frames"),
        "{text}"
    );
    assert!(text.contains("web (10.77.1.5:40000)"));
    assert!(text.contains("then 200 UDP round trips"), "{text}");
    assert!(text.contains("refused by the template check"), "{text}");
    assert_rtt_table(&text, 1);
    assert!(text.contains("UDP 4 B raw frames, one thread"), "{text}");
    assert!(text.contains("ping, in-process multiplexers"), "{text}");
    assert!(text.contains("UDP 4 B, in-process, busy"), "{text}");
    for counters in ["reassembled", "cksum drops", "echo replies", "frag bodies"] {
        assert!(text.contains(counters), "{text}");
    }
    // The handlers' part: each check its own line says passed.
    assert!(text.contains("3 runs, 3 out of fuel"), "{text}");
    assert!(
        text.contains("its UDP checksum verified in the same loop (checked)"),
        "{text}"
    );
    assert!(text.contains("swapped (checked) and summed"), "{text}");
    // The lossy TCP transfer, its data sent from the send area.
    assert!(text.contains("bytes arrived intact"), "{text}");
    let by_reference = text
        .lines()
        .find(|l| l.contains("carried their data by reference"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(!by_reference.trim_start().starts_with("0 of"), "{text}");
}

#[test]
fn demo_veth_runs_against_linux() {
    // SAFETY: no arguments, cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let text = demo(&["--veth", "--round-trips", "200"]);
    assert!(text.contains("Linux -> exonet"), "{text}");
    assert_rtt_table(&text, 2);
    let ns = text
        .split_whitespace()
        .find(|w| w.starts_with("exonet-demo-"))
        .unwrap_or_else(|| panic!("no namespace named: {text}"));
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains(ns),
        "{ns} was left behind"
    );
}

#[test]
fn filter_explain_shows_trie_and_code() {
    let out = exonet()
        .args(["filter", "tcp and dst port 80", "--explain"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("canonical filters:"), "{text}");
    assert!(text.contains("SHIFT(14 + (14:8 & 0xf) << 2)"), "{text}");
    assert!(text.contains("native code:"), "{text}");
    let out = exonet()
        .args([
            "filter",
            "--dpf",
            "12:16 == 0x800 & SHIFT(14) & 9:8 == 6",
            "--explain",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("23:8 == 0x6"));
}

#[test]
fn filter_rejects_bad_input_with_a_message() {
    for args in [
        vec!["filter", "tcp and dst port"],
        vec!["filter", "--dpf", "70000:8 == 1"],
        vec!["filter", "tcp", "--read", "/nonexistent/x.pcap"],
    ] {
        let out = exonet().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("exonet filter:"));
    }
}

/// `exonet filter EXPR --read F` prints the numbers of the frames that
/// `tcpdump -r F EXPR` prints (frame n of the capture has timestamp n ms, so
/// tcpdump's `-tt` timestamps name the frames).
#[test]
fn filter_read_matches_tcpdump() {
    let path = write_capture("read");
    let have_tcpdump = Command::new("tcpdump").arg("--version").output().is_ok();
    for expr in [
        "tcp",
        "udp and port 53",
        "tcp and dst port 80",
        "host 10.77.0.2",
        "src host 10.77.0.1 and not udp",
        "portrange 50-500",
        "icmp or arp",
        "net 10.77.0.0/24 and not port 22",
        "not (tcp or udp)",
    ] {
        let out = exonet()
            .args(["filter", expr, "--read"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{expr}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours: Vec<u32> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert!(!ours.is_empty(), "{expr} matched nothing");
        if !have_tcpdump {
            eprintln!("skipped comparison with tcpdump: not installed");
            continue;
        }
        let td = Command::new("tcpdump")
            .args(["-tt", "-n", "-r"])
            .arg(&path)
            .arg(expr)
            .output()
            .unwrap();
        assert!(
            td.status.success(),
            "tcpdump {expr}: {}",
            String::from_utf8_lossy(&td.stderr)
        );
        let theirs: Vec<u32> = String::from_utf8(td.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let ts: f64 = l.split_whitespace().next().unwrap().parse().unwrap();
                (ts * 1000.0).round() as u32 + 1
            })
            .collect();
        assert_eq!(ours, theirs, "{expr}");
    }
    std::fs::remove_file(path).unwrap();
}
