//! TCP segments (RFC 9293) and their options: MSS (RFC 9293 §3.7.1), window scale and
//! timestamps (RFC 7323), SACK (RFC 2018).

use std::net::Ipv4Addr;

use crate::checksum;
use crate::field::{get_u16, get_u32, set_u16, set_u32, set_words};
use crate::ipv4::protocol;
use crate::WireError;

/// Header length without options (data offset 5).
pub const MIN_HEADER_LEN: usize = 20;
/// Header length with 40 bytes of options (data offset 15).
pub const MAX_HEADER_LEN: usize = 60;
/// Most option bytes a header can carry.
pub const MAX_OPTIONS_LEN: usize = MAX_HEADER_LEN - MIN_HEADER_LEN;
/// Most SACK blocks that fit in the option space (RFC 2018 §3).
pub const MAX_SACK_BLOCKS: usize = 4;

/// Control bits (RFC 9293 §3.1; ECE/CWR from RFC 3168).
pub mod flags {
    /// No more data from sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push function.
    pub const PSH: u8 = 0x08;
    /// Acknowledgment field is significant.
    pub const ACK: u8 = 0x10;
    /// Urgent pointer field is significant.
    pub const URG: u8 = 0x20;
    /// ECN echo.
    pub const ECE: u8 = 0x40;
    /// Congestion window reduced.
    pub const CWR: u8 = 0x80;
}

/// Option kinds with a fixed meaning here.
mod kind {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WINDOW_SCALE: u8 = 3;
    pub const SACK_PERMITTED: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TIMESTAMPS: u8 = 8;
}

/// A view of a TCP segment. TCP has no length field: the buffer must be exactly the
/// segment (the IP payload), since the checksum and pseudo-header cover all of it.
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Wraps without validation; getters may panic on a short buffer.
    #[inline]
    pub fn new_unchecked(buffer: T) -> Self {
        TcpPacket { buffer }
    }

    /// Wraps after checking the fixed header is present (`Truncated`), the data offset is
    /// at least 5 (`BadLength`) and the options fit in the buffer (`Truncated`). Options
    /// are validated lazily by [`TcpPacket::options_iter`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let p = TcpPacket { buffer };
        if p.header_len() < MIN_HEADER_LEN {
            return Err(WireError::BadLength);
        }
        if p.header_len() > p.buffer.as_ref().len() {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }

    /// The wrapped buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 0)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }

    /// Sequence number.
    #[inline]
    pub fn seq_number(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 4)
    }

    /// Acknowledgment number (meaningful when ACK is set).
    #[inline]
    pub fn ack_number(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }

    /// Data offset in 32-bit words.
    #[inline]
    pub fn data_offset(&self) -> u8 {
        self.buffer.as_ref()[12] >> 4
    }

    /// Header length in bytes (data offset × 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.data_offset()) * 4
    }

    /// The control bits (see [`flags`]).
    #[inline]
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[13]
    }

    /// FIN set.
    #[inline]
    pub fn fin(&self) -> bool {
        self.flags() & flags::FIN != 0
    }

    /// SYN set.
    #[inline]
    pub fn syn(&self) -> bool {
        self.flags() & flags::SYN != 0
    }

    /// RST set.
    #[inline]
    pub fn rst(&self) -> bool {
        self.flags() & flags::RST != 0
    }

    /// PSH set.
    #[inline]
    pub fn psh(&self) -> bool {
        self.flags() & flags::PSH != 0
    }

    /// ACK set.
    #[inline]
    pub fn ack(&self) -> bool {
        self.flags() & flags::ACK != 0
    }

    /// URG set.
    #[inline]
    pub fn urg(&self) -> bool {
        self.flags() & flags::URG != 0
    }

    /// Receive window (unscaled).
    #[inline]
    pub fn window(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 14)
    }

    /// Checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 16)
    }

    /// Urgent pointer (meaningful when URG is set).
    #[inline]
    pub fn urgent_ptr(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 18)
    }

    /// Raw option bytes, padding included.
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()]
    }

    /// Decoded options.
    #[inline]
    pub fn options_iter(&self) -> TcpOptionIter<'_> {
        TcpOptionIter::new(self.options())
    }

    /// The timestamps option's (TSval, TSecr), if the segment carries one
    /// (see [`timestamps`]).
    #[inline]
    pub fn timestamps(&self) -> Option<(u32, u32)> {
        timestamps(self.options())
    }

    /// Segment data.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// Whether the checksum over pseudo-header and segment verifies (RFC 9293 §3.1).
    #[inline]
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        self.sum(src, dst) == 0xffff
    }

    /// Segments over 64 KiB cannot occur in IPv4; their length would wrap here.
    #[inline]
    fn sum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> u16 {
        let b = self.buffer.as_ref();
        checksum::add(
            checksum::pseudo_header_sum(src, dst, protocol::TCP, b.len() as u16),
            checksum::sum(b),
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    /// Sets the source port.
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 0, v);
    }

    /// Sets the destination port.
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 2, v);
    }

    /// Sets the sequence number.
    #[inline]
    pub fn set_seq_number(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 4, v);
    }

    /// Sets the acknowledgment number.
    #[inline]
    pub fn set_ack_number(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 8, v);
    }

    /// Sets the data offset from a header length in bytes (a multiple of 4), clearing
    /// the reserved bits.
    #[inline]
    pub fn set_header_len(&mut self, len: usize) {
        self.buffer.as_mut()[12] = data_offset(len);
    }

    /// Sets all control bits.
    #[inline]
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[13] = v;
    }

    /// Sets the window.
    #[inline]
    pub fn set_window(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 14, v);
    }

    /// Sets the checksum field as is.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 16, v);
    }

    /// Sets the urgent pointer.
    #[inline]
    pub fn set_urgent_ptr(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 18, v);
    }

    /// Mutable option bytes.
    #[inline]
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[MIN_HEADER_LEN..hl]
    }

    /// Mutable segment data.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[hl..]
    }

    /// Computes and stores the checksum.
    #[inline]
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let c = !self.sum(src, dst);
        self.set_checksum(c);
    }
}

