//! Protocol composition (§2.3).
//!
//! A [`Layer`] has a body, run as the message goes up, and a commit and an
//! abort for the final phase. [`Composition::new`] stacks layers at run
//! time into one handler; [`Composition::run`] runs it on a frame:
//!
//! 1. Bodies run bottom up. Each sees the frame as a stream ([`Message`]):
//!    it peeks, strips its header, may push pipes for the data it passes up
//!    (UDP pushes its checksum), and passes the rest up, or consumes it:
//!    [`Message::consume_into`] copies into the layer's buffer through the
//!    pipes the lower layers pushed AND the layer's own, in ONE compiled
//!    loop. Every combination of pipes a message can meet is compiled when
//!    the layers are composed, never per message.
//! 2. Bytes no layer consumed still run through the pushed pipes (so UDP
//!    verifies a payload the layer above ignored).
//! 3. Commits run in FIFO order (bottom up). A failing body makes every
//!    layer whose body ran abort (the failure propagates down, as the
//!    paper's `deliver` error does); a failing commit makes the layers above
//!    it abort. Either way the frame is then delivered untouched, or
//!    dropped if the failing layer says so ([`Disposition`]).
//!
//! Lower layers' modifying pipes apply to the bytes consumed through
//! `consume_into`; `peek` and `strip` see the frame as it arrived.

use std::collections::HashMap;
use std::fmt;

use crate::pipe::{builtins, Compiled, Pipe, PipeError, PipeList};
use crate::Transfer;

/// Most layers in one composition.
pub const MAX_LAYERS: usize = 8;
/// Most layers that push pipes for the data they pass up: every subset of
/// them is compiled with every consuming layer's own pipes, so this bounds
/// the compiled lists (2^4 combinations per consumer).
pub const MAX_PIPE_LAYERS: usize = 4;

/// What becomes of a frame whose handler failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Delivered to the application untouched (e.g. not for this handler).
    Deliver,
    /// Dropped and counted (e.g. a bad checksum).
    Drop,
}

/// A failing body or commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerError {
    pub disposition: Disposition,
    pub reason: &'static str,
}

impl LayerError {
    pub fn deliver(reason: &'static str) -> LayerError {
        LayerError {
            disposition: Disposition::Deliver,
            reason,
        }
    }

    pub fn drop(reason: &'static str) -> LayerError {
        LayerError {
            disposition: Disposition::Drop,
            reason,
        }
    }
}

impl fmt::Display for LayerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = match self.disposition {
            Disposition::Deliver => "deliver",
            Disposition::Drop => "drop",
        };
        write!(f, "{} ({d})", self.reason)
    }
}

/// How a body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The rest of the message goes to the layer above (if there is none,
    /// the frame is delivered after the commits).
    Up,
    /// This layer placed the message: no layer above runs.
    Consumed,
}

/// The pipes a layer declares when it is composed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerPipes {
    /// Run over the data the layer passes up, once it calls
    /// [`Message::push_pipes`].
    pub up: Vec<Pipe>,
    /// Run over what the layer itself consumes with `own_pipes`.
    pub own: Vec<Pipe>,
}

/// A protocol layer. Its pipes' persistent registers are reset to their
/// initial values for every message and reached through
/// [`Message::reg`]/[`Message::set_reg`], numbered `up` then `own`.
pub trait Layer: Send {
    /// The pipes of this layer (asked once, at composition).
    fn pipes(&self) -> LayerPipes {
        LayerPipes::default()
    }
    /// The initial processing of a message.
    fn body(&mut self, msg: &mut Message<'_>) -> Result<Pass, LayerError>;
    /// After every body succeeded and the commits below this one did.
    fn commit(&mut self, msg: &Message<'_>) -> Result<(), LayerError>;
    /// Undo what the body did: a body failed, or a commit below this one.
    fn abort(&mut self);
}

/// What the IPv4 layer found, for the layers above.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ipv4Meta {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub protocol: u8,
}

/// What the UDP layer found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpMeta {
    pub src_port: u16,
    pub dst_port: u16,
}

/// Facts lower layers leave for upper ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Notes {
    pub ipv4: Option<Ipv4Meta>,
    pub udp: Option<UdpMeta>,
}

/// Counters of a composition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub runs: u64,
    pub consumed: u64,
    pub delivered: u64,
    pub dropped: u64,
    /// Compiled loops run with a destination (`consume_into`).
    pub transfers: u64,
    /// Compiled loops run without one (stripped or unconsumed bytes seen by
    /// pushed pipes).
    pub scans: u64,
    /// Pipe lists compiled (all at composition).
    pub compiled: u64,
}

