//! The control server and the daemon loop (DESIGN.md "Control";
//! Thekkath et al. §III-D, the registry server).
//!
//! Applications connect on a Unix `SOCK_SEQPACKET` socket; each peer's uid
//! comes from `SO_PEERCRED`. The multiplexer's own thread serves the
//! requests between two batches ([`Daemon::run`]): an epoll set of the
//! listener and every connection is looked at every few rounds of its loop
//! (every round once it idles), and is part of what it sleeps on. A request
//! thus costs no wake-up while the loop spins, and one when it sleeps. It
//! was a thread of its own until measured: each bind then woke that thread
//! as well, and a connection binds two channels (the client's next, bound
//! ahead, and the server's accepted one); served here, connections a second
//! through two daemons rose by 12-17% (interleaved pairs). The control path
//! stays the slow path: at most [`REQUESTS_PER_ROUND`] requests of one
//! connection are served in a round, so that no client holds the
//! multiplexer from its frames or from other clients, and a client's
//! requests are answered in the order sent. An answer the application's
//! socket cannot take (it does not read them) cuts its connection, which
//! is then reclaimed. Nothing in a request is trusted: the endpoint or
//! channel it names must belong to the connection that sends it, the
//! segment is validated when mapped, the doorbells must be datagram
//! sockets, and each connection has limits. An application's endpoints,
//! channels and ports live as long as its connection: when the socket
//! closes (exit, crash, `kill -9`), the daemon reclaims all of it.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exonet_dpf::Filter;
use exonet_shm::control::{
    ErrorCode, PeerCred, Record, Reply, Request, SeqListener, SeqPacket, CONTROL_VERSION,
    MAX_MESSAGE, STATS_PAGE,
};
use exonet_shm::{read_blob, Doorbell, Doorbells, Segment};

use crate::{ChannelId, ChannelSpec, EndpointId, Idle, Mux, MuxError, Proto, RunConfig, Template};

/// How the daemon serves its socket.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub socket: PathBuf,
    /// File mode of the socket: who may connect (the registry decides what
    /// each may do).
    pub mode: u32,
    /// The host's addresses with their prefix lengths, as told to
    /// applications.
    pub prefixes: Vec<(Ipv4Addr, u8)>,
    pub run: RunConfig,
    /// Most endpoints one connection may hold.
    pub max_endpoints: usize,
    /// Most channels one connection may hold.
    pub max_channels: usize,
    /// Largest segment the daemon maps for one endpoint.
    pub max_segment_bytes: u64,
    /// Most segment bytes mapped at once for the endpoints of one uid other
    /// than root's: the daemon faults each accepted segment in, and those
    /// pages are its own, so without a budget one user's applications could
    /// make it take `max_connections_per_uid` × `max_endpoints` ×
    /// `max_segment_bytes`.
    pub max_segment_bytes_per_uid: u64,
    /// Most connections at once.
    pub max_connections: usize,
    /// Most connections at once from one uid other than root's, so that
    /// one user cannot take every connection.
    pub max_connections_per_uid: usize,
}

impl DaemonConfig {
    pub fn new(socket: PathBuf, prefixes: Vec<(Ipv4Addr, u8)>) -> DaemonConfig {
        DaemonConfig {
            socket,
            mode: 0o666,
            prefixes,
            run: RunConfig::default(),
            max_endpoints: 64,
            max_channels: 4096,
            max_segment_bytes: 1 << 30,
            max_segment_bytes_per_uid: 2 << 30,
            max_connections: 1024,
            max_connections_per_uid: 64,
        }
    }
}

/// Stops a running [`Daemon`] from another thread (or a signal handler's
/// thread).
#[derive(Clone)]
pub struct StopHandle {
    stop: Arc<AtomicBool>,
    bell: Arc<Doorbell>,
}

