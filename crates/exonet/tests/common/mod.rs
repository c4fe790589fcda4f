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
