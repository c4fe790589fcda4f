//! exonet-ash: application-specific safe handlers (Wallach, Engler,
//! Kaashoek: "ASHs: Application-Specific Handlers for High-Performance
//! Messaging").
//!
//! - [`pipe`]: dynamic ILP. Pipes are small computations on streaming data
//!   in a register language; a pipe list composes any of them at run time
//!   and compiles (Cranelift) into one data-copying loop (§2.2).
//! - [`layer`]: protocol composition (§2.3): layers with body, commit and
//!   abort, composed at run time into one handler.
//! - [`handler`]: WebAssembly handlers run by the multiplexer on message
//!   arrival, bounded by fuel and sandboxed by wasmtime (§3).

pub mod handler;
pub mod layer;
pub mod pipe;

/// A compiled data transfer: what a handler's `consume` runs to move
/// message bytes into the application's window (a [`pipe::PipeList`]
/// compiled into one loop, or a plain copy).
pub trait Transfer: Send {
    /// Copies `src` into `dst` (the same length) through the pipes,
    /// updating their persistent registers.
    fn transfer(&mut self, src: &[u8], dst: &mut [u8]);
    /// A persistent register of one of the list's pipes (the paper's
    /// import), `None` if there is no such register.
    fn reg(&self, pipe: usize, reg: usize) -> Option<u64>;
    /// Sets a persistent register (the paper's export); false if there is
    /// no such register.
    fn set_reg(&mut self, pipe: usize, reg: usize, value: u64) -> bool;
    /// What transferring `n` bytes costs in fuel, charged to the handler
    /// (§3.3: the pipes' static cost times the iterations).
    fn cost(&self, n: usize) -> u64;
    /// For a transfer with the UDP checksum below it
    /// ([`handler::Below::Udp`]): the checksum accumulator of what it moved
    /// since last asked, reset to 0. `None` for any other.
    fn take_checksum(&mut self) -> Option<u64> {
        None
    }
}
