//! Congestion control: RFC 5681 slow start and congestion avoidance with NewReno's
//! window arithmetic in fast recovery (RFC 6582), or CUBIC's growth and decrease
//! (RFC 9438), either with HyStart++'s delay-based exit from the initial slow start
//! (RFC 9406). The connection detects duplicate ACKs, partial ACKs and losses and
//! retransmits; this keeps the windows.

use std::time::Duration;

use super::seq::SeqNum;
use crate::Time;

/// The congestion control algorithm of a connection ([`super::TcpConfig::congestion`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Congestion {
    /// RFC 5681: halve on loss, a segment per RTT in congestion avoidance.
    NewReno,
    /// RFC 9438: decrease by β = 0.7 and regrow along a cubic curve of the time
    /// since the loss, no slower than Reno would (Linux's default, and ours).
    #[default]
    Cubic,
}

/// RFC 9438 §5.1: C = 0.4 (segments per second cubed).
const CUBIC_C: f64 = 0.4;
/// RFC 9438 §4.6: β_cubic = 0.7.
const CUBIC_BETA: f64 = 0.7;
/// RFC 9438 §4.3: α_cubic = 3 (1 − β) / (1 + β), Reno's average rate at β.
const CUBIC_ALPHA: f64 = 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA);

/// RFC 9406 §4.3: MIN_RTT_THRESH, the least delay increase taken for a queue.
const MIN_RTT_THRESH: Duration = Duration::from_millis(4);
/// RFC 9406 §4.3: MAX_RTT_THRESH, the most that is asked for on long paths.
const MAX_RTT_THRESH: Duration = Duration::from_millis(16);
/// RFC 9406 §4.3: MIN_RTT_DIVISOR, RttThresh = lastRoundMinRTT / 8 between the two.
const MIN_RTT_DIVISOR: u32 = 8;
/// RFC 9406 §4.3: N_RTT_SAMPLE, the RTT samples a round needs before its minimum
/// is trusted.
const N_RTT_SAMPLE: u32 = 8;
/// RFC 9406 §4.3: CSS_GROWTH_DIVISOR, Conservative Slow Start grows at a quarter
/// of slow start's rate.
const CSS_GROWTH_DIVISOR: u32 = 4;
/// RFC 9406 §4.3: CSS_ROUNDS, the rounds of CSS before congestion avoidance.
const CSS_ROUNDS: u32 = 5;

/// HyStart++'s state (RFC 9406 §4.2).
#[derive(Debug, Clone, Default)]
struct HyStart {
    /// windowEnd: the round ends when an ACK covers it; `None` until the first
    /// ACK of data, which starts the first round at SND.NXT.
    window_end: Option<SeqNum>,
    /// lastRoundMinRTT; `None` for infinity.
    last_round_min_rtt: Option<Duration>,
    /// currentRoundMinRTT; `None` for infinity.
    current_round_min_rtt: Option<Duration>,
    /// rttSampleCount.
    rtt_sample_count: u32,
    /// cssBaselineMinRtt: `Some` while in Conservative Slow Start.
    css_baseline_min_rtt: Option<Duration>,
    /// CSS rounds ended, the one CSS began in included.
    css_rounds: u32,
}

/// What HyStart++ did on an ACK, for the connection's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HyStartEvent {
    /// The delay rose: Conservative Slow Start.
    CssEntered,
    /// CSS_ROUNDS rounds of CSS: congestion avoidance, ssthresh = cwnd.
    SlowStartExited,
}

/// CUBIC's state (RFC 9438 §4.1), windows in segments.
#[derive(Debug, Clone, Default)]
struct Cubic {
    /// W_max: the window before the last reduction, or less with fast convergence.
    w_max: f64,
    /// cwnd_prior: the window when ssthresh was last set (§4.3's switch of α).
    cwnd_prior: f64,
    /// Start of the current congestion avoidance stage, t = 0; `None` until the
    /// first ACK in it (or HyStart++ ends slow start, at that moment).
    epoch: Option<Time>,
    /// K (§4.2, equation 2), in seconds.
    k: f64,
    /// W_est (§4.3), the window Reno would have now.
    w_est: f64,
    /// Bytes of growth not yet whole, carried to the next ACK.
    carry: f64,
}

