//! Capture files: classic pcap (the libpcap format) writer and reader, a pcapng reader
//! (draft-ietf-opsawg-pcapng), and [`read_frames`] which accepts either.
//!
//! Readers take untrusted files: every length is checked before use, a record or block
//! is never larger than [`MAX_RECORD_LEN`] (plus a bounded allowance for pcapng
//! options), and blocks that are skipped are streamed, not buffered.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;
use std::time::Duration;

use crate::WireError;

/// `LINKTYPE_ETHERNET`: records are Ethernet II frames.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Largest record accepted by the readers, so a corrupt length cannot make them
/// allocate gigabytes. Larger than any jumbo frame or TSO/GRO super-packet.
pub const MAX_RECORD_LEN: usize = 256 * 1024;
/// Default snapshot length: whole frames up to the IPv4 maximum.
pub const DEFAULT_SNAPLEN: u32 = 65_535;

const MAGIC_MICRO: u32 = 0xa1b2_c3d4;
const MAGIC_NANO: u32 = 0xa1b2_3c4d;
const PCAPNG_SHB: u32 = 0x0a0d_0d0a;
const PCAPNG_IDB: u32 = 1;
const PCAPNG_SPB: u32 = 3;
const PCAPNG_EPB: u32 = 6;
/// Option space allowed in a parsed pcapng block beyond its packet data.
const MAX_BLOCK_OPTIONS: usize = 64 * 1024;

/// Timestamp fraction unit of a classic pcap file, chosen by its magic number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TsResolution {
    /// Microseconds (magic 0xa1b2c3d4).
    Micro,
    /// Nanoseconds (magic 0xa1b23c4d).
    Nano,
}

/// One captured packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Capture time since the Unix epoch (zero for pcapng simple packets, which have none).
    pub ts: Duration,
    /// Length on the wire; `data` is shorter when the capture was truncated to snaplen.
    pub orig_len: u32,
    /// Link type of the interface it was captured on (see [`LINKTYPE_ETHERNET`]).
    pub linktype: u32,
    /// Captured bytes.
    pub data: Vec<u8>,
}

/// Writes a classic pcap file (little-endian, Ethernet link type).
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    w: W,
    res: TsResolution,
    snaplen: u32,
}

impl<W: Write> PcapWriter<W> {
    /// Microsecond timestamps, [`DEFAULT_SNAPLEN`]; writes the global header.
    pub fn new(w: W) -> Result<Self, WireError> {
        Self::with_options(w, TsResolution::Micro, DEFAULT_SNAPLEN)
    }

    /// Chosen resolution and snapshot length; writes the global header.
    pub fn with_options(mut w: W, res: TsResolution, snaplen: u32) -> Result<Self, WireError> {
        let magic = match res {
            TsResolution::Micro => MAGIC_MICRO,
            TsResolution::Nano => MAGIC_NANO,
        };
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&magic.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs stay 0: timestamps are UTC.
        h[16..20].copy_from_slice(&snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        w.write_all(&h)?;
        Ok(PcapWriter { w, res, snaplen })
    }

    /// Appends one frame captured at `ts` (since the Unix epoch), truncated to snaplen.
    /// `BadLength` if `ts` is past 2106 or the frame exceeds 4 GiB.
    pub fn write_packet(&mut self, ts: Duration, data: &[u8]) -> Result<(), WireError> {
        let secs = u32::try_from(ts.as_secs()).map_err(|_| WireError::BadLength)?;
        let frac = match self.res {
            TsResolution::Micro => ts.subsec_micros(),
            TsResolution::Nano => ts.subsec_nanos(),
        };
        let orig_len = u32::try_from(data.len()).map_err(|_| WireError::BadLength)?;
        let incl_len = orig_len.min(self.snaplen);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&secs.to_le_bytes());
        h[4..8].copy_from_slice(&frac.to_le_bytes());
        h[8..12].copy_from_slice(&incl_len.to_le_bytes());
        h[12..16].copy_from_slice(&orig_len.to_le_bytes());
        self.w.write_all(&h)?;
        self.w.write_all(&data[..incl_len as usize])?;
        Ok(())
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> Result<(), WireError> {
        Ok(self.w.flush()?)
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.w
    }
}

/// Reads a classic pcap file of either byte order and either timestamp resolution.
///
/// The byte order a capture file was written in; both readers read every
/// header field through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ByteOrder {
    Big,
    Little,
}

