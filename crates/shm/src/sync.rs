//! The atomics the shared structures are made of: `std`'s in normal builds,
//! loom's under `--cfg loom`, so the ring and wake-up protocols are
//! model-checked exactly as they are written.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64};

pub(crate) use std::sync::atomic::Ordering;
