//! ICMPv4 (RFC 792): echo, destination unreachable (with the RFC 1191 next-hop MTU)
//! and time exceeded.

use crate::checksum;
use crate::field::{get_u16, set_u16};
use crate::ipv4::Ipv4Packet;
use crate::WireError;

/// Type, code, checksum and the 4-byte type-specific word.
pub const HEADER_LEN: usize = 8;

/// Message types handled here.
pub mod msg_type {
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Destination unreachable.
    pub const DST_UNREACHABLE: u8 = 3;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
}

/// Destination-unreachable codes.
pub mod unreach {
    /// Net unreachable.
    pub const NET: u8 = 0;
    /// Host unreachable.
    pub const HOST: u8 = 1;
    /// Protocol unreachable.
    pub const PROTOCOL: u8 = 2;
    /// Port unreachable.
    pub const PORT: u8 = 3;
    /// Fragmentation needed and DF set; carries the next-hop MTU (RFC 1191).
    pub const FRAG_NEEDED: u8 = 4;
}

/// Time-exceeded codes.
pub mod time_exceeded {
    /// TTL exceeded in transit.
    pub const TTL: u8 = 0;
    /// Fragment reassembly time exceeded.
    pub const REASSEMBLY: u8 = 1;
}

/// A view of an ICMPv4 message. ICMP has no length field: the buffer must be exactly
/// the message (the IP payload), since the checksum covers all of it.
#[derive(Debug, Clone)]
pub struct IcmpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> IcmpPacket<T> {
    /// Wraps without validation; getters may panic on a short buffer.
    pub fn new_unchecked(buffer: T) -> Self {
        IcmpPacket { buffer }
    }

    /// Wraps after checking that the 8-byte header is present.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        Ok(IcmpPacket { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Message type (see [`msg_type`]).
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// Code.
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }

    /// Echo identifier (bytes 4..6).
    pub fn echo_ident(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }

    /// Echo sequence number (bytes 6..8).
    pub fn echo_seq_no(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 6)
    }

    /// Next-hop MTU of a fragmentation-needed error (bytes 6..8, RFC 1191 §4).
    pub fn next_hop_mtu(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 6)
    }

    /// Whether this is an error message that quotes the offending datagram.
    pub fn is_error(&self) -> bool {
        matches!(
            self.msg_type(),
            msg_type::DST_UNREACHABLE | msg_type::TIME_EXCEEDED
        )
    }

    /// Echo data, or the quoted datagram of an error.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// The quoted IP header (plus the first 64 bits of its data) of an error, so the
    /// sender can match it to a flow. `Unsupported` for non-error types, otherwise the
    /// header-only IPv4 checks of [`Ipv4Packet::new_checked_header`].
    pub fn quoted_ipv4(&self) -> Result<Ipv4Packet<&[u8]>, WireError> {
        if !self.is_error() {
            return Err(WireError::Unsupported);
        }
        Ipv4Packet::new_checked_header(self.payload())
    }

    /// Whether the checksum over the whole message verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(self.buffer.as_ref()) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IcmpPacket<T> {
    /// Sets the message type.
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }

    /// Sets the code.
    pub fn set_code(&mut self, v: u8) {
        self.buffer.as_mut()[1] = v;
    }

    /// Sets the checksum field as is.
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 2, v);
    }

    /// Sets the echo identifier.
    pub fn set_echo_ident(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 4, v);
    }

    /// Sets the echo sequence number.
    pub fn set_echo_seq_no(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 6, v);
    }

    /// Sets the next-hop MTU, clearing the unused word before it.
    pub fn set_next_hop_mtu(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 4, 0);
        set_u16(self.buffer.as_mut(), 6, v);
    }

    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }

    /// Computes and stores the checksum over the whole message.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }
}

/// The ICMP messages this crate understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcmpRepr<'a> {
    /// Echo request ("ping").
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Data echoed back.
        data: &'a [u8],
    },
    /// Echo reply.
    EchoReply {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Data of the request.
        data: &'a [u8],
    },
    /// Destination unreachable.
    DstUnreachable {
        /// Reason (see [`unreach`]).
        code: u8,
        /// Next-hop MTU for [`unreach::FRAG_NEEDED`], else 0.
        next_hop_mtu: u16,
        /// Offending IP header plus at least 64 bits of its data.
        quoted: &'a [u8],
    },
    /// Time exceeded.
    TimeExceeded {
        /// Reason (see [`time_exceeded`]).
        code: u8,
        /// Offending IP header plus at least 64 bits of its data.
        quoted: &'a [u8],
    },
}

