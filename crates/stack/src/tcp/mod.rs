//! TCP (RFC 9293) as a sans-IO core: a [`Connection`] is one transmission control
//! block, fed parsed segments and the time, and asked for segments to send and for
//! its next deadline. Nothing here reads a clock or does I/O, so tests run whole
//! connections over a simulated network in simulated time, with loss, duplication,
//! reordering, delay, bit corruption (caught by the checksum) and slow readers.
//!
//! What is here: the state machine of RFC 9293 §3.3.2 with active, passive and
//! simultaneous open and close, half-close, RST and SYN handling hardened per
//! RFC 5961 §3–§5 with the ACK limit of §7, ISNs per RFC 6528
//! ([`initial_sequence_number`]), SYN cookies per RFC 4987 §3.6 for a listener
//! whose SYN queue is full ([`syn_cookie_reply`], [`syn_cookie_accept`]: the MSS
//! in 3 bits of the ISS, window scale and SACK-permitted in the low bits of our
//! TSval when the SYN had timestamps, lost without them), the MSS option, window scaling (RFC 7323 §2),
//! timestamps (RFC 7323 §3–§5: negotiated on the SYNs, TS.Recent echoed per §4.3,
//! an RTT sample from every ACK of new data with §4.2's alpha and beta divided by
//! the samples expected per window, PAWS with §5.5's 24-day expiry of TS.Recent; the
//! clock is the caller's `now` in milliseconds plus a per-connection offset,
//! [`timestamp_offset`]), retransmission with the RFC 6298 timer, zero-window
//! probing, keep-alive, delayed ACKs and Nagle's algorithm (all switchable).
//!
//! Performance: congestion control by [`TcpConfig::congestion`], RFC 5681 NewReno
//! or CUBIC (RFC 9438, the default: W_cubic with C = 0.4 and β = 0.7, the
//! Reno-friendly region, fast convergence), with slow start from RFC 6928's initial
//! window of up to 10 segments ([`TcpConfig::large_initial_window`]), fast
//! retransmit and Limited Transmit (RFC 3042); HyStart++ (RFC 9406,
//! [`TcpConfig::hystart`]): the initial slow start watches each round's minimum RTT
//! (timestamps give a sample per ACK; without them, RACK's send times of segments
//! sent once, kept for HyStart++ alone when SACK, and with it RACK, is off), and a
//! rise by RttThresh (an eighth of the last round's, within 4–16 ms) turns it into
//! Conservative Slow Start at a quarter of the growth, back to slow start if the
//! RTT falls below the baseline, or after five rounds into congestion avoidance at
//! ssthresh = cwnd (for CUBIC, RFC 9438 §4.10's epoch with W_max = cwnd); later
//! slow starts, after a timeout, are plain; SACK (RFC 2018, [`TcpConfig::sack`]):
//! blocks for out-of-order data, newest first, and a scoreboard driving RFC 6675
//! loss recovery (duplicate ACKs as its §2 counts them: every ACK that SACKs new
//! data; IsLost, NextSeg, pipe; blocks outside SND.UNA..SND.MAX ignored), NewReno
//! recovery (RFC 6582) without it; receive-buffer auto-tuning (Linux's dynamic
//! right-sizing up to [`TcpConfig::recv_buffer_max`], the window scale chosen for
//! that ceiling); and header prediction ([`TcpConfig::header_prediction`]), a short
//! path for pure ACKs and in-order data (acknowledging new data or not) in
//! ESTABLISHED, checked against the general path by a property test.
//!
//! Tail Loss Probe (RFC 8985 §7, [`TcpConfig::tail_loss_probe`]): when no ACK came
//! for PTO = 2·SRTT plus the peer's ACK delay (our own delayed-ACK bound, at least
//! 2 ms, where §7.2 takes 200 ms for a lone segment), one probe (new data, or the
//! last segment again) whose ACK, a SACK or duplicate ACK, starts fast recovery
//! for the losses below it, or whose full ACK repairs a single tail loss with
//! cwnd reduced as for fast recovery (timestamps, in place of D-SACK, spare that
//! when the original had arrived). Where §7.2 arms no probe and leaves the losses
//! to RACK (SACKed data, recovery), the same timer still runs: on expiry the holes
//! below SACKed data, retransmissions included, count as lost. Without SACK the
//! probe still draws a duplicate ACK for NewReno.
//!
//! RACK (RFC 8985 §6, [`TcpConfig::rack`], with SACK): every transmitted range
//! is recorded with its send time, in sequence order, trimmed by the cumulative
//! ACK. A segment is lost once a segment sent after it was delivered and
//! RACK.rtt plus the reordering window passed since it was sent; the reordering
//! timer waits out the rest (§6.3). The window is min_RTT / 4 (min_RTT over the
//! connection's life, from segments sent once), at most SRTT, widened by each
//! round trip that brings a D-SACK (RFC 2883 §4; our receiver reports data that
//! arrives twice, below RCV.NXT or beyond a hole, in the next ACK's first block)
//! for 16 recoveries, and zero in recovery or with DupThresh segments
//! SACKed until reordering has been seen (§6.2 step 4). RACK's losses are RFC
//! 6675's: they start recovery and are NextSeg's first choice, and pipe counts
//! them out. This finds lost retransmissions, which RFC 6675 leaves to the RTO
//! (a retransmission of SND.UNA restarts the RTO, as in Linux, so that the timer
//! does not beat RACK to it), and losses fewer than DupThresh segments show.
//! Without RACK, DupThresh marks
//! the holes, the probe timer is the only stand-in for RACK's, and RFC 6675's
//! rescue retransmission (NextSeg rule (4)) resends the tail beyond the highest
//! SACKed byte once per recovery when all data has been sent.
//!
//! Not taken: HyStart++'s larger per-ACK growth limit L = 8 for senders without
//! pacing (RFC 9406 §4.2, a SHOULD); we keep RFC 5681's one segment, so that
//! HyStart++ changes where slow start ends, not how fast it goes: with L = 8 the
//! bursts of stretch ACKs overflowed a deep bottleneck queue in slow start
//! before the RTT rise showed (see `CongestionControl::on_ack`).
//!
//! The send buffer is the connection's heap memory, or memory the caller lends
//! ([`SendMemory`], [`Connection::lend_send_memory`]): then a segment's data is
//! not copied but named where it lies ([`Connection::poll_transmit_referenced`]),
//! for the first transmission and every retransmission, and its bytes stay
//! untouched until the caller reports the transmission done. The sockets over
//! the multiplexer are in [`crate::socket`], and lend part of the endpoint's
//! segment. Of RFC 7323,
//! a non-RST segment without timestamps on a connection that agreed to them is
//! taken rather than dropped (§3.2's SHOULD; Linux takes it too), and a RST
//! carries no timestamps (§3.2 allows either).

mod cc;
mod connection;
mod cookie;
mod isn;
mod rack;
mod recv;
mod rtt;
mod send;
mod seq;

#[cfg(test)]
mod tests;

pub use cc::Congestion;
pub(crate) use connection::TS_OPTION_LEN;
pub use connection::{
    reset_for_closed, Connection, Keepalive, TcpConfig, TcpError, TcpState, TcpStats,
};
pub use cookie::{syn_ack_shape, syn_cookie_accept, syn_cookie_reply, SYN_COOKIE_LIFETIME};
pub use isn::{initial_sequence_number, timestamp_offset};
pub use send::{Pieces, SendMemory};
pub use seq::SeqNum;