impl Cubic {
    /// §4.2: a congestion avoidance stage starts at `now` with cwnd_epoch = `cwnd`;
    /// without an earlier reduction (slow start ended at ssthresh, or by HyStart++,
    /// §4.10) the plateau W_max is here and K = 0.
    fn begin_epoch(&mut self, cwnd: f64, now: Time) {
        if self.w_max < cwnd {
            self.w_max = cwnd;
        }
        self.k = ((self.w_max - cwnd) / CUBIC_C).cbrt();
        self.w_est = cwnd;
        self.carry = 0.0;
        self.epoch = Some(now);
    }

    /// W_cubic(t) of §4.2, equation 1, with `t` in seconds since the epoch.
    fn w_cubic(&self, t: f64) -> f64 {
        CUBIC_C * (t - self.k).powi(3) + self.w_max
    }
}

/// Congestion window and slow-start threshold, in bytes.
#[derive(Debug, Clone)]
pub(crate) struct CongestionControl {
    algorithm: Congestion,
    cwnd: u32,
    /// IW, for the restart after idle.
    initial: u32,
    ssthresh: u32,
    mss: u32,
    cubic: Cubic,
    /// `None` without HyStart++ ([`super::TcpConfig::hystart`]).
    hystart: Option<HyStart>,
}

impl CongestionControl {
    /// The initial window: RFC 6928 §2's min(10·SMSS, max(2·SMSS, 14600))
    /// bytes where `large_initial_window`, else RFC 5681 §3.1's equation (1),
    /// 2 to 4 segments by SMSS; ssthresh starts arbitrarily high. RFC 9438
    /// §4.10 keeps both.
    pub(crate) fn new(
        algorithm: Congestion,
        mss: u32,
        hystart: bool,
        large_initial_window: bool,
    ) -> Self {
        let cwnd = if large_initial_window {
            (10 * mss).min((2 * mss).max(14_600))
        } else {
            mss * match mss {
                m if m > 2190 => 2,
                m if m > 1095 => 3,
                _ => 4,
            }
        };
        CongestionControl {
            algorithm,
            cwnd,
            initial: cwnd,
            ssthresh: u32::MAX,
            mss,
            cubic: Cubic::default(),
            hystart: hystart.then(HyStart::default),
        }
    }

    /// RFC 5681 §3.1: after a lost SYN or SYN-ACK the initial window MUST be one
    /// segment.
    pub(crate) fn syn_lost(&mut self) {
        self.cwnd = self.mss;
    }

    /// Bytes that may be outstanding.
    pub(crate) fn window(&self) -> u32 {
        self.cwnd
    }

    /// The slow-start threshold.
    pub(crate) fn ssthresh(&self) -> u32 {
        self.ssthresh
    }

    /// New data acknowledged outside recovery: slow start (RFC 5681 equation (2),
    /// with RFC 3465's limit of one SMSS per ACK) or congestion avoidance. `rtt` is
    /// the smoothed RTT, which CUBIC looks ahead by.
    pub(crate) fn on_ack(&mut self, acked: u32, now: Time, rtt: Duration) {
        if self.cwnd < self.ssthresh {
            // RFC 9406 §4.2 grows by min(N, L·SMSS) and says an unpaced sender
            // SHOULD use L = 8; we keep RFC 3465's L = 1, so that HyStart++
            // changes where slow start ends, not how fast it goes nor its bursts.
            // Measured: with L = 8, a stretch ACK's burst overflowed the
            // 1000-segment bottleneck of `hystart_leaves_slow_start_before_the_
            // queue_overflows` in slow start (278 drops, against none), before
            // the RTT rose enough to be seen.
            let mut inc = acked.min(self.mss);
            if self.in_css() {
                // RFC 9406 §4.2: CSS grows by a CSS_GROWTH_DIVISOR-th of that.
                inc /= CSS_GROWTH_DIVISOR;
            }
            self.cwnd = self.cwnd.saturating_add(inc);
            return;
        }
        match self.algorithm {
            // RFC 5681 equation (3).
            Congestion::NewReno => {
                let inc = (self.mss * self.mss / self.cwnd).max(1);
                self.cwnd = self.cwnd.saturating_add(inc);
            }
            Congestion::Cubic => self.cubic_avoidance(acked, now, rtt),
        }
    }

