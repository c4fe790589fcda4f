//! Whole-frame builders with correct lengths and checksums, for tests and benchmarks.
//!
//! [`ipv4_frame`] is the general form (VLAN tags, IP options, fragments, any
//! transport); the other functions are shorthands for the common cases and panic only
//! when their arguments cannot form a frame (documented on each).

use std::net::Ipv4Addr;

use crate::arp::{self, ArpRepr};
use crate::ethernet::{ethertype, EthernetRepr, MacAddr};
use crate::icmp::IcmpRepr;
use crate::ipv4::{protocol, Ipv4Repr};
use crate::tcp::{self, TcpOption, TcpRepr};
use crate::udp::UdpRepr;
use crate::WireError;

/// The transport part of an IPv4 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport<'a> {
    /// A UDP datagram.
    Udp(UdpRepr<'a>),
    /// A TCP segment.
    Tcp(TcpRepr<'a>),
    /// An ICMP message.
    Icmp(IcmpRepr<'a>),
}

impl Transport<'_> {
    /// IP protocol number.
    pub fn protocol(&self) -> u8 {
        match self {
            Transport::Udp(_) => protocol::UDP,
            Transport::Tcp(_) => protocol::TCP,
            Transport::Icmp(_) => protocol::ICMP,
        }
    }

    /// Encoded length.
    pub fn buffer_len(&self) -> usize {
        match self {
            Transport::Udp(r) => r.buffer_len(),
            Transport::Tcp(r) => r.buffer_len(),
            Transport::Icmp(r) => r.buffer_len(),
        }
    }

    /// Writes into the front of `buf`, checksummed against `src`/`dst`.
    pub fn emit(&self, buf: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) -> Result<(), WireError> {
        match self {
            Transport::Udp(r) => r.emit(buf, src, dst),
            Transport::Tcp(r) => r.emit(buf, src, dst),
            Transport::Icmp(r) => r.emit(buf),
        }
    }
}

/// Ethernet + IPv4 + transport. The EtherType, IP protocol and IP payload length are
/// derived from `l4`, overriding those fields of `eth` and `ip`.
pub fn ipv4_frame(eth: &EthernetRepr, ip: &Ipv4Repr, l4: &Transport) -> Result<Vec<u8>, WireError> {
    let eth = EthernetRepr {
        ethertype: ethertype::IPV4,
        ..*eth
    };
    let ip = Ipv4Repr {
        protocol: l4.protocol(),
        payload_len: l4.buffer_len(),
        ..*ip
    };
    let mut buf = vec![0; eth.header_len() + ip.total_len()];
    eth.emit(&mut buf)?;
    let datagram = &mut buf[eth.header_len()..];
    ip.emit(datagram)?;
    l4.emit(&mut datagram[ip.header_len()..], ip.src, ip.dst)?;
    Ok(buf)
}

fn simple(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    l4: &Transport,
) -> Vec<u8> {
    let eth = EthernetRepr {
        dst: dst_mac,
        src: src_mac,
        vlans: &[],
        ethertype: ethertype::IPV4,
    };
    let ip = Ipv4Repr::new(src_ip, dst_ip, l4.protocol(), l4.buffer_len());
    ipv4_frame(&eth, &ip, l4).expect("payload must fit in an IPv4 datagram")
}

/// An untagged UDP/IPv4 frame (TTL 64, DF).
///
/// # Panics
/// If the payload does not fit in an IPv4 datagram.
pub fn udp_frame(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let udp = UdpRepr {
        src_port: sport,
        dst_port: dport,
        payload,
    };
    simple(src_mac, dst_mac, src_ip, dst_ip, &Transport::Udp(udp))
}

/// An untagged TCP/IPv4 frame (TTL 64, DF, window 65535); `flags` from
/// [`tcp::flags`].
///
/// # Panics
/// If the options do not fit in 40 bytes (see [`tcp::write_options`]) or the payload
/// does not fit in an IPv4 datagram.
#[allow(clippy::too_many_arguments)] // one argument per header field a test varies
pub fn tcp_frame(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    sport: u16,
    dport: u16,
    flags: u8,
    seq: u32,
    ack: u32,
    options: &[TcpOption],
    payload: &[u8],
) -> Vec<u8> {
    let mut opts = [0u8; tcp::MAX_OPTIONS_LEN];
    let n = tcp::write_options(options, &mut opts).expect("TCP options must fit in 40 bytes");
    let seg = TcpRepr {
        src_port: sport,
        dst_port: dport,
        seq_number: seq,
        ack_number: ack,
        flags,
        window: 65535,
        urgent_ptr: 0,
        options: &opts[..n],
        payload,
    };
    simple(src_mac, dst_mac, src_ip, dst_ip, &Transport::Tcp(seg))
}

/// An untagged ICMP echo request frame.
///
/// # Panics
/// If the data does not fit in an IPv4 datagram.
pub fn icmp_echo(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    ident: u16,
    seq_no: u16,
    data: &[u8],
) -> Vec<u8> {
    let echo = IcmpRepr::EchoRequest {
        ident,
        seq_no,
        data,
    };
    simple(src_mac, dst_mac, src_ip, dst_ip, &Transport::Icmp(echo))
}

/// An untagged ARP frame from `arp.sha` to `dst_mac`.
pub fn arp_frame(dst_mac: MacAddr, arp: &ArpRepr) -> Vec<u8> {
    let eth = EthernetRepr {
        dst: dst_mac,
        src: arp.sha,
        vlans: &[],
        ethertype: ethertype::ARP,
    };
    let mut buf = vec![0; eth.header_len() + arp::PACKET_LEN];
    let (head, body) = buf.split_at_mut(eth.header_len());
    eth.emit(head).expect("sized for the header");
    arp.emit(body).expect("sized for the packet");
    buf
}

/// A broadcast "who has `target_ip`, tell `src_ip`" (RFC 826).
pub fn arp_request(src_mac: MacAddr, src_ip: Ipv4Addr, target_ip: Ipv4Addr) -> Vec<u8> {
    let req = ArpRepr {
        oper: arp::OP_REQUEST,
        sha: src_mac,
        spa: src_ip,
        tha: MacAddr::default(),
        tpa: target_ip,
    };
    arp_frame(MacAddr::BROADCAST, &req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ArpPacket, EthernetFrame, IcmpPacket, Ipv4Packet, TcpPacket, UdpPacket};

    const M1: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const M2: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const A: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);

    #[test]
    fn udp_tcp_icmp_arp() {
        let f = udp_frame(M1, M2, A, B, 1000, 2000, b"xyz");
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!(
            (e.src_addr(), e.dst_addr(), e.ethertype()),
            (M1, M2, ethertype::IPV4)
        );
        let ip = Ipv4Packet::new_checked(e.payload()).unwrap();
        assert!(ip.verify_checksum());
        let u = UdpPacket::new_checked(ip.payload()).unwrap();
        assert!(u.verify_checksum(A, B) && u.checksum() != 0);
        assert_eq!(u.payload(), b"xyz");

        let f = tcp_frame(
            M1,
            M2,
            A,
            B,
            1,
            2,
            tcp::flags::SYN,
            7,
            0,
            &[TcpOption::Mss(1460)],
            &[],
        );
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        let t = TcpPacket::new_checked(ip.payload()).unwrap();
        assert!(t.syn() && t.verify_checksum(A, B));
        assert_eq!(
            t.options_iter().next().unwrap().unwrap(),
            TcpOption::Mss(1460)
        );

        let f = icmp_echo(M1, M2, A, B, 9, 10, b"ping");
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        let i = IcmpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!(
            IcmpRepr::parse(&i).unwrap(),
            IcmpRepr::EchoRequest {
                ident: 9,
                seq_no: 10,
                data: b"ping"
            }
        );

        let f = arp_request(M1, A, B);
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert!(e.dst_addr().is_broadcast());
        let a = ArpRepr::parse(&ArpPacket::new_checked(e.payload()).unwrap()).unwrap();
        assert_eq!((a.oper, a.sha, a.spa, a.tpa), (arp::OP_REQUEST, M1, A, B));
    }

    #[test]
    fn ipv4_frame_errors() {
        let eth = EthernetRepr {
            dst: M1,
            src: M2,
            vlans: &[],
            ethertype: 0,
        };
        let ip = Ipv4Repr {
            options: &[1, 1, 1],
            ..Ipv4Repr::new(A, B, 0, 0)
        };
        let l4 = Transport::Udp(UdpRepr {
            src_port: 1,
            dst_port: 2,
            payload: &[],
        });
        assert!(matches!(
            ipv4_frame(&eth, &ip, &l4),
            Err(WireError::BadLength)
        ));
    }
}
