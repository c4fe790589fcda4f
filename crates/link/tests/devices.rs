//! Real devices: TAP, AF_PACKET and AF_XDP over veth pairs, inside network
//! namespaces the tests create and always delete. They need root; without it they say
//! so and pass.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

use exonet_link::afpacket::{self, AfPacket, RxMode};
use exonet_link::afxdp::{self, AfXdp, XdpMode};
use exonet_link::tap::Tap;
use exonet_link::{LendScratch, Link, LENT_AT_ONCE};
use exonet_wire::ethernet::ethertype;
use exonet_wire::tcp::{self, TcpOption};
use exonet_wire::{arp, build, ArpPacket, ArpRepr, EthernetFrame, Ipv4Packet, MacAddr, TcpPacket};

fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn ip(args: &[&str]) {
    run("ip", args);
}

/// Runs `program` with `args`, which must succeed.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
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

/// Receives the test frames of `burst` on `l` with `recv_lent`, each frame of
/// a slice compared, intact, inside the call; returns the widest slice.
fn recv_in_slices(l: &mut impl Link, burst: &[Vec<u8>]) -> usize {
    let (mut got, mut widest) = (Vec::<Vec<u8>>::new(), 0);
    let mut scratch = LendScratch::default();
    let deadline = Instant::now() + PATIENCE;
    while got.len() < burst.len() && Instant::now() < deadline {
        let n = l
            .recv_lent(&mut scratch, 100, &mut |slice| {
                widest = widest.max(slice.len());
                let ours: Vec<&[u8]> = slice
                    .iter()
                    .map(|&(f, _)| f)
                    .filter(|f| is_test_frame(f))
                    .collect();
                for (k, f) in ours.iter().enumerate() {
                    assert_eq!(*f, &burst[got.len() + k][..]);
                }
                got.extend(ours.iter().map(|f| f.to_vec()));
            })
            .unwrap();
        if n == 0 {
            wait(l, libc::POLLIN);
        }
    }
    assert_frames(&got, burst);
    widest
}

/// An AF_PACKET link on `ifname` receiving in `mode`, the rest as by default.
fn afpacket(ifname: &str, mode: RxMode) -> AfPacket {
    let cfg = afpacket::Config {
        rx_mode: mode,
        ..afpacket::Config::default()
    };
    AfPacket::with_config(ifname, cfg).unwrap()
}

/// A namespace (named after `tag`) with a veth pair in it, both ends up.
fn veth_pair(tag: &str) -> (Netns, String, String) {
    let ns = Netns::new(tag);
    let (a_name, b_name) = (
        format!("exo-a{}", std::process::id()),
        format!("exo-b{}", std::process::id()),
    );
    ip(&[
        "-n", &ns.0, "link", "add", &a_name, "type", "veth", "peer", "name", &b_name,
    ]);
    ip(&["-n", &ns.0, "link", "set", &a_name, "up"]);
    ip(&["-n", &ns.0, "link", "set", &b_name, "up"]);
    (ns, a_name, b_name)
}

fn afpacket_over_veth(mode: RxMode, tag: &str) {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let (ns, a_name, b_name) = veth_pair(tag);
    ns.run(|| {
        let mut a = afpacket(&a_name, mode);
        let mut b = afpacket(&b_name, mode);
        assert_eq!(a.ifname(), a_name);
        assert_eq!(a.mtu(), 1500);

        // More than the transmit ring holds and than one receive block holds.
        let out = frames(a.mac(), b.mac(), 2000);
        send_all(&mut a, &out);
        assert_frames(&recv_test_frames(&mut b, out.len(), PATIENCE), &out);
        // PACKET_IGNORE_OUTGOING: the sender does not see its own frames.
        assert!(recv_test_frames(&mut a, 1, Duration::from_millis(200)).is_empty());
        // In chunks, around the receive ring (2048 slots in Frames mode) and back.
        for chunk in frames(a.mac(), b.mac(), 2000).chunks(500) {
            send_all(&mut a, chunk);
            assert_frames(&recv_test_frames(&mut b, chunk.len(), PATIENCE), chunk);
        }
        // Lent a slice at a time (copied: AF_PACKET keeps the default), every
        // frame of a slice intact for the whole call.
        let burst = frames(a.mac(), b.mac(), 100);
        send_all(&mut a, &burst);
        assert_eq!(recv_in_slices(&mut b, &burst), LENT_AT_ONCE);

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
        assert_eq!((sa.tx_frames, sb.tx_frames), (4100, 50));
        assert!(sb.rx_frames >= 4100 && sa.rx_frames >= 50);
        assert_eq!(sa.rx_dropped + sb.rx_dropped, 0);
    });
}

