//! The handler's imports (module `exonet`) and the host state they act on.
//!
//! Every import checks its arguments: a pointer or window range outside its
//! memory, a negative length, an unknown pipe list or register is misuse and
//! aborts the invocation (a trap), never touches the host; a frame too short
//! for the request is an ordinary answer (-1). Imports that move bytes charge
//! fuel for them, so a handler cannot do unbounded work through the host.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};

use wasmtime::{Caller, Linker, Memory, ResourceLimiter};

use super::below::UdpAccount;
use super::outbox::Outbox;
use super::udp::Datagram;
use super::window::Window;
use super::NULL_PIPE;
use crate::Transfer;

/// The module handlers import from.
pub(crate) const MODULE: &str = "exonet";

/// Value types in import signatures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    I32,
    I64,
}

use Ty::{I32, I64};

/// Every import: name, parameters, results (the ABI in `exonet_ash.h`).
pub(crate) const IMPORTS: &[(&str, &[Ty], &[Ty])] = &[
    ("msg_len", &[], &[I32]),
    ("peek", &[I32, I32, I32], &[I32]),
    ("consume", &[I32, I32], &[I32]),
    ("skip", &[I32], &[I32]),
    ("cursor", &[], &[I32]),
    ("seek", &[I32], &[I32]),
    ("consume_window", &[I32, I32, I32], &[I32]),
    ("window_len", &[], &[I32]),
    ("window_read", &[I32, I32, I32], &[]),
    ("window_write", &[I32, I32, I32], &[]),
    ("window_load32", &[I32], &[I32]),
    ("window_store32", &[I32, I32], &[]),
    ("window_load64", &[I32], &[I64]),
    ("window_store64", &[I32, I64], &[]),
    ("pipe_reg", &[I32, I32, I32], &[I64]),
    ("pipe_set_reg", &[I32, I32, I32, I64], &[]),
    ("send", &[I32, I32], &[I32]),
    ("reply_udp", &[I32, I32], &[I32]),
    ("abort", &[], &[]),
];

/// Fuel every byte-moving import costs on top of its bytes.
pub(crate) const CALL_FUEL: u64 = 8;

/// Fuel for a plain copy of `n` bytes (about one unit per 8-byte word).
pub(crate) fn copy_fuel(n: usize) -> u64 {
    CALL_FUEL + n as u64 / 8
}

/// Most elements a handler's table may have.
pub(crate) const MAX_TABLE_ELEMENTS: usize = 1 << 16;

/// Why an import ended the invocation.
#[derive(Debug)]
pub(crate) enum HostAbort {
    /// The handler called `abort()`.
    Requested,
    /// An import's charge exceeded the fuel left.
    OutOfFuel,
    /// An import was called with arguments outside the contract.
    Misuse(String),
}

impl fmt::Display for HostAbort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostAbort::Requested => f.write_str("the handler called abort()"),
            HostAbort::OutOfFuel => f.write_str("out of fuel in an import"),
            HostAbort::Misuse(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for HostAbort {}

/// The frame of the current invocation, borrowed for the duration of
/// `Handler::run` (a raw pointer because the store outlives the borrow).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame {
    ptr: *const u8,
    len: usize,
}

// SAFETY: a Frame is only dereferenced by imports inside `Handler::run`, on
// the thread running it, while the slice it was made from is borrowed.
unsafe impl Send for Frame {}

impl Frame {
    /// No frame (outside `run`, and during the start function).
    pub(crate) const EMPTY: Frame = Frame {
        ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
        len: 0,
    };

