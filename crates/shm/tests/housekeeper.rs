//! The multiplexer's side of a segment, faulted in and given back by the
//! housekeeper thread.
//! Alone in its binary: it counts the process's descriptors, which tests
//! running beside it would move.
#![cfg(not(loom))]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use exonet_shm::*;

/// Descriptors open in this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The multiplexer's side of a segment is faulted in and given back by a
/// thread of its own: what the application wrote is there, and once the
/// mappings are dropped their memfds are closed (no descriptor is left).
#[test]
fn opened_segments_are_populated_and_given_back_elsewhere() {
    let config = SegmentConfig {
        frame_size: 2048,
        frame_count: 512,
        ring_entries: [64, 64, 64, 64],
    };
    let before = open_fds();
    for round in 0..20u8 {
        let seg = Segment::create(&config).unwrap();
        let file = File::from(seg.fd().try_clone_to_owned().unwrap());
        let last = seg.layout().segment_size() - 1;
        file.write_all_at(&[round + 1], last).unwrap();
        let peer = Segment::open(seg.fd().try_clone_to_owned().unwrap()).unwrap();
        peer.populate_elsewhere();
        drop(seg);
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, last).unwrap();
        assert_eq!(byte[0], round + 1);
        drop(file);
        drop(peer);
    }
    // The housekeeper closes them in its own time: bounded wait.
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_fds() > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        open_fds() <= before,
        "{} descriptors left",
        open_fds() - before
    );
}