impl StopHandle {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Ringing cannot block; failing only delays the stop by one
        // latency bound.
        let _ = self.bell.signal();
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Most requests of one connection served in one round of the loop: a
/// client may send requests ahead (unanswered ones, above all), but cannot
/// hold the multiplexer from its frames or from other clients. The rest
/// wait in its socket, whose buffer bounds what it can send ahead.
pub const REQUESTS_PER_ROUND: u32 = 4;

/// Longest wait of a request for a look at the control sockets while the
/// loop runs. A look is a system call: in every eighth round, it was 4% of
/// a daemon's time in a bulk transfer; in every yielding round of an idle
/// spin, it kept an application woken on the daemon's CPU waiting for it
/// (a ping-pong through two daemons: round trips 22.4 -> 20.4 us without).
const CONTROL_EVERY: Duration = Duration::from_micros(20);

/// Rounds between two clock reads for [`CONTROL_EVERY`]: read in every
/// round, the clock was 5% of a daemon's time in a connections-per-second
/// run.
const CLOCK_EVERY: u32 = 8;

/// The epoll token of the listening socket; a connection's is its id.
const LISTENER: u64 = u64::MAX;

/// Most ready sockets taken from epoll at once; the rest stay ready
/// (level-triggered) for the next look.
const READY_AT_ONCE: usize = 64;

/// One application's connection, and what it holds.
struct Conn {
    sock: SeqPacket,
    cred: PeerCred,
    /// It said hello: other requests are served.
    hello: bool,
    /// Its endpoints, each with the size of its segment.
    endpoints: BTreeMap<EndpointId, u64>,
    channels: usize,
}

/// The listener and the connections' sockets in one epoll set, so that a
/// look at all of them is one system call, and a sleep can wait on them
/// with the link. Level-triggered: a socket with requests left after a
/// round is ready again at the next look.
struct Sockets {
    epoll: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Sockets {
    fn new() -> io::Result<Sockets> {
        // SAFETY: epoll_create1 takes no pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let events = vec![libc::epoll_event { events: 0, u64: 0 }; READY_AT_ONCE];
        Ok(Sockets { epoll, events })
    }

    fn add(&self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: both descriptors are live; `ev` is read during the call.
        let r = unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut ev,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The tokens of the ready sockets, without waiting.
    fn ready(&mut self, tokens: &mut Vec<u64>) {
        tokens.clear();
        // SAFETY: `events` is a live array of READY_AT_ONCE entries, which
        // the kernel fills at most.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                self.events.as_mut_ptr(),
                READY_AT_ONCE as libc::c_int,
                0,
            )
        };
        // An error (EINTR) is as nothing ready: the next look sees it.
        let n = usize::try_from(n).unwrap_or(0);
        tokens.extend(self.events[..n].iter().map(|e| e.u64));
    }
}

/// A daemon running on its own thread ([`Daemon::spawn`]).
pub struct Running {
    stop: StopHandle,
    socket: PathBuf,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl Running {
    /// The control socket's path, for [`exonet_shm::control::Client::connect`].
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops the daemon and returns how its loop ended.
    pub fn stop(mut self) -> io::Result<()> {
        self.halt()
    }

    fn halt(&mut self) -> io::Result<()> {
        self.stop.stop();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(io::Error::other("the multiplexer thread panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// The multiplexer serving applications over its control socket.
pub struct Daemon {
    mux: Mux,
    config: DaemonConfig,
    listener: SeqListener,
    sockets: Sockets,
    /// Tokens of ready sockets, kept to spare an allocation per look.
    ready: Vec<u64>,
    /// One request's bytes.
    buf: Vec<u8>,
    /// Rung by a stop, to end a sleep.
    bell: Arc<Doorbell>,
    stop: StopHandle,
    conns: HashMap<u64, Conn>,
    next_conn: u64,
    /// Unanswered requests refused: only counted, as nobody waits to hear.
    unanswered_refused: u64,
    /// Connections cut because their socket took no more answers.
    connections_cut: u64,
    /// A descriptor the reply being made carries ([`Request::OpenDirect`]).
    reply_fd: Option<OwnedFd>,
}

impl Daemon {
    /// Listens on `config.socket` (replacing a stale socket file, refusing
    /// a live one).
    pub fn bind(mux: Mux, config: DaemonConfig) -> io::Result<Daemon> {
        if let Some(dir) = config.socket.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        let listener = SeqListener::bind(&config.socket)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&config.socket, std::fs::Permissions::from_mode(config.mode))?;
        }
        listener.set_nonblocking(true)?;
        let sockets = Sockets::new()?;
        sockets.add(listener.as_fd(), LISTENER)?;
        let bell = Arc::new(Doorbell::new()?);
        let stop = StopHandle {
            stop: Arc::new(AtomicBool::new(false)),
            bell: bell.clone(),
        };
        Ok(Daemon {
            mux,
            config,
            listener,
            sockets,
            ready: Vec::with_capacity(READY_AT_ONCE),
            buf: vec![0u8; MAX_MESSAGE],
            bell,
            stop,
            conns: HashMap::new(),
            next_conn: 0,
            unanswered_refused: 0,
            reply_fd: None,
            connections_cut: 0,
        })
    }

    /// Binds and runs the daemon on a thread of its own; the multiplexer is
    /// made on that thread (a link need not be `Send` once open). Stopped and
    /// joined when the returned handle drops.
    pub fn spawn(
        make_mux: impl FnOnce() -> io::Result<Mux> + Send + 'static,
        config: DaemonConfig,
    ) -> io::Result<Running> {
        let socket = config.socket.clone();
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("exonet-mux".into())
            .spawn(move || {
                let daemon = make_mux().and_then(|mux| Daemon::bind(mux, config));
                let mut d = match daemon {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return Ok(());
                    }
                };
                let _ = tx.send(Ok(d.stop_handle()));
                d.run()
            })?;
        let stop = rx
            .recv()
            .map_err(|_| io::Error::other("the multiplexer thread died while starting"))??;
        Ok(Running {
            stop,
            socket,
            thread: Some(thread),
        })
    }

    pub fn mux(&self) -> &Mux {
        &self.mux
    }

    pub fn mux_mut(&mut self) -> &mut Mux {
        &mut self.mux
    }

    pub fn socket(&self) -> &Path {
        &self.config.socket
    }

    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Runs the multiplexer and serves requests until stopped: busy-polls
    /// while there is work, and after `run.idle_spins` empty rounds sleeps
    /// on the link, the endpoints' doorbells and the control sockets for at
    /// most `run.latency`.
    pub fn run(&mut self) -> io::Result<()> {
        let mut idle = Idle::new(self.config.run);
        let mut looked: Option<Instant> = None;
        let mut rounds = 0u32;
        while !self.stop.stopped() {
            let mut work = 0;
            rounds = rounds.wrapping_add(1);
            let look = ((idle.yielding() || rounds.is_multiple_of(CLOCK_EVERY))
                && looked.is_none_or(|t| t.elapsed() >= CONTROL_EVERY))
                || looked.is_none();
            if look {
                looked = Some(Instant::now());
                work += self.serve_control();
            }
            work += self.mux.poll()?;
            if self.mux.take_woken() {
                std::thread::yield_now();
            }
            if !idle.should_sleep(work) {
                continue;
            }
            let extra = [self.bell.as_fd(), self.sockets.epoll.as_fd()];
            if self.mux.wait_also(self.config.run.latency, &extra)? {
                // A stop is seen by its flag, not counted by rings.
                let _ = self.bell.drain();
            }
            // Whatever woke the loop, the sockets are looked at first.
            looked = None;
        }
        Ok(())
    }

    /// Accepts new connections and serves the requests that have come, at
    /// most [`REQUESTS_PER_ROUND`] of each connection; returns how many.
    fn serve_control(&mut self) -> usize {
        let mut ready = std::mem::take(&mut self.ready);
        self.sockets.ready(&mut ready);
        let mut served = 0;
        for &token in &ready {
            if token == LISTENER {
                self.accept();
            } else {
                served += self.serve_conn(token);
            }
        }
        self.ready = ready;
        served
    }

    /// Takes the connections waiting on the listener. One past the limits
    /// is refused by closing it: the application reads end of stream.
    fn accept(&mut self) {
        while let Ok(sock) = self.listener.accept() {
            let Ok(cred) = sock.peer_cred() else { continue };
            let of_uid = self
                .conns
                .values()
                .filter(|c| c.cred.uid == cred.uid)
                .count();
            if self.conns.len() >= self.config.max_connections
                || (cred.uid != 0 && of_uid >= self.config.max_connections_per_uid)
                || sock.set_nonblocking(true).is_err()
            {
                continue;
            }
            let id = self.next_conn;
            self.next_conn += 1;
            if self.sockets.add(sock.as_fd(), id).is_err() {
                continue;
            }
            self.conns.insert(
                id,
                Conn {
                    sock,
                    cred,
                    hello: false,
                    endpoints: BTreeMap::new(),
                    channels: 0,
                },
            );
        }
    }

    /// Serves up to [`REQUESTS_PER_ROUND`] requests of connection `id`,
    /// closing it if its peer hung up, broke the protocol at the socket
    /// level, or was cut; returns how many.
    fn serve_conn(&mut self, id: u64) -> usize {
        let mut served = 0;
        while served < REQUESTS_PER_ROUND as usize {
            let Some(c) = self.conns.get(&id) else {
                return served;
            };
            let open = match c.sock.recv(&mut self.buf) {
                Ok((0, _)) => false,
                Ok((n, fds)) => self.serve_request(id, n, fds),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return served,
                // Cut message or too many descriptors: refused, and served on.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    self.answer(id, &bad_reply("message too long or too many descriptors"))
                }
                Err(_) => false,
            };
            if !open {
                self.close(id);
                return served + 1;
            }
            served += 1;
        }
        served
    }

    /// Runs the request in the first `n` bytes of the buffer, and answers
    /// it unless it asked for no answer; false when the connection is to
    /// be closed.
    fn serve_request(&mut self, id: u64, n: usize, fds: Vec<OwnedFd>) -> bool {
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        let reply = match Request::decode(&self.buf[..n]) {
            Err(e) => Some(bad_reply(&e.to_string())),
            Ok((Request::Hello { .. }, _)) => {
                c.hello = true;
                Some(Reply::Hello {
                    version: CONTROL_VERSION,
                })
            }
            Ok(_) if !c.hello => Some(bad_reply("say hello first")),
            Ok((req, answer)) => {
                let cred = c.cred;
                match (self.execute(id, cred, req, fds), answer) {
                    (Ok(r), true) => Some(r),
                    (Err((code, message)), true) => Some(Reply::Error { code, message }),
                    (Ok(_), false) => None,
                    (Err(_), false) => {
                        self.unanswered_refused += 1;
                        None
                    }
                }
            }
        };
        let open = reply.is_none_or(|r| self.answer(id, &r));
        // Unsent (no answer asked for, or a refusal) it is closed here.
        self.reply_fd = None;
        open
    }

    /// Writes an answer without blocking; false when the connection is to
    /// be closed: the peer is gone, or its socket cannot take the answer
    /// (it does not read them), which cuts it.
    fn answer(&mut self, id: u64, reply: &Reply) -> bool {
        let Some(c) = self.conns.get(&id) else {
            return false;
        };
        let fds: &[BorrowedFd<'_>] = match (&self.reply_fd, reply) {
            (Some(fd), Reply::Direct { .. }) => &[fd.as_fd()],
            _ => &[],
        };
        match c.sock.send(&reply.encode(), fds) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.connections_cut += 1;
                false
            }
            Err(_) => false,
        }
    }

