//! WebAssembly handlers (ASH §2-3): code an application installs on one of its
//! channels, which the multiplexer runs on every frame the channel's filter
//! accepts, before delivery.
//!
//! A handler is a WebAssembly module, validated and compiled once (wasmtime,
//! Cranelift) at [`Handler::install`]. It sees only the frame (read-only,
//! through imports), its own private state (its linear memory and globals,
//! kept across invocations) and a [`Window`] of the application's segment,
//! into which it moves message data ("message vectoring", through a pipe list
//! or a plain copy) and whose data structures it may update. It may initiate
//! messages (the [`Outbox`]), which the multiplexer checks against the
//! channel's transmit template. Fuel bounds each invocation (the paper's
//! instruction budget, §3.3); a trap, misuse of an import or running out of
//! fuel aborts it, and the frame is then delivered as if no handler were
//! installed.
//!
//! Protocol layers below the handler (§2.3, [`Below`]): with
//! [`Below::Udp`] the multiplexer's trusted Ethernet, IPv4 and UDP layers
//! check the headers, the handler's message is the UDP payload (other
//! frames are delivered without running it, corrupt ones dropped), each of
//! its pipe lists runs with the UDP checksum pipe in front, so the payload
//! is checksummed in the loop that moves it, and a datagram whose checksum
//! fails is dropped with the handler's sends ([`Outcome::Dropped`]).
//!
//! # ABI (also in `include/exonet_ash.h`)
//!
//! - Entry: the exported function `ash_handle(i32 frame_len) -> i32`. It returns
//!   0 (`ASH_CONSUMED`: the frame is not delivered) or 1 (`ASH_DELIVER`:
//!   delivered as usual); anything else is an abort ([`Abort::BadVerdict`]).
//!   On any abort the frame is delivered untouched and the invocation's sends
//!   are discarded; window writes already made stay (§3.2: undoing them is the
//!   handler's concern).
//! - Memory: at most one, defined by the module (an imported memory or table is
//!   refused), at most [`HandlerConfig::memory_max`] bytes: a larger initial
//!   size is refused at install, `memory.grow` past it returns -1. Imports that
//!   take pointers need it exported as `memory`. If the module exports a
//!   mutable i32 global `__stack_pointer` (C: link with
//!   `-Wl,--export=__stack_pointer`), an abort resets it to its value after
//!   install, as unwinding would. A start function runs at install, under the
//!   fuel budget.
//! - Fuel: [`HandlerConfig::fuel`] per invocation; one unit per instruction
//!   (control flow free), bulk memory operations one per byte, imports that
//!   move bytes 8 plus one per 8 bytes (`reply_udp` also for the checksum
//!   pass), `consume_window` through a pipe list 8 plus the transfer's
//!   [`Transfer::cost`](crate::Transfer::cost).
//! - Features: WebAssembly 1.0 with mutable globals, sign extension,
//!   multi-value and bulk memory; no floating point (refused at install, as
//!   in §3.3), SIMD, threads, reference types, GC, tail calls, exceptions,
//!   memory64 or multiple memories.
//! - Imports, module `exonet`; all i32 unless noted; pointers are offsets in the
//!   handler's memory; window offsets are unsigned; the cursor starts at 0:
//!   - `msg_len() -> i32`
//!   - `peek(dst, msg_off, n) -> i32`: copy frame bytes `[msg_off, msg_off+n)`
//!     to `dst`; n, or -1 if the frame is shorter (nothing copied).
//!   - `consume(dst, n) -> i32`: copy the next n bytes at the cursor and
//!     advance; n, or -1 if short (cursor unchanged).
//!   - `skip(n) -> i32` (n or -1), `cursor() -> i32`, `seek(off) -> i32` (off, or
//!     -1 beyond the frame).
//!   - `consume_window(win_off, n, pipe_list) -> i32`: move the next n bytes
//!     into the window at `win_off` through transfer `pipe_list` (-1 =
//!     `NULL_PIPE`, a plain copy) and advance; n, or -1 if the frame is short.
//!   - `window_len() -> i32`; `window_read(dst, win_off, n)`;
//!     `window_write(win_off, src, n)`; `window_load32(win_off) -> i32`;
//!     `window_store32(win_off, v)`; `window_load64(win_off) -> i64`;
//!     `window_store64(win_off, v: i64)` (little-endian, any alignment).
//!   - `pipe_reg(pl, pipe, reg) -> i64`, `pipe_set_reg(pl, pipe, reg, v: i64)`:
//!     a transfer's persistent registers.
//!   - `send(ptr, len) -> i32`: queue a whole Ethernet frame; 0, or -1 if the
//!     outbox is full or `len` is out of range (under 14 or over
//!     [`HandlerConfig::max_send_len`]).
//!   - `reply_udp(ptr, len) -> i32`: if the frame is Ethernet/IPv4/UDP, queue a
//!     reply carrying `len` payload bytes: MACs, addresses and ports swapped,
//!     VLAN tags kept, fresh IPv4 header (TTL 64, DF), both checksums; 0, or -1
//!     if the frame is not UDP or the reply does not fit.
//!   - `abort()`: abort the invocation ([`Abort::Requested`]); never returns.
//!
//!   Misuse aborts the invocation ([`Abort::Trap`]): a negative length or frame
//!   offset, a range outside the handler's memory or the window, no window,
//!   an unknown pipe list or register.
//!
//! ```
//! use exonet_ash::handler::{Engine, Handler, HandlerConfig, Outbox, Outcome};
//!
//! let engine = Engine::new()?;
//! let wat = r#"(module (func (export "ash_handle") (param i32) (result i32)
//!                 (i32.lt_u (local.get 0) (i32.const 64))))"#;
//! let mut h = Handler::install(&engine, wat.as_bytes(), vec![], None, HandlerConfig::default())?;
//! let mut out = Outbox::new(4, 9018);
//! assert!(matches!(h.run(&[0; 60], &mut out).outcome, Outcome::Deliver));
//! assert!(matches!(h.run(&[0; 100], &mut out).outcome, Outcome::Consumed));
//! # Ok::<(), exonet_ash::handler::InstallError>(())
//! ```

