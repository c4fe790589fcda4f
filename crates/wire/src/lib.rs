//! Zero-copy frame views and builders for user-level networking.
//!
//! Each protocol module follows the smoltcp pattern: a view `XPacket<T: AsRef<[u8]>>`
//! wraps a buffer without copying, `new_checked` validates every length the getters rely
//! on (so a checked view never panics), getters decode big-endian fields in place and
//! setters exist when `T: AsMut<[u8]>`. Small `Repr` structs emit complete headers
//! (with checksums) and parse them back; [`build`] assembles whole frames for tests and
//! benchmarks; [`pcap`] reads and writes capture files.
//!
//! ```
//! use exonet_wire::{build, EthernetFrame, Ipv4Packet, UdpPacket, MacAddr, WireError};
//! use exonet_wire::ethernet::ethertype;
//!
//! let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
//! let frame = build::udp_frame(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr::BROADCAST, a, b, 68, 67, b"hi");
//!
//! let eth = EthernetFrame::new_checked(&frame[..])?;
//! assert_eq!(eth.ethertype(), ethertype::IPV4);
//! let ip = Ipv4Packet::new_checked(eth.payload())?;
//! let udp = UdpPacket::new_checked(ip.payload())?;
//! assert!(ip.verify_checksum() && udp.verify_checksum(ip.src_addr(), ip.dst_addr()));
//! assert_eq!((udp.dst_port(), udp.payload()), (67, &b"hi"[..]));
//!
//! // Truncated input is an error, not a panic.
//! assert!(matches!(Ipv4Packet::new_checked(&eth.payload()[..10]), Err(WireError::Truncated)));
//! # Ok::<(), WireError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arp;
pub mod build;
pub mod checksum;
mod error;
pub mod ethernet;
pub mod field;
pub mod icmp;
pub mod ipv4;
pub mod pcap;
pub mod rng;
pub mod tcp;
pub mod tso;
pub mod udp;

pub use arp::{ArpPacket, ArpRepr};
pub use error::WireError;
pub use ethernet::{EthernetFrame, EthernetRepr, MacAddr, VlanTag};
pub use icmp::{IcmpPacket, IcmpRepr};
pub use ipv4::{Ipv4Addr, Ipv4Packet, Ipv4Repr};
pub use tcp::{TcpOption, TcpOptionIter, TcpPacket, TcpRepr};
pub use udp::{UdpPacket, UdpRepr};