/// One TCP option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpOption<'a> {
    /// End of option list (kind 0); the rest of the option space is padding.
    EndOfList,
    /// No-operation (kind 1), used to align later options.
    NoOp,
    /// Maximum segment size (kind 2, RFC 9293 §3.7.1).
    Mss(u16),
    /// Window scale shift count (kind 3, RFC 7323 §2).
    WindowScale(u8),
    /// SACK permitted (kind 4, RFC 2018 §2).
    SackPermitted,
    /// SACK blocks as (left edge, right edge), the present ones first (kind 5,
    /// RFC 2018 §3).
    Sack([Option<(u32, u32)>; MAX_SACK_BLOCKS]),
    /// Timestamps (kind 8, RFC 7323 §3).
    Timestamps {
        /// Sender's timestamp clock.
        tsval: u32,
        /// Echo of the peer's most recent TSval.
        tsecr: u32,
    },
    /// Any other kind, skipped by its length byte (RFC 9293 §3.2: unknown options must
    /// be ignored).
    Unknown {
        /// Option kind.
        kind: u8,
        /// Bytes after kind and length.
        data: &'a [u8],
    },
}

impl TcpOption<'_> {
    /// Encoded length (without padding).
    pub fn buffer_len(&self) -> usize {
        match self {
            TcpOption::EndOfList | TcpOption::NoOp => 1,
            TcpOption::Mss(_) => 4,
            TcpOption::WindowScale(_) => 3,
            TcpOption::SackPermitted => 2,
            TcpOption::Sack(blocks) => 2 + 8 * blocks.iter().flatten().count(),
            TcpOption::Timestamps { .. } => 10,
            TcpOption::Unknown { data, .. } => 2 + data.len(),
        }
    }

    /// An option the parser would read back differently is not emitted.
    fn is_valid(&self) -> bool {
        match self {
            TcpOption::Sack(blocks) => blocks.iter().flatten().count() > 0,
            TcpOption::Unknown { kind: k, data } => {
                !matches!(
                    *k,
                    kind::EOL
                        | kind::NOP
                        | kind::MSS
                        | kind::WINDOW_SCALE
                        | kind::SACK_PERMITTED
                        | kind::SACK
                        | kind::TIMESTAMPS
                ) && data.len() <= MAX_OPTIONS_LEN - 2
            }
            _ => true,
        }
    }

    /// Writes into the front of `buf`, which must hold [`TcpOption::buffer_len`] bytes.
    fn emit(&self, buf: &mut [u8]) {
        let len = self.buffer_len();
        if len > 1 {
            buf[1] = len as u8;
        }
        buf[0] = match *self {
            TcpOption::EndOfList => kind::EOL,
            TcpOption::NoOp => kind::NOP,
            TcpOption::Mss(v) => {
                set_u16(buf, 2, v);
                kind::MSS
            }
            TcpOption::WindowScale(v) => {
                buf[2] = v;
                kind::WINDOW_SCALE
            }
            TcpOption::SackPermitted => kind::SACK_PERMITTED,
            TcpOption::Sack(blocks) => {
                for (i, (l, r)) in blocks.iter().flatten().enumerate() {
                    set_u32(buf, 2 + 8 * i, *l);
                    set_u32(buf, 6 + 8 * i, *r);
                }
                kind::SACK
            }
            TcpOption::Timestamps { tsval, tsecr } => {
                set_u32(buf, 2, tsval);
                set_u32(buf, 6, tsecr);
                kind::TIMESTAMPS
            }
            TcpOption::Unknown { kind, data } => {
                buf[2..len].copy_from_slice(data);
                kind
            }
        };
    }
}

