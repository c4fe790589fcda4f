//! One connection (RFC 9293 §3.3.1, the TCB) and its state machine (§3.3.2, event
//! processing §3.10).

use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::time::Duration;

use exonet_wire::tcp::{
    flags, write_options, TcpOption, TcpOptionIter, MAX_SACK_BLOCKS, MIN_HEADER_LEN,
};
use exonet_wire::{checksum, TcpRepr};

use super::cc::{Congestion, CongestionControl, HyStartEvent};
use super::rack::Rack;
use super::recv::RecvBuffer;
use super::rtt::RttEstimator;
use super::send::{self, Pieces, SendBuffer, SendMemory};
use super::seq::SeqNum;
use crate::time::{earlier, nanos};
use crate::Time;

/// RFC 9293 §3.7.1: without an MSS option, the peer accepts 536 bytes of data.
pub(super) const DEFAULT_MSS: u16 = 536;
/// A floor under the peer's MSS, as Linux's `tcp_min_snd_mss`: a tiny advertised MSS
/// would make every byte cost a segment.
pub(super) const MIN_MSS: u16 = 48;
/// The largest value of the 16-bit window field.
const MAX_WINDOW: usize = 65_535;
/// The largest window scale shift (RFC 7323 §2.3).
const MAX_WSCALE: u8 = 14;
/// The longest delay of an ACK, just under RFC 9293 §3.8.6.3's 0.5 s.
const MAX_ACK_DELAY: Duration = Duration::from_millis(499);
/// RFC 6298 §5.7: the RTO once data flows after a SYN had to be retransmitted.
const RTO_AFTER_SYN_LOSS: Duration = Duration::from_secs(3);
/// The option space (RFC 9293 §3.1: a data offset of at most 15 words). A SYN's
/// options (MSS, NOP and window scale, SACK-permitted or two NOPs, timestamps)
/// take 20 bytes; an ACK's timestamps and three SACK blocks all 40.
const MAX_OPTIONS_LEN: usize = 40;
/// Option bytes on every segment once timestamps are agreed: two NOPs and the
/// option (RFC 7323 Appendix A's layout).
pub(crate) const TS_OPTION_LEN: usize = 12;
/// RFC 6675 §2: DupThresh, the duplicate ACKs (or SACKed segments above a hole)
/// that mean a loss.
const DUP_THRESH: u32 = 3;
/// Recent out-of-order arrivals remembered for the order of SACK blocks (RFC 2018
/// §4); more than fit in one option, as some may have been filled since.
const SACK_HISTORY: usize = 8;
/// RFC 7323 §5.5: TS.Recent becomes invalid after 24 days without an update, the
/// shortest time in which a 1 ms timestamp clock can move 2^31.
const PAWS_IDLE: Duration = Duration::from_secs(24 * 24 * 3600);
/// Added to 2·SRTT for the probe timeout (RFC 8985 §7.2) while more than one
/// segment is in flight: room for the scheduling of the peer's ACKs, as Linux's
/// TCP_TIMEOUT_MIN.
const PTO_SLACK: Duration = Duration::from_millis(2);

/// Quick ACKs at a connection's start (Linux's `TCP_MAX_QUICKACKS`).
const QUICK_ACKS: u8 = 16;

/// Settings of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// The most data one segment carries on our link (MTU − 40 for IPv4): advertised
    /// in the MSS option of our SYN and the upper bound on what we send.
    pub mss: u16,
    /// Bytes the application may queue for sending, unacknowledged ones included.
    pub send_buffer: usize,
    /// Receive buffer and so the largest window offered: at most 65535 bytes
    /// unless both ends scale windows, and at most 65535 × 2^14 bytes. With
    /// auto-tuning ([`TcpConfig::recv_buffer_max`]) the size to start from.
    pub recv_buffer: usize,
    /// Receive-buffer auto-tuning (Linux's dynamic right-sizing): the buffer grows
    /// up to this size while the application reads as fast as data arrives, so the
    /// window keeps up with the path's bandwidth-delay product. The window scale
    /// offered on the SYN covers this ceiling. At most `recv_buffer` disables it.
    pub recv_buffer_max: usize,
    /// Offer window scaling (RFC 7323 §2) in our SYN, or accept a peer's offer.
    pub window_scaling: bool,
    /// Offer timestamps (RFC 7323 §3) in our SYN, or accept a peer's offer: RTT
    /// samples from every ACK of new data (§4) and PAWS (§5).
    pub timestamps: bool,
    /// RTO before any RTT sample (RFC 6298 §2.1: 1 s).
    pub initial_rto: Duration,
    /// Lower bound of the RTO (RFC 6298 §2.4: 1 s; lower on low-latency links and in
    /// tests).
    pub min_rto: Duration,
    /// Upper bound of the RTO (RFC 6298 §2.5: at least 60 s).
    pub max_rto: Duration,
    /// Retransmissions of one segment (or zero-window probes without answer) before
    /// the connection fails with [`TcpError::TimedOut`] (RFC 9293 §3.8.3's R2; 15 as
    /// Linux's `tcp_retries2`).
    pub max_retransmissions: u32,
    /// The same limit for the SYN or SYN-ACK (6 as Linux's `tcp_syn_retries`).
    pub max_syn_retransmissions: u32,
    /// Maximum segment lifetime; TIME-WAIT lasts twice this (RFC 9293 §3.6.1). 30 s
    /// as Linux's 60 s TIME-WAIT; RFC 9293 §3.4.2 takes 2 minutes.
    pub msl: Duration,
    /// How long a connection its application has closed ([`Connection::abandon`])
    /// waits in FIN-WAIT-2 for the peer's FIN before it goes (Linux's
    /// `tcp_fin_timeout`, 60 s). RFC 9293 lets FIN-WAIT-2 last for ever, which a
    /// peer that never closes would turn into state held for nobody.
    pub fin_wait2_timeout: Duration,
    /// Delay of acknowledgments for in-order data (RFC 9293 §3.8.6.3: under 0.5 s, an
    /// ACK at least for every second segment); `None` acknowledges every segment at
    /// once, which suits low-latency links (U-Net §7.8).
    pub delayed_ack: Option<Duration>,
    /// With [`TcpConfig::delayed_ack`]: while the application falls behind (more
    /// unread data than at our last ACK), the ACK owed for every second segment
    /// waits for its next read, which it then carries with the window that read
    /// opened, or for the delayed-ACK bound. Linux acknowledges so
    /// (`__tcp_ack_snd_check`, `tcp_cleanup_rbuf`): RFC 9293 §3.8.6.3's "at least
    /// every second full-sized segment" is a SHOULD, and an ACK that cannot move
    /// the window's right edge only costs both ends a frame. Off keeps to it.
    /// Nothing is held before a receive buffer's worth has come (see
    /// `Connection::ramping`), while the sender's slow start needs the ACKs.
    pub ack_on_read: bool,
    /// With [`TcpConfig::delayed_ack`]: the ACK that completes our active
    /// open waits for the application's first write, which carries it, or
    /// for the delayed-ACK bound; any other wait of the application (a read,
    /// a readiness wait for reading) sends it at once
    /// ([`Connection::release_held_ack`]). Linux delays this ACK so when a
    /// write is pending (`tcp_rcv_synsent_state_process`); RFC 9293
    /// §3.8.6.3 allows it as any delayed ACK. One frame less per connection,
    /// and a server that waits for the request is woken once, for the ACK
    /// and the request together.
    pub hold_handshake_ack: bool,
    /// Nagle's algorithm (RFC 9293 §3.7.4): hold back small segments while data is
    /// unacknowledged. Off is TCP_NODELAY.
    pub nagle: bool,
    /// Keep-alive probing of an idle connection (RFC 9293 §3.8.4); off by default,
    /// as RFC 1122 §4.2.3.6 requires.
    pub keepalive: Option<Keepalive>,
    /// Challenge ACKs (RFC 5961 §3–§5) sent per second at most (RFC 5961 §7), so
    /// that forged segments cannot turn the connection into an amplifier. Counted
    /// per connection: a host-wide count leaks to an off-path attacker which
    /// connections exist (CVE-2016-5696).
    pub challenge_ack_limit: u32,
    /// The congestion control algorithm: CUBIC (RFC 9438) by default, as Linux.
    pub congestion: Congestion,
    /// Header prediction: a short path for the common segment in ESTABLISHED
    /// (see [`TcpStats::header_predicted`]); off runs every segment through the
    /// general processing of RFC 9293 §3.10.7.4, which gives the same results.
    pub header_prediction: bool,
    /// Offer selective acknowledgments (RFC 2018) in our SYN, or accept a peer's
    /// offer: SACK blocks for out-of-order data, and loss recovery by the
    /// scoreboard (RFC 6675) rather than NewReno's one hole per round trip.
    pub sack: bool,
    /// Tail Loss Probe (RFC 8985 §7): when no ACK came for about two round trips,
    /// send one segment (new data, or the last one again) so that its ACK shows
    /// the losses at the tail of a flight to SACK or NewReno recovery instead of
    /// leaving them to the retransmission timeout.
    pub tail_loss_probe: bool,
    /// The longest the peer is taken to hold the ACK of a lone segment, in the
    /// probe timeout of a flight of one segment (RFC 8985 §7.2's WCDelAckT).
    /// `None`: our own delayed-ACK bound, at least 2 ms, as both ends of this
    /// library are configured alike.
    pub peer_ack_delay: Option<Duration>,
    /// HyStart++ (RFC 9406): leave the initial slow start when the round-trip
    /// time rises, a queue building at the bottleneck, through a few rounds of
    /// Conservative Slow Start, rather than at the first loss of a window grown
    /// past the path's capacity (see [`TcpStats::hystart_exits`]). It needs an
    /// RTT sample per ACK: from timestamps ([`TcpConfig::timestamps`]), or else
    /// from RACK's send times ([`TcpConfig::rack`], with SACK); with Karn's one
    /// sample per round trip alone slow start ends by loss as without it.
    pub hystart: bool,
    /// RFC 6928's initial window of up to 10 segments (14,600 bytes), as
    /// Linux, FreeBSD and Windows use: a short answer goes out in one round
    /// trip. Off: RFC 5681 §3.1's 2 to 4 segments.
    pub large_initial_window: bool,
    /// SYN cookies (RFC 4987 §3.6): a listener whose SYN queue is full answers a
    /// SYN with a SYN-ACK that keeps no state ([`super::syn_cookie_reply`]), and the
    /// ACK completing it makes the connection ([`super::syn_cookie_accept`]), as
    /// Linux's `tcp_syncookies = 1`. Off, such SYNs are dropped. Only a listener's
    /// setting counts.
    pub syn_cookies: bool,
    /// Every SYN to a listener is answered with a SYN cookie by the link,
    /// below the application, where the link can (AF_XDP's XDP program: see
    /// `exonet_link::afxdp`), as Linux answers SYNs in softirq: a handshake
    /// wakes the application only for the ACK that completes it. Off by
    /// default: a cookie's SYN-ACK is never sent again, so if the peer's ACK
    /// is lost, a protocol where the server speaks first waits for the peer
    /// to send something. Only a listener's setting counts.
    pub link_syn_cookies: bool,
    /// RACK (RFC 8985 §6), where SACK is agreed: a segment is lost once one sent
    /// after it was delivered and a round trip plus a reordering window passed
    /// since it was sent, which finds lost retransmissions and losses that fewer
    /// than three later segments show, and tolerates reordering within the window.
    /// Off: RFC 6675's DupThresh marks holes lost, and the probe timer stands in
    /// for RACK's ([`TcpConfig::tail_loss_probe`]).
    pub rack: bool,
}

/// Keep-alive settings (RFC 1122 §4.2.3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Silence from the peer before the first probe (RFC 1122: at least 2 hours by
    /// default).
    pub idle: Duration,
    /// Time between unanswered probes.
    pub interval: Duration,
    /// Unanswered probes after which the connection fails with
    /// [`TcpError::TimedOut`].
    pub probes: u32,
}

impl Default for Keepalive {
    /// Linux's defaults: 2 hours, then 9 probes 75 s apart.
    fn default() -> Self {
        Keepalive {
            idle: Duration::from_secs(2 * 3600),
            interval: Duration::from_secs(75),
            probes: 9,
        }
    }
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            mss: 1460,
            send_buffer: 256 * 1024,
            recv_buffer: MAX_WINDOW,
            recv_buffer_max: 4 << 20,
            window_scaling: true,
            timestamps: true,
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_secs(1),
            max_rto: Duration::from_secs(60),
            max_retransmissions: 15,
            max_syn_retransmissions: 6,
            msl: Duration::from_secs(30),
            fin_wait2_timeout: Duration::from_secs(60),
            delayed_ack: None,
            ack_on_read: false,
            hold_handshake_ack: false,
            nagle: true,
            keepalive: None,
            challenge_ack_limit: 100,
            congestion: Congestion::Cubic,
            sack: true,
            header_prediction: true,
            tail_loss_probe: true,
            peer_ack_delay: None,
            hystart: true,
            large_initial_window: true,
            syn_cookies: true,
            link_syn_cookies: false,
            rack: true,
        }
    }
}

/// Connection states (RFC 9293 §3.3.2). LISTEN belongs to the listener, which makes a
/// connection per SYN ([`Connection::accept`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TcpState {
    /// Our SYN sent, waiting for the peer's.
    SynSent,
    /// Both SYNs seen, ours not yet acknowledged.
    SynReceived,
    /// Data flows both ways.
    Established,
    /// We closed; our FIN is queued or sent, not acknowledged.
    FinWait1,
    /// Our FIN acknowledged; the peer may still send.
    FinWait2,
    /// Both closed at once; waiting for the ACK of our FIN.
    Closing,
    /// Both closed; waiting 2 × MSL for old segments to die out.
    TimeWait,
    /// The peer closed; we may still send.
    CloseWait,
    /// The peer closed, then we did; waiting for the ACK of our FIN.
    LastAck,
    /// No connection (any more).
    Closed,
}

/// Why a connection ended abnormally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TcpError {
    /// A RST answered our SYN (RFC 9293 §3.10.7.3: "connection refused").
    Refused,
    /// A valid RST arrived on a synchronized connection ("connection reset").
    Reset,
    /// Retransmissions ran out ([`TcpConfig::max_retransmissions`]).
    TimedOut,
}

/// Counters of one connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpStats {
    /// Segments given to [`Connection::handle_segment`].
    pub segments_received: u64,
    /// Segments written by [`Connection::poll_transmit`].
    pub segments_sent: u64,
    /// Of those, SYNs, data or FINs sent again.
    pub retransmitted: u64,
    /// Retransmission (or persist) timeouts.
    pub timeouts: u64,
    /// Retransmissions without a timeout: entering recovery, answering a partial
    /// ACK, or repairing a hole the SACK scoreboard shows (RFC 6675 NextSeg).
    pub fast_retransmits: u64,
    /// Of those, rescue retransmissions (RFC 6675 §4 NextSeg rule (4)): the last
    /// segment in recovery, once per recovery, when nothing else may go.
    pub rescue_retransmits: u64,
    /// ACKs sent under the RFC 5961 §7 limit, and ones the limit suppressed.
    pub challenge_acks: u64,
    /// See `challenge_acks`.
    pub challenge_acks_suppressed: u64,
    /// Segments that took the header-prediction path.
    pub header_predicted: u64,
    /// Receive-buffer growths by auto-tuning ([`TcpConfig::recv_buffer_max`]).
    pub recv_buffer_growths: u64,
    /// Segments dropped by PAWS (RFC 7323 §5.3 R1): a timestamp older than TS.Recent.
    pub paws_rejected: u64,
    /// RTT samples taken from timestamp echoes (RFC 7323 §4).
    pub ts_rtt_samples: u64,
    /// SACK blocks taken into the scoreboard (RFC 2018 §3).
    pub sack_blocks_received: u64,
    /// SACK blocks ignored: outside SND.UNA..SND.MAX (stale, D-SACK or forged).
    pub sack_blocks_ignored: u64,
    /// Tail loss probes sent (RFC 8985 §7.3).
    pub tlp_probes: u64,
    /// Losses the probe timer revealed (RFC 8985 §7.4): a probe's ACK started fast
    /// recovery or acknowledged a retransmitted probe whose original had not
    /// arrived, or the timer expired with SACKed data or in recovery and found the
    /// holes (or retransmissions) below lost.
    pub tlp_recoveries: u64,
    /// Entries into HyStart++'s Conservative Slow Start (RFC 9406 §4.2), the
    /// RTT having risen in slow start; more than `hystart_exits` when the rise
    /// proved jitter and slow start resumed, or a loss ended it.
    pub css_entries: u64,
    /// Slow starts that HyStart++ ended, after CSS, without a loss (ssthresh =
    /// cwnd).
    pub hystart_exits: u64,
    /// Segments RACK marked lost (RFC 8985 §6.2), retransmissions included.
    pub rack_losses: u64,
    /// Expiries of RACK's reordering timer (RFC 8985 §6.3).
    pub rack_timeouts: u64,
    /// D-SACK blocks received (RFC 2883 §4: a first block below SEG.ACK or within
    /// the second), each a segment the peer got twice.
    pub dsacks_received: u64,
    /// D-SACK blocks sent: data that arrived twice, reported to the peer
    /// (RFC 2883 §4) so that its RACK widens its reordering window.
    pub dsacks_sent: u64,
}

