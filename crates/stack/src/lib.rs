//! tmp
#![forbid(unsafe_code)]
#![warn(missing_docs)]
pub mod time;
pub mod timer;
pub use time::Time;
pub use timer::{TimerId, TimerWheel};