    /// RFC 9438 §4.2–§4.5: congestion avoidance along W_cubic, or W_est where Reno
    /// would be faster.
    fn cubic_avoidance(&mut self, acked: u32, now: Time, rtt: Duration) {
        let mss = f64::from(self.mss);
        let cwnd = f64::from(self.cwnd) / mss;
        let c = &mut self.cubic;
        let epoch = match c.epoch {
            Some(e) => e,
            None => {
                c.begin_epoch(cwnd, now);
                now
            }
        };
        let t = now.saturating_duration_since(epoch).as_secs_f64();
        // §4.3, equation 4; α becomes 1 once W_est reaches cwnd_prior.
        let alpha = if c.w_est >= c.cwnd_prior {
            1.0
        } else {
            CUBIC_ALPHA
        };
        c.w_est += alpha * f64::from(acked) / mss / cwnd;
        if c.w_cubic(t) < c.w_est {
            // §4.3: the Reno-friendly region.
            self.cwnd = self.cwnd.max((c.w_est * mss) as u32);
            return;
        }
        // §4.4, §4.5: aim at W_cubic one RTT ahead, kept within [cwnd, 1.5 cwnd],
        // and close (target − cwnd) / cwnd of the gap per segment acknowledged.
        let target = c.w_cubic(t + rtt.as_secs_f64()).clamp(cwnd, 1.5 * cwnd);
        c.carry += (target - cwnd) / cwnd * f64::from(acked);
        let whole = c.carry.floor();
        c.carry -= whole;
        self.cwnd = self.cwnd.saturating_add(whole as u32);
    }

    /// HyStart++ is on and slow start is its initial one (RFC 9406 §4.3: HyStart++
    /// SHOULD only be used while ssthresh is at its initial, arbitrarily high
    /// value; a later slow start, after a timeout, stops at the ssthresh the loss
    /// set, and a loss in CSS ends it the same way).
    fn hystart(&mut self) -> Option<&mut HyStart> {
        self.hystart.as_mut().filter(|_| self.ssthresh == u32::MAX)
    }

    /// HyStart++ watches this slow start (see [`CongestionControl::hystart`]).
    pub(crate) fn hystart_running(&self) -> bool {
        self.hystart.is_some() && self.ssthresh == u32::MAX
    }

    /// In Conservative Slow Start (RFC 9406 §4.2).
    fn in_css(&self) -> bool {
        self.ssthresh == u32::MAX
            && self
                .hystart
                .as_ref()
                .is_some_and(|h| h.css_baseline_min_rtt.is_some())
    }

    /// RFC 9406 §4.2 on an ACK of new data outside recovery, after [`Self::on_ack`]
    /// grew the window by it: `rtt` is the ACK's RTT sample, if it gave one
    /// (timestamps give one per ACK; Karn's rule one per round, fewer than
    /// N_RTT_SAMPLE, so that without timestamps slow start ends by loss as ever),
    /// `ack` its SEG.ACK and `snd_nxt` where the next round ends.
    pub(crate) fn hystart_on_ack(
        &mut self,
        ack: SeqNum,
        snd_nxt: SeqNum,
        rtt: Option<Duration>,
        now: Time,
    ) -> Option<HyStartEvent> {
        let h = self.hystart()?;
        let mut event = None;
        if let Some(r) = rtt {
            h.current_round_min_rtt = Some(h.current_round_min_rtt.map_or(r, |m| m.min(r)));
            h.rtt_sample_count += 1;
        }
        if h.rtt_sample_count >= N_RTT_SAMPLE {
            match (
                h.css_baseline_min_rtt,
                h.last_round_min_rtt,
                h.current_round_min_rtt,
            ) {
                // In CSS, the delay fell back below the baseline: its increase was
                // jitter, and slow start resumes, HyStart++ included.
                (Some(base), _, Some(cur)) if cur < base => {
                    h.css_baseline_min_rtt = None;
                    h.css_rounds = 0;
                }
                // In slow start, the delay rose by RttThresh = lastRoundMinRTT / 8
                // within [MIN_RTT_THRESH, MAX_RTT_THRESH]: a queue is building.
                (None, Some(last), Some(cur)) => {
                    let thresh = (last / MIN_RTT_DIVISOR).clamp(MIN_RTT_THRESH, MAX_RTT_THRESH);
                    if cur >= last + thresh {
                        h.css_baseline_min_rtt = Some(cur);
                        h.css_rounds = 0;
                        event = Some(HyStartEvent::CssEntered);
                    }
                }
                _ => {}
            }
        }
        // Rounds by sequence numbers: one ends when windowEnd is acknowledged,
        // and the next one runs to SND.NXT.
        let Some(end) = h.window_end else {
            h.window_end = Some(snd_nxt);
            return event;
        };
        if ack < end {
            return event;
        }
        if h.css_baseline_min_rtt.is_some() {
            h.css_rounds += 1;
            if h.css_rounds >= CSS_ROUNDS {
                self.enter_avoidance(now);
                return Some(HyStartEvent::SlowStartExited);
            }
        }
        h.window_end = Some(snd_nxt);
        h.last_round_min_rtt = h.current_round_min_rtt.take();
        h.rtt_sample_count = 0;
        event
    }

