//! RACK's time-based loss detection (RFC 8985 §6): a record of every transmitted
//! range with its send time, and the rule that a segment is lost once one sent
//! after it has been delivered and a round trip plus the reordering window has
//! passed since it was sent.
//!
//! Its times are kept in nanoseconds, as the RTT estimator's: `Duration`
//! arithmetic (seconds and nanoseconds apart) costs several times the
//! instructions, and this runs on every ACK.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

use super::connection::{ts_before, ts_clock};
use super::seq::SeqNum;
use crate::Time;

/// Recoveries a reordering window grown by D-SACKs lasts (RFC 8985 §6.2 step 4).
const REO_WND_PERSIST: u32 = 16;

/// One transmitted range [start, end) and its state (RFC 8985 §6.1's per-segment
/// variables, plus what RFC 6675's pipe needs).
#[derive(Debug, Clone, Copy)]
struct Record {
    start: SeqNum,
    end: SeqNum,
    /// Segment.xmit_ts: when the latest copy went out.
    xmit: Time,
    /// Segment.retransmitted: sent more than once, so an ACK may answer either copy.
    retrans: bool,
    /// Delivered: SACKed, or cumulatively acknowledged and about to be dropped.
    sacked: bool,
    /// Segment.lost: marked lost by RACK or a timeout; it stays set after the
    /// segment is resent, as Linux's TCPCB_LOST.
    lost: bool,
    /// A retransmission of it is in flight and not deemed lost (Linux's
    /// TCPCB_SACKED_RETRANS), which pipe counts.
    rtx_out: bool,
}

impl Record {
    fn len(&self) -> u32 {
        self.end.distance_from(self.start)
    }
}

/// RACK.xmit_ts, RACK.end_seq and RACK.rtt: the most recently sent segment known
/// delivered, and its round trip.
#[derive(Debug, Clone, Copy)]
struct Latest {
    xmit: Time,
    end: SeqNum,
    /// In nanoseconds.
    rtt: u64,
}

/// RFC 8985 §6.2's RACK_sent_after: ties of the time go by sequence, as a flight
/// leaves at one instant.
fn sent_after(t1: Time, seq1: SeqNum, t2: Time, seq2: SeqNum) -> bool {
    t1 > t2 || (t1 == t2 && seq1 > seq2)
}

/// The RACK state of a connection: its transmission records, in sequence order
/// from SND.UNA to SND.MAX, and the variables of RFC 8985 §6.1.
#[derive(Debug, Clone, Default)]
pub(super) struct Rack {
    /// Capacity is kept across ACKs, so that recording a segment does not
    /// allocate once the window has been reached.
    records: VecDeque<Record>,
    /// RACK.xmit_ts, RACK.end_seq, RACK.rtt; none until a delivery.
    latest: Option<Latest>,
    /// RACK.min_RTT, over the connection's life, from segments sent once, in
    /// nanoseconds.
    min_rtt: Option<u64>,
    /// RACK.fack: the highest end of a delivered segment.
    fack: Option<SeqNum>,
    /// RACK.reordering_seen: a segment sent once arrived below `fack`.
    reordering_seen: bool,
    /// RACK.dsack_round: SND.NXT when a D-SACK last grew the window.
    dsack_round: Option<SeqNum>,
    /// RACK.reo_wnd_mult less one.
    reo_wnd_grown: u32,
    /// RACK.reo_wnd_persist: recoveries left before the window shrinks back.
    reo_wnd_persist: u32,
    /// The least RTT of the segments sent once that were delivered since
    /// last taken ([`Rack::take_sample`]), in nanoseconds.
    sample: Option<u64>,
}

impl Rack {
    /// Records a transmission of [start, end) at `now`: what lies below `snd_max`
    /// went before and is resent, the rest is new.
    pub(super) fn on_sent(&mut self, start: SeqNum, end: SeqNum, snd_max: SeqNum, now: Time) {
        let old_end = if end < snd_max { end } else { snd_max };
        if start < old_end {
            let range = self.split_range(start, old_end);
            for r in self.records.range_mut(range) {
                r.xmit = now;
                r.retrans = true;
                r.rtx_out = true;
            }
        }
        let new_start = start.max(snd_max);
        if new_start < end {
            self.records.push_back(Record {
                start: new_start,
                end,
                xmit: now,
                retrans: false,
                sacked: false,
                lost: false,
                rtx_out: false,
            });
        }
    }

