//! Real devices: TAP and AF_PACKET over a veth pair, each inside a network namespace
//! the test creates and always deletes. They need root; without it they say so and
//! pass.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use exonet_link::afpacket::AfPacket;
use exonet_link::afxdp::AfXdp;
use exonet_link::tap::Tap;
use exonet_link::Link;
use exonet_wire::{build, MacAddr};

fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace deleted on drop (with every interface in it), even when the
/// test panics.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("exo-ns-{}-{tag}", std::process::id());
        ip(&["netns", "add", &name]);
        let ns = Netns(name);
        // Fewer stray frames (router solicitations, MLD) on the test interfaces.
        let _ = Command::new("ip")
            .args(["netns", "exec", &ns.0, "sysctl", "-qw"])
            .args([
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ])
            .output();
        ns
    }

    /// Runs `f` on a thread that has entered the namespace, so that the sockets and
    /// devices it opens live there.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = File::open(&path).expect("open netns");
                // SAFETY: moves only this thread into the namespace, which it then
                // keeps until it ends.
                let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

const MARK: &[u8] = b"exonet-link-test";
const PATIENCE: Duration = Duration::from_secs(5);

/// Numbered test frames: UDP between 10.77.0.1 and 10.77.0.2.
fn frames(src: [u8; 6], dst: [u8; 6], n: u16) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut payload = MARK.to_vec();
            payload.extend_from_slice(&i.to_be_bytes());
            payload.resize(40 + usize::from(i % 200) * 7, 0xa5);
            build::udp_frame(
                MacAddr(src),
                MacAddr(dst),
                "10.77.0.1".parse().unwrap(),
                "10.77.0.2".parse().unwrap(),
                40_000,
                40_001,
                &payload,
            )
        })
        .collect()
}

fn is_test_frame(f: &[u8]) -> bool {
    f.windows(MARK.len()).any(|w| w == MARK)
}

/// Sends all `frames`, retrying while the link is full, for at most 5 s.
fn send_all(l: &mut impl Link, frames: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut sent = 0;
    while sent < refs.len() {
        assert!(Instant::now() < deadline, "sent only {sent} frames");
        sent += l.send_batch(&refs[sent..]).unwrap();
        if sent < refs.len() {
            wait(l, libc::POLLOUT);
        }
    }
}

/// Receives test frames until `n` have come or `within` has passed.
fn recv_test_frames(l: &mut impl Link, n: usize, within: Duration) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < n && Instant::now() < deadline {
        let k = l
            .recv_batch(
                &mut |f| {
                    if is_test_frame(f) {
                        got.push(f.to_vec());
                    }
                },
                64,
            )
            .unwrap();
        if k < 64 && got.len() < n {
            wait(l, libc::POLLIN);
        }
    }
    got
}

/// Equal frame lists, without printing thousands of bytes when they are not.
fn assert_frames(got: &[Vec<u8>], want: &[Vec<u8>]) {
    let first_diff = got.iter().zip(want).position(|(g, w)| g != w);
    assert!(
        got.len() == want.len() && first_diff.is_none(),
        "got {} frames, want {}; first difference at {first_diff:?}",
        got.len(),
        want.len()
    );
}

fn wait(l: &impl Link, events: libc::c_short) {
    let mut p = libc::pollfd {
        fd: l.as_raw_fd().unwrap(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 50) };
}

