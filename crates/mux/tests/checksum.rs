//! A link's word on a frame's transport checksum (`Link::recv_batch_checked`)
//! goes on as `Desc::CSUM_OK`, never on a fragment, and the stack does not
//! verify such a checksum again.

mod common;

use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use common::*;
use exonet_link::memwire::{self, MemWire};
use exonet_link::{Link, LinkStats};
use exonet_mux::{InProcess, Mux, MuxConfig};
use exonet_shm::{Desc, INLINE_MAX};
use exonet_stack::{Stack, StackConfig, TcpListener, TcpStream, UdpSocket};
use exonet_wire::{build, MacAddr};

/// A link whose every frame is said to carry a good transport checksum, as
/// AF_PACKET says of those Linux verified or left to finish; with the MTU
/// it says it has.
struct Vouching(MemWire, usize);

impl Vouching {
    fn new(wire: MemWire) -> Vouching {
        let mtu = wire.mtu();
        Vouching(wire, mtu)
    }
}

impl Link for Vouching {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8]), max: usize) -> std::io::Result<usize> {
        self.0.recv_batch(f, max)
    }
    fn recv_batch_checked(
        &mut self,
        f: &mut dyn FnMut(&[u8], bool),
        max: usize,
    ) -> std::io::Result<usize> {
        self.0.recv_batch(&mut |frame| f(frame, true), max)
    }
    fn send_with(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> std::io::Result<usize> {
        self.0.send_with(fill)
    }
    fn mtu(&self) -> usize {
        self.1
    }
    fn mac(&self) -> [u8; 6] {
        self.0.mac()
    }
    fn as_raw_fd(&self) -> Option<RawFd> {
        self.0.as_raw_fd()
    }
    fn stats(&self) -> LinkStats {
        self.0.stats()
    }
}

/// A stack at `ip` over `link`, its multiplexer in process.
fn host(link: Box<dyn Link>, ip: Ipv4Addr) -> Stack {
    let mux = Mux::new(link, vec![ip], MuxConfig::default());
    Stack::over(
        Box::new(InProcess::new(mux, vec![(ip, 24)])),
        &StackConfig::default(),
    )
    .unwrap()
}

#[test]
fn the_links_word_is_passed_on_but_not_for_a_fragment() {
    let (x, mut wire) = memwire::pair().unwrap();
    let mut mux = Mux::new(Box::new(Vouching::new(x)), vec![HOST], MuxConfig::default());
    let (ea, mut a, _) = endpoint(&mut mux, 32, false);
    let (ca, _) = mux.bind_socket(ea, spec(5000)).unwrap();
    let udp =
        |len: usize| build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 7777, 5000, &vec![7u8; len]);
    let whole = udp(600);
    let (frags, _) = fragments_of(udp(4000), 0x77);
    assert_eq!(frags.len(), 3);
    for f in std::iter::once(&whole).chain(&frags) {
        assert_eq!(wire.send_batch(&[&f[..]]).unwrap(), 1);
    }
    mux.poll_rx().unwrap();
    let mut inline = [0u8; INLINE_MAX];
    let mut got = Vec::new();
    while let Some(d) = a.rx.pop_frame(&mut inline).unwrap() {
        assert_eq!(d.channel, ca.0);
        got.push((d.len as usize, d.flags & Desc::CSUM_OK != 0));
    }
    let want: Vec<(usize, bool)> = std::iter::once((whole.len(), true))
        .chain(frags.iter().map(|f| (f.len(), false)))
        .collect();
    assert_eq!(got, want);
}

/// A frame longer than the link says it sends is cut to that length,
/// counted, and no longer vouched for.
#[test]
fn a_frame_cut_to_the_links_length_is_not_vouched_for() {
    let (x, mut wire) = memwire::pair().unwrap();
    let mut mux = Mux::new(
        Box::new(Vouching(x, 1000)),
        vec![HOST],
        MuxConfig::default(),
    );
    let (ea, mut a, _) = endpoint(&mut mux, 32, false);
    let (ca, _) = mux.bind_socket(ea, spec(5000)).unwrap();
    let udp =
        |len: usize| build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 7777, 5000, &vec![7u8; len]);
    let (short, long) = (udp(600), udp(1200));
    assert_eq!(wire.send_batch(&[&short[..], &long[..]]).unwrap(), 2);
    assert_eq!(mux.poll_rx().unwrap(), 2);
    assert_eq!(mux.stats().rx_truncated, 1);
    let mut inline = [0u8; INLINE_MAX];
    let mut got = Vec::new();
    while let Some(d) = a.rx.pop_frame(&mut inline).unwrap() {
        assert_eq!(d.channel, ca.0);
        got.push((d.len as usize, d.flags & Desc::CSUM_OK != 0));
    }
    assert_eq!(got, [(short.len(), true), (1018, false)]);
}

/// Two stacks in process: the one whose link vouches for every frame
/// verifies none of the checksums again; the other verifies them all; the
/// transfer is intact both ways.
#[test]
fn a_stack_does_not_verify_again_what_the_link_vouched_for() {
    let (x, y) = memwire::pair().unwrap();
    let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let (sa, sb) = (host(Box::new(x), a), host(Box::new(Vouching::new(y)), b));
    let l = TcpListener::bind(&sb, (b, 9)).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let sent = data.clone();
    let writer = std::thread::spawn(move || {
        let mut c = TcpStream::connect(&sa, (b, 9)).unwrap();
        c.write_all(&sent).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        (back, sa.stats().tcp)
    });
    let (mut s, _) = l.accept().unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    s.write_all(&got).unwrap();
    drop(s);
    let (back, ta) = writer.join().unwrap();
    assert!(got == data && back == data, "the data differs");
    let tb = sb.stats().tcp;
    assert!(tb.checksums_offloaded > 200, "{tb:#?}");
    assert_eq!(tb.bad_checksum, 0);
    assert_eq!(ta.checksums_offloaded, 0, "{ta:#?}");
}

/// A UDP checksum the link vouched for is not verified again in the copy: a
/// datagram whose checksum fails is read where the link said it was good,
/// and dropped (counted) where it said nothing.
#[test]
fn a_udp_checksum_the_link_vouched_for_is_not_verified_again() {
    let (x, wire) = memwire::pair().unwrap();
    let (y, other) = memwire::pair().unwrap();
    let (mx, my) = (MacAddr(x.mac()), MacAddr(y.mac()));
    let (vouched, plain) = (
        host(Box::new(Vouching::new(x)), HOST),
        host(Box::new(y), HOST),
    );
    for (stack, mac, mut wire, delivered) in
        [(&vouched, mx, wire, true), (&plain, my, other, false)]
    {
        let s = UdpSocket::bind(stack, (HOST, 5000)).unwrap();
        s.set_nonblocking(true).unwrap();
        let mut f = build::udp_frame(PEER_MAC, mac, PEER, HOST, 7777, 5000, &[9u8; 300]);
        let at = 14 + 20 + 6;
        f[at] ^= 0x5a;
        assert_eq!(wire.send_batch(&[&f[..]]).unwrap(), 1);
        let mut buf = [0u8; 512];
        let mut got = None;
        for _ in 0..1000 {
            match s.recv_from(&mut buf) {
                Ok((n, _)) => {
                    got = Some(n);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            if stack.stats().sockets.bad_checksum > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if delivered {
            assert_eq!(got, Some(300));
        } else {
            assert_eq!(got, None);
            assert_eq!(stack.stats().sockets.bad_checksum, 1);
        }
    }
}