impl ByteOrder {
    fn u16(self, b: &[u8]) -> u16 {
        let b = [b[0], b[1]];
        match self {
            ByteOrder::Big => u16::from_be_bytes(b),
            ByteOrder::Little => u16::from_le_bytes(b),
        }
    }

    fn u32(self, b: &[u8]) -> u32 {
        let b = [b[0], b[1], b[2], b[3]];
        match self {
            ByteOrder::Big => u32::from_be_bytes(b),
            ByteOrder::Little => u32::from_le_bytes(b),
        }
    }
}

/// Iterates `Result<Record, WireError>`; after the first error it ends.
#[derive(Debug)]
pub struct PcapReader<R: Read> {
    r: R,
    order: ByteOrder,
    res: TsResolution,
    snaplen: u32,
    linktype: u32,
    done: bool,
}

impl<R: Read> PcapReader<R> {
    /// Reads the global header: `BadFormat` for an unknown magic, `Unsupported` for a
    /// major version other than 2, `Truncated` for a short file.
    pub fn new(mut r: R) -> Result<Self, WireError> {
        let mut magic = [0u8; 4];
        r.read_exact(&mut magic)?;
        Self::after_magic(magic, r)
    }

    fn after_magic(magic: [u8; 4], mut r: R) -> Result<Self, WireError> {
        let (order, res) = match (u32::from_le_bytes(magic), u32::from_be_bytes(magic)) {
            (MAGIC_MICRO, _) => (ByteOrder::Little, TsResolution::Micro),
            (MAGIC_NANO, _) => (ByteOrder::Little, TsResolution::Nano),
            (_, MAGIC_MICRO) => (ByteOrder::Big, TsResolution::Micro),
            (_, MAGIC_NANO) => (ByteOrder::Big, TsResolution::Nano),
            _ => return Err(WireError::BadFormat),
        };
        let mut h = [0u8; 20];
        r.read_exact(&mut h)?;
        let mut p = PcapReader {
            r,
            order,
            res,
            snaplen: 0,
            linktype: 0,
            done: false,
        };
        if p.order.u16(&h[0..2]) != 2 {
            return Err(WireError::Unsupported);
        }
        p.snaplen = p.order.u32(&h[12..16]);
        // The upper bits of this field carry FCS information, not the link type.
        p.linktype = p.order.u32(&h[16..20]) & 0xffff;
        Ok(p)
    }

    /// Link type of every record (see [`LINKTYPE_ETHERNET`]).
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    /// Snapshot length declared in the header.
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// Timestamp resolution declared by the magic.
    pub fn resolution(&self) -> TsResolution {
        self.res
    }

    fn read_record(&mut self) -> Result<Option<Record>, WireError> {
        let mut h = [0u8; 16];
        match read_full(&mut self.r, &mut h)? {
            0 => return Ok(None),
            16 => {}
            _ => return Err(WireError::Truncated),
        }
        let (secs, frac) = (self.order.u32(&h[0..4]), self.order.u32(&h[4..8]));
        let (incl_len, orig_len) = (
            self.order.u32(&h[8..12]) as usize,
            self.order.u32(&h[12..16]),
        );
        let nanos = match self.res {
            TsResolution::Micro if frac < 1_000_000 => frac * 1000,
            TsResolution::Nano if frac < 1_000_000_000 => frac,
            _ => return Err(WireError::BadLength),
        };
        if incl_len > MAX_RECORD_LEN {
            return Err(WireError::BadLength);
        }
        let mut data = vec![0; incl_len];
        self.r.read_exact(&mut data)?;
        Ok(Some(Record {
            ts: Duration::new(u64::from(secs), nanos),
            orig_len,
            linktype: self.linktype,
            data,
        }))
    }
}

impl<R: Read> Iterator for PcapReader<R> {
    type Item = Result<Record, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.read_record().transpose();
        // After an error the stream position is unknown: stop rather than yield garbage.
        self.done = !matches!(r, Some(Ok(_)));
        r
    }
}

/// One pcapng interface: what its packets' link type and timestamp unit are.
#[derive(Debug, Clone, Copy)]
struct Interface {
    linktype: u32,
    ticks_per_sec: u64,
}

/// Reads a pcapng file: Section Header, Interface Description, Enhanced Packet and
/// Simple Packet blocks; other blocks are skipped. Sections may differ in byte order.
///
/// Iterates `Result<Record, WireError>`; after the first error it ends.
#[derive(Debug)]
pub struct PcapngReader<R: Read> {
    r: R,
    order: ByteOrder,
    interfaces: Vec<Interface>,
    done: bool,
}

