//! IPv4 headers (RFC 791) with options and fragmentation fields.

pub use std::net::Ipv4Addr;

use crate::checksum;
use crate::field::{get_u16, set_u16, set_words};
use crate::WireError;

/// Header length without options (IHL = 5).
pub const MIN_HEADER_LEN: usize = 20;
/// Header length with the most options IHL can describe (IHL = 15).
pub const MAX_HEADER_LEN: usize = 60;

/// IP protocol numbers used in this crate.
pub mod protocol {
    /// ICMP (RFC 792).
    pub const ICMP: u8 = 1;
    /// TCP (RFC 9293).
    pub const TCP: u8 = 6;
    /// UDP (RFC 768).
    pub const UDP: u8 = 17;
}

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// Where an IPv4 packet lies in an Ethernet frame (untagged or behind one
/// 802.1Q tag): see [`in_frame`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct InFrame {
    /// Offset of the IPv4 header (14, or 18 behind the tag).
    pub l3: usize,
    /// Offset of the transport header (past the options).
    pub l4: usize,
    /// End of the packet (from its total length).
    pub end: usize,
    /// The protocol field.
    pub proto: u8,
    /// More fragments follow, or this is not the first.
    pub fragment: bool,
}

/// The IPv4 packet of `frame`, if it carries one whose version is 4, whose
/// header length is at least 20 bytes and within its total length, and which
/// lies within the frame; `None` otherwise. For the links' offloads, which
/// read frames where they lie.
pub(crate) fn in_frame(frame: &[u8]) -> Option<InFrame> {
    let mut l3 = 14;
    if frame.get(12..14)? == [0x81, 0x00] {
        l3 = 18;
    }
    if frame.get(l3 - 2..l3)? != [0x08, 0x00] {
        return None;
    }
    let ip = frame.get(l3..l3 + MIN_HEADER_LEN)?;
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(get_u16(ip, 2));
    let end = l3 + total;
    if ip[0] >> 4 != 4 || ihl < MIN_HEADER_LEN || total < ihl || end > frame.len() {
        return None;
    }
    Some(InFrame {
        l3,
        l4: l3 + ihl,
        end,
        proto: ip[9],
        fragment: get_u16(ip, 6) & (FLAG_MF | OFFSET_MASK) != 0,
    })
}