    /// The index of the first record starting at or after `at`, splitting the
    /// record across it.
    fn split(&mut self, at: SeqNum) -> usize {
        let i = self.records.partition_point(|r| r.start < at);
        if i > 0 {
            let r = self.records[i - 1];
            if at < r.end {
                self.records[i - 1].end = at;
                self.records.insert(i, Record { start: at, ..r });
            }
        }
        i
    }

    fn split_range(&mut self, start: SeqNum, end: SeqNum) -> Range<usize> {
        let i = self.split(start);
        i..self.split(end)
    }

    /// An ACK up to `ack`: the records below it newly delivered (RFC 8985 §6.2
    /// steps 1–3). `tsecr` is the ACK's echo, `ts_offset` our timestamp offset.
    pub(super) fn on_ack(&mut self, ack: SeqNum, now: Time, tsecr: Option<u32>, ts_offset: u32) {
        for i in 0..self.records.len() {
            let r = self.records[i];
            if r.end > ack {
                break;
            }
            if !r.sacked {
                self.records[i].sacked = true;
                self.delivered(r, now, tsecr, ts_offset);
            }
        }
    }

    /// A SACK block [start, end) within the flight: its records newly delivered.
    /// Call in ascending order of blocks, after [`Rack::on_ack`], as §6.2 step 3
    /// takes deliveries in sequence order. The ACK's echo says nothing of these:
    /// out-of-order data leaves TS.Recent alone (RFC 7323 §4.3).
    pub(super) fn on_sack(&mut self, start: SeqNum, end: SeqNum, now: Time) {
        for i in self.split_range(start, end) {
            let r = self.records[i];
            if !r.sacked {
                self.records[i].sacked = true;
                self.delivered(r, now, None, 0);
            }
        }
    }

    /// SND.UNA moved to `una`: the records below it go.
    pub(super) fn on_cumulative_ack(&mut self, una: SeqNum) {
        while self.records.front().is_some_and(|r| r.end <= una) {
            self.records.pop_front();
        }
        if let Some(r) = self.records.front_mut() {
            r.start = r.start.max(una);
        }
    }

    /// RFC 8985 §6.2 steps 1–3 for a segment newly delivered.
    fn delivered(&mut self, r: Record, now: Time, tsecr: Option<u32>, ts_offset: u32) {
        let rtt = now.as_nanos().saturating_sub(r.xmit.as_nanos());
        if r.retrans {
            // Step 2: the ACK may be for an earlier copy. The echo tells (RFC
            // 7323); without it, an RTT below the least seen is too short for
            // the last copy.
            let earlier_copy = tsecr.is_some_and(|e| ts_before(e, ts_clock(r.xmit, ts_offset)));
            if earlier_copy || self.min_rtt.is_some_and(|m| rtt < m) {
                return;
            }
        } else {
            // Step 1, from the samples Karn's rule leaves unambiguous.
            self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
            self.sample = Some(self.sample.map_or(rtt, |s| s.min(rtt)));
            // Step 3: delivered below the highest delivered, never resent.
            if self.fack.is_some_and(|f| r.end < f) {
                self.reordering_seen = true;
            }
        }
        if self.fack.is_none_or(|f| r.end > f) {
            self.fack = Some(r.end);
        }
        if self
            .latest
            .is_none_or(|l| sent_after(r.xmit, r.end, l.xmit, l.end))
        {
            self.latest = Some(Latest {
                xmit: r.xmit,
                end: r.end,
                rtt,
            });
        }
    }

    /// An RTT sample from what was delivered since the last call: segments
    /// sent once only (Karn's rule), the least of them.
    pub(super) fn take_sample(&mut self) -> Option<Duration> {
        self.sample.take().map(Duration::from_nanos)
    }

    /// A D-SACK (RFC 2883) arrived: RFC 8985 §6.2 step 4 widens the reordering
    /// window by min_RTT / 4 once per round trip that sees one, for the next 16
    /// recoveries.
    pub(super) fn on_dsack(&mut self, snd_una: SeqNum, snd_max: SeqNum) {
        if self.dsack_round.is_some_and(|r| snd_una >= r) {
            self.dsack_round = None;
        }
        if self.dsack_round.is_none() {
            self.dsack_round = Some(snd_max);
            self.reo_wnd_grown += 1;
            self.reo_wnd_persist = REO_WND_PERSIST;
        }
    }

