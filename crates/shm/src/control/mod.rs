//! The control socket: how an application gets endpoints and channels from
//! the multiplexer (the slow path; DESIGN.md "Control").
//!
//! A Unix `SOCK_SEQPACKET` socket; the multiplexer learns the peer's uid
//! from `SO_PEERCRED` (root's endpoints are privileged). The application
//! creates the segment and sends its memfd and the two doorbells with
//! `SCM_RIGHTS` ([`Client::create_endpoint`]); the multiplexer maps it,
//! trusting nothing in it ([`crate::Segment::open`]). Everything an
//! application holds lives as long as its connection: when the socket
//! closes, because the application exited or was killed, the multiplexer
//! reclaims it all. When the multiplexer goes away, requests and
//! [`Client::wait`] fail with [`ControlError::Disconnected`].

mod msg;
mod sock;

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use msg::{
    Below, DecodeError, ErrorCode, HandlerSpec, Record, Reply, Request, SynAnswers, WireField,
    CONTROL_VERSION, MAX_FILTERS, MAX_FILTER_TEXT, MAX_HANDLER_MODULE, MAX_MESSAGE, MAX_PIPE_LIST,
    MAX_PIPE_LISTS, MAX_TEMPLATE_FIELD, MAX_TEMPLATE_FIELDS, NO_REPLY, PROTO_ICMP, PROTO_TCP,
    PROTO_UDP, STATS_PAGE,
};
pub use sock::{connect_or_remove_dead, PeerCred, SeqListener, SeqPacket, MAX_FDS};

use crate::{AppEndpoint, Doorbells, Segment, SegmentConfig, Wakeup};

/// Where the daemon listens unless told otherwise: `$EXONET_SOCKET`, else
/// `/run/exonet/control.sock` for root, else
/// `$XDG_RUNTIME_DIR/exonet.sock`, else `/tmp/exonet-UID.sock`.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("EXONET_SOCKET") {
        return PathBuf::from(p);
    }
    // SAFETY: geteuid cannot fail and touches no memory.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/exonet/control.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => Path::new(&d).join("exonet.sock"),
        None => PathBuf::from(format!("/tmp/exonet-{uid}.sock")),
    }
}

/// Why a control request failed.
#[derive(Debug)]
pub enum ControlError {
    /// The multiplexer closed the connection (it exited or crashed).
    Disconnected,
    /// The multiplexer refused the request.
    Refused {
        code: ErrorCode,
        message: String,
    },
    /// The multiplexer answered something that does not fit the request.
    Protocol(String),
    Io(io::Error),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Disconnected => write!(f, "disconnected from the multiplexer"),
            ControlError::Refused { code, message } => {
                write!(f, "the multiplexer refused: {message} ({code:?})")
            }
            ControlError::Protocol(m) => write!(f, "control protocol error: {m}"),
            ControlError::Io(e) => write!(f, "control socket: {e}"),
        }
    }
}

impl std::error::Error for ControlError {}

impl From<io::Error> for ControlError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::NotConnected => ControlError::Disconnected,
            _ => ControlError::Io(e),
        }
    }
}

