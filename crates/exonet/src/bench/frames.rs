//! Ethernet / IPv4 / TCP frames for the benchmarks, built with
//! [`exonet_wire::build`] (correct lengths and checksums) and padded to the
//! Ethernet minimum.

use std::net::Ipv4Addr;

use exonet_wire::build::{ipv4_frame, Transport};
use exonet_wire::tcp::flags;
use exonet_wire::{EthernetRepr, Ipv4Repr, MacAddr, TcpRepr};

/// Shortest Ethernet frame without its FCS; shorter frames are padded.
pub const MIN_FRAME: usize = 60;
/// The IPv4 Router Alert option (RFC 2113), four bytes.
pub const OPT_ROUTER_ALERT: [u8; 4] = [0x94, 0x04, 0x00, 0x00];

/// What goes into an Ethernet / IPv4 / TCP frame.
#[derive(Clone, Debug)]
pub struct TcpFrame<'a> {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub src_ip: u32,
    pub dst_ip: u32,
    /// IPv4 options, a multiple of 4 bytes, at most 40.
    pub ip_options: &'a [u8],
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

impl Default for TcpFrame<'_> {
    fn default() -> Self {
        TcpFrame {
            dst_mac: [0x02, 0, 0, 0, 0, 1],
            src_mac: [0x02, 0, 0, 0, 0, 2],
            src_ip: 0x0a00_0002,
            dst_ip: 0x0a00_0001,
            ip_options: &[],
            src_port: 40000,
            dst_port: 80,
            seq: 1,
            payload: &[],
        }
    }
}

impl TcpFrame<'_> {
    /// The frame's bytes: Ethernet, IPv4 with options, a 20-byte TCP header
    /// (ACK|PSH), the payload, padded with zeros to [`MIN_FRAME`].
    ///
    /// # Panics
    /// If the options are not a multiple of 4 bytes or longer than 40.
    pub fn build(&self) -> Vec<u8> {
        let eth = EthernetRepr {
            dst: MacAddr(self.dst_mac),
            src: MacAddr(self.src_mac),
            vlans: &[],
            ethertype: exonet_wire::ethernet::ethertype::IPV4,
        };
        let seg = TcpRepr {
            src_port: self.src_port,
            dst_port: self.dst_port,
            seq_number: self.seq,
            ack_number: 1,
            flags: flags::ACK | flags::PSH,
            window: 65535,
            urgent_ptr: 0,
            options: &[],
            payload: self.payload,
        };
        let l4 = Transport::Tcp(seg);
        let mut ip = Ipv4Repr::new(
            Ipv4Addr::from(self.src_ip),
            Ipv4Addr::from(self.dst_ip),
            l4.protocol(),
            l4.buffer_len(),
        );
        ip.ident = self.seq as u16;
        ip.options = self.ip_options;
        let mut f = ipv4_frame(&eth, &ip, &l4).expect("a valid TCP/IPv4 frame");
        if f.len() < MIN_FRAME {
            f.resize(MIN_FRAME, 0);
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_what_the_filters_expect() {
        let f = TcpFrame {
            ip_options: &OPT_ROUTER_ALERT,
            src_ip: 0xc00c_4501,
            src_port: 1234,
            dst_port: 4321,
            ..TcpFrame::default()
        }
        .build();
        assert_eq!(f.len(), MIN_FRAME);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        assert_eq!(f[14], 0x46); // IPv4, 24-byte header
        assert_eq!(f[23], 6);
        assert_eq!(&f[26..30], &[192, 12, 69, 1]);
        assert_eq!(&f[34..38], &OPT_ROUTER_ALERT);
        assert_eq!(&f[38..42], &[0x04, 0xd2, 0x10, 0xe1]);
        let ip = exonet_wire::Ipv4Packet::new_checked(&f[14..]).unwrap();
        assert!(Ipv4Repr::parse(&ip).is_ok(), "IPv4 header checksum");
    }
}
