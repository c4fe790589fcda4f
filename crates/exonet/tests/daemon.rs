//! `exonet daemon`, `exonet raw-echo` and `exonet stats` as separate
//! processes: two daemons joined by a memwire cable, an echo application on
//! one, a test application on the other, ARP resolution on the
//! application's behalf, kill -9 of the echo application, SIGTERM.

mod common;

use std::net::Ipv4Addr;
use std::process::Stdio;

use common::daemons::{count, daemon, daemon_with, exonet, field, signal, stats, Procs};
use common::until;
use exonet_shm::control::{Client, PROTO_UDP};
use exonet_shm::{Desc, SegmentConfig, INLINE_MAX};
use exonet_wire::build;
use exonet_wire::ethernet::MacAddr;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

#[test]
fn two_daemons_on_a_memwire_echo_arp_reclaim_and_stop() {
    let mut procs = Procs::new("daemon");
    let dir = procs.1.clone();
    procs.0.push(daemon(&dir, "a", "10.0.0.1/24"));
    procs.0.push(daemon(&dir, "b", "10.0.0.2/24"));
    let (sa, sb) = (dir.join("a.sock"), dir.join("b.sock"));
    // The multiplexer runs ahead of the applications, where it may.
    // SAFETY: plain system call, no pointers.
    let root = unsafe { libc::geteuid() } == 0;
    assert_eq!(nice_of(procs.0[0].id()), if root { -10 } else { 0 });
    let echo = exonet()
        .args(["raw-echo", "--port", "7", "--socket"])
        .arg(&sa)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    procs.0.push(echo);
    until("the echo application binds", || {
        count(&stats(&sa), "channel") == 1
    });

    // A test application on B: resolve A through B's ARP, then ping-pong.
    let mut c = Client::connect(&sb).unwrap();
    let info = c.info().unwrap();
    let (ep, mut app) = c
        .create_endpoint(&SegmentConfig {
            frame_size: 2048,
            frame_count: 64,
            ring_entries: [64; 4],
        })
        .unwrap();
    let bufs: Vec<u32> = app.frames.layout().buffers().collect();
    for &b in &bufs[..32] {
        app.free.push(Desc::buffer(b, 0, 0)).unwrap();
    }
    let (ch, port) = c.bind_socket(ep, PROTO_UDP, (B, 0), None).unwrap();
    let mut mac = None;
    until("ARP resolves A", || {
        mac = c.resolve(A).unwrap();
        mac.is_some()
    });
    let (me, them) = (MacAddr(info.mac), MacAddr(mac.unwrap()));
    let mut inline = [0u8; INLINE_MAX];
    for i in 0..100u32 {
        let payload = i.to_be_bytes();
        let frame = build::udp_frame(me, them, B, A, port, 7, &payload);
        assert!(app.tx.push_inline(ch, &frame).unwrap());
        app.kick.notify_if_sleeping().unwrap();
        let mut got = None;
        until("the echo comes back", || {
            if let Some(d) = app.rx.pop_frame(&mut inline).unwrap() {
                assert!(d.is_inline());
                got = Some(inline[..d.len as usize].to_vec());
            }
            got.is_some()
        });
        assert_eq!(
            got.unwrap(),
            build::udp_frame(them, me, A, B, 7, port, &payload),
            "echo {i}"
        );
    }
    let s = stats(&sa);
    assert_eq!(field(&s, "endpoint", "tx_frames"), 100);
    assert!(field(&s, "host", "arp_replies_sent") >= 1);

    // kill -9 the echo application: A reclaims it and answers for the
    // closed port as a host would.
    let mut echo = procs.0.remove(2);
    echo.kill().unwrap();
    echo.wait().unwrap();
    until("A reclaims the echo endpoint", || {
        count(&stats(&sa), "endpoint") == 0
    });
    assert_eq!(count(&stats(&sa), "channel"), 0);
    let frame = build::udp_frame(me, them, B, A, port, 7, b"anyone?");
    assert!(app.tx.push_inline(ch, &frame).unwrap());
    app.kick.notify_if_sleeping().unwrap();
    until("A answers port unreachable", || {
        field(&stats(&sa), "host", "udp_unreachables") >= 1
    });

    // SIGTERM stops daemon A cleanly; B's application is unaffected.
    let mut a = procs.0.remove(0);
    signal(&a, libc::SIGTERM);
    let status = a.wait().unwrap();
    assert!(status.success(), "daemon A exits cleanly: {status}");
    assert!(!sa.exists(), "daemon A removed its socket");
    assert!(c.is_connected());
}