impl<'a> IcmpRepr<'a> {
    /// Reads a checked message, verifying the checksum (`BadChecksum`); `Unsupported`
    /// for other message types.
    pub fn parse<T: AsRef<[u8]>>(p: &'a IcmpPacket<T>) -> Result<Self, WireError> {
        if !p.verify_checksum() {
            return Err(WireError::BadChecksum);
        }
        let (ident, seq_no, data) = (p.echo_ident(), p.echo_seq_no(), p.payload());
        Ok(match p.msg_type() {
            msg_type::ECHO_REQUEST => IcmpRepr::EchoRequest {
                ident,
                seq_no,
                data,
            },
            msg_type::ECHO_REPLY => IcmpRepr::EchoReply {
                ident,
                seq_no,
                data,
            },
            msg_type::DST_UNREACHABLE => IcmpRepr::DstUnreachable {
                code: p.code(),
                next_hop_mtu: p.next_hop_mtu(),
                quoted: data,
            },
            msg_type::TIME_EXCEEDED => IcmpRepr::TimeExceeded {
                code: p.code(),
                quoted: data,
            },
            _ => return Err(WireError::Unsupported),
        })
    }

    fn data(&self) -> &'a [u8] {
        match *self {
            IcmpRepr::EchoRequest { data, .. } | IcmpRepr::EchoReply { data, .. } => data,
            IcmpRepr::DstUnreachable { quoted, .. } | IcmpRepr::TimeExceeded { quoted, .. } => {
                quoted
            }
        }
    }

    /// Message length.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.data().len()
    }

    /// Writes the message, checksum included, into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let buf = buf
            .get_mut(..self.buffer_len())
            .ok_or(WireError::Truncated)?;
        let mut p = IcmpPacket::new_unchecked(buf);
        let (ty, code) = match *self {
            IcmpRepr::EchoRequest { ident, seq_no, .. }
            | IcmpRepr::EchoReply { ident, seq_no, .. } => {
                p.set_echo_ident(ident);
                p.set_echo_seq_no(seq_no);
                let ty = if matches!(self, IcmpRepr::EchoRequest { .. }) {
                    msg_type::ECHO_REQUEST
                } else {
                    msg_type::ECHO_REPLY
                };
                (ty, 0)
            }
            IcmpRepr::DstUnreachable {
                code, next_hop_mtu, ..
            } => {
                p.set_next_hop_mtu(next_hop_mtu);
                (msg_type::DST_UNREACHABLE, code)
            }
            IcmpRepr::TimeExceeded { code, .. } => {
                p.set_next_hop_mtu(0);
                (msg_type::TIME_EXCEEDED, code)
            }
        };
        p.set_msg_type(ty);
        p.set_code(code);
        p.payload_mut().copy_from_slice(self.data());
        p.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipv4::{protocol, Ipv4Addr, Ipv4Repr};

    #[test]
    fn echo_round_trip() {
        let r = IcmpRepr::EchoRequest {
            ident: 0x1234,
            seq_no: 7,
            data: b"abcdefg",
        };
        let mut buf = vec![0; r.buffer_len()];
        r.emit(&mut buf).unwrap();
        let p = IcmpPacket::new_checked(&buf[..]).unwrap();
        assert!(p.verify_checksum() && !p.is_error());
        assert!(matches!(p.quoted_ipv4(), Err(WireError::Unsupported)));
        assert_eq!(IcmpRepr::parse(&p).unwrap(), r);
        buf[9] ^= 1;
        assert!(matches!(
            IcmpRepr::parse(&IcmpPacket::new_checked(&buf[..]).unwrap()),
            Err(WireError::BadChecksum)
        ));
        assert!(matches!(
            IcmpPacket::new_checked(&buf[..7]),
            Err(WireError::Truncated)
        ));
    }

    #[test]
    fn frag_needed_quotes_header() {
        // The offending datagram: a 1500-byte UDP datagram of which only 28 bytes are quoted.
        let ip = Ipv4Repr::new(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 9),
            protocol::UDP,
            1480,
        );
        let mut quoted = [0u8; 28];
        ip.emit(&mut quoted).unwrap();
        quoted[20..22].copy_from_slice(&5353u16.to_be_bytes());
        let r = IcmpRepr::DstUnreachable {
            code: unreach::FRAG_NEEDED,
            next_hop_mtu: 1400,
            quoted: &quoted,
        };
        let mut buf = vec![0; r.buffer_len()];
        r.emit(&mut buf).unwrap();
        let p = IcmpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(
            (p.msg_type(), p.code(), p.next_hop_mtu()),
            (msg_type::DST_UNREACHABLE, unreach::FRAG_NEEDED, 1400)
        );
        let q = p.quoted_ipv4().unwrap();
        assert_eq!(
            (q.total_len(), q.dst_addr(), &q.payload()[..2]),
            (1500, Ipv4Addr::new(10, 0, 0, 9), &5353u16.to_be_bytes()[..])
        );
        assert_eq!(IcmpRepr::parse(&p).unwrap(), r);

        let t = IcmpRepr::TimeExceeded {
            code: time_exceeded::TTL,
            quoted: &quoted,
        };
        let mut buf = vec![0xff; t.buffer_len()];
        t.emit(&mut buf).unwrap();
        let p = IcmpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(IcmpRepr::parse(&p).unwrap(), t);
        assert!(p.quoted_ipv4().is_ok());
    }
}
