//! The control server and the daemon loop (DESIGN.md "Control";
//! Thekkath et al. §III-D, the registry server).
//!
//! A control thread accepts applications on a Unix `SOCK_SEQPACKET` socket,
//! learns each peer's uid from `SO_PEERCRED`, decodes requests and queues
//! them for the multiplexer thread, which runs them between two batches
//! ([`Daemon::run`]) and writes the answers on the application's socket
//! itself, so that a request costs a wake-up of each thread and no more.
//! A connection has at most [`MAX_QUEUED`] jobs queued; while it has that
//! many its socket is not read. Answers keep the order of the requests:
//! one the control thread makes (hello, a message that does not decode)
//! is queued behind the connection's jobs when it has any. An answer the
//! application's socket cannot take (it does not read them) cuts its
//! connection, which is then reclaimed. Nothing in a request is trusted: the
//! endpoint or channel it names must belong to the connection that sends
//! it, the segment is validated when mapped, the doorbells must be datagram
//! sockets, and each connection has limits. An application's endpoints,
//! channels and ports live as long as its connection: when the socket
//! closes (exit, crash, `kill -9`), the daemon reclaims all of it.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

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

/// Most jobs one connection has queued for the multiplexer thread: a
/// client may send requests ahead (unanswered ones, above all), but cannot
/// grow the queue beyond this.
pub const MAX_QUEUED: u32 = 4;

/// What both threads hold of one connection.
struct ConnShared {
    /// Read by the control thread, answered by the multiplexer thread.
    sock: SeqPacket,
    /// Jobs of this connection queued and not yet done.
    queued: AtomicU32,
    /// Set by the multiplexer thread when the socket took no more answers:
    /// the connection is being closed.
    cut: AtomicBool,
}