#[test]
fn afpacket_over_veth_blocks() {
    afpacket_over_veth(RxMode::Blocks, "veth");
}

#[test]
fn afpacket_over_veth_frames() {
    afpacket_over_veth(RxMode::Frames, "vethf");
}

/// A TCP super-segment: 20,000 bytes of payload behind headers with timestamps.
fn super_segment(src: [u8; 6], dst: [u8; 6]) -> (Vec<u8>, Vec<u8>) {
    let payload: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let ts = TcpOption::Timestamps { tsval: 7, tsecr: 9 };
    let opts = [TcpOption::NoOp, TcpOption::NoOp, ts];
    let (a, b) = ("10.77.0.1".parse().unwrap(), "10.77.0.2".parse().unwrap());
    let frame = build::tcp_frame(
        MacAddr(src),
        MacAddr(dst),
        a,
        b,
        40_000,
        80,
        tcp::flags::ACK | tcp::flags::PSH,
        1_000,
        1,
        &opts,
        &payload,
    );
    (frame, payload)
}

/// The payload of `f` if it is a TCP segment from 10.77.0.1 (one cut from
/// a super-segment), checked to fit the MTU, to carry valid checksums and to
/// be said to (`checked`: the link computed them).
fn cut_segment(f: &[u8], checked: bool) -> Option<&[u8]> {
    let ip = Ipv4Packet::new_checked(f.get(14..)?).ok()?;
    if ip.protocol() != 6 || ip.src_addr() != Ipv4Addr::new(10, 77, 0, 1) {
        return None;
    }
    assert!(f.len() <= 1514, "a frame of {} bytes", f.len());
    assert!(ip.verify_checksum());
    let seg = TcpPacket::new_checked(ip.payload()).unwrap();
    assert!(seg.verify_checksum(ip.src_addr(), ip.dst_addr()));
    assert!(checked, "a segment cut here is known good");
    Some(&f[f.len() - seg.payload().len()..])
}

/// The TCP segments from 10.77.0.1 received on `l` within `within`, each
/// checked by [`cut_segment`]; their payloads joined.
fn recv_segments(l: &mut impl Link, want: usize, within: Duration) -> (usize, Vec<u8>) {
    let deadline = Instant::now() + within;
    let (mut n, mut data) = (0, Vec::new());
    while data.len() < want && Instant::now() < deadline {
        l.recv_batch_checked(
            &mut |f, checked| {
                if let Some(payload) = cut_segment(f, checked) {
                    n += 1;
                    data.extend_from_slice(payload);
                }
            },
            // Fewer than a super-segment's: its cutting goes on in the next call.
            5,
        )
        .unwrap();
        wait(l, libc::POLLIN);
    }
    (n, data)
}