/// The timestamps option's (TSval, TSecr) in option bytes `o`, if there is
/// one (RFC 7323 §3). The layout of RFC 7323 Appendix A (NOP, NOP, then the
/// option), which nearly every sender uses, is read without a scan; the
/// first well-formed one counts, and malformed options hide the rest.
pub fn timestamps(o: &[u8]) -> Option<(u32, u32)> {
    if o.len() >= 12 && o[..4] == [kind::NOP, kind::NOP, kind::TIMESTAMPS, 10] {
        return Some((get_u32(o, 4), get_u32(o, 8)));
    }
    TcpOptionIter::new(o)
        .map_while(Result::ok)
        .find_map(|opt| match opt {
            TcpOption::Timestamps { tsval, tsecr } => Some((tsval, tsecr)),
            _ => None,
        })
}

/// Encodes `opts` into the front of `buf`, zero-padded (EOL) to a multiple of 4 bytes,
/// and returns the padded length — ready for [`TcpRepr::options`].
///
/// `BadOption` if the options exceed the 40-byte option space, a SACK has no blocks or
/// an `Unknown` uses a known kind; `Truncated` if `buf` is too short.
pub fn write_options(opts: &[TcpOption], buf: &mut [u8]) -> Result<usize, WireError> {
    let len: usize = opts.iter().map(TcpOption::buffer_len).sum();
    let padded = len.next_multiple_of(4);
    if padded > MAX_OPTIONS_LEN || !opts.iter().all(TcpOption::is_valid) {
        return Err(WireError::BadOption);
    }
    let buf = buf.get_mut(..padded).ok_or(WireError::Truncated)?;
    let mut at = 0;
    for o in opts {
        o.emit(&mut buf[at..]);
        at += o.buffer_len();
    }
    buf[at..].fill(0);
    Ok(padded)
}

/// Iterator over encoded TCP options (RFC 9293 §3.2). Stops after
/// [`TcpOption::EndOfList`]; yields `Err(BadOption)` once and stops on a length byte
/// that is missing, below 2, past the option space, or wrong for a known kind.
#[derive(Debug, Clone)]
pub struct TcpOptionIter<'a> {
    data: &'a [u8],
}

impl<'a> TcpOptionIter<'a> {
    /// Iterates over raw option bytes.
    pub fn new(data: &'a [u8]) -> Self {
        TcpOptionIter { data }
    }

    fn fail(&mut self) -> Option<Result<TcpOption<'a>, WireError>> {
        self.data = &[];
        Some(Err(WireError::BadOption))
    }
}