    /// Closes connection `id` (the application reads the answers already
    /// sent, then end of stream), and everything it held goes back.
    fn close(&mut self, id: u64) {
        // Closing the socket takes it out of the epoll set.
        if let Some(c) = self.conns.remove(&id) {
            for ep in c.endpoints.into_keys() {
                // Present unless already destroyed, which removed it here.
                let _ = self.mux.remove_endpoint(ep);
            }
        }
    }

    fn owned(&self, conn: u64, endpoint: u32) -> Result<EndpointId, (ErrorCode, String)> {
        let ep = EndpointId(endpoint);
        match self.conns.get(&conn) {
            Some(h) if h.endpoints.contains_key(&ep) => Ok(ep),
            _ => Err((
                ErrorCode::NoSuchEndpoint,
                format!("no endpoint {endpoint} on this connection"),
            )),
        }
    }

    /// A channel of one of this connection's endpoints.
    fn owned_channel(&self, conn: u64, channel: u32) -> Result<ChannelId, (ErrorCode, String)> {
        let ch = ChannelId(channel);
        match self.mux.channel_owner(ch) {
            Some(ep) if self.owned(conn, ep.0).is_ok() => Ok(ch),
            _ => Err((
                ErrorCode::NoSuchChannel,
                format!("no channel {channel} on this connection"),
            )),
        }
    }