/// Segmentation offload over a veth: a super-segment sent whole crosses it
/// whole and is cut on arrival; with TSO off the link takes none.
#[test]
fn afpacket_sends_and_cuts_super_segments() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let (ns, a_name, b_name) = veth_pair("tso");
    ns.run(|| {
        let mut a = afpacket(&a_name, RxMode::Blocks);
        let mut b = afpacket(&b_name, RxMode::Blocks);
        assert_eq!(a.max_frame_len(), 1518);
        assert!(a.max_send_len() > 65_000, "a veth has TSO on by default");
        let (frame, payload) = super_segment(a.mac(), b.mac());
        assert_eq!(a.send_batch(&[&frame[..]]).unwrap(), 1);
        let (n, got) = recv_segments(&mut b, payload.len(), PATIENCE);
        // 1500 − 20 − 32: 1448 bytes a segment.
        assert_eq!(n, payload.len().div_ceil(1448));
        assert!(got == payload, "payload differs");
        assert_eq!((a.stats().tx_super, b.stats().rx_super), (1, 1));
        // Nothing else goes beyond the MTU: not a long UDP datagram, not a
        // TCP frame whose IPv4 length disagrees with it.
        let udp = build::udp_frame(
            MacAddr(a.mac()),
            MacAddr(b.mac()),
            "10.77.0.1".parse().unwrap(),
            "10.77.0.2".parse().unwrap(),
            1,
            2,
            &[0; 9000],
        );
        let mut lying = frame.clone();
        lying[16..18].copy_from_slice(&1400u16.to_be_bytes());
        assert_eq!(a.send_batch(&[&udp[..], &lying[..]]).unwrap(), 2);
        assert_eq!((a.stats().tx_super, a.stats().tx_dropped), (1, 2));
        // A frame that fits, sent raw (no checksum left to Linux), is never
        // said to be good: here its checksum fails.
        let mut bad = frame[..14 + 20 + 32 + 100].to_vec();
        bad[16..18].copy_from_slice(&(20u16 + 32 + 100).to_be_bytes());
        bad[24..26].fill(0);
        let sum = exonet_wire::checksum::checksum(&bad[14..34]);
        bad[24..26].copy_from_slice(&sum.to_be_bytes());
        bad[14 + 20 + 16] ^= 0xff;
        assert_eq!(a.send_batch(&[&bad[..]]).unwrap(), 1);
        let deadline = Instant::now() + PATIENCE;
        let mut seen = None;
        while seen.is_none() && Instant::now() < deadline {
            b.recv_batch_checked(
                &mut |f, checked| seen = seen.or((f == &bad[..]).then_some(checked)),
                8,
            )
            .unwrap();
            wait(&b, libc::POLLIN);
        }
        assert_eq!(seen, Some(false), "the raw frame arrives, not vouched for");
        // Frame by frame, the kernel queues it whole on the socket, beside
        // the slots, between frames that fit them.
        let mut b = afpacket(&b_name, RxMode::Frames);
        let small = frames(a.mac(), b.mac(), 3);
        let batch: Vec<&[u8]> = vec![&small[0], &frame, &small[1], &frame, &small[2]];
        assert_eq!(a.send_batch(&batch).unwrap(), 5);
        let (n, got) = recv_segments(&mut b, 2 * payload.len(), PATIENCE);
        assert_eq!(n, 2 * payload.len().div_ceil(1448));
        assert!(got[..payload.len()] == payload[..] && got[payload.len()..] == payload[..]);
        assert_eq!(b.stats().rx_super, 2);

        let tso_off = |name: &str| run("ethtool", &["-K", name, "tso", "off"]);
        // TSO turned off under an open link: Linux cuts what it still takes,
        // and the frames behind go on (the ring is not stuck on it).
        tso_off(&a_name);
        let rx_super = b.stats().rx_super;
        assert_eq!(a.send_batch(&[&frame[..]]).unwrap(), 1);
        let (n, got) = recv_segments(&mut b, payload.len(), PATIENCE);
        assert_eq!(n, payload.len().div_ceil(1448));
        assert!(got == payload, "payload differs");
        assert_eq!(b.stats().rx_super, rx_super, "it arrives cut");
        let after = frames(a.mac(), b.mac(), 3);
        send_all(&mut a, &after);
        assert_frames(&recv_test_frames(&mut b, after.len(), PATIENCE), &after);

        // Without TSO the link takes no super-segment, and says so.
        tso_off(&b_name);
        drop(a);
        let mut a = afpacket(&a_name, RxMode::Blocks);
        assert_eq!(a.max_send_len(), 1518);
        assert_eq!(a.send_batch(&[&frame[..]]).unwrap(), 1);
        assert_eq!(a.stats().tx_dropped, 1);
        // Frames mode never sends them.
        let f = afpacket(&b_name, RxMode::Frames);
        assert_eq!(f.max_send_len(), 1518);
    });
}