impl<'a> Iterator for TcpOptionIter<'a> {
    type Item = Result<TcpOption<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        let d = self.data;
        match *d.first()? {
            kind::EOL => {
                self.data = &[];
                return Some(Ok(TcpOption::EndOfList));
            }
            kind::NOP => {
                self.data = &d[1..];
                return Some(Ok(TcpOption::NoOp));
            }
            _ => {}
        }
        let len = match d.get(1) {
            Some(&l) if l >= 2 && usize::from(l) <= d.len() => usize::from(l),
            _ => return self.fail(),
        };
        let (k, body) = (d[0], &d[2..len]);
        self.data = &d[len..];
        let opt = match (k, body.len()) {
            (kind::MSS, 2) => TcpOption::Mss(get_u16(body, 0)),
            (kind::WINDOW_SCALE, 1) => TcpOption::WindowScale(body[0]),
            (kind::SACK_PERMITTED, 0) => TcpOption::SackPermitted,
            (kind::SACK, n) if n & 7 == 0 && (1..=MAX_SACK_BLOCKS).contains(&(n / 8)) => {
                let mut blocks = [None; MAX_SACK_BLOCKS];
                for (i, b) in blocks.iter_mut().take(n / 8).enumerate() {
                    *b = Some((get_u32(body, 8 * i), get_u32(body, 8 * i + 4)));
                }
                TcpOption::Sack(blocks)
            }
            (kind::TIMESTAMPS, 8) => TcpOption::Timestamps {
                tsval: get_u32(body, 0),
                tsecr: get_u32(body, 4),
            },
            (
                kind::MSS
                | kind::WINDOW_SCALE
                | kind::SACK_PERMITTED
                | kind::SACK
                | kind::TIMESTAMPS,
                _,
            ) => return self.fail(),
            (kind, _) => TcpOption::Unknown { kind, data: body },
        };
        Some(Ok(opt))
    }
}

/// A TCP segment to emit or as parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpRepr<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq_number: u32,
    /// Acknowledgment number.
    pub ack_number: u32,
    /// Control bits (see [`flags`]).
    pub flags: u8,
    /// Window.
    pub window: u16,
    /// Urgent pointer.
    pub urgent_ptr: u16,
    /// Encoded options (see [`write_options`]); zero-padded to 4 bytes on emit.
    pub options: &'a [u8],
    /// Segment data.
    pub payload: &'a [u8],
}

impl<'a> TcpRepr<'a> {
    /// Reads a checked segment, verifying the checksum against the addresses of the
    /// enclosing IPv4 header (`BadChecksum`). Options are returned raw.
    pub fn parse<T: AsRef<[u8]>>(
        p: &'a TcpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> Result<Self, WireError> {
        if !p.verify_checksum(src, dst) {
            return Err(WireError::BadChecksum);
        }
        Ok(Self::parse_verified(p))
    }

