//! The control protocol's messages and their encoding.
//!
//! Every message is one `SOCK_SEQPACKET` packet: a kind byte, then the
//! fields in order, integers little-endian, strings and byte strings as a
//! `u32` length and the bytes, lists as a `u32` count and the items. The
//! decoder checks every length against what is left and against the
//! protocol's limits, and refuses trailing bytes: a message either decodes
//! exactly or is an error.
//!
//! A request's kind byte may carry [`NO_REPLY`]: the sender goes on without
//! waiting, and the multiplexer answers nothing, whether the request succeeds
//! or is refused (it counts refusals); only a message that does not decode,
//! or comes before [`Request::Hello`], is answered with an error, as the
//! sender broke the protocol. Requests keep their order on a connection
//! either way, so a later request sees an earlier unanswered one done.

use std::fmt;
use std::net::Ipv4Addr;

/// Version of the protocol, exchanged in [`Request::Hello`]. 2: requests
/// without a reply ([`NO_REPLY`]). 3: an application may sleep in
/// `FUTEX_WAIT` ([`crate::WakeWord::FUTEX`]), which a multiplexer of
/// version 2 would not wake. 4: [`Reply::Info`] carries `max_send`, the
/// longest frame the link takes (TCP segmentation offload). 5:
/// [`Request::OpenDirect`].
pub const CONTROL_VERSION: u32 = 5;
/// Set in a request's kind byte: the multiplexer sends no reply. Only on
/// requests whose success is a bare [`Reply::Ok`]
/// ([`Request::may_go_unanswered`]); the decoder refuses it elsewhere.
pub const NO_REPLY: u8 = 0x80;
/// Largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Most filters one channel binds (a disjunction).
pub const MAX_FILTERS: usize = 16;
/// Longest filter text.
pub const MAX_FILTER_TEXT: usize = 4096;
/// Most fields of a transmit template, and the longest field.
pub const MAX_TEMPLATE_FIELDS: usize = 32;
pub const MAX_TEMPLATE_FIELD: usize = 64;
/// Most records in one [`Reply::Stats`] (the client asks again from where
/// the last page ended).
pub const STATS_PAGE: usize = 16;

/// Largest handler module (WebAssembly) an application may install.
pub const MAX_HANDLER_MODULE: usize = 4 << 20;
/// Most pipe lists one handler brings, and the longest encoded list.
pub const MAX_PIPE_LISTS: usize = 16;
pub const MAX_PIPE_LIST: usize = 8192;

/// IP protocol numbers the registry allocates ports for; for ICMP the
/// "port" is the echo identifier (an unprivileged ping socket).
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// One field of a transmit template: `bytes` at `offset` under `mask`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireField {
    pub offset: u16,
    pub bytes: Vec<u8>,
    pub mask: Vec<u8>,
}

/// What an application asks of the multiplexer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// First message: the client's protocol version.
    Hello {
        version: u32,
    },
    /// The host's MAC, addresses and MTU.
    Info,
    /// Serve a new endpoint; carries five descriptors: the segment's memfd,
    /// then the two ends (waited on, rung through) of the application's
    /// doorbell and of the multiplexer's doorbell.
    CreateEndpoint,
    DestroyEndpoint {
        endpoint: u32,
    },
    /// A UDP or TCP channel; port 0 asks for an ephemeral one.
    BindSocket {
        endpoint: u32,
        proto: u8,
        local_addr: Ipv4Addr,
        local_port: u16,
        remote: Option<(Ipv4Addr, u16)>,
    },
    /// A channel with raw filters (DPF text, any of them) and template.
    BindChannel {
        endpoint: u32,
        filters: Vec<String>,
        template: Vec<WireField>,
    },
    Unbind {
        channel: u32,
    },
    AllocatePort {
        endpoint: u32,
        proto: u8,
        port: u16,
    },
    ReleasePort {
        endpoint: u32,
        proto: u8,
        port: u16,
    },
    SetWeight {
        endpoint: u32,
        weight: u32,
    },
    /// The MAC of a neighbour (the multiplexer asks by ARP if it must).
    Resolve {
        ip: Ipv4Addr,
    },
    /// Counters, from record number `from` on.
    Stats {
        from: u32,
    },
    /// Installs (or replaces) the handler of a channel (ASH). Carries one
    /// descriptor, a memfd holding the WebAssembly module in its first
    /// `module_len` bytes; `spec.module` is not sent.
    InstallHandler {
        channel: u32,
        module_len: u32,
        spec: HandlerSpec,
    },
    /// Removes a channel's handler, if it has one.
    RemoveHandler {
        channel: u32,
    },
    /// Has the link answer the SYNs of TCP listener `channel` with SYN
    /// cookies, until the channel goes.
    AnswerSyns {
        channel: u32,
        answers: SynAnswers,
    },
    /// Opens the endpoint's direct send port: the [`Reply::Direct`] carries
    /// one descriptor, to which the application may write whole Ethernet frames
    /// of its connected TCP channels (not their SYNs, FINs or RSTs); the
    /// kernel checks each against the channel, as the transmit scan would.
    OpenDirect {
        endpoint: u32,
    },
}