    /// The endpoint, if the connection owns it and may bind one more
    /// channel.
    fn channel_room(
        &self,
        conn: u64,
        endpoint: u32,
        channels: usize,
    ) -> Result<EndpointId, (ErrorCode, String)> {
        let ep = self.owned(conn, endpoint)?;
        if channels >= self.config.max_channels {
            return Err((ErrorCode::Limit, "too many channels".into()));
        }
        Ok(ep)
    }

    fn execute(
        &mut self,
        conn: u64,
        cred: PeerCred,
        req: Request,
        fds: Vec<OwnedFd>,
    ) -> Result<Reply, (ErrorCode, String)> {
        let (n_endpoints, n_channels) = self
            .conns
            .get(&conn)
            .map_or((0, 0), |c| (c.endpoints.len(), c.channels));
        if !matches!(
            req,
            Request::CreateEndpoint | Request::InstallHandler { .. }
        ) && !fds.is_empty()
        {
            return Err(bad("descriptors on a request that takes none"));
        }
        match req {
            // Answered in `serve_request`, before anything runs here.
            Request::Hello { .. } => Ok(Reply::Hello {
                version: CONTROL_VERSION,
            }),
            Request::Info => Ok(Reply::Info {
                mac: self.mux.mac(),
                addrs: self.config.prefixes.clone(),
                mtu: self.mux.link().max_frame_len() as u32,
                max_send: self.mux.link().max_send_len() as u32,
            }),
            Request::CreateEndpoint => {
                if n_endpoints >= self.config.max_endpoints {
                    return Err((ErrorCode::Limit, "too many endpoints".into()));
                }
                let (ep, bytes) = self.open_endpoint(fds, self.segment_room(cred.uid))?;
                let id = self.mux.add_endpoint(ep, cred.uid, cred.uid == 0);
                self.holdings(conn).endpoints.insert(id, bytes);
                Ok(Reply::Endpoint { endpoint: id.0 })
            }
            Request::DestroyEndpoint { endpoint } => {
                let ep = self.owned(conn, endpoint)?;
                let channels = self.mux.channels_of(ep).len();
                self.mux.remove_endpoint(ep).map_err(refused)?;
                let h = self.holdings(conn);
                h.endpoints.remove(&ep);
                h.channels = h.channels.saturating_sub(channels);
                Ok(Reply::Ok)
            }
            Request::BindSocket {
                endpoint,
                proto,
                local_addr,
                local_port,
                remote,
            } => {
                let ep = self.channel_room(conn, endpoint, n_channels)?;
                let proto = proto_of(proto)?;
                let (ch, port) = self
                    .mux
                    .bind_socket(
                        ep,
                        ChannelSpec {
                            proto,
                            local_addr,
                            local_port,
                            remote,
                        },
                    )
                    .map_err(refused)?;
                self.holdings(conn).channels += 1;
                Ok(Reply::Bound {
                    channel: ch.0,
                    port,
                })
            }
            Request::BindChannel {
                endpoint,
                filters,
                template,
            } => {
                let ep = self.channel_room(conn, endpoint, n_channels)?;
                let filters = filters
                    .iter()
                    .map(|f| Filter::from_str(f))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| (ErrorCode::BadFilter, format!("filter: {e}")))?;
                let template = template.iter().fold(Template::new(), |t, f| {
                    t.masked(f.offset as usize, &f.bytes, &f.mask)
                });
                let ch = self
                    .mux
                    .bind_channel(ep, &filters, template)
                    .map_err(refused)?;
                self.holdings(conn).channels += 1;
                Ok(Reply::Bound {
                    channel: ch.0,
                    port: 0,
                })
            }
            Request::InstallHandler {
                channel,
                module_len,
                spec,
            } => {
                let ch = self.owned_channel(conn, channel)?;
                let [fd] = <[OwnedFd; 1]>::try_from(fds).map_err(|_| {
                    bad("a handler install carries one descriptor: the module's memfd")
                })?;
                let module = read_blob(&fd, module_len as usize)
                    .map_err(|e| (ErrorCode::BadHandler, format!("handler module: {e}")))?;
                self.mux
                    .install_handler(ch, &spec, &module)
                    .map_err(refused)?;
                Ok(Reply::Ok)
            }
            Request::RemoveHandler { channel } => {
                let ch = self.owned_channel(conn, channel)?;
                self.mux.set_handler(ch, None).map_err(refused)?;
                Ok(Reply::Ok)
            }
            Request::AnswerSyns { channel, answers } => {
                let ch = self.owned_channel(conn, channel)?;
                self.mux.answer_syns(ch, &answers).map_err(refused)?;
                Ok(Reply::Ok)
            }
            Request::OpenDirect { endpoint } => {
                let ep = self.owned(conn, endpoint)?;
                let (fd, rate) = self.mux.open_direct(ep).map_err(refused)?;
                self.reply_fd = Some(fd);
                Ok(Reply::Direct {
                    bytes_per_sec: rate.bytes_per_sec,
                    burst: rate.burst,
                })
            }
            Request::Unbind { channel } => {
                let ch = self.owned_channel(conn, channel)?;
                self.mux.unbind_channel(ch).map_err(refused)?;
                let h = self.holdings(conn);
                h.channels = h.channels.saturating_sub(1);
                Ok(Reply::Ok)
            }
            Request::AllocatePort {
                endpoint,
                proto,
                port,
            } => {
                let ep = self.owned(conn, endpoint)?;
                let port = self
                    .mux
                    .allocate_port(ep, proto_of(proto)?, port)
                    .map_err(refused)?;
                Ok(Reply::Port { port })
            }
            Request::ReleasePort {
                endpoint,
                proto,
                port,
            } => {
                let ep = self.owned(conn, endpoint)?;
                if self.mux.release_port(ep, proto_of(proto)?, port) {
                    Ok(Reply::Ok)
                } else {
                    Err((ErrorCode::NotPermitted, format!("port {port} is not held")))
                }
            }
            Request::SetWeight { endpoint, weight } => {
                let ep = self.owned(conn, endpoint)?;
                // A weight is a share of the link taken from the others:
                // policy, so root's alone.
                if cred.uid != 0 && weight != 1 {
                    return Err((
                        ErrorCode::NotPermitted,
                        "only root sets transmit weights".into(),
                    ));
                }
                self.mux.set_weight(ep, weight).map_err(refused)?;
                Ok(Reply::Ok)
            }
            Request::Resolve { ip } => match self.mux.resolve(ip) {
                Ok(mac) => Ok(Reply::Mac(mac)),
                Err(e) => Err((ErrorCode::Unavailable, format!("ARP request: {e}"))),
            },
            Request::Stats { from } => {
                let all = self.records();
                let from = (from as usize).min(all.len());
                let to = (from + STATS_PAGE).min(all.len());
                Ok(Reply::Stats {
                    more: to < all.len(),
                    records: all[from..to].to_vec(),
                })
            }
        }
    }

    /// What connection `conn` holds: only asked of a live one, which
    /// `execute` serves.
    fn holdings(&mut self, conn: u64) -> &mut Conn {
        self.conns
            .get_mut(&conn)
            .expect("a served connection is live")
    }

    /// The largest segment `uid` may have mapped now: the limit per segment,
    /// and for all but root what is left of the uid's budget.
    fn segment_room(&self, uid: u32) -> (u64, &'static str) {
        let one = (self.config.max_segment_bytes, "");
        if uid == 0 {
            return one;
        }
        let held: u64 = self
            .conns
            .values()
            .filter(|c| c.cred.uid == uid)
            .flat_map(|c| c.endpoints.values())
            .sum();
        let left = self.config.max_segment_bytes_per_uid.saturating_sub(held);
        if left < one.0 {
            (left, " left of this user's budget")
        } else {
            one
        }
    }

    /// Maps a segment sent by an application (the memfd and the two ends of
    /// both doorbells) if it is at most `room.0` bytes (`room.1` says whose
    /// limit that is); returns it with its size.
    fn open_endpoint(
        &self,
        fds: Vec<OwnedFd>,
        room: (u64, &str),
    ) -> Result<(exonet_shm::MuxEndpoint, u64), (ErrorCode, String)> {
        let Ok([memfd, app_rx, app_tx, mux_rx, mux_tx]) = <[OwnedFd; 5]>::try_from(fds) else {
            return Err((
                ErrorCode::BadSegment,
                "an endpoint takes five descriptors: memfd and two doorbells".into(),
            ));
        };
        let seg_err = |e: &dyn std::fmt::Display| (ErrorCode::BadSegment, e.to_string());
        let seg = Segment::open(memfd).map_err(|e| seg_err(&e))?;
        let bytes = seg.layout().segment_size();
        if bytes > room.0 {
            return Err((
                ErrorCode::Limit,
                format!("segment of {bytes} bytes; at most {}{}", room.0, room.1),
            ));
        }
        let bells = Doorbells {
            app: Doorbell::from_fds(app_rx, app_tx).map_err(|e| seg_err(&e))?,
            mux: Doorbell::from_fds(mux_rx, mux_tx).map_err(|e| seg_err(&e))?,
        };
        // Accepted: its pages are faulted in off the loop.
        seg.populate_elsewhere();
        Ok((seg.into_mux(bells), bytes))
    }

    /// Every counter as records: the link, the host, the multiplexer, each
    /// endpoint (labelled with its owner) and each channel (with its
    /// filter).
    pub fn records(&self) -> Vec<Record> {
        let s = self.mux.stats();
        let mut out = vec![
            Record {
                kind: "link".into(),
                id: 0,
                label: String::new(),
                fields: link_fields(&s.link),
            },
            Record {
                kind: "host".into(),
                id: 0,
                label: self
                    .config
                    .prefixes
                    .iter()
                    .map(|(a, l)| format!("{a}/{l}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                fields: named(s.host.fields()),
            },
            Record {
                kind: "frag".into(),
                id: 0,
                label: String::new(),
                fields: named(s.frag.fields()),
            },
            Record {
                kind: "mux".into(),
                id: 0,
                label: String::new(),
                fields: named(vec![
                    ("rx_unmatched", s.rx_unmatched),
                    ("rx_truncated", s.rx_truncated),
                    ("connections", self.conns.len() as u64),
                    ("unanswered_refused", self.unanswered_refused),
                    ("connections_cut", self.connections_cut),
                ]),
            },
        ];
        for e in &s.endpoints {
            let pid = self
                .conns
                .values()
                .find(|h| h.endpoints.contains_key(&e.id))
                .map_or(0, |c| c.cred.pid);
            let mut fields = named(vec![
                ("uid", e.uid as u64),
                ("pid", pid as u64),
                ("privileged", e.privileged as u64),
                ("weight", e.weight as u64),
                ("channels", e.channels.len() as u64),
            ]);
            fields.extend(named(e.stats.fields()));
            out.push(Record {
                kind: "endpoint".into(),
                id: e.id.0,
                label: format!("uid {} pid {pid}", e.uid),
                fields,
            });
        }
        for c in &s.channels {
            let mut fields = named(vec![
                ("endpoint", c.endpoint.0 as u64),
                ("handler", c.has_handler as u64),
            ]);
            fields.extend(named(c.stats.fields()));
            let mut label = c.filter.clone();
            if label.len() > 1000 {
                let mut cut = 1000;
                while !label.is_char_boundary(cut) {
                    cut -= 1;
                }
                label.truncate(cut);
                label.push('…');
            }
            out.push(Record {
                kind: "channel".into(),
                id: c.id.0,
                label,
                fields,
            });
        }
        out
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config.socket);
    }
}

