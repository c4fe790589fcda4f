//! `reply_udp`: answering the UDP datagram a handler runs on, the way Table 6's
//! remote increment answers without waking the application.

use std::net::Ipv4Addr;

use exonet_wire::ethernet::{ethertype, MAX_VLAN_TAGS};
use exonet_wire::ipv4::protocol;
use exonet_wire::{
    udp, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr, MacAddr, UdpPacket, UdpRepr, VlanTag,
};

/// The addressing of a received Ethernet/IPv4/UDP datagram (VLAN tags kept,
/// so the reply goes back on the same VLAN).
pub(crate) struct Datagram {
    src_mac: MacAddr,
    dst_mac: MacAddr,
    vlans: [VlanTag; MAX_VLAN_TAGS],
    vlan_count: usize,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
}

impl Datagram {
    /// The datagram in `frame`, or `None` if it is not an unfragmented
    /// Ethernet/IPv4/UDP one.
    pub(crate) fn parse(frame: &[u8]) -> Option<Datagram> {
        let eth = EthernetFrame::new_checked(frame).ok()?;
        if eth.ethertype() != ethertype::IPV4 {
            return None;
        }
        let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
        if ip.protocol() != protocol::UDP || ip.is_fragment() {
            return None;
        }
        let u = UdpPacket::new_checked(ip.payload()).ok()?;
        let mut vlans = [VlanTag::new(0); MAX_VLAN_TAGS];
        let vlan_count = eth.vlan_count();
        for (i, v) in vlans.iter_mut().enumerate().take(vlan_count) {
            *v = eth.vlan(i)?;
        }
        Some(Datagram {
            src_mac: eth.src_addr(),
            dst_mac: eth.dst_addr(),
            vlans,
            vlan_count,
            src_ip: ip.src_addr(),
            dst_ip: ip.dst_addr(),
            src_port: u.src_port(),
            dst_port: u.dst_port(),
        })
    }

    fn eth(&self) -> EthernetRepr<'_> {
        EthernetRepr {
            dst: self.src_mac,
            src: self.dst_mac,
            vlans: &self.vlans[..self.vlan_count],
            ethertype: ethertype::IPV4,
        }
    }

    /// Length of a reply carrying `payload_len` bytes.
    pub(crate) fn reply_len(&self, payload_len: usize) -> usize {
        self.eth().header_len() + exonet_wire::ipv4::MIN_HEADER_LEN + udp::HEADER_LEN + payload_len
    }

    /// Writes the reply into `buf` (sized by [`Datagram::reply_len`]):
    /// addresses and ports swapped, a fresh IPv4 header (TTL 64, DF) and both
    /// checksums. False if the payload does not fit in an IPv4 datagram.
    pub(crate) fn emit_reply(&self, payload: &[u8], buf: &mut [u8]) -> bool {
        let eth = self.eth();
        let datagram = UdpRepr {
            src_port: self.dst_port,
            dst_port: self.src_port,
            payload,
        };
        let ip = Ipv4Repr::new(
            self.dst_ip,
            self.src_ip,
            protocol::UDP,
            datagram.buffer_len(),
        );
        let (head, rest) = buf.split_at_mut(eth.header_len());
        eth.emit(head).is_ok()
            && ip.emit(rest).is_ok()
            && datagram
                .emit(&mut rest[ip.header_len()..], ip.src, ip.dst)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exonet_wire::build;

    #[test]
    fn reply_swaps_and_checksums() {
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let (ma, mb) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        let req = build::udp_frame(ma, mb, a, b, 1000, 7, b"ping");
        let d = Datagram::parse(&req).expect("a UDP frame");
        let mut buf = vec![0; d.reply_len(5)];
        assert!(d.emit_reply(b"pong!", &mut buf));
        assert_eq!(buf, build::udp_frame(mb, ma, b, a, 7, 1000, b"pong!"));

        let mut not_udp = req.clone();
        not_udp[23] = protocol::TCP;
        assert!(Datagram::parse(&not_udp).is_none());
        assert!(Datagram::parse(&req[..40]).is_none());
    }
}