/// A loss probe awaiting its ACK (RFC 8985 §7.3's TLP.end_seq and TLP.is_retrans).
#[derive(Debug, Clone, Copy)]
struct TlpEpisode {
    /// SND.NXT after the probe.
    end: SeqNum,
    /// The probe sent old data again rather than new.
    retrans: bool,
    /// Our timestamp on the probe, to tell an echo of it from one of the original.
    tsval: u32,
}

/// SACK blocks as (left, right) edges, the present ones first (RFC 2018 §3).
type SackBlocks = [Option<(u32, u32)>; MAX_SACK_BLOCKS];

/// What a SYN offered (RFC 9293 §3.7.1, RFC 7323 §2–§3, RFC 2018 §2), before it
/// is agreed with our [`TcpConfig`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct SynOptions {
    pub mss: Option<u16>,
    pub wscale: Option<u8>,
    pub sack: bool,
    /// The TSval to echo, if timestamps were offered.
    pub tsval: Option<u32>,
}

/// The fields of a received segment the state machine reads.
#[derive(Debug, Clone, Copy)]
struct Segment<'a> {
    seq: SeqNum,
    ack: SeqNum,
    flags: u8,
    window: u16,
    /// The timestamps option as (TSval, TSecr), if the segment carried one.
    ts: Option<(u32, u32)>,
    /// SACK blocks (RFC 2018 §3), if SACK was agreed and the segment carried them.
    sack: SackBlocks,
    /// No options but timestamps and padding (header prediction's condition).
    plain_options: bool,
    payload: &'a [u8],
}

impl Segment<'_> {
    fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// SEG.LEN: data plus one for each of SYN and FIN (RFC 9293 §3.4).
    fn len(&self) -> u32 {
        self.payload.len() as u32
            + u32::from(self.has(flags::SYN))
            + u32::from(self.has(flags::FIN))
    }
}

/// The reply to a segment for a connection that does not exist (RFC 9293 §3.10.7.1,
/// also LISTEN's answer to an ACK, §3.10.7.2): a RST that the sender will take as
/// acceptable, or nothing for a RST. Emit it with the addresses swapped.
pub fn reset_for_closed(seg: &TcpRepr) -> Option<TcpRepr<'static>> {
    if seg.flags & flags::RST != 0 {
        return None;
    }
    let (seq_number, ack_number, f) = if seg.flags & flags::ACK != 0 {
        (seg.ack_number, 0, flags::RST)
    } else {
        let s = Segment {
            seq: SeqNum(seg.seq_number),
            ack: SeqNum(0),
            flags: seg.flags,
            window: 0,
            ts: None,
            sack: [None; MAX_SACK_BLOCKS],
            plain_options: true,
            payload: seg.payload,
        };
        (0, (s.seq + s.len()).0, flags::RST | flags::ACK)
    };
    Some(TcpRepr {
        src_port: seg.dst_port,
        dst_port: seg.src_port,
        seq_number,
        ack_number,
        flags: f,
        window: 0,
        urgent_ptr: 0,
        options: &[],
        payload: &[],
    })
}

/// The peer's window scale option, if its SYN carried a well-formed one.
pub(super) fn wscale_option(seg: &TcpRepr) -> Option<u8> {
    TcpOptionIter::new(seg.options)
        .map_while(Result::ok)
        .find_map(|o| match o {
            TcpOption::WindowScale(s) => Some(s),
            _ => None,
        })
}

/// A segment's timestamps option as (TSval, TSecr), if well-formed.
pub(super) fn ts_option(seg: &TcpRepr) -> Option<(u32, u32)> {
    exonet_wire::tcp::timestamps(seg.options)
}

/// `a` is before `b` on the 32-bit timestamp circle (RFC 7323 §5.2, as sequence
/// numbers compare).
pub(super) fn ts_before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// Our timestamp clock (RFC 7323 §5.4): milliseconds plus `offset`, modulo 2^32.
pub(super) fn ts_clock(now: Time, offset: u32) -> u32 {
    ((now.as_nanos() / 1_000_000) as u32).wrapping_add(offset)
}

/// Whether the peer's SYN offers SACK (RFC 2018 §2).
pub(super) fn sack_permitted_option(seg: &TcpRepr) -> bool {
    TcpOptionIter::new(seg.options)
        .map_while(Result::ok)
        .any(|o| matches!(o, TcpOption::SackPermitted))
}

/// The options of a segment on a synchronized connection, read in one pass: the
/// timestamps, the SACK blocks, and whether there is nothing else (nor anything
/// malformed), as header prediction requires.
fn segment_options(seg: &TcpRepr) -> (Option<(u32, u32)>, SackBlocks, bool) {
    let (mut ts, mut sack, mut plain) = (None, [None; MAX_SACK_BLOCKS], true);
    if seg.options.len() == 12 && seg.options[..4] == [1, 1, 8, 10] {
        // RFC 7323 Appendix A's layout, on nearly every segment: no scan.
        return (exonet_wire::tcp::timestamps(seg.options), sack, plain);
    }
    for o in TcpOptionIter::new(seg.options) {
        match o {
            Ok(TcpOption::Timestamps { tsval, tsecr }) => ts = ts.or(Some((tsval, tsecr))),
            Ok(TcpOption::NoOp | TcpOption::EndOfList) => {}
            Ok(TcpOption::Sack(blocks)) => {
                if sack[0].is_none() {
                    sack = blocks;
                }
                plain = false;
            }
            Ok(_) => plain = false,
            Err(_) => {
                plain = false;
                break;
            }
        }
    }
    (ts, sack, plain)
}

/// The peer's MSS option, if its SYN carried a well-formed one.
pub(super) fn mss_option(seg: &TcpRepr) -> Option<u16> {
    TcpOptionIter::new(seg.options)
        .map_while(Result::ok)
        .find_map(|o| match o {
            TcpOption::Mss(m) => Some(m),
            _ => None,
        })
}

/// One TCP connection. Feed it segments addressed to it ([`Connection::handle_segment`],
/// checksum already verified) and expired deadlines ([`Connection::handle_timeout`]);
/// drain [`Connection::poll_transmit`] after every input and application call, and
/// call again at [`Connection::poll_timeout`].
#[derive(Debug, Clone)]
pub struct Connection {
    config: TcpConfig,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    state: TcpState,
    error: Option<TcpError>,
    /// Opened by a listener: a RST in SYN-RECEIVED is a reset, not a refusal.
    passive: bool,

    // Send sequence variables (RFC 9293 §3.3.1).
    iss: SeqNum,
    snd_una: SeqNum,
    snd_nxt: SeqNum,
    /// The highest SND.NXT so far: after a timeout SND.NXT goes back to SND.UNA to
    /// resend, while ACKs up to here stay acceptable.
    snd_max: SeqNum,
    snd_wnd: u32,
    /// The largest window the peer offered (RFC 5961 §5's MAX.SND.WND; RFC 9293
    /// §3.8.6.2.1's Max(SND.WND)).
    max_snd_wnd: u32,
    snd_wl1: SeqNum,
    snd_wl2: SeqNum,
    /// The application's bytes not yet acknowledged, starting at `send_base`.
    send_buf: SendBuffer,
    send_base: SeqNum,
    /// The application closed: a FIN follows the send buffer.
    fin_queued: bool,
    /// Data per segment: the peer's MSS clamped to ours (RFC 9293 §3.7.1).
    send_mss: usize,
    /// Shift of the peer's window fields (RFC 7323 §2.3), once both SYNs agreed.
    snd_wscale: u8,
    /// Shift of ours; 0 until both SYNs agreed.
    rcv_wscale: u8,
    /// Both SYNs carry the window scale option.
    wscale_agreed: bool,
    /// Both SYNs carry SACK-permitted (RFC 2018 §2).
    sack_ok: bool,

    // Timestamps (RFC 7323 §3–§5).
    /// Both SYNs carry the timestamps option: every segment but a RST carries one.
    ts_ok: bool,
    /// Added to the millisecond clock to make our TSvals (RFC 7323 §5.4: a random
    /// offset per connection keeps them from leaking uptime or linking connections).
    ts_offset: u32,
    /// TS.Recent: the TSval to echo (RFC 7323 §4.3).
    ts_recent: u32,
    /// When TS.Recent was last set, for its 24-day validity (RFC 7323 §5.5); `None`
    /// until then.
    ts_recent_age: Option<Time>,
    /// Last.ACK.sent: the acknowledgment number of our latest segment (RFC 7323
    /// §4.3).
    last_ack_sent: SeqNum,

    // Receive sequence variables.
    irs: SeqNum,
    rcv_nxt: SeqNum,
    /// The right edge of the window last advertised, which never moves left (RFC
    /// 9293 §3.8.6.2.2 discourages shrinking).
    rcv_adv: SeqNum,
    recv: RecvBuffer,
    /// Stream offsets of the latest out-of-order arrivals, newest first: the SACK
    /// blocks we send are the runs holding them, in this order (RFC 2018 §4).
    sack_recent: VecDeque<u64>,
    /// A duplicate to report as the first SACK block of the next ACK (RFC 2883
    /// §4), once.
    dsack: Option<(SeqNum, SeqNum)>,
    /// Bytes the application has read, for auto-tuning.
    app_read: u64,
    /// Start of the current auto-tuning round (about an RTT) and `app_read` then.
    drs_mark: Option<(Time, u64)>,
    /// Most bytes read in one round so far (Linux's rcvq_space.space).
    drs_space: u64,
    /// The receiver's RTT estimate, from timestamp echoes or the time a window
    /// takes to arrive (Linux's rcv_rtt_est).
    rcv_rtt: Option<Duration>,
    /// Without timestamps: the sequence number that completes the window in
    /// flight, and when the measurement began.
    rcv_rtt_window: Option<(SeqNum, Time)>,
    /// Where the peer's FIN lies, once seen, possibly ahead of a hole.
    rx_fin: Option<SeqNum>,
    fin_received: bool,

    // Timers and acknowledgment state.
    rtt: RttEstimator,
    /// The retransmission timer, which is also the persist timer while the peer's
    /// window is zero (RFC 9293 §3.8.6.1).
    rtx_deadline: Option<Time>,
    retries: u32,
    /// The next segment may carry one byte beyond a zero window (a window probe).
    probe: bool,
    /// The end of the segment being timed and when it was sent (one sample per RTT,
    /// RFC 6298 §3).
    rtt_sample: Option<(SeqNum, Time)>,
    syn_retransmitted: bool,
    ack_now: bool,
    /// Out-of-order segments not yet answered each with its own duplicate ACK (RFC
    /// 5681 §4.2), which the sender's fast retransmit counts; several may arrive
    /// before the caller polls.
    dup_acks_owed: u32,
    ack_deadline: Option<Time>,
    /// Segments received since our last ACK, for the every-second-segment rule.
    unacked_segments: u32,
    /// Quick ACKs left for a full-sized segment while the sender's slow
    /// start grows (Linux's `icsk_ack.quick`), and whether the ACK owed
    /// now is one.
    quick_acks: u8,
    quick_owed: bool,
    /// Unread bytes when our last ACK went ([`TcpConfig::ack_on_read`]).
    unread_at_ack: usize,
    /// The ACK of the peer's SYN-ACK is held ([`TcpConfig::hold_handshake_ack`]).
    handshake_ack_held: bool,
    time_wait_deadline: Option<Time>,
    /// The application closed its socket: FIN-WAIT-2 is bounded.
    abandoned: bool,
    /// When an abandoned connection in FIN-WAIT-2 goes.
    fin_wait2_deadline: Option<Time>,
    /// A RST to send with this sequence number.
    rst_pending: Option<SeqNum>,
    stats: TcpStats,

    // Congestion control and loss recovery (RFC 5681, RFC 6582).
    cc: CongestionControl,
    /// Duplicate ACKs in a row (RFC 5681 §2's definition).
    dup_acks: u32,
    /// In fast recovery until SND.UNA passes `recover`.
    in_recovery: bool,
    /// RFC 6582's "recover": SND.MAX when recovery began or a timeout struck.
    recover: SeqNum,
    /// Resend the segment at SND.UNA once, without going back (fast retransmit).
    rexmit_pending: bool,
    /// The last transmit held back a short super-segment
    /// ([`Connection::poll_transmit_offloaded`]'s `cork`).
    corked: bool,
    /// The SACK scoreboard (RFC 6675 §3): disjoint ranges [start, end) above
    /// SND.UNA the peer holds, in order.
    scoreboard: Vec<(SeqNum, SeqNum)>,
    /// RFC 6675's HighRxt, as the end of the highest retransmitted range.
    high_rxt: SeqNum,
    /// RFC 6675's RescueRxt: `recover` when the rescue retransmission went.
    rescue_rxt: Option<SeqNum>,
    /// The probe timer (RFC 8985 §7.2).
    pto_deadline: Option<Time>,
    /// The probe timer expired: the next segment is a probe (RFC 8985 §7.3).
    tlp_pending: bool,
    /// The probe sent and not yet acknowledged; at most one (RFC 8985 §7.3).
    tlp: Option<TlpEpisode>,
    /// Holes below this count as lost in recovery: they were last sent before a
    /// probe that arrived, or before the probe timer expired (RFC 8985 §6.2's
    /// rule for what we time this way; see [`Connection::on_pto`]).
    tlp_lost_below: Option<SeqNum>,
    /// RACK's records and variables (RFC 8985 §6), kept while [`Connection::rack_on`].
    rack: Rack,
    /// RACK's reordering timer (RFC 8985 §6.3).
    rack_deadline: Option<Time>,
    /// Start of the current one-second window of challenge ACKs, and how many went.
    challenge_window: (Time, u32),
    /// When the peer was last heard from, for keep-alive.
    last_heard: Time,
    /// Keep-alive probes sent since then.
    keepalive_probes: u32,
    keepalive_pending: bool,
}

impl Connection {
    fn new(
        mut config: TcpConfig,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNum,
        state: TcpState,
    ) -> Self {
        config.recv_buffer = config.recv_buffer.min(MAX_WINDOW << MAX_WSCALE);
        config.recv_buffer_max = config
            .recv_buffer_max
            .clamp(config.recv_buffer, MAX_WINDOW << MAX_WSCALE);
        // RFC 9293 §3.8.6.3: the delay MUST be less than 0.5 s.
        config.delayed_ack = config.delayed_ack.map(|d| d.min(MAX_ACK_DELAY));
        Connection {
            local,
            remote,
            state,
            error: None,
            passive: false,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_max: iss,
            snd_wnd: 0,
            max_snd_wnd: 0,
            snd_wl1: SeqNum(0),
            snd_wl2: iss,
            send_buf: SendBuffer::new(),
            send_base: iss + 1,
            fin_queued: false,
            send_mss: usize::from(DEFAULT_MSS.min(config.mss)),
            snd_wscale: 0,
            rcv_wscale: 0,
            wscale_agreed: false,
            sack_ok: false,
            ts_ok: false,
            ts_offset: 0,
            ts_recent: 0,
            ts_recent_age: None,
            last_ack_sent: SeqNum(0),
            irs: SeqNum(0),
            rcv_nxt: SeqNum(0),
            rcv_adv: SeqNum(0),
            recv: RecvBuffer::new(config.recv_buffer),
            sack_recent: VecDeque::new(),
            dsack: None,
            app_read: 0,
            drs_mark: None,
            // Linux's tcp_init_buffer_space: the initial window, at most 10
            // segments.
            drs_space: config.recv_buffer.min(10 * usize::from(config.mss)) as u64,
            rcv_rtt: None,
            rcv_rtt_window: None,
            rx_fin: None,
            fin_received: false,
            rtt: RttEstimator::new(config.initial_rto, config.min_rto, config.max_rto),
            rtx_deadline: None,
            retries: 0,
            probe: false,
            rtt_sample: None,
            syn_retransmitted: false,
            ack_now: false,
            dup_acks_owed: 0,
            ack_deadline: None,
            unacked_segments: 0,
            quick_acks: QUICK_ACKS,
            quick_owed: false,
            unread_at_ack: 0,
            handshake_ack_held: false,
            time_wait_deadline: None,
            abandoned: false,
            fin_wait2_deadline: None,
            rst_pending: None,
            stats: TcpStats::default(),
            cc: CongestionControl::new(
                config.congestion,
                u32::from(DEFAULT_MSS),
                config.hystart,
                config.large_initial_window,
            ),
            dup_acks: 0,
            in_recovery: false,
            recover: iss,
            rexmit_pending: false,
            corked: false,
            scoreboard: Vec::new(),
            high_rxt: iss,
            rescue_rxt: None,
            pto_deadline: None,
            tlp_pending: false,
            tlp: None,
            tlp_lost_below: None,
            rack: Rack::default(),
            rack_deadline: None,
            challenge_window: (Time::ZERO, 0),
            last_heard: Time::ZERO,
            keepalive_probes: 0,
            keepalive_pending: false,
            config,
        }
    }