    /// # Safety
    /// `bytes` must stay borrowed, unchanged, until the frame is replaced by
    /// [`Frame::EMPTY`]: [`Frame::bytes`] reads it until then.
    pub(crate) unsafe fn new(bytes: &[u8]) -> Frame {
        Frame {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: either EMPTY (dangling, length 0: a valid empty slice) or
        // made by `Frame::new`, whose caller keeps the slice borrowed for as
        // long as this Frame is installed in the host.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// What a handler's store holds: its view of the world.
pub(crate) struct Host {
    /// The message: the frame, or the payload the layers below pass up.
    pub(crate) frame: Frame,
    /// The whole frame (what `reply_udp` answers).
    pub(crate) whole: Frame,
    /// With UDP below: the checksum of what the handler moves.
    pub(crate) udp: Option<UdpAccount>,
    pub(crate) cursor: usize,
    pub(crate) window: Option<Window>,
    pub(crate) transfers: Vec<Box<dyn Transfer>>,
    /// The caller's outbox, swapped in for the invocation.
    pub(crate) outbox: Outbox,
    pub(crate) sends_left: usize,
    pub(crate) max_sends: usize,
    pub(crate) max_send_len: usize,
    pub(crate) memory: Option<Memory>,
    pub(crate) memory_max: usize,
}

impl ResourceLimiter for Host {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= self.memory_max)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        1
    }
}

type Res<T> = wasmtime::Result<T>;

fn misuse(message: String) -> wasmtime::Error {
    wasmtime::Error::new(HostAbort::Misuse(message))
}

/// Takes `fuel` from what the invocation has left, aborting it if short.
fn charge(c: &mut Caller<'_, Host>, fuel: u64) -> Res<()> {
    let left = c.get_fuel()?;
    match left.checked_sub(fuel) {
        Some(rest) => c.set_fuel(rest),
        None => {
            c.set_fuel(0)?;
            Err(wasmtime::Error::new(HostAbort::OutOfFuel))
        }
    }
}

/// A length, frame offset or index argument, which must not be negative.
fn unsigned(import: &str, what: &str, v: i32) -> Res<usize> {
    usize::try_from(v).map_err(|_| misuse(format!("{import}: negative {what} {v}")))
}

/// A window offset: the bits of the i32 as unsigned.
fn win_off(v: i32) -> u64 {
    u64::from(v as u32)
}

/// `[ptr, ptr + n)` of the handler's memory.
fn private<'m>(mem: &'m mut [u8], import: &str, ptr: i32, n: usize) -> Res<&'m mut [u8]> {
    let start = ptr as u32 as usize;
    let size = mem.len();
    start
        .checked_add(n)
        .and_then(|end| mem.get_mut(start..end))
        .ok_or_else(|| {
            misuse(format!(
                "{import}: [{start}, {start}+{n}) is outside the handler's {size}-byte memory"
            ))
        })
}

fn memory(c: &Caller<'_, Host>, import: &str) -> Res<Memory> {
    c.data()
        .memory
        .ok_or_else(|| misuse(format!("{import}: the handler exports no memory")))
}

fn window<'h>(host: &'h Host, import: &str) -> Res<&'h Window> {
    host.window
        .as_ref()
        .ok_or_else(|| misuse(format!("{import}: no window was granted")))
}

fn outside_window(import: &str, off: u64, n: usize, w: &Window) -> wasmtime::Error {
    misuse(format!(
        "{import}: [{off}, {off}+{n}) is outside the {}-byte window",
        w.len()
    ))
}

fn transfer<'h>(host: &'h mut Host, import: &str, pl: i32) -> Res<&'h mut Box<dyn Transfer>> {
    usize::try_from(pl)
        .ok()
        .and_then(|i| host.transfers.get_mut(i))
        .ok_or_else(|| misuse(format!("{import}: no pipe list {pl}")))
}

fn msg_len(c: Caller<'_, Host>) -> i32 {
    // `Handler::run` refuses frames longer than i32::MAX.
    c.data().frame.len() as i32
}

fn peek(mut c: Caller<'_, Host>, dst: i32, off: i32, n: i32) -> Res<i32> {
    let (off, len) = (
        unsigned("peek", "offset", off)?,
        unsigned("peek", "length", n)?,
    );
    charge(&mut c, copy_fuel(len))?;
    let mem = memory(&c, "peek")?;
    let (mem, host) = mem.data_and_store_mut(&mut c);
    let dst = private(mem, "peek", dst, len)?;
    let frame = host.frame;
    match off
        .checked_add(len)
        .and_then(|end| frame.bytes().get(off..end))
    {
        Some(src) => {
            dst.copy_from_slice(src);
            Ok(n)
        }
        None => Ok(-1),
    }
}