impl ConnShared {
    /// Writes an answer without blocking; an application whose socket
    /// cannot take it (it does not read its answers) is marked cut, and
    /// false says so. Any other failure is a peer gone: `Err`.
    fn send_answer(&self, reply: &Reply) -> io::Result<bool> {
        match self.sock.send(&reply.encode(), &[]) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.cut.store(true, Ordering::Release);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

struct Job {
    conn: u64,
    shared: Arc<ConnShared>,
    kind: JobKind,
}

enum JobKind {
    Request {
        cred: PeerCred,
        req: Request,
        fds: Vec<OwnedFd>,
        /// Whether the application waits for the answer.
        answer: bool,
    },
    /// An answer the control thread made, due after the connection's
    /// queued jobs.
    Reply(Reply),
    Closed,
}

/// The control thread's end of the job queue.
struct Jobs {
    tx: mpsc::Sender<Job>,
    /// Jobs sent and not yet taken; the multiplexer looks at it before it
    /// sleeps.
    pending: Arc<AtomicUsize>,
    /// Set while the multiplexer thread sleeps (or is about to): only then
    /// does a job ring its doorbell.
    sleeping: Arc<AtomicBool>,
    bell: Arc<Doorbell>,
}

impl Jobs {
    fn send(&self, job: Job) {
        // SeqCst pairs with `Daemon::run`: either it sees the job pending,
        // or this sees it sleeping and rings.
        self.pending.fetch_add(1, Ordering::SeqCst);
        // Fails only when the multiplexer thread is gone: nobody to serve.
        let _ = self.tx.send(job);
        if self.sleeping.load(Ordering::SeqCst) {
            let _ = self.bell.signal();
        }
    }
}

/// What one connection holds.
#[derive(Default)]
struct Holdings {
    pid: i32,
    endpoints: Vec<EndpointId>,
    channels: usize,
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
    jobs: mpsc::Receiver<Job>,
    /// See [`Jobs`].
    pending: Arc<AtomicUsize>,
    sleeping: Arc<AtomicBool>,
    /// Rung by the control thread after queueing a job while we sleep,
    /// and by a stop.
    bell: Arc<Doorbell>,
    /// Rung for the control thread when a connection that had
    /// [`MAX_QUEUED`] jobs may be read again.
    control_bell: Arc<Doorbell>,
    stop: StopHandle,
    conns: HashMap<u64, Holdings>,
    /// Unanswered requests refused: only counted, as nobody waits to hear.
    unanswered_refused: u64,
    /// Connections cut because their socket took no more answers (counted
    /// when reclaimed).
    connections_cut: u64,
    control: Option<JoinHandle<()>>,
}

impl Daemon {
    /// Listens on `config.socket` (replacing a stale socket file, refusing
    /// a live one) and starts the control thread.
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
        let bell = Arc::new(Doorbell::new()?);
        let stop = StopHandle {
            stop: Arc::new(AtomicBool::new(false)),
            bell: bell.clone(),
        };
        let control_bell = Arc::new(Doorbell::new()?);
        let (tx, jobs) = mpsc::channel();
        let queue = Jobs {
            tx,
            pending: Arc::new(AtomicUsize::new(0)),
            sleeping: Arc::new(AtomicBool::new(false)),
            bell: bell.clone(),
        };
        let (pending, sleeping) = (queue.pending.clone(), queue.sleeping.clone());
        let thread_stop = stop.clone();
        let thread_bell = control_bell.clone();
        let limits = (config.max_connections, config.max_connections_per_uid);
        let control = std::thread::Builder::new()
            .name("exonet-control".into())
            .spawn(move || {
                // The slow path must not preempt the fast one: an
                // application's request wakes this thread on the sender's
                // CPU, and a normal thread preempted the application there
                // (in a connections-per-second run, ~13% of the client's
                // time went to the switch). SCHED_BATCH wakes without
                // preempting. Should it be refused, the thread runs as it is.
                let param = libc::sched_param { sched_priority: 0 };
                // SAFETY: sched_setscheduler reads `param`; pid 0 is this thread.
                unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
                control_loop(listener, queue, thread_bell, thread_stop, limits)
            })?;
        Ok(Daemon {
            mux,
            config,
            jobs,
            pending,
            sleeping,
            bell,
            control_bell,
            stop,
            conns: HashMap::new(),
            unanswered_refused: 0,
            connections_cut: 0,
            control: Some(control),
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
    /// on the link, the endpoints' doorbells and the control queue for at
    /// most `run.latency`.
    pub fn run(&mut self) -> io::Result<()> {
        let mut idle = Idle::new(self.config.run);
        while !self.stop.stopped() {
            let work = self.serve_jobs() + self.mux.poll()?;
            if self.mux.take_woken() {
                std::thread::yield_now();
            }
            if !idle.should_sleep(work) {
                continue;
            }
            // The control thread rings only while this is set; a job it
            // queued before it could see the flag is seen pending here.
            self.sleeping.store(true, Ordering::SeqCst);
            if self.pending.load(Ordering::SeqCst) == 0 {
                let bell = self.bell.clone();
                if self
                    .mux
                    .wait_also(self.config.run.latency, &[bell.as_fd()])?
                {
                    // Jobs are taken from the queue, not counted by rings.
                    let _ = bell.drain();
                }
            }
            self.sleeping.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Runs every queued job; returns how many.
    pub fn serve_jobs(&mut self) -> usize {
        let mut n = 0;
        while let Ok(job) = self.jobs.try_recv() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            n += 1;
            self.serve(job);
        }
        n
    }

    fn serve(&mut self, job: Job) {
        let shared = job.shared;
        let reply = match job.kind {
            JobKind::Closed => {
                self.connections_cut += u64::from(shared.cut.load(Ordering::Acquire));
                return self.reclaim(job.conn);
            }
            // A cut connection's remaining requests are not run: it is
            // about to be reclaimed, and nobody would hear the answers.
            _ if shared.cut.load(Ordering::Acquire) => None,
            JobKind::Reply(r) => Some(r),
            JobKind::Request {
                cred,
                req,
                fds,
                answer,
            } => match (self.execute(job.conn, cred, req, fds), answer) {
                (Ok(r), true) => Some(r),
                (Err((code, message)), true) => Some(Reply::Error { code, message }),
                (Ok(_), false) => None,
                (Err(_), false) => {
                    self.unanswered_refused += 1;
                    None
                }
            },
        };
        if let Some(r) = reply {
            self.answer(&shared, &r);
        }
        // The control thread stopped reading a connection with its fill of
        // jobs; it learns of room only by this ring.
        if shared.queued.fetch_sub(1, Ordering::AcqRel) == MAX_QUEUED {
            let _ = self.control_bell.signal();
        }
    }

    /// Writes an answer without blocking. A socket that cannot take it (the
    /// application does not read its answers) is cut: the application reads
    /// end of stream, and the control thread closes it. Any other failure
    /// is a peer gone, which the control thread sees by itself.
    fn answer(&self, shared: &ConnShared, reply: &Reply) {
        if let Ok(false) = shared.send_answer(reply) {
            // Wakes the control thread's poll on this socket, and keeps
            // the application from sending more.
            let _ = shared.sock.shutdown();
            let _ = self.control_bell.signal();
        }
    }

    /// Everything a closed connection held goes back.
    fn reclaim(&mut self, conn: u64) {
        if let Some(h) = self.conns.remove(&conn) {
            for ep in h.endpoints {
                // Present unless already destroyed, which removed it here.
                let _ = self.mux.remove_endpoint(ep);
            }
        }
    }

    fn owned(&self, conn: u64, endpoint: u32) -> Result<EndpointId, (ErrorCode, String)> {
        let ep = EndpointId(endpoint);
        match self.conns.get(&conn) {
            Some(h) if h.endpoints.contains(&ep) => Ok(ep),
            _ => Err((
                ErrorCode::NoSuchEndpoint,
                format!("no endpoint {endpoint} on this connection"),
            )),
        }
    }

    /// The endpoint, if the connection owns it and may bind one more
    /// channel.
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
        let holdings = self.conns.entry(conn).or_insert_with(|| Holdings {
            pid: cred.pid,
            ..Holdings::default()
        });
        let (n_endpoints, n_channels) = (holdings.endpoints.len(), holdings.channels);
        if !matches!(
            req,
            Request::CreateEndpoint | Request::InstallHandler { .. }
        ) && !fds.is_empty()
        {
            return Err(bad("descriptors on a request that takes none"));
        }
        match req {
            // Answered by the control thread.
            Request::Hello { .. } => Ok(Reply::Hello {
                version: CONTROL_VERSION,
            }),
            Request::Info => Ok(Reply::Info {
                mac: self.mux.mac(),
                addrs: self.config.prefixes.clone(),
                mtu: self.mux.link().max_frame_len() as u32,
            }),
            Request::CreateEndpoint => {
                if n_endpoints >= self.config.max_endpoints {
                    return Err((ErrorCode::Limit, "too many endpoints".into()));
                }
                let ep = self.open_endpoint(fds)?;
                let id = self.mux.add_endpoint(ep, cred.uid, cred.uid == 0);
                self.holdings(conn).endpoints.push(id);
                Ok(Reply::Endpoint { endpoint: id.0 })
            }
            Request::DestroyEndpoint { endpoint } => {
                let ep = self.owned(conn, endpoint)?;
                let channels = self.mux.channels_of(ep).len();
                self.mux.remove_endpoint(ep).map_err(refused)?;
                let h = self.holdings(conn);
                h.endpoints.retain(|&e| e != ep);
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

    fn holdings(&mut self, conn: u64) -> &mut Holdings {
        self.conns.entry(conn).or_default()
    }

    /// Maps a segment sent by an application: the memfd and the two ends
    /// of both doorbells.
    fn open_endpoint(
        &self,
        fds: Vec<OwnedFd>,
    ) -> Result<exonet_shm::MuxEndpoint, (ErrorCode, String)> {
        let Ok([memfd, app_rx, app_tx, mux_rx, mux_tx]) = <[OwnedFd; 5]>::try_from(fds) else {
            return Err((
                ErrorCode::BadSegment,
                "an endpoint takes five descriptors: memfd and two doorbells".into(),
            ));
        };
        let seg_err = |e: &dyn std::fmt::Display| (ErrorCode::BadSegment, e.to_string());
        let seg = Segment::open(memfd).map_err(|e| seg_err(&e))?;
        if seg.layout().segment_size() > self.config.max_segment_bytes {
            return Err((
                ErrorCode::Limit,
                format!(
                    "segment of {} bytes; at most {}",
                    seg.layout().segment_size(),
                    self.config.max_segment_bytes
                ),
            ));
        }
        let bells = Doorbells {
            app: Doorbell::from_fds(app_rx, app_tx).map_err(|e| seg_err(&e))?,
            mux: Doorbell::from_fds(mux_rx, mux_tx).map_err(|e| seg_err(&e))?,
        };
        Ok(seg.into_mux(bells))
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
                    (
                        "control_queued",
                        self.pending.load(Ordering::Relaxed) as u64,
                    ),
                    ("unanswered_refused", self.unanswered_refused),
                    ("connections_cut", self.connections_cut),
                ]),
            },
        ];
        for e in &s.endpoints {
            let pid = self
                .conns
                .values()
                .find(|h| h.endpoints.contains(&e.id))
                .map_or(0, |h| h.pid);
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
        self.stop.stop();
        if let Some(t) = self.control.take() {
            let _ = t.join();
        }
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
        ("tx_frames", l.tx_frames),
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

struct Conn {
    id: u64,
    shared: Arc<ConnShared>,
    cred: PeerCred,
    hello: bool,
}

fn pollin(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// The control thread: accepts, reads requests and hands them to the
/// multiplexer thread, which answers them. Every socket is non-blocking,
/// so no application can stall it by not reading; a connection with
/// [`MAX_QUEUED`] jobs is not read until the multiplexer rings `wake`.
fn control_loop(
    listener: SeqListener,
    jobs: Jobs,
    wake: Arc<Doorbell>,
    stop: StopHandle,
    (max_connections, max_per_uid): (usize, usize),
) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut next = 0u64;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut fds = Vec::new();
    // Which connection each pollfd after the first two is.
    let mut polled = Vec::new();
    while !stop.stopped() {
        fds.clear();
        polled.clear();
        fds.push(pollin(listener.as_raw_fd()));
        fds.push(pollin(wake.as_fd().as_raw_fd()));
        for (i, c) in conns.iter().enumerate() {
            if c.shared.queued.load(Ordering::Acquire) < MAX_QUEUED
                || c.shared.cut.load(Ordering::Acquire)
            {
                fds.push(pollin(c.shared.sock.as_raw_fd()));
                polled.push(i);
            }
        }
        // SAFETY: `fds` is a live array of `fds.len()` pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        if r <= 0 {
            continue;
        }
        if fds[1].revents != 0 {
            // Rings only say "look again", which the next round does.
            let _ = wake.drain();
        }
        let mut closed = Vec::new();
        for (p, &i) in fds[2..].iter().zip(&polled) {
            if p.revents == 0 {
                continue;
            }
            let c = &mut conns[i];
            if !serve_conn(c, &mut buf, &jobs) {
                closed.push(i);
            }
        }
        // Highest index first, so that the others stay put.
        for i in closed.into_iter().rev() {
            let c = conns.swap_remove(i);
            // After the connection's queued jobs, by the queue's order.
            jobs.send(Job {
                conn: c.id,
                shared: c.shared,
                kind: JobKind::Closed,
            });
        }
        if fds[0].revents != 0 {
            while let Ok(sock) = listener.accept() {
                let Ok(cred) = sock.peer_cred() else { continue };
                let of_uid = conns.iter().filter(|c| c.cred.uid == cred.uid).count();
                // Refused by closing: the application reads end of stream.
                if conns.len() >= max_connections
                    || (cred.uid != 0 && of_uid >= max_per_uid)
                    || sock.set_nonblocking(true).is_err()
                {
                    continue;
                }
                conns.push(Conn {
                    id: next,
                    shared: Arc::new(ConnShared {
                        sock,
                        queued: AtomicU32::new(0),
                        cut: AtomicBool::new(false),
                    }),
                    cred,
                    hello: false,
                });
                next += 1;
            }
        }
    }
    // Dropping `conns` (and the multiplexer dropping its jobs) closes every
    // connection: applications see "disconnected".
}

/// Reads one request and queues it, or answers it here; false when the
/// connection is to be closed (the peer hung up, broke the protocol at the
/// socket level, or was cut).
fn serve_conn(c: &mut Conn, buf: &mut [u8], jobs: &Jobs) -> bool {
    if c.shared.cut.load(Ordering::Acquire) {
        return false;
    }
    let (n, fds) = match c.shared.sock.recv(buf) {
        Ok((0, _)) => return false,
        Ok(x) => x,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            // Cut message or too many descriptors: refuse, keep serving.
            return answer(
                c,
                jobs,
                bad_reply("message too long or too many descriptors"),
            );
        }
        Err(_) => return false,
    };
    let reply = match Request::decode(&buf[..n]) {
        Err(e) => bad_reply(&e.to_string()),
        Ok((Request::Hello { .. }, _)) => {
            c.hello = true;
            Reply::Hello {
                version: CONTROL_VERSION,
            }
        }
        Ok(_) if !c.hello => bad_reply("say hello first"),
        Ok((req, answer)) => {
            queue(
                c,
                jobs,
                JobKind::Request {
                    cred: c.cred,
                    req,
                    fds,
                    answer,
                },
            );
            return true;
        }
    };
    answer(c, jobs, reply)
}

fn queue(c: &Conn, jobs: &Jobs, kind: JobKind) {
    c.shared.queued.fetch_add(1, Ordering::AcqRel);
    jobs.send(Job {
        conn: c.id,
        shared: c.shared.clone(),
        kind,
    });
}

fn bad_reply(why: &str) -> Reply {
    Reply::Error {
        code: ErrorCode::BadRequest,
        message: why.to_string(),
    }
}

/// Sends an answer made by this thread after those of the connection's
/// queued jobs: now if it has none (each job's answer is written before
/// the job stops counting), else queued behind them. False when the
/// connection is to be closed: the peer is gone, or its socket cannot take
/// the answer (it does not read them), which cuts it as the multiplexer
/// would.
fn answer(c: &Conn, jobs: &Jobs, reply: Reply) -> bool {
    if c.shared.queued.load(Ordering::Acquire) == 0 {
        matches!(c.shared.send_answer(&reply), Ok(true))
    } else {
        queue(c, jobs, JobKind::Reply(reply));
        true
    }
}
