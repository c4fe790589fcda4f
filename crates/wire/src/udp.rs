//! UDP (RFC 768).

use std::net::Ipv4Addr;

use crate::checksum;
use crate::field::{get_u16, set_u16};
use crate::ipv4::protocol;
use crate::WireError;

/// Ports, length and checksum.
pub const HEADER_LEN: usize = 8;

/// A view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps without validation; getters may panic on a short buffer.
    pub fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps after checking the header is present (`Truncated`), the length field
    /// covers at least the header (`BadLength`) and does not exceed the buffer
    /// (`Truncated`).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let len = usize::from(get_u16(b, 4));
        if len < HEADER_LEN {
            return Err(WireError::BadLength);
        }
        if len > b.len() {
            return Err(WireError::Truncated);
        }
        Ok(UdpPacket { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 0)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }

    /// Length field: header plus data.
    pub fn len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }

    /// Whether the datagram carries no data.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) == HEADER_LEN
    }

    /// Checksum field (0: none was computed).
    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 6)
    }

    /// Data, bounded by the length field.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }

    /// Whether the checksum over pseudo-header and datagram verifies; a zero checksum
    /// means the sender computed none and is accepted (RFC 768).
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        self.checksum() == 0 || self.sum(src, dst) == 0xffff
    }

    fn sum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> u16 {
        let len = self.len();
        checksum::add(
            checksum::pseudo_header_sum(src, dst, protocol::UDP, len),
            checksum::sum(&self.buffer.as_ref()[..usize::from(len)]),
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 0, v);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 2, v);
    }

    /// Sets the length field.
    pub fn set_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 4, v);
    }

    /// Sets the checksum field as is.
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 6, v);
    }

    /// Mutable data, bounded by the length field.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..len]
    }

    /// Computes and stores the checksum; a computed 0 is sent as 0xffff because 0 on
    /// the wire means "no checksum" (RFC 768).
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let c = !self.sum(src, dst);
        self.set_checksum(if c == 0 { 0xffff } else { c });
    }
}

/// A UDP datagram to emit or as parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Data.
    pub payload: &'a [u8],
}

impl<'a> UdpRepr<'a> {
    /// Reads a checked datagram, verifying the checksum against the addresses of the
    /// enclosing IPv4 header (`BadChecksum`).
    pub fn parse<T: AsRef<[u8]>>(
        p: &'a UdpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> Result<Self, WireError> {
        if !p.verify_checksum(src, dst) {
            return Err(WireError::BadChecksum);
        }
        Ok(UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload: p.payload(),
        })
    }

    /// Header plus data.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Writes the datagram, checksum included, into the front of `buf`. `BadLength`
    /// if it exceeds 65535 bytes, `Truncated` if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) -> Result<(), WireError> {
        let len = u16::try_from(self.buffer_len()).map_err(|_| WireError::BadLength)?;
        let buf = buf
            .get_mut(..usize::from(len))
            .ok_or(WireError::Truncated)?;
        let mut p = UdpPacket::new_unchecked(buf);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len);
        p.payload_mut().copy_from_slice(self.payload);
        p.fill_checksum(src, dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    #[test]
    fn round_trip_and_checks() {
        let r = UdpRepr {
            src_port: 5353,
            dst_port: 53,
            payload: b"hello",
        };
        let mut buf = vec![0; r.buffer_len() + 4];
        r.emit(&mut buf, A, B).unwrap();
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(
            (p.len(), p.payload(), p.is_empty()),
            (13, &b"hello"[..], false)
        );
        assert_eq!(UdpRepr::parse(&p, A, B).unwrap(), r);
        assert!(matches!(
            UdpRepr::parse(&p, A, A),
            Err(WireError::BadChecksum)
        ));

        let mut none = buf.clone();
        none[6..8].fill(0);
        assert!(UdpPacket::new_checked(&none[..])
            .unwrap()
            .verify_checksum(A, A));

        set_u16(&mut buf, 4, 7);
        assert!(matches!(
            UdpPacket::new_checked(&buf[..]),
            Err(WireError::BadLength)
        ));
        set_u16(&mut buf, 4, 18);
        assert!(matches!(
            UdpPacket::new_checked(&buf[..]),
            Err(WireError::Truncated)
        ));
        assert!(matches!(
            UdpPacket::new_checked(&buf[..7]),
            Err(WireError::Truncated)
        ));
        let big = vec![0; 65_528];
        assert!(matches!(
            UdpRepr { payload: &big, ..r }.emit(&mut [], A, B),
            Err(WireError::BadLength)
        ));
    }

    #[test]
    fn computed_zero_is_sent_as_ffff() {
        // Choose the last payload word so that the full sum is 0xffff, i.e. checksum 0.
        let mut buf = [0u8; 10];
        let mut p = UdpPacket::new_unchecked(&mut buf[..]);
        p.set_src_port(1);
        p.set_dst_port(2);
        p.set_len(10);
        let partial = p.sum(A, B);
        p.payload_mut().copy_from_slice(&(!partial).to_be_bytes());
        p.fill_checksum(A, B);
        assert_eq!(p.checksum(), 0xffff);
        assert!(p.verify_checksum(A, B));
    }
}