    /// Reads a checked segment whose checksum is known good already (verified
    /// below, as a receive offload does), without verifying it again.
    pub fn parse_verified<T: AsRef<[u8]>>(p: &'a TcpPacket<T>) -> Self {
        TcpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq_number: p.seq_number(),
            ack_number: p.ack_number(),
            flags: p.flags(),
            window: p.window(),
            urgent_ptr: p.urgent_ptr(),
            options: p.options(),
            payload: p.payload(),
        }
    }

    /// Header length, options padded.
    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN + self.options.len().next_multiple_of(4)
    }

    /// Header plus data.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len()
    }

    /// Writes the segment, checksum included, into the front of `buf`. `BadOption` if
    /// the options exceed 40 bytes, `BadLength` if the segment exceeds 65535 bytes,
    /// `Truncated` if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) -> Result<(), WireError> {
        let (hl, len) = self.lengths(self.payload.len())?;
        let buf = buf
            .get_mut(..usize::from(len))
            .ok_or(WireError::Truncated)?;
        let header = self.write_header(buf, hl);
        // Copy once, checksum in the copy: the payload's sum comes from the
        // copy itself (it starts at an even offset, so the sums simply add).
        let payload = checksum::copy_and_sum(&mut buf[hl..], self.payload);
        Self::finish(buf, len, header, payload, src, dst);
        Ok(())
    }

    /// Writes the header alone into the front of `buf`, for a segment whose
    /// `payload_len` bytes of data stay elsewhere (gathered from a send buffer
    /// when the frame is sent): `payload_sum` is their sum ([`checksum::sum`],
    /// from an even offset). `self.payload` is not looked at. Returns the header
    /// length; errors as [`TcpRepr::emit`].
    pub fn emit_header(
        &self,
        buf: &mut [u8],
        src: Ipv4Addr,
        dst: Ipv4Addr,
        payload_len: usize,
        payload_sum: u16,
    ) -> Result<usize, WireError> {
        let (hl, len) = self.lengths(payload_len)?;
        let buf = buf.get_mut(..hl).ok_or(WireError::Truncated)?;
        let header = self.write_header(buf, hl);
        Self::finish(buf, len, header, payload_sum, src, dst);
        Ok(hl)
    }

    /// The header length and the segment's, for `payload_len` bytes of data.
    fn lengths(&self, payload_len: usize) -> Result<(usize, u16), WireError> {
        let hl = self.header_len();
        if hl > MAX_HEADER_LEN {
            return Err(WireError::BadOption);
        }
        let len = u16::try_from(hl + payload_len).map_err(|_| WireError::BadLength)?;
        Ok((hl, len))
    }

    /// Fills in the header's fields and options (`hl` bytes in all, padded),
    /// the checksum zero; returns the header's sum ([`checksum::sum`]).
    ///
    /// The fixed header (RFC 9293 §3.1) goes as its five 32-bit words, and
    /// the header is summed as 32-bit numbers, the fixed part before it is
    /// written: [`checksum::fold`] reduces them to the sum of their 16-bit
    /// halves.
    fn write_header(&self, buf: &mut [u8], hl: usize) -> u16 {
        let words = [
            (u32::from(self.src_port) << 16) | u32::from(self.dst_port),
            self.seq_number,
            self.ack_number,
            (u32::from(data_offset(hl)) << 24)
                | (u32::from(self.flags) << 16)
                | u32::from(self.window),
            // The checksum, zero, then the urgent pointer.
            u32::from(self.urgent_ptr),
        ];
        let (fixed, opts) = buf[..hl].split_at_mut(MIN_HEADER_LEN);
        set_words(fixed, &words);
        let (given, padding) = opts.split_at_mut(self.options.len());
        given.copy_from_slice(self.options);
        // Options are mostly whole words: no call to fill nothing.
        if !padding.is_empty() {
            padding.fill(0);
        }
        let sum: u64 = words.iter().map(|&w| u64::from(w)).sum();
        checksum::fold(sum + checksum::add_words(opts))
    }

    /// Stores the checksum over the pseudo-header, a header summing to
    /// `header` at the front of `b` and data summing to `payload`.
    fn finish(b: &mut [u8], len: u16, header: u16, payload: u16, src: Ipv4Addr, dst: Ipv4Addr) {
        let sum = [
            checksum::pseudo_header_sum(src, dst, protocol::TCP, len),
            header,
            payload,
        ]
        .into_iter()
        .fold(0, checksum::add);
        TcpPacket::new_unchecked(b).set_checksum(!sum);
    }
}

/// The data offset byte from a header length in bytes (a multiple of 4), the
/// reserved bits clear.
#[inline]
fn data_offset(header_len: usize) -> u8 {
    ((header_len / 4) as u8) << 4
}