fn consume(mut c: Caller<'_, Host>, dst: i32, n: i32) -> Res<i32> {
    let len = unsigned("consume", "length", n)?;
    charge(&mut c, copy_fuel(len))?;
    let mem = memory(&c, "consume")?;
    let (mem, host) = mem.data_and_store_mut(&mut c);
    let dst = private(mem, "consume", dst, len)?;
    let (frame, at) = (host.frame, host.cursor);
    match frame.bytes().get(at..).and_then(|rest| rest.get(..len)) {
        Some(src) => {
            dst.copy_from_slice(src);
            host.cursor = at + len;
            Ok(n)
        }
        None => Ok(-1),
    }
}

fn skip(mut c: Caller<'_, Host>, n: i32) -> Res<i32> {
    let len = unsigned("skip", "length", n)?;
    let host = c.data_mut();
    if len > host.frame.len() - host.cursor {
        return Ok(-1);
    }
    host.cursor += len;
    Ok(n)
}

fn cursor(c: Caller<'_, Host>) -> i32 {
    // The cursor never passes the frame's end, and frames fit in an i32.
    c.data().cursor as i32
}

fn seek(mut c: Caller<'_, Host>, off: i32) -> Res<i32> {
    let at = unsigned("seek", "offset", off)?;
    let host = c.data_mut();
    if at > host.frame.len() {
        return Ok(-1);
    }
    host.cursor = at;
    Ok(off)
}

fn consume_window(mut c: Caller<'_, Host>, dst: i32, n: i32, pl: i32) -> Res<i32> {
    let len = unsigned("consume_window", "length", n)?;
    let off = win_off(dst);
    let Host {
        frame,
        cursor,
        window,
        transfers,
        udp,
        ..
    } = c.data_mut();
    let w = window
        .as_ref()
        .ok_or_else(|| misuse("consume_window: no window was granted".into()))?;
    let pipes = match (pl, udp.as_mut()) {
        // With UDP below, a plain copy still checksums.
        (NULL_PIPE, Some(u)) => Some(&mut u.copy),
        (NULL_PIPE, None) => None,
        _ => Some(
            usize::try_from(pl)
                .ok()
                .and_then(|i| transfers.get_mut(i))
                .ok_or_else(|| misuse(format!("consume_window: no pipe list {pl}")))?,
        ),
    };
    let Some(src) = frame
        .bytes()
        .get(*cursor..)
        .and_then(|rest| rest.get(..len))
    else {
        charge(&mut c, CALL_FUEL)?;
        return Ok(-1);
    };
    let (moved, fuel, sum) = match pipes {
        None => (w.write(off, src), copy_fuel(len), None),
        Some(t) => {
            // A pipe list that panics (on a length it did not expect, say)
            // aborts the handler rather than unwinding into the multiplexer.
            let moved = panic::catch_unwind(AssertUnwindSafe(|| w.transfer(off, src, t.as_mut())));
            // Taken even from a failed transfer, so that no sum is left for
            // the next message.
            let sum = t.take_checksum();
            let moved =
                moved.map_err(|_| misuse(format!("consume_window: pipe list {pl} failed")))?;
            (moved, CALL_FUEL.saturating_add(t.cost(len)), sum)
        }
    };
    if !moved {
        return Err(outside_window("consume_window", off, len, w));
    }
    if let (Some(u), Some(sum)) = (udp.as_mut(), sum) {
        u.moved(*cursor..*cursor + len, sum);
    }
    *cursor += len;
    // Charged after the copy, which the frame's length bounds.
    charge(&mut c, fuel)?;
    Ok(n)
}

