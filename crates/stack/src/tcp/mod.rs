//! TCP (RFC 9293) as a sans-IO core: a [`Connection`] is one transmission control
//! block, fed parsed segments and the time, and asked for segments to send and for
//! its next deadline. Nothing here reads a clock or does I/O, so tests run whole
//! connections over a simulated network in simulated time.
//!
//! What is here: the state machine of RFC 9293 §3.3.2 with active, passive and
//! simultaneous open and close, half-close, RST and SYN handling hardened per
//! RFC 5961 §3–§5 with the ACK limit of §7, ISNs per RFC 6528
//! ([`initial_sequence_number`]), the MSS option, window scaling (RFC 7323 §2),
//! timestamps (RFC 7323 §3–§5: negotiated on the SYNs, TS.Recent echoed per §4.3,
//! an RTT sample from every ACK of new data with §4.2's alpha and beta divided by
//! the samples expected per window, PAWS with §5.5's 24-day expiry of TS.Recent; the
//! clock is the caller's `now` in milliseconds plus a per-connection offset,
//! [`timestamp_offset`]), retransmission with the RFC 6298 timer, zero-window
//! probing, keep-alive, delayed ACKs and Nagle's algorithm (all switchable), and
//! congestion control ([`Congestion`]: RFC 5681 NewReno, or CUBIC per RFC 9438 with
//! its Reno-friendly region and fast convergence, the default): slow start, fast
//! retransmit with Limited Transmit (RFC 3042), SACK (RFC 2018: negotiated, blocks
//! sent newest first for out-of-order data, a scoreboard driving RFC 6675 loss
//! recovery with IsLost, NextSeg and pipe, stale or forged blocks ignored) and,
//! without SACK, NewReno recovery (RFC 6582), and receive-buffer auto-tuning
//! (Linux's dynamic right-sizing: the buffer grows towards
//! [`TcpConfig::recv_buffer_max`] while the application keeps up, the window scale
//! chosen for that ceiling), and header prediction (Van Jacobson's fast path for
//! the common segment in ESTABLISHED, [`TcpConfig::header_prediction`], checked
//! against the general path by a property test). Not yet: RFC 6675's optional rescue
//! retransmission, D-SACK (RFC 2883), HyStart, and the sockets over the multiplexer. Of RFC
//! 7323, a non-RST segment without timestamps on a connection that agreed to them
//! is taken rather than dropped (§3.2's SHOULD; Linux takes it too), and a RST
//! carries no timestamps (§3.2 allows either).

mod cc;
mod connection;
mod isn;
mod recv;
mod rtt;
mod seq;

#[cfg(test)]
mod tests;

pub use cc::Congestion;
pub use connection::{
    reset_for_closed, Connection, Keepalive, TcpConfig, TcpError, TcpState, TcpStats,
};
pub use isn::{initial_sequence_number, timestamp_offset};
pub use seq::SeqNum;