/// The result of running a composition on a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A layer consumed the message and every commit succeeded.
    Consumed,
    /// Deliver the frame untouched to the application.
    Deliver,
    /// Drop it.
    Drop,
}

/// Why layers could not be composed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ComposeError {
    TooManyLayers(usize),
    TooManyPipeLayers(usize),
    Pipes { layer: usize, error: PipeError },
}

impl fmt::Display for ComposeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ComposeError::TooManyLayers(n) => {
                write!(f, "{n} layers (at most {MAX_LAYERS})")
            }
            ComposeError::TooManyPipeLayers(n) => write!(
                f,
                "{n} layers push pipes for the data they pass up (at most {MAX_PIPE_LAYERS})"
            ),
            ComposeError::Pipes { layer, error } => write!(f, "layer {layer}: {error}"),
        }
    }
}

impl std::error::Error for ComposeError {}

/// A compiled combination of pipes and where its pipes' registers live.
struct Entry {
    code: Compiled,
    /// For each pipe of `code`, its number among all layers' pipes.
    globals: Vec<usize>,
}

/// Which pipes run: the layers (bit mask) whose up pipes were pushed, and
/// the consuming layer if it runs its own.
type Key = (u32, Option<usize>);

/// Everything a message's run shares with its layers but the layers.
struct Runtime {
    /// Per layer: the global numbers of its up pipes, then of its own.
    up: Vec<Vec<usize>>,
    own: Vec<Vec<usize>>,
    init: Vec<Vec<u64>>,
    regs: Vec<Vec<u64>>,
    compiled: HashMap<Key, Entry>,
    stats: Stats,
}

impl Runtime {
    /// Runs the pipes of `key` over `src`, into `dst` if there is one.
    fn run(&mut self, key: Key, src: &[u8], dst: Option<&mut [u8]>) {
        let Some(e) = self.compiled.get_mut(&key) else {
            // No pipes at all (every other key was compiled): a plain copy
            // or nothing.
            if let Some(d) = dst {
                d.copy_from_slice(src);
            }
            return;
        };
        for (i, &g) in e.globals.iter().enumerate() {
            for (r, &v) in self.regs[g].iter().enumerate() {
                e.code.set_reg(i, r, v);
            }
        }
        match dst {
            Some(d) => {
                e.code.transfer(src, d);
                self.stats.transfers += 1;
            }
            None => {
                e.code.scan(src);
                self.stats.scans += 1;
            }
        }
        for (i, &g) in e.globals.iter().enumerate() {
            for (r, v) in self.regs[g].iter_mut().enumerate() {
                *v = e.code.reg(i, r).unwrap_or(*v);
            }
        }
    }

    /// The key for the current pushes, and for `layer`'s own pipes if
    /// asked for and it has some.
    fn key(&self, pushed: u32, own: Option<usize>) -> Key {
        (pushed, own.filter(|&l| !self.own[l].is_empty()))
    }
}

/// The frame as the layers see it: a stream with a cursor.
pub struct Message<'a> {
    frame: &'a [u8],
    cursor: usize,
    end: usize,
    layer: usize,
    pushed: u32,
    notes: Notes,
    rt: &'a mut Runtime,
}