pub use exonet_wire::tcp::SynAnswers;

/// [`SynAnswers::wscale`] on the wire when the SYN-ACK offers none.
const NO_WSCALE: u8 = 0xff;

/// A handler (ASH) an application installs on one of its channels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HandlerSpec {
    /// The WebAssembly module (`exonet_ash.h` describes its imports and
    /// entry point).
    pub module: Vec<u8>,
    /// Encoded pipe lists (`exonet_ash::pipe`), numbered in this order for
    /// the handler's `consume_window`.
    pub pipe_lists: Vec<Vec<u8>>,
    /// The part of the segment the handler may read and write: offset and
    /// length, inside the frame area (buffers the application keeps off its
    /// free ring).
    pub window: Option<(u32, u32)>,
    /// Fuel per invocation; 0 takes the multiplexer's default (which is
    /// also the most it grants).
    pub fuel: u64,
    /// The trusted protocol layers the multiplexer runs below the handler.
    pub below: Below,
}

/// Protocol layers below a handler (ASH §2.3; `exonet_ash::handler::Below`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Below {
    /// None: the handler sees whole frames.
    #[default]
    Nothing = 0,
    /// Ethernet, IPv4 and UDP: the handler sees UDP payloads, and the UDP
    /// checksum is verified in the loops that move them.
    Udp = 1,
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorCode {
    /// A malformed or out-of-protocol message.
    BadRequest = 1,
    NoSuchEndpoint = 2,
    NoSuchChannel = 3,
    /// A filter that does not parse or that DPF refuses.
    BadFilter = 4,
    NotPermitted = 5,
    PortInUse = 6,
    NoPortsLeft = 7,
    NotOurAddress = 8,
    /// The segment or its descriptors are unusable.
    BadSegment = 9,
    /// A per-connection limit (endpoints, channels) was reached.
    Limit = 10,
    /// The multiplexer is shutting down or failed.
    Unavailable = 11,
    /// A handler module, pipe list or window the multiplexer refuses.
    BadHandler = 12,
}

impl ErrorCode {
    fn from_u8(v: u8) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match v {
            1 => BadRequest,
            2 => NoSuchEndpoint,
            3 => NoSuchChannel,
            4 => BadFilter,
            5 => NotPermitted,
            6 => PortInUse,
            7 => NoPortsLeft,
            8 => NotOurAddress,
            9 => BadSegment,
            10 => Limit,
            11 => Unavailable,
            12 => BadHandler,
            _ => return None,
        })
    }
}

/// A named group of counters: an endpoint, a channel, the host, the link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// "endpoint", "channel", "host", "link", "frag", ...
    pub kind: String,
    pub id: u32,
    /// A free-form description (owner, filter, link name).
    pub label: String,
    pub fields: Vec<(String, u64)>,
}

impl Record {
    /// The value of counter `name`, if present.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.fields.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// What the multiplexer answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Ok,
    Hello {
        version: u32,
    },
    Info {
        mac: [u8; 6],
        addrs: Vec<(Ipv4Addr, u8)>,
        mtu: u32,
        max_send: u32,
    },
    Endpoint {
        endpoint: u32,
    },
    Bound {
        channel: u32,
        port: u16,
    },
    Port {
        port: u16,
    },
    Mac(Option<[u8; 6]>),
    Stats {
        records: Vec<Record>,
        more: bool,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    /// The direct send port ([`Request::OpenDirect`]), its descriptor
    /// alongside: the kernel passes at most `bytes_per_sec` through it, in
    /// bursts of at most `burst` bytes, and drops the rest.
    Direct {
        bytes_per_sec: u64,
        burst: u64,
    },
}

/// A message that does not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed control message: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn ip(&mut self, v: Ipv4Addr) -> &mut Self {
        self.0.extend_from_slice(&v.octets());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    /// Bytes of a length both sides know, without a length before them.
    fn take_bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }

    fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
}

