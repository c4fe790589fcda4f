//! Tracing of every frame a link moves, through a callback.

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use exonet_wire::ethernet::ethertype;
use exonet_wire::ipv4::protocol;
use exonet_wire::{arp, ArpPacket, EthernetFrame, IcmpPacket, Ipv4Packet, TcpPacket, UdpPacket};

use crate::{sendable, Direction, Link, LinkStats};

/// A link that shows each frame it receives or sends to a callback, e.g.
/// `|dir, f| eprintln!("{dir} {}", Summary(f))` or a `tracing` event.
#[derive(Debug)]
pub struct Tracer<L, F> {
    inner: L,
    trace: F,
}

impl<L: Link, F: FnMut(Direction, &[u8])> Tracer<L, F> {
    /// Calls `trace` with every frame moved through `inner`.
    pub fn new(inner: L, trace: F) -> Self {
        Tracer { inner, trace }
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// The wrapped link.
    pub fn into_inner(self) -> L {
        self.inner
    }
}

impl<L: Link, F: FnMut(Direction, &[u8]) + Send> Link for Tracer<L, F> {
    recv_batch_from_checked!();

    fn recv_batch_checked(
        &mut self,
        f: &mut dyn FnMut(&[u8], bool),
        max: usize,
    ) -> io::Result<usize> {
        let trace = &mut self.trace;
        self.inner.recv_batch_checked(
            &mut |frame, ok| {
                trace(Direction::Rx, frame);
                f(frame, ok);
            },
            max,
        )
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        let trace = &mut self.trace;
        self.inner.send_with(&mut |buf| {
            let len = fill(buf)?;
            if sendable(len, buf.len()) {
                trace(Direction::Tx, &buf[..len]);
            }
            Some(len)
        })
    }

    forward_to_inner!();

    forward_kicks_to_inner!();
}

/// A one-line description of a frame, as tcpdump would print it:
/// `02:00:00:00:00:01 > ff:ff:ff:ff:ff:ff IPv4 10.77.0.1:68 > 10.77.0.2:67 UDP len 2`.
/// Whatever cannot be parsed is described as far as it could be.
#[derive(Debug, Clone, Copy)]
pub struct Summary<'a>(pub &'a [u8]);

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Ok(eth) = EthernetFrame::new_checked(self.0) else {
            return write!(f, "runt frame, {} bytes", self.0.len());
        };
        write!(f, "{} > {} ", eth.src_addr(), eth.dst_addr())?;
        if let Some(vid) = eth.vlan_id() {
            write!(f, "vlan {vid} ")?;
        }
        match eth.ethertype() {
            ethertype::IPV4 => ipv4(f, eth.payload()),
            ethertype::ARP => match ArpPacket::new_checked(eth.payload()) {
                Ok(a) if a.oper() == arp::OP_REQUEST => {
                    write!(f, "ARP who-has {} tell {}", a.tpa(), a.spa())
                }
                Ok(a) => write!(f, "ARP {} is-at {}", a.spa(), a.sha()),
                Err(e) => write!(f, "ARP ({e})"),
            },
            t => write!(f, "ethertype {t:#06x}, {} bytes", self.0.len()),
        }
    }
}

fn ipv4(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    let ip = match Ipv4Packet::new_checked(bytes) {
        Ok(ip) => ip,
        Err(e) => return write!(f, "IPv4 ({e})"),
    };
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    if ip.is_fragment() && !ip.is_first_fragment() {
        return write!(f, "IPv4 {src} > {dst} fragment +{}", ip.frag_offset());
    }
    let p = ip.payload();
    match ip.protocol() {
        protocol::UDP => match UdpPacket::new_checked(p) {
            Ok(u) => write!(
                f,
                "IPv4 {src}:{} > {dst}:{} UDP len {}",
                u.src_port(),
                u.dst_port(),
                u.payload().len()
            ),
            Err(e) => write!(f, "IPv4 {src} > {dst} UDP ({e})"),
        },
        protocol::TCP => match TcpPacket::new_checked(p) {
            Ok(t) => write!(
                f,
                "IPv4 {src}:{} > {dst}:{} TCP flags {:#04x} seq {} len {}",
                t.src_port(),
                t.dst_port(),
                t.flags(),
                t.seq_number(),
                t.payload().len()
            ),
            Err(e) => write!(f, "IPv4 {src} > {dst} TCP ({e})"),
        },
        protocol::ICMP => match IcmpPacket::new_checked(p) {
            Ok(i) => write!(
                f,
                "IPv4 {src} > {dst} ICMP type {} code {}",
                i.msg_type(),
                i.code()
            ),
            Err(e) => write!(f, "IPv4 {src} > {dst} ICMP ({e})"),
        },
        other => write!(f, "IPv4 {src} > {dst} proto {other}"),
    }
}