fn window_len(c: Caller<'_, Host>) -> i32 {
    let len = c.data().window.as_ref().map_or(0, Window::len);
    i32::try_from(len).unwrap_or(i32::MAX)
}

fn window_read(mut c: Caller<'_, Host>, dst: i32, off: i32, n: i32) -> Res<()> {
    let len = unsigned("window_read", "length", n)?;
    charge(&mut c, copy_fuel(len))?;
    let mem = memory(&c, "window_read")?;
    let (mem, host) = mem.data_and_store_mut(&mut c);
    let dst = private(mem, "window_read", dst, len)?;
    let w = window(host, "window_read")?;
    if !w.read(win_off(off), dst) {
        return Err(outside_window("window_read", win_off(off), len, w));
    }
    Ok(())
}

fn window_write(mut c: Caller<'_, Host>, off: i32, src: i32, n: i32) -> Res<()> {
    let len = unsigned("window_write", "length", n)?;
    charge(&mut c, copy_fuel(len))?;
    let mem = memory(&c, "window_write")?;
    let (mem, host) = mem.data_and_store_mut(&mut c);
    let src = private(mem, "window_write", src, len)?;
    let w = window(host, "window_write")?;
    if !w.write(win_off(off), src) {
        return Err(outside_window("window_write", win_off(off), len, w));
    }
    Ok(())
}

fn load<const N: usize>(c: &Caller<'_, Host>, import: &str, off: i32) -> Res<[u8; N]> {
    let w = window(c.data(), import)?;
    let mut bytes = [0; N];
    if !w.read(win_off(off), &mut bytes) {
        return Err(outside_window(import, win_off(off), N, w));
    }
    Ok(bytes)
}

fn store(c: &Caller<'_, Host>, import: &str, off: i32, bytes: &[u8]) -> Res<()> {
    let w = window(c.data(), import)?;
    if !w.write(win_off(off), bytes) {
        return Err(outside_window(import, win_off(off), bytes.len(), w));
    }
    Ok(())
}

fn window_load32(c: Caller<'_, Host>, off: i32) -> Res<i32> {
    load(&c, "window_load32", off).map(i32::from_le_bytes)
}

fn window_store32(c: Caller<'_, Host>, off: i32, v: i32) -> Res<()> {
    store(&c, "window_store32", off, &v.to_le_bytes())
}

fn window_load64(c: Caller<'_, Host>, off: i32) -> Res<i64> {
    load(&c, "window_load64", off).map(i64::from_le_bytes)
}

fn window_store64(c: Caller<'_, Host>, off: i32, v: i64) -> Res<()> {
    store(&c, "window_store64", off, &v.to_le_bytes())
}

fn pipe_reg(mut c: Caller<'_, Host>, pl: i32, pipe: i32, reg: i32) -> Res<i64> {
    let (pipe_i, reg_i) = (
        unsigned("pipe_reg", "index", pipe)?,
        unsigned("pipe_reg", "index", reg)?,
    );
    transfer(c.data_mut(), "pipe_reg", pl)?
        .reg(pipe_i, reg_i)
        .map(|v| v as i64)
        .ok_or_else(|| {
            misuse(format!(
                "pipe_reg: pipe list {pl} has no register {reg} in pipe {pipe}"
            ))
        })
}

fn pipe_set_reg(mut c: Caller<'_, Host>, pl: i32, pipe: i32, reg: i32, v: i64) -> Res<()> {
    let (pipe_i, reg_i) = (
        unsigned("pipe_set_reg", "index", pipe)?,
        unsigned("pipe_set_reg", "index", reg)?,
    );
    if transfer(c.data_mut(), "pipe_set_reg", pl)?.set_reg(pipe_i, reg_i, v as u64) {
        Ok(())
    } else {
        Err(misuse(format!(
            "pipe_set_reg: pipe list {pl} has no register {reg} in pipe {pipe}"
        )))
    }
}

/// Shortest frame `send` accepts: an Ethernet header.
const MIN_SEND_LEN: usize = exonet_wire::ethernet::HEADER_LEN;