    /// Active OPEN (RFC 9293 §3.10.1): SYN-SENT, the SYN waiting in
    /// [`Connection::poll_transmit`]. `iss` should come from
    /// [`super::initial_sequence_number`].
    pub fn connect(
        config: TcpConfig,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNum,
    ) -> Self {
        Connection::new(config, local, remote, iss, TcpState::SynSent)
    }

    /// Passive open from a SYN that reached a listener (RFC 9293 §3.10.7.2):
    /// SYN-RECEIVED, the SYN-ACK waiting in [`Connection::poll_transmit`]. `None`
    /// unless `syn` has SYN set and neither ACK nor RST (those the listener answers
    /// with [`reset_for_closed`] or ignores). Data on the SYN is not taken: it is not
    /// acknowledged, so the peer sends it again.
    pub fn accept(
        config: TcpConfig,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNum,
        syn: &TcpRepr,
    ) -> Option<Self> {
        if syn.flags & (flags::SYN | flags::ACK | flags::RST) != flags::SYN {
            return None;
        }
        let mut c = Connection::new(config, local, remote, iss, TcpState::SynReceived);
        c.passive = true;
        c.take_syn(syn);
        Some(c)
    }

    /// A connection whose handshake a SYN cookie completed (RFC 4987 §3.6):
    /// ESTABLISHED as though our SYN-ACK with ISS `iss` had answered a SYN that
    /// offered `offer` (whose `tsval` is the ACK's), and `ack`, the third segment of
    /// the handshake, had acknowledged it. The caller checked the cookie, sets the
    /// timestamp offset the SYN-ACK's TSval came from, then gives it `ack` by
    /// [`Connection::handle_segment`] for its data and FIN.
    pub(super) fn from_cookie(
        config: TcpConfig,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNum,
        offer: &SynOptions,
        ack: &TcpRepr,
        now: Time,
    ) -> Self {
        let mut c = Connection::new(config, local, remote, iss, TcpState::Established);
        c.passive = true;
        c.negotiate(SeqNum(ack.seq_number) - 1, offer);
        // The SYN-ACK was sent and `ack` acknowledges it. No RTT sample: the
        // TSecr is the cookie's TSval, its low bits not the clock's.
        c.snd_una = iss + 1;
        c.snd_nxt = c.snd_una;
        c.snd_max = c.snd_una;
        c.snd_wnd = c.peer_window(ack.window);
        c.max_snd_wnd = c.snd_wnd;
        c.snd_wl1 = SeqNum(ack.seq_number);
        c.snd_wl2 = SeqNum(ack.ack_number);
        c.last_heard = now;
        if c.ts_ok {
            c.ts_recent_age = Some(now);
        }
        c
    }

    /// Sets the offset added to the millisecond clock for our timestamps (RFC 7323
    /// §5.4); call before the first [`Connection::poll_transmit`]. It should be
    /// random per connection, e.g. [`super::timestamp_offset`]; 0 without this call.
    pub fn with_timestamp_offset(mut self, offset: u32) -> Self {
        self.ts_offset = offset;
        self
    }

    /// Both SYNs carried the timestamps option (RFC 7323 §3.2).
    pub fn timestamps(&self) -> bool {
        self.ts_ok
    }

    /// Both SYNs carried SACK-permitted (RFC 2018 §2).
    pub fn sack(&self) -> bool {
        self.sack_ok
    }

    /// The window scale shifts, ours and the peer's, if both SYNs agreed them.
    #[cfg(test)]
    pub(super) fn window_scales(&self) -> Option<(u8, u8)> {
        self.wscale_agreed
            .then_some((self.rcv_wscale, self.snd_wscale))
    }

    /// Our timestamp clock at `now`: milliseconds (RFC 7323 §5.4 asks for a tick
    /// between 1 ms and 1 s) plus the connection's offset, modulo 2^32.
    pub(super) fn ts_now(&self, now: Time) -> u32 {
        ts_clock(now, self.ts_offset)
    }

    /// TS.Recent is younger than 24 days (RFC 7323 §5.5); valid until first set.
    fn ts_recent_valid(&self, now: Time) -> bool {
        self.ts_recent_age
            .is_none_or(|t| now.saturating_duration_since(t) <= PAWS_IDLE)
    }

    /// RFC 7323 §4.3 (2) and §5.3 R3: the TSval of a segment that covers
    /// Last.ACK.sent becomes TS.Recent unless older. Once TS.Recent is invalid (§5.5)
    /// any such TSval replaces it, as Linux does.
    fn update_ts_recent(&mut self, seg: &Segment, now: Time) {
        let Some((tsval, _)) = seg.ts else { return };
        let newer = !ts_before(tsval, self.ts_recent) || !self.ts_recent_valid(now);
        if seg.seq <= self.last_ack_sent && newer {
            self.ts_recent = tsval;
            self.ts_recent_age = Some(now);
        }
    }

    /// Initializes the receive side and the peer's window and MSS from its SYN.
    fn take_syn(&mut self, syn: &TcpRepr) {
        self.snd_wnd = u32::from(syn.window);
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl2 = SeqNum(syn.ack_number);
        let offer = SynOptions {
            mss: mss_option(syn),
            wscale: wscale_option(syn),
            sack: sack_permitted_option(syn),
            tsval: ts_option(syn).map(|t| t.0),
        };
        self.negotiate(SeqNum(syn.seq_number), &offer);
    }

    /// The receive side from the peer's ISN, and what the peer's SYN offered
    /// agreed with what we accept.
    fn negotiate(&mut self, irs: SeqNum, offer: &SynOptions) {
        self.irs = irs;
        self.rcv_nxt = self.irs + 1;
        self.rcv_adv = self.rcv_nxt;
        self.last_ack_sent = self.rcv_nxt;
        self.snd_wl1 = self.irs;
        if let (Some(shift), true) = (offer.wscale, self.config.window_scaling) {
            // RFC 7323 §2.3: a shift over 14 is taken as 14.
            self.snd_wscale = shift.min(MAX_WSCALE);
            self.rcv_wscale = self.our_wscale();
            self.wscale_agreed = true;
        }
        if let (Some(tsval), true) = (offer.tsval, self.config.timestamps) {
            // RFC 7323 §3.2, §4.3: both SYNs carry the option; echo the peer's.
            self.ts_ok = true;
            self.ts_recent = tsval;
        }
        // RFC 2018 §2: SACK only if both SYNs carry SACK-permitted.
        self.sack_ok = self.config.sack && offer.sack;
        let peer = offer.mss.unwrap_or(DEFAULT_MSS);
        let mut mss = peer.clamp(MIN_MSS, self.config.mss.max(MIN_MSS));
        if self.ts_ok {
            // RFC 9293 §3.7.1 (RFC 6691): the MSS excludes options, so the
            // timestamps on every segment come out of the data.
            mss = mss.saturating_sub(TS_OPTION_LEN as u16).max(MIN_MSS);
        }
        self.send_mss = usize::from(mss);
        self.cc = CongestionControl::new(
            self.config.congestion,
            self.send_mss as u32,
            self.config.hystart,
            self.config.large_initial_window,
        );
    }

    /// The shift that lets the window field cover the whole receive buffer.
    fn our_wscale(&self) -> u8 {
        (0..MAX_WSCALE)
            .find(|&s| self.config.recv_buffer_max >> s <= MAX_WINDOW)
            .unwrap_or(MAX_WSCALE)
    }

    /// A window field of the peer's, in bytes.
    fn peer_window(&self, field: u16) -> u32 {
        u32::from(field) << self.snd_wscale
    }

    /// The state.
    pub fn state(&self) -> TcpState {
        self.state
    }

    /// Why the connection closed, if abnormally.
    pub fn error(&self) -> Option<TcpError> {
        self.error
    }

    /// Our address.
    pub fn local(&self) -> SocketAddrV4 {
        self.local
    }

    /// The peer's address.
    pub fn remote(&self) -> SocketAddrV4 {
        self.remote
    }

    /// Data bytes per segment we send.
    pub fn send_mss(&self) -> usize {
        self.send_mss
    }

    /// The current retransmission timeout, backoff included.
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    /// The counters.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }

    /// The smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// The congestion window in bytes (RFC 5681 §2).
    pub fn cwnd(&self) -> u32 {
        self.cc.window()
    }

    /// The slow-start threshold in bytes (RFC 5681 §2); `u32::MAX` until the first
    /// loss.
    pub fn ssthresh(&self) -> u32 {
        self.cc.ssthresh()
    }

    /// Queues data to send; returns how much fit in the send buffer. Takes nothing
    /// once the application closed or in states where we may no longer send.
    pub fn send(&mut self, data: &[u8]) -> usize {
        let open = matches!(
            self.state,
            TcpState::SynSent | TcpState::SynReceived | TcpState::Established | TcpState::CloseWait
        );
        if !open || self.fin_queued {
            return 0;
        }
        self.send_buf.push(data, self.config.send_buffer)
    }

    /// Bytes [`Connection::send`] would take now: the send buffer's free room
    /// (less any acknowledged bytes in lent memory still referenced).
    pub fn send_room(&self) -> usize {
        self.send_buf.room(self.config.send_buffer)
    }

    /// Bytes queued and not yet acknowledged by the peer.
    pub fn send_queue_len(&self) -> usize {
        self.send_buf.len()
    }

    /// Reads received data in order; returns how many bytes were copied.
    pub fn recv(&mut self, buf: &mut [u8]) -> usize {
        let before = self.free_window();
        let n = self.recv.read(buf);
        self.app_read += n as u64;
        if n > 0 && !self.fin_received {
            // Tell the peer when reading opened the window enough to matter: by the
            // SWS threshold and at least doubling what it may send (as Linux does).
            // Only if this read opened it: a window already that much larger than
            // the peer knows (the handshake's, unscaled in the SYN, RFC 7323 §2.2)
            // goes with the next segment, as every ACK of data carries it; sent
            // on its own, it cost a frame per connection, and woke a peer waiting
            // for our answer.
            let left = self.rcv_adv.distance_from(self.rcv_nxt);
            let opens = |free: u32| free >= left + self.sws_threshold() && free >= 2 * left;
            // The ACK owed for every second segment, held back for this read
            // (`TcpConfig::ack_on_read`).
            let owed = self.config.ack_on_read && self.second_segment_unacked();
            if owed || (opens(self.free_window()) && !opens(before)) {
                self.ack_now = true;
            }
        }
        n
    }

    /// Sends the ACK of the handshake now if it is held for a first write
    /// ([`TcpConfig::hold_handshake_ack`]): the application waits for the
    /// peer instead. True if it was held.
    pub fn release_held_ack(&mut self) -> bool {
        if std::mem::take(&mut self.handshake_ack_held) {
            self.ack_now = true;
            return true;
        }
        false
    }

    /// The receive buffer's size now: [`TcpConfig::recv_buffer`], or more once
    /// auto-tuning grew it.
    pub fn recv_buffer(&self) -> usize {
        self.recv.capacity()
    }

    /// Bytes ready for [`Connection::recv`].
    pub fn recv_queue_len(&self) -> usize {
        self.recv.len()
    }

    /// The peer closed its direction and all its data has been read.
    pub fn recv_finished(&self) -> bool {
        self.fin_received && self.recv.len() == 0
    }

    /// CLOSE (RFC 9293 §3.10.4): no more data from us; a FIN follows what is queued.
    /// The peer may go on sending (half-close).
    pub fn close(&mut self) {
        match self.state {
            TcpState::SynSent => self.enter_closed(None),
            // The FIN waits until the handshake completes.
            TcpState::SynReceived => self.fin_queued = true,
            TcpState::Established => {
                self.fin_queued = true;
                self.state = TcpState::FinWait1;
            }
            TcpState::CloseWait => {
                self.fin_queued = true;
                self.state = TcpState::LastAck;
            }
            _ => {}
        }
    }

    /// ABORT (RFC 9293 §3.10.5): a RST to the peer where it has a connection, and
    /// CLOSED at once; queued data is dropped.
    pub fn abort(&mut self) {
        if matches!(
            self.state,
            TcpState::SynReceived
                | TcpState::Established
                | TcpState::FinWait1
                | TcpState::FinWait2
                | TcpState::CloseWait
        ) {
            // SND.MAX: the peer's RCV.NXT if it has everything, which RFC 5961 §3.2
            // asks of a RST (SND.NXT may have gone back for a retransmission).
            self.rst_pending = Some(self.snd_max);
        }
        self.enter_closed(None);
    }

    fn enter_closed(&mut self, error: Option<TcpError>) {
        self.state = TcpState::Closed;
        self.error = error;
        self.rtx_deadline = None;
        self.pto_deadline = None;
        self.rack_deadline = None;
        self.ack_deadline = None;
        self.time_wait_deadline = None;
        self.fin_wait2_deadline = None;
        self.ack_now = false;
    }

    fn enter_time_wait(&mut self, now: Time) {
        self.state = TcpState::TimeWait;
        self.rtx_deadline = None;
        self.pto_deadline = None;
        self.rack_deadline = None;
        self.fin_wait2_deadline = None;
        self.time_wait_deadline = Some(now + 2 * self.config.msl);
    }

    /// Our FIN is acknowledged: FIN-WAIT-2, bounded if the application has
    /// closed its socket.
    fn enter_fin_wait2(&mut self, now: Time) {
        self.state = TcpState::FinWait2;
        self.bound_fin_wait2(now);
    }

    /// The application closed its socket (after [`Connection::close`] or a
    /// shutdown of writing): nobody reads what comes any more, so FIN-WAIT-2
    /// lasts [`TcpConfig::fin_wait2_timeout`] at most.
    pub fn abandon(&mut self, now: Time) {
        self.abandoned = true;
        self.bound_fin_wait2(now);
    }

    /// Arms the FIN-WAIT-2 timeout once the connection is both abandoned
    /// and in FIN-WAIT-2, whichever came last at `now`.
    fn bound_fin_wait2(&mut self, now: Time) {
        if self.abandoned && self.state == TcpState::FinWait2 && self.fin_wait2_deadline.is_none() {
            self.fin_wait2_deadline = Some(now + self.config.fin_wait2_timeout);
        }
    }

