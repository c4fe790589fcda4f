//! Real peers over veth (root only; "skipped: needs root" otherwise): the
//! daemon owns one end of a veth pair in its own namespace, Linux the other
//! (or, for the tap link, the daemon's TAP device, Linux on its kernel
//! side). With the afpacket link (in both receive modes), the afxdp link and
//! the tap link: Linux
//! `ping` and `arping` get answers from the multiplexer itself, and a scapy
//! script gets its UDP frames echoed by `exonet raw-echo`, before and after
//! a burst of hostile frames.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::until;
use exonet_shm::control::Client;

fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

/// Two namespaces, a veth pair between them, the daemon and its
/// applications, and a scratch directory: all gone on drop, even when the
/// test fails.
struct Rig {
    exo: String,
    linux: String,
    procs: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.exo, &self.linux] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn in_ns(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

fn stat(sock: &Path, kind: &str, name: &str) -> u64 {
    let mut c = Client::connect(sock).unwrap();
    c.stats()
        .unwrap()
        .iter()
        .filter(|r| r.kind == kind)
        .filter_map(|r| r.get(name))
        .sum()
}

/// With the daemon on `link` (`afpacket` or `afxdp`), its interface followed
/// by `suffix` in the link spec, the addresses in 10.77.`subnet`.0/24.
/// With `link` "tap", the daemon's TAP device is the wire and Linux sits on
/// its kernel side in the same namespace; otherwise a veth pair joins the
/// daemon's namespace to Linux's.
fn serve_linux_peers(link: &str, suffix: &str, subnet: u8) {
    let tap = link == "tap";
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("exonet-veth-{pid}-{link}{subnet}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rig = Rig {
        exo: format!("exo-{pid}-{link}{subnet}-x"),
        linux: format!("exo-{pid}-{link}{subnet}-l"),
        procs: Vec::new(),
        dir: dir.clone(),
    };
    if tap {
        rig.linux = rig.exo.clone();
    }
    ip(&["netns", "add", &rig.exo]);
    let (vx, vl) = if tap {
        let t = format!("tp{subnet}{}", pid % 10000);
        (t.clone(), t)
    } else {
        (
            format!("vx{subnet}{}", pid % 10000),
            format!("vl{subnet}{}", pid % 10000),
        )
    };
    if !tap {
        ip(&["netns", "add", &rig.linux]);
        ip(&["link", "add", &vx, "type", "veth", "peer", "name", &vl]);
        ip(&["link", "set", &vx, "netns", &rig.exo]);
        ip(&["link", "set", &vl, "netns", &rig.linux]);
        ip(&["-n", &rig.exo, "link", "set", &vx, "up"]);
    }
    for ns in [&rig.exo, &rig.linux] {
        let _ = in_ns(ns, "sysctl")
            .args(["-qw", "net.ipv6.conf.all.disable_ipv6=1"])
            .output();
    }
    let (exo_ip, linux_ip) = (format!("10.77.{subnet}.1"), format!("10.77.{subnet}.2"));

    let sock = dir.join("control.sock");
    let daemon = in_ns(&rig.exo, env!("CARGO_BIN_EXE_exonet"))
        .args(["daemon", "--link", &format!("{link}:{vx}{suffix}")])
        .args(["--ip", &format!("{exo_ip}/24"), "--socket"])
        .arg(&sock)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    rig.procs.push(daemon);
    until("the daemon listens", || {
        if let Some(status) = rig.procs[0].try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            let _ = rig.procs[0].stderr.take().unwrap().read_to_string(&mut err);
            panic!("the daemon exited ({status}): {err}");
        }
        Client::connect(&sock).is_ok()
    });
    // The daemon made the TAP device; Linux's side of it comes up now.
    ip(&[
        "-n",
        &rig.linux,
        "addr",
        "add",
        &format!("{linux_ip}/24"),
        "dev",
        &vl,
    ]);
    ip(&["-n", &rig.linux, "link", "set", &vl, "up"]);
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

    run(in_ns(&rig.linux, "ping").args(["-c", "3", "-i", "0.2", "-W", "2", &exo_ip]));
    // Fragmented both ways: Linux cuts the request in three, the host
    // reassembles it and fragments the reply.
    run(in_ns(&rig.linux, "ping").args(["-c", "2", "-i", "0.2", "-W", "2", "-s", "4000", &exo_ip]));
    run(in_ns(&rig.linux, "arping").args(["-c", "2", "-w", "5", "-I", &vl, &exo_ip]));
    let mac = Client::connect(&sock).unwrap().info().unwrap().mac;
    let mac = mac.map(|b| format!("{b:02x}")).join(":");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scapy/raw_echo.py");
    let out = run(in_ns(&rig.linux, "/usr/bin/python3")
        .arg(script)
        .args([&vl, &exo_ip, &mac, "7", "30"]));
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
    assert!(rig.procs[0].try_wait().unwrap().is_none());
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

#[test]
fn linux_peers_over_tap() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    serve_linux_peers("tap", "", 44);
}