    /// CSS_ROUNDS rounds of CSS are over: congestion avoidance with ssthresh =
    /// cwnd (RFC 9406 §4.2). CUBIC starts its stage now: with no loss W_max is
    /// undefined, so RFC 9438 §4.10 takes cwnd_prior = W_max = cwnd and K = 0.
    fn enter_avoidance(&mut self, now: Time) {
        self.ssthresh = self.cwnd;
        if self.algorithm == Congestion::Cubic {
            let cwnd = f64::from(self.cwnd) / f64::from(self.mss);
            self.cubic.cwnd_prior = cwnd;
            self.cubic.begin_epoch(cwnd, now);
        }
    }

    /// Sending resumes after `idle` with nothing in flight. Time without sending
    /// says nothing of the path, so CUBIC's epoch moves on by it (RFC 9438 §5.8
    /// asks not to grow while application-limited; Linux's bictcp_cwnd_event does
    /// this), lest W_cubic of the idle time open the window at once. Idle for
    /// longer than `rto`, the window restarts at RFC 5681 §4.1's RW =
    /// min(IW, cwnd), a burst the path may no longer take, and ssthresh keeps
    /// three quarters of the window (RFC 2861 §3, as Linux) for slow start to
    /// regain it.
    pub(crate) fn restart_after_idle(&mut self, idle: Duration, rto: Duration) {
        if let Some(epoch) = &mut self.cubic.epoch {
            *epoch = *epoch + idle;
        }
        if idle > rto && self.cwnd > self.initial {
            self.ssthresh = self.ssthresh.max(self.cwnd / 4 * 3);
            self.cwnd = self.initial;
        }
    }

    /// A congestion event sets ssthresh: RFC 5681 equation (4), half the flight;
    /// RFC 9438 §4.6, β_cubic × cwnd, with W_max by §4.7's fast convergence. At
    /// least two segments either way.
    fn reduce(&mut self, flight: u32) {
        let floor = 2 * self.mss;
        self.ssthresh = match self.algorithm {
            Congestion::NewReno => (flight / 2).max(floor),
            Congestion::Cubic => {
                let cwnd = f64::from(self.cwnd) / f64::from(self.mss);
                let c = &mut self.cubic;
                // §4.7: a loss before regaining the last plateau means competition;
                // release bandwidth by aiming lower.
                c.w_max = if cwnd < c.w_max {
                    cwnd * (1.0 + CUBIC_BETA) / 2.0
                } else {
                    cwnd
                };
                c.cwnd_prior = cwnd;
                c.epoch = None;
                ((f64::from(self.cwnd) * CUBIC_BETA) as u32).max(floor)
            }
        };
    }

    /// Retransmission timeout (RFC 5681 §3.1, RFC 9438 §4.8): ssthresh as for any
    /// congestion event, cwnd one segment, the loss window.
    pub(crate) fn on_timeout(&mut self, flight: u32) {
        self.reduce(flight);
        self.cwnd = self.mss;
    }

    /// Loss detected by duplicate ACKs or the SACK scoreboard (RFC 6582 §3.2 step
    /// 2, RFC 6675 §5 step 4.2): cwnd = ssthresh, inflated by the three segments
    /// that have left the network when NewReno's arithmetic follows (`inflate`);
    /// SACK recovery counts them in its pipe instead.
    pub(crate) fn enter_recovery(&mut self, flight: u32, inflate: bool) {
        self.reduce(flight);
        self.cwnd = self.ssthresh + if inflate { 3 * self.mss } else { 0 };
    }

    /// Another duplicate ACK in NewReno recovery (step 4): one more segment has left.
    pub(crate) fn on_dup_ack(&mut self) {
        self.cwnd = self.cwnd.saturating_add(self.mss);
    }

    /// A partial ACK in NewReno recovery (step 5): deflate by what it acknowledged,
    /// then add back a segment if it acknowledged one or more.
    pub(crate) fn on_partial_ack(&mut self, acked: u32) {
        self.cwnd = self.cwnd.saturating_sub(acked).max(self.mss);
        if acked >= self.mss {
            self.cwnd = self.cwnd.saturating_add(self.mss);
        }
    }