    /// Fast recovery ended (RFC 8985 §6.2 step 4): a grown window shrinks back
    /// after 16 recoveries without D-SACKs.
    pub(super) fn on_recovery_exit(&mut self) {
        self.reo_wnd_persist = self.reo_wnd_persist.saturating_sub(1);
        if self.reo_wnd_persist == 0 {
            self.reo_wnd_grown = 0;
        }
    }

    /// RACK.reo_wnd (RFC 8985 §6.2 step 4): min_RTT / 4 times the D-SACK
    /// multiplier, at most SRTT; zero, as DupThresh would, while no reordering has
    /// been seen and the sender is in recovery or DupThresh segments are SACKed.
    /// In nanoseconds, as `srtt`.
    pub(super) fn reo_wnd(&self, in_recovery: bool, dupthresh_sacked: bool, srtt: u64) -> u64 {
        if !self.reordering_seen && (in_recovery || dupthresh_sacked) {
            return 0;
        }
        let quarter = self.min_rtt.unwrap_or_default() / 4;
        // Saturating: past 584 years the cap is SRTT anyway.
        (quarter.saturating_mul(u64::from(1 + self.reo_wnd_grown))).min(srtt)
    }

    /// RFC 8985 §6.2 step 5, RACK_detect_loss: marks lost each segment sent before
    /// RACK's whose RACK.rtt + `reo_wnd` since its sending has passed. Returns the
    /// segments newly marked, whether any lost one awaits resending, and the time
    /// until the last of the others is due (the reordering timer, §6.3), if any.
    /// `reo_wnd` and the time are in nanoseconds.
    pub(super) fn detect_loss(&mut self, now: Time, reo_wnd: u64) -> (u32, bool, Option<u64>) {
        let Some(l) = self.latest else {
            return (0, false, None);
        };
        let (mut newly, mut pending, mut timeout) = (0, false, None);
        for r in self.records.iter_mut() {
            if !sent_after(l.xmit, l.end, r.xmit, r.end) {
                // First transmissions go in sequence order and retransmissions
                // later: past a first one sent after RACK's, all were.
                if !r.retrans {
                    break;
                }
                continue;
            }
            if r.sacked {
                continue;
            }
            if r.lost && !r.rtx_out {
                pending = true;
                continue;
            }
            let due = r.xmit.after_nanos(l.rtt).after_nanos(reo_wnd);
            if due <= now {
                r.lost = true;
                r.rtx_out = false;
                newly += 1;
                pending = true;
            } else {
                let left = due.as_nanos() - now.as_nanos();
                timeout = Some(timeout.map_or(left, |t: u64| t.max(left)));
            }
        }
        (newly, pending, timeout)
    }

    /// Marks lost every segment below the highest delivered that is neither
    /// SACKed nor already awaiting resending: the probe timer's verdict when
    /// nothing arrived for a PTO after the latest transmission (see the
    /// connection's `on_pto`), for what RACK cannot see, a segment or
    /// retransmission with nothing sent after it delivered.
    pub(super) fn mark_lost_below_fack(&mut self) {
        let Some(fack) = self.fack else { return };
        for r in self.records.iter_mut() {
            if r.start >= fack {
                break;
            }
            if !r.sacked {
                r.lost = true;
                r.rtx_out = false;
            }
        }
    }

    /// RFC 6675 NextSeg rule (1) with RACK's losses (RFC 8985 §6.2 in place of
    /// IsLost): the first segment lost and not resent since, and its length.
    pub(super) fn next_lost(&self) -> Option<(SeqNum, u32)> {
        self.records
            .iter()
            .find(|r| r.lost && !r.rtx_out && !r.sacked)
            .map(|r| (r.start, r.len()))
    }

    /// RFC 6675 SetPipe with RACK's losses: a segment not SACKed counts unless
    /// lost, and a retransmission of it in flight once more.
    pub(super) fn pipe(&self) -> u32 {
        self.records
            .iter()
            .filter(|r| !r.sacked)
            .map(|r| u32::from(!r.lost) * r.len() + u32::from(r.rtx_out) * r.len())
            .sum()
    }