mod below;
pub mod examples;
mod host;
mod outbox;
mod udp;
mod window;

use std::fmt;
use std::sync::Arc;

use wasmtime::{
    Config, ExternType, Global, Linker, Module, Mutability, OptLevel, Store, Trap, TypedFunc, Val,
    ValType, WasmFeatures,
};

use crate::layer::Disposition;
pub use below::{transfer_for, Below};
use host::{Frame, Host, HostAbort, Ty, IMPORTS, MAX_TABLE_ELEMENTS, MODULE};
pub use outbox::Outbox;
pub use window::Window;

/// The entry point's export name.
pub const ENTRY: &str = "ash_handle";

/// Verdict: the handler consumed the frame.
pub const ASH_CONSUMED: i32 = 0;

/// Verdict: deliver the frame to the application.
pub const ASH_DELIVER: i32 = 1;

/// `consume_window`'s pipe list for a plain copy.
pub const NULL_PIPE: i32 = -1;

/// Largest module accepted, in bytes (binary or text).
pub const MAX_MODULE_LEN: usize = 4 << 20;

/// WebAssembly stack a handler may use; deeper recursion traps.
pub const MAX_WASM_STACK: usize = 256 << 10;

const WASM_PAGE: u64 = 64 << 10;

/// The proposals a handler may use (see the module docs).
fn allowed_features() -> WasmFeatures {
    WasmFeatures::MUTABLE_GLOBAL
        | WasmFeatures::SIGN_EXTENSION
        | WasmFeatures::MULTI_VALUE
        | WasmFeatures::BULK_MEMORY
        // The LEB encoding of call_indirect's table index that newer clang
        // emits: an encoding, not a capability.
        | WasmFeatures::CALL_INDIRECT_OVERLONG
}

/// A WebAssembly engine configured for handlers: compiled by Cranelift for
/// speed, fuel metered, bounded stack, only the features handlers need. One
/// per multiplexer; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    engine: wasmtime::Engine,
    linker: Arc<Linker<Host>>,
}

