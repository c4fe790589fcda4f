//! The one error type shared by every parser, emitter and capture-file reader.

use std::fmt;
use std::io;

/// Why a buffer, header or capture file was rejected.
///
/// Parsers return these instead of panicking so that hostile input (from the wire or
/// from a file) can at worst be dropped.
#[derive(Debug)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends before the header, or before the length a header field declares.
    Truncated,
    /// The IP version field is not 4.
    BadVersion,
    /// A length field is inconsistent (below its minimum, larger than its container,
    /// or a value that does not fit the field when emitting).
    BadLength,
    /// A checksum does not verify.
    BadChecksum,
    /// A TCP option is malformed (bad length byte, or too many options to emit).
    BadOption,
    /// A capture file is not pcap/pcapng (unknown magic) or is structurally
    /// inconsistent (e.g. a packet on an undeclared pcapng interface).
    BadFormat,
    /// Text that is not a MAC address.
    BadAddress,
    /// Well-formed but outside what this crate handles (e.g. non-Ethernet/IPv4 ARP,
    /// a non-Ethernet capture, or more VLAN tags than supported).
    Unsupported,
    /// An I/O error other than a premature end of file (which is [`WireError::Truncated`]).
    Io(io::Error),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated buffer"),
            WireError::BadVersion => f.write_str("bad IP version"),
            WireError::BadLength => f.write_str("inconsistent length field"),
            WireError::BadChecksum => f.write_str("bad checksum"),
            WireError::BadOption => f.write_str("malformed option"),
            WireError::BadFormat => f.write_str("malformed capture file"),
            WireError::BadAddress => f.write_str("invalid address syntax"),
            WireError::Unsupported => f.write_str("unsupported packet or file format"),
            WireError::Io(e) => write!(f, "I/O error: {e}"),
        }
    }
}

impl std::error::Error for WireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WireError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// A short read means the file was cut off; anything else is a real I/O failure.
impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            WireError::Truncated
        } else {
            WireError::Io(e)
        }
    }
}