/// How a TCP listener's SYNs are answered below the application, with SYN
/// cookies the listener's stack takes back: what the stack asks of the
/// multiplexer (`exonet_shm`'s `AnswerSyns`) and the multiplexer of the link
/// (`exonet_link::SynListener`, with the listener's address and port).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SynAnswers {
    /// The SipHash key of the listener's cookies and timestamp offsets.
    pub key: [u8; 16],
    /// When the listener's clock reads zero, on the monotonic clock (ns).
    pub epoch: u64,
    /// The MSS the SYN-ACK offers.
    pub mss: u16,
    /// The SYN-ACK's window field.
    pub window: u16,
    /// The window scale the SYN-ACK offers, if any.
    pub wscale: Option<u8>,
    /// Whether the SYN-ACK permits SACK.
    pub sack: bool,
    /// The IPv4 TTL of the SYN-ACK.
    pub ttl: u8,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const B: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);

    fn collect(bytes: &[u8]) -> Vec<Result<TcpOption<'_>, WireError>> {
        TcpOptionIter::new(bytes).collect()
    }

    #[test]
    fn options_round_trip() {
        let opts = [
            TcpOption::Mss(1460),
            TcpOption::SackPermitted,
            TcpOption::Timestamps {
                tsval: 1,
                tsecr: 0xdead_beef,
            },
            TcpOption::NoOp,
            TcpOption::WindowScale(7),
            TcpOption::Unknown {
                kind: 30,
                data: &[1, 2],
            },
        ];
        let mut buf = [0xffu8; 40];
        let n = write_options(&opts, &mut buf).unwrap();
        assert_eq!(n, 24);
        let got: Vec<_> = TcpOptionIter::new(&buf[..n]).map(Result::unwrap).collect();
        assert_eq!(got, opts);
        // Padding after the last option reads as End of Option List.
        let n = write_options(&opts[..4], &mut buf).unwrap();
        assert_eq!(n, 20);
        assert_eq!(
            collect(&buf[..n]).pop().unwrap().unwrap(),
            TcpOption::EndOfList
        );

        let sack = TcpOption::Sack([Some((1, 2)), Some((3, 4)), Some((5, 6)), Some((7, 8))]);
        let n = write_options(&[TcpOption::NoOp, TcpOption::NoOp, sack], &mut buf).unwrap();
        assert_eq!(n, 36);
        assert_eq!(collect(&buf[..n])[2].as_ref().unwrap(), &sack);
    }

    proptest! {
        /// The header written and summed as words is the one the setters
        /// write, its checksum the complement of the sum of the bytes.
        #[test]
        fn emit_writes_what_the_setters_write(
            words in proptest::array::uniform5(any::<u32>()),
            f in any::<u8>(),
            options in proptest::collection::vec(any::<u8>(), 0..41),
            payload in proptest::collection::vec(any::<u8>(), 0..100),
        ) {
            let repr = TcpRepr {
                src_port: words[0] as u16,
                dst_port: (words[0] >> 16) as u16,
                seq_number: words[1],
                ack_number: words[2],
                flags: f,
                window: words[3] as u16,
                urgent_ptr: words[4] as u16,
                options: &options,
                payload: &payload,
            };
            let mut got = vec![0xaa; repr.buffer_len()];
            repr.emit(&mut got, A, B).unwrap();
            let mut want = vec![0xaa; repr.buffer_len()];
            let mut p = TcpPacket::new_unchecked(&mut want[..]);
            p.set_src_port(repr.src_port);
            p.set_dst_port(repr.dst_port);
            p.set_seq_number(repr.seq_number);
            p.set_ack_number(repr.ack_number);
            p.set_header_len(repr.header_len());
            p.set_flags(f);
            p.set_window(repr.window);
            p.set_urgent_ptr(repr.urgent_ptr);
            let opts = p.options_mut();
            opts[..options.len()].copy_from_slice(&options);
            opts[options.len()..].fill(0);
            p.payload_mut().copy_from_slice(&payload);
            p.set_checksum(0);
            let len = want.len() as u16;
            let sum = checksum::add(
                checksum::pseudo_header_sum(A, B, protocol::TCP, len),
                checksum::sum_reference(&want),
            );
            TcpPacket::new_unchecked(&mut want[..]).set_checksum(!sum);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn header_alone_matches_the_whole_segment() {
        let opts = [0x01, 0x01, 0x08, 0x0a, 0, 0, 0, 1, 0, 0, 0, 2];
        for n in [0usize, 1, 7, 1448] {
            let payload: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
            let repr = TcpRepr {
                src_port: 1,
                dst_port: 2,
                seq_number: 3,
                ack_number: 4,
                flags: flags::ACK | flags::PSH,
                window: 5,
                urgent_ptr: 0,
                options: &opts,
                payload: &payload,
            };
            let mut whole = vec![0u8; repr.buffer_len()];
            repr.emit(&mut whole, A, B).unwrap();
            let mut head = [0u8; 60];
            let hl = repr
                .emit_header(&mut head, A, B, n, checksum::sum(&payload))
                .unwrap();
            assert_eq!(hl, 32);
            assert_eq!(&head[..hl], &whole[..hl]);
            // A header too short for the buffer is refused, not cut.
            assert!(matches!(
                repr.emit_header(&mut head[..31], A, B, n, 0),
                Err(WireError::Truncated)
            ));
        }
    }

    #[test]
    fn writer_rejects() {
        let mut buf = [0u8; 40];
        let five = [TcpOption::Timestamps { tsval: 0, tsecr: 0 }; 5];
        assert!(matches!(
            write_options(&five, &mut buf),
            Err(WireError::BadOption)
        ));
        assert!(matches!(
            write_options(&[TcpOption::Sack([None; 4])], &mut buf),
            Err(WireError::BadOption)
        ));
        assert!(matches!(
            write_options(
                &[TcpOption::Unknown {
                    kind: 2,
                    data: &[0, 0]
                }],
                &mut buf
            ),
            Err(WireError::BadOption)
        ));
        assert!(matches!(
            write_options(&[TcpOption::Mss(1)], &mut buf[..3]),
            Err(WireError::Truncated)
        ));
    }

    #[test]
    fn malformed_options() {
        for bad in [
            &[2u8][..],
            &[2, 4, 0],
            &[2, 1, 0, 0],
            &[2, 3, 0, 0],
            &[3, 4, 0, 0],
            &[5, 2],
            &[5, 6, 0, 0, 0, 0],
            &[8, 6, 0, 0, 0, 0],
            &[99, 0],
            &[99, 9, 0],
        ] {
            let r = collect(bad);
            assert!(
                matches!(r.last(), Some(Err(WireError::BadOption))),
                "{bad:?}: {r:?}"
            );
        }
        // Unknown kinds are skipped by length; parsing continues after them.
        assert_eq!(collect(&[99, 3, 7, 1, 0, 5]).len(), 3);
        assert_eq!(collect(&[1, 1, 0, 2, 1]).len(), 3);
    }

    #[test]
    fn segment_round_trip_and_checks() {
        let mut ob = [0; 40];
        let n = write_options(&[TcpOption::Mss(536), TcpOption::WindowScale(2)], &mut ob).unwrap();
        let r = TcpRepr {
            src_port: 40000,
            dst_port: 80,
            seq_number: 0x0102_0304,
            ack_number: 0xa0b0_c0d0,
            flags: flags::SYN | flags::ACK,
            window: 65535,
            urgent_ptr: 0,
            options: &ob[..n],
            payload: b"data",
        };
        let mut buf = vec![0; r.buffer_len()];
        r.emit(&mut buf, A, B).unwrap();
        let p = TcpPacket::new_checked(&buf[..]).unwrap();
        assert!(p.syn() && p.ack() && !p.fin() && !p.rst() && !p.psh() && !p.urg());
        assert_eq!((p.header_len(), p.payload()), (28, &b"data"[..]));
        assert_eq!(TcpRepr::parse(&p, A, B).unwrap(), r);
        assert!(matches!(
            TcpRepr::parse(&p, A, A),
            Err(WireError::BadChecksum)
        ));

        let mut bad = buf.clone();
        bad[12] = 0x40;
        assert!(matches!(
            TcpPacket::new_checked(&bad[..]),
            Err(WireError::BadLength)
        ));
        bad[12] = 0xf0;
        assert!(matches!(
            TcpPacket::new_checked(&bad[..]),
            Err(WireError::Truncated)
        ));
        assert!(matches!(
            TcpPacket::new_checked(&buf[..19]),
            Err(WireError::Truncated)
        ));
        let long = [1u8; 41];
        assert!(matches!(
            TcpRepr {
                options: &long,
                ..r
            }
            .emit(&mut [0; 100], A, B),
            Err(WireError::BadOption)
        ));
    }
}