impl Engine {
    /// The engine, with the handler imports defined once.
    pub fn new() -> Result<Engine, InstallError> {
        let mut c = Config::new();
        c.consume_fuel(true)
            .cranelift_opt_level(OptLevel::Speed)
            .max_wasm_stack(MAX_WASM_STACK)
            // Aborts are answered by delivering the frame: no one reads a
            // backtrace, and capturing one would slow every trap.
            .wasm_backtrace_max_frames(None)
            .wasm_features(WasmFeatures::all(), false)
            .wasm_features(allowed_features(), true);
        let engine = wasmtime::Engine::new(&c).map_err(|e| InstallError::Engine(one_line(&e)))?;
        let linker = host::linker(&engine).map_err(|e| InstallError::Engine(one_line(&e)))?;
        Ok(Engine {
            engine,
            linker: Arc::new(linker),
        })
    }
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

/// Per-handler limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandlerConfig {
    /// Fuel per invocation (about one unit per WebAssembly instruction, plus
    /// what imports charge for the bytes they move).
    pub fuel: u64,
    /// Bytes of private linear memory.
    pub memory_max: usize,
    /// Frames one invocation may send.
    pub max_sends: usize,
    /// Longest frame a handler may send.
    pub max_send_len: usize,
    /// The trusted protocol layers below the handler; its pipe lists must
    /// have been compiled for them ([`transfer_for`]).
    pub below: Below,
}

impl Default for HandlerConfig {
    /// Fuel for copying and checksumming a 9000-byte frame a dozen times
    /// over (§3.3 sizes the budget for 4 KB messages copied, decrypted and
    /// checksummed), 1 MiB of memory, 4 sends of up to a jumbo frame (9000
    /// bytes of payload, 14 of Ethernet header, 4 of VLAN tag).
    fn default() -> Self {
        HandlerConfig {
            fuel: 1_000_000,
            memory_max: 1 << 20,
            max_sends: 4,
            max_send_len: 9018,
            below: Below::Nothing,
        }
    }
}

/// What one invocation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The verdict.
    pub outcome: Outcome,
    /// Fuel consumed.
    pub fuel: u64,
}

/// A handler's verdict on a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Consumed: the frame is not delivered; the sends stand.
    Consumed,
    /// Deliver the frame to the application as usual; the sends stand.
    Deliver,
    /// Not delivered, and counted as a drop: a layer below the handler
    /// refused the message (a bad UDP checksum or a corrupt header, see
    /// [`Below`]; in a [`crate::layer::Composition`], its `Drop`). The
    /// sends were discarded.
    Dropped,
    /// Aborted: deliver the frame untouched; the sends were discarded.
    Aborted(Abort),
}

/// Why an invocation (or a start function) was aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Abort {
    /// The handler called `abort()`.
    Requested,
    /// The fuel budget ran out.
    OutOfFuel,
    /// A trap: out of bounds access, unreachable, division by zero, stack
    /// overflow, misuse of an import...
    Trap(String),
    /// `ash_handle` returned neither `ASH_CONSUMED` nor `ASH_DELIVER`.
    BadVerdict(i32),
}

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Abort::Requested => f.write_str("the handler called abort()"),
            Abort::OutOfFuel => f.write_str("out of fuel"),
            Abort::Trap(m) => f.write_str(m),
            Abort::BadVerdict(v) => write!(
                f,
                "verdict {v} is neither ASH_CONSUMED ({ASH_CONSUMED}) nor ASH_DELIVER ({ASH_DELIVER})"
            ),
        }
    }
}

impl Abort {
    fn of(e: &wasmtime::Error) -> Abort {
        if let Some(h) = e.downcast_ref::<HostAbort>() {
            return match h {
                HostAbort::Requested => Abort::Requested,
                HostAbort::OutOfFuel => Abort::OutOfFuel,
                HostAbort::Misuse(m) => Abort::Trap(m.clone()),
            };
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => Abort::OutOfFuel,
            Some(t) => Abort::Trap(t.to_string()),
            None => Abort::Trap(one_line(e)),
        }
    }
}

