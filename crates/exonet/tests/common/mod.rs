//! Shared by the tests that run the binary's processes.

// Each test binary uses only some of these helpers.
#[allow(dead_code)]
pub mod daemons;
#[allow(dead_code)]
pub mod netns;

use std::time::{Duration, Instant};

/// Waits, bounded in time, until `f` holds; `what` names it when it never does.
pub fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Bytes that do not compress, different per seed: test files to send.
#[allow(dead_code)]
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = exonet_wire::rng::SplitMix64::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}