    /// A retransmission timeout: everything outstanding is lost (as Linux's
    /// tcp_enter_loss) and what the peer held counts for nothing (RFC 2018 §8).
    pub(super) fn on_rto(&mut self) {
        for r in &mut self.records {
            r.sacked = false;
            r.lost = true;
            r.rtx_out = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_split_mark_and_count() {
        let ms = Duration::from_millis;
        let ns = |d: Duration| d.as_nanos() as u64;
        // Across the wrap of the sequence space.
        let s = |n: u32| SeqNum(u32::MAX - 120) + n;
        let t0 = Time::ZERO + ms(1);
        let mut rack = Rack::default();
        for k in 0..3 {
            rack.on_sent(s(100 * k), s(100 * k + 100), s(100 * k), t0);
        }
        assert_eq!(rack.pipe(), 300);
        // Half of the second segment SACKed a round trip later: the record splits.
        let t1 = t0 + ms(10);
        rack.on_sack(s(100), s(150), t1);
        assert_eq!(rack.records.len(), 4);
        assert_eq!(rack.pipe(), 250);
        // The first was sent with it, before it in sequence: lost once RACK.rtt
        // and the window passed; the third, after it, is not.
        let wnd = rack.reo_wnd(false, false, ns(ms(10)));
        assert_eq!(wnd, ns(ms(10)) / 4);
        assert_eq!(rack.detect_loss(t1, wnd), (0, false, Some(wnd)));
        assert_eq!(rack.detect_loss(t1.after_nanos(wnd), wnd), (1, true, None));
        assert_eq!(rack.next_lost(), Some((s(0), 100)));
        assert_eq!(rack.pipe(), 150);
        // Half of it resent: in flight again, the rest still awaits resending.
        let t2 = t1.after_nanos(wnd);
        rack.on_sent(s(0), s(50), s(300), t2);
        assert_eq!(rack.next_lost(), Some((s(50), 50)));
        assert_eq!(rack.pipe(), 200);
        // That retransmission lost too once the rest of the segment, resent
        // after it, arrives; and the third segment, sent long before that.
        let t3 = t2 + ms(10);
        rack.on_sent(s(50), s(100), s(300), t3);
        rack.on_sack(s(50), s(100), t3 + ms(10));
        assert_eq!(rack.reo_wnd(true, false, ns(ms(10))), 0);
        assert_eq!(rack.detect_loss(t3 + ms(10), 0), (3, true, None));
        assert_eq!(rack.next_lost(), Some((s(0), 50)));
        assert_eq!(rack.pipe(), 0);
        // The cumulative ACK drops what it covers, trimming a record it splits.
        rack.on_ack(s(120), t3 + ms(20), None, 0);
        rack.on_cumulative_ack(s(120));
        assert_eq!(rack.records.front().map(|r| r.start), Some(s(120)));
        assert_eq!(rack.next_lost(), Some((s(150), 50)));
        // An RTO: all lost, nothing SACKed.
        rack.on_rto();
        assert_eq!(rack.next_lost(), Some((s(120), 30)));
        assert_eq!(rack.pipe(), 0);
    }

    #[test]
    fn reordering_and_dsack_set_the_window() {
        let ms = Duration::from_millis;
        let ns = |d: Duration| d.as_nanos() as u64;
        let t0 = Time::ZERO;
        let mut rack = Rack::default();
        rack.on_sent(SeqNum(0), SeqNum(100), SeqNum(0), t0);
        rack.on_sent(SeqNum(100), SeqNum(200), SeqNum(100), t0);
        // Zero with DupThresh segments SACKed or in recovery, until reordering.
        rack.on_sack(SeqNum(100), SeqNum(200), t0 + ms(8));
        assert_eq!(rack.reo_wnd(false, true, ns(ms(10))), 0);
        rack.on_ack(SeqNum(200), t0 + ms(9), None, 0);
        assert_eq!(rack.reo_wnd(true, true, ns(ms(10))), ns(ms(2)));
        // A D-SACK per round trip adds min_RTT / 4, capped at SRTT.
        rack.on_dsack(SeqNum(200), SeqNum(300));
        rack.on_dsack(SeqNum(250), SeqNum(300));
        assert_eq!(rack.reo_wnd(true, true, ns(ms(10))), ns(ms(4)));
        rack.on_dsack(SeqNum(300), SeqNum(400));
        assert_eq!(rack.reo_wnd(true, true, ns(ms(5))), ns(ms(5)));
        // Back to one quarter after 16 recoveries without one.
        for _ in 0..REO_WND_PERSIST {
            rack.on_recovery_exit();
        }
        assert_eq!(rack.reo_wnd(true, true, ns(ms(10))), ns(ms(2)));
    }
}
