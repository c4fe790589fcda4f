//! Adaptive timing: warm up, time batches with [`Instant`] and
//! [`black_box`], report the median of several repetitions.
//!
//! A batch classifies consecutive frames of the case, cycling through the
//! frame set; its length is calibrated so that every repetition takes about
//! `per_case / (reps + 2)` (the two extra shares go to calibration and
//! warm-up), so one (case, system) measurement takes about `per_case`.

use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// How long to spend on one (case, system) and how many repetitions.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub per_case: Duration,
    pub reps: usize,
}

impl Budget {
    pub fn normal() -> Budget {
        Budget {
            per_case: Duration::from_millis(200),
            reps: 7,
        }
    }

    pub fn quick() -> Budget {
        Budget {
            per_case: Duration::from_millis(30),
            reps: 5,
        }
    }

    /// The target duration of one repetition.
    pub fn per_rep(&self) -> Duration {
        self.per_case / (self.reps as u32 + 2)
    }
}

/// The median (mean of the two middle values for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of nothing");
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `p`th percentile of `v` (0 < p <= 100), nearest rank: the smallest
/// value that at least `p` percent of the values do not exceed.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    assert!(
        !v.is_empty() && p > 0.0 && p <= 100.0,
        "percentile {p} of {}",
        v.len()
    );
    v.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Median nanoseconds per frame of `classify` over `frames`.
pub fn ns_per_frame<R>(
    frames: &[Vec<u8>],
    budget: &Budget,
    mut classify: impl FnMut(&[u8]) -> R,
) -> f64 {
    assert!(!frames.is_empty());
    let n = frames.len();
    let mut pos = 0usize;
    let mut batch = |count: u64| -> Duration {
        let start = Instant::now();
        let mut left = count;
        while left > 0 {
            let end = (pos as u64 + left).min(n as u64) as usize;
            for f in &frames[pos..end] {
                black_box(classify(black_box(f.as_slice())));
            }
            left -= (end - pos) as u64;
            pos = if end == n { 0 } else { end };
        }
        start.elapsed()
    };
    let count = calibrate(budget.per_rep(), &mut batch);
    batch(count); // warm-up at full length
    let samples = (0..budget.reps)
        .map(|_| batch(count).as_nanos() as f64 / count as f64)
        .collect();
    median(samples)
}

/// Median nanoseconds per frame of `classify` called on `chunk` frames at a
/// time, cycling through `frames`.
pub fn ns_per_frame_batched<T: Copy + Default>(
    frames: &[&[u8]],
    budget: &Budget,
    chunk: usize,
    mut classify: impl FnMut(&[&[u8]], &mut [T]),
) -> f64 {
    assert!(!frames.is_empty() && chunk > 0);
    let n = frames.len();
    let mut out = vec![T::default(); chunk];
    let mut pos = 0usize;
    let mut batch = |count: u64| -> Duration {
        let start = Instant::now();
        let mut left = count;
        while left > 0 {
            let take = (left.min(chunk as u64) as usize).min(n - pos);
            classify(black_box(&frames[pos..pos + take]), &mut out[..take]);
            black_box(&out);
            left -= take as u64;
            pos = if pos + take == n { 0 } else { pos + take };
        }
        start.elapsed()
    };
    let count = calibrate(budget.per_rep(), &mut batch);
    batch(count);
    let samples = (0..budget.reps)
        .map(|_| batch(count).as_nanos() as f64 / count as f64)
        .collect();
    median(samples)
}

/// Median nanoseconds per operation of `batch`, which does the number of
/// operations it is given (one round trip, one descriptor...) and says how
/// long they took; it may fail (a peer process that stopped answering), and
/// then so does the measurement. Calibrated and warmed up like
/// [`ns_per_frame`].
pub fn ns_per_op<E>(
    budget: &Budget,
    mut batch: impl FnMut(u64) -> Result<Duration, E>,
) -> Result<f64, E> {
    let count = try_calibrate(budget.per_rep(), &mut batch)?;
    batch(count)?;
    let mut samples = Vec::with_capacity(budget.reps);
    for _ in 0..budget.reps {
        samples.push(batch(count)?.as_nanos() as f64 / count as f64);
    }
    Ok(median(samples))
}

/// The batch length that makes `batch` take about `target`.
pub fn calibrate(target: Duration, batch: &mut impl FnMut(u64) -> Duration) -> u64 {
    match try_calibrate(target, &mut |n| Ok::<_, Infallible>(batch(n))) {
        Ok(count) => count,
        Err(never) => match never {},
    }
}

/// [`calibrate`] for a batch that may fail.
fn try_calibrate<E>(
    target: Duration,
    batch: &mut impl FnMut(u64) -> Result<Duration, E>,
) -> Result<u64, E> {
    let mut count: u64 = 1;
    loop {
        let t = batch(count)?;
        if t * 4 >= target || count >= 1 << 40 {
            let scaled = count as f64 * target.as_secs_f64() / t.as_secs_f64().max(1e-9);
            return Ok((scaled as u64).max(1));
        }
        let grow = if t.is_zero() {
            16
        } else {
            (target.as_secs_f64() / t.as_secs_f64())
                .ceil()
                .clamp(2.0, 16.0) as u64
        };
        count *= grow;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn percentile_is_the_nearest_rank() {
        let mut v: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 99.0), 198.0);
        assert_eq!(percentile(&mut v, 100.0), 200.0);
        assert_eq!(percentile(&mut v, 50.0), 100.0);
        assert_eq!(percentile(&mut [7.0], 99.0), 7.0);
    }

    #[test]
    fn every_frame_is_visited_in_turn() {
        let frames: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i]).collect();
        let mut seen = [0u64; 5];
        let budget = Budget {
            per_case: Duration::from_millis(2),
            reps: 3,
        };
        ns_per_frame(&frames, &budget, |f| seen[f[0] as usize] += 1);
        let (lo, hi) = (seen.iter().min().unwrap(), seen.iter().max().unwrap());
        assert!(*lo > 0 && hi - lo <= 1, "{seen:?}");
    }
}