#[test]
fn afpacket_over_veth() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let ns = Netns::new("veth");
    let (a_name, b_name) = (
        format!("exo-a{}", std::process::id()),
        format!("exo-b{}", std::process::id()),
    );
    ip(&[
        "-n", &ns.0, "link", "add", &a_name, "type", "veth", "peer", "name", &b_name,
    ]);
    ip(&["-n", &ns.0, "link", "set", &a_name, "up"]);
    ip(&["-n", &ns.0, "link", "set", &b_name, "up"]);
    ns.run(|| {
        let mut a = AfPacket::open(&a_name).unwrap();
        let mut b = AfPacket::open(&b_name).unwrap();
        assert_eq!(a.ifname(), a_name);
        assert_eq!(a.mtu(), 1500);

        // More than the transmit ring holds and than one receive block holds.
        let out = frames(a.mac(), b.mac(), 2000);
        send_all(&mut a, &out);
        assert_frames(&recv_test_frames(&mut b, out.len(), PATIENCE), &out);
        // PACKET_IGNORE_OUTGOING: the sender does not see its own frames.
        assert!(recv_test_frames(&mut a, 1, Duration::from_millis(200)).is_empty());

        // The other way, written straight into the transmit ring.
        let back = frames(b.mac(), a.mac(), 50);
        let mut next = back.iter();
        let taken = b
            .send_with(&mut |buf| {
                let f = next.next()?;
                buf[..f.len()].copy_from_slice(f);
                Some(f.len())
            })
            .unwrap();
        assert_eq!(taken, back.len());
        assert_frames(&recv_test_frames(&mut a, back.len(), PATIENCE), &back);

        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!((sa.tx_frames, sb.tx_frames), (2000, 50));
        assert!(sb.rx_frames >= 2000 && sa.rx_frames >= 50);
        assert_eq!(sa.rx_dropped + sb.rx_dropped, 0);
    });
}

#[test]
fn tap_to_afpacket_and_back() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let ns = Netns::new("tap");
    let name = format!("exo-t{}", std::process::id());
    ns.run(|| {
        let mut tap = Tap::open(&name).unwrap();
        assert_eq!(tap.name(), name);
        assert_ne!(tap.mac(), tap.kernel_mac());
        ip(&["-n", &ns.0, "link", "set", &name, "up"]);
        let mut kernel = AfPacket::open(&name).unwrap();
        assert_eq!(kernel.mac(), tap.kernel_mac());

        // Written to the TAP: received by the kernel's interface.
        let inbound = frames(tap.mac(), tap.kernel_mac(), 100);
        send_all(&mut tap, &inbound);
        assert_frames(
            &recv_test_frames(&mut kernel, inbound.len(), PATIENCE),
            &inbound,
        );

        // Sent out of the kernel's interface: read from the TAP.
        let outbound = frames(tap.kernel_mac(), tap.mac(), 100);
        send_all(&mut kernel, &outbound);
        assert_frames(
            &recv_test_frames(&mut tap, outbound.len(), PATIENCE),
            &outbound,
        );

        let st = tap.stats();
        assert_eq!((st.tx_frames, st.tx_dropped), (100, 0));
        assert!(st.rx_frames >= 100);
    });
}

#[test]
fn afxdp_over_veth() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let ns = Netns::new("xdp");
    let (c_name, d_name) = (
        format!("exo-c{}", std::process::id()),
        format!("exo-d{}", std::process::id()),
    );
    ip(&[
        "-n", &ns.0, "link", "add", &c_name, "type", "veth", "peer", "name", &d_name,
    ]);
    ip(&["-n", &ns.0, "link", "set", &c_name, "up"]);
    ip(&["-n", &ns.0, "link", "set", &d_name, "up"]);
    ns.run(|| {
        let mut c = AfPacket::open(&c_name).unwrap();
        let mut d = AfXdp::open(&d_name).unwrap();
        assert_eq!(d.ifname(), d_name);

        // In bursts: veth queues only a few hundred frames for XDP.
        let inbound = frames(c.mac(), d.mac(), 1000);
        for chunk in inbound.chunks(50) {
            send_all(&mut c, chunk);
            assert_frames(&recv_test_frames(&mut d, chunk.len(), PATIENCE), chunk);
        }
        let outbound = frames(d.mac(), c.mac(), 1000);
        for chunk in outbound.chunks(50) {
            let mut next = chunk.iter();
            let mut sent = 0;
            let deadline = Instant::now() + PATIENCE;
            while sent < chunk.len() && Instant::now() < deadline {
                sent += d
                    .send_with(&mut |buf| {
                        let f = next.next()?;
                        buf[..f.len()].copy_from_slice(f);
                        Some(f.len())
                    })
                    .unwrap();
            }
            assert_frames(&recv_test_frames(&mut c, chunk.len(), PATIENCE), chunk);
        }
        let st = d.stats();
        assert_eq!((st.tx_frames, st.rx_frames, st.rx_dropped), (1000, 1000, 0));
    });
    // Detached with the link: the interface takes a new program.
    drop(ns);
}