/// AF_XDP with its program generic takes a super-segment a peer left to the
/// veth's segmentation offload in several chunks, gathers it and cuts it into
/// frames of the MTU, each with its checksums (so said to be good), and never
/// lends more frames in a call than asked: the cutting goes on in the next.
#[test]
fn afxdp_generic_gathers_and_cuts_super_segments() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let (ns, a_name, b_name) = veth_pair("xsg");
    ns.run(|| {
        let mut a = afpacket(&a_name, RxMode::Blocks);
        let cfg = afxdp::Config {
            mode: XdpMode::Generic,
            ..afxdp::Config::default()
        };
        let mut b = AfXdp::with_config(&b_name, cfg).unwrap();
        // Linearized by the kernel until the first super-segment, then
        // taken in chunks as they are.
        assert!(!b.takes_frags());
        let (frame, payload) = super_segment(a.mac(), b.mac());
        let small = frames(a.mac(), b.mac(), 1);
        let batch: Vec<&[u8]> = vec![&frame, &small[0], &frame];
        assert_eq!(a.send_batch(&batch).unwrap(), 3);
        assert_eq!(a.stats().tx_super, 2);
        let mut scratch = LendScratch::default();
        let (mut n, mut data, mut test_frames) = (0, Vec::new(), 0);
        let deadline = Instant::now() + PATIENCE;
        while data.len() < 2 * payload.len() && Instant::now() < deadline {
            let mut lent = 0;
            b.recv_lent(&mut scratch, 5, &mut |slice| {
                for &(f, checked) in slice {
                    lent += 1;
                    if is_test_frame(f) {
                        // Between the two, as sent.
                        assert_eq!(data.len(), payload.len());
                        test_frames += 1;
                    } else if let Some(p) = cut_segment(f, checked) {
                        n += 1;
                        data.extend_from_slice(p);
                    }
                }
            })
            .unwrap();
            assert!(lent <= 5, "{lent} frames lent in a call for 5");
            if lent == 0 {
                wait(&b, libc::POLLIN);
            }
        }
        assert_eq!(n, 2 * payload.len().div_ceil(1448));
        assert!(data[..payload.len()] == payload[..] && data[payload.len()..] == payload[..]);
        assert_eq!(test_frames, 1);
        assert_eq!(b.stats().rx_super, 2);
        assert!(b.takes_frags());
        // Frame by frame (`recv_batch_checked`, as a wrapping link takes
        // them), the cut segments are said to be good too.
        assert_eq!(a.send_batch(&[&frame[..]]).unwrap(), 1);
        let (n, got) = recv_segments(&mut b, payload.len(), PATIENCE);
        assert_eq!(n, payload.len().div_ceil(1448));
        assert!(got == payload, "payload differs");
        assert_eq!(b.stats().rx_super, 3);
    });
}

/// Frames mode hands a lone frame over as soon as the kernel has written it: the
/// socket turns readable without any timer (the block timeout, which Frames mode does
/// not use, is set to an hour), a `recv_batch` then gets the frame, and once it has
/// the socket is no longer readable.
#[test]
fn afpacket_frames_wakes_for_a_lone_frame() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let (ns, a_name, b_name) = veth_pair("lone");
    ns.run(|| {
        let cfg = afpacket::Config {
            rx_mode: RxMode::Frames,
            block_timeout_ms: 3_600_000,
            ..afpacket::Config::default()
        };
        let mut a = AfPacket::with_config(&a_name, cfg).unwrap();
        let mut b = AfPacket::with_config(&b_name, cfg).unwrap();
        let one = frames(a.mac(), b.mac(), 1);
        send_all(&mut a, &one);

        // Bounded: the readiness is expected at once; a stray frame before ours
        // costs one more round.
        let mut got = Vec::new();
        for _ in 0..10 {
            let mut p = libc::pollfd {
                fd: b.as_raw_fd().unwrap(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, PATIENCE.as_millis() as libc::c_int) };
            assert_eq!(r, 1, "not readable within {PATIENCE:?}");
            assert_ne!(p.revents & libc::POLLIN, 0, "revents {:#x}", p.revents);
            let k = b
                .recv_batch(
                    &mut |f| {
                        if is_test_frame(f) {
                            got.push(f.to_vec());
                        }
                    },
                    64,
                )
                .unwrap();
            assert!(k > 0, "readable, but recv_batch found nothing");
            if !got.is_empty() {
                break;
            }
        }
        assert_frames(&got, &one);
        let mut p = libc::pollfd {
            fd: b.as_raw_fd().unwrap(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a timeout of 0 only looks.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "still readable");
    });
}