impl<'a> Message<'a> {
    /// The whole frame as it arrived.
    pub fn frame(&self) -> &'a [u8] {
        self.frame
    }

    /// The cursor's offset in the frame.
    pub fn offset(&self) -> usize {
        self.cursor
    }

    /// Bytes left between the cursor and the end of the message.
    pub fn remaining(&self) -> usize {
        self.end - self.cursor
    }

    /// `n` bytes at `off` past the cursor, if the message has them.
    pub fn peek(&self, off: usize, n: usize) -> Option<&'a [u8]> {
        let start = self.cursor.checked_add(off)?;
        let end = start.checked_add(n)?;
        (end <= self.end).then(|| &self.frame[start..end])
    }

    /// Consumes a header of `n` bytes and returns it. The pipes pushed
    /// below see them (the Internet checksum stays exact as long as the
    /// parts it sees, but the last, have an even length).
    pub fn strip(&mut self, n: usize) -> Result<&'a [u8], LayerError> {
        let h = self
            .peek(0, n)
            .ok_or(LayerError::drop("message too short"))?;
        if self.pushed != 0 {
            let key = self.rt.key(self.pushed, None);
            self.rt.run(key, h, None);
        }
        self.cursor += n;
        Ok(h)
    }

    /// Ends the message `n` bytes past the cursor (e.g. before Ethernet
    /// padding); an error if it has fewer.
    pub fn truncate(&mut self, n: usize) -> Result<(), LayerError> {
        if n > self.remaining() {
            return Err(LayerError::drop("length beyond the frame"));
        }
        self.end = self.cursor + n;
        Ok(())
    }

    /// The current layer's up pipes run over everything from the cursor on.
    pub fn push_pipes(&mut self) {
        if !self.rt.up[self.layer].is_empty() {
            self.pushed |= 1 << self.layer;
        }
    }

    /// Copies the next `n` bytes into `dst[..n]` through the pushed pipes
    /// and, with `own_pipes`, the current layer's own, in one compiled
    /// loop, and advances past them.
    pub fn consume_into(
        &mut self,
        dst: &mut [u8],
        n: usize,
        own_pipes: bool,
    ) -> Result<(), LayerError> {
        let src = self
            .peek(0, n)
            .ok_or(LayerError::drop("message too short"))?;
        let dst = dst
            .get_mut(..n)
            .ok_or(LayerError::deliver("destination too small"))?;
        let key = self.rt.key(self.pushed, own_pipes.then_some(self.layer));
        self.rt.run(key, src, Some(dst));
        self.cursor += n;
        Ok(())
    }

    /// A persistent register of the current layer's pipes (`up` then
    /// `own`, as declared).
    pub fn reg(&self, pipe: usize, reg: usize) -> Option<u64> {
        let g = self.global(pipe)?;
        self.rt.regs[g].get(reg).copied()
    }

    /// Sets one (e.g. a checksum's seed); false if there is none.
    pub fn set_reg(&mut self, pipe: usize, reg: usize, value: u64) -> bool {
        match self.global(pipe).and_then(|g| self.rt.regs[g].get_mut(reg)) {
            Some(r) => {
                *r = value;
                true
            }
            None => false,
        }
    }

    fn global(&self, pipe: usize) -> Option<usize> {
        let up = &self.rt.up[self.layer];
        match pipe.checked_sub(up.len()) {
            None => Some(up[pipe]),
            Some(i) => self.rt.own[self.layer].get(i).copied(),
        }
    }

    pub fn notes(&self) -> &Notes {
        &self.notes
    }

    pub fn notes_mut(&mut self) -> &mut Notes {
        &mut self.notes
    }
}

/// Layers composed into one handler.
pub struct Composition {
    layers: Vec<Box<dyn Layer>>,
    rt: Runtime,
}

impl Composition {
    /// Composes `layers` (bottom first) and compiles every combination of
    /// their pipes a message can meet.
    pub fn new(layers: Vec<Box<dyn Layer>>) -> Result<Composition, ComposeError> {
        if layers.len() > MAX_LAYERS {
            return Err(ComposeError::TooManyLayers(layers.len()));
        }
        let declared: Vec<LayerPipes> = layers.iter().map(|l| l.pipes()).collect();
        let mut all: Vec<Pipe> = Vec::new();
        let mut up = Vec::new();
        let mut own = Vec::new();
        for d in &declared {
            up.push((all.len()..all.len() + d.up.len()).collect::<Vec<_>>());
            all.extend(d.up.iter().cloned());
            own.push((all.len()..all.len() + d.own.len()).collect::<Vec<_>>());
            all.extend(d.own.iter().cloned());
        }
        let pushers: Vec<usize> = (0..layers.len()).filter(|&l| !up[l].is_empty()).collect();
        if pushers.len() > MAX_PIPE_LAYERS {
            return Err(ComposeError::TooManyPipeLayers(pushers.len()));
        }
        let init: Vec<Vec<u64>> = all.iter().map(|p| p.persistent.clone()).collect();
        let mut rt = Runtime {
            up,
            own,
            regs: init.clone(),
            init,
            compiled: HashMap::new(),
            stats: Stats::default(),
        };
        // Every subset of the pushing layers, alone and with each layer's
        // own pipes (that layer can only have seen pushes from itself and
        // below).
        for subset in 0u32..1 << pushers.len() {
            let mask: u32 = pushers
                .iter()
                .enumerate()
                .filter(|(i, _)| subset & (1 << i) != 0)
                .map(|(_, &l)| 1 << l)
                .sum();
            let top = pushers
                .iter()
                .enumerate()
                .filter(|(i, _)| subset & (1 << i) != 0)
                .map(|(_, &l)| l)
                .max();
            let mut keys = Vec::new();
            if mask != 0 {
                keys.push((mask, None));
            }
            for l in 0..layers.len() {
                if !rt.own[l].is_empty() && top.is_none_or(|t| t <= l) {
                    keys.push((mask, Some(l)));
                }
            }
            for key in keys {
                let mut globals: Vec<usize> = (0..layers.len())
                    .filter(|l| key.0 & (1 << l) != 0)
                    .flat_map(|l| rt.up[l].iter().copied())
                    .collect();
                let layer = key.1.unwrap_or_else(|| top.unwrap_or(0));
                if let Some(l) = key.1 {
                    globals.extend(rt.own[l].iter().copied());
                }
                let code = PipeList::new(globals.iter().map(|&g| all[g].clone()).collect())
                    .and_then(|pl| pl.compile())
                    .map_err(|error| ComposeError::Pipes { layer, error })?;
                rt.stats.compiled += 1;
                rt.compiled.insert(key, Entry { code, globals });
            }
        }
        Ok(Composition { layers, rt })
    }