impl<R: Read> PcapngReader<R> {
    /// Reads the first Section Header Block: `BadFormat` if the file does not start
    /// with one or its byte-order magic is wrong.
    pub fn new(mut r: R) -> Result<Self, WireError> {
        let mut magic = [0u8; 4];
        r.read_exact(&mut magic)?;
        Self::after_magic(magic, r)
    }

    fn after_magic(magic: [u8; 4], r: R) -> Result<Self, WireError> {
        if u32::from_le_bytes(magic) != PCAPNG_SHB {
            return Err(WireError::BadFormat);
        }
        let mut p = PcapngReader {
            r,
            order: ByteOrder::Little,
            interfaces: Vec::new(),
            done: false,
        };
        let mut len = [0u8; 4];
        p.r.read_exact(&mut len)?;
        p.section_header(len)?;
        Ok(p)
    }

    /// The rest of a Section Header Block after its type; the byte-order magic that
    /// follows the length decides how the length (and the whole section) is read.
    fn section_header(&mut self, len: [u8; 4]) -> Result<(), WireError> {
        let mut bom_ver = [0u8; 8];
        self.r.read_exact(&mut bom_ver)?;
        self.order = match bom_ver[0..4] {
            [0x4d, 0x3c, 0x2b, 0x1a] => ByteOrder::Little,
            [0x1a, 0x2b, 0x3c, 0x4d] => ByteOrder::Big,
            _ => return Err(WireError::BadFormat),
        };
        let total = self.order.u32(&len) as usize;
        if total < 28 || total & 3 != 0 {
            return Err(WireError::BadLength);
        }
        if self.order.u16(&bom_ver[4..6]) != 1 {
            return Err(WireError::Unsupported);
        }
        self.interfaces.clear();
        // Section length, options and trailing length are not needed.
        skip(&mut self.r, total - 16)
    }

    fn read_record(&mut self) -> Result<Option<Record>, WireError> {
        loop {
            let mut h = [0u8; 8];
            match read_full(&mut self.r, &mut h)? {
                0 => return Ok(None),
                8 => {}
                _ => return Err(WireError::Truncated),
            }
            // The SHB type reads the same in both byte orders.
            if u32::from_le_bytes([h[0], h[1], h[2], h[3]]) == PCAPNG_SHB {
                self.section_header([h[4], h[5], h[6], h[7]])?;
                continue;
            }
            let (btype, total) = (self.order.u32(&h[0..4]), self.order.u32(&h[4..8]) as usize);
            if total < 12 || total & 3 != 0 {
                return Err(WireError::BadLength);
            }
            let body_len = total - 12;
            if !matches!(btype, PCAPNG_IDB | PCAPNG_EPB | PCAPNG_SPB) {
                skip(&mut self.r, body_len + 4)?;
                continue;
            }
            if body_len > MAX_RECORD_LEN + MAX_BLOCK_OPTIONS {
                return Err(WireError::BadLength);
            }
            let mut body = vec![0; body_len];
            self.r.read_exact(&mut body)?;
            skip(&mut self.r, 4)?;
            match btype {
                PCAPNG_IDB => self.interface(&body)?,
                PCAPNG_EPB => return self.enhanced_packet(body).map(Some),
                _ => return self.simple_packet(body).map(Some),
            }
        }
    }

    /// Interface Description Block: link type and the `if_tsresol` option (code 9).
    fn interface(&mut self, body: &[u8]) -> Result<(), WireError> {
        if body.len() < 8 {
            return Err(WireError::BadLength);
        }
        let mut iface = Interface {
            linktype: u32::from(self.order.u16(&body[0..2])),
            ticks_per_sec: 1_000_000,
        };
        let mut opts = &body[8..];
        while opts.len() >= 4 {
            let (code, len) = (
                self.order.u16(&opts[0..2]),
                usize::from(self.order.u16(&opts[2..4])),
            );
            let padded = 4 + len.next_multiple_of(4);
            if code == 0 || padded > opts.len() {
                break;
            }
            if code == 9 && len == 1 {
                let v = opts[4];
                iface.ticks_per_sec = if v & 0x80 == 0 {
                    10u64.checked_pow(u32::from(v))
                } else {
                    1u64.checked_shl(u32::from(v & 0x7f))
                }
                .ok_or(WireError::Unsupported)?;
            }
            opts = &opts[padded..];
        }
        self.interfaces.push(iface);
        Ok(())
    }