fn tap_to_afpacket_and_back(mode: RxMode, tag: &str, offloads: bool) {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let ns = Netns::new(tag);
    let name = format!("exo-t{}", std::process::id());
    ns.run(|| {
        let mut tap = Tap::open_with(&name, offloads).unwrap();
        assert_eq!(tap.offloads(), offloads);
        assert_eq!(tap.name(), name);
        assert_ne!(tap.mac(), tap.kernel_mac());
        ip(&["-n", &ns.0, "link", "set", &name, "up"]);
        let mut kernel = afpacket(&name, mode);
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
fn tap_to_afpacket_blocks_and_back() {
    tap_to_afpacket_and_back(RxMode::Blocks, "tap", true);
}

#[test]
fn tap_to_afpacket_frames_and_back() {
    tap_to_afpacket_and_back(RxMode::Frames, "tapf", true);
}

/// The same without the offloads: no `virtio_net_hdr` either way.
#[test]
fn tap_without_offloads_to_afpacket_and_back() {
    tap_to_afpacket_and_back(RxMode::Frames, "tapn", false);
}

/// With offloads, a TCP super-segment crosses a TAP whole both ways: one
/// the TAP sends goes up the kernel's interface as one packet (a packet
/// socket there takes it whole, and cuts it), and one sent out of the
/// kernel's interface is read whole and cut by the TAP. Without offloads,
/// the TAP takes none.
#[test]
fn tap_offloads_super_segments_both_ways() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let ns = Netns::new("tapo");
    let name = format!("exo-o{}", std::process::id());
    ns.run(|| {
        let mut tap = Tap::open(&name).unwrap();
        assert!(tap.offloads());
        assert!(tap.max_send_len() > 65_000);
        ip(&["-n", &ns.0, "link", "set", &name, "up"]);
        let mut kernel = afpacket(&name, RxMode::Frames);
        assert!(
            kernel.max_send_len() > 65_000,
            "the TAP's interface has TSO"
        );

        let (frame, payload) = super_segment(tap.mac(), tap.kernel_mac());
        assert_eq!(tap.send_batch(&[&frame[..]]).unwrap(), 1);
        let (n, got) = recv_segments(&mut kernel, payload.len(), PATIENCE);
        assert_eq!(n, payload.len().div_ceil(1448));
        assert!(got == payload, "payload differs");
        assert_eq!((tap.stats().tx_super, kernel.stats().rx_super), (1, 1));

        let (frame, payload) = super_segment(tap.kernel_mac(), tap.mac());
        assert_eq!(kernel.send_batch(&[&frame[..]]).unwrap(), 1);
        let (n, got) = recv_segments(&mut tap, payload.len(), PATIENCE);
        assert_eq!(n, payload.len().div_ceil(1448));
        assert!(got == payload, "payload differs");
        assert_eq!((kernel.stats().tx_super, tap.stats().rx_super), (1, 1));
        assert_eq!(tap.stats().rx_dropped, 0);
    });
    let name = format!("exo-p{}", std::process::id());
    ns.run(|| {
        let mut tap = Tap::open_with(&name, false).unwrap();
        assert!(!tap.offloads());
        assert_eq!(tap.max_send_len(), tap.max_frame_len());
        let (frame, _) = super_segment(tap.mac(), tap.kernel_mac());
        assert_eq!(tap.send_batch(&[&frame[..]]).unwrap(), 1);
        assert_eq!((tap.stats().tx_frames, tap.stats().tx_dropped), (0, 1));
    });
}

/// `XdpMode::Auto` off a veth: native where the driver has XDP (a TAP's
/// does), and the frames come through it.
#[test]
fn afxdp_runs_native_on_a_tap() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let ns = Netns::new("xdpt");
    let name = format!("exo-u{}", std::process::id());
    ns.run(|| {
        let mut tap = Tap::open(&name).unwrap();
        ip(&["-n", &ns.0, "link", "set", &name, "up"]);
        let mut xdp = AfXdp::open(&name).unwrap();
        assert_eq!(xdp.mode(), XdpMode::Native);
        let inbound = frames(tap.mac(), tap.kernel_mac(), 20);
        send_all(&mut tap, &inbound);
        assert_frames(
            &recv_test_frames(&mut xdp, inbound.len(), PATIENCE),
            &inbound,
        );
    });
}

/// Both places the program can run (`XdpMode`): a veth takes either.
#[test]
fn afxdp_over_veth_native() {
    afxdp_over_veth(XdpMode::Native, "xdpn");
}

#[test]
fn afxdp_over_veth_generic() {
    afxdp_over_veth(XdpMode::Generic, "xdpg");
}

fn afxdp_over_veth(mode: XdpMode, tag: &str) {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let ns = Netns::new(tag);
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
        let cfg = afxdp::Config {
            mode,
            ..afxdp::Config::default()
        };
        let mut d = AfXdp::with_config(&d_name, cfg).unwrap();
        assert_eq!((d.ifname(), d.mode()), (&d_name[..], mode));

        // In bursts: veth queues only a few hundred frames for XDP.
        let inbound = frames(c.mac(), d.mac(), 1000);
        for chunk in inbound.chunks(50) {
            send_all(&mut c, chunk);
            assert_frames(&recv_test_frames(&mut d, chunk.len(), PATIENCE), chunk);
        }
        // Lent in place, a slice at a time: every frame of a slice intact
        // for the whole call.
        let burst = frames(c.mac(), d.mac(), 100);
        for chunk in burst.chunks(50) {
            send_all(&mut c, chunk);
        }
        assert_eq!(recv_in_slices(&mut d, &burst), LENT_AT_ONCE);
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
        // Corked, frames sent one call at a time wait in the ring for one kick
        // (copy mode sends only when kicked).
        let corked = frames(d.mac(), c.mac(), 20);
        d.cork();
        for f in &corked {
            assert_eq!(d.send_batch(&[&f[..]]).unwrap(), 1);
        }
        assert!(recv_test_frames(&mut c, 1, Duration::from_millis(100)).is_empty());
        d.uncork().unwrap();
        assert_frames(&recv_test_frames(&mut c, corked.len(), PATIENCE), &corked);
        let st = d.stats();
        assert_eq!((st.tx_frames, st.rx_frames, st.rx_dropped), (1020, 1100, 0));
        // No packet came in several chunks: still the program without frags.
        assert!(!d.takes_frags());
    });
    // Detached with the link: the interface takes a new program.
    drop(ns);
}

