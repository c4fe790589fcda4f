//! The protocol library: sans-IO cores (as in smoltcp or quinn-proto) that take a
//! frame, and the time where it matters, and return typed results, events and frames
//! to send. No I/O and no clock reads inside, so tests drive them directly.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod icmp;
pub mod ipv4_rx;
pub mod udp;
