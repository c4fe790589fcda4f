//! The socket tools against real Linux peers over veth (root only;
//! "skipped: needs root" otherwise), on the rig of tests/veth.rs: Linux
//! `ping`, `nc -u` and `socat` to `exonet udp-echo`; `exonet ping` to Linux
//! (also fragmented); an 8000-byte datagram from scapy in fragments out
//! of order; hostile input, after which the host still answers, the drops
//! are counted and the library holds no memory; handlers in the
//! multiplexer answering Linux, one with UDP below it dropping a bad
//! checksum; Linux's UDP super-datagrams (`UDP_SEGMENT`), left whole by
//! the veth, cut by the afpacket link into the datagrams their sender wrote.

mod common;

use common::daemons::{echo_stats, exonet, field, json_u64, stats, stop_echo, text, udp_echo};
use common::netns::{is_root, run, scapy_script, stat, Rig};
use common::until;

/// `exonet udp-echo` on port 7 of the rig's daemon, incomplete datagrams
/// given up after a second.
fn echo_on(rig: &mut Rig) -> std::io::BufReader<std::process::ChildStdout> {
    let (echo, out) = udp_echo(&rig.sock, &["--port", "7", "--reasm-timeout", "1000"]);
    rig.procs.push(echo);
    out
}

/// Linux's `ping` to the daemon, `nc -u` and `socat` to the echo server.
fn linux_tools_answered(rig: &Rig) {
    let exo = &rig.exo_ip;
    let out = run(rig
        .linux("ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2", exo]));
    assert!(
        text(&out.stdout).contains("3 received"),
        "{}",
        text(&out.stdout)
    );
    let nc = format!("printf hello-nc | nc -u -w 1 {exo} 7");
    let out = run(rig.linux("sh").args(["-c", &nc]));
    assert_eq!(text(&out.stdout), "hello-nc");
    let socat = format!("printf hello-socat | socat -t 1 - UDP4:{exo}:7");
    let out = run(rig.linux("sh").args(["-c", &socat]));
    assert_eq!(text(&out.stdout), "hello-socat");
}

fn tools_and_linux_peers(link: &str, suffix: &str, subnet: u8) {
    let mut rig = Rig::new(link, suffix, subnet);
    let mut out = echo_on(&mut rig);
    // (tests/veth.rs has Linux's fragmented pings.)
    linux_tools_answered(&rig);

    // exonet ping to Linux, small and fragmented both ways.
    for size in ["56", "4000"] {
        let ping = exonet()
            .args(["ping", &rig.linux_ip, "--count", "3", "--interval", "100"])
            .args(["--size", size, "--socket"])
            .arg(&rig.sock)
            .output()
            .unwrap();
        let s = text(&ping.stdout);
        assert!(ping.status.success(), "{s}{}", text(&ping.stderr));
        assert!(
            s.contains("3 packets transmitted, 3 received, 0% packet loss"),
            "{s}"
        );
    }

    // exonet udp-send to a Linux echo server (socat), in fragments both
    // ways; one datagram outstanding, so that socat's pipe never joins two.
    let echo_addr = format!("{}:7000", rig.linux_ip);
    let socat = rig
        .linux("socat")
        .args([&format!("UDP4-LISTEN:7000,bind={}", rig.linux_ip), "PIPE"])
        .spawn()
        .unwrap();
    rig.procs.push(socat);
    until("socat listens", || {
        let ss = run(rig.linux("ss").args(["-uln"]));
        text(&ss.stdout).contains(&echo_addr)
    });
    let send = exonet()
        .args([
            "udp-send", &echo_addr, "--count", "20", "--size", "3000", "--json",
        ])
        .arg("--socket")
        .arg(&rig.sock)
        .output()
        .unwrap();
    let s = text(&send.stdout);
    assert!(send.status.success(), "{s}{}", text(&send.stderr));
    assert_eq!(json_u64(&s, "received"), Some(20), "{s}");
    let mut socat = rig.procs.pop().unwrap();
    let _ = socat.kill();
    let _ = socat.wait();

    let script = scapy_script("udp_frag_echo.py");
    let py = run(rig.linux("/usr/bin/python3").arg(script).args([
        &rig.vl,
        &rig.exo_ip,
        &rig.exo_mac(),
        "7",
        "8000",
    ]));
    assert!(
        text(&py.stdout).contains("echoed 8000 bytes"),
        "{}",
        text(&py.stdout)
    );

    let last = stop_echo(rig.procs.pop().unwrap(), &mut out);
    for (k, at_least) in [("answered", 3), ("reassembled", 1)] {
        assert!(json_u64(&last, k).unwrap() >= at_least, "{k}: {last}");
    }
    for k in ["bad_checksum", "reasm_bytes", "queued"] {
        assert_eq!(json_u64(&last, k), Some(0), "{k}: {last}");
    }
    assert!(stat(&rig.sock, "host", "echo_replies") >= 3);
    assert!(rig.daemon_alive());
}