impl From<ControlError> for io::Error {
    fn from(e: ControlError) -> Self {
        let kind = match &e {
            ControlError::Disconnected => io::ErrorKind::NotConnected,
            ControlError::Refused { code, .. } => match code {
                ErrorCode::NotPermitted => io::ErrorKind::PermissionDenied,
                ErrorCode::PortInUse => io::ErrorKind::AddrInUse,
                ErrorCode::NotOurAddress => io::ErrorKind::AddrNotAvailable,
                ErrorCode::NoSuchEndpoint | ErrorCode::NoSuchChannel => io::ErrorKind::NotFound,
                ErrorCode::BadRequest
                | ErrorCode::BadFilter
                | ErrorCode::BadSegment
                | ErrorCode::BadHandler => io::ErrorKind::InvalidInput,
                ErrorCode::NoPortsLeft | ErrorCode::Limit => io::ErrorKind::OutOfMemory,
                ErrorCode::Unavailable => io::ErrorKind::NotConnected,
            },
            ControlError::Protocol(_) => io::ErrorKind::InvalidData,
            ControlError::Io(e) => e.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// The host as the multiplexer describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostInfo {
    pub mac: [u8; 6],
    /// Addresses with their prefix lengths.
    pub addrs: Vec<(Ipv4Addr, u8)>,
    /// Largest frame the link carries, Ethernet header included.
    pub mtu: u32,
    /// Longest frame the link takes to send: beyond `mtu` only with TCP
    /// segmentation offload, for TCP super-segments (a whole TCP/IPv4 packet
    /// of up to 64 KB that the link cuts into segments that fit its MTU).
    pub max_send: u32,
}

/// An application's connection to the multiplexer.
///
/// Requests may be pipelined ([`Client::begin`]): the multiplexer answers a
/// connection's requests in the order they came, so the answers to begun
/// requests are taken in that order ([`Client::answer`]), and a request
/// that waits for its reply keeps those that come before it for `answer`.
pub struct Client {
    sock: SeqPacket,
    buf: Vec<u8>,
    /// Begun requests whose answers have not been read.
    in_flight: usize,
    /// Answers to begun requests, read before a later request's reply.
    early: VecDeque<Result<Reply, ControlError>>,
    /// Requests without a reply held back ([`Client::defer`]), encoded,
    /// and since when.
    deferred: Vec<Vec<u8>>,
    deferred_since: Option<Instant>,
    /// The descriptors that came with the last reply read.
    reply_fds: Vec<OwnedFd>,
}

/// An endpoint's direct send port, as the multiplexer hands it over.
#[derive(Debug)]
pub struct DirectPort {
    /// Whole frames are written here.
    pub fd: OwnedFd,
    /// What the kernel lets through: more is dropped.
    pub bytes_per_sec: u64,
    pub burst: u64,
}

/// How long a request waits for its reply before failing; the multiplexer
/// answers between two batches, so only a wedged one takes this long.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

impl Client {
    /// Connects to the daemon at `path` and checks the protocol version.
    pub fn connect(path: &Path) -> Result<Client, ControlError> {
        let sock = SeqPacket::connect(path).map_err(|e| {
            ControlError::Io(io::Error::new(
                e.kind(),
                format!("cannot reach the multiplexer at {}: {e}", path.display()),
            ))
        })?;
        Client::over(sock)
    }

    /// A client over an already connected socket.
    pub fn over(sock: SeqPacket) -> Result<Client, ControlError> {
        sock.set_read_timeout(Some(REPLY_TIMEOUT))?;
        let mut c = Client {
            sock,
            buf: vec![0; MAX_MESSAGE],
            in_flight: 0,
            early: VecDeque::new(),
            deferred: Vec::new(),
            deferred_since: None,
            reply_fds: Vec::new(),
        };
        match c.request(
            &Request::Hello {
                version: CONTROL_VERSION,
            },
            &[],
        )? {
            Reply::Hello { version } if version == CONTROL_VERSION => Ok(c),
            Reply::Hello { version } => Err(ControlError::Protocol(format!(
                "multiplexer speaks version {version}, we speak {CONTROL_VERSION}"
            ))),
            other => Err(unexpected(other)),
        }
    }

    /// Sends one request (with descriptors) and returns the reply; a
    /// refusal is [`ControlError::Refused`].
    pub fn request(
        &mut self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Reply, ControlError> {
        self.flush()?;
        self.sock.send(&req.encode(), fds)?;
        while self.in_flight > 0 {
            let early = self.reply(true).expect("a blocking read has an outcome");
            self.in_flight -= 1;
            self.early.push_back(early);
        }
        self.reply(true).expect("a blocking read has an outcome")
    }

    /// Sends a request without waiting for its reply, which
    /// [`answer`](Self::answer) gives, in the order the requests were begun.
    pub fn begin(&mut self, req: &Request) -> Result<(), ControlError> {
        self.deferred.push(req.encode());
        self.flush()?;
        self.in_flight += 1;
        Ok(())
    }

    /// The reply to the oldest begun request not yet answered: `None` if
    /// none is begun, or if its reply has not come and `wait` is false.
    pub fn answer(&mut self, wait: bool) -> Option<Result<Reply, ControlError>> {
        if let Some(r) = self.early.pop_front() {
            return Some(r);
        }
        if self.in_flight == 0 {
            return None;
        }
        let r = self.reply(wait)?;
        self.in_flight -= 1;
        Some(r)
    }

    /// Begun requests whose replies [`answer`](Self::answer) has not given.
    pub fn unanswered(&self) -> usize {
        self.in_flight + self.early.len()
    }

    /// Reads one reply; `None` if `block` is false and none has come.
    fn reply(&mut self, block: bool) -> Option<Result<Reply, ControlError>> {
        let got = if block {
            self.sock.recv(&mut self.buf)
        } else {
            self.sock.try_recv(&mut self.buf)
        };
        let n = match got {
            Ok((0, _)) => return Some(Err(ControlError::Disconnected)),
            Ok((n, fds)) => {
                self.reply_fds = fds;
                n
            }
            Err(e) if !block && e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) => return Some(Err(e.into())),
        };
        Some(
            match Reply::decode(&self.buf[..n]).map_err(|e| ControlError::Protocol(e.to_string())) {
                Ok(Reply::Error { code, message }) => Err(ControlError::Refused { code, message }),
                r => r,
            },
        )
    }

    pub fn info(&mut self) -> Result<HostInfo, ControlError> {
        match self.request(&Request::Info, &[])? {
            Reply::Info {
                mac,
                addrs,
                mtu,
                max_send,
            } => Ok(HostInfo {
                mac,
                addrs,
                mtu,
                max_send,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Creates a segment, has the multiplexer serve it, and returns the
    /// endpoint's id and the application's side of it.
    pub fn create_endpoint(
        &mut self,
        config: &SegmentConfig,
    ) -> Result<(u32, AppEndpoint), ControlError> {
        let seg = Segment::create(config).map_err(|e| ControlError::Io(io::Error::other(e)))?;
        let bells = Doorbells::new()?;
        let (app_rx, app_tx) = bells.app.fds();
        let (mux_rx, mux_tx) = bells.mux.fds();
        let fds = [seg.fd(), app_rx, app_tx, mux_rx, mux_tx];
        match self.request(&Request::CreateEndpoint, &fds)? {
            Reply::Endpoint { endpoint } => Ok((endpoint, seg.into_app(bells))),
            other => Err(unexpected(other)),
        }
    }

    /// Opens the endpoint's direct send port ([`Request::OpenDirect`]):
    /// the descriptor to write its connected TCP channels' frames to, and
    /// its rate and burst in bytes.
    pub fn open_direct(&mut self, endpoint: u32) -> Result<DirectPort, ControlError> {
        match self.request(&Request::OpenDirect { endpoint }, &[])? {
            Reply::Direct {
                bytes_per_sec,
                burst,
            } => match std::mem::take(&mut self.reply_fds).pop() {
                Some(fd) => Ok(DirectPort {
                    fd,
                    bytes_per_sec,
                    burst,
                }),
                None => Err(ControlError::Protocol(
                    "a direct send port's reply without its descriptor".into(),
                )),
            },
            other => Err(unexpected(other)),
        }
    }

    pub fn destroy_endpoint(&mut self, endpoint: u32) -> Result<(), ControlError> {
        self.expect_ok(&Request::DestroyEndpoint { endpoint })
    }

    /// Binds a UDP ([`PROTO_UDP`]), TCP ([`PROTO_TCP`]) or ICMP echo
    /// ([`PROTO_ICMP`], the port being the echo identifier) channel; returns
    /// the channel and the port (the one allocated when `local_port` is 0).
    pub fn bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> Result<(u32, u16), ControlError> {
        let req = bind_socket_request(endpoint, proto, local, remote);
        bound(self.request(&req, &[]))
    }

    /// Begins a [`bind_socket`](Self::bind_socket) whose answer
    /// [`bound_socket`](Self::bound_socket) gives, in the order of the
    /// requests begun.
    pub fn begin_bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> Result<(), ControlError> {
        self.begin(&bind_socket_request(endpoint, proto, local, remote))
    }

    /// The answer to the oldest begun request, a
    /// [`begin_bind_socket`](Self::begin_bind_socket): the channel and the
    /// port. `None` as for [`answer`](Self::answer).
    pub fn bound_socket(&mut self, wait: bool) -> Option<Result<(u32, u16), ControlError>> {
        self.answer(wait).map(bound)
    }

    /// Binds a channel to raw filters (DPF text; the channel receives what
    /// any of them accepts) and a transmit template.
    pub fn bind_channel(
        &mut self,
        endpoint: u32,
        filters: &[String],
        template: &[WireField],
    ) -> Result<u32, ControlError> {
        match self.request(
            &Request::BindChannel {
                endpoint,
                filters: filters.to_vec(),
                template: template.to_vec(),
            },
            &[],
        )? {
            Reply::Bound { channel, .. } => Ok(channel),
            other => Err(unexpected(other)),
        }
    }

    /// Installs a handler on one of our channels (replacing any it had):
    /// the module goes in a sealed memfd, the rest in the request.
    pub fn install_handler(
        &mut self,
        channel: u32,
        spec: &HandlerSpec,
    ) -> Result<(), ControlError> {
        if spec.module.len() > MAX_HANDLER_MODULE {
            return Err(ControlError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a handler module of {} bytes is over the limit of {MAX_HANDLER_MODULE}",
                    spec.module.len()
                ),
            )));
        }
        let blob = crate::blob_memfd(&spec.module)?;
        let req = Request::InstallHandler {
            channel,
            module_len: spec.module.len() as u32,
            spec: HandlerSpec {
                module: Vec::new(),
                ..spec.clone()
            },
        };
        match self.request(&req, &[blob.as_fd()])? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub fn remove_handler(&mut self, channel: u32) -> Result<(), ControlError> {
        self.expect_ok(&Request::RemoveHandler { channel })
    }

    /// Has the link answer the SYNs of TCP listener `channel` with SYN
    /// cookies ([`Request::AnswerSyns`]).
    pub fn answer_syns(&mut self, channel: u32, answers: &SynAnswers) -> Result<(), ControlError> {
        self.expect_ok(&Request::AnswerSyns {
            channel,
            answers: answers.clone(),
        })
    }

    pub fn unbind(&mut self, channel: u32) -> Result<(), ControlError> {
        self.expect_ok(&Request::Unbind { channel })
    }

    /// Unbinds without waiting: the multiplexer does it before any later
    /// request of this connection, and only counts a refusal. Deferred
    /// ([`defer`](Self::defer)).
    pub fn unbind_async(&mut self, channel: u32) -> Result<(), ControlError> {
        self.defer(&Request::Unbind { channel })
    }

    /// As [`post`](Self::post), but held back to go with the next request,
    /// in one system call and one wake-up of the multiplexer's control
    /// thread, or with [`flush`](Self::flush) (which the owner calls within
    /// a bound of its choosing: [`deferred_since`](Self::deferred_since)).
    pub fn defer(&mut self, req: &Request) -> Result<(), ControlError> {
        let bytes = encode_unanswered(req)?;
        self.deferred.push(bytes);
        self.deferred_since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Since when the oldest deferred request waits; `None` if none does.
    pub fn deferred_since(&self) -> Option<Instant> {
        self.deferred_since
    }

    /// Sends the deferred requests.
    pub fn flush(&mut self) -> Result<(), ControlError> {
        self.deferred_since = None;
        if self.deferred.is_empty() {
            return Ok(());
        }
        let r = self.sock.send_many(&self.deferred);
        self.deferred.clear();
        Ok(r?)
    }

    /// Sends a request the multiplexer does not answer
    /// ([`Request::may_go_unanswered`]; an `InvalidInput` error for another):
    /// it runs before any later request of this connection, and a refusal
    /// is only counted, in the multiplexer's "mux" record.
    pub fn post(&mut self, req: &Request) -> Result<(), ControlError> {
        let bytes = encode_unanswered(req)?;
        self.deferred.push(bytes);
        self.flush()
    }

    /// Holds a port for channels bound with raw filters (0: ephemeral).
    pub fn allocate_port(
        &mut self,
        endpoint: u32,
        proto: u8,
        port: u16,
    ) -> Result<u16, ControlError> {
        match self.request(
            &Request::AllocatePort {
                endpoint,
                proto,
                port,
            },
            &[],
        )? {
            Reply::Port { port } => Ok(port),
            other => Err(unexpected(other)),
        }
    }

    pub fn release_port(
        &mut self,
        endpoint: u32,
        proto: u8,
        port: u16,
    ) -> Result<(), ControlError> {
        self.expect_ok(&Request::ReleasePort {
            endpoint,
            proto,
            port,
        })
    }

    pub fn set_weight(&mut self, endpoint: u32, weight: u32) -> Result<(), ControlError> {
        self.expect_ok(&Request::SetWeight { endpoint, weight })
    }

    /// The MAC of `ip` if the multiplexer's ARP cache has it; otherwise it
    /// sends a request and this returns `None`: ask again shortly.
    pub fn resolve(&mut self, ip: Ipv4Addr) -> Result<Option<[u8; 6]>, ControlError> {
        match self.request(&Request::Resolve { ip }, &[])? {
            Reply::Mac(m) => Ok(m),
            other => Err(unexpected(other)),
        }
    }

    /// Every counter record, all pages.
    pub fn stats(&mut self) -> Result<Vec<Record>, ControlError> {
        let mut all = Vec::new();
        loop {
            match self.request(
                &Request::Stats {
                    from: all.len() as u32,
                },
                &[],
            )? {
                Reply::Stats { records, more } => {
                    let got = records.len();
                    all.extend(records);
                    if !more || got == 0 {
                        return Ok(all);
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Whether the multiplexer is still there.
    pub fn is_connected(&self) -> bool {
        !self.sock.peer_closed()
    }

    /// Sleeps until the endpoint has work (`ready`, re-checked after the
    /// wake-up flag is set), `timeout` passes, or the multiplexer goes away
    /// ([`ControlError::Disconnected`]). Returns whether there may be work.
    pub fn wait(
        &self,
        ep: &AppEndpoint,
        timeout: Option<Duration>,
        ready: impl FnOnce() -> bool,
    ) -> Result<bool, ControlError> {
        match ep
            .wake
            .sleep_or_hangup(timeout, Some(self.sock.as_fd()), ready)?
        {
            Wakeup::HangUp => Err(ControlError::Disconnected),
            Wakeup::Ready | Wakeup::Signaled => Ok(true),
            Wakeup::TimedOut => Ok(false),
        }
    }

    fn expect_ok(&mut self, req: &Request) -> Result<(), ControlError> {
        match self.request(req, &[])? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

/// The control socket, for a caller's own poll set (to notice the multiplexer
/// go while waiting on a doorbell, as [`Client::wait`] does).
impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// A request encoded with [`NO_REPLY`]; an `InvalidInput` error for one
/// that has a reply to wait for.
fn encode_unanswered(req: &Request) -> Result<Vec<u8>, ControlError> {
    req.encode_unanswered().ok_or_else(|| {
        ControlError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{req:?} has a reply to wait for"),
        ))
    })
}

fn bind_socket_request(
    endpoint: u32,
    proto: u8,
    local: (Ipv4Addr, u16),
    remote: Option<(Ipv4Addr, u16)>,
) -> Request {
    Request::BindSocket {
        endpoint,
        proto,
        local_addr: local.0,
        local_port: local.1,
        remote,
    }
}

/// A bind's channel and port.
fn bound(reply: Result<Reply, ControlError>) -> Result<(u32, u16), ControlError> {
    match reply? {
        Reply::Bound { channel, port } => Ok((channel, port)),
        other => Err(unexpected(other)),
    }
}

fn unexpected(r: Reply) -> ControlError {
    ControlError::Protocol(format!("unexpected reply {r:?}"))
}