/// A view of an IPv4 datagram.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps without validation; getters may panic on a short buffer.
    #[inline]
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wraps after the RFC 791 consistency checks: version 4 (`BadVersion`), IHL ≥ 5 and
    /// total length ≥ header length (`BadLength`), header and total length within the
    /// buffer (`Truncated`). The buffer may extend past the total length (link padding).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_checked_header(buffer)?;
        if usize::from(p.total_len()) > p.buffer.as_ref().len() {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }

    /// Like [`Ipv4Packet::new_checked`] but lets the datagram extend past the buffer, for
    /// the header quoted in an ICMP error (RFC 792 quotes the header plus only 64 bits of
    /// data). [`Ipv4Packet::payload`] then returns the part that is present.
    #[inline]
    pub fn new_checked_header(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let p = Ipv4Packet { buffer };
        if p.version() != 4 {
            return Err(WireError::BadVersion);
        }
        let hl = p.header_len();
        if hl < MIN_HEADER_LEN || usize::from(p.total_len()) < hl {
            return Err(WireError::BadLength);
        }
        if p.buffer.as_ref().len() < hl {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }

    /// The wrapped buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Version field (4 after a successful check).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// Internet Header Length in 32-bit words.
    #[inline]
    pub fn ihl(&self) -> u8 {
        self.buffer.as_ref()[0] & 0x0f
    }

    /// Header length in bytes (IHL × 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.ihl()) * 4
    }

    /// Differentiated services code point (upper 6 bits of the former TOS byte).
    #[inline]
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[1] >> 2
    }

    /// Explicit congestion notification (lower 2 bits of the former TOS byte).
    #[inline]
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[1] & 3
    }

    /// Total length of the datagram, header included.
    #[inline]
    pub fn total_len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }

    /// Identification, shared by all fragments of one datagram.
    #[inline]
    pub fn ident(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }

    /// Don't Fragment flag.
    #[inline]
    pub fn dont_frag(&self) -> bool {
        get_u16(self.buffer.as_ref(), 6) & FLAG_DF != 0
    }

    /// More Fragments flag.
    #[inline]
    pub fn more_frags(&self) -> bool {
        get_u16(self.buffer.as_ref(), 6) & FLAG_MF != 0
    }

    /// Fragment offset in bytes (the field counts 8-byte units).
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        (get_u16(self.buffer.as_ref(), 6) & OFFSET_MASK) << 3
    }

    /// Part of a fragmented datagram: MF set or a non-zero offset.
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    /// The first fragment of a fragmented datagram (offset 0, MF set) — the only one
    /// carrying the transport header. An unfragmented datagram is not a fragment.
    #[inline]
    pub fn is_first_fragment(&self) -> bool {
        self.more_frags() && self.frag_offset() == 0
    }

    /// Time to live.
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[8]
    }

    /// Protocol of the payload (see [`protocol`]).
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[9]
    }

    /// Header checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 10)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }

    /// Raw options (IHL > 5), padding included.
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()]
    }

    /// Whether the header checksum verifies (RFC 791 §3.1, RFC 1071).
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        // The header is whole 32-bit words.
        checksum::fold(checksum::add_words(
            &self.buffer.as_ref()[..self.header_len()],
        )) == 0xffff
    }

    /// The payload, bounded by the total length (link-layer padding excluded) and, for
    /// a header-only check, by the buffer.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = usize::from(self.total_len()).min(b.len());
        &b[self.header_len()..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Sets version and IHL from a header length in bytes (a multiple of 4).
    #[inline]
    pub fn set_version_and_header_len(&mut self, version: u8, header_len: usize) {
        self.buffer.as_mut()[0] = version_ihl(version, header_len);
    }

    /// Sets DSCP (6 bits) and ECN (2 bits).
    #[inline]
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: u8) {
        self.buffer.as_mut()[1] = dscp_ecn(dscp, ecn);
    }

    /// Sets the total length.
    #[inline]
    pub fn set_total_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 2, v);
    }

    /// Sets the identification.
    #[inline]
    pub fn set_ident(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 4, v);
    }

    /// Sets DF, MF and the fragment offset in bytes (truncated to a multiple of 8).
    #[inline]
    pub fn set_frag(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        set_u16(
            self.buffer.as_mut(),
            6,
            frag_field(dont_frag, more_frags, offset),
        );
    }

    /// Sets the time to live.
    #[inline]
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[8] = v;
    }

    /// Sets the protocol.
    #[inline]
    pub fn set_protocol(&mut self, v: u8) {
        self.buffer.as_mut()[9] = v;
    }

    /// Sets the checksum field as is.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 10, v);
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[12..16].copy_from_slice(&a.octets());
    }

    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[16..20].copy_from_slice(&a.octets());
    }

    /// Mutable options.
    #[inline]
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[MIN_HEADER_LEN..hl]
    }

    /// Mutable payload, bounded like [`Ipv4Packet::payload`].
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, tl) = (self.header_len(), usize::from(self.total_len()));
        let b = self.buffer.as_mut();
        let end = tl.min(b.len());
        &mut b[hl..end]
    }

    /// Computes and stores the header checksum.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(&self.buffer.as_ref()[..self.header_len()]);
        self.set_checksum(c);
    }
}

/// IPv4 header fields to emit or as parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr<'a> {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Payload protocol.
    pub protocol: u8,
    /// Time to live.
    pub ttl: u8,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment.
    pub dont_frag: bool,
    /// More Fragments.
    pub more_frags: bool,
    /// Fragment offset in bytes (a multiple of 8).
    pub frag_offset: u16,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN (2 bits).
    pub ecn: u8,
    /// Encoded options, padded to a multiple of 4 bytes, at most 40.
    pub options: &'a [u8],
    /// Payload length in bytes.
    pub payload_len: usize,
}

