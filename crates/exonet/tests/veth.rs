//! Real peers over veth (root only; "skipped: needs root" otherwise): the
//! daemon owns one end of a veth pair in its own namespace, Linux the other
//! (or, for the tap link, the daemon's TAP device, Linux on its kernel
//! side). With the afpacket link (in both receive modes), the afxdp link and
//! the tap link: Linux
//! `ping` and `arping` get answers from the multiplexer itself, and a scapy
//! script gets its UDP frames echoed by `exonet raw-echo`, before and after
//! a burst of hostile frames.

mod common;

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use exonet_wire::Ipv4Packet;

use common::netns::{is_root, run, scapy_script, stat, Rig};
use common::until;

/// With the daemon on `link`, its interface followed by `suffix` in the link
/// spec, the addresses in 10.77.`subnet`.0/24 (see [`Rig::new`]).
fn serve_linux_peers(link: &str, suffix: &str, subnet: u8) {
    let mut rig = Rig::new(link, suffix, subnet);
    let sock = rig.sock.clone();
    let echo = Command::new(env!("CARGO_BIN_EXE_exonet"))
        .args(["raw-echo", "--port", "7", "--socket"])
        .arg(&sock)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    rig.procs.push(echo);
    until("the echo application binds", || {
        stat(&sock, "endpoint", "channels") == 1
    });

    let exo_ip = rig.exo_ip.clone();
    run(rig
        .linux("ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2", &exo_ip]));
    // Fragmented both ways: Linux cuts the request in three, the host
    // reassembles it and fragments the reply.
    run(rig
        .linux("ping")
        .args(["-c", "2", "-i", "0.2", "-W", "2", "-s", "4000", &exo_ip]));
    run(rig
        .linux("arping")
        .args(["-c", "2", "-w", "5", "-I", &rig.vl, &exo_ip]));
    let out = run(rig
        .linux("/usr/bin/python3")
        .arg(scapy_script("raw_echo.py"))
        .args([&rig.vl, &exo_ip, &rig.exo_mac(), "7", "30"]));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("echoed 31/31"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    assert!(stat(&sock, "host", "echo_replies") >= 5);
    assert!(stat(&sock, "host", "echo_reassembled") >= 2);
    assert_eq!(stat(&sock, "host", "echo_frag_bytes_held"), 0);
    assert!(stat(&sock, "host", "arp_replies_sent") >= 2);
    assert!(stat(&sock, "endpoint", "tx_frames") >= 31);
    // The daemon survived all of it.
    assert!(rig.daemon_alive());
}

#[test]
fn linux_peers_over_afpacket() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    serve_linux_peers("afpacket", "", 41);
}

#[test]
fn linux_peers_over_afpacket_frames() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    serve_linux_peers("afpacket", ":frames", 43);
}

#[test]
fn linux_peers_over_afxdp() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    serve_linux_peers("afxdp", "", 42);
}

/// `exonet daemon --capture`: tcpdump sees none of an AF_XDP socket's
/// frames, and the daemon's own pcap has them, both ways, once it stops.
#[test]
fn the_daemon_captures_what_its_link_moves() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let path = std::env::temp_dir().join(format!("exonet-capture-{}.pcap", std::process::id()));
    let mut rig = Rig::with_daemon_args("afxdp", "", 88, &["--capture", path.to_str().unwrap()]);
    run(rig
        .linux("ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2", &rig.exo_ip]));
    // SIGINT stops the daemon, which flushes the capture.
    let pid = rig.procs[0].id() as libc::pid_t;
    // SAFETY: a signal to our own child, still unreaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    until("the daemon stops", || {
        rig.procs[0].try_wait().unwrap().is_some()
    });
    let frames = exonet_wire::pcap::read_frames(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let (exo, linux): (Ipv4Addr, Ipv4Addr) =
        (rig.exo_ip.parse().unwrap(), rig.linux_ip.parse().unwrap());
    let echoes = |kind: u8, src: Ipv4Addr, dst: Ipv4Addr| {
        frames
            .iter()
            .filter_map(|f| Ipv4Packet::new_checked(f.get(14..)?).ok())
            .filter(|ip| ip.protocol() == 1 && ip.src_addr() == src && ip.dst_addr() == dst)
            .filter(|ip| ip.payload().first() == Some(&kind))
            .count()
    };
    assert_eq!(echoes(8, linux, exo), 3, "echo requests in");
    assert_eq!(echoes(0, exo, linux), 3, "echo replies out");
}

#[test]
fn linux_peers_over_tap() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    serve_linux_peers("tap", "", 44);
}
