//! What the `exonet` binary shares with the tests that drive it.

pub mod hosts;
