//! Congestion control: RFC 5681 slow start and congestion avoidance, with NewReno's
//! fast recovery (RFC 6582). The connection detects duplicate ACKs and partial
//! ACKs and retransmits; this keeps the windows.

/// Congestion window and slow-start threshold, in bytes.
#[derive(Debug, Clone)]
pub(crate) struct NewReno {
    cwnd: u32,
    ssthresh: u32,
    mss: u32,
}

impl NewReno {
    /// RFC 5681 §3.1, equation (1): the initial window by SMSS; ssthresh starts
    /// arbitrarily high.
    pub(crate) fn new(mss: u32) -> Self {
        let segments = match mss {
            m if m > 2190 => 2,
            m if m > 1095 => 3,
            _ => 4,
        };
        NewReno {
            cwnd: segments * mss,
            ssthresh: u32::MAX,
            mss,
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

    /// New data acknowledged outside recovery: slow start (equation (2), with RFC
    /// 3465's limit of one SMSS per ACK) or congestion avoidance (equation (3)).
    pub(crate) fn on_ack(&mut self, acked: u32) {
        let inc = if self.cwnd < self.ssthresh {
            acked.min(self.mss)
        } else {
            (self.mss * self.mss / self.cwnd).max(1)
        };
        self.cwnd = self.cwnd.saturating_add(inc);
    }

    /// Equation (4): half the flight, at least two segments.
    fn halve(&mut self, flight: u32) {
        self.ssthresh = (flight / 2).max(2 * self.mss);
    }

    /// Retransmission timeout (RFC 5681 §3.1): one segment, the loss window.
    pub(crate) fn on_timeout(&mut self, flight: u32) {
        self.halve(flight);
        self.cwnd = self.mss;
    }

    /// Third duplicate ACK (RFC 6582 §3.2 step 2): the window inflated by the three
    /// segments that have left the network.
    pub(crate) fn enter_recovery(&mut self, flight: u32) {
        self.halve(flight);
        self.cwnd = self.ssthresh + 3 * self.mss;
    }

    /// Another duplicate ACK in recovery (step 4): one more segment has left.
    pub(crate) fn on_dup_ack(&mut self) {
        self.cwnd = self.cwnd.saturating_add(self.mss);
    }

    /// A partial ACK (step 5): deflate by what it acknowledged, then add back a
    /// segment if it acknowledged one or more.
    pub(crate) fn on_partial_ack(&mut self, acked: u32) {
        self.cwnd = self.cwnd.saturating_sub(acked).max(self.mss);
        if acked >= self.mss {
            self.cwnd = self.cwnd.saturating_add(self.mss);
        }
    }

    /// A full ACK ends recovery (step 3, option 1): no burst larger than a segment
    /// beyond what is still in flight.
    pub(crate) fn exit_recovery(&mut self, flight: u32) {
        self.cwnd = self.ssthresh.min(flight.max(self.mss) + self.mss);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_window_by_mss() {
        assert_eq!(NewReno::new(536).window(), 4 * 536);
        assert_eq!(NewReno::new(1460).window(), 3 * 1460);
        assert_eq!(NewReno::new(4000).window(), 8000);
        let mut c = NewReno::new(1460);
        c.syn_lost();
        assert_eq!(c.window(), 1460);
    }

    #[test]
    fn slow_start_avoidance_and_losses() {
        let mut c = NewReno::new(1000);
        // Slow start: a segment per ACK, however much it acknowledges.
        c.on_ack(1000);
        c.on_ack(5000);
        assert_eq!(c.window(), 6000);
        // Timeout: ssthresh = flight / 2, cwnd one segment.
        c.on_timeout(6000);
        assert_eq!((c.window(), c.ssthresh), (1000, 3000));
        c.on_ack(1000);
        c.on_ack(1000);
        assert_eq!(c.window(), 3000);
        // Congestion avoidance: about a segment per window.
        c.on_ack(1000);
        assert_eq!(c.window(), 3333);
        // Fast recovery: halve, inflate, deflate, settle.
        c.enter_recovery(8000);
        assert_eq!((c.window(), c.ssthresh), (7000, 4000));
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
        // The threshold never falls under two segments.
        c.on_timeout(0);
        assert_eq!(c.ssthresh, 2000);
    }
}