struct Dec<'a>(&'a [u8]);

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn ip(&mut self) -> Result<Ipv4Addr, DecodeError> {
        let b = self.take(4)?;
        Ok(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    }
    fn bytes(&mut self, max: usize) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(DecodeError("field too long"));
        }
        self.take(n)
    }
    fn str(&mut self, max: usize) -> Result<String, DecodeError> {
        let b = self.bytes(max)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError("text is not UTF-8"))
    }
    /// A list count, refused above `max`.
    fn count(&mut self, max: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(DecodeError("list too long"));
        }
        Ok(n)
    }
    fn end(self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError("trailing bytes"))
        }
    }
}

impl Request {
    /// Whether the request may be sent with [`NO_REPLY`]: its success tells
    /// the sender nothing it needs (a [`Reply::Ok`]).
    pub fn may_go_unanswered(&self) -> bool {
        matches!(
            self,
            Request::DestroyEndpoint { .. }
                | Request::Unbind { .. }
                | Request::ReleasePort { .. }
                | Request::SetWeight { .. }
                | Request::RemoveHandler { .. }
        )
    }

    /// The request with [`NO_REPLY`]; `None` for a request whose reply
    /// carries something ([`may_go_unanswered`](Self::may_go_unanswered)).
    pub fn encode_unanswered(&self) -> Option<Vec<u8>> {
        self.may_go_unanswered().then(|| {
            let mut b = self.encode();
            b[0] |= NO_REPLY;
            b
        })
    }

