//! The protocol library (Thekkath et al., "Implementing Network Protocols at User
//! Level"): sans-IO protocol cores in the style of smoltcp and quinn-proto. Nothing
//! here does I/O or reads a clock; the caller passes frames and the current [`Time`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod frag;
pub mod reasm;
pub mod time;
pub mod timer;

pub use frag::{fragment, FragError};
pub use reasm::{DropCause, ReasmConfig, ReasmStats, Reassembler};
pub use time::Time;
pub use timer::{TimerId, TimerWheel};