/// Addresses of the steering tests: exonet's, the peer's, the one the exonet side's
/// Linux owns, and one nobody has.
const EXO: Ipv4Addr = Ipv4Addr::new(10, 77, 40, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 77, 40, 2);
const HOST: Ipv4Addr = Ipv4Addr::new(10, 77, 40, 3);
const NOBODY: Ipv4Addr = Ipv4Addr::new(10, 77, 40, 9);

/// Two namespaces joined by a veth pair: `x_name` on the exonet side, where Linux
/// holds HOST, and `p_name` on the peer side, holding PEER.
struct Pair {
    exo: Netns,
    peer: Netns,
    x_name: String,
    p_name: String,
}

fn pair(tag: &str) -> Pair {
    let (exo, peer) = (
        Netns::new(&format!("{tag}x")),
        Netns::new(&format!("{tag}p")),
    );
    let (x_name, p_name) = (
        format!("exo-x{}", std::process::id()),
        format!("exo-p{}", std::process::id()),
    );
    ip(&[
        "-n", &exo.0, "link", "add", &x_name, "type", "veth", "peer", "name", &p_name, "netns",
        &peer.0,
    ]);
    for (ns, dev, addr) in [
        (&exo, &x_name, "10.77.40.3/24"),
        (&peer, &p_name, "10.77.40.2/24"),
    ] {
        ip(&["-n", &ns.0, "addr", "add", addr, "dev", dev]);
        ip(&["-n", &ns.0, "link", "set", dev, "up"]);
    }
    Pair {
        exo,
        peer,
        x_name,
        p_name,
    }
}

/// Whether `f` is IPv4 to `addr` or ARP with `addr` as its target.
fn is_for(f: &[u8], addr: Ipv4Addr) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(f) else {
        return false;
    };
    match eth.ethertype() {
        ethertype::IPV4 => {
            Ipv4Packet::new_checked_header(eth.payload()).is_ok_and(|ip| ip.dst_addr() == addr)
        }
        ethertype::ARP => ArpPacket::new_checked(eth.payload()).is_ok_and(|a| a.tpa() == addr),
        _ => false,
    }
}