    fn iface(&self, id: u32) -> Result<Interface, WireError> {
        self.interfaces
            .get(id as usize)
            .copied()
            .ok_or(WireError::BadFormat)
    }

    fn enhanced_packet(&self, mut body: Vec<u8>) -> Result<Record, WireError> {
        if body.len() < 20 {
            return Err(WireError::BadLength);
        }
        let iface = self.iface(self.order.u32(&body[0..4]))?;
        let ticks = (u64::from(self.order.u32(&body[4..8])) << 32)
            | u64::from(self.order.u32(&body[8..12]));
        let cap_len = self.order.u32(&body[12..16]) as usize;
        let orig_len = self.order.u32(&body[16..20]);
        if cap_len > MAX_RECORD_LEN || cap_len > body.len() - 20 {
            return Err(WireError::BadLength);
        }
        let tps = iface.ticks_per_sec;
        let nanos = (u128::from(ticks % tps) * 1_000_000_000 / u128::from(tps)) as u32;
        body.truncate(20 + cap_len);
        body.drain(..20);
        Ok(Record {
            ts: Duration::new(ticks / tps, nanos),
            orig_len,
            linktype: iface.linktype,
            data: body,
        })
    }

    /// Simple Packet Block: interface 0, no timestamp; captured length is what fits.
    fn simple_packet(&self, mut body: Vec<u8>) -> Result<Record, WireError> {
        if body.len() < 4 {
            return Err(WireError::BadLength);
        }
        let iface = self.iface(0)?;
        let orig_len = self.order.u32(&body[0..4]);
        let cap_len = (orig_len as usize).min(body.len() - 4);
        if cap_len > MAX_RECORD_LEN {
            return Err(WireError::BadLength);
        }
        body.truncate(4 + cap_len);
        body.drain(..4);
        Ok(Record {
            ts: Duration::ZERO,
            orig_len,
            linktype: iface.linktype,
            data: body,
        })
    }
}

impl<R: Read> Iterator for PcapngReader<R> {
    type Item = Result<Record, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.read_record().transpose();
        // After an error the stream position is unknown: stop rather than yield garbage.
        self.done = !matches!(r, Some(Ok(_)));
        r
    }
}

/// A pcap or pcapng reader chosen by the file's magic number.
#[derive(Debug)]
pub enum CaptureReader<R: Read> {
    /// Classic pcap.
    Pcap(PcapReader<R>),
    /// pcapng.
    Pcapng(PcapngReader<R>),
}

impl<R: Read> CaptureReader<R> {
    /// Detects the format from the first four bytes (`BadFormat` if neither).
    pub fn new(mut r: R) -> Result<Self, WireError> {
        let mut magic = [0u8; 4];
        r.read_exact(&mut magic)?;
        if u32::from_le_bytes(magic) == PCAPNG_SHB {
            Ok(CaptureReader::Pcapng(PcapngReader::after_magic(magic, r)?))
        } else {
            Ok(CaptureReader::Pcap(PcapReader::after_magic(magic, r)?))
        }
    }
}

impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<Record, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            CaptureReader::Pcap(r) => r.next(),
            CaptureReader::Pcapng(r) => r.next(),
        }
    }
}

/// All frames of a pcap or pcapng file of Ethernet captures (`Unsupported` if a record
/// has another link type).
pub fn read_frames(path: impl AsRef<Path>) -> Result<Vec<Vec<u8>>, WireError> {
    let reader = CaptureReader::new(BufReader::new(File::open(path)?))?;
    reader
        .map(|rec| {
            let rec = rec?;
            if rec.linktype == LINKTYPE_ETHERNET {
                Ok(rec.data)
            } else {
                Err(WireError::Unsupported)
            }
        })
        .collect()
}

/// Reads until `buf` is full or end of file; returns the count, so a clean end of file
/// (0) can be told from a cut-off header.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, WireError> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}

/// Discards `n` bytes without buffering them (skipped blocks may be large).
fn skip<R: Read>(r: &mut R, n: usize) -> Result<(), WireError> {
    let want = n as u64;
    if io::copy(&mut r.take(want), &mut io::sink())? != want {
        return Err(WireError::Truncated);
    }
    Ok(())
}