    /// The earliest deadline at which [`Connection::handle_timeout`] has work.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Time> {
        // Pairwise, not an iterator over the seven: asked after every event.
        earlier(
            earlier(
                earlier(self.rtx_deadline, self.pto_deadline),
                earlier(self.rack_deadline, self.ack_deadline),
            ),
            earlier(
                earlier(self.time_wait_deadline, self.fin_wait2_deadline),
                self.keepalive_deadline(),
            ),
        )
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.time_wait_deadline.is_some_and(|t| t <= now) {
            self.enter_closed(None);
            return;
        }
        if self.fin_wait2_deadline.is_some_and(|t| t <= now) {
            // Linux's orphan timeout: the peer learns of it from the RST its
            // next segment draws (the multiplexer resets it when the channel
            // goes).
            self.enter_closed(Some(TcpError::TimedOut));
            return;
        }
        if self.ack_deadline.is_some_and(|t| t <= now) {
            self.ack_deadline = None;
            self.ack_now = true;
        }
        if self.rtx_deadline.is_some_and(|t| t <= now) {
            self.rtx_deadline = None;
            self.on_rto(now);
        }
        if self.pto_deadline.is_some_and(|t| t <= now) {
            self.pto_deadline = None;
            self.on_pto(now);
        }
        if self.rack_deadline.is_some_and(|t| t <= now) {
            self.rack_deadline = None;
            self.on_rack_timer(now);
        }
        if let (Some(t), Some(ka)) = (self.keepalive_deadline(), self.config.keepalive) {
            if t <= now {
                if self.keepalive_probes >= ka.probes {
                    self.enter_closed(Some(TcpError::TimedOut));
                } else {
                    self.keepalive_probes += 1;
                    self.keepalive_pending = true;
                }
            }
        }
    }

    /// When the next keep-alive probe is due: only on an open connection with
    /// nothing outstanding, since the retransmission and persist timers watch the
    /// peer otherwise (RFC 1122 §4.2.3.6: probe only when no data or ACK arrived).
    fn keepalive_deadline(&self) -> Option<Time> {
        let ka = self.config.keepalive?;
        let idle = matches!(self.state, TcpState::Established | TcpState::CloseWait)
            && self.snd_una == self.snd_max
            && self.rtx_deadline.is_none();
        idle.then(|| self.last_heard + ka.idle + ka.interval * self.keepalive_probes)
    }

    /// Data or a FIN waits to go out.
    #[inline]
    fn has_unsent(&self) -> bool {
        let offset = self.snd_nxt.diff(self.send_base).max(0) as usize;
        offset < self.send_buf.len() || (self.fin_queued && offset == self.send_buf.len())
    }

    /// Retransmission timeout (RFC 6298 §5.4–§5.6) or persist timeout (RFC 9293
    /// §3.8.6.1): go back to the oldest unacknowledged byte and send again.
    fn on_rto(&mut self, now: Time) {
        let persist = self.snd_wnd == 0 && self.has_unsent();
        if self.snd_una == self.snd_max && !persist {
            return;
        }
        self.retries += 1;
        self.stats.timeouts += 1;
        let handshake = matches!(self.state, TcpState::SynSent | TcpState::SynReceived);
        let limit = if handshake {
            self.config.max_syn_retransmissions
        } else {
            self.config.max_retransmissions
        };
        if self.retries > limit {
            self.enter_closed(Some(TcpError::TimedOut));
            return;
        }
        self.rtt.back_off();
        // Karn: no sample from a segment that may have been sent twice.
        self.rtt_sample = None;
        if !persist {
            // RFC 5681 §3.1: a timeout is congestion; RFC 6582 §3.2 step 1 (via
            // `recover`): duplicate ACKs of what was in flight start no recovery.
            self.cc.on_timeout(self.snd_max.distance_from(self.snd_una));
            self.recover = self.snd_max;
        }
        self.in_recovery = false;
        self.dup_acks = 0;
        self.rexmit_pending = false;
        // RTO recovery replaces any probe (RFC 8985 §7.3).
        self.pto_deadline = None;
        self.tlp_pending = false;
        self.tlp = None;
        self.tlp_lost_below = None;
        // RFC 2018 §8: the receiver may have reneged, so what it held counts for
        // nothing; blocks arriving from now on still spare resending (RFC 6675 §5.1).
        self.scoreboard.clear();
        self.rack.on_rto();
        self.rack_deadline = None;
        self.snd_nxt = self.snd_una;
        self.syn_retransmitted |= handshake;
        self.probe = self.snd_wnd == 0;
        self.rtx_deadline = Some(now + self.rtt.rto());
    }

    /// SEGMENT ARRIVES (RFC 9293 §3.10.7) for this connection's 4-tuple, checksum
    /// verified.
    pub fn handle_segment(&mut self, repr: &TcpRepr, now: Time) {
        self.stats.segments_received += 1;
        let (ts, sack, plain_options) = segment_options(repr);
        let seg = Segment {
            seq: SeqNum(repr.seq_number),
            ack: SeqNum(repr.ack_number),
            flags: repr.flags,
            window: repr.window,
            // RFC 7323 §3.2: a TSopt is ignored unless both SYNs carried one.
            ts: ts.filter(|_| self.ts_ok),
            sack: if self.sack_ok {
                sack
            } else {
                [None; MAX_SACK_BLOCKS]
            },
            plain_options,
            payload: repr.payload,
        };
        if self.config.header_prediction && self.predicted(&seg, now) {
            self.stats.header_predicted += 1;
            return;
        }
        match self.state {
            TcpState::Closed => {}
            TcpState::SynSent => self.on_syn_sent(&seg, repr, now),
            _ => self.on_synchronized(seg, now),
        }
    }

    /// Header prediction (Van Jacobson; BSD's tcp_input): in ESTABLISHED, the
    /// common segment, the next in sequence with only ACK (and PSH) set, no options
    /// but fresh timestamps, the window unchanged and nothing being resent, is
    /// a pure ACK of new data or in-order data acknowledging nothing new, or
    /// (as Linux's fast path also takes) in-order data acknowledging new data,
    /// every segment of a request-response exchange. Each takes the steps of
    /// the general path that can apply to it, and skips the checks that cannot
    /// fail; the general path stays the reference ([`TcpConfig::header_prediction`]
    /// switches this off). False if `seg` is not such a segment, having changed
    /// nothing.
    fn predicted(&mut self, seg: &Segment, now: Time) -> bool {
        let common = self.state == TcpState::Established
            && seg.flags & !flags::PSH == flags::ACK
            && seg.seq == self.rcv_nxt
            && seg.plain_options
            && seg.ts.is_some() == self.ts_ok
            && seg
                .ts
                .is_none_or(|(tsval, _)| !ts_before(tsval, self.ts_recent))
            && self.snd_wnd > 0
            && self.peer_window(seg.window) == self.snd_wnd
            && self.snd_nxt == self.snd_max
            && (self.snd_wl1 < seg.seq || (self.snd_wl1 == seg.seq && self.snd_wl2 <= seg.ack));
        if !common {
            return false;
        }
        // Nothing SACKed and no recovery: the general path's ACK steps (RACK's
        // loss detection among them, run on every ACK) have nothing to find,
        // even on data that acknowledges nothing new.
        let quiet = !self.in_recovery && self.scoreboard.is_empty();
        let new_ack = seg.ack > self.snd_una && seg.ack <= self.snd_max;
        let in_order_data = !seg.payload.is_empty()
            && !self.recv.has_gap()
            && self.rx_fin.is_none()
            && seg.payload.len() <= self.recv.window();
        // A pure ACK of new data, in-order data acknowledging nothing new, or
        // (a request-response exchange's every segment) in-order data
        // acknowledging new data: the ACK's steps, then the data's, in the
        // general path's order.
        let takes_ack = quiet && new_ack && (seg.payload.is_empty() || in_order_data);
        let data_alone = quiet && in_order_data && seg.ack == self.snd_una;
        if !takes_ack && !data_alone {
            return false;
        }
        self.last_heard = now;
        self.keepalive_probes = 0;
        self.update_ts_recent(seg, now);
        if takes_ack {
            self.congestion_on_ack(seg, now);
            let rtt = self.ack_advance(seg.ack, now, seg.ts.map(|t| t.1));
            self.hystart_on_ack(seg.ack, rtt, now);
        }
        self.snd_wl1 = seg.seq;
        self.snd_wl2 = seg.ack;
        self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
        if in_order_data {
            self.take_text(seg, now);
        }
        true
    }

    /// RFC 9293 §3.10.7.3.
    fn on_syn_sent(&mut self, seg: &Segment, repr: &TcpRepr, now: Time) {
        // First, the ACK: ISS < SEG.ACK =< SND.NXT.
        let ack_ok = seg.has(flags::ACK) && seg.ack > self.iss && seg.ack <= self.snd_max;
        if seg.has(flags::ACK) && !ack_ok {
            if !seg.has(flags::RST) {
                self.rst_pending = Some(seg.ack);
            }
            return;
        }
        // Second, RST: only with an acceptable ACK (RFC 5961 §3.2 leaves SYN-SENT so).
        if seg.has(flags::RST) {
            if ack_ok {
                self.enter_closed(Some(TcpError::Refused));
            }
            return;
        }
        // Fourth, SYN. Data on it is left for the peer to resend, as in `accept`.
        if !seg.has(flags::SYN) {
            return;
        }
        self.take_syn(repr);
        self.last_heard = now;
        if self.ts_ok {
            self.ts_recent_age = Some(now);
        }
        if ack_ok {
            self.state = TcpState::Established;
            // The SYN-ACK's TSecr echoes the SYN copy it answers (RFC 7323 §4.1).
            let tsecr = if self.ts_ok { ts_option(repr) } else { None };
            self.ack_advance(seg.ack, now, tsecr.map(|t| t.1));
            self.after_handshake();
            match self.config.delayed_ack {
                Some(delay) if self.config.hold_handshake_ack => {
                    self.ack_deadline = Some(now + delay);
                    self.handshake_ack_held = true;
                }
                _ => self.ack_now = true,
            }
        } else {
            // Simultaneous open: SYN-ACK with our ISS again, which makes the SYN's
            // timing worthless (Karn).
            self.state = TcpState::SynReceived;
            self.snd_nxt = self.iss;
            self.rtt_sample = None;
        }
    }

    fn after_handshake(&mut self) {
        if self.syn_retransmitted {
            self.rtt.reinitialize(RTO_AFTER_SYN_LOSS);
            self.cc.syn_lost();
        }
        if self.fin_queued {
            self.state = TcpState::FinWait1;
        }
    }

    /// RFC 9293 §3.10.7.4, for SYN-RECEIVED and the synchronized states.
    fn on_synchronized(&mut self, mut seg: Segment, now: Time) {
        // RFC 7323 §5.3 R1, PAWS, before the sequence number check: a TSval older
        // than a valid TS.Recent marks an old duplicate (of a previous incarnation or
        // from a wrapped sequence space), dropped and answered with an ACK. RSTs are
        // exempt (§5.3, last paragraph), lest a stale TS.Recent block them.
        if let Some((tsval, _)) = seg.ts {
            if !seg.has(flags::RST) && ts_before(tsval, self.ts_recent) && self.ts_recent_valid(now)
            {
                self.stats.paws_rejected += 1;
                if seg.len() == 0 {
                    // Bare ACKs under the RFC 5961 §7 limit, as out-of-window ones.
                    self.challenge_ack(now);
                } else {
                    self.ack_now = true;
                }
                return;
            }
        }
        if self.state == TcpState::SynReceived && seg.has(flags::SYN) && seg.seq == self.irs {
            if seg.has(flags::ACK) {
                // Simultaneous open: the peer's SYN-ACK. Its SYN we know; its ACK
                // completes our handshake. (RFC 9293's acceptability test would
                // reject the SYN's sequence number, RFC 9293 errata aside.)
                seg.seq = seg.seq + 1;
                seg.flags &= !flags::SYN;
            } else if !seg.has(flags::RST) {
                // The peer's SYN again: our SYN-ACK was lost. Echo this copy's
                // TSval, so the peer's RTT sample starts at this SYN.
                self.update_ts_recent(&seg, now);
                self.snd_nxt = self.iss;
                return;
            }
        }

        // First, the sequence number (§3.10.7.4 table).
        let wnd = self.recv.window() as u32;
        let len = seg.len();
        let acceptable = match (len, wnd) {
            (0, 0) => seg.seq == self.rcv_nxt,
            (0, _) => seg.seq.in_range(self.rcv_nxt, wnd),
            (_, 0) => false,
            _ => {
                seg.seq.in_range(self.rcv_nxt, wnd)
                    || (seg.seq + (len - 1)).in_range(self.rcv_nxt, wnd)
            }
        };
        // A zero window still takes valid ACKs and RSTs at RCV.NXT (RFC 9293
        // §3.10.7.4: "special allowance"); their data is not taken.
        let control_only = !acceptable && wnd == 0 && seg.seq == self.rcv_nxt;
        if control_only && len > 0 {
            // A window probe, answered with the (still zero) window.
            self.ack_now = true;
        }
        if acceptable || control_only {
            self.last_heard = now;
            self.keepalive_probes = 0;
        } else {
            if !seg.has(flags::RST) {
                if seg.len() == 0 || seg.has(flags::SYN) {
                    // A bare ACK: answering each without limit lets two ends that
                    // disagree ping-pong forever (Linux limits these too). A SYN
                    // gets RFC 5961 §4's challenge ACK.
                    self.challenge_ack(now);
                } else {
                    let end = seg.seq + seg.payload.len() as u32;
                    if !seg.payload.is_empty() && end <= self.rcv_nxt {
                        // Data we had: a spurious retransmission, or a copy.
                        self.report_duplicate(seg.seq, end);
                    }
                    self.ack_now = true;
                }
                if self.state == TcpState::TimeWait && seg.has(flags::FIN) {
                    // A retransmitted FIN: our ACK was lost; wait 2 MSL from now.
                    self.enter_time_wait(now);
                }
            }
            return;
        }

        // Second, RST (RFC 5961 §3.2): only an exact match resets; one elsewhere in
        // the window gets a challenge ACK, which a real peer answers with an exact RST.
        if seg.has(flags::RST) {
            if seg.seq == self.rcv_nxt {
                let error = match self.state {
                    TcpState::SynReceived if !self.passive => Some(TcpError::Refused),
                    TcpState::Closing | TcpState::LastAck | TcpState::TimeWait => None,
                    _ => Some(TcpError::Reset),
                };
                self.enter_closed(error);
            } else {
                self.challenge_ack(now);
            }
            return;
        }

        // Fourth, SYN (RFC 5961 §4.2): in any synchronized state, in window or not,
        // a challenge ACK; a peer that really restarted answers it with a RST.
        if seg.has(flags::SYN) {
            self.challenge_ack(now);
            return;
        }

        // Fifth, the ACK.
        if !seg.has(flags::ACK) {
            return;
        }
        let handshake = self.state == TcpState::SynReceived;
        if handshake {
            if !(seg.ack > self.snd_una && seg.ack <= self.snd_max) {
                self.rst_pending = Some(seg.ack);
                return;
            }
            self.state = TcpState::Established;
            self.snd_wnd = self.peer_window(seg.window);
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
            self.after_handshake();
        }
        // RFC 5961 §5.2: an ACK of something never sent, or too old to be from this
        // connection's recent past, is answered and the segment dropped.
        if seg.ack > self.snd_max || seg.ack < self.snd_una - self.max_snd_wnd {
            self.challenge_ack(now);
            return;
        }
        // RFC 7323 §5.3 R3, here rather than right after the sequence check so that
        // only segments passing the RST, SYN and ACK checks move TS.Recent.
        self.update_ts_recent(&seg, now);
        if !handshake {
            self.congestion_on_ack(&seg, now);
        }
        if seg.ack > self.snd_una {
            let rtt = self.ack_advance(seg.ack, now, seg.ts.map(|t| t.1));
            if !handshake {
                self.hystart_on_ack(seg.ack, rtt, now);
            }
        }
        // SND.UNA =< SEG.ACK here; update the window from the newest segment only.
        if self.snd_wl1 < seg.seq || (self.snd_wl1 == seg.seq && self.snd_wl2 <= seg.ack) {
            if self.snd_wnd == 0 && seg.window > 0 && seg.ack == self.snd_una {
                // The window opened without taking the probe byte: send it again
                // now rather than after the (backed-off) timeout, and time nothing
                // that was sent before (Karn).
                self.snd_nxt = self.snd_una;
                self.rtt_sample = None;
            }
            self.snd_wnd = self.peer_window(seg.window);
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
            self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
        }
        if self.snd_wnd == 0 {
            // An answer to a window probe: the peer is alive (RFC 9293 §3.8.6.1: keep
            // probing as long as it answers).
            self.retries = 0;
        }
        if self.fin_acked() {
            match self.state {
                TcpState::FinWait1 => self.enter_fin_wait2(now),
                TcpState::Closing => self.enter_time_wait(now),
                TcpState::LastAck => {
                    self.enter_closed(None);
                    return;
                }
                _ => {}
            }
        }

        // Sixth, URG: urgent data is delivered inline like any other.

        // Seventh, the text.
        if !control_only
            && !seg.payload.is_empty()
            && matches!(
                self.state,
                TcpState::Established | TcpState::FinWait1 | TcpState::FinWait2
            )
        {
            self.take_text(&seg, now);
        }

        // Eighth, FIN: it takes effect once everything before it has arrived.
        if !control_only && seg.has(flags::FIN) && !self.fin_received && self.rx_fin.is_none() {
            let fin = seg.seq + seg.payload.len() as u32;
            self.rx_fin = Some(fin);
            // Out of order, at once (RFC 5681 §4.2); in order, as `check_fin` says.
            self.ack_now |= fin != self.rcv_nxt;
        }
        self.check_fin(now);
    }

    /// Congestion window and recovery from an acceptable ACK, before SND.UNA and
    /// SND.WND take it in.
    fn congestion_on_ack(&mut self, seg: &Segment, now: Time) {
        let flight = self.snd_max.distance_from(self.snd_una);
        if self.rack_records() && seg.ack > self.snd_una {
            let tsecr = seg.ts.map(|t| t.1);
            self.rack.on_ack(seg.ack, now, tsecr, self.ts_offset);
        }
        let newly_sacked = self.take_sack_blocks(seg, now);
        let rack_lost = self.rack_on() && self.rack_detect(now);
        if seg.ack > self.snd_una {
            let acked = seg.ack.distance_from(self.snd_una);
            self.dup_acks = 0;
            if self.tlp_repaired_loss(seg) {
                // RFC 8985 §7.4.2: the probe repaired a loss, a congestion event:
                // cwnd reduced as on entering fast recovery.
                self.cc.enter_recovery(flight, false);
            } else if !self.in_recovery && rack_lost && seg.ack >= self.recover {
                self.rack_enter_recovery(flight);
            } else if !self.in_recovery {
                let srtt = self.rtt.srtt().unwrap_or_default();
                self.cc.on_ack(acked, now, srtt);
                // RFC 6675 §5: an ACK that SACKs new data is a duplicate
                // "regardless of its status as a cumulative acknowledgment",
                // and enters recovery once IsLost(HighACK + 1): here, for the
                // hole at the new SND.UNA. (RACK, on, decided above.)
                if !self.rack_on()
                    && self.sack_ok
                    && newly_sacked > 0
                    && seg.ack > self.recover
                    && self.hole_lost(self.scoreboard.partition_point(|&(_, e)| e <= seg.ack))
                {
                    self.dup_acks = 1;
                    self.enter_loss_recovery(flight - acked, false);
                }
            } else if seg.ack >= self.recover {
                // RFC 6582 §3.2 step 3, RFC 6675 §5 (A): a full ACK.
                self.in_recovery = false;
                // Which ends the probe timer's episode in it (see `on_pto`).
                self.tlp = None;
                self.tlp_lost_below = None;
                self.rack.on_recovery_exit();
                self.cc.exit_recovery(flight - acked);
                if rack_lost {
                    // Lost beyond the recovery point: sent after recovery began,
                    // a new loss event.
                    self.rack_enter_recovery(flight - acked);
                }
            } else if !self.sack_ok {
                // RFC 6582 step 5: a partial ACK; the next hole is lost too. (With
                // SACK the scoreboard says which holes are.)
                self.cc.on_partial_ack(acked);
                self.rexmit_pending = true;
            }
            return;
        }
        // RFC 5681 §2: a duplicate ACK acknowledges nothing new while data is
        // outstanding, carries no data, SYN or FIN, and leaves the window alone.
        // With SACK, RFC 6675 §2 counts instead an ACK that SACKs new data,
        // "even if it carries new data, changes the advertised window, or moves
        // the cumulative acknowledgment point": a receiver whose buffer grows
        // while it holds out-of-order data announces a new window with them.
        let duplicate = seg.ack == self.snd_una
            && flight > 0
            && if self.sack_ok {
                newly_sacked > 0
            } else {
                seg.payload.is_empty()
                    && !seg.has(flags::SYN | flags::FIN)
                    && self.peer_window(seg.window) == self.snd_wnd
            };
        if self.rack_on() {
            // RFC 8985 §6.2: RACK alone marks losses (DupThresh only through its
            // reordering window); duplicate ACKs still drive Limited Transmit.
            self.dup_acks += u32::from(duplicate);
            if rack_lost && !self.in_recovery && self.snd_una >= self.recover {
                self.rack_enter_recovery(flight);
            }
            return;
        }
        if !duplicate {
            return;
        }
        self.dup_acks += 1;
        if self.in_recovery {
            if !self.sack_ok {
                self.cc.on_dup_ack();
            }
            return;
        }
        // RFC 5681 §3.2 fast retransmit; RFC 6582 §3.2 step 2 recovery (only past
        // `recover`, so one loss event is not taken for several). RFC 6675 §5 (B)
        // enters as well once the scoreboard marks SND.UNA lost, as several
        // out-of-order segments may be answered by fewer duplicate ACKs.
        // RFC 8985 §7.4 (with §6.2's rule): a duplicate ACK while a probe is out
        // answers the probe, sent a PTO after everything before it, all of whose
        // ACKs are in: what the peer lacks below the probe is lost. Without SACK
        // this takes the one duplicate ACK the probe elicits.
        let probe_answered = self.tlp.is_some();
        let lost = if self.sack_ok {
            self.dup_acks >= DUP_THRESH || self.hole_lost(0) || probe_answered
        } else {
            self.dup_acks == DUP_THRESH || probe_answered
        };
        if lost && self.snd_una > self.recover {
            self.enter_loss_recovery(flight, probe_answered);
        }
    }

    /// RFC 5681 §3.2 fast retransmit and the recovery of RFC 6582 §3.2 step 2
    /// or RFC 6675 §5 step (4), `flight` bytes outstanding; `probe_answered`
    /// when a duplicate ACK answered the tail loss probe (RFC 8985 §7.4).
    fn enter_loss_recovery(&mut self, flight: u32, probe_answered: bool) {
        self.in_recovery = true;
        self.recover = self.snd_max;
        // NewReno's inflation stands for three duplicate ACKs, not the probe's.
        let inflate = !self.sack_ok && !probe_answered;
        self.cc.enter_recovery(flight, inflate);
        self.high_rxt = self.snd_una;
        self.rexmit_pending = true;
        // Recovery ends the probe's episode (RFC 8985 §7.4.2, as Linux).
        if probe_answered {
            self.stats.tlp_recoveries += 1;
            self.tlp_lost_below = Some(self.snd_max);
        }
        self.tlp = None;
        self.pto_deadline = None;
    }

    /// HyStart++ (RFC 9406 §4.2) takes the ACK's RTT sample after the window grew
    /// by the ACK, and may end slow start.
    fn hystart_on_ack(&mut self, ack: SeqNum, rtt: Option<Duration>, now: Time) {
        // Without timestamps, Karn's rule leaves one sample per round trip,
        // fewer than HyStart++ needs (RFC 9406 §4.2: N_RTT_SAMPLE); RACK's
        // send times give one per ACK, from segments sent once.
        let sample = self.rack.take_sample();
        let rtt = if self.ts_ok { rtt } else { rtt.or(sample) };
        match self.cc.hystart_on_ack(ack, self.snd_max, rtt, now) {
            Some(HyStartEvent::CssEntered) => self.stats.css_entries += 1,
            Some(HyStartEvent::SlowStartExited) => self.stats.hystart_exits += 1,
            None => {}
        }
    }

    /// RFC 8985 §7.4: an ACK at or beyond the probe ends its episode. True if the
    /// probe was old data sent again and its original had been lost: §7.4.2 tells
    /// by D-SACK, which we lack; timestamps tell instead (as Eifel detection, RFC
    /// 3522), since an echo older than the probe's TSval answers the original.
    /// Without them every acknowledged retransmitted probe counts as a repair.
    fn tlp_repaired_loss(&mut self, seg: &Segment) -> bool {
        let Some(tlp) = self.tlp.filter(|t| seg.ack >= t.end) else {
            return false;
        };
        self.tlp = None;
        let original_arrived = seg.ts.is_some_and(|(_, tsecr)| ts_before(tsecr, tlp.tsval));
        let repaired = tlp.retrans && !original_arrived;
        if repaired {
            self.stats.tlp_recoveries += 1;
        }
        repaired
    }

    /// Merges the segment's SACK blocks into the scoreboard (and RACK's records)
    /// and returns how many bytes they newly cover. A block must lie within
    /// SND.UNA..SND.MAX: others are stale or forged, and ignored, as is a D-SACK
    /// (RFC 2883 §4: a first block below SEG.ACK or within the second), which
    /// widens RACK's reordering window instead.
    fn take_sack_blocks(&mut self, seg: &Segment, now: Time) -> u32 {
        // Most ACKs carry none: nothing to set up.
        if seg.sack.iter().all(Option::is_none) {
            return 0;
        }
        let mut newly = 0;
        let mut taken = [(SeqNum(0), SeqNum(0)); MAX_SACK_BLOCKS];
        let mut count = 0;
        let dsack = match seg.sack {
            [Some((l, r)), second, ..] => {
                let (l, r) = (SeqNum(l), SeqNum(r));
                l < r
                    && (r <= seg.ack
                        || second.is_some_and(|(sl, sr)| SeqNum(sl) <= l && r <= SeqNum(sr)))
            }
            _ => false,
        };
        if dsack {
            self.stats.dsacks_received += 1;
            if self.rack_on() {
                self.rack.on_dsack(self.snd_una, self.snd_max);
            }
        }
        for (i, (l, r)) in seg.sack.into_iter().flatten().enumerate() {
            let (l, r) = (SeqNum(l), SeqNum(r));
            if (i == 0 && dsack) || !(self.snd_una <= l && l < r && r <= self.snd_max) {
                self.stats.sack_blocks_ignored += 1;
                continue;
            }
            self.stats.sack_blocks_received += 1;
            taken[count] = (l, r);
            count += 1;
            let before: u32 = self.sacked_bytes();
            // Take out every range touching [l, r) and put back their union.
            let (mut start, mut end) = (l, r);
            self.scoreboard.retain(|&(s, e)| {
                let apart = e < start || s > end;
                if !apart {
                    start = if s < start { s } else { start };
                    end = end.max(e);
                }
                apart
            });
            let at = self.scoreboard.partition_point(|&(s, _)| s < start);
            self.scoreboard.insert(at, (start, end));
            newly += self.sacked_bytes() - before;
        }
        if self.rack_on() {
            // In sequence order, for RACK's reordering detection (RFC 8985 §6.2
            // step 3).
            let taken = &mut taken[..count];
            taken.sort_unstable_by_key(|b| b.0.diff(self.snd_una));
            for &(l, r) in taken.iter() {
                self.rack.on_sack(l, r, now);
            }
        }
        newly
    }

    fn sacked_bytes(&self) -> u32 {
        self.scoreboard
            .iter()
            .map(|&(s, e)| e.distance_from(s))
            .sum()
    }

    /// RFC 6675 §4 IsLost for the hole below scoreboard range `i` (its every byte
    /// has the same ranges above it): DupThresh discontiguous SACKed ranges above,
    /// or more than (DupThresh − 1) × SMSS SACKed bytes.
    fn hole_lost(&self, i: usize) -> bool {
        let above = self.scoreboard.get(i..).unwrap_or_default();
        let bytes: u32 = above.iter().map(|&(s, e)| e.distance_from(s)).sum();
        above.len() as u32 >= DUP_THRESH || bytes > (DUP_THRESH - 1) * self.send_mss as u32
    }

    /// The holes below the highest SACKed byte as [start, end) and whether lost.
    fn holes(&self) -> impl Iterator<Item = (SeqNum, SeqNum, bool)> + '_ {
        let starts = std::iter::once(self.snd_una).chain(self.scoreboard.iter().map(|r| r.1));
        starts
            .zip(&self.scoreboard)
            .enumerate()
            .map(|(i, (a, &(b, _)))| {
                let before_probe = self.tlp_lost_below.is_some_and(|end| b <= end);
                (a, b, before_probe || self.hole_lost(i))
            })
            .filter(|&(a, b, _)| a < b)
    }

    /// RFC 6675 §4 SetPipe: bytes thought in flight. Of the bytes not SACKed, those
    /// not lost count once, and those retransmitted (below HighRxt) once more.
    fn pipe(&self) -> u32 {
        let hole = |a: SeqNum, b: SeqNum, lost: bool| {
            let rtx = if b < self.high_rxt { b } else { self.high_rxt };
            rtx.distance_from(a) + if lost { 0 } else { b.distance_from(a) }
        };
        let tail = self.scoreboard.last().map_or(self.snd_una, |r| r.1);
        self.holes()
            .map(|(a, b, lost)| hole(a, b, lost))
            .sum::<u32>()
            + hole(tail, self.snd_max, false)
    }

    /// RFC 6675 §4 NextSeg rules (1) and (3): the first hole byte above HighRxt
    /// and below the highest SACKed byte, lost or (`any`) not, and how many bytes
    /// of the hole follow it.
    fn next_hole(&self, any: bool) -> Option<(SeqNum, u32)> {
        self.holes()
            .filter(|&(_, _, lost)| lost || any)
            .map(|(a, b, _)| (a.max(self.high_rxt), b))
            .find(|&(a, b)| a < b)
            .map(|(a, b)| (a, b.distance_from(a)))
    }

    /// An ACK demanded by RFC 5961, or by a bare ACK outside the window, within the
    /// per-second limit of RFC 5961 §7.
    fn challenge_ack(&mut self, now: Time) {
        let (start, sent) = &mut self.challenge_window;
        if now >= *start + Duration::from_secs(1) {
            (*start, *sent) = (now, 0);
        }
        if *sent < self.config.challenge_ack_limit {
            *sent += 1;
            self.ack_now = true;
            self.stats.challenge_acks += 1;
        } else {
            self.stats.challenge_acks_suppressed += 1;
        }
    }

    fn take_text(&mut self, seg: &Segment, now: Time) {
        let off = seg.seq.diff(self.rcv_nxt);
        let (off, data) = if off < 0 {
            let skip = (off.unsigned_abs() as usize).min(seg.payload.len());
            if skip > 0 {
                self.report_duplicate(seg.seq, seg.seq + skip as u32);
            }
            (0, &seg.payload[skip..])
        } else {
            (off as usize, seg.payload)
        };
        let gap_before = self.recv.has_gap();
        let at = self.recv.offset() + off as u64;
        if off > 0
            && !data.is_empty()
            && self
                .recv
                .run_at(at)
                .is_some_and(|(_, end)| at + data.len() as u64 <= end)
        {
            // Out-of-order data we hold already: a D-SACK, with the block that
            // holds it second (RFC 2883 §4, example 5).
            self.report_duplicate(seg.seq, seg.seq + data.len() as u32);
        }
        let advanced = self.recv.write(off, data);
        self.rcv_nxt = self.rcv_nxt + advanced as u32;
        if advanced > 0 {
            self.measure_rcv_rtt(seg, now);
            self.tune_recv_buffer(now);
        }
        // In-order data with nothing held out of order (nearly always) leaves
        // the list empty.
        if self.sack_ok && (off > 0 || !self.sack_recent.is_empty()) {
            // RFC 2018 §4: the block holding the latest arrival goes first; ones
            // delivered in order since are dropped.
            let next = self.recv.offset();
            self.sack_recent.retain(|&a| a >= next && a != at);
            if off > 0 {
                self.sack_recent.push_front(at);
                self.sack_recent.truncate(SACK_HISTORY);
            }
        }
        // RFC 5681 §4.2: out-of-order data, and data filling a hole, are acknowledged
        // at once, so the sender learns of losses quickly.
        if off > 0 {
            self.dup_acks_owed += 1;
        }
        if off > 0 || advanced != data.len() || gap_before {
            self.ack_now = true;
            return;
        }
        match self.config.delayed_ack {
            Some(delay) => {
                self.unacked_segments += 1;
                let ramping = self.ramping();
                let behind =
                    self.config.ack_on_read && self.recv.len() > self.unread_at_ack && !ramping;
                // At a connection's start, a full-sized segment is
                // acknowledged at the end of its batch, the odd last one of
                // a flight too, for the first [`QUICK_ACKS`] ACKs (Linux's
                // quick ACKs, `tcp_incr_quickack`): held for the
                // delayed-ACK bound, it kept the sender's slow start waiting
                // as long (about 1 ms of a 10 MB transfer's first 2 through
                // two daemons). A short request still waits, for its answer
                // to carry the ACK.
                let quick = ramping && self.quick_acks > 0 && data.len() >= self.full_segment();
                if quick && !self.ack_now {
                    self.quick_owed = true;
                }
                if quick || (self.second_segment_unacked() && !behind) {
                    self.ack_now = true;
                } else if self.ack_deadline.is_none() {
                    self.ack_deadline = Some(now + delay);
                }
            }
            None => self.ack_now = true,
        }
    }

    /// Less than a receive buffer's worth of data has come: until then
    /// [`TcpConfig::ack_on_read`] holds no ACK. The sender's slow start grows
    /// by the segments each ACK covers, at most one MSS (RFC 3465's L = 1),
    /// so ACKs held for the reads of whole batches kept it near linear: 2 MB
    /// through two daemons took 1.46 Gbit/s (median of 7) against 2.35 with
    /// this, where a bulk transfer takes 6. Linux's receiver, likewise,
    /// acknowledges every second segment at once while its advertised
    /// window still grows (`rcv_ssthresh`).
    fn ramping(&self) -> bool {
        self.app_read + (self.recv.len() as u64) < self.config.recv_buffer as u64
    }

    /// RFC 9293 §3.8.6.3: an ACK is owed for every second full-sized segment.
    fn second_segment_unacked(&self) -> bool {
        self.unacked_segments >= 2
    }

    /// Data in `l..r` came again: reported by the next ACK's first SACK block (RFC
    /// 2883 §4, a D-SACK; the first duplicate since the last ACK counts).
    fn report_duplicate(&mut self, l: SeqNum, r: SeqNum) {
        if self.sack_ok && self.dsack.is_none() {
            self.dsack = Some((l, r));
        }
    }

    /// Linux's tcp_rcv_rtt_measure_ts and tcp_rcv_rtt_measure: the receiver's RTT
    /// from the echo of our TSval on new data (smoothed by 1/8), or else from the
    /// time a whole window takes to arrive (an overestimate, so the least is kept).
    fn measure_rcv_rtt(&mut self, seg: &Segment, now: Time) {
        if let Some((_, tsecr)) = seg.ts.filter(|t| t.1 != 0) {
            let d = self.ts_now(now).wrapping_sub(tsecr);
            if d as i32 >= 0 {
                let sample = Duration::from_millis(u64::from(d.max(1)));
                self.rcv_rtt = Some(match self.rcv_rtt {
                    Some(r) => r - r / 8 + sample / 8,
                    None => sample,
                });
            }
            return;
        }
        match self.rcv_rtt_window {
            Some((seq, _)) if self.rcv_nxt < seq => return,
            Some((_, start)) => {
                let sample = now.saturating_duration_since(start);
                self.rcv_rtt = Some(self.rcv_rtt.map_or(sample, |r| r.min(sample)));
            }
            None => {}
        }
        let window = self.rcv_adv.distance_from(self.rcv_nxt);
        self.rcv_rtt_window = Some((self.rcv_nxt + window.max(1), now));
    }

    /// Dynamic right-sizing (Fisk and Feng; Linux's tcp_rcv_space_adjust): once per
    /// receiver RTT, if the application read more than in any round before, it
    /// keeps up and the window is what limits the sender, so the buffer grows to
    /// twice that, and more while the rate still climbs (a sender in slow start
    /// doubles per round trip).
    fn tune_recv_buffer(&mut self, now: Time) {
        let ceiling = self
            .config
            .recv_buffer_max
            .min(MAX_WINDOW << self.rcv_wscale);
        if self.recv.capacity() >= ceiling {
            return;
        }
        let Some(rtt) = self.rcv_rtt.or(self.rtt.srtt()) else {
            return;
        };
        let (start, read) = *self.drs_mark.get_or_insert((now, self.app_read));
        if now.saturating_duration_since(start) < rtt {
            return;
        }
        self.drs_mark = Some((now, self.app_read));
        let copied = self.app_read - read;
        if copied <= self.drs_space {
            return;
        }
        let space = self.drs_space.max(1);
        let mut window = 2 * copied + 16 * u64::from(self.config.mss);
        window += 2 * window * (copied - space) / space;
        self.drs_space = copied;
        let target = (window.min(ceiling as u64)) as usize;
        if target > self.recv.capacity() {
            self.recv.grow(target);
            self.stats.recv_buffer_growths += 1;
        }
    }

    fn check_fin(&mut self, now: Time) {
        if self.fin_received || self.rx_fin != Some(self.rcv_nxt) {
            return;
        }
        self.fin_received = true;
        self.rcv_nxt = self.rcv_nxt + 1;
        match (self.state, self.config.delayed_ack) {
            // As Linux (which turns to delayed ACKs on a FIN): the application
            // reads the end and closes at once as a rule, and its FIN then
            // carries this ACK, one segment instead of two; the delayed-ACK
            // bound holds if it does not.
            (TcpState::Established, Some(delay)) => {
                self.ack_deadline = earlier(self.ack_deadline, Some(now + delay));
            }
            _ => self.ack_now = true,
        }
        match self.state {
            TcpState::SynReceived | TcpState::Established => self.state = TcpState::CloseWait,
            TcpState::FinWait1 if self.fin_acked() => self.enter_time_wait(now),
            TcpState::FinWait1 => self.state = TcpState::Closing,
            TcpState::FinWait2 => self.enter_time_wait(now),
            _ => {}
        }
    }

    /// Only the connection's end is left to hear: our FIN is sent, with at
    /// most one segment of data unacknowledged before it. Nothing the peer
    /// sends can then start a recovery (duplicate ACKs need more segments in
    /// flight, RFC 5681 §3.2), so how soon it is looked at changes only how
    /// soon the connection's state goes; a lost FIN or segment is the
    /// retransmission timer's anyway.
    pub fn winding_down(&self) -> bool {
        self.fin_sent() && self.snd_max.distance_from(self.snd_una) <= self.send_mss() as u32 + 1
    }

    /// Our FIN went out (SND.MAX is past the data).
    fn fin_sent(&self) -> bool {
        self.fin_queued && self.snd_max > self.send_base + self.send_buf.len() as u32
    }

    /// Our FIN was sent and acknowledged.
    fn fin_acked(&self) -> bool {
        self.fin_queued && self.snd_una == self.send_base + self.send_buf.len() as u32 + 1
    }

    /// New data acknowledged: SND.UNA < SEG.ACK =< SND.MAX. Returns the RTT sample
    /// the ACK gave, if any.
    fn ack_advance(&mut self, ack: SeqNum, now: Time, tsecr: Option<u32>) -> Option<Duration> {
        let flight = self.snd_max.distance_from(self.snd_una);
        self.snd_una = ack;
        let acked = (ack.distance_from(self.send_base) as usize).min(self.send_buf.len());
        self.send_buf.drain(acked);
        self.send_base = self.send_base + acked as u32;
        self.snd_nxt = self.snd_nxt.max(self.snd_una);
        self.high_rxt = self.high_rxt.max(self.snd_una);
        let una = self.snd_una;
        self.scoreboard.retain_mut(|r| {
            r.0 = r.0.max(una);
            r.0 < r.1
        });
        self.rack.on_cumulative_ack(una);
        // RFC 7323 §4.1: with timestamps every ACK of new data is a sample, even of a
        // retransmitted segment, since the echo names the copy that arrived (Karn's
        // ambiguity is gone). A TSecr ahead of our clock is no echo of ours.
        let ts_rtt = tsecr
            .filter(|_| self.ts_ok)
            .map(|e| self.ts_now(now).wrapping_sub(e))
            .filter(|&d| d as i32 >= 0);
        let mut sample = None;
        if let Some(d) = ts_rtt {
            // RFC 7323 §4.2: ExpectedSamples = ceil(FlightSize / (SMSS × 2)).
            let expected = flight.div_ceil(2 * self.send_mss as u32);
            let r = Duration::from_millis(u64::from(d));
            self.rtt.sample_weighted(r, expected);
            self.stats.ts_rtt_samples += 1;
            self.rtt_sample = None;
            sample = Some(r);
        } else if let Some((end, sent)) = self.rtt_sample {
            if ack >= end {
                let r = now.saturating_duration_since(sent);
                self.rtt.sample(r);
                self.rtt_sample = None;
                sample = Some(r);
            }
        }
        self.retries = 0;
        self.probe = false;
        // RFC 6298 §5.2, §5.3.
        self.rtx_deadline =
            (self.snd_una != self.snd_max).then(|| now.after_nanos(self.rtt.rto_nanos()));
        // RFC 8985 §7.2: restarted by an ACK of new data.
        self.arm_pto(now);
        sample
    }

    /// The probe timer expired (RFC 8985 §7.3), nothing acknowledged for 2·SRTT.
    /// With nothing SACKed and not in recovery, a probe goes out, then the RTO
    /// waits behind it. Otherwise, where §7.2 arms no PTO because RACK (§6) would
    /// find the losses: every segment below the highest SACKed byte was last sent
    /// more than a PTO ago, longer than RACK's RTT plus reordering window (§6.2),
    /// and so is lost. Without RACK ([`TcpConfig::rack`]) this is its only
    /// stand-in; with it, this catches what RACK cannot see, a retransmission with
    /// nothing sent after it delivered (which §7.2 leaves to the RTO). Outside
    /// recovery that starts it (once per window, RFC 6582 §3.2 step 2); in
    /// recovery the holes already resent count as lost again (their
    /// retransmissions were), and NewReno resends SND.UNA. Either way once per
    /// episode.
    fn on_pto(&mut self, now: Time) {
        if !self.pto_allowed() {
            return;
        }
        if !self.in_recovery && self.scoreboard.is_empty() {
            self.tlp_pending = true;
            self.rtx_deadline = Some(now + self.rtt.rto());
            return;
        }
        if !self.in_recovery {
            // As in `rack_enter_recovery`.
            let past = if self.rack_on() {
                self.snd_una >= self.recover
            } else {
                self.snd_una > self.recover
            };
            if !past {
                return;
            }
            let flight = self.snd_max.distance_from(self.snd_una);
            self.in_recovery = true;
            self.recover = self.snd_max;
            self.cc.enter_recovery(flight, false);
            self.high_rxt = self.snd_una;
        }
        self.stats.tlp_recoveries += 1;
        if self.rack_on() {
            self.rack.mark_lost_below_fack();
        } else {
            self.high_rxt = self.snd_una;
            self.rexmit_pending = !self.sack_ok || self.scoreboard.is_empty();
            self.tlp_lost_below = self.scoreboard.last().map(|r| r.1);
        }
        self.tlp = Some(TlpEpisode {
            end: self.snd_max,
            retrans: false,
            tsval: self.ts_now(now),
        });
    }

    /// RFC 8985 §7.2's conditions for a probe timer: switched on, data in flight
    /// and an RTT measured, no probe out, not going back after a timeout, and the
    /// peer's window open (else the persist timer probes). Unlike §7.2, SACK is not
    /// required (without it the probe still elicits a duplicate ACK), and the
    /// timer runs with SACKed data and in recovery too ([`Connection::on_pto`]).
    fn pto_allowed(&self) -> bool {
        self.config.tail_loss_probe
            && matches!(
                self.state,
                TcpState::Established
                    | TcpState::CloseWait
                    | TcpState::FinWait1
                    | TcpState::Closing
                    | TcpState::LastAck
            )
            && self.snd_una != self.snd_max
            && self.rtt.srtt().is_some()
            && self.tlp.is_none()
            && self.snd_nxt == self.snd_max
            && self.snd_wnd > 0
    }

    /// (Re)arms the probe timer if a probe is allowed (RFC 8985 §7.2): PTO = 2·SRTT
    /// plus the peer's ACK delay, at most the RTO. §7.2 adds WCDelAckT = 200 ms
    /// when one segment is in flight, for a peer that holds a lone segment's ACK
    /// that long; on a LAN that leaves the probe no earlier than the RTO. We take
    /// [`TcpConfig::peer_ack_delay`], by default our own delayed-ACK bound
    /// ([`TcpConfig::delayed_ack`]), since both ends of this stack are configured
    /// alike, and otherwise 2 ms. A peer delaying longer draws a spurious probe: a
    /// segment, and a cwnd reduction only if timestamps cannot show that the
    /// original arrived.
    fn arm_pto(&mut self, now: Time) {
        self.pto_deadline = None;
        if !self.pto_allowed() {
            return;
        }
        let Some(srtt) = self.rtt.srtt_nanos() else {
            return;
        };
        let flight = self.snd_max.distance_from(self.snd_una);
        let ack_delay = if flight <= self.send_mss as u32 {
            self.config
                .peer_ack_delay
                .unwrap_or_else(|| self.config.delayed_ack.unwrap_or_default().max(PTO_SLACK))
        } else {
            PTO_SLACK
        };
        // In nanoseconds: armed on every ACK and every send of new data.
        let ack_delay = nanos(ack_delay);
        let pto = srtt
            .saturating_mul(2)
            .saturating_add(ack_delay)
            .min(self.rtt.rto_nanos());
        self.pto_deadline = Some(now.after_nanos(pto));
    }

    /// RACK runs: switched on and SACK agreed (RFC 8985 §6 needs SACK to tell
    /// which segments were delivered).
    fn rack_on(&self) -> bool {
        self.config.rack && self.sack_ok
    }

    /// RACK's record of transmissions is kept: for RACK, or, without
    /// timestamps, for HyStart++'s per-ACK RTT samples (RFC 9406 §4.2 wants
    /// one per ACK; Karn's rule alone gives one per round trip) while its slow
    /// start lasts. Cumulative ACKs trim the record either way.
    fn rack_records(&self) -> bool {
        self.rack_on() || (!self.ts_ok && self.cc.hystart_running())
    }

    /// RACK_detect_loss (RFC 8985 §6.2 step 5) and the reordering timer (§6.3)
    /// armed for the segments not yet due. True if a lost segment awaits
    /// resending.
    fn rack_detect(&mut self, now: Time) -> bool {
        let dupthresh_sacked = self.sacked_bytes() > (DUP_THRESH - 1) * self.send_mss as u32;
        let srtt = self.rtt.srtt_nanos().unwrap_or_default();
        let reo_wnd = self.rack.reo_wnd(self.in_recovery, dupthresh_sacked, srtt);
        let (newly, pending, timeout) = self.rack.detect_loss(now, reo_wnd);
        self.stats.rack_losses += u64::from(newly);
        self.rack_deadline = timeout.map(|t| now.after_nanos(t));
        pending
    }

    /// Fast recovery begins when RACK marks a loss (RFC 8985 §6.2, RFC 6675 §5
    /// (B)), once per window (RFC 6582 §3.2 step 2: the caller checks that
    /// SND.UNA reached `recover`; unlike a duplicate ACK, RACK's verdict is on a
    /// segment sent after the previous recovery began, so SND.UNA at `recover`
    /// suffices). NextSeg then resends what RACK marked. A probe out was what
    /// revealed the loss (§7.4).
    fn rack_enter_recovery(&mut self, flight: u32) {
        self.in_recovery = true;
        self.recover = self.snd_max;
        self.cc.enter_recovery(flight, false);
        self.high_rxt = self.snd_una;
        if self.tlp.take().is_some() {
            self.stats.tlp_recoveries += 1;
        }
        self.pto_deadline = None;
    }

    /// RACK's reordering timer expired (RFC 8985 §6.3): the segments it waited
    /// for are due now, and their loss may start recovery.
    fn on_rack_timer(&mut self, now: Time) {
        if !self.rack_on() || self.snd_una == self.snd_max {
            return;
        }
        self.stats.rack_timeouts += 1;
        if self.rack_detect(now) && !self.in_recovery && self.snd_una >= self.recover {
            let flight = self.snd_max.distance_from(self.snd_una);
            self.rack_enter_recovery(flight);
        }
    }

    /// The window to advertise, capped by the buffer's free space.
    fn free_window(&self) -> u32 {
        self.recv.window().min(MAX_WINDOW << self.rcv_wscale) as u32
    }

    /// RFC 9293 §3.8.6.2.2: the right edge moves only by at least min(buffer / 2,
    /// MSS), so the peer is not invited to send tiny segments. The MSS is what the
    /// peer's full segments carry: with timestamps, 12 bytes less than ours (RFC
    /// 6691), so that each of them moves the edge and the window field stays the
    /// same, as header prediction wants.
    fn sws_threshold(&self) -> u32 {
        (self.recv.capacity() / 2).min(self.full_segment()) as u32
    }

    /// The data of a full-sized segment of the peer's: our MSS less the
    /// timestamps option it carries, if any.
    fn full_segment(&self) -> usize {
        let ts = if self.ts_ok { TS_OPTION_LEN } else { 0 };
        usize::from(self.config.mss).saturating_sub(ts).max(1)
    }

    fn advertise_window(&mut self, syn: bool) -> u16 {
        // RFC 7323 §2.2: the window of a SYN is never scaled.
        let shift = if syn { 0 } else { self.rcv_wscale };
        let free = self.recv.window().min(MAX_WINDOW << shift) as u32;
        let left = self.rcv_adv.distance_from(self.rcv_nxt);
        let wnd = if free >= left + self.sws_threshold() {
            free
        } else {
            left
        };
        // The field drops the low bits, which may pull the edge back by less than
        // 2^shift (RFC 7323 §2.4 allows it); the edge remembered stays the
        // furthest offered, so data up to it is still taken.
        let field = (wnd >> shift).min(MAX_WINDOW as u32);
        self.rcv_adv = self.rcv_adv.max(self.rcv_nxt + (field << shift));
        field as u16
    }

    /// Writes the next segment to send into `buf` and returns its length (the TCP
    /// segment only: the caller adds the IPv4 header from [`Connection::local`] to
    /// [`Connection::remote`]). `buf` should hold 24 + [`TcpConfig::mss`] bytes;
    /// shorter buffers get shorter segments, down to 60 bytes (a header with the
    /// most options), below which nothing is written.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        let space = buf.len();
        let mut out = Out {
            buf,
            space,
            cut: space,
            cork: false,
            pieces: None,
        };
        self.transmit(now, &mut out)
    }

    /// [`Connection::poll_transmit`] leaving the data where it lies when the
    /// send buffer is in lent memory ([`Connection::lend_send_memory`]): `buf`
    /// gets the header, and with it the data if both fit; otherwise the data
    /// stays in the send buffer and the returned pieces name it (the segment is
    /// `buf[..n]` followed by them). `space` is the most the segment may take,
    /// header and data (24 + [`TcpConfig::mss`] for full segments); with the
    /// send buffer in the heap it is cut to `buf`. Every segment with pieces
    /// must be reported [`Connection::reference_done`] once its bytes were read,
    /// in the order sent, or [`Connection::reference_unsent`] at once: until
    /// then the bytes stay as they are, acknowledged or not.
    pub fn poll_transmit_referenced(
        &mut self,
        now: Time,
        buf: &mut [u8],
        space: usize,
    ) -> Option<(usize, Option<Pieces>)> {
        self.poll_transmit_offloaded(now, buf, space, space, false)
    }

    /// [`Connection::poll_transmit_referenced`] over a link with TCP
    /// segmentation offload, which cuts a segment longer than `cut` (header
    /// and data) into segments of `cut`, each with this one's header. New
    /// data then goes in *super-segments* of up to `space`, a whole number of
    /// segments (but for the end of what is queued), when the segments the
    /// link cuts are the connection's full-sized ones. A super-segment's
    /// checksum is left to the link: the field holds only the sum of its
    /// header, not of its data.
    ///
    /// With `cork` (the caller's earlier segments are not yet taken), new data
    /// that would go in a super-segment shorter than `space` only because the
    /// queue ends there is held back ([`Connection::is_corked`]), for more to
    /// join it, as Linux's autocorking does: the caller sends it once the
    /// earlier segments are taken.
    pub fn poll_transmit_offloaded(
        &mut self,
        now: Time,
        buf: &mut [u8],
        space: usize,
        cut: usize,
        cork: bool,
    ) -> Option<(usize, Option<Pieces>)> {
        let space = if self.send_buf.is_lent() {
            space.max(buf.len())
        } else {
            buf.len()
        };
        if space > cut {
            self.send_buf.stop_block_sums();
        }
        let mut out = Out {
            buf,
            space,
            cut: cut.min(space),
            cork,
            pieces: None,
        };
        self.corked = false;
        let n = self.transmit(now, &mut out)?;
        Some((n, out.pieces))
    }

    /// The last [`Connection::poll_transmit_offloaded`] held data back for its
    /// `cork`.
    pub fn is_corked(&self) -> bool {
        self.corked
    }

    /// Moves the send buffer into `mem` (part of the endpoint's segment, read
    /// in place by the transmitter): only while nothing is queued; otherwise,
    /// or if `mem` is empty, it is handed back.
    pub fn lend_send_memory(
        &mut self,
        mem: Box<dyn SendMemory>,
    ) -> Result<(), Box<dyn SendMemory>> {
        self.send_buf.lend(mem)
    }

    /// Gives lent send memory up once nothing will be sent from it again (our
    /// FIN was acknowledged, or the connection is closed); returns whether it
    /// did. Segments still referencing it need not be reported done.
    pub fn end_send_memory(&mut self) -> bool {
        let done = matches!(
            self.state,
            TcpState::FinWait2 | TcpState::TimeWait | TcpState::Closed
        );
        if done && self.send_buf.is_lent() {
            self.send_buf = SendBuffer::new();
            return true;
        }
        false
    }

    /// Whether [`Connection::poll_transmit`] may have a segment now: false
    /// only when it certainly has none, so that a caller can skip preparing
    /// to send (a route, a buffer) after most events. Inline: asked some ten
    /// times a round trip, mostly to answer false.
    #[inline]
    pub fn may_transmit(&self) -> bool {
        self.rst_pending.is_some()
            || self.ack_now
            || self.dup_acks_owed > 0
            || self.rexmit_pending
            || self.tlp_pending
            || self.keepalive_pending
            || self.in_recovery
            || match self.state {
                TcpState::Closed => false,
                TcpState::SynSent | TcpState::SynReceived => {
                    self.snd_nxt == self.iss || self.has_unsent()
                }
                _ => self.has_unsent(),
            }
    }

    /// The send buffer is in lent memory.
    pub fn sends_by_reference(&self) -> bool {
        self.send_buf.is_lent()
    }

    /// The oldest segment sent with pieces ([`Connection::poll_transmit_referenced`])
    /// was read: its bytes may be reused once acknowledged.
    pub fn reference_done(&mut self) {
        self.send_buf.done();
    }

    /// The newest segment returned with pieces no longer references them:
    /// it was not sent after all (it counts as lost, and is retransmitted),
    /// or it was copied out whole (held for ARP, or written directly).
    pub fn reference_unsent(&mut self) {
        self.send_buf.unsent();
    }

    /// Segments sent with pieces and not yet done.
    pub fn references(&self) -> usize {
        self.send_buf.references()
    }

    fn transmit(&mut self, now: Time, out: &mut Out<'_>) -> Option<usize> {
        if out.buf.len() < MIN_HEADER_LEN + MAX_OPTIONS_LEN {
            return None;
        }
        if let Some(seq) = self.rst_pending.take() {
            return Some(self.emit(out, now, seq, flags::RST, 0..0));
        }
        match self.state {
            TcpState::Closed => None,
            TcpState::SynSent | TcpState::SynReceived if self.snd_nxt == self.iss => {
                let f = if self.state == TcpState::SynSent {
                    flags::SYN
                } else {
                    flags::SYN | flags::ACK
                };
                let len = self.emit(out, now, self.iss, f, 0..0);
                self.sent(now, 1);
                Some(len)
            }
            TcpState::SynSent => None,
            _ => self.transmit_synchronized(now, out),
        }
    }

    fn transmit_synchronized(&mut self, now: Time, out: &mut Out<'_>) -> Option<usize> {
        // SACK blocks on an ACK come out of the data (RFC 2018 §3 leaves room as
        // needed), so that the segment still fits the path.
        let opts = self.options_len();
        let room = out.space - MIN_HEADER_LEN - opts;
        let ts_len = if self.ts_ok { TS_OPTION_LEN } else { 0 };
        let mss =
            self.send_mss - (opts - ts_len).min(self.send_mss.saturating_sub(usize::from(MIN_MSS)));
        if self.dup_acks_owed > 1 {
            // All but the last; the last goes as the pending ACK below, or rides on
            // data.
            self.dup_acks_owed -= 1;
            let n = self.emit(out, now, self.snd_max, flags::ACK, 0..0);
            self.ack_now = true;
            return Some(n);
        }
        self.dup_acks_owed = 0;
        if self.state != TcpState::SynReceived {
            if self.rexmit_pending {
                self.rexmit_pending = false;
                if self.snd_nxt > self.snd_una {
                    // Going back after a timeout sends it anyway.
                    let seq = self.snd_una;
                    if let Some(n) = self.fast_retransmit(out, now, room.min(mss), seq) {
                        return Some(n);
                    }
                }
            }
            if self.in_recovery && self.sack_ok {
                return self.sack_recovery_transmit(now, out, room.min(mss));
            }
            if self.tlp_pending {
                self.tlp_pending = false;
                if self.pto_allowed() && !self.in_recovery && self.scoreboard.is_empty() {
                    if let Some(n) = self.send_probe(now, out, room, mss) {
                        return Some(n);
                    }
                }
            }
            self.skip_sacked();
            let cwnd_room = self.cwnd_room();
            // A super-segment when the link cuts it into our full segments.
            let cut_mss = out.cut.saturating_sub(MIN_HEADER_LEN + opts);
            let seg_max = if cut_mss == mss && room >= 2 * mss {
                room - room % mss
            } else {
                mss
            };
            if let Some(n) = self.send_data(now, out, room, mss, seg_max, cwnd_room) {
                // RFC 8985 §7.2: restarted by sending new data.
                self.arm_pto(now);
                return Some(n);
            }
            // Nothing may go out while the peer's window is shut: probe it later.
            if self.snd_wnd == 0
                && self.snd_una == self.snd_max
                && self.has_unsent()
                && self.rtx_deadline.is_none()
            {
                self.rtx_deadline = Some(now + self.rtt.rto());
            }
        }
        self.pure_ack(now, out)
    }

    /// A keep-alive probe or an ACK, if one is due.
    fn pure_ack(&mut self, now: Time, out: &mut Out<'_>) -> Option<usize> {
        if self.keepalive_pending {
            // RFC 1122 §4.2.3.6: SEG.SEQ = SND.NXT − 1 lies outside the peer's window,
            // so a live peer answers with an ACK.
            self.keepalive_pending = false;
            return Some(self.emit(out, now, self.snd_max - 1, flags::ACK, 0..0));
        }
        if self.ack_now {
            // At SND.MAX, not SND.NXT: while going back after a timeout SND.NXT lies
            // below what the peer has, and an ACK there would be unacceptable to it
            // and answered with another ACK (as BSD does).
            return Some(self.emit(out, now, self.snd_max, flags::ACK, 0..0));
        }
        None
    }

    /// RFC 8985 §7.3: the probe is a segment of new data if the peer's window
    /// allows one (congestion control does not hold it back), else the last
    /// segment sent again. SND.NXT then marks the end of the episode.
    fn send_probe(
        &mut self,
        now: Time,
        out: &mut Out<'_>,
        room: usize,
        mss: usize,
    ) -> Option<usize> {
        let tsval = self.ts_now(now);
        let (n, retrans) = match self.send_data(now, out, room, mss, mss, u32::MAX) {
            Some(n) => (n, false),
            None => {
                let data_end = self.send_base + self.send_buf.len() as u32;
                let sent_end = if self.snd_max < data_end {
                    self.snd_max
                } else {
                    data_end
                };
                let last =
                    sent_end - (mss.min(room) as u32).min(sent_end.distance_from(self.snd_una));
                (self.retransmit(out, now, room.min(mss), last)?.0, true)
            }
        };
        self.tlp = Some(TlpEpisode {
            end: self.snd_nxt,
            retrans,
            tsval,
        });
        self.stats.tlp_probes += 1;
        Some(n)
    }

    /// Bytes congestion control lets go beyond SND.NXT: the usable window of RFC
    /// 5681 §3.1, cwnd stretched by Limited Transmit (RFC 3042 §2) by a segment for
    /// each of the first two duplicate ACKs, so that a small window still yields the
    /// third.
    fn cwnd_room(&self) -> u32 {
        let limited_transmit = if self.in_recovery {
            0
        } else {
            self.dup_acks.min(2)
        };
        let cwnd = self
            .cc
            .window()
            .saturating_add(limited_transmit * self.send_mss as u32);
        (self.snd_una + cwnd).distance_from(self.snd_nxt)
    }

    /// Sends the next data segment at SND.NXT, if one should go: of up to
    /// `seg_max` bytes, a multiple of `mss` unless it ends the queue.
    fn send_data(
        &mut self,
        now: Time,
        out: &mut Out<'_>,
        room: usize,
        mss: usize,
        seg_max: usize,
        cwnd_room: u32,
    ) -> Option<usize> {
        let (len, fin) = self.next_data(room, mss, seg_max, cwnd_room)?;
        let offset = self.snd_nxt.diff(self.send_base) as usize;
        let ends_queue = offset + len == self.send_buf.len();
        if out.cork && seg_max > mss && len < seg_max && ends_queue && !fin {
            self.corked = true;
            return None;
        }
        let mut f = flags::ACK;
        if fin {
            f |= flags::FIN;
        }
        if len > 0 && offset + len == self.send_buf.len() {
            f |= flags::PSH;
        }
        let n = self.emit(out, now, self.snd_nxt, f, offset..offset + len);
        self.sent(now, len as u32 + u32::from(fin));
        Some(n)
    }

    /// RFC 6675 §5 (C): while cwnd − pipe allows a segment, NextSeg: a lost hole
    /// (rule 1), else new data (rule 2), else any hole below the highest SACKed
    /// byte (rule 3), else the rescue retransmission (rule 4). With RACK, what it
    /// marked lost is rule 1's, and pipe counts its losses (RFC 8985 §6.2 in
    /// place of IsLost).
    fn sack_recovery_transmit(
        &mut self,
        now: Time,
        out: &mut Out<'_>,
        room: usize,
    ) -> Option<usize> {
        let rack = self.rack_on();
        let pipe = if rack { self.rack.pipe() } else { self.pipe() };
        let free = self.cc.window().saturating_sub(pipe);
        if free >= self.send_mss as u32 {
            let lost = if rack {
                self.rack.next_lost()
            } else {
                self.next_hole(false)
            };
            if let Some((seq, len)) = lost {
                return self.fast_retransmit(out, now, room.min(len as usize), seq);
            }
            if let Some(n) = self.send_data(now, out, room, room, room, free) {
                return Some(n);
            }
            if let Some((seq, len)) = self.next_hole(true) {
                return self.fast_retransmit(out, now, room.min(len as usize), seq);
            }
            if let Some(n) = self.rescue_retransmit(now, out, room) {
                return Some(n);
            }
        }
        self.pure_ack(now, out)
    }

    /// RFC 6675 §4 NextSeg rule (4), the rescue retransmission: once per
    /// recovery (until SND.UNA passes RescueRxt), the last segment beyond the
    /// highest SACKed byte, whose loss nothing else would show before the RTO;
    /// HighRxt stays. Narrower than the RFC's: only once everything queued has
    /// been sent (with data waiting, rule (2) failed for the peer's window and
    /// the tail is most likely still in flight: a rescue would be spurious), and
    /// only that tail (the highest unSACKed byte of a hole, which the RFC allows
    /// too, was resent already by rules (1) and (3)). Not with RACK: a
    /// retransmission sent after the tail shows its loss a round trip later
    /// (RFC 8985 §6.2), and a tail still in flight costs no spurious resend.
    fn rescue_retransmit(&mut self, now: Time, out: &mut Out<'_>, room: usize) -> Option<usize> {
        let used = self.rescue_rxt.is_some_and(|r| self.snd_una <= r);
        if self.rack_on() || used || self.has_unsent() {
            return None;
        }
        let tail = self.scoreboard.last().map_or(self.snd_una, |r| r.1);
        if tail >= self.snd_max {
            return None;
        }
        // A FIN goes again with the data before it (`retransmit`).
        let data_end = self.send_base + self.send_buf.len() as u32;
        let end = if self.snd_max < data_end {
            self.snd_max
        } else {
            data_end
        };
        let seq = end - (room as u32).min(end.distance_from(tail));
        let (n, _) = self.retransmit(out, now, room, seq)?;
        self.rescue_rxt = Some(self.recover);
        self.stats.fast_retransmits += 1;
        self.stats.rescue_retransmits += 1;
        self.arm_pto(now);
        Some(n)
    }

    /// Going back after a timeout, SND.NXT skips what the peer is known to hold
    /// (RFC 6675 §5.1: use the SACK information that arrives after an RTO).
    fn skip_sacked(&mut self) {
        if let Some(&(_, e)) = self
            .scoreboard
            .iter()
            .find(|&&(s, e)| s <= self.snd_nxt && self.snd_nxt < e)
        {
            self.snd_nxt = e;
        }
    }

    /// [`Connection::retransmit`] by loss recovery: RFC 5681 §3.2 step 3 and RFC
    /// 6582 §3.2 step 5 at SND.UNA, or a hole RFC 6675's NextSeg picked, which
    /// moves HighRxt.
    fn fast_retransmit(
        &mut self,
        out: &mut Out<'_>,
        now: Time,
        max: usize,
        seq: SeqNum,
    ) -> Option<usize> {
        let (n, end) = self.retransmit(out, now, max, seq)?;
        self.stats.fast_retransmits += 1;
        self.high_rxt = self.high_rxt.max(end);
        if self.rack_on() && seq == self.snd_una {
            // SND.UNA resent gets a whole RTO (as Linux), lest the timer, run
            // since the last ACK of new data, beat RACK's repair of this
            // retransmission if it is lost: a round trip and more later.
            self.rtx_deadline = Some(now + self.rtt.rto());
        }
        // The probe timer runs from the latest retransmission, so that on expiry
        // every retransmission had longer than a round trip to be acknowledged.
        self.arm_pto(now);
        Some(n)
    }

    /// Sends up to `max` bytes at `seq` again, below SND.MAX, leaving SND.NXT where
    /// it is; returns the segment's length and the sequence number after it.
    fn retransmit(
        &mut self,
        out: &mut Out<'_>,
        now: Time,
        max: usize,
        seq: SeqNum,
    ) -> Option<(usize, SeqNum)> {
        let offset = seq.diff(self.send_base).max(0) as usize;
        // Only what went out before: SND.MAX bounds the data.
        let sent = self.snd_max.distance_from(self.send_base) as usize;
        let avail = self.send_buf.len().min(sent).checked_sub(offset)?;
        let len = avail.min(max);
        let fin = self.fin_sent() && len == avail;
        if len == 0 && !fin {
            return None;
        }
        let mut f = flags::ACK;
        if fin {
            f |= flags::FIN;
        }
        // Karn: whatever was being timed may be this segment.
        self.rtt_sample = None;
        self.stats.retransmitted += 1;
        if self.rtx_deadline.is_none() {
            self.rtx_deadline = Some(now + self.rtt.rto());
        }
        let n = self.emit(out, now, seq, f, offset..offset + len);
        let end = seq + len as u32 + u32::from(fin);
        if self.rack_records() {
            self.rack.on_sent(seq, end, self.snd_max, now);
        }
        Some((n, end))
    }

    /// What the next data segment at SND.NXT carries: bytes and whether a FIN, or
    /// `None` if nothing should go now. `cwnd_room` is what congestion control
    /// allows beyond SND.NXT; beyond `mss` (up to `seg_max`), a super-segment
    /// takes whole segments only, unless it empties the queue.
    fn next_data(
        &self,
        room: usize,
        mss: usize,
        seg_max: usize,
        cwnd_room: u32,
    ) -> Option<(usize, bool)> {
        let offset = self.snd_nxt.diff(self.send_base);
        let mut avail: usize = (self.send_buf.len() as i64 - i64::from(offset))
            .try_into()
            .ok()?;
        let resend = self.snd_nxt < self.snd_max;
        if resend {
            // Going back: stop short of what the peer holds.
            if let Some(&(s, _)) = self.scoreboard.iter().find(|r| r.0 > self.snd_nxt) {
                avail = avail.min(s.distance_from(self.snd_nxt) as usize);
            }
        }
        let rwnd_room = (self.snd_una + self.snd_wnd).distance_from(self.snd_nxt);
        let mut allowance = rwnd_room.min(cwnd_room) as usize;
        let forced = allowance == 0 && self.probe && (avail > 0 || self.fin_queued);
        if forced {
            // RFC 9293 §3.8.6.1: a probe carries one byte beyond the zero window.
            allowance = 1;
        }
        let mut len = avail.min(allowance).min(seg_max).min(room);
        if len > mss && len < avail {
            len -= len % mss;
        }
        // The FIN occupies a sequence number, so it needs room in the window too.
        let fin = self.fin_queued
            && len == avail
            && allowance > len
            && offset + len as i32 == self.send_buf.len() as i32;
        if len == 0 && !fin {
            return None;
        }
        if !fin && !forced && !resend && len < mss {
            // Sender SWS avoidance (RFC 9293 §3.8.6.2.1) with Nagle (§3.7.4): a short
            // segment only if it empties the queue while nothing is unacknowledged
            // (or Nagle is off), or if it is half the largest window the peer offered.
            let idle = self.snd_una == self.snd_max;
            let all_and_idle = len == avail && (!self.config.nagle || idle);
            // With nothing in flight no ACK will come to open the window further,
            // so a window-limited segment goes now: RFC 9293's override timeout,
            // taken as zero.
            let window_bound_idle = len == allowance && idle;
            if !all_and_idle && !window_bound_idle && (len as u32) * 2 < self.max_snd_wnd {
                return None;
            }
        }
        Some((len, fin))
    }

    /// Bookkeeping after sending `len` sequence numbers at SND.NXT.
    fn sent(&mut self, now: Time, len: u32) {
        if self.rack_records() {
            self.rack
                .on_sent(self.snd_nxt, self.snd_nxt + len, self.snd_max, now);
        }
        if self.snd_nxt < self.snd_max {
            self.stats.retransmitted += 1;
        } else if self.snd_una == self.snd_max {
            // Nothing was in flight since the last ACK.
            let idle = now.saturating_duration_since(self.last_heard);
            self.cc.restart_after_idle(idle, self.rtt.rto());
        }
        self.snd_nxt = self.snd_nxt + len;
        if self.snd_nxt > self.snd_max {
            self.snd_max = self.snd_nxt;
            // With timestamps the echoes time every segment.
            if self.rtt_sample.is_none() && !self.ts_ok {
                self.rtt_sample = Some((self.snd_nxt, now));
            }
        }
        self.probe = false;
        // RFC 6298 §5.1.
        if self.rtx_deadline.is_none() {
            self.rtx_deadline = Some(now + self.rtt.rto());
        }
    }

    /// Whether [`Connection::sack_blocks`] may find any: false on nearly
    /// every segment, which then skips building them.
    fn may_sack(&self) -> bool {
        self.sack_ok && (self.dsack.is_some() || !self.sack_recent.is_empty())
    }

    /// The SACK blocks to send (RFC 2018 §4): the runs beyond a hole that hold the
    /// latest arrivals, newest first, as many as fit beside the timestamps.
    fn sack_blocks(&self) -> SackBlocks {
        let mut blocks = [None; MAX_SACK_BLOCKS];
        if !self.may_sack() {
            return blocks;
        }
        // 40 option bytes: 12 of timestamps leave room for 3 blocks of 8 beside the
        // 2 NOPs and 2 bytes of the SACK option's head, 4 without them.
        let fit = if self.ts_ok { 3 } else { MAX_SACK_BLOCKS };
        let next = self.recv.offset();
        let mut count = 0;
        if let Some((l, r)) = self.dsack {
            blocks[0] = Some((l.0, r.0));
            count = 1;
        }
        for run in self
            .sack_recent
            .iter()
            .filter_map(|&at| self.recv.run_at(at))
        {
            let block = (
                (self.rcv_nxt + (run.0 - next) as u32).0,
                (self.rcv_nxt + (run.1 - next) as u32).0,
            );
            if count == fit {
                break;
            }
            if !blocks[..count].contains(&Some(block)) {
                blocks[count] = Some(block);
                count += 1;
            }
        }
        blocks
    }

    /// Option bytes on a data segment or ACK now: timestamps, SACK blocks with two
    /// NOPs.
    fn options_len(&self) -> usize {
        let ts = if self.ts_ok { TS_OPTION_LEN } else { 0 };
        if !self.may_sack() {
            return ts;
        }
        match self.sack_blocks().iter().flatten().count() {
            0 => ts,
            n => ts + 4 + 8 * n,
        }
    }

    /// The options of a segment with flags `f`, written into `buf`; returns their
    /// length.
    fn write_segment_options(&self, f: u8, now: Time, buf: &mut [u8]) -> usize {
        let tsval = self.ts_now(now);
        // RFC 7323 §3.2: TSecr is 0 unless ACK is set.
        let tsecr = if f & flags::ACK != 0 {
            self.ts_recent
        } else {
            0
        };
        let ts = TcpOption::Timestamps { tsval, tsecr };
        let mut list = [TcpOption::NoOp; 8];
        let mut count = 0;
        let mut push = |o| {
            list[count] = o;
            count += 1;
        };
        if f & flags::SYN != 0 {
            // Window scale and timestamps go in our SYN if we offer them, and in a
            // SYN-ACK only if the peer's SYN offered them (RFC 7323 §2.2, §3.2).
            let (wscale, timestamps) = if self.state == TcpState::SynSent {
                (self.config.window_scaling, self.config.timestamps)
            } else {
                (self.wscale_agreed, self.ts_ok)
            };
            let sack = if self.state == TcpState::SynSent {
                self.config.sack
            } else {
                self.sack_ok
            };
            push(TcpOption::Mss(self.config.mss));
            if wscale {
                push(TcpOption::NoOp);
                push(TcpOption::WindowScale(self.our_wscale()));
            }
            // SACK-permitted takes the place of the NOPs before timestamps, as
            // Linux lays them out, to stay within 20 option bytes.
            match (sack, timestamps) {
                (true, true) => push(TcpOption::SackPermitted),
                (true, false) => {
                    push(TcpOption::NoOp);
                    push(TcpOption::NoOp);
                    push(TcpOption::SackPermitted);
                }
                (false, true) => {
                    push(TcpOption::NoOp);
                    push(TcpOption::NoOp);
                }
                (false, false) => {}
            }
            if timestamps {
                push(ts);
            }
        } else if f & flags::RST == 0 {
            let blocks = if self.may_sack() && f & flags::ACK != 0 {
                self.sack_blocks()
            } else {
                [None; MAX_SACK_BLOCKS]
            };
            if blocks[0].is_none() {
                // Timestamps alone, or nothing, on nearly every segment: written
                // as `write_options` would (RFC 7323 Appendix A's layout).
                if !self.ts_ok {
                    return 0;
                }
                buf[..4].copy_from_slice(&[1, 1, 8, 10]);
                buf[4..8].copy_from_slice(&tsval.to_be_bytes());
                buf[8..12].copy_from_slice(&tsecr.to_be_bytes());
                return TS_OPTION_LEN;
            }
            if self.ts_ok {
                // RFC 7323 §3.2: once agreed, on every segment but a RST (where it
                // MAY go; Linux leaves it out too).
                push(TcpOption::NoOp);
                push(TcpOption::NoOp);
                push(ts);
            }
            if blocks[0].is_some() && f & flags::ACK != 0 {
                push(TcpOption::NoOp);
                push(TcpOption::NoOp);
                push(TcpOption::Sack(blocks));
            }
        }
        write_options(&list[..count], buf).expect("the options fit")
    }

    /// Writes one segment; every segment but a SYN and a RST acknowledges RCV.NXT,
    /// which answers any pending ACK. The data (bytes `data` of the send buffer)
    /// is copied if it fits `out.buf`, and referenced otherwise.
    fn emit(
        &mut self,
        out: &mut Out<'_>,
        now: Time,
        seq: SeqNum,
        f: u8,
        data: std::ops::Range<usize>,
    ) -> usize {
        let mut opts = [0; MAX_OPTIONS_LEN];
        let n = self.write_segment_options(f, now, &mut opts);
        let options = &opts[..n];
        let ack = f & flags::ACK != 0;
        let window = if ack {
            self.advertise_window(f & flags::SYN != 0)
        } else {
            self.free_window() as u16
        };
        if ack {
            self.ack_now = false;
            self.ack_deadline = None;
            self.unacked_segments = 0;
            if std::mem::take(&mut self.quick_owed) {
                self.quick_acks -= 1;
            }
            self.unread_at_ack = self.recv.len();
            self.handshake_ack_held = false;
            self.last_ack_sent = self.rcv_nxt;
            if self.dsack.take().is_some() {
                self.stats.dsacks_sent += 1;
            }
        }
        let repr = TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq_number: seq.0,
            ack_number: if ack { self.rcv_nxt.0 } else { 0 },
            flags: f,
            window: if f & flags::RST != 0 { 0 } else { window },
            urgent_ptr: 0,
            options,
            payload: &[],
        };
        self.stats.segments_sent += 1;
        let hl = repr.header_len();
        let len = data.len();
        let (written, sum) = if hl + len <= out.buf.len() {
            // Copied, the sums taken in the copy.
            let (a, b) = self.send_buf.slices(data.clone());
            let (da, db) = out.buf[hl..hl + len].split_at_mut(a.len());
            let sa = checksum::copy_and_sum(da, a);
            // The second piece is there only when the data wraps the ring.
            let sb = if b.is_empty() {
                0
            } else {
                checksum::copy_and_sum(db, b)
            };
            (hl + len, send::combine(sa, a.len(), sb))
        } else {
            // The link sums a super-segment's data as it cuts it.
            let sum = if hl + len > out.cut {
                0
            } else {
                self.send_buf.sum(data.clone())
            };
            out.pieces = self.send_buf.reference(data);
            debug_assert!(out.pieces.is_some(), "data beyond the space of a copy");
            (hl, sum)
        };
        repr.emit_header(out.buf, *self.local.ip(), *self.remote.ip(), len, sum)
            .expect("the segment fits: its payload was cut to the space");
        written
    }
}

