//! ARP for IPv4 over Ethernet (RFC 826).

use std::net::Ipv4Addr;

use crate::ethernet::{ethertype, MacAddr};
use crate::field::{get_u16, set_u16};
use crate::WireError;

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;
/// `ar$hrd` for Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;
/// `ar$op` request.
pub const OP_REQUEST: u16 = 1;
/// `ar$op` reply.
pub const OP_REPLY: u16 = 2;

/// A view of an ARP packet whose address lengths are Ethernet (6) and IPv4 (4).
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wraps without validation; getters may panic on a short buffer.
    pub fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    /// Wraps after checking the length and that `hlen`/`plen` are 6/4: the address
    /// fields' offsets depend on them, and only Ethernet/IPv4 is handled
    /// (`Unsupported` otherwise).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < 6 {
            return Err(WireError::Truncated);
        }
        if b[4] != 6 || b[5] != 4 {
            return Err(WireError::Unsupported);
        }
        if b.len() < PACKET_LEN {
            return Err(WireError::Truncated);
        }
        Ok(ArpPacket { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Hardware type (`ar$hrd`).
    pub fn htype(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 0)
    }

    /// Protocol type (`ar$pro`), an EtherType.
    pub fn ptype(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }

    /// Hardware address length (`ar$hln`).
    pub fn hlen(&self) -> u8 {
        self.buffer.as_ref()[4]
    }

    /// Protocol address length (`ar$pln`).
    pub fn plen(&self) -> u8 {
        self.buffer.as_ref()[5]
    }

    /// Operation (`ar$op`): [`OP_REQUEST`] or [`OP_REPLY`].
    pub fn oper(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 6)
    }

    /// Sender hardware address.
    pub fn sha(&self) -> MacAddr {
        self.mac(8)
    }

    /// Sender protocol address.
    pub fn spa(&self) -> Ipv4Addr {
        self.ip(14)
    }

    /// Target hardware address.
    pub fn tha(&self) -> MacAddr {
        self.mac(18)
    }

    /// Target protocol address.
    pub fn tpa(&self) -> Ipv4Addr {
        self.ip(24)
    }

    fn mac(&self, at: usize) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[at..at + 6]);
        MacAddr(a)
    }

    fn ip(&self, at: usize) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ArpPacket<T> {
    /// Sets `ar$hrd`.
    pub fn set_htype(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 0, v);
    }

    /// Sets `ar$pro`.
    pub fn set_ptype(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 2, v);
    }

    /// Sets `ar$hln`.
    pub fn set_hlen(&mut self, v: u8) {
        self.buffer.as_mut()[4] = v;
    }

    /// Sets `ar$pln`.
    pub fn set_plen(&mut self, v: u8) {
        self.buffer.as_mut()[5] = v;
    }

    /// Sets `ar$op`.
    pub fn set_oper(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 6, v);
    }

    /// Sets the sender hardware address.
    pub fn set_sha(&mut self, a: MacAddr) {
        self.buffer.as_mut()[8..14].copy_from_slice(&a.0);
    }

    /// Sets the sender protocol address.
    pub fn set_spa(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[14..18].copy_from_slice(&a.octets());
    }

    /// Sets the target hardware address.
    pub fn set_tha(&mut self, a: MacAddr) {
        self.buffer.as_mut()[18..24].copy_from_slice(&a.0);
    }

    /// Sets the target protocol address.
    pub fn set_tpa(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[24..28].copy_from_slice(&a.octets());
    }
}

/// An Ethernet/IPv4 ARP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    /// [`OP_REQUEST`] or [`OP_REPLY`].
    pub oper: u16,
    /// Sender hardware address.
    pub sha: MacAddr,
    /// Sender protocol address.
    pub spa: Ipv4Addr,
    /// Target hardware address (zero in a request).
    pub tha: MacAddr,
    /// Target protocol address.
    pub tpa: Ipv4Addr,
}

impl ArpRepr {
    /// Reads a checked packet; `Unsupported` unless the hardware type is Ethernet and
    /// the protocol type IPv4.
    pub fn parse<T: AsRef<[u8]>>(p: &ArpPacket<T>) -> Result<Self, WireError> {
        if p.htype() != HTYPE_ETHERNET || p.ptype() != ethertype::IPV4 {
            return Err(WireError::Unsupported);
        }
        Ok(ArpRepr {
            oper: p.oper(),
            sha: p.sha(),
            spa: p.spa(),
            tha: p.tha(),
            tpa: p.tpa(),
        })
    }

    /// Writes the [`PACKET_LEN`]-byte packet into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let buf = buf.get_mut(..PACKET_LEN).ok_or(WireError::Truncated)?;
        let mut p = ArpPacket::new_unchecked(buf);
        p.set_htype(HTYPE_ETHERNET);
        p.set_ptype(ethertype::IPV4);
        p.set_hlen(6);
        p.set_plen(4);
        p.set_oper(self.oper);
        p.set_sha(self.sha);
        p.set_spa(self.spa);
        p.set_tha(self.tha);
        p.set_tpa(self.tpa);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let r = ArpRepr {
            oper: OP_REPLY,
            sha: MacAddr([2, 0, 0, 0, 0, 1]),
            spa: Ipv4Addr::new(10, 0, 0, 1),
            tha: MacAddr([2, 0, 0, 0, 0, 2]),
            tpa: Ipv4Addr::new(10, 0, 0, 2),
        };
        let mut buf = [0u8; PACKET_LEN];
        r.emit(&mut buf).unwrap();
        let p = ArpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!((p.hlen(), p.plen()), (6, 4));
        assert_eq!(ArpRepr::parse(&p).unwrap(), r);
        assert!(matches!(
            ArpPacket::new_checked(&buf[..27]),
            Err(WireError::Truncated)
        ));
        assert!(matches!(r.emit(&mut [0u8; 27]), Err(WireError::Truncated)));
        buf[5] = 16; // IPv6-sized protocol addresses
        assert!(matches!(
            ArpPacket::new_checked(&buf[..]),
            Err(WireError::Unsupported)
        ));
        buf[5] = 4;
        buf[0] = 9; // not Ethernet
        let p = ArpPacket::new_checked(&buf[..]).unwrap();
        assert!(matches!(ArpRepr::parse(&p), Err(WireError::Unsupported)));
    }
}