fn named(v: Vec<(&'static str, u64)>) -> Vec<(String, u64)> {
    v.into_iter().map(|(n, x)| (n.to_string(), x)).collect()
}

fn link_fields(l: &exonet_link::LinkStats) -> Vec<(String, u64)> {
    named(vec![
        ("rx_frames", l.rx_frames),
        ("rx_bytes", l.rx_bytes),
        ("rx_dropped", l.rx_dropped),
        ("rx_csum_completed", l.rx_csum_completed),
        ("rx_super", l.rx_super),
        ("tx_frames", l.tx_frames),
        ("tx_super", l.tx_super),
        ("tx_bytes", l.tx_bytes),
        ("tx_dropped", l.tx_dropped),
        ("syns_answered", l.syns_answered),
    ])
}

fn bad(why: &str) -> (ErrorCode, String) {
    (ErrorCode::BadRequest, why.to_string())
}

pub(crate) fn proto_of(n: u8) -> Result<Proto, (ErrorCode, String)> {
    Proto::from_number(n).ok_or_else(|| {
        bad("the registry allocates UDP and TCP ports and ICMP echo identifiers only")
    })
}

pub(crate) fn refused(e: MuxError) -> (ErrorCode, String) {
    let code = match &e {
        MuxError::NoSuchEndpoint(_) => ErrorCode::NoSuchEndpoint,
        MuxError::NoSuchChannel(_) => ErrorCode::NoSuchChannel,
        MuxError::Filter(_) => ErrorCode::BadFilter,
        MuxError::NotPermitted(_) => ErrorCode::NotPermitted,
        MuxError::PortInUse { .. } | MuxError::InTimeWait { .. } => ErrorCode::PortInUse,
        MuxError::NoPortsLeft(_) => ErrorCode::NoPortsLeft,
        MuxError::NotOurAddress(_) => ErrorCode::NotOurAddress,
        MuxError::BadHandler(_) => ErrorCode::BadHandler,
        MuxError::Link(_) => ErrorCode::Unavailable,
    };
    (code, e.to_string())
}

fn bad_reply(why: &str) -> Reply {
    Reply::Error {
        code: ErrorCode::BadRequest,
        message: why.to_string(),
    }
}