/// Linux on both sides and exonet on one: Linux's ARP for exonet's address and its
/// datagram reach the socket (exonet answers the ARP through it), while the exonet
/// side's Linux still resolves, receives and answers for its own address.
#[test]
fn afxdp_steers_its_addresses_and_linux_keeps_its_own() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let p = pair("sl");
    let mut xdp = p.exo.run(|| AfXdp::open_for(&p.x_name, &[EXO]).unwrap());
    // A veth's program runs generic unless told (`XdpMode::Auto`).
    assert_eq!(xdp.mode(), XdpMode::Generic);
    let host = p.exo.run(|| UdpSocket::bind((HOST, 40_001)).unwrap());
    let peer = p.peer.run(|| UdpSocket::bind((PEER, 40_000)).unwrap());
    let xdp_mac = xdp.mac();
    let mut seen = Vec::new();

    // The peer's Linux asks who has EXO; exonet's reply lets the datagram through.
    peer.send_to(b"exonet-link-test to exo", (EXO, 40_001))
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let mut answered = false;
    while !seen.iter().any(|f: &Vec<u8>| is_test_frame(f)) && Instant::now() < deadline {
        let mut replies = Vec::new();
        xdp.recv_batch(
            &mut |f| {
                seen.push(f.to_vec());
                let Ok(eth) = EthernetFrame::new_checked(f) else {
                    return;
                };
                let Ok(req) = ArpPacket::new_checked(eth.payload()) else {
                    return;
                };
                if req.oper() == arp::OP_REQUEST && req.tpa() == EXO {
                    let reply = ArpRepr {
                        oper: arp::OP_REPLY,
                        sha: MacAddr(xdp_mac),
                        spa: EXO,
                        tha: req.sha(),
                        tpa: req.spa(),
                    };
                    replies.push(build::arp_frame(req.sha(), &reply));
                }
            },
            64,
        )
        .unwrap();
        answered |= !replies.is_empty();
        send_all(&mut xdp, &replies);
        wait(&xdp, libc::POLLIN);
    }
    assert!(answered, "no ARP request for {EXO} on the socket");
    assert!(
        seen.iter().any(|f| is_test_frame(f)),
        "the datagram for {EXO} did not reach the socket"
    );

    // HOST: Linux answers the ARP, takes the datagram and answers a ping.
    peer.send_to(b"to host", (HOST, 40_001)).unwrap();
    host.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0; 64];
    let (n, from) = host.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"to host"[..], (PEER, 40_000).into()));
    let ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            &p.peer.0,
            "ping",
            "-c1",
            "-W1",
            "10.77.40.3",
        ])
        .output()
        .expect("run ping");
    assert!(
        ping.status.success(),
        "ping {HOST}: {}",
        String::from_utf8_lossy(&ping.stdout)
    );

    // All the socket ever got was for EXO: nothing for HOST (ARP, datagram, echo).
    xdp.recv_batch(&mut |f| seen.push(f.to_vec()), 64).unwrap();
    let stray: Vec<_> = seen.iter().filter(|f| !is_for(f, EXO)).collect();
    assert!(
        stray.is_empty(),
        "not for {EXO} but on the socket: {stray:02x?}"
    );
}

/// `f` with one 802.1Q tag (VLAN 5) after the addresses.
fn tagged(f: &[u8]) -> Vec<u8> {
    [&f[..12], &[0x81, 0x00, 0x00, 0x05], &f[12..]].concat()
}

/// Sends `frame` as is out of `ifname` from a raw AF_PACKET socket of the calling
/// thread's namespace (the links refuse frames shorter than an Ethernet header).
fn send_raw(ifname: &str, frame: &[u8]) -> io::Result<()> {
    let name = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: reads the live, NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "no interface {ifname}");
    // SAFETY: plain system call, no pointers.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `sockaddr_ll` is plain data; all zeroes is valid.
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_ifindex = index as i32;
    // SAFETY: passes the live frame and address with their sizes.
    let r = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&to as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Frame by frame, including truncated ones: only IPv4 to EXO and ARP for EXO,