fn send(mut c: Caller<'_, Host>, ptr: i32, n: i32) -> Res<i32> {
    let host = c.data();
    let len = match usize::try_from(n) {
        Ok(len) if (MIN_SEND_LEN..=host.max_send_len).contains(&len) => len,
        _ => return Ok(-1),
    };
    if host.sends_left == 0 {
        return Ok(-1);
    }
    charge(&mut c, copy_fuel(len))?;
    let mem = memory(&c, "send")?;
    let (mem, host) = mem.data_and_store_mut(&mut c);
    let src = private(mem, "send", ptr, len)?;
    if !host.outbox.push_with(len, |dst| {
        dst.copy_from_slice(src);
        true
    }) {
        return Ok(-1);
    }
    host.sends_left -= 1;
    Ok(0)
}

fn reply_udp(mut c: Caller<'_, Host>, ptr: i32, n: i32) -> Res<i32> {
    let host = c.data();
    let (Ok(len), Some(d)) = (usize::try_from(n), Datagram::parse(host.whole.bytes())) else {
        return Ok(-1);
    };
    let total = d.reply_len(len);
    if total > host.max_send_len || host.sends_left == 0 {
        return Ok(-1);
    }
    // A copy of the payload plus a checksum pass over the datagram.
    charge(&mut c, copy_fuel(total).saturating_add(copy_fuel(len)))?;
    let mem = memory(&c, "reply_udp")?;
    let (mem, host) = mem.data_and_store_mut(&mut c);
    let payload = private(mem, "reply_udp", ptr, len)?;
    if !host
        .outbox
        .push_with(total, |dst| d.emit_reply(payload, dst))
    {
        return Ok(-1);
    }
    host.sends_left -= 1;
    Ok(0)
}

fn abort(_: Caller<'_, Host>) -> Res<()> {
    Err(wasmtime::Error::new(HostAbort::Requested))
}

/// A linker with every import of [`IMPORTS`].
pub(crate) fn linker(engine: &wasmtime::Engine) -> Res<Linker<Host>> {
    let mut l = Linker::new(engine);
    l.func_wrap(MODULE, "msg_len", msg_len)?;
    l.func_wrap(MODULE, "peek", peek)?;
    l.func_wrap(MODULE, "consume", consume)?;
    l.func_wrap(MODULE, "skip", skip)?;
    l.func_wrap(MODULE, "cursor", cursor)?;
    l.func_wrap(MODULE, "seek", seek)?;
    l.func_wrap(MODULE, "consume_window", consume_window)?;
    l.func_wrap(MODULE, "window_len", window_len)?;
    l.func_wrap(MODULE, "window_read", window_read)?;
    l.func_wrap(MODULE, "window_write", window_write)?;
    l.func_wrap(MODULE, "window_load32", window_load32)?;
    l.func_wrap(MODULE, "window_store32", window_store32)?;
    l.func_wrap(MODULE, "window_load64", window_load64)?;
    l.func_wrap(MODULE, "window_store64", window_store64)?;
    l.func_wrap(MODULE, "pipe_reg", pipe_reg)?;
    l.func_wrap(MODULE, "pipe_set_reg", pipe_set_reg)?;
    l.func_wrap(MODULE, "send", send)?;
    l.func_wrap(MODULE, "reply_udp", reply_udp)?;
    l.func_wrap(MODULE, "abort", abort)?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// exonet_ash.h declares exactly the imports the runtime provides.
    #[test]
    fn the_header_declares_every_import() {
        let header = include_str!("../../include/exonet_ash.h");
        let declared: Vec<&str> = header
            .split("ASH_IMPORT(")
            .skip(1)
            .filter_map(|rest| rest.split_once(')').map(|(name, _)| name))
            .filter(|name| *name != "name")
            .collect();
        let provided: Vec<&str> = IMPORTS.iter().map(|(name, ..)| *name).collect();
        assert_eq!(declared, provided);
    }
}