    /// Runs the handler on `frame` (see the module doc for the phases).
    pub fn run(&mut self, frame: &[u8]) -> Verdict {
        self.rt.stats.runs += 1;
        for (r, i) in self.rt.regs.iter_mut().zip(&self.rt.init) {
            r.copy_from_slice(i);
        }
        let mut msg = Message {
            frame,
            cursor: 0,
            end: frame.len(),
            layer: 0,
            pushed: 0,
            notes: Notes::default(),
            rt: &mut self.rt,
        };
        let mut ran = 0;
        let mut consumed = false;
        let mut failure = None;
        for (k, layer) in self.layers.iter_mut().enumerate() {
            msg.layer = k;
            ran = k + 1;
            match layer.body(&mut msg) {
                Ok(Pass::Up) => {}
                Ok(Pass::Consumed) => {
                    consumed = true;
                    break;
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if failure.is_none() && msg.pushed != 0 && msg.remaining() > 0 {
            let key = msg.rt.key(msg.pushed, None);
            let rest = &frame[msg.cursor..msg.end];
            msg.rt.run(key, rest, None);
            msg.cursor = msg.end;
        }
        let failure = match failure {
            Some(e) => {
                // The failure propagates down through every body that ran.
                for layer in &mut self.layers[..ran] {
                    layer.abort();
                }
                Some(e)
            }
            None => (0..ran).find_map(|j| {
                msg.layer = j;
                let e = self.layers[j].commit(&msg).err()?;
                for layer in &mut self.layers[j + 1..ran] {
                    layer.abort();
                }
                Some(e)
            }),
        };
        let verdict = match failure {
            Some(e) if e.disposition == Disposition::Drop => Verdict::Drop,
            Some(_) => Verdict::Deliver,
            None if consumed => Verdict::Consumed,
            None => Verdict::Deliver,
        };
        let s = &mut self.rt.stats;
        match verdict {
            Verdict::Consumed => s.consumed += 1,
            Verdict::Deliver => s.delivered += 1,
            Verdict::Drop => s.dropped += 1,
        }
        verdict
    }

    pub fn stats(&self) -> Stats {
        self.rt.stats
    }
}

pub(crate) const ETHER_HEADER: usize = 14;
const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
const PROTO_UDP: u8 = 17;

/// Ethernet and IPv4: checks the header (version, IHL, total length,
/// header checksum, not a fragment), strips both headers and the Ethernet
/// padding, and notes the addresses and protocol. A frame that is not
/// IPv4, or a fragment, is delivered; a corrupt header is dropped.
#[derive(Debug, Default)]
pub struct Ipv4Layer;

/// An IPv4 header as [`Ipv4Layer`] checks it.
pub(crate) struct Ipv4Header {
    pub meta: Ipv4Meta,
    /// Header length and total length, in bytes.
    pub ihl: usize,
    pub total: usize,
}

/// Checks the Ethernet and IPv4 headers at the start of `frame` (version,
/// IHL, total length within the frame, header checksum, not a fragment).
pub(crate) fn ipv4_header(frame: &[u8]) -> Result<Ipv4Header, LayerError> {
    let eth = frame
        .get(..ETHER_HEADER)
        .ok_or(LayerError::deliver("not an Ethernet frame"))?;
    if eth[12..14] != ETHERTYPE_IPV4 {
        return Err(LayerError::deliver("not IPv4"));
    }
    let ip = frame
        .get(ETHER_HEADER..ETHER_HEADER + 20)
        .ok_or(LayerError::drop("IPv4 header truncated"))?;
    if ip[0] >> 4 != 4 {
        return Err(LayerError::drop("IP version is not 4"));
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ihl < 20 {
        return Err(LayerError::drop("IPv4 header length under 20"));
    }
    let header = frame
        .get(ETHER_HEADER..ETHER_HEADER + ihl)
        .ok_or(LayerError::drop("IPv4 options truncated"))?;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if total < ihl || total > frame.len() - ETHER_HEADER {
        return Err(LayerError::drop("bad IPv4 total length"));
    }
    if builtins::fold_checksum(builtins::checksum_accumulate(0, header)) != 0 {
        return Err(LayerError::drop("bad IPv4 header checksum"));
    }
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    if frag & 0x3fff != 0 {
        return Err(LayerError::deliver("IPv4 fragment"));
    }
    let meta = Ipv4Meta {
        src: [ip[12], ip[13], ip[14], ip[15]],
        dst: [ip[16], ip[17], ip[18], ip[19]],
        protocol: ip[9],
    };
    Ok(Ipv4Header { meta, ihl, total })
}

impl Layer for Ipv4Layer {
    fn body(&mut self, msg: &mut Message<'_>) -> Result<Pass, LayerError> {
        let h = ipv4_header(msg.peek(0, msg.remaining()).unwrap_or_default())?;
        msg.notes_mut().ipv4 = Some(h.meta);
        msg.strip(ETHER_HEADER + h.ihl)?;
        msg.truncate(h.total - h.ihl)?;
        Ok(Pass::Up)
    }

    fn commit(&mut self, _: &Message<'_>) -> Result<(), LayerError> {
        Ok(())
    }

    fn abort(&mut self) {}
}

/// A UDP header as [`UdpLayer`] checks it.
pub(crate) struct UdpHeader {
    pub meta: UdpMeta,
    /// The UDP length (header included).
    pub len: usize,
    /// The checksum accumulator over the pseudo-header and the UDP header,
    /// to continue over the payload; `None` if the sender sent no checksum.
    pub seed: Option<u64>,
}

/// Checks the UDP header at the start of `datagram` (the IPv4 payload) of
/// a packet `ip` describes: a length within it.
pub(crate) fn udp_header(ip: &Ipv4Meta, datagram: &[u8]) -> Result<UdpHeader, LayerError> {
    if ip.protocol != PROTO_UDP {
        return Err(LayerError::deliver("not UDP"));
    }
    let h = datagram
        .get(..8)
        .ok_or(LayerError::drop("UDP header truncated"))?;
    let len = u16::from_be_bytes([h[4], h[5]]);
    if usize::from(len) < 8 || usize::from(len) > datagram.len() {
        return Err(LayerError::drop("bad UDP length"));
    }
    let seed = (h[6..8] != [0, 0]).then(|| {
        let mut pseudo = [0u8; 20];
        pseudo[..4].copy_from_slice(&ip.src);
        pseudo[4..8].copy_from_slice(&ip.dst);
        pseudo[9] = PROTO_UDP;
        pseudo[10..12].copy_from_slice(&len.to_be_bytes());
        pseudo[12..].copy_from_slice(h);
        builtins::checksum_accumulate(0, &pseudo)
    });
    let meta = UdpMeta {
        src_port: u16::from_be_bytes([h[0], h[1]]),
        dst_port: u16::from_be_bytes([h[2], h[3]]),
    };
    Ok(UdpHeader {
        meta,
        len: usize::from(len),
        seed,
    })
}

/// UDP over [`Ipv4Layer`]: strips the header and what follows the UDP
/// length, and pushes the checksum pipe, seeded with the pseudo-header and
/// the header, over the payload; the commit drops the datagram if the
/// checksum is wrong (0 means none was sent). Not UDP: delivered.
#[derive(Debug, Default)]
pub struct UdpLayer {
    checked: bool,
}

impl Layer for UdpLayer {
    fn pipes(&self) -> LayerPipes {
        LayerPipes {
            up: vec![builtins::checksum()],
            own: Vec::new(),
        }
    }

    fn body(&mut self, msg: &mut Message<'_>) -> Result<Pass, LayerError> {
        let ip = msg.notes().ipv4.ok_or(LayerError::deliver("not UDP"))?;
        let h = udp_header(&ip, msg.peek(0, msg.remaining()).unwrap_or_default())?;
        self.checked = h.seed.is_some();
        if let Some(seed) = h.seed {
            msg.set_reg(0, 0, seed);
        }
        msg.notes_mut().udp = Some(h.meta);
        msg.strip(8)?;
        msg.truncate(h.len - 8)?;
        if self.checked {
            msg.push_pipes();
        }
        Ok(Pass::Up)
    }

    fn commit(&mut self, msg: &Message<'_>) -> Result<(), LayerError> {
        if self.checked && msg.reg(0, 0).map(builtins::fold_checksum) != Some(0) {
            return Err(LayerError::drop("bad UDP checksum"));
        }
        Ok(())
    }

    fn abort(&mut self) {}
}