impl<'a> Ipv4Repr<'a> {
    /// An unfragmented datagram with DF set, TTL 64, no options: what a host sends.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, payload_len: usize) -> Self {
        Ipv4Repr {
            src,
            dst,
            protocol,
            ttl: 64,
            ident: 0,
            dont_frag: true,
            more_frags: false,
            frag_offset: 0,
            dscp: 0,
            ecn: 0,
            options: &[],
            payload_len,
        }
    }

    /// Reads a checked packet, verifying the header checksum (`BadChecksum`).
    pub fn parse<T: AsRef<[u8]>>(p: &'a Ipv4Packet<T>) -> Result<Self, WireError> {
        if !p.verify_checksum() {
            return Err(WireError::BadChecksum);
        }
        Ok(Ipv4Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            protocol: p.protocol(),
            ttl: p.ttl(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            more_frags: p.more_frags(),
            frag_offset: p.frag_offset(),
            dscp: p.dscp(),
            ecn: p.ecn(),
            options: p.options(),
            payload_len: usize::from(p.total_len()) - p.header_len(),
        })
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN + self.options.len()
    }

    /// Header plus payload length.
    pub fn total_len(&self) -> usize {
        self.header_len() + self.payload_len
    }

    /// Writes the header, checksum included, into the front of `buf`.
    ///
    /// `BadLength` if a field does not fit (options not a multiple of 4 or over 40
    /// bytes, total length over 65535, offset not a multiple of 8, DSCP/ECN too wide);
    /// `Truncated` if `buf` is shorter than the header.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let hl = self.header_len();
        let total = u16::try_from(self.total_len()).map_err(|_| WireError::BadLength)?;
        if self.options.len() & 3 != 0
            || hl > MAX_HEADER_LEN
            || self.frag_offset & 7 != 0
            || self.dscp > 63
            || self.ecn > 3
        {
            return Err(WireError::BadLength);
        }
        let buf = buf.get_mut(..hl).ok_or(WireError::Truncated)?;
        // The fixed header (RFC 791 §3.1) as its five 32-bit words, written
        // at once and summed as numbers: [`checksum::fold`] reduces them to
        // the sum of their 16-bit halves, without reading the bytes back.
        let frag = frag_field(self.dont_frag, self.more_frags, self.frag_offset);
        let t = total.to_be_bytes();
        let w0 = u32::from_be_bytes([
            version_ihl(4, hl),
            dscp_ecn(self.dscp, self.ecn),
            t[0],
            t[1],
        ]);
        let w1 = (u32::from(self.ident) << 16) | u32::from(frag);
        // The checksum field is zero while summed.
        let w2 = (u32::from(self.ttl) << 24) | (u32::from(self.protocol) << 16);
        let (w3, w4) = (self.src.to_bits(), self.dst.to_bits());
        let mut sum = checksum::fold([w0, w1, w2, w3, w4].iter().map(|&w| u64::from(w)).sum());
        let (fixed, options) = buf.split_at_mut(MIN_HEADER_LEN);
        // Most headers have none: no call to copy nothing.
        if !self.options.is_empty() {
            sum = checksum::add(sum, checksum::sum(self.options));
            options.copy_from_slice(self.options);
        }
        let w2 = w2 | u32::from(!sum);
        set_words(fixed, &[w0, w1, w2, w3, w4]);
        Ok(())
    }
}

/// The first byte: version and IHL from a header length in bytes.
#[inline]
fn version_ihl(version: u8, header_len: usize) -> u8 {
    (version << 4) | ((header_len / 4) as u8 & 0x0f)
}

/// The second byte: DSCP (6 bits) and ECN (2 bits).
#[inline]
fn dscp_ecn(dscp: u8, ecn: u8) -> u8 {
    (dscp << 2) | (ecn & 3)
}