/// Why a handler was not installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallError {
    /// The WebAssembly engine could not be configured.
    Engine(String),
    /// The module is over [`MAX_MODULE_LEN`].
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// Not a valid module (or uses a refused feature).
    Malformed(String),
    /// An import the runtime does not provide.
    UnknownImport {
        /// Module name.
        module: String,
        /// Field name.
        name: String,
    },
    /// An `exonet` import declared with the wrong type.
    ImportType {
        /// The import.
        name: String,
        /// Its type in the ABI.
        expected: String,
        /// Its type in the module.
        found: String,
    },
    /// The module imports a memory (a handler defines its own).
    ImportedMemory,
    /// The module imports a table.
    ImportedTable,
    /// No exported `ash_handle`.
    MissingEntry,
    /// `ash_handle` is not a function `(i32) -> i32`.
    EntryType(String),
    /// The initial memory is over [`HandlerConfig::memory_max`].
    MemoryOverLimit {
        /// Bytes requested.
        bytes: u64,
        /// The limit.
        limit: usize,
    },
    /// The initial table is over the runtime's limit.
    TableOverLimit {
        /// Elements requested.
        elements: u64,
    },
    /// The start function (or data initialisation) aborted.
    Start(Abort),
    /// Instantiation failed otherwise.
    Instantiate(String),
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallError::Engine(m) => write!(f, "cannot configure the WebAssembly engine: {m}"),
            InstallError::TooLarge { len } => write!(
                f,
                "module too large: {len} bytes, over the {MAX_MODULE_LEN}-byte limit"
            ),
            InstallError::Malformed(m) => write!(f, "malformed module: {m}"),
            InstallError::UnknownImport { module, name } => {
                write!(f, "unknown import `{module}::{name}`")
            }
            InstallError::ImportType {
                name,
                expected,
                found,
            } => write!(
                f,
                "import `{MODULE}::{name}` has type {found}, expected {expected}"
            ),
            InstallError::ImportedMemory => {
                f.write_str("imported memory refused: a handler defines its own memory")
            }
            InstallError::ImportedTable => f.write_str("imported table refused"),
            InstallError::MissingEntry => write!(f, "missing entry point: no exported `{ENTRY}`"),
            InstallError::EntryType(t) => {
                write!(
                    f,
                    "entry point `{ENTRY}` is {t}, expected a function (i32) -> i32"
                )
            }
            InstallError::MemoryOverLimit { bytes, limit } => write!(
                f,
                "memory over the limit: {bytes} bytes initially, limit {limit}"
            ),
            InstallError::TableOverLimit { elements } => write!(
                f,
                "table over the limit: {elements} elements initially, limit {MAX_TABLE_ELEMENTS}"
            ),
            InstallError::Start(a) => write!(f, "start function aborted: {a}"),
            InstallError::Instantiate(m) => write!(f, "instantiation failed: {m}"),
        }
    }
}

impl std::error::Error for InstallError {}

/// A wasmtime error with its causes, on one line (WAT parse errors span
/// several, pointing at the source).
fn one_line(e: &wasmtime::Error) -> String {
    format!("{e:#}")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn ty_name(t: Ty) -> &'static str {
    match t {
        Ty::I32 => "i32",
        Ty::I64 => "i64",
    }
}

fn is(v: &ValType, t: Ty) -> bool {
    matches!((v, t), (ValType::I32, Ty::I32) | (ValType::I64, Ty::I64))
}

fn same(found: impl ExactSizeIterator<Item = ValType>, expected: &[Ty]) -> bool {
    found.len() == expected.len() && found.zip(expected).all(|(v, &t)| is(&v, t))
}

fn signature(params: &[String], results: &[String]) -> String {
    format!("({}) -> ({})", params.join(", "), results.join(", "))
}

fn func_signature(ft: &wasmtime::FuncType) -> String {
    let names =
        |it: &mut dyn Iterator<Item = ValType>| it.map(|v| v.to_string()).collect::<Vec<_>>();
    signature(&names(&mut ft.params()), &names(&mut ft.results()))
}

fn check_imports(module: &Module) -> Result<(), InstallError> {
    for import in module.imports() {
        let unknown = || InstallError::UnknownImport {
            module: import.module().to_string(),
            name: import.name().to_string(),
        };
        let ft = match import.ty() {
            ExternType::Memory(_) => return Err(InstallError::ImportedMemory),
            ExternType::Table(_) => return Err(InstallError::ImportedTable),
            ExternType::Func(ft) => ft,
            _ => return Err(unknown()),
        };
        let Some((name, params, results)) = IMPORTS
            .iter()
            .find(|(name, ..)| import.module() == MODULE && *name == import.name())
        else {
            return Err(unknown());
        };
        if !same(ft.params(), params) || !same(ft.results(), results) {
            let names = |ts: &[Ty]| {
                ts.iter()
                    .map(|&t| ty_name(t).to_string())
                    .collect::<Vec<_>>()
            };
            return Err(InstallError::ImportType {
                name: name.to_string(),
                expected: signature(&names(params), &names(results)),
                found: func_signature(&ft),
            });
        }
    }
    Ok(())
}