/// untagged or behind one tag and long enough to show the address, reach the socket;
/// the rest is passed to Linux, and the link keeps working.
#[test]
fn afxdp_steers_frame_by_frame() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let p = pair("sf");
    let mut xdp = p.exo.run(|| AfXdp::open_for(&p.x_name, &[EXO]).unwrap());
    let mut host = p.exo.run(|| AfPacket::open(&p.x_name).unwrap());
    let mut peer = p.peer.run(|| AfPacket::open(&p.p_name).unwrap());
    let (pm, xm) = (MacAddr(peer.mac()), MacAddr(xdp.mac()));
    let udp = |src: Ipv4Addr, dst: Ipv4Addr| build::udp_frame(pm, xm, src, dst, 1, 2, b"x");
    let arp_for = |oper, spa, tpa| {
        let a = ArpRepr {
            oper,
            sha: pm,
            spa,
            tha: MacAddr::default(),
            tpa,
        };
        build::arp_frame(MacAddr::BROADCAST, &a)
    };
    let mut not_ipv4_arp = arp_for(arp::OP_REQUEST, PEER, EXO);
    not_ipv4_arp[16..18].copy_from_slice(&0x86ddu16.to_be_bytes());

    // (frame, whether it belongs on the socket)
    let mut cases = vec![
        (udp(PEER, EXO), true),
        (udp(PEER, HOST), false),
        (udp(PEER, NOBODY), false),
        (udp(EXO, PEER), false),
        (tagged(&udp(PEER, EXO)), true),
        (tagged(&udp(PEER, HOST)), false),
        (arp_for(arp::OP_REQUEST, PEER, EXO), true),
        (arp_for(arp::OP_REPLY, PEER, EXO), true),
        (tagged(&arp_for(arp::OP_REQUEST, PEER, EXO)), true),
        (arp_for(arp::OP_REQUEST, PEER, HOST), false),
        (arp_for(arp::OP_REQUEST, EXO, NOBODY), false),
        (not_ipv4_arp, false),
    ];
    // Every cut of a frame for EXO from the bare Ethernet header on: passed until the
    // address is wholly there.
    for (f, need) in [
        (udp(PEER, EXO), 34),
        (tagged(&udp(PEER, EXO)), 38),
        (arp_for(arp::OP_REQUEST, PEER, EXO), 42),
        (tagged(&arp_for(arp::OP_REQUEST, PEER, EXO)), 46),
    ] {
        for len in 14..=need {
            if !cases.iter().any(|(g, _)| g[..] == f[..len]) {
                cases.push((f[..len].to_vec(), len == need));
            }
        }
    }
    // Shorter than an Ethernet header: Linux refuses to send it on an Ethernet
    // device (dev_validate_header), so it cannot reach the program here; should a
    // kernel let it through, it must be passed like the rest.
    for len in [1, 6, 13] {
        let f = udp(PEER, EXO)[..len].to_vec();
        match p.peer.run(|| send_raw(&p.p_name, &f)) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Ok(()) => cases.push((f, false)),
            Err(e) => panic!("sending {len} bytes: {e}"),
        }
    }

    // veth keeps order on its one queue, so once a marked frame for EXO sent after a
    // chunk is on the socket, the program has judged the whole chunk.
    for (i, chunk) in cases.chunks(40).enumerate() {
        let mark = [MARK, &i.to_be_bytes()].concat();
        let mut out: Vec<_> = chunk.iter().map(|(f, _)| f.clone()).collect();
        out.push(build::udp_frame(pm, xm, PEER, EXO, 1, 2, &mark));
        send_all(&mut peer, &out);
        let mut got = Vec::new();
        let deadline = Instant::now() + PATIENCE;
        while !got.last().is_some_and(|f: &Vec<u8>| is_test_frame(f)) {
            assert!(Instant::now() < deadline, "the marker did not come back");
            xdp.recv_batch(&mut |f| got.push(f.to_vec()), 64).unwrap();
            wait(&xdp, libc::POLLIN);
        }
        let want: Vec<_> = chunk
            .iter()
            .filter(|(_, steer)| *steer)
            .map(|(f, _)| f.clone())
            .chain(out.last().cloned())
            .collect();
        assert_eq!(got, want, "frames on the socket");
    }

    // Passed, Linux sees them (untagged ones: Linux strips or drops a tag before its
    // packet sockets look).
    let mut passed: Vec<_> = cases
        .iter()
        .filter(|(f, steer)| !steer && f.len() >= 14 && f[12..14] != [0x81, 0x00])
        .map(|(f, _)| f.clone())
        .collect();
    let deadline = Instant::now() + PATIENCE;
    while !passed.is_empty() && Instant::now() < deadline {
        host.recv_batch(&mut |f| passed.retain(|g| g != f), 64)
            .unwrap();
        wait(&host, libc::POLLIN);
    }
    assert!(passed.is_empty(), "not passed to Linux: {passed:02x?}");
    assert_eq!(xdp.stats().rx_dropped, 0);
}