#[test]
fn tools_and_linux_peers_over_afpacket() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tools_and_linux_peers("afpacket", ":frames", 51);
}

#[test]
fn tools_and_linux_peers_over_afxdp() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    tools_and_linux_peers("afxdp", "", 52);
}

/// Linux sends with `UDP_SEGMENT` (as QUIC stacks do): over a veth (or to
/// a TAP with offloads, from Linux 6.2) the super-datagram arrives whole,
/// and the link cuts it by the segment size in its `virtio_net_hdr`. Every
/// datagram comes back from `exonet udp-echo` as it was sent, and none is
/// dropped.
fn linux_udp_super_datagrams_are_cut(link: &str, suffix: &str, subnet: u8) {
    let mut rig = Rig::new(link, suffix, subnet);
    let mut out = echo_on(&mut rig);
    let py = run(rig
        .linux("/usr/bin/python3")
        .arg(scapy_script("udp_gso_echo.py"))
        .args([&rig.linux_ip, &rig.exo_ip, "7"]));
    let said = text(&py.stdout);
    assert!(py.status.success(), "{said}{}", text(&py.stderr));
    assert!(said.contains("echoed 18 of 18 datagrams"), "{said}");
    assert_eq!(stat(&rig.sock, "link", "rx_super"), 3);
    assert_eq!(stat(&rig.sock, "link", "rx_dropped"), 0);
    let last = stop_echo(rig.procs.pop().unwrap(), &mut out);
    assert_eq!(json_u64(&last, "bad_checksum"), Some(0), "{last}");
    assert!(rig.daemon_alive());
}

#[test]
fn linux_udp_super_datagrams_are_cut_by_afpacket_blocks() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    linux_udp_super_datagrams_are_cut("afpacket", "", 78);
}

#[test]
fn linux_udp_super_datagrams_are_cut_by_afpacket_frames() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    linux_udp_super_datagrams_are_cut("afpacket", ":frames", 79);
}

#[test]
fn linux_udp_super_datagrams_are_cut_by_tap() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    linux_udp_super_datagrams_are_cut("tap", "", 83);
}

#[test]
fn hostile_udp_input_over_afpacket() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    hostile_udp_input_is_counted_and_forgotten("afpacket", ":frames", 53);
}

#[test]
fn hostile_udp_input_over_afxdp() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    hostile_udp_input_is_counted_and_forgotten("afxdp", "", 54);
}

#[test]
fn hostile_udp_input_over_tap() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    hostile_udp_input_is_counted_and_forgotten("tap", "", 86);
}

fn hostile_udp_input_is_counted_and_forgotten(link: &str, suffix: &str, subnet: u8) {
    let mut rig = Rig::new(link, suffix, subnet);
    let mut out = echo_on(&mut rig);
    let script = scapy_script("udp_hostile.py");
    let py = run(rig.linux("/usr/bin/python3").arg(script).args([
        &rig.vl,
        &rig.exo_ip,
        &rig.exo_mac(),
        "7",
        "300",
    ]));
    assert!(
        text(&py.stdout).contains("echoed 2/2"),
        "{}",
        text(&py.stdout)
    );
    // Still a host: ping and echo answered.
    linux_tools_answered(&rig);

    // The unfinished datagrams are given up after the reassembly timeout.
    let echo = rig.procs.last().unwrap();
    let mut seen = String::new();
    until("the echo server holds no fragments", || {
        seen = echo_stats(echo, &mut out);
        json_u64(&seen, "reasm_bytes") == Some(0)
    });
    let last = stop_echo(rig.procs.pop().unwrap(), &mut out);
    for k in [
        "bad_checksum",
        "udp_bad_length",
        "reasm_overlap",
        "reasm_too_many_fragments",
        "reasm_timed_out",
        "icmp_errors_unclaimed",
    ] {
        assert!(json_u64(&last, k).unwrap() > 0, "{k}: {last}");
    }
    assert!(json_u64(&last, "reasm_timed_out").unwrap() >= 300, "{last}");
    for k in ["reasm_bytes", "queued"] {
        assert_eq!(json_u64(&last, k), Some(0), "{k}: {last}");
    }
    // `exonet stats`: the multiplexer counted what it could not deliver,
    // let the flood's heads through and holds no body fragments.
    let mux = stats(&rig.sock);
    assert!(field(&mux, "host", "unmatched_dropped") > 0, "{mux:#?}");
    assert!(field(&mux, "host", "icmp_errors_unclaimed") > 0, "{mux:#?}");
    assert!(field(&mux, "frag", "heads") >= 300, "{mux:#?}");
    assert_eq!(field(&mux, "frag", "held_bytes"), 0, "{mux:#?}");
    assert!(rig.daemon_alive());
}

