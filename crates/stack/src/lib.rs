//! The protocol library (Thekkath et al., "Implementing Network Protocols at User
//! Level"): sans-IO protocol cores in the style of smoltcp and quinn-proto. They take
//! a frame, and the current [`Time`] where it matters, and return typed results,
//! events and frames to send. Nothing here does I/O or reads a clock, so tests drive
//! them with simulated time.
//!
//! The cores: IPv4 input checks ([`ipv4_rx`]), fragmentation ([`frag`]) and
//! reassembly ([`reasm`]), ICMP ([`icmp`]), UDP ([`udp`]), TCP connections
//! ([`tcp`]), the neighbour cache ([`arp`]) and a hierarchical timing wheel
//! ([`timer`]). The [`socket`] module runs
//! them over an endpoint of the multiplexer: [`Stack`], [`UdpSocket`],
//! [`IcmpSocket`] and [`Poll`].
// Only the socket layer touches shared memory, each block with its reason.
#![deny(unsafe_code)]

pub mod arp;
pub mod frag;
pub mod icmp;
pub mod ipv4_rx;
pub mod reasm;
pub mod socket;
pub mod tcp;
pub mod time;
pub mod timer;
pub mod udp;

pub use frag::{fragment, FragError};
pub use reasm::{DropCause, ReasmConfig, ReasmStats, Reassembler};
pub use socket::{
    Echo, Event, Events, IcmpSocket, Interest, Multiplexer, Poll, Stack, StackConfig, StackStats,
    TcpInfo, TcpListener, TcpStream, Token, UdpSocket, Window, MAX_WINDOW,
};
pub use time::Time;
pub use timer::{TimerId, TimerWheel};