fn check_entry(module: &Module) -> Result<(), InstallError> {
    match module.get_export(ENTRY) {
        None => Err(InstallError::MissingEntry),
        Some(ExternType::Func(ft))
            if same(ft.params(), &[Ty::I32]) && same(ft.results(), &[Ty::I32]) =>
        {
            Ok(())
        }
        Some(ExternType::Func(ft)) => Err(InstallError::EntryType(format!(
            "a function {}",
            func_signature(&ft)
        ))),
        Some(_) => Err(InstallError::EntryType("not a function".into())),
    }
}

fn check_resources(module: &Module, config: &HandlerConfig) -> Result<(), InstallError> {
    let need = module.resources_required();
    if let Some(pages) = need.max_initial_memory_size {
        let bytes = pages.saturating_mul(WASM_PAGE);
        if bytes > config.memory_max as u64 {
            return Err(InstallError::MemoryOverLimit {
                bytes,
                limit: config.memory_max,
            });
        }
    }
    match need.max_initial_table_size {
        Some(elements) if elements > MAX_TABLE_ELEMENTS as u64 => {
            Err(InstallError::TableOverLimit { elements })
        }
        _ => Ok(()),
    }
}

/// An installed handler: its compiled code, private state, transfers and
/// window. Kept by the multiplexer in its channel table.
pub struct Handler {
    store: Store<Host>,
    entry: TypedFunc<i32, i32>,
    /// The exported shadow stack pointer and its value after install.
    stack_pointer: Option<(Global, i32)>,
    fuel: u64,
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = self.store.data();
        f.debug_struct("Handler")
            .field("fuel", &self.fuel)
            .field("window", &host.window)
            .field("transfers", &host.transfers.len())
            .field("memory_max", &host.memory_max)
            .finish_non_exhaustive()
    }
}

impl Handler {
    /// Validates and compiles `wasm` (binary or text), links it against the
    /// imports and runs its start function. `transfers` are the compiled pipe
    /// lists `consume_window` may name (by index); `window` the part of the
    /// application's segment the handler may use.
    pub fn install(
        engine: &Engine,
        wasm: &[u8],
        transfers: Vec<Box<dyn crate::Transfer>>,
        window: Option<Window>,
        config: HandlerConfig,
    ) -> Result<Handler, InstallError> {
        if wasm.len() > MAX_MODULE_LEN {
            return Err(InstallError::TooLarge { len: wasm.len() });
        }
        let module =
            Module::new(&engine.engine, wasm).map_err(|e| InstallError::Malformed(one_line(&e)))?;
        check_imports(&module)?;
        check_entry(&module)?;
        check_resources(&module, &config)?;
        let udp = match config.below {
            Below::Nothing => None,
            Below::Udp => {
                Some(below::UdpAccount::new().map_err(|e| InstallError::Engine(e.to_string()))?)
            }
        };
        let host = Host {
            frame: Frame::EMPTY,
            whole: Frame::EMPTY,
            udp,
            cursor: 0,
            window,
            transfers,
            outbox: Outbox::default(),
            sends_left: 0,
            max_sends: config.max_sends,
            max_send_len: config.max_send_len,
            memory: None,
            memory_max: config.memory_max,
        };
        let mut store = Store::new(&engine.engine, host);
        store.limiter(|h| h);
        store
            .set_fuel(config.fuel)
            .map_err(|e| InstallError::Engine(one_line(&e)))?;
        let instance = engine
            .linker
            .instantiate(&mut store, &module)
            .map_err(|e| {
                if e.is::<Trap>() || e.is::<HostAbort>() {
                    InstallError::Start(Abort::of(&e))
                } else {
                    InstallError::Instantiate(one_line(&e))
                }
            })?;
        let memory = instance.get_memory(&mut store, "memory");
        store.data_mut().memory = memory;
        let entry = instance
            .get_typed_func::<i32, i32>(&mut store, ENTRY)
            .map_err(|e| InstallError::EntryType(one_line(&e)))?;
        let stack_pointer = instance
            .get_global(&mut store, "__stack_pointer")
            .filter(|g| g.ty(&store).mutability() == Mutability::Var)
            .and_then(|g| g.get(&mut store).i32().map(|top| (g, top)));
        Ok(Handler {
            store,
            entry,
            stack_pointer,
            fuel: config.fuel,
        })
    }