    /// A full ACK ends recovery (RFC 6582 §3.2 step 3, option 1): no burst larger
    /// than a segment beyond what is still in flight.
    pub(crate) fn exit_recovery(&mut self, flight: u32) {
        self.cwnd = self.ssthresh.min(flight.max(self.mss) + self.mss);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reno(mss: u32) -> CongestionControl {
        CongestionControl::new(Congestion::NewReno, mss, false, false)
    }

    #[test]
    fn initial_window_by_mss() {
        assert_eq!(reno(536).window(), 4 * 536);
        assert_eq!(reno(1460).window(), 3 * 1460);
        assert_eq!(reno(4000).window(), 8000);
        let mut c = CongestionControl::new(Congestion::Cubic, 1460, false, false);
        assert_eq!(c.window(), 3 * 1460);
        c.syn_lost();
        assert_eq!(c.window(), 1460);
    }

    #[test]
    fn large_initial_window_by_mss() {
        let iw = |mss| CongestionControl::new(Congestion::Cubic, mss, false, true).window();
        // RFC 6928 §2: min(10·MSS, max(2·MSS, 14600)).
        assert_eq!(iw(536), 10 * 536);
        assert_eq!(iw(1460), 14_600);
        assert_eq!(iw(1448), 10 * 1448);
        assert_eq!(iw(4000), 14_600);
        assert_eq!(iw(9000), 18_000);
        // Lost SYN or SYN-ACK: one segment all the same (RFC 6928 §2).
        let mut c = CongestionControl::new(Congestion::NewReno, 1460, false, true);
        c.syn_lost();
        assert_eq!(c.window(), 1460);
    }

    #[test]
    fn the_window_restarts_after_an_idle_rto() {
        let rto = Duration::from_secs(1);
        let mut c = CongestionControl::new(Congestion::Cubic, 1000, false, true);
        c.cwnd = 100_000;
        c.ssthresh = 40_000;
        // Not longer than an RTO: as it was.
        c.restart_after_idle(rto, rto);
        assert_eq!((c.window(), c.ssthresh()), (100_000, 40_000));
        // Longer: RW = min(IW, cwnd), ssthresh at least 3/4 of the window.
        c.restart_after_idle(rto * 2, rto);
        assert_eq!((c.window(), c.ssthresh()), (10_000, 75_000));
        // A window below IW stays.
        c.cwnd = 4_000;
        c.restart_after_idle(rto * 2, rto);
        assert_eq!((c.window(), c.ssthresh()), (4_000, 75_000));
    }

    #[test]
    fn slow_start_avoidance_and_losses() {
        let (now, rtt) = (Time::ZERO, Duration::from_millis(10));
        let mut c = reno(1000);
        // Slow start: a segment per ACK, however much it acknowledges.
        c.on_ack(1000, now, rtt);
        c.on_ack(5000, now, rtt);
        assert_eq!(c.window(), 6000);
        // Timeout: ssthresh = flight / 2, cwnd one segment.
        c.on_timeout(6000);
        assert_eq!((c.window(), c.ssthresh()), (1000, 3000));
        c.on_ack(1000, now, rtt);
        c.on_ack(1000, now, rtt);
        assert_eq!(c.window(), 3000);
        // Congestion avoidance: about a segment per window.
        c.on_ack(1000, now, rtt);
        assert_eq!(c.window(), 3333);
        // Fast recovery: halve, inflate, deflate, settle.
        c.enter_recovery(8000, true);
        assert_eq!((c.window(), c.ssthresh()), (7000, 4000));
        c.on_dup_ack();
        assert_eq!(c.window(), 8000);
        c.on_partial_ack(2500);
        assert_eq!(c.window(), 6500);
        c.on_partial_ack(10);
        assert_eq!(c.window(), 6490);
        c.exit_recovery(1000);
        assert_eq!(c.window(), 2000);
        c.exit_recovery(9000);
        assert_eq!(c.window(), 4000);
        // SACK recovery: no inflation.
        c.enter_recovery(8000, false);
        assert_eq!((c.window(), c.ssthresh()), (4000, 4000));
        // The threshold never falls under two segments.
        c.on_timeout(0);
        assert_eq!(c.ssthresh(), 2000);
    }

    /// Drives a CUBIC window from a loss at `w_max` segments with one ACK per
    /// segment, a window per RTT, and returns (t, cwnd in segments) per RTT.
    fn cubic_after_loss(w_max: u32, rtt: Duration, rtts: u32) -> Vec<(f64, f64)> {
        let mss = 1000;
        let mut c = CongestionControl::new(Congestion::Cubic, mss, false, false);
        c.cwnd = w_max * mss;
        c.ssthresh = 0;
        c.enter_recovery(w_max * mss, false);
        c.exit_recovery(w_max * mss);
        let mut now = Time::ZERO + Duration::from_secs(1);
        let start = now;
        let mut out = vec![];
        for _ in 0..rtts {
            let segments = c.window() / mss;
            for i in 0..segments {
                c.on_ack(mss, now + rtt * i / segments, rtt);
            }
            now = now + rtt;
            let t = now.saturating_duration_since(start).as_secs_f64();
            out.push((t, f64::from(c.window()) / f64::from(mss)));
        }
        out
    }

    #[test]
    fn cubic_decrease_and_fast_convergence() {
        let mut c = CongestionControl::new(Congestion::Cubic, 1000, false, false);
        c.cwnd = 100_000;
        c.enter_recovery(100_000, false);
        // §4.6: β = 0.7.
        assert_eq!((c.window(), c.ssthresh()), (70_000, 70_000));
        assert_eq!(c.cubic.w_max, 100.0);
        // §4.7: another loss below W_max lowers the plateau to cwnd (1 + β) / 2.
        c.enter_recovery(70_000, false);
        assert!((c.cubic.w_max - 70.0 * 0.85).abs() < 1e-9);
        assert_eq!(c.window(), 49_000);
        // §4.8: a timeout leaves one segment.
        c.on_timeout(49_000);
        assert_eq!((c.window(), c.ssthresh()), (1000, 34_300));
    }

    #[test]
    fn cubic_follows_its_curve() {
        // W_max = 100 segments: K = cbrt(100 × 0.3 / 0.4) ≈ 4.22 s. With a 100 ms
        // RTT the curve outruns Reno's W_est, so cwnd tracks W_cubic(t), a little
        // ahead as it aims one RTT on.
        let rtt = Duration::from_millis(100);
        let k = (100.0f64 * 0.3 / 0.4).cbrt();
        let trace = cubic_after_loss(100, rtt, 80);
        for &(t, w) in &trace {
            let curve = 0.4 * (t - k).powi(3) + 100.0;
            assert!(
                (w - curve).abs() <= 0.05 * curve + 1.0,
                "t = {t:.1} s: cwnd {w:.1}, W_cubic {curve:.1}"
            );
        }
        // Concave, flat near W_max around K, then convex.
        let at = |s: f64| trace.iter().find(|p| p.0 >= s).unwrap().1;
        assert!(at(1.0) - at(0.1) > at(4.3) - at(3.4));
        assert!(at(8.0) - at(7.1) > at(4.3) - at(3.4));
        assert!((at(k) - 100.0).abs() < 2.0);
    }

    #[test]
    fn cubic_idle_time_does_not_count() {
        let rtt = Duration::from_millis(100);
        let mss = 1000;
        let mut c = CongestionControl::new(Congestion::Cubic, mss, false, false);
        c.cwnd = 100 * mss;
        c.enter_recovery(100 * mss, false);
        let t = Time::ZERO + Duration::from_secs(1);
        c.on_ack(mss, t, rtt);
        let before = c.window();
        // Ten idle seconds, well past K ≈ 4.2 s: the next window of ACKs finds
        // the curve where it left it, rather than aiming at W_cubic(10 s) ≈ 180
        // segments and growing by half.
        c.restart_after_idle(Duration::from_secs(10), Duration::from_secs(60));
        for _ in 0..70 {
            c.on_ack(mss, t + Duration::from_secs(10), rtt);
        }
        assert!(c.window() - before < 3 * mss, "{} → {}", before, c.window());
    }

    #[test]
    fn cubic_is_reno_friendly_on_short_rtts() {
        // At 1 ms the curve barely moves within many RTTs, while Reno's estimate
        // grows by α_cubic per RTT (§4.3).
        let trace = cubic_after_loss(100, Duration::from_millis(1), 40);
        let (_, w) = trace[39];
        let w_est = 70.0 + CUBIC_ALPHA * 40.0;
        assert!((w - w_est).abs() < 1.5, "cwnd {w:.1}, W_est {w_est:.1}");
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A slow-starting sender for HyStart++: every ACK acknowledges a segment
    /// (of 1000 bytes), and the window is refilled after it.
    struct Rounds {
        c: CongestionControl,
        una: SeqNum,
        nxt: SeqNum,
        /// The SND.NXT that ends the current round, as HyStart++ keeps it.
        round_end: SeqNum,
        now: Time,
        events: Vec<HyStartEvent>,
    }

    impl Rounds {
        fn new(algorithm: Congestion) -> Rounds {
            let c = CongestionControl::new(algorithm, 1000, true, false);
            let nxt = SeqNum(c.window());
            Rounds {
                c,
                una: SeqNum(0),
                nxt,
                round_end: nxt,
                now: Time::ZERO,
                events: vec![],
            }
        }

        /// One round trip: the ACKs of what was in flight at its start, the
        /// first `samples` of them with an RTT sample `rtt`.
        fn round(&mut self, rtt: Duration, samples: u32) {
            let end = self.round_end;
            let mut i = 0;
            while self.una < end {
                self.una = self.una + 1000;
                self.now = self.now + Duration::from_micros(100);
                self.c.on_ack(1000, self.now, rtt);
                let sample = (i < samples).then_some(rtt);
                let event = self.c.hystart_on_ack(self.una, self.nxt, sample, self.now);
                self.events.extend(event);
                if self.una >= end {
                    self.round_end = self.nxt;
                }
                self.nxt = self.una + self.c.window();
                i += 1;
            }
        }

        /// Segments acknowledged in the next round.
        fn next_acks(&self) -> u32 {
            self.round_end.distance_from(self.una).div_ceil(1000)
        }
    }

    #[test]
    fn hystart_keeps_slow_start_while_rtt_is_flat() {
        let mut r = Rounds::new(Congestion::NewReno);
        for _ in 0..8 {
            let (before, acks) = (r.c.window(), r.next_acks());
            r.round(ms(50), u32::MAX);
            // Slow start: a segment per ACK, doubling per round.
            assert_eq!(r.c.window(), before + acks * 1000);
        }
        assert!(r.c.window() >= 256 * 1000, "{}", r.c.window());
        assert_eq!((r.events.len(), r.c.ssthresh()), (0, u32::MAX));
    }

    /// Three rounds at `base`, then one at `base + rise`: whether that round
    /// entered CSS.
    fn css_after_rise(base: Duration, rise: Duration) -> bool {
        let mut r = Rounds::new(Congestion::NewReno);
        for _ in 0..3 {
            r.round(base, u32::MAX);
        }
        r.round(base + rise, u32::MAX);
        assert!(r.events.len() <= 1);
        r.c.in_css()
    }

    #[test]
    fn hystart_rtt_thresh_is_an_eighth_clamped_to_4_16_ms() {
        // lastRoundMinRTT / 8 = 6.25 ms.
        assert!(!css_after_rise(ms(50), Duration::from_micros(6_249)));
        assert!(css_after_rise(ms(50), Duration::from_micros(6_250)));
        // 10 ms / 8 is under MIN_RTT_THRESH.
        assert!(!css_after_rise(ms(10), Duration::from_micros(3_999)));
        assert!(css_after_rise(ms(10), ms(4)));
        // 400 ms / 8 is over MAX_RTT_THRESH.
        assert!(!css_after_rise(ms(400), Duration::from_micros(15_999)));
        assert!(css_after_rise(ms(400), ms(16)));
    }

    #[test]
    fn hystart_css_grows_by_a_quarter_then_avoidance_after_5_rounds() {
        let mut r = Rounds::new(Congestion::NewReno);
        for _ in 0..3 {
            r.round(ms(50), u32::MAX);
        }
        // 32 segments acknowledged in this round: CSS from the 8th sample on, a
        // quarter segment per ACK after.
        let (before, acks) = (r.c.window(), r.next_acks());
        r.round(ms(60), u32::MAX);
        assert_eq!(r.events, [HyStartEvent::CssEntered]);
        assert_eq!(r.c.window(), before + 8 * 1000 + (acks - 8) * 250);
        // Three more rounds of CSS, whatever the RTT does above the baseline.
        for rtt in [60, 70, 65] {
            let (before, acks) = (r.c.window(), r.next_acks());
            r.round(ms(rtt), u32::MAX);
            assert_eq!(r.c.window(), before + acks * 250);
            assert_eq!(r.c.ssthresh(), u32::MAX);
        }
        // The fifth ends it: congestion avoidance at ssthresh = cwnd.
        r.round(ms(60), u32::MAX);
        assert_eq!(
            r.events,
            [HyStartEvent::CssEntered, HyStartEvent::SlowStartExited]
        );
        assert!(!r.c.in_css());
        let w = r.c.window();
        assert_eq!(r.c.ssthresh(), w);
        // Reno's congestion avoidance: about a segment per round.
        let acks = r.next_acks();
        r.round(ms(60), u32::MAX);
        assert!(r.c.window() - w <= 1000 * acks.div_ceil(w / 1000));
        // Slow start is over for good: the RTT samples do nothing more.
        r.round(ms(30), u32::MAX);
        r.round(ms(90), u32::MAX);
        assert_eq!(r.events.len(), 2);
    }

    #[test]
    fn hystart_css_resumes_slow_start_when_rtt_falls_below_baseline() {
        let mut r = Rounds::new(Congestion::NewReno);
        for _ in 0..3 {
            r.round(ms(50), u32::MAX);
        }
        r.round(ms(60), u32::MAX);
        assert!(r.c.in_css());
        // The rise was jitter: the next round's minimum falls under the 60 ms
        // baseline, and after its 8th sample slow start grows a segment per ACK.
        let (before, acks) = (r.c.window(), r.next_acks());
        r.round(ms(59), u32::MAX);
        assert!(!r.c.in_css());
        assert_eq!(r.c.window(), before + 8 * 250 + (acks - 8) * 1000);
        assert_eq!(r.c.ssthresh(), u32::MAX);
        // HyStart++ goes on: another rise is another CSS.
        r.round(ms(59), u32::MAX);
        r.round(ms(70), u32::MAX);
        assert!(r.c.in_css());
        assert_eq!(r.events, [HyStartEvent::CssEntered; 2]);
    }

    #[test]
    fn hystart_needs_8_samples_per_round() {
        let mut r = Rounds::new(Congestion::NewReno);
        // Seven samples a round (Karn's one a round likewise) never suffice,
        // however much the RTT rises.
        for i in 0..10 {
            let (before, acks) = (r.c.window(), r.next_acks());
            r.round(ms(50 + 20 * i), 7);
            assert_eq!(r.c.window(), before + acks * 1000);
        }
        assert!(r.events.is_empty());
        // With an eighth the same rise counts.
        r.round(ms(300), 8);
        assert_eq!(r.events, [HyStartEvent::CssEntered]);
    }

    #[test]
    fn hystart_loss_in_css_ends_it_by_the_loss_response() {
        let mut r = Rounds::new(Congestion::NewReno);
        for _ in 0..3 {
            r.round(ms(50), u32::MAX);
        }
        r.round(ms(60), u32::MAX);
        assert!(r.c.in_css());
        // A timeout: ssthresh as for any loss, then plain slow start up to it
        // (RFC 9406 §4.3), a whole segment per ACK, no more HyStart++.
        let flight = r.nxt.distance_from(r.una);
        r.c.on_timeout(flight);
        assert_eq!((r.c.window(), r.c.ssthresh()), (1000, flight / 2));
        r.nxt = r.una + 1000;
        r.round_end = r.nxt;
        for rtt in [50, 70, 90] {
            let (before, acks) = (r.c.window(), r.next_acks());
            r.round(ms(rtt), u32::MAX);
            assert_eq!(r.c.window(), before + acks * 1000);
        }
        assert_eq!(r.events, [HyStartEvent::CssEntered]);
    }

    #[test]
    fn hystart_exit_starts_cubic_epoch_at_cwnd() {
        let mut r = Rounds::new(Congestion::Cubic);
        for _ in 0..3 {
            r.round(ms(50), u32::MAX);
        }
        for _ in 0..5 {
            r.round(ms(60), u32::MAX);
        }
        assert_eq!(r.events.last(), Some(&HyStartEvent::SlowStartExited));
        // RFC 9438 §4.10: cwnd_prior = W_max = cwnd, K = 0, t from the exit.
        let w = f64::from(r.c.window()) / 1000.0;
        let c = &r.c.cubic;
        assert_eq!(
            (c.w_max, c.cwnd_prior, c.k, c.epoch),
            (w, w, 0.0, Some(r.now))
        );
        // From the plateau CUBIC grows slowly at first: within 2 % in a round.
        let before = r.c.window();
        r.round(ms(60), u32::MAX);
        assert!(r.c.window() > before && r.c.window() < before * 102 / 100);
    }
}