    /// The request as sent by one who waits for the reply.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        match self {
            Request::Hello { version } => e.u8(1).u32(*version),
            Request::Info => e.u8(2),
            Request::CreateEndpoint => e.u8(3),
            Request::DestroyEndpoint { endpoint } => e.u8(4).u32(*endpoint),
            Request::BindSocket {
                endpoint,
                proto,
                local_addr,
                local_port,
                remote,
            } => {
                e.u8(5)
                    .u32(*endpoint)
                    .u8(*proto)
                    .ip(*local_addr)
                    .u16(*local_port);
                match remote {
                    Some((a, p)) => e.u8(1).ip(*a).u16(*p),
                    None => e.u8(0),
                }
            }
            Request::BindChannel {
                endpoint,
                filters,
                template,
            } => {
                e.u8(6).u32(*endpoint).u32(filters.len() as u32);
                for f in filters {
                    e.str(f);
                }
                e.u32(template.len() as u32);
                for f in template {
                    e.u16(f.offset).bytes(&f.bytes).bytes(&f.mask);
                }
                &mut e
            }
            Request::Unbind { channel } => e.u8(7).u32(*channel),
            Request::AllocatePort {
                endpoint,
                proto,
                port,
            } => e.u8(8).u32(*endpoint).u8(*proto).u16(*port),
            Request::ReleasePort {
                endpoint,
                proto,
                port,
            } => e.u8(9).u32(*endpoint).u8(*proto).u16(*port),
            Request::SetWeight { endpoint, weight } => e.u8(10).u32(*endpoint).u32(*weight),
            Request::Resolve { ip } => e.u8(11).ip(*ip),
            Request::Stats { from } => e.u8(12).u32(*from),
            Request::InstallHandler {
                channel,
                module_len,
                spec,
            } => {
                e.u8(13).u32(*channel).u32(*module_len);
                match spec.window {
                    Some((o, l)) => e.u8(1).u32(o).u32(l),
                    None => e.u8(0),
                };
                e.u64(spec.fuel)
                    .u8(spec.below as u8)
                    .u32(spec.pipe_lists.len() as u32);
                for p in &spec.pipe_lists {
                    e.bytes(p);
                }
                &mut e
            }
            Request::RemoveHandler { channel } => e.u8(14).u32(*channel),
            Request::AnswerSyns { channel, answers } => e
                .u8(15)
                .u32(*channel)
                .take_bytes(&answers.key)
                .u64(answers.epoch)
                .u16(answers.mss)
                .u16(answers.window)
                .u8(answers.wscale.unwrap_or(NO_WSCALE))
                .u8(u8::from(answers.sack))
                .u8(answers.ttl),
            Request::OpenDirect { endpoint } => e.u8(16).u32(*endpoint),
        };
        e.0
    }

    /// A request and whether its sender waits for the reply (false: it was
    /// sent with [`NO_REPLY`]).
    pub fn decode(b: &[u8]) -> Result<(Request, bool), DecodeError> {
        let mut d = Dec(b);
        let kind = d.u8()?;
        let r = match kind & !NO_REPLY {
            1 => Request::Hello { version: d.u32()? },
            2 => Request::Info,
            3 => Request::CreateEndpoint,
            4 => Request::DestroyEndpoint { endpoint: d.u32()? },
            5 => Request::BindSocket {
                endpoint: d.u32()?,
                proto: d.u8()?,
                local_addr: d.ip()?,
                local_port: d.u16()?,
                remote: match d.u8()? {
                    0 => None,
                    1 => Some((d.ip()?, d.u16()?)),
                    _ => return Err(DecodeError("bad option tag")),
                },
            },
            6 => {
                let endpoint = d.u32()?;
                let n = d.count(MAX_FILTERS)?;
                let mut filters = Vec::with_capacity(n);
                for _ in 0..n {
                    filters.push(d.str(MAX_FILTER_TEXT)?);
                }
                let n = d.count(MAX_TEMPLATE_FIELDS)?;
                let mut template = Vec::with_capacity(n);
                for _ in 0..n {
                    let offset = d.u16()?;
                    let bytes = d.bytes(MAX_TEMPLATE_FIELD)?.to_vec();
                    let mask = d.bytes(MAX_TEMPLATE_FIELD)?.to_vec();
                    if bytes.len() != mask.len() {
                        return Err(DecodeError("template bytes and mask differ in length"));
                    }
                    template.push(WireField {
                        offset,
                        bytes,
                        mask,
                    });
                }
                Request::BindChannel {
                    endpoint,
                    filters,
                    template,
                }
            }
            7 => Request::Unbind { channel: d.u32()? },
            8 => Request::AllocatePort {
                endpoint: d.u32()?,
                proto: d.u8()?,
                port: d.u16()?,
            },
            9 => Request::ReleasePort {
                endpoint: d.u32()?,
                proto: d.u8()?,
                port: d.u16()?,
            },
            10 => Request::SetWeight {
                endpoint: d.u32()?,
                weight: d.u32()?,
            },
            11 => Request::Resolve { ip: d.ip()? },
            12 => Request::Stats { from: d.u32()? },
            13 => {
                let channel = d.u32()?;
                let module_len = d.u32()?;
                if module_len as usize > MAX_HANDLER_MODULE {
                    return Err(DecodeError("handler module too long"));
                }
                let window = match d.u8()? {
                    0 => None,
                    1 => Some((d.u32()?, d.u32()?)),
                    _ => return Err(DecodeError("bad option tag")),
                };
                let fuel = d.u64()?;
                let below = match d.u8()? {
                    0 => Below::Nothing,
                    1 => Below::Udp,
                    _ => return Err(DecodeError("unknown layers below a handler")),
                };
                let n = d.count(MAX_PIPE_LISTS)?;
                let mut pipe_lists = Vec::with_capacity(n);
                for _ in 0..n {
                    pipe_lists.push(d.bytes(MAX_PIPE_LIST)?.to_vec());
                }
                Request::InstallHandler {
                    channel,
                    module_len,
                    spec: HandlerSpec {
                        module: Vec::new(),
                        pipe_lists,
                        window,
                        fuel,
                        below,
                    },
                }
            }
            14 => Request::RemoveHandler { channel: d.u32()? },
            16 => Request::OpenDirect { endpoint: d.u32()? },
            15 => {
                let channel = d.u32()?;
                let key = d.take(16)?.try_into().expect("16 bytes");
                let (epoch, mss, window) = (d.u64()?, d.u16()?, d.u16()?);
                let wscale = match d.u8()? {
                    NO_WSCALE => None,
                    s @ 0..=14 => Some(s),
                    _ => return Err(DecodeError("a window scale above 14")),
                };
                let sack = match d.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError("SACK-permitted is 0 or 1")),
                };
                let ttl = d.u8()?;
                if mss < 48 || ttl == 0 {
                    return Err(DecodeError("an MSS below 48 or a TTL of 0"));
                }
                Request::AnswerSyns {
                    channel,
                    answers: SynAnswers {
                        key,
                        epoch,
                        mss,
                        window,
                        wscale,
                        sack,
                        ttl,
                    },
                }
            }
            _ => return Err(DecodeError("unknown request")),
        };
        d.end()?;
        let answered = kind & NO_REPLY == 0;
        if !answered && !r.may_go_unanswered() {
            return Err(DecodeError(
                "a request whose reply carries data sent without reply",
            ));
        }
        Ok((r, answered))
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        match self {
            Reply::Ok => e.u8(1),
            Reply::Hello { version } => e.u8(2).u32(*version),
            Reply::Info {
                mac,
                addrs,
                mtu,
                max_send,
            } => {
                e.u8(3);
                e.0.extend_from_slice(mac);
                e.u32(addrs.len() as u32);
                for (a, len) in addrs {
                    e.ip(*a).u8(*len);
                }
                e.u32(*mtu).u32(*max_send)
            }
            Reply::Endpoint { endpoint } => e.u8(4).u32(*endpoint),
            Reply::Bound { channel, port } => e.u8(5).u32(*channel).u16(*port),
            Reply::Port { port } => e.u8(6).u16(*port),
            Reply::Mac(mac) => {
                e.u8(7);
                match mac {
                    Some(m) => {
                        e.u8(1);
                        e.0.extend_from_slice(m);
                        &mut e
                    }
                    None => e.u8(0),
                }
            }
            Reply::Stats { records, more } => {
                e.u8(8).u8(*more as u8).u32(records.len() as u32);
                for r in records {
                    e.str(&r.kind).u32(r.id).str(&r.label);
                    e.u32(r.fields.len() as u32);
                    for (name, v) in &r.fields {
                        e.str(name).u64(*v);
                    }
                }
                &mut e
            }
            Reply::Error { code, message } => e.u8(9).u8(*code as u8).str(message),
            Reply::Direct {
                bytes_per_sec,
                burst,
            } => e.u8(10).u64(*bytes_per_sec).u64(*burst),
        };
        e.0
    }

    pub fn decode(b: &[u8]) -> Result<Reply, DecodeError> {
        let mut d = Dec(b);
        let r = match d.u8()? {
            1 => Reply::Ok,
            2 => Reply::Hello { version: d.u32()? },
            3 => {
                let mac = d.take(6)?.try_into().unwrap();
                let n = d.count(256)?;
                let mut addrs = Vec::with_capacity(n);
                for _ in 0..n {
                    addrs.push((d.ip()?, d.u8()?));
                }
                Reply::Info {
                    mac,
                    addrs,
                    mtu: d.u32()?,
                    max_send: d.u32()?,
                }
            }
            4 => Reply::Endpoint { endpoint: d.u32()? },
            5 => Reply::Bound {
                channel: d.u32()?,
                port: d.u16()?,
            },
            6 => Reply::Port { port: d.u16()? },
            10 => Reply::Direct {
                bytes_per_sec: d.u64()?,
                burst: d.u64()?,
            },
            7 => Reply::Mac(match d.u8()? {
                0 => None,
                1 => Some(d.take(6)?.try_into().unwrap()),
                _ => return Err(DecodeError("bad option tag")),
            }),
            8 => {
                let more = d.u8()? != 0;
                let n = d.count(STATS_PAGE)?;
                let mut records = Vec::with_capacity(n);
                for _ in 0..n {
                    let kind = d.str(64)?;
                    let id = d.u32()?;
                    let label = d.str(1024)?;
                    let k = d.count(256)?;
                    let mut fields = Vec::with_capacity(k);
                    for _ in 0..k {
                        fields.push((d.str(64)?, d.u64()?));
                    }
                    records.push(Record {
                        kind,
                        id,
                        label,
                        fields,
                    });
                }
                Reply::Stats { records, more }
            }
            9 => Reply::Error {
                code: ErrorCode::from_u8(d.u8()?).ok_or(DecodeError("unknown error code"))?,
                message: d.str(4096)?,
            },
            _ => return Err(DecodeError("unknown reply")),
        };
        d.end()?;
        Ok(r)
    }
}