/// Where [`Connection::emit`] writes a segment.
struct Out<'a> {
    buf: &'a mut [u8],
    /// The most the segment may take, header and data: `buf`'s length unless
    /// the data may be referenced.
    space: usize,
    /// Where the link cuts a longer segment (see
    /// [`Connection::poll_transmit_offloaded`]); `space` without offload.
    cut: usize,
    /// Hold back a short super-segment (see there).
    cork: bool,
    /// Where the data lies, if it was referenced.
    pieces: Option<Pieces>,
}

/// Socket options that may change on an open connection.
impl Connection {
    /// Copies received data in order into `buf` without consuming it.
    pub fn peek(&self, buf: &mut [u8]) -> usize {
        self.recv.peek(buf)
    }

    /// Turns Nagle's algorithm on or off (off is TCP_NODELAY); off sends what is
    /// queued at once.
    pub fn set_nagle(&mut self, on: bool) {
        self.config.nagle = on;
    }

    /// Whether Nagle's algorithm is on.
    pub fn nagle(&self) -> bool {
        self.config.nagle
    }

    /// Sets keep-alive probing (RFC 1122 §4.2.3.6); `None` turns it off.
    pub fn set_keepalive(&mut self, keepalive: Option<Keepalive>) {
        self.config.keepalive = keepalive;
        self.keepalive_probes = 0;
    }