    /// Runs the handler on `frame`. Frames it sends are appended to `out`
    /// (which the caller clears); they stand only if the outcome is
    /// [`Outcome::Consumed`] or [`Outcome::Deliver`]: an abort removes them.
    /// The fuel reported is what the invocation consumed (all of the budget
    /// if it ran out). WebAssembly runs on the calling thread's stack, which
    /// needs [`MAX_WASM_STACK`] free beyond the caller's own use.
    pub fn run(&mut self, frame: &[u8], out: &mut Outbox) -> Run {
        let Ok(_) = i32::try_from(frame.len()) else {
            return Run {
                outcome: Outcome::Aborted(Abort::Trap("frame longer than 2^31 bytes".into())),
                fuel: 0,
            };
        };
        let host = self.store.data_mut();
        // The message: the whole frame, or what the layers below pass up.
        let message = match host.udp.as_mut().map(|u| u.start(frame)) {
            None => frame,
            Some(below::Datagram::Payload(r)) => &frame[r],
            Some(below::Datagram::Refused(d)) => {
                let outcome = match d {
                    Disposition::Deliver => Outcome::Deliver,
                    Disposition::Drop => Outcome::Dropped,
                };
                return Run { outcome, fuel: 0 };
            }
        };
        let len = message.len() as i32;
        // SAFETY: `frame` (and `message` in it) stays borrowed for this whole
        // call, and the host's frames are reset to EMPTY below, before the
        // borrow ends.
        host.frame = unsafe { Frame::new(message) };
        // SAFETY: as above.
        host.whole = unsafe { Frame::new(frame) };
        host.cursor = 0;
        host.sends_left = host.max_sends;
        // The caller's outbox becomes the host's for the invocation: no
        // pointer to it is kept, nothing is allocated.
        std::mem::swap(&mut host.outbox, out);
        let kept = host.outbox.len();
        let result = self
            .store
            .set_fuel(self.fuel)
            .and_then(|()| self.entry.call(&mut self.store, len));
        let left = self.store.get_fuel().unwrap_or(0);
        let mut outcome = match result {
            Ok(ASH_CONSUMED) => Outcome::Consumed,
            Ok(ASH_DELIVER) => Outcome::Deliver,
            Ok(v) => Outcome::Aborted(Abort::BadVerdict(v)),
            Err(e) => Outcome::Aborted(Abort::of(&e)),
        };
        if matches!(outcome, Outcome::Aborted(_)) {
            self.unwind();
            self.store.data_mut().outbox.truncate(kept);
        } else if let Some(u) = self.store.data_mut().udp.as_mut() {
            // UDP's commit, after the handler's body: a bad checksum drops
            // the datagram and what the handler sent.
            if !u.verify(message) {
                outcome = Outcome::Dropped;
                self.store.data_mut().outbox.truncate(kept);
            }
        }
        let host = self.store.data_mut();
        host.frame = Frame::EMPTY;
        host.whole = Frame::EMPTY;
        std::mem::swap(&mut host.outbox, out);
        Run {
            outcome,
            fuel: self.fuel.saturating_sub(left),
        }
    }

    /// Resets the shadow stack an abort left mid-frame.
    fn unwind(&mut self) {
        if let Some((sp, top)) = self.stack_pointer {
            // Cannot fail: install checked it is a mutable i32 global of
            // this store.
            let _ = sp.set(&mut self.store, Val::I32(top));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The import table the install checks use matches the linker: a module
    /// importing everything, with the table's types, links.
    #[test]
    fn every_import_links_with_its_declared_type() {
        let imports: String = IMPORTS
            .iter()
            .map(|(name, params, results)| {
                let list = |ts: &[Ty]| ts.iter().map(|&t| ty_name(t)).collect::<Vec<_>>().join(" ");
                format!(
                    r#"(import "{MODULE}" "{name}" (func (param {}) (result {})))"#,
                    list(params),
                    list(results)
                )
            })
            .collect();
        let wat = format!(
            r#"(module {imports} (func (export "{ENTRY}") (param i32) (result i32) (i32.const 1)))"#
        );
        let engine = Engine::new().expect("engine");
        let h = Handler::install(
            &engine,
            wat.as_bytes(),
            vec![],
            None,
            HandlerConfig::default(),
        );
        assert!(h.is_ok(), "{:?}", h.err());
    }
}
