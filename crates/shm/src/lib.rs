//! exonet-shm: the endpoint as shared memory.
//!
//! An endpoint (U-Net §3; AF_XDP's socket with its UMEM) is a
//! *communication segment* both sides map: a sealed memfd holding a
//! versioned header page, four single-producer single-consumer descriptor
//! rings, and fixed-size frame buffers.
//!
//! | U-Net            | exonet          | AF_XDP     | producer → consumer |
//! |------------------|-----------------|------------|---------------------|
//! | free queue       | free ring       | fill       | application → multiplexer |
//! | receive queue    | rx ring         | rx         | multiplexer → application |
//! | send queue       | tx ring         | tx         | application → multiplexer |
//! | "sent" flag      | completion ring | completion | multiplexer → application |
//!
//! The multiplexer is trusted, the application is not, and neither believes
//! anything the other wrote into shared memory: layouts are validated once
//! and kept privately, ring indices are checked against the ring size,
//! descriptors are copied out and validated ([`Layout::validate_frame`],
//! [`Layout::validate_buffer`]). Each side publishes in the header whether
//! it sleeps ([`WakeWord`]), so the other rings its doorbell only then.
//! Frames of up to [`INLINE_MAX`] bytes travel inside the rx and tx rings.
//! A transmit frame may be gathered from up to [`MAX_PARTS`] descriptors
//! ([`Desc::MORE`], AF_XDP's multi-buffer frames): a header, inline or in a
//! buffer, and payload anywhere in the frame area, published together with
//! [`Producer::push_chain`].
//!
//! The layout is written down in C in `include/exonet_endpoint.h`.

// Under `--cfg loom` only the ring and wake-up core is built, and only its
// model-checking tests use it.
#![cfg_attr(all(loom, not(test)), allow(dead_code))]

mod desc;
mod idmap;
mod ring;
mod sync;
mod wake;

pub use desc::{Desc, DescError, INLINE_MAX, MAX_PARTS};
pub use idmap::{IdHasher, IdMap};
pub use ring::{Consumer, Part, Producer, RingError};
pub use wake::WakeWord;

#[cfg(not(loom))]
pub mod bench;
#[cfg(not(loom))]
mod event;
#[cfg(not(loom))]
mod layout;
#[cfg(not(loom))]
mod segment;

#[cfg(not(loom))]
pub mod control;

#[cfg(not(loom))]
pub use event::{Doorbell, Doorbells, Notifier, Ring, Sleeper, Wakeup, SLEEP_SLICE};
#[cfg(not(loom))]
pub use layout::{
    ConfigError, IndexLine, Layout, RingHead, RingId, RingInfo, SegmentConfig, SegmentError,
    SegmentHeader, HEADER_SIZE, RING_DESCS_OFFSET, SEGMENT_MAGIC, SEGMENT_VERSION,
};
#[cfg(not(loom))]
pub use segment::{blob_memfd, read_blob, AppEndpoint, Frames, MuxEndpoint, Segment};

#[cfg(all(test, loom))]
mod loom_tests;