    /// The keep-alive settings.
    pub fn keepalive(&self) -> Option<Keepalive> {
        self.config.keepalive
    }
}

#[cfg(test)]
impl Connection {
    /// The whole state but the header-prediction switch and counter, to compare a
    /// connection with the fast path with one without.
    pub(crate) fn fingerprint(&self) -> String {
        let mut c = self.clone();
        c.config.header_prediction = false;
        c.stats.header_predicted = 0;
        format!("{c:?}")
    }

    /// Where the lent send memory starts in the segment, and its bytes.
    pub(crate) fn lent_memory(&self) -> Option<(u32, &[u8])> {
        self.send_buf.lent_memory()
    }

    /// RCV.NXT, SND.UNA, SND.MAX, the window field that repeats SND.WND, and
    /// TS.Recent, for forging segments that hit the fast path.
    pub(crate) fn view(&self) -> (u32, u32, u32, u16, u32) {
        (
            self.rcv_nxt.0,
            self.snd_una.0,
            self.snd_max.0,
            (self.snd_wnd >> self.snd_wscale).min(MAX_WINDOW as u32) as u16,
            self.ts_recent,
        )
    }
}

#[cfg(test)]
mod ts_tests {
    use super::ts_before;

    #[test]
    fn timestamps_compare_modulo_2_32() {
        assert!(ts_before(1, 2));
        assert!(!ts_before(2, 2) && !ts_before(3, 2));
        // Across the wrap: 0xffff_fff0 is 21 ticks before 5.
        assert!(ts_before(0xffff_fff0, 5));
        assert!(!ts_before(5, 0xffff_fff0));
        // Up to 2^31 − 1 ahead counts as later.
        assert!(ts_before(0, 0x7fff_ffff) && !ts_before(0, 0x8000_0001));
    }
}