/// The flags and fragment offset field: DF, MF and the offset in bytes
/// (truncated to a multiple of 8).
#[inline]
fn frag_field(dont_frag: bool, more_frags: bool, offset: u16) -> u16 {
    let mut v = (offset >> 3) & OFFSET_MASK;
    if dont_frag {
        v |= FLAG_DF;
    }
    if more_frags {
        v |= FLAG_MF;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(options: &[u8], payload_len: usize) -> Vec<u8> {
        let mut r = Ipv4Repr::new(
            Ipv4Addr::new(192, 168, 0, 1),
            Ipv4Addr::new(192, 168, 0, 199),
            protocol::UDP,
            payload_len,
        );
        r.options = options;
        let mut buf = vec![0xaa; r.total_len()];
        r.emit(&mut buf).unwrap();
        buf
    }

    proptest! {
        /// The header written at once is the one the setters write.
        #[test]
        fn emit_writes_what_the_setters_write(
            src in any::<u32>(), dst in any::<u32>(),
            proto in any::<u8>(), ttl in any::<u8>(),
            ident in any::<u16>(), flags in 0u8..4, offset in 0u16..0x2000,
            dscp in 0u8..64, ecn in 0u8..4, words in 0usize..11, payload_len in 0usize..2000,
        ) {
            let options: Vec<u8> = (0..words * 4).map(|i| (i * 37 + 5) as u8).collect();
            let mut r = Ipv4Repr::new(Ipv4Addr::from(src), Ipv4Addr::from(dst), proto, payload_len);
            (r.ttl, r.ident, r.dscp, r.ecn, r.options) = (ttl, ident, dscp, ecn, &options);
            (r.dont_frag, r.more_frags, r.frag_offset) = (flags & 1 != 0, flags & 2 != 0, offset * 8);
            let hl = r.header_len();
            let mut got = vec![0xaa; hl];
            r.emit(&mut got).unwrap();
            let mut want = vec![0xaa; hl];
            let mut p = Ipv4Packet::new_unchecked(&mut want[..]);
            p.set_version_and_header_len(4, hl);
            p.set_dscp_ecn(dscp, ecn);
            p.set_total_len(r.total_len() as u16);
            p.set_ident(ident);
            p.set_frag(r.dont_frag, r.more_frags, r.frag_offset);
            p.set_ttl(ttl);
            p.set_protocol(proto);
            p.set_src_addr(r.src);
            p.set_dst_addr(r.dst);
            p.options_mut().copy_from_slice(&options);
            p.fill_checksum();
            prop_assert_eq!(got, want);
        }
    }

    proptest! {
        /// The header's words, summed as numbers, verify as its bytes do.
        #[test]
        fn verify_checksum_sums_as_bytes(bytes in proptest::collection::vec(any::<u8>(), 60),
                                         ihl in 5u8..16, fix in any::<bool>()) {
            let mut b = bytes;
            b[0] = 0x40 | ihl;
            let hl = usize::from(ihl) * 4;
            if fix {
                b[10..12].fill(0);
                let c = checksum::checksum(&b[..hl]);
                b[10..12].copy_from_slice(&c.to_be_bytes());
            }
            let p = Ipv4Packet::new_unchecked(&b[..]);
            prop_assert_eq!(p.verify_checksum(), checksum::sum_reference(&b[..hl]) == 0xffff);
        }
    }

    #[test]
    fn known_header_checksum() {
        // Wikipedia's worked example header (checksum 0xb861).
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        let mut buf = hdr.to_vec();
        buf.resize(0x73, 0);
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(sample(&[], 0x73 - 20)[..20], hdr);
    }

    #[test]
    fn consistency_checks() {
        let good = sample(&[1, 1, 1, 0], 8);
        let p = Ipv4Packet::new_checked(&good[..]).unwrap();
        assert_eq!(
            (p.header_len(), p.options(), p.payload().len()),
            (24, &[1, 1, 1, 0][..], 8)
        );
        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 10]);
        assert_eq!(
            Ipv4Packet::new_checked(&padded[..])
                .unwrap()
                .payload()
                .len(),
            8
        );

        let check = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            Ipv4Packet::new_checked(b).map(|_| ())
        };
        assert!(matches!(
            check(&|b| b[0] = 0x65),
            Err(WireError::BadVersion)
        ));
        assert!(matches!(check(&|b| b[0] = 0x44), Err(WireError::BadLength)));
        assert!(matches!(
            check(&|b| set_u16(b, 2, 23)),
            Err(WireError::BadLength)
        ));
        assert!(matches!(
            check(&|b| set_u16(b, 2, 33)),
            Err(WireError::Truncated)
        ));
        assert!(matches!(
            check(&|b| b.truncate(19)),
            Err(WireError::Truncated)
        ));
        assert!(matches!(check(&|b| b[0] = 0x4f), Err(WireError::BadLength)));
        // Header-only check for quoted headers: payload clamped to what is present.
        let q = Ipv4Packet::new_checked_header(&good[..28]).unwrap();
        assert_eq!(q.payload().len(), 4);
    }

    #[test]
    fn fragments_and_repr() {
        let opts = [0x94, 0x04, 0, 0]; // router alert
        let r = Ipv4Repr {
            ident: 0x1234,
            dont_frag: false,
            more_frags: true,
            frag_offset: 1480,
            dscp: 46,
            ecn: 1,
            ttl: 3,
            options: &opts,
            ..Ipv4Repr::new(
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(10, 0, 0, 2),
                protocol::TCP,
                5,
            )
        };
        let mut buf = vec![0; r.total_len()];
        r.emit(&mut buf).unwrap();
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert!(p.is_fragment() && !p.is_first_fragment());
        assert_eq!(Ipv4Repr::parse(&p).unwrap(), r);
        let mut first = Ipv4Packet::new_unchecked(&mut buf[..]);
        first.set_frag(false, true, 0);
        assert!(first.is_fragment() && first.is_first_fragment());
        assert!(matches!(
            Ipv4Repr::parse(&first),
            Err(WireError::BadChecksum)
        ));
        first.fill_checksum();
        first.set_frag(true, false, 0);
        assert!(!first.is_fragment() && !first.is_first_fragment());

        for bad in [
            Ipv4Repr {
                frag_offset: 7,
                ..r
            },
            Ipv4Repr {
                options: &[1, 2],
                ..r
            },
            Ipv4Repr {
                payload_len: 65_535,
                ..r
            },
            Ipv4Repr { dscp: 64, ..r },
        ] {
            assert!(matches!(bad.emit(&mut [0; 100]), Err(WireError::BadLength)));
        }
        assert!(matches!(r.emit(&mut [0; 23]), Err(WireError::Truncated)));
    }
}
