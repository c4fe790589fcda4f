//! `insert-N`: with N `ports-N` filters installed, the time to insert one
//! more and have it take effect, i.e. `insert` plus the first `demux` of a
//! frame that reaches it (so an engine that compiles lazily, at the next
//! demux, is charged for its compilation too). Each inserted filter is then
//! deleted (untimed, followed by an untimed demux) so N stays N. Reported
//! as the median, in microseconds, of many such inserts.

use std::hint::black_box;
use std::time::Instant;

use exonet_dpf::Dpf;

use super::cases::{port, ports_filter, ports_frame};
use super::Fail;
use crate::bench::measure::{median, Budget};

/// Different filters to insert in turn.
const POOL: usize = 64;
const MAX_SAMPLES: usize = 100_000;

/// Median microseconds per insert; also the setup time, for the progress
/// note.
pub fn measure(n: usize, budget: &Budget) -> Result<(f64, f64), Fail> {
    let setup = Instant::now();
    let mut dpf = Dpf::new();
    let mut first = None;
    for i in 0..n {
        let id = dpf
            .insert(&ports_filter(port(i)))
            .map_err(|e| Fail::Error(format!("insert of filter {i} failed: {e}")))?;
        first.get_or_insert(id);
    }
    let got = dpf.demux(&ports_frame(port(0), 0));
    if got != first {
        return Err(Fail::Error(format!(
            "a frame to the first port reached {got:?}, not {first:?}"
        )));
    }
    let setup = setup.elapsed().as_secs_f64() * 1e3;

    let extra: Vec<_> = (n..n + POOL)
        .map(|i| (port(i), ports_filter(port(i)), ports_frame(port(i), i)))
        .collect();
    let min_samples = 2 * budget.reps + 2; // the first is dropped as warm-up
    let mut samples = Vec::new();
    let start = Instant::now();
    for (p, filter, frame) in extra.iter().cycle() {
        if samples.len() >= min_samples
            && (start.elapsed() >= budget.per_case || samples.len() >= MAX_SAMPLES)
        {
            break;
        }
        let t = Instant::now();
        let id = dpf
            .insert(black_box(filter))
            .map_err(|e| Fail::Error(format!("insert failed: {e}")))?;
        let got = dpf.demux(black_box(frame));
        let dt = t.elapsed();
        if got != Some(id) {
            return Err(Fail::Error(format!(
                "after inserting {id} for port {p}, a frame to it reached {got:?}"
            )));
        }
        dpf.delete(id)
            .map_err(|e| Fail::Error(format!("delete failed: {e}")))?;
        if let Some(other) = dpf.demux(frame) {
            return Err(Fail::Error(format!(
                "after deleting {id}, a frame to port {p} still reached {other}"
            )));
        }
        samples.push(dt.as_secs_f64() * 1e6);
    }
    Ok((median(samples.split_off(1)), setup))
}
