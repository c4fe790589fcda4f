//! The retransmission timeout (RFC 6298): smoothed RTT and its variation from
//! samples, exponential backoff on timeouts.

use std::time::Duration;

use crate::time::nanos;

/// Clock granularity G of RFC 6298 §2: time here is in nanoseconds, but the RTO
/// should not collapse onto SRTT when samples barely vary.
const GRANULARITY: u64 = 1_000_000;
/// Most doublings kept; 2^16 × any RTO is far past every sensible maximum.
const MAX_BACKOFF: u32 = 16;

/// RTO state of one connection, in nanoseconds: a sample per ACK divides them
/// as integers, where `Duration`'s division carries seconds and nanoseconds
/// apart (twice the divisions).
#[derive(Debug, Clone)]
pub(crate) struct RttEstimator {
    srtt: Option<u64>,
    rttvar: u64,
    /// The RTO computed from the samples, before backoff and the bounds.
    rto: u64,
    backoff: u32,
    min: u64,
    max: u64,
}

impl RttEstimator {
    /// Before any sample the RTO is `initial` (RFC 6298 §2.1: 1 s).
    pub(crate) fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        RttEstimator {
            srtt: None,
            rttvar: 0,
            rto: nanos(initial),
            backoff: 0,
            min: nanos(min),
            max: nanos(max),
        }
    }

    /// The current timeout: computed, doubled per backoff, bounded by [min, max]
    /// (RFC 6298 §2.4, §2.5, §5.5).
    pub(crate) fn rto(&self) -> Duration {
        Duration::from_nanos(self.rto_nanos())
    }

    /// [`RttEstimator::rto`] in nanoseconds, for deadlines taken per ACK.
    pub(crate) fn rto_nanos(&self) -> u64 {
        self.rto
            .max(self.min)
            .saturating_mul(1 << self.backoff)
            .min(self.max)
    }

    /// The smoothed round-trip time, once measured.
    pub(crate) fn srtt(&self) -> Option<Duration> {
        self.srtt.map(Duration::from_nanos)
    }

    /// [`RttEstimator::srtt`] in nanoseconds.
    pub(crate) fn srtt_nanos(&self) -> Option<u64> {
        self.srtt
    }

    /// Takes a sample `r` of a segment that was not retransmitted (Karn's algorithm,
    /// RFC 6298 §3) and clears the backoff (RFC 6298 §5.7's note: the backed-off RTO
    /// holds until such a sample arrives).
    pub(crate) fn sample(&mut self, r: Duration) {
        self.sample_weighted(r, 1);
    }

    /// Takes one of `expected` samples per RTT, as timestamps give one per ACK of new
    /// data: RFC 7323 §4.2 divides alpha and beta by ExpectedSamples, so that a
    /// window's worth of samples moves the estimate as much as RFC 6298's one per RTT
    /// would. `expected` = 1 is plain RFC 6298 §2.3.
    pub(crate) fn sample_weighted(&mut self, r: Duration, expected: u32) {
        let n = u64::from(expected.max(1));
        let r = nanos(r);
        let srtt = match self.srtt {
            // RFC 6298 §2.2.
            None => {
                self.rttvar = r / 2;
                r
            }
            // RFC 6298 §2.3, with alpha = 1/8 and beta = 1/4 (over n, RFC 7323 §4.2).
            Some(srtt) => {
                let err = srtt.abs_diff(r);
                self.rttvar = self.rttvar - self.rttvar / (4 * n) + err / (4 * n);
                srtt - srtt / (8 * n) + r / (8 * n)
            }
        };
        self.srtt = Some(srtt);
        self.rto = srtt.saturating_add(GRANULARITY.max(self.rttvar.saturating_mul(4)));
        self.backoff = 0;
    }

    /// Doubles the timeout after it expired (RFC 6298 §5.5).
    pub(crate) fn back_off(&mut self) {
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
    }

    /// Starts over from `rto` without backoff (RFC 6298 §5.7: 3 s once the handshake
    /// completes if the SYN had to be retransmitted; Karn left no sample).
    pub(crate) fn reinitialize(&mut self, rto: Duration) {
        self.rto = nanos(rto);
        self.backoff = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn rfc6298_estimates() {
        let mut e = RttEstimator::new(ms(1000), ms(10), ms(60_000));
        assert_eq!(e.rto(), ms(1000));
        e.sample(ms(100));
        // SRTT = 100, RTTVAR = 50, RTO = 100 + 4 × 50.
        assert_eq!((e.srtt(), e.rto()), (Some(ms(100)), ms(300)));
        e.sample(ms(200));
        // RTTVAR = 3/4 × 50 + 1/4 × 100 = 62.5, SRTT = 87.5 + 25 = 112.5.
        assert_eq!(e.srtt(), Some(Duration::from_micros(112_500)));
        assert_eq!(e.rto(), Duration::from_micros(112_500 + 250_000));
    }

    #[test]
    fn backoff_bounds_and_reset() {
        let mut e = RttEstimator::new(ms(1000), ms(1000), ms(60_000));
        e.sample(ms(1));
        // The minimum applies to the computed value (RFC 6298 §2.4).
        assert_eq!(e.rto(), ms(1000));
        let mut seen = vec![];
        for _ in 0..8 {
            e.back_off();
            seen.push(e.rto().as_secs());
        }
        assert_eq!(seen, [2, 4, 8, 16, 32, 60, 60, 60]);
        e.sample(ms(1));
        assert_eq!(e.rto(), ms(1000));
        e.back_off();
        e.reinitialize(ms(3000));
        assert_eq!(e.rto(), ms(3000));
    }

    #[test]
    fn rfc7323_weighted_samples() {
        let mut e = RttEstimator::new(ms(1000), ms(10), ms(60_000));
        e.sample_weighted(ms(100), 4);
        assert_eq!(e.srtt(), Some(ms(100)));
        // alpha' = 1/32, beta' = 1/16: SRTT = 100 + (200 − 100) / 32 = 103.125,
        // RTTVAR = 50 + (100 − 50) / 16 = 53.125.
        e.sample_weighted(ms(200), 4);
        assert_eq!(e.srtt(), Some(Duration::from_micros(103_125)));
        assert_eq!(e.rto(), Duration::from_micros(103_125 + 4 * 53_125));
    }
}
