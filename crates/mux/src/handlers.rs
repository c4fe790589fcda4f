//! Handlers (ASH) on channels: what runs in the multiplexer when a frame
//! arrives on its channel, before delivery (Wallach et al., DESIGN.md
//! "Handlers").
//!
//! An application installs a WebAssembly module on one of its channels
//! ([`Mux::install_handler`](crate::Mux::install_handler)); it is validated
//! and compiled once, with the pipe lists it brings, and runs on every frame
//! the channel's filter accepts. Its window, if it has one, is a range of the
//! endpoint's own frame area. What it sends is checked against the channel's
//! transmit template like anything the application sends. Fuel bounds each
//! invocation, and a budget per period bounds an endpoint's handlers
//! together: past it, frames are delivered without their handler until the
//! next period. Every abort delivers the frame untouched and is counted.

use std::time::{Duration, Instant};

use exonet_ash::handler::{self, Engine, HandlerConfig, Outbox, Outcome, Run, Window};
use exonet_ash::layer::{Composition, Verdict};
use exonet_ash::Transfer;
use exonet_shm::control::HandlerSpec;
use exonet_shm::Frames;

use crate::HandlerVerdict;

/// Runs in the multiplexer on each frame of its channel, before delivery.
/// Frames it puts in `out` are sent (after the channel's template check)
/// unless it aborts.
pub trait Handler: Send {
    fn on_frame(&mut self, frame: &[u8], out: &mut Outbox) -> Run;
}

/// A WebAssembly handler (ASH), with the segment its window is in: the
/// mapping lives as long as the handler.
pub(crate) struct Downloaded {
    ash: handler::Handler,
    _frames: Option<Frames>,
}

impl Handler for Downloaded {
    fn on_frame(&mut self, frame: &[u8], out: &mut Outbox) -> Run {
        self.ash.run(frame, out)
    }
}

/// Protocol layers composed at run time (§2.3) into one handler whose data
/// manipulations are one loop: trusted code, installed in process
/// ([`Mux::set_handler`](crate::Mux::set_handler)). A refusing layer's
/// `Drop` drops the frame (counted); its `Deliver` delivers it untouched.
impl Handler for Composition {
    fn on_frame(&mut self, frame: &[u8], _out: &mut Outbox) -> Run {
        let outcome = match self.run(frame) {
            Verdict::Consumed => Outcome::Consumed,
            Verdict::Deliver => Outcome::Deliver,
            Verdict::Drop => Outcome::Dropped,
        };
        Run { outcome, fuel: 0 }
    }
}

/// A handler compiled into the multiplexer (trusted code: tests, and the
/// native baseline of `exonet bench ash`).
impl<F: FnMut(&[u8]) -> HandlerVerdict + Send> Handler for F {
    fn on_frame(&mut self, frame: &[u8], _out: &mut Outbox) -> Run {
        let outcome = match self(frame) {
            HandlerVerdict::Consumed => Outcome::Consumed,
            HandlerVerdict::Deliver => Outcome::Deliver,
        };
        Run { outcome, fuel: 0 }
    }
}

/// Limits on handlers.
#[derive(Clone, Copy, Debug)]
pub struct HandlerLimits {
    /// Fuel per invocation: the default, and the most an install may ask.
    pub fuel: u64,
    /// Fuel all of one endpoint's handlers may use per `period`.
    pub budget: u64,
    pub period: Duration,
    /// Bytes of private memory one handler may have.
    pub memory: usize,
    /// Frames one invocation may send.
    pub sends: usize,
}

impl Default for HandlerLimits {
    fn default() -> Self {
        HandlerLimits {
            fuel: 1_000_000,
            budget: 200_000_000,
            period: Duration::from_millis(10),
            memory: 1 << 20,
            sends: 4,
        }
    }
}

/// An endpoint's handler fuel in the current period.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Budget {
    start: Option<Instant>,
    used: u64,
}

impl Budget {
    /// Whether a handler may run at `now`.
    pub fn allows(&mut self, now: Instant, limits: &HandlerLimits) -> bool {
        match self.start {
            Some(s) if now.saturating_duration_since(s) < limits.period => {}
            _ => {
                self.start = Some(now);
                self.used = 0;
            }
        }
        self.used < limits.budget
    }

    pub fn charge(&mut self, fuel: u64) {
        self.used = self.used.saturating_add(fuel);
    }
}

/// Validates and compiles an application's handler: its pipe lists, its
/// window (inside `frames`, the endpoint's frame area) and its module.
pub(crate) fn download(
    engine: &Engine,
    spec: &HandlerSpec,
    module: &[u8],
    frames: &Frames,
    limits: &HandlerLimits,
    max_send_len: usize,
) -> Result<Downloaded, String> {
    let mut transfers: Vec<Box<dyn Transfer>> = Vec::with_capacity(spec.pipe_lists.len());
    for (i, bytes) in spec.pipe_lists.iter().enumerate() {
        let list =
            exonet_ash::pipe::PipeList::decode(bytes).map_err(|e| format!("pipe list {i}: {e}"))?;
        let compiled = list.compile().map_err(|e| format!("pipe list {i}: {e}"))?;
        transfers.push(Box::new(compiled));
    }
    let window = match spec.window {
        None => None,
        Some((offset, len)) => {
            let p = frames.area_ptr(offset, len).map_err(|_| {
                format!(
                    "the window ({len} bytes at {offset}) is not inside the endpoint's frame area"
                )
            })?;
            // SAFETY: the range is inside the segment's mapping, which
            // `Downloaded` keeps alive (its `Frames`) as long as the handler.
            Some(unsafe { Window::new(p.as_ptr(), len as usize) })
        }
    };
    let fuel = match spec.fuel {
        0 => limits.fuel,
        f => f.min(limits.fuel),
    };
    let config = HandlerConfig {
        fuel,
        memory_max: limits.memory,
        max_sends: limits.sends,
        max_send_len,
    };
    let ash = handler::Handler::install(engine, module, transfers, window, config)
        .map_err(|e| e.to_string())?;
    Ok(Downloaded {
        ash,
        _frames: spec.window.map(|_| frames.clone()),
    })
}