/// An application asleep in a blocking read, with no timeout, learns that
/// its daemon was killed: its sleep (in `FUTEX_WAIT`, which a dead process
/// cannot end) looks for the control socket's hang-up after each slice, and
/// the read fails instead of waiting for ever.
#[test]
fn a_read_asleep_ends_when_the_daemon_is_killed() {
    let mut procs = Procs::new("daemon-killed");
    let dir = procs.1.clone();
    procs.0.push(daemon(&dir, "a", "10.97.0.1/24"));
    let stack = exonet_stack::Stack::open(&dir.join("a.sock")).unwrap();
    let socket = exonet_stack::UdpSocket::bind(&stack, (Ipv4Addr::UNSPECIFIED, 7000)).unwrap();
    let (done, outcome) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let _ = done.send(socket.recv_from(&mut buf).map(|(n, _)| n));
    });
    // Asleep by then, as a rule; a read that begins after the kill fails
    // the same way.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut a = procs.0.remove(0);
    signal(&a, libc::SIGKILL);
    a.wait().unwrap();
    let r = outcome
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the read still waits 10 s after its daemon was killed");
    assert!(r.is_err(), "the read returned {r:?}");
    reader.join().unwrap();
}

/// The nice value of process `pid` (`/proc/PID/stat`'s 19th field).
fn nice_of(pid: u32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis, from the 3rd.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(16).unwrap().parse().unwrap()
}

#[test]
fn bad_command_lines_are_refused_clearly() {
    for args in [
        &["daemon", "--link", "bogus", "--ip", "10.0.0.1/24"][..],
        &["daemon", "--link", "memwire", "--ip", "10.0.0.1"],
        &["daemon", "--link", "memwire", "--ip", "10.0.0.1/33"],
        &["daemon", "--link", "tap", "--ip", "10.0.0.1/24"],
        &["stats", "--socket", "/nonexistent/exonet.sock"],
    ] {
        refused(args, "exonet");
    }
    let args = ["daemon", "--link", "memwire", "--ip", "10.0.0.1/24"];
    let nowhere = ["--capture", "/nonexistent/exonet.pcap"];
    refused(
        &[&args[..], &nowhere].concat(),
        "--capture /nonexistent/exonet.pcap",
    );
    let short = ["--capture", "/tmp/x.pcap", "--capture-snaplen", "10"];
    refused(&[&args[..], &short].concat(), "64..=262144");
    for nice in ["-21", "20"] {
        let args = ["daemon", "--link", "memwire", "--ip", "10.0.0.1/24"];
        refused(&[&args[..], &["--nice", nice]].concat(), "-20..=19");
    }
    refused(&[&args[..], &["--cpu", "100000"]].concat(), "--cpu 100000");
    refused(&[&args[..], &["--cpu", "-1"]].concat(), "'-1'");
}

/// `--cpu N` keeps the daemon, all its threads, on CPU N.
#[test]
fn a_daemon_kept_on_a_cpu_stays_there() {
    let mut procs = Procs::new("daemon-cpu");
    let d = daemon_with(&procs.1, "a", "10.98.0.1/24", &["--cpu", "0"]);
    let pid = d.id();
    procs.0.push(d);
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    for t in tasks {
        let status = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap();
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim();
        assert_eq!(cpus, "0", "{status}");
    }
}

/// Runs `exonet args`, which must fail and say `says` on stderr.
fn refused(args: &[&str], says: &str) {
    let out = exonet().args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(says), "{args:?}: {err}");
}