#[test]
fn a_handler_answers_linux_over_afxdp() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut rig = Rig::new("afxdp", "", 55);
    let handler = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ash/handlers/udp_echo.wat")
        .to_string_lossy()
        .into_owned();
    let (echo, mut out) = udp_echo(&rig.sock, &["--port", "7", "--handler", &handler]);
    rig.procs.push(echo);
    // Linux's nc is answered by the handler in the multiplexer: the echo
    // application never sees the datagrams.
    for i in 0..3 {
        let nc = format!("printf hello-ash-{i} | nc -u -w 1 {} 7", rig.exo_ip);
        let out = run(rig.linux("sh").args(["-c", &nc]));
        assert_eq!(text(&out.stdout), format!("hello-ash-{i}"));
    }
    let mux = stats(&rig.sock);
    assert_eq!(field(&mux, "channel", "handler_runs"), 3, "{mux:#?}");
    assert_eq!(field(&mux, "channel", "handler_sent"), 3, "{mux:#?}");
    assert_eq!(field(&mux, "channel", "rx_consumed"), 3, "{mux:#?}");
    let last = stop_echo(rig.procs.pop().unwrap(), &mut out);
    assert_eq!(json_u64(&last, "answered"), Some(0), "{last}");
    assert!(rig.daemon_alive());
}

/// A handler installed with UDP below it (`udp-echo --below udp`): Linux's
/// nc is echoed by the handler, which sees only the payload; a datagram
/// from scapy with a wrong UDP checksum is dropped by the multiplexer with
/// the handler's reply, and counted.
#[test]
fn a_handler_with_udp_below_drops_bad_checksums_from_linux() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut rig = Rig::new("afxdp", "", 56);
    let handler = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ash/handlers/udp_echo_payload.wat")
        .to_string_lossy()
        .into_owned();
    let (echo, mut out) = udp_echo(
        &rig.sock,
        &["--port", "7", "--handler", &handler, "--below", "udp"],
    );
    rig.procs.push(echo);
    let nc = |i: u32| {
        let nc = format!("printf below-{i} | nc -u -w 1 {} 7", rig.exo_ip);
        text(&run(rig.linux("sh").args(["-c", &nc])).stdout)
    };
    assert_eq!(nc(0), "below-0");
    // scapy's checksum field as given: wrong for this payload.
    let bad = format!(
        "from scapy.all import IP, UDP, send\n\
         send(IP(dst='{}')/UDP(sport=40000, dport=7, chksum=0x1234)/b'corrupt', verbose=0)\n",
        rig.exo_ip
    );
    run(rig.linux("/usr/bin/python3").args(["-c", &bad]));
    until("the bad datagram is counted", || {
        field(&stats(&rig.sock), "channel", "handler_dropped") == 1
    });
    assert_eq!(nc(1), "below-1");
    let mux = stats(&rig.sock);
    assert_eq!(field(&mux, "channel", "handler_runs"), 3, "{mux:#?}");
    assert_eq!(field(&mux, "channel", "handler_sent"), 2, "{mux:#?}");
    assert_eq!(field(&mux, "channel", "rx_consumed"), 3, "{mux:#?}");
    let last = stop_echo(rig.procs.pop().unwrap(), &mut out);
    assert_eq!(json_u64(&last, "answered"), Some(0), "{last}");
    assert!(rig.daemon_alive());
}
