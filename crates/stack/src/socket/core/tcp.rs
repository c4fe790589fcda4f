//! TCP over the endpoint: the sans-IO [`Connection`]s of this stack, their
//! listeners, timers and frames.
//!
//! Every connection has a channel of its own at the multiplexer, bound to its
//! 4-tuple (Thekkath §III-D: the registry knows each connection, so it can reset
//! them if the application dies). A listener's channel takes the SYNs; a
//! connection it accepts lives in the listener's SYN queue (sending on the
//! listener's channel) until its handshake completes, and only then binds a
//! channel: a SYN flood costs a bounded queue, never channels. That bind is
//! not waited for: the connection is ready for `accept` at once and sends on
//! the listener's channel until the answer comes (the multiplexer follows
//! such segments on the connection's channel once it is bound). A client that
//! connects to the same peer again has the channel of its next connection
//! bound ahead, so only its first connect waits for a bind. Once the SYN
//! queue is full, SYNs are answered with SYN cookies (RFC 4987 §3.6,
//! [`TcpConfig::syn_cookies`]) and cost nothing: an ACK that returns a valid
//! cookie makes the connection straight into the accept queue. A listener
//! with [`TcpConfig::link_syn_cookies`] has the link answer every SYN it can
//! with the same cookies (AF_XDP's XDP program, under this stack's key and
//! clock), so only the ACK wakes the application. Segments are matched to
//! connections by 4-tuple whatever channel brought them.
//!
//! Segments received in one pump are all given to their connections before any
//! answers, so a batch of data gets one ACK. Timers are a heap of deadlines,
//! checked lazily: a connection's entry is replaced only when its deadline moves
//! earlier, and a stale one costs an early look.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use exonet_shm::control::{SynAnswers, PROTO_TCP};
use exonet_shm::{Desc, Part, INLINE_MAX};
use exonet_wire::ipv4::protocol;
use exonet_wire::tcp::flags;
use exonet_wire::{Ipv4Repr, TcpPacket, TcpRepr, WireError};

use super::{segment_bytes_mut, write_eth, Held, Inner, Kind, Sock, ETH_LEN, IP_LEN};
use crate::ipv4_rx::{DstKind, Ipv4Datagram};
use crate::tcp::{
    initial_sequence_number, reset_for_closed, syn_ack_shape, syn_cookie_accept, syn_cookie_reply,
    timestamp_offset, Connection, Pieces, TcpConfig, TcpError, TcpState, SYN_COOKIE_LIFETIME,
    TS_OPTION_LEN,
};
use crate::time::{earlier, Time};

/// Linux's `tcp_synack_retries`: a SYN-ACK is sent 6 times at most, so a
/// half-open connection leaves the SYN queue within about a minute.
const SYNACK_RETRIES: u32 = 5;
/// The IPv4 and TCP headers without options (RFC 9293 §3.7.1: MSS = MTU − 40).
const TCP_IP_HEADERS: usize = 40;
/// The longest TCP header (RFC 9293 §3.1: a data offset of 15 words).
const TCP_MAX_HEADER: usize = 60;
/// Most binds begun and not answered: the multiplexer's answers wait in
/// the control socket, which takes a few hundred, and a daemon cuts an
/// application whose socket takes no more.
const MAX_AHEAD: usize = 32;
/// How long an unbind may wait for a request to go with.
const UNBIND_DEFER: Duration = Duration::from_millis(1);
/// Longest segment written to the direct send port: requests, answers and
/// ACKs. A full-sized segment is bulk, which the daemon sends faster from
/// its own CPU than the application would through the kernel's whole send
/// path in its own thread (a prototype that sent every segment directly
/// moved 1 GB a third slower).
const DIRECT_MAX: usize = 1024;

/// Counters of TCP input and of the connections of a stack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpSocketStats {
    /// Segments given to a connection or listener.
    pub segments: u64,
    /// Segments whose checksum failed (dropped).
    pub bad_checksum: u64,
    /// Segments whose checksum the multiplexer said was good already
    /// ([`Desc::CSUM_OK`]: verified below, or computed by the link), not
    /// verified again.
    pub checksums_offloaded: u64,
    /// Segments too short for their header, or not to a unicast address of ours.
    pub malformed: u64,
    /// RSTs sent for segments that found no connection (RFC 9293 §3.10.7.1).
    pub resets_sent: u64,
    /// SYNs dropped because the listener's SYN queue was full and it sends no
    /// SYN cookies.
    pub syn_dropped: u64,
    /// SYN-ACKs with a SYN cookie, sent for SYNs that found the SYN queue full.
    pub syn_cookies_sent: u64,
    /// ACKs whose cookie was valid: connections made by them (or dropped, as
    /// `accept_overflow`, when the accept queue was full).
    pub syn_cookies_accepted: u64,
    /// ACKs to a listener that had sent cookies lately, matching no connection
    /// and carrying no valid cookie (answered with a RST).
    pub syn_cookies_rejected: u64,
    /// Handshake-completing ACKs dropped because the accept queue was full (the
    /// peer sends them again).
    pub accept_overflow: u64,
    /// Connections opened by `connect`.
    pub connects: u64,
    /// Of those, the ones whose channel was bound ahead (a connect to the
    /// peer of the connect before): no wait for the multiplexer.
    pub connects_bound_ahead: u64,
    /// Connections whose handshake completed at a listener.
    pub accepts: u64,
    /// Connections that ended in a reset, a refusal or a timeout.
    pub failed: u64,
    /// Connections in the stack now (closing ones included).
    pub open: usize,
    /// Slots of the send area lent now (connections sending by reference, and
    /// gone ones whose last chains the multiplexer has not completed).
    pub send_slots: usize,
    /// Segments sent again, over all connections so far.
    pub retransmitted: u64,
    /// Retransmission timeouts, over all connections so far.
    pub timeouts: u64,
    /// Fast retransmits, over all connections so far.
    pub fast_retransmits: u64,
    /// Segments RACK marked lost (RFC 8985 §6), over all connections so far.
    pub rack_losses: u64,
    /// Slow starts ended by HyStart++ rather than a loss, over all connections so
    /// far ([`crate::tcp::TcpStats::hystart_exits`]).
    pub hystart_exits: u64,
}

/// A TCP socket: a listener or a connection.
pub(crate) enum TcpSock {
    Listener(Box<Listener>),
    Conn(Box<Conn>),
}

pub(crate) struct Listener {
    /// Connections whose handshake completed, not yet accepted.
    pub ready: VecDeque<usize>,
    /// The most `ready` holds; also the bound of the SYN queue.
    backlog: usize,
    /// Connections in the SYN queue.
    embryos: usize,
    /// When the listener last sent a SYN cookie: ACKs are checked for one only
    /// within [`SYN_COOKIE_LIFETIME`] of it, so that a guess has fewer chances.
    cookie_sent: Option<Time>,
    /// The link answers its SYNs with cookies ([`TcpConfig::link_syn_cookies`]):
    /// any ACK may return one.
    link_answers: bool,
    config: TcpConfig,
}

pub(crate) struct Conn {
    pub conn: Connection,
    /// The listener whose SYN queue holds it, until the handshake completes.
    listener: Option<usize>,
    /// The application closed its socket: it goes once the connection is done.
    orphan: bool,
    /// `shutdown(Read)`: what arrives is discarded.
    read_shut: bool,
    /// `shutdown(Write)` or a close: writes fail.
    write_shut: bool,
    send_buffer: usize,
    /// The deadline this connection has in the timer heap.
    armed: Option<Time>,
    /// On the list of connections to answer at the end of the pump.
    dirty: bool,
    /// Data segments taken since the connection last sent.
    unanswered: u32,
    /// The end (reset, timeout) was handed to the socket.
    ended: bool,
    /// The send area's slot its send buffer is in.
    slot: Option<usize>,
    /// `TcpTable::tuples` maps its 4-tuple (the socket's local and peer) to it.
    tupled: bool,
    /// Accepted, and its own channel's bind not begun yet
    /// ([`lazy_bind`](crate::StackConfig::lazy_bind)) or not answered: it
    /// sends on its listener's channel meanwhile.
    promoting: bool,
}

impl Conn {
    fn new(conn: Connection, listener: Option<usize>, send_buffer: usize) -> Conn {
        Conn {
            conn,
            listener,
            orphan: false,
            read_shut: false,
            write_shut: false,
            send_buffer,
            armed: None,
            dirty: false,
            unanswered: 0,
            ended: false,
            slot: None,
            tupled: false,
            promoting: false,
        }
    }

    /// The descriptor flags of its next segment: [`Desc::QUIET`] once the
    /// application has closed it, it is accepted (out of its listener's
    /// queues: an embryo's segments only ever go on the listener's channel)
    /// and only its end is left to hear ([`Connection::winding_down`]). Sent
    /// on the listener's channel while its own is being bound, the flag
    /// quiets its own channel once bound, not the listener's. The peer's
    /// last ACKs then wait in the rx ring for the application's next wake-up
    /// instead of causing one: nobody waits for them, and until they come
    /// the retransmission timer of our FIN bounds the wait (after them, the
    /// FIN-WAIT-2 timeout). The peer's FIN waits too, but for at most the
    /// multiplexer's `QUIET_FIN_WAKE`, as the peer waits for its ACK: a
    /// server that closed first is nearly always woken sooner by its next
    /// request.
    fn tx_flags(&self) -> u32 {
        let quiet = self.orphan && self.listener.is_none() && self.conn.winding_down();
        if quiet {
            Desc::QUIET
        } else {
            0
        }
    }

    pub fn readable(&self) -> bool {
        self.conn.recv_queue_len() > 0
            || self.conn.recv_finished()
            || self.read_shut
            || self.conn.state() == TcpState::Closed
    }

    pub fn writable(&self) -> bool {
        matches!(
            self.conn.state(),
            TcpState::Established | TcpState::CloseWait
        ) && !self.write_shut
            && self.conn.send_room() > 0
    }
}

/// Where a connection's segments go: the same for each of a flush.
struct Route {
    channel: u32,
    local: SocketAddrV4,
    dst: std::net::Ipv4Addr,
    ttl: u8,
    /// `None` while the neighbour is being resolved.
    mac: Option<[u8; 6]>,
    mtu: usize,
}

/// The TCP state of a stack beside its sockets.
pub(crate) struct TcpTable {
    /// The secret of RFC 6528 ISNs and RFC 7323 timestamp offsets.
    key: [u8; 16],
    /// Connections by (local, remote).
    tuples: HashMap<(SocketAddrV4, SocketAddrV4), usize>,
    timers: BinaryHeap<Reverse<(Time, usize)>>,
    /// Connections to answer at the end of the pump.
    dirty: Vec<usize>,
    /// Channels to unbind once the multiplexer has taken the frames sent before
    /// (so a final RST or ACK goes out on the channel it was sent on): the
    /// channel and the count of frames pushed by then.
    unbinds: Vec<(u32, u64)>,
    /// When unbinds held back by the multiplexer's client must be sent.
    unbinds_until: Option<Time>,
    stats: TcpSocketStats,
    /// What a connection is opened with unless the call says otherwise.
    pub config: TcpConfig,
    /// Binds begun and not yet answered, in the order begun (the
    /// multiplexer's answers come in that order).
    ahead: VecDeque<Ahead>,
    /// The channel of the next connect to a peer, bound ahead.
    spare: Option<Spare>,
    /// The (local address, peer) of the last connect: a second connect to the
    /// same peer has a spare bound for the one after.
    last_connect: Option<(Ipv4Addr, SocketAddrV4)>,
    /// Numbers the spares, so that an answer finds its own.
    spares: u64,
    /// Promotions among `ahead`.
    promotions: usize,
    /// Connections accepted through a daemon that have no own channel yet,
    /// with their 4-tuple, by when they ask for it
    /// ([`lazy_bind`](crate::StackConfig::lazy_bind)).
    lazy: VecDeque<(Time, usize, SocketAddrV4, SocketAddrV4)>,
}

/// A bind begun without waiting for its answer.
enum Ahead {
    /// The own channel of connection `id`, accepted with this 4-tuple.
    Promotion {
        id: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    },
    /// Spare number `n`.
    Spare(u64),
}

/// A channel on an ephemeral port to `remote`, for the next connect there.
struct Spare {
    n: u64,
    ip: Ipv4Addr,
    remote: SocketAddrV4,
    /// `None` until the answer is taken.
    bound: Option<io::Result<(u32, u16)>>,
}

impl TcpTable {
    pub fn new(config: TcpConfig) -> io::Result<TcpTable> {
        let mut key = [0u8; 16];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
        Ok(TcpTable {
            key,
            tuples: HashMap::new(),
            timers: BinaryHeap::new(),
            dirty: Vec::new(),
            unbinds: Vec::new(),
            unbinds_until: None,
            stats: TcpSocketStats::default(),
            config,
            ahead: VecDeque::new(),
            spare: None,
            last_connect: None,
            spares: 0,
            promotions: 0,
            lazy: VecDeque::new(),
        })
    }

    pub fn next_deadline(&self) -> Option<Time> {
        let timer = self.timers.peek().map(|Reverse((t, _))| *t);
        earlier(timer, self.unbinds_until)
    }
}

fn conn_in(sockets: &mut [Option<Sock>], id: usize) -> Option<&mut Conn> {
    match sockets.get_mut(id)?.as_mut()?.tcp.as_mut()? {
        TcpSock::Conn(c) => Some(c),
        TcpSock::Listener(_) => None,
    }
}

fn listener_in(sockets: &mut [Option<Sock>], id: usize) -> Option<&mut Listener> {
    match sockets.get_mut(id)?.as_mut()?.tcp.as_mut()? {
        TcpSock::Listener(l) => Some(l),
        TcpSock::Conn(_) => None,
    }
}

/// The error a connection's end gives its socket.
fn end_error(e: TcpError) -> io::ErrorKind {
    match e {
        TcpError::Refused => io::ErrorKind::ConnectionRefused,
        TcpError::Reset => io::ErrorKind::ConnectionReset,
        TcpError::TimedOut => io::ErrorKind::TimedOut,
    }
}

impl Inner {
    /// Fits a connection's settings to its path and to this endpoint: the MSS
    /// to the path's MTU, and the receive buffer, so the window, to what the
    /// endpoint's receive buffers hold in full segments. With a larger window
    /// a sender may have more in flight than the multiplexer can hand over
    /// while the application is away from its stack, and the rest is dropped
    /// at the endpoint: a 1 MB flight into 512 buffers lost 1,326 segments
    /// and ended in retransmission timeouts.
    fn fit(&self, config: &mut TcpConfig, mtu: usize) {
        let most = mtu
            .saturating_sub(TCP_IP_HEADERS)
            .clamp(48, usize::from(u16::MAX));
        config.mss = config.mss.min(most as u16);
        // A peer's full segment carries our MSS less its timestamps.
        let per_buffer = usize::from(config.mss).saturating_sub(TS_OPTION_LEN);
        let held = self.rx_buffers * per_buffer.max(1);
        config.recv_buffer = config.recv_buffer.min(held);
        config.recv_buffer_max = config.recv_buffer_max.min(held);
    }

    pub fn conn(&self, id: usize) -> Option<&Conn> {
        match self.sock_opt(id)?.tcp.as_ref()? {
            TcpSock::Conn(c) => Some(c),
            TcpSock::Listener(_) => None,
        }
    }

    pub fn conn_mut(&mut self, id: usize) -> Option<&mut Conn> {
        conn_in(&mut self.sockets, id)
    }

    /// What connections are opened with unless the call says otherwise.
    pub fn tcp_config(&self) -> TcpConfig {
        self.tcp.config.clone()
    }

    /// The counters, with the connections' own summed in.
    pub(super) fn tcp_stats(&self) -> TcpSocketStats {
        let mut s = self.tcp.stats.clone();
        for c in self
            .sockets
            .iter()
            .flatten()
            .filter_map(|s| match s.tcp.as_ref() {
                Some(TcpSock::Conn(c)) => Some(c),
                _ => None,
            })
        {
            let st = c.conn.stats();
            s.open += 1;
            s.retransmitted += st.retransmitted;
            s.timeouts += st.timeouts;
            s.fast_retransmits += st.fast_retransmits;
            s.rack_losses += st.rack_losses;
            s.hystart_exits += st.hystart_exits;
        }
        s.send_slots = self.send_area.in_use();
        s
    }

    /// Opens a listener on `local` (port 0: ephemeral).
    pub fn tcp_listen(
        &mut self,
        local: SocketAddrV4,
        backlog: usize,
        config: TcpConfig,
    ) -> io::Result<usize> {
        let ip = self.bind_ip(*local.ip());
        let taken = self.sockets.iter().flatten().any(|s| {
            matches!(s.tcp.as_ref(), Some(TcpSock::Listener(_)))
                && s.local.port() == local.port()
                && *s.local.ip() == ip
        });
        if local.port() != 0 && taken {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{ip}:{} has a listener of this stack", local.port()),
            ));
        }
        let (channel, port) =
            self.control()
                .bind_socket(self.endpoint, PROTO_TCP, (ip, local.port()), None)?;
        let mut s = Sock::new(Kind::Tcp, channel, SocketAddrV4::new(ip, port));
        // Cookies carry window scaling and SACK in timestamps only.
        let link_answers = config.link_syn_cookies && config.timestamps && {
            let mut c = config.clone();
            self.fit(&mut c, self.mtu);
            syn_ack_shape(&c).is_some_and(|(window, wscale, sack)| {
                let answers = SynAnswers {
                    key: self.tcp.key,
                    epoch: self.epoch,
                    mss: c.mss,
                    window,
                    wscale,
                    sack,
                    ttl: s.ttl,
                };
                // A link that cannot leaves the SYNs to the listener, as without.
                self.control().answer_syns(channel, &answers).is_ok()
            })
        };
        s.tcp = Some(TcpSock::Listener(Box::new(Listener {
            ready: VecDeque::new(),
            backlog: backlog.max(1),
            embryos: 0,
            cookie_sent: None,
            link_answers,
            config,
        })));
        Ok(self.add_socket(s))
    }

    /// Active OPEN (RFC 9293 §3.10.1): binds a channel for the connection on an
    /// ephemeral port and sends the SYN.
    pub fn tcp_connect(&mut self, remote: SocketAddrV4, config: TcpConfig) -> io::Result<usize> {
        let now = self.now();
        self.clock = now;
        let dst = *remote.ip();
        if remote.port() == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot connect to port 0",
            ));
        }
        // Refuses what cannot be reached and starts resolving the neighbour.
        self.next_hop(dst, false, now)?;
        let ip = self.on_link(dst).map_or(self.info.addrs[0].0, |(a, _)| a);
        let (channel, port) = self.tcp_connect_channel(ip, remote)?;
        let local = SocketAddrV4::new(ip, port);
        let mut config = config;
        let mtu = self.path_mtu(dst, now);
        self.fit(&mut config, mtu);
        let send_buffer = config.send_buffer;
        let iss = initial_sequence_number(&self.tcp.key, local, remote, now);
        let conn = Connection::connect(config, local, remote, iss)
            .with_timestamp_offset(timestamp_offset(&self.tcp.key, local, remote));
        let mut s = Sock::new(Kind::Tcp, channel, local);
        s.peer = Some(remote);
        s.tcp = Some(TcpSock::Conn(Box::new(Conn::new(conn, None, send_buffer))));
        let id = self.add_socket(s);
        self.tcp_file(local, remote, id);
        self.tcp.stats.connects += 1;
        self.tcp_after(id, now);
        Ok(id)
    }

    /// A channel on an ephemeral port for a connection from `ip` to `remote`:
    /// the spare bound ahead for it, if there is one, else one bound now. A
    /// second connect in a row to the same peer begins a spare for the next.
    fn tcp_connect_channel(
        &mut self,
        ip: Ipv4Addr,
        remote: SocketAddrV4,
    ) -> io::Result<(u32, u16)> {
        let peer = Some((*remote.ip(), remote.port()));
        let spare = match self.tcp.spare.take() {
            Some(s) if s.ip == ip && s.remote == remote => match s.bound {
                Some(r) => Some(r),
                None => {
                    // Begun long ago, as a rule: answered by now.
                    self.tcp.spare = Some(s);
                    self.tcp_take_bound(true);
                    self.tcp.spare.take().and_then(|s| s.bound)
                }
            },
            other => {
                // For another peer: given back (an unanswered one is, on its
                // answer, as it is no longer the spare).
                if let Some(Some(Ok((ch, _)))) = other.map(|s| s.bound) {
                    self.tcp_unbind_later(ch);
                }
                None
            }
        };
        let bound = match spare {
            Some(Ok(b)) => {
                self.tcp.stats.connects_bound_ahead += 1;
                b
            }
            // A refused spare: bound now, and the refusal, if it stands, said
            // by that bind.
            Some(Err(_)) | None => {
                self.control()
                    .bind_socket(self.endpoint, PROTO_TCP, (ip, 0), peer)?
            }
        };
        if self.tcp.last_connect == Some((ip, remote)) {
            let n = self.tcp.spares;
            self.tcp.spares += 1;
            if self
                .tcp_begin_bind((ip, 0), remote, Ahead::Spare(n))
                .is_ok()
            {
                self.tcp.spare = Some(Spare {
                    n,
                    ip,
                    remote,
                    bound: None,
                });
                if self.in_process {
                    self.tcp_take_bound(false);
                }
            }
        }
        self.tcp.last_connect = Some((ip, remote));
        Ok(bound)
    }

    /// Begins the bind of a connection channel from `local` to `remote`,
    /// whose answer `ahead` names. At most [`MAX_AHEAD`] are begun and not
    /// answered: past that, the answers are waited for first.
    fn tcp_begin_bind(
        &mut self,
        local: (Ipv4Addr, u16),
        remote: SocketAddrV4,
        ahead: Ahead,
    ) -> io::Result<()> {
        if self.tcp.ahead.len() >= MAX_AHEAD {
            self.tcp_take_bound(true);
        }
        self.control().begin_bind_socket(
            self.endpoint,
            PROTO_TCP,
            local,
            Some((*remote.ip(), remote.port())),
        )?;
        self.tcp.promotions += usize::from(matches!(ahead, Ahead::Promotion { .. }));
        self.tcp.ahead.push_back(ahead);
        Ok(())
    }

    /// Takes the answers to binds begun ahead that have come (with `wait`,
    /// waits for all of them).
    pub(super) fn tcp_take_bound(&mut self, wait: bool) {
        while !self.tcp.ahead.is_empty() {
            let Some(answer) = self.control().bound_socket(wait) else {
                return;
            };
            match self.tcp.ahead.pop_front().expect("checked above") {
                Ahead::Promotion { id, local, remote } => {
                    self.tcp.promotions -= 1;
                    self.tcp_promoted(id, local, remote, answer)
                }
                Ahead::Spare(n) => match self.tcp.spare.as_mut() {
                    Some(s) if s.n == n => s.bound = Some(answer),
                    _ => {
                        if let Ok((ch, _)) = answer {
                            self.tcp_unbind_later(ch);
                        }
                    }
                },
            }
        }
    }

    /// Whether connections wait for the answers to their own channels'
    /// binds (a spare's is only wanted at the next connect).
    pub(super) fn tcp_promotions_ahead(&self) -> bool {
        self.tcp.promotions > 0
    }

    /// Whether a connecting socket is done: `Ok` once synchronized, the error if
    /// it failed, `None` while the handshake goes on. A neighbour that did not
    /// answer ARP within `give_up` of `started` fails it as Linux does
    /// (EHOSTUNREACH), instead of the SYN retrying for a minute.
    pub fn tcp_connected(
        &mut self,
        id: usize,
        started: Instant,
        give_up: Duration,
    ) -> Option<io::Result<()>> {
        if let Some(e) = self.sock_mut(id).error.take() {
            return Some(Err(e.into()));
        }
        let c = self.conn(id)?;
        match c.conn.state() {
            TcpState::SynSent | TcpState::SynReceived => {}
            TcpState::Closed => {
                return Some(Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the connection closed during the handshake",
                )))
            }
            _ => return Some(Ok(())),
        }
        let remote = *c.conn.remote().ip();
        if started.elapsed() >= give_up && !self.arp.reachable(remote, self.clock) {
            self.tcp_abort(id);
            return Some(Err(io::Error::new(
                io::ErrorKind::HostUnreachable,
                format!("{remote} did not answer ARP"),
            )));
        }
        None
    }

    /// Takes a connection off the accept queue of listener `id`.
    pub fn tcp_accept(&mut self, id: usize) -> Option<io::Result<usize>> {
        if let Some(e) = self.sock_mut(id).error.take() {
            return Some(Err(e.into()));
        }
        listener_in(&mut self.sockets, id)?
            .ready
            .pop_front()
            .map(Ok)
    }

    /// Reads received data: `None` while there is none and the stream goes on.
    /// Runs right after a pump, whose clock it goes by.
    pub fn tcp_read(&mut self, id: usize, buf: &mut [u8], peek: bool) -> Option<io::Result<usize>> {
        if let Some(e) = self.sock_mut(id).error.take() {
            return Some(Err(e.into()));
        }
        if self.conn_mut(id)?.read_shut {
            return Some(Ok(0));
        }
        self.tcp_waits_to_read(id);
        let c = self.conn_mut(id)?;
        let n = if peek {
            c.conn.peek(buf)
        } else {
            c.conn.recv(buf)
        };
        if n > 0 {
            // Reading may open the window: tell the peer now. It changes
            // nothing else (the pump before answered and armed everything),
            // so with nothing to send there is nothing to do.
            if !peek && c.conn.may_transmit() {
                self.tcp_after(id, self.clock);
            }
            return Some(Ok(n));
        }
        let ended = c.conn.recv_finished() || c.conn.state() == TcpState::Closed;
        ended.then_some(Ok(0))
    }

    /// The application reads, or waits to read, on connection `id`: the
    /// handshake's ACK, if held for a first write, goes now.
    pub fn tcp_waits_to_read(&mut self, id: usize) {
        if conn_in(&mut self.sockets, id).is_some_and(|c| c.conn.release_held_ack()) {
            self.tcp_after(id, self.clock);
        }
    }

    /// Queues data to send: `None` while the send buffer is full or the
    /// handshake goes on. Runs right after a pump, whose clock it goes by.
    pub fn tcp_write(&mut self, id: usize, data: &[u8]) -> Option<io::Result<usize>> {
        if let Some(e) = self.sock_mut(id).error.take() {
            return Some(Err(e.into()));
        }
        let c = self.conn_mut(id)?;
        if c.write_shut {
            return Some(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the socket was shut down for writing",
            )));
        }
        match c.conn.state() {
            TcpState::SynSent | TcpState::SynReceived => None,
            TcpState::Established | TcpState::CloseWait => {
                if c.slot.is_none() && c.conn.send_queue_len() == 0 {
                    self.tcp_lend_slot(id);
                }
                let c = self.conn_mut(id)?;
                let n = c.conn.send(data);
                if n == 0 {
                    return None;
                }
                self.tcp_after(id, self.clock);
                Some(Ok(n))
            }
            _ => Some(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the connection is closed",
            ))),
        }
    }

    /// `shutdown(2)`: no more writes (a FIN follows the queued data), or no more
    /// reads (what is queued or arrives is discarded).
    pub fn tcp_shutdown(&mut self, id: usize, read: bool, write: bool) -> io::Result<()> {
        let Some(c) = self.conn_mut(id) else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        if matches!(c.conn.state(), TcpState::SynSent | TcpState::Closed) {
            return Err(io::ErrorKind::NotConnected.into());
        }
        if write && !c.write_shut {
            c.write_shut = true;
            c.conn.close();
        }
        if read {
            c.read_shut = true;
        }
        let now = self.now();
        self.tcp_after(id, now);
        Ok(())
    }

    /// The application closed connection or listener `id`.
    pub(super) fn tcp_close(&mut self, id: usize) {
        let now = self.now();
        self.clock = now;
        let Some(sock) = self.sock_opt(id) else {
            return;
        };
        if matches!(sock.tcp.as_ref(), Some(TcpSock::Listener(_))) {
            let local = sock.local;
            // Its SYN queue and accept queue go with it, reset.
            let mut children: Vec<usize> = self
                .sockets
                .iter()
                .enumerate()
                .filter_map(|(i, s)| match s.as_ref()?.tcp.as_ref()? {
                    TcpSock::Conn(c) if c.listener == Some(id) => Some(i),
                    _ => None,
                })
                .collect();
            if let Some(l) = listener_in(&mut self.sockets, id) {
                children.extend(l.ready.drain(..));
            }
            for child in children {
                self.tcp_abort(child);
                self.tcp_remove(child);
            }
            // Connections it accepted send on its channel until their own is
            // bound: that comes before the listener's channel goes, whose
            // end resets what the multiplexer still follows there.
            self.tcp_bind_lazy_of(local);
            self.tcp_take_bound(true);
            self.tcp_remove(id);
            return;
        }
        let Some(c) = self.conn_mut(id) else {
            return;
        };
        c.orphan = true;
        c.conn.abandon(now);
        if matches!(c.conn.state(), TcpState::Closed | TcpState::TimeWait) {
            // In TIME-WAIT, the multiplexer takes the 4-tuple over.
            self.tcp_remove(id);
        } else if c.conn.recv_queue_len() > 0 {
            // RFC 2525 §2.17, as Linux: closing with unread data loses it, which
            // the peer learns from a RST.
            self.tcp_abort(id);
        } else {
            c.write_shut = true;
            c.conn.close();
            self.tcp_after(id, now);
        }
    }

    /// Lets connection `id` act on a change of its settings: sends what it
    /// may send now and arms its timers.
    pub fn tcp_touch(&mut self, id: usize) {
        let now = self.now();
        self.tcp_after(id, now);
    }

    /// Moves connection `id`'s (empty) send buffer into a slot of the send
    /// area, if one is free and large enough, so that its segments are sent
    /// by reference. Needs inline slots for the chains' headers.
    fn tcp_lend_slot(&mut self, id: usize) {
        if !self.tx.has_inline() {
            return;
        }
        let slot_size = self.send_area.slot_size();
        let Some(c) = conn_in(&mut self.sockets, id) else {
            return;
        };
        if c.send_buffer > slot_size || c.conn.sends_by_reference() {
            return;
        }
        let Some((slot, mem)) = self.send_area.lend(id) else {
            return;
        };
        match c.conn.lend_send_memory(mem) {
            Ok(()) => c.slot = Some(slot),
            Err(_) => self.send_area.release(slot),
        }
    }

    /// ABORT (RFC 9293 §3.10.5): a RST now, and the connection is gone.
    fn tcp_abort(&mut self, id: usize) {
        let now = self.now();
        if let Some(c) = self.conn_mut(id) {
            c.conn.abort();
            c.orphan = true;
        }
        self.tcp_after(id, now);
    }

    /// Drops socket `id` and its connection's state; its channel is unbound once
    /// the multiplexer has taken what was sent on it.
    fn tcp_remove(&mut self, id: usize) {
        let Some(sock) = self.sockets.get_mut(id).and_then(Option::take) else {
            return;
        };
        let mut own_channel = true;
        if let Some(TcpSock::Conn(c)) = sock.tcp.as_ref() {
            if let Some(peer) = sock.peer {
                if self.tcp.tuples.get(&(sock.local, peer)) == Some(&id) {
                    self.tcp.tuples.remove(&(sock.local, peer));
                }
            }
            if let Some(slot) = c.slot {
                self.send_area.release(slot);
            }
            let st = c.conn.stats();
            self.tcp.stats.retransmitted += st.retransmitted;
            self.tcp.stats.timeouts += st.timeouts;
            self.tcp.stats.fast_retransmits += st.fast_retransmits;
            self.tcp.stats.rack_losses += st.rack_losses;
            self.tcp.stats.hystart_exits += st.hystart_exits;
            if let Some(lid) = c.listener {
                own_channel = false;
                if let Some(l) = listener_in(&mut self.sockets, lid) {
                    l.embryos -= 1;
                }
            }
            // Still on its listener's channel: its own goes on the answer.
            own_channel &= !c.promoting;
        }
        if own_channel {
            self.by_channel.remove(&sock.channel);
            self.tcp.unbinds.push((sock.channel, self.tx_stats.frames));
        }
    }

    /// Unbinds the channels whose last frames the multiplexer has taken.
    fn tcp_unbind_due(&mut self) {
        if self.tcp.unbinds.is_empty() {
            return;
        }
        let taken = self
            .tx_stats
            .frames
            .saturating_sub(u64::from(self.tx.outstanding()));
        let due: Vec<u32> = self
            .tcp
            .unbinds
            .iter()
            .filter(|&&(_, mark)| mark <= taken)
            .map(|&(ch, _)| ch)
            .collect();
        if due.is_empty() {
            return;
        }
        self.tcp.unbinds.retain(|&(_, mark)| mark > taken);
        for ch in due {
            self.tcp_unbind_later(ch);
        }
    }

    /// Unbinds a channel without waiting: nothing hangs on the answer, and
    /// a later bind of the port comes after it anyway. A daemon's client
    /// holds the request back to go with the next one (one wake-up of the
    /// daemon's control thread for both), for at most [`UNBIND_DEFER`]. The
    /// multiplexer may be gone already; then everything is reclaimed.
    fn tcp_unbind_later(&mut self, ch: u32) {
        let _ = self.control().unbind_async(ch);
        if !self.in_process && self.tcp.unbinds_until.is_none() {
            self.tcp.unbinds_until = Some(self.clock + UNBIND_DEFER);
        }
    }

    /// A TCP segment arrived on the channel of socket `id`; `checked`: its
    /// checksum is known good ([`Desc::CSUM_OK`]).
    pub(super) fn tcp_input(&mut self, id: usize, dg: &Ipv4Datagram, checked: bool) {
        let now = self.clock;
        if dg.dst_kind != DstKind::Unicast {
            // RFC 1122 §4.2.3.10: no connection from a broadcast or multicast.
            self.tcp.stats.malformed += 1;
            return;
        }
        let Ok(p) = TcpPacket::new_checked(dg.payload) else {
            self.tcp.stats.malformed += 1;
            return;
        };
        let repr = if checked {
            self.tcp.stats.checksums_offloaded += 1;
            TcpRepr::parse_verified(&p)
        } else {
            let Ok(repr) = TcpRepr::parse(&p, dg.src, dg.dst) else {
                self.tcp.stats.bad_checksum += 1;
                return;
            };
            repr
        };
        self.tcp.stats.segments += 1;
        let local = SocketAddrV4::new(dg.dst, repr.dst_port);
        let remote = SocketAddrV4::new(dg.src, repr.src_port);
        // The connection is nearly always the channel's own socket: found
        // without hashing the 4-tuple.
        let own = self.sock_opt(id).is_some_and(|s| {
            s.local == local
                && s.peer == Some(remote)
                && matches!(s.tcp.as_ref(), Some(TcpSock::Conn(c)) if c.tupled)
        });
        let found = if own {
            Some(id)
        } else {
            self.tcp.tuples.get(&(local, remote)).copied()
        };
        if let Some(cid) = found {
            self.tcp_segment(cid, &repr, now);
            return;
        }
        let listening = matches!(self.sock(id).tcp.as_ref(), Some(TcpSock::Listener(_)))
            && self.sock(id).local == local;
        let control = repr.flags & (flags::SYN | flags::ACK | flags::RST);
        if listening && control == flags::SYN {
            self.tcp_syn(id, local, remote, &repr, now);
            return;
        }
        if listening && control == flags::ACK && self.tcp_cookie_ack(id, local, remote, &repr, now)
        {
            return;
        }
        // RFC 9293 §3.10.7.1 (and §3.10.7.2 for an ACK to a listener).
        if let Some(rst) = reset_for_closed(&repr) {
            self.tcp_reply(id, local, remote, &rst);
        }
    }

    fn tcp_segment(&mut self, id: usize, repr: &TcpRepr, now: Time) {
        let Some(c) = conn_in(&mut self.sockets, id) else {
            return;
        };
        if let Some(lid) = c.listener {
            let full = match self.sockets.get(lid).and_then(Option::as_ref) {
                Some(Sock { tcp: Some(t), .. }) => match t {
                    TcpSock::Listener(l) => l.ready.len() >= l.backlog,
                    TcpSock::Conn(_) => true,
                },
                _ => true,
            };
            if full && repr.flags & flags::ACK != 0 {
                // As Linux: the handshake waits for room; the peer's next ACK or
                // our SYN-ACK's retransmission completes it.
                self.tcp.stats.accept_overflow += 1;
                return;
            }
        }
        let c = conn_in(&mut self.sockets, id).expect("checked above");
        c.conn.handle_segment(repr, now);
        if !repr.payload.is_empty() {
            c.unanswered += 1;
        }
        if c.unanswered >= 2 {
            // RFC 5681 §4.2: an ACK at least for every second full-sized
            // segment, however many the pump brings at once, so the sender's
            // window grows and its clock keeps ticking.
            self.tcp_after(id, now);
        } else {
            self.tcp_mark(id);
        }
    }

    /// A SYN for listener `lid`: a new connection in its SYN queue (RFC 9293
    /// §3.10.7.2) if the queue has room, else a SYN cookie or nothing.
    fn tcp_syn(
        &mut self,
        lid: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        repr: &TcpRepr,
        now: Time,
    ) {
        let channel = self.sock(lid).channel;
        let Some(l) = listener_in(&mut self.sockets, lid) else {
            return;
        };
        if l.embryos >= l.backlog {
            if l.config.syn_cookies {
                self.tcp_cookie_syn(lid, local, remote, repr, now);
            } else {
                self.tcp.stats.syn_dropped += 1;
            }
            return;
        }
        let mut config = l.config.clone();
        config.max_syn_retransmissions = config.max_syn_retransmissions.min(SYNACK_RETRIES);
        let mtu = self.path_mtu(*remote.ip(), now);
        self.fit(&mut config, mtu);
        let send_buffer = config.send_buffer;
        let iss = initial_sequence_number(&self.tcp.key, local, remote, now);
        let Some(conn) = Connection::accept(config, local, remote, iss, repr) else {
            return;
        };
        let conn = conn.with_timestamp_offset(timestamp_offset(&self.tcp.key, local, remote));
        let id = self.tcp_embryo(lid, channel, conn, send_buffer);
        self.tcp_mark(id);
    }

    /// A new connection of listener `lid` in its SYN queue, on the listener's
    /// `channel` (not routed by channel: found by its 4-tuple).
    fn tcp_embryo(
        &mut self,
        lid: usize,
        channel: u32,
        conn: Connection,
        send_buffer: usize,
    ) -> usize {
        let (local, remote) = (conn.local(), conn.remote());
        if let Some(l) = listener_in(&mut self.sockets, lid) {
            l.embryos += 1;
        }
        let mut s = Sock::new(Kind::Tcp, channel, local);
        s.peer = Some(remote);
        s.tcp = Some(TcpSock::Conn(Box::new(Conn::new(
            conn,
            Some(lid),
            send_buffer,
        ))));
        let id = self.insert_socket(s);
        self.tcp_file(local, remote, id);
        id
    }

    /// Files connection `id` under its 4-tuple; one it displaces is found by
    /// the tuple no more.
    fn tcp_file(&mut self, local: SocketAddrV4, remote: SocketAddrV4, id: usize) {
        if let Some(old) = self.tcp.tuples.insert((local, remote), id) {
            if let Some(c) = conn_in(&mut self.sockets, old) {
                c.tupled = false;
            }
        }
        if let Some(c) = conn_in(&mut self.sockets, id) {
            c.tupled = true;
        }
    }

    /// Answers a SYN for listener `lid`, whose SYN queue is full, with a SYN
    /// cookie (RFC 4987 §3.6), keeping nothing.
    fn tcp_cookie_syn(
        &mut self,
        lid: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        repr: &TcpRepr,
        now: Time,
    ) {
        let Some(l) = listener_in(&mut self.sockets, lid) else {
            return;
        };
        let mut config = l.config.clone();
        let mtu = self.path_mtu(*remote.ip(), now);
        self.fit(&mut config, mtu);
        let mut seg = [0u8; TCP_MAX_HEADER];
        let Some(n) = syn_cookie_reply(&config, &self.tcp.key, local, remote, repr, now, &mut seg)
        else {
            return;
        };
        // Held for the neighbour as a connection's SYN-ACK would be.
        let sent = self.send_held(lid, *remote.ip(), protocol::TCP, n, |buf| {
            buf.copy_from_slice(&seg[..n]);
        });
        if sent.is_ok() {
            self.tcp.stats.syn_cookies_sent += 1;
            if let Some(l) = listener_in(&mut self.sockets, lid) {
                l.cookie_sent = Some(now);
            }
        }
    }

    /// An ACK for listener `lid` that matches no connection: if it returns a
    /// valid SYN cookie, the connection it makes goes straight to the accept
    /// queue. False if it carries no cookie (it gets the RST of RFC 9293
    /// §3.10.7.2, as in Linux), or the listener sent none lately.
    fn tcp_cookie_ack(
        &mut self,
        lid: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        repr: &TcpRepr,
        now: Time,
    ) -> bool {
        let channel = self.sock(lid).channel;
        let Some(l) = listener_in(&mut self.sockets, lid) else {
            return false;
        };
        let recent = l.link_answers
            || l.cookie_sent
                .is_some_and(|t| now.saturating_duration_since(t) <= SYN_COOKIE_LIFETIME);
        if !recent {
            return false;
        }
        let full = l.ready.len() >= l.backlog;
        let mut config = l.config.clone();
        let mtu = self.path_mtu(*remote.ip(), now);
        self.fit(&mut config, mtu);
        let send_buffer = config.send_buffer;
        let Some(conn) = syn_cookie_accept(config, &self.tcp.key, local, remote, repr, now) else {
            self.tcp.stats.syn_cookies_rejected += 1;
            return false;
        };
        self.tcp.stats.syn_cookies_accepted += 1;
        if full {
            // As Linux: dropped; the peer, established, sends again what it sent.
            self.tcp.stats.accept_overflow += 1;
            return true;
        }
        let id = self.tcp_embryo(lid, channel, conn, send_buffer);
        // Synchronized already: through the SYN queue to the accept queue.
        self.tcp_promote(id, lid);
        self.tcp_mark(id);
        true
    }

    /// Moves a connection out of its listener's SYN queue once synchronized
    /// and queues it for `accept`. In process it asks for its own channel at
    /// once; through a daemon once it has lived
    /// [`lazy_bind`](crate::StackConfig::lazy_bind) ([`Inner::tcp_bind_lazy`]).
    fn tcp_promote(&mut self, id: usize, lid: usize) {
        let (local, remote) = {
            let s = self.sock(id);
            (s.local, s.peer.expect("a connection has a peer"))
        };
        let bound = if self.in_process {
            let ahead = Ahead::Promotion { id, local, remote };
            self.tcp_begin_bind((*local.ip(), local.port()), remote, ahead)
        } else {
            let due = self.clock + self.lazy_bind;
            self.tcp.lazy.push_back((due, id, local, remote));
            Ok(())
        };
        if bound.is_err() {
            // The multiplexer is gone: nothing more goes out anyway.
            if let Some(c) = self.conn_mut(id) {
                c.conn.abort();
            }
            return;
        }
        if let Some(c) = self.conn_mut(id) {
            c.listener = None;
            c.promoting = true;
        }
        if let Some(l) = listener_in(&mut self.sockets, lid) {
            l.embryos -= 1;
            l.ready.push_back(id);
        }
        self.tcp.stats.accepts += 1;
        if self.in_process {
            self.tcp_take_bound(false);
        }
    }

    /// Begins the binds of the connections accepted
    /// [`lazy_bind`](crate::StackConfig::lazy_bind) ago that still live and
    /// still send: one that winds down ends on its listener's channel.
    pub(super) fn tcp_bind_lazy(&mut self, now: Time) {
        while let Some(&(due, id, local, remote)) = self.tcp.lazy.front() {
            if due > now {
                return;
            }
            self.tcp.lazy.pop_front();
            self.tcp_bind_accepted(id, local, remote, false);
        }
    }

    /// Begins the binds of all the connections accepted on `local` that
    /// have none yet: their listener goes.
    fn tcp_bind_lazy_of(&mut self, local: SocketAddrV4) {
        let (now, later): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.tcp.lazy)
            .into_iter()
            .partition(|e| e.2 == local);
        self.tcp.lazy = later;
        for (_, id, local, remote) in now {
            self.tcp_bind_accepted(id, local, remote, true);
        }
    }

    /// Begins the bind of the own channel of connection `id`, accepted with
    /// this 4-tuple and still on its listener's channel, if it still
    /// lives, and, unless `any_state`, still sends.
    fn tcp_bind_accepted(
        &mut self,
        id: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        any_state: bool,
    ) {
        let waits = self.sock_opt(id).is_some_and(|s| {
            s.local == local
                && s.peer == Some(remote)
                && matches!(s.tcp.as_ref(), Some(TcpSock::Conn(c)) if c.promoting
                    && (any_state
                        || matches!(c.conn.state(), TcpState::Established | TcpState::CloseWait)))
        });
        if waits {
            let ahead = Ahead::Promotion { id, local, remote };
            // The multiplexer gone, nothing more goes out anyway.
            let _ = self.tcp_begin_bind((*local.ip(), local.port()), remote, ahead);
        }
    }

    /// The answer to the bind of connection `id`'s own channel, begun when
    /// it was accepted with this 4-tuple.
    fn tcp_promoted(
        &mut self,
        id: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        answer: io::Result<(u32, u16)>,
    ) {
        let waits = self.sock_opt(id).is_some_and(|s| {
            s.local == local
                && s.peer == Some(remote)
                && matches!(s.tcp.as_ref(), Some(TcpSock::Conn(c)) if c.promoting)
        });
        match answer {
            Ok((channel, _)) if waits => {
                self.sock_mut(id).channel = channel;
                self.by_channel.insert(channel, id);
                if let Some(c) = self.conn_mut(id) {
                    c.promoting = false;
                }
            }
            // Gone meanwhile: its channel goes too (the multiplexer then holds
            // a TIME-WAIT it followed there).
            Ok((channel, _)) => {
                self.tcp_unbind_later(channel);
            }
            Err(_) if waits => {
                // The 4-tuple is not ours to have: the multiplexer holds it in
                // TIME-WAIT, for an application that died, or for this very
                // connection, which finished on its listener's channel
                // meanwhile. Reset unless finished; either way it stays on
                // the listener's channel, which its end must not unbind.
                let finished = self.conn(id).is_some_and(|c| {
                    matches!(c.conn.state(), TcpState::TimeWait | TcpState::Closed)
                });
                if !finished {
                    self.tcp_abort(id);
                }
            }
            Err(_) => {}
        }
    }

    /// Notes that connection `id` has something to answer at the end of the pump.
    fn tcp_mark(&mut self, id: usize) {
        if let Some(c) = conn_in(&mut self.sockets, id) {
            if !c.dirty {
                c.dirty = true;
                self.tcp.dirty.push(id);
            }
        }
    }

    /// Runs the connections' timers due at `now`, and sends held-back
    /// unbinds that are due.
    pub(super) fn tcp_timers(&mut self, now: Time) {
        if self.tcp.unbinds_until.is_some_and(|t| t <= now) {
            self.tcp.unbinds_until = None;
            let _ = self.control().flush_deferred();
        }
        while let Some(&Reverse((t, id))) = self.tcp.timers.peek() {
            if t > now {
                break;
            }
            self.tcp.timers.pop();
            if let Some(c) = conn_in(&mut self.sockets, id) {
                if c.armed == Some(t) {
                    c.armed = None;
                    c.conn.handle_timeout(now);
                    self.tcp_mark(id);
                }
            }
        }
    }

    /// Replaces the timer heap's stale tops before a sleep. A connection's
    /// entry stays when its deadline moves later (a delayed ACK that left
    /// with data, leaving the probe timer), to be skipped at its time: cheap
    /// while busy, but a sleep would end there for nothing. The bound of
    /// held-back unbinds goes too once a request took them along.
    pub(crate) fn tcp_settle_timers(&mut self) {
        if self.tcp.unbinds_until.is_some() && !self.control().has_deferred() {
            self.tcp.unbinds_until = None;
        }
        while let Some(&Reverse((t, id))) = self.tcp.timers.peek() {
            let Some(c) = conn_in(&mut self.sockets, id).filter(|c| c.armed == Some(t)) else {
                self.tcp.timers.pop();
                continue;
            };
            let due = c.conn.poll_timeout();
            if due.is_some_and(|d| d <= t) {
                return;
            }
            self.tcp.timers.pop();
            c.armed = due;
            if let Some(d) = due {
                self.tcp.timers.push(Reverse((d, id)));
            }
        }
    }

    /// Answers the connections marked in this pump, and unbinds what is due.
    pub(super) fn tcp_transmit_dirty(&mut self, now: Time) {
        // Every connection a full ring or pool stopped is marked dirty and
        // tried again here, and sets the flag again if it is still stopped;
        // a datagram's blocked send sets it again on its retry. Without this
        // the flag outlived the block, and a sleep's re-check saw work
        // whenever the tx ring had room.
        self.tx_blocked = false;
        self.tx_corked = false;
        if !self.tcp.dirty.is_empty() {
            let mut dirty = std::mem::take(&mut self.tcp.dirty);
            for &id in &dirty {
                if let Some(c) = conn_in(&mut self.sockets, id) {
                    c.dirty = false;
                    self.tcp_after(id, now);
                }
            }
            // The list keeps its capacity (a pump would allocate it again
            // otherwise); marks made meanwhile stay on it.
            dirty.clear();
            dirty.append(&mut self.tcp.dirty);
            self.tcp.dirty = dirty;
        }
        self.tcp_unbind_due();
    }

    /// After anything happened to connection `id`: completes a handshake at a
    /// listener, sends what the connection has to send, re-arms its timer and
    /// removes it once it is done and nobody holds it.
    fn tcp_after(&mut self, id: usize, now: Time) {
        let Some(c) = conn_in(&mut self.sockets, id) else {
            return;
        };
        c.dirty = false;
        c.unanswered = 0;
        if c.orphan && c.conn.recv_queue_len() > 0 {
            // RFC 1122 §4.2.2.13: data that comes after the CLOSE is lost,
            // which the peer learns from a RST (as from Linux), and nobody
            // holds a window open for a reader that is gone.
            c.conn.abort();
        }
        if c.read_shut {
            let mut sink = [0u8; 4096];
            while c.conn.recv(&mut sink) > 0 {}
        }
        if let Some(lid) = c.listener {
            if !matches!(c.conn.state(), TcpState::SynReceived | TcpState::Closed) {
                self.tcp_promote(id, lid);
            }
        }
        self.tcp_flush(id, now);
        let Some(c) = conn_in(&mut self.sockets, id) else {
            return;
        };
        if let Some(slot) = c.slot {
            if c.conn.end_send_memory() {
                c.slot = None;
                self.send_area.release(slot);
            }
        }
        let Some(c) = conn_in(&mut self.sockets, id) else {
            return;
        };
        if let Some(d) = c.conn.poll_timeout() {
            if c.armed.is_none_or(|a| d < a) {
                c.armed = Some(d);
                self.tcp.timers.push(Reverse((d, id)));
            }
        }
        if c.conn.state() == TcpState::TimeWait && c.orphan && c.listener.is_none() {
            // Thekkath §III-D: the multiplexer holds TIME-WAIT for the 4-tuple
            // once the channel goes, so the application need not keep it.
            self.tcp_remove(id);
            return;
        }
        if c.conn.state() != TcpState::Closed {
            return;
        }
        let (gone, error) = (c.orphan || c.listener.is_some(), c.conn.error());
        if !c.ended {
            c.ended = true;
            if let Some(e) = error {
                self.tcp.stats.failed += 1;
                self.sock_mut(id).error = Some(end_error(e));
            }
            // A closed connection answers no more segments: RFC 9293 §3.10.7.1
            // gives the RST of a port with no connection.
            let s = self.sock(id);
            if let Some(peer) = s.peer {
                let key = (s.local, peer);
                if self.tcp.tuples.get(&key) == Some(&id) {
                    self.tcp.tuples.remove(&key);
                }
            }
            if let Some(c) = self.conn_mut(id) {
                c.tupled = false;
            }
        }
        if gone {
            self.tcp_remove(id);
        }
    }

    /// Writes the segments connection `id` has to send into send buffers and
    /// puts them on the tx ring. Stops, leaving the connection marked, when
    /// buffers or ring slots run out.
    fn tcp_flush(&mut self, id: usize, now: Time) {
        // After most events there is nothing to send: no route is looked up.
        if !self.conn(id).is_some_and(|c| c.conn.may_transmit()) {
            return;
        }
        let frame_size = self.frames.layout().frame_size() as usize;
        // The same for every segment of the connection: looked up once.
        let Some(s) = self.sock_opt(id) else { return };
        let (channel, local, ttl) = (s.channel, s.local, s.ttl);
        let Some(remote) = s.peer else { return };
        let dst = *remote.ip();
        let mac = match self.next_hop(dst, false, now) {
            Ok(m) => m,
            Err(e) => {
                // The peer cannot be reached any more (an address change):
                // the connection ends with the reason.
                if let Some(c) = self.conn_mut(id) {
                    if c.conn.state() != TcpState::Closed {
                        c.conn.abort();
                        self.sock_mut(id).error = Some(e.kind());
                    }
                }
                return;
            }
        };
        let route = Route {
            channel,
            local,
            dst,
            ttl,
            mac,
            mtu: self.path_mtu(dst, now).min(frame_size - ETH_LEN),
        };
        if self.conn(id).is_some_and(|c| c.conn.sends_by_reference()) {
            if self.tcp_flush_referenced(id, now, &route) {
                let _ = self.kick.notify_if_sleeping();
            }
            return;
        }
        // Segments go in send buffers held through a clone of the frames (an
        // Arc), which the path above does without.
        let frames = self.frames.clone();
        let mtu = route.mtu;
        let mut pushed = false;
        while let Some(c) = conn_in(&mut self.sockets, id) {
            // The usual end of the loop, told before a ring slot or a buffer
            // is sought: a connection with nothing to send is not blocked.
            if !c.conn.may_transmit() {
                break;
            }
            if self.tx.outstanding() >= self.tx.entries() {
                self.tx_blocked = true;
                self.tcp_mark(id);
                break;
            }
            let Some(b) = self.tx_pool.pop() else {
                self.tx_blocked = true;
                self.tcp_mark(id);
                break;
            };
            let Some(buf) = segment_bytes_mut(&frames, b, frame_size as u32) else {
                self.tx_pool.push(b);
                break;
            };
            let Some(n) = c
                .conn
                .poll_transmit(now, &mut buf[ETH_LEN + IP_LEN..ETH_LEN + mtu])
            else {
                self.tx_pool.push(b);
                break;
            };
            let (flags, own_channel) = (c.tx_flags(), !c.promoting);
            if self.tcp_headers(buf, &route, n).is_err() {
                self.tx_pool.push(b);
                break;
            }
            let len = ETH_LEN + IP_LEN + n;
            if mac.is_some() && own_channel && self.tcp_direct(&buf[..len], now) {
                self.tx_pool.push(b);
                continue;
            }
            let Some(_) = mac else {
                // Held until the neighbour answers; more than the cache holds
                // are lost and retransmitted.
                let frame = buf[..len].to_vec();
                self.tx_pool.push(b);
                self.arp.hold(dst, Held { channel, frame });
                continue;
            };
            let r = if len <= INLINE_MAX && self.tx.has_inline() {
                self.inline[..len].copy_from_slice(&buf[..len]);
                self.tx_pool.push(b);
                self.tx_stats.inline += 1;
                self.tx
                    .push_inline_with(channel, &self.inline[..len], flags)
            } else {
                let mut d = Desc::buffer(b, len as u32, channel);
                d.flags = flags;
                let r = self.tx.push(d);
                if !matches!(r, Ok(true)) {
                    self.tx_pool.push(b);
                }
                r
            };
            match r {
                Ok(true) => {
                    self.tx_stats.frames += 1;
                    pushed = true;
                }
                // Checked above; a lost segment is retransmitted.
                Ok(false) => {}
                // The ring is broken: the next pump reports it.
                Err(_) => break,
            }
        }
        if pushed {
            let _ = self.kick.notify_if_sleeping();
        }
    }

    /// [`Inner::tcp_flush`] for a connection whose send buffer is in the send
    /// area: each segment's headers go inline, and its data, unless it fits
    /// there too, as chain parts where it lies. Returns whether anything was
    /// pushed.
    fn tcp_flush_referenced(&mut self, id: usize, now: Time, r: &Route) -> bool {
        let mut pushed = false;
        let mut head = [0u8; INLINE_MAX];
        while let Some(c) = conn_in(&mut self.sockets, id) {
            // The usual end of the loop, told without building a segment, and
            // before ring slots are sought: a connection with nothing to send
            // is not blocked.
            if !c.conn.may_transmit() {
                break;
            }
            // Room for the longest chain: headers and the two ends of the ring.
            if self.tx.outstanding() + 3 > self.tx.entries() {
                self.tx_blocked = true;
                self.tcp_mark(id);
                break;
            }
            let one = r.mtu - IP_LEN;
            // Super-segments only where the link cuts them as the path needs.
            let (space, cut) = match self.tso {
                Some(t) if one >= t.cut => (t.space, t.cut),
                _ => (one, one),
            };
            // Short super-segments wait while earlier ones are in the ring.
            let cork = space > cut && c.conn.references() > 0;
            let Some((n, pieces)) = c.conn.poll_transmit_offloaded(
                now,
                &mut head[ETH_LEN + IP_LEN..],
                space,
                cut,
                cork,
            ) else {
                if c.conn.is_corked() {
                    // Looked at again at the end of every pump, the one that
                    // takes the completions it waits for among them.
                    self.tx_corked = true;
                    self.tcp_mark(id);
                }
                break;
            };
            let (slot, flags, own_channel) = (c.slot, c.tx_flags(), !c.promoting);
            let data = pieces.map_or(0, |p| p.len());
            self.tcp_headers(&mut head, r, n + data)
                .expect("a header of a segment cut to the path MTU");
            let len = ETH_LEN + IP_LEN + n;
            if r.mac.is_some() && own_channel && len + data <= DIRECT_MAX {
                let mut frame = [0u8; DIRECT_MAX];
                let frame = &mut frame[..len + data];
                if self.tcp_gather(&head[..len], pieces, frame) && self.tcp_direct(frame, now) {
                    // Copied out: its reference ends here.
                    if pieces.is_some() {
                        self.tcp_reference_unsent(id);
                    }
                    continue;
                }
            }
            let Some(_) = r.mac else {
                // Held whole until the neighbour answers: a copy, so the
                // reference ends here.
                let mut frame = vec![0; len + data];
                let _ = self.tcp_gather(&head[..len], pieces, &mut frame);
                if pieces.is_some() {
                    self.tcp_reference_unsent(id);
                }
                self.arp.hold(
                    r.dst,
                    Held {
                        channel: r.channel,
                        frame,
                    },
                );
                continue;
            };
            let res = match pieces {
                None => {
                    self.tx_stats.inline += 1;
                    self.tx.push_inline_with(r.channel, &head[..len], flags)
                }
                Some(p) => {
                    let mut parts = [Part::Inline(&head[..len]); 3];
                    let mut k = 1;
                    for (offset, len) in p.iter() {
                        parts[k] = Part::Area { offset, len };
                        k += 1;
                    }
                    self.tx.push_chain_with(r.channel, &parts[..k], flags)
                }
            };
            match res {
                Ok(true) => {
                    self.tx_stats.frames += 1;
                    pushed = true;
                    if let (Some(_), Some(slot)) = (pieces, slot) {
                        self.tx_stats.referenced += 1;
                        self.send_area.sent(slot);
                    }
                }
                // Checked above; a lost segment is retransmitted.
                Ok(false) | Err(_) => {
                    if pieces.is_some() {
                        self.tcp_reference_unsent(id);
                    }
                    if res.is_err() {
                        // The ring is broken: the next pump reports it.
                        break;
                    }
                }
            }
        }
        pushed
    }

    /// Writes `frame`, a whole segment of a connection on its own channel,
    /// to the direct send port at `now` if it may go there; returns whether
    /// it went. Only while the tx ring is empty, so that it cannot overtake
    /// the connection's earlier segments; only what the port's check passes
    /// (an ACK without SYN, FIN or RST); only data, no longer than
    /// [`DIRECT_MAX`]: a request or an answer, which someone waits for (a
    /// bulk receiver's ACKs would cost it the kernel's send path for each);
    /// and only what the port's rate allows.
    fn tcp_direct(&mut self, frame: &[u8], now: Time) -> bool {
        use std::io::Write;
        let Some(direct) = &mut self.direct else {
            return false;
        };
        let tcp = frame.get(ETH_LEN + IP_LEN..).unwrap_or_default();
        let (fl, header) = match tcp {
            [_, _, _, _, _, _, _, _, _, _, _, _, off, fl, ..] => (*fl, usize::from(off >> 4) * 4),
            _ => return false,
        };
        if frame.len() > DIRECT_MAX
            || tcp.len() <= header
            || fl & flags::ACK == 0
            || fl & (flags::SYN | flags::FIN | flags::RST) != 0
        {
            return false;
        }
        if self.tx.outstanding() > 0 {
            self.tx_stats.direct_behind += 1;
            return false;
        }
        if !direct.take(frame.len(), now) {
            return false;
        }
        match (&direct.port).write(frame) {
            Ok(n) if n == frame.len() => {
                self.tx_stats.direct += 1;
                true
            }
            r => {
                self.tx_stats.direct_failed += 1;
                // A full queue passes; anything else (the port gone with
                // the daemon) ends it.
                let passing = matches!(&r, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) || e.raw_os_error() == Some(libc::ENOBUFS));
                if !passing {
                    self.direct = None;
                }
                false
            }
        }
    }

    /// Writes the Ethernet and IPv4 headers of a TCP segment (or super-segment)
    /// of `tcp_len` bytes along `r` into the front of `frame`.
    fn tcp_headers(
        &mut self,
        frame: &mut [u8],
        r: &Route,
        tcp_len: usize,
    ) -> Result<(), WireError> {
        let mut ip = Ipv4Repr::new(*r.local.ip(), r.dst, protocol::TCP, tcp_len);
        ip.ttl = r.ttl;
        ip.ident = self.ident;
        // Segments are cut to the path MTU (RFC 9293 §3.7.1 via the MSS), so
        // they need no fragmenting, as Linux sends them.
        ip.dont_frag = true;
        self.ident = self.ident.wrapping_add(1);
        ip.emit(&mut frame[ETH_LEN..])?;
        write_eth(frame, r.mac.unwrap_or([0; 6]), self.info.mac);
        Ok(())
    }

    /// Copies a segment whose headers are `head` and whose data lies in the
    /// send area as `pieces` into `out`, exactly as long as both; false if a
    /// piece is not in the area (its bytes are left as they were).
    fn tcp_gather(&self, head: &[u8], pieces: Option<Pieces>, out: &mut [u8]) -> bool {
        out[..head.len()].copy_from_slice(head);
        let mut end = head.len();
        let mut whole = true;
        for (at, l) in pieces.iter().flat_map(|p| p.iter()) {
            whole &= self
                .frames
                .read_area(at, &mut out[end..end + l as usize])
                .is_ok();
            end += l as usize;
        }
        whole
    }

    fn tcp_reference_unsent(&mut self, id: usize) {
        if let Some(c) = self.conn_mut(id) {
            c.conn.reference_unsent();
        }
    }

    /// Sends a segment that belongs to no connection (a RST) on the channel of
    /// socket `id`.
    fn tcp_reply(&mut self, id: usize, local: SocketAddrV4, remote: SocketAddrV4, seg: &TcpRepr) {
        let len = seg.buffer_len();
        let sent = self.send(id, *remote.ip(), protocol::TCP, len, |buf| {
            // Cannot fail: the buffer has the segment's length.
            let _ = seg.emit(buf, *local.ip(), *remote.ip());
        });
        if sent.is_ok() {
            self.tcp.stats.resets_sent += 1;
        }
    }

    /// Before the endpoint goes: gives connections the application closed a
    /// bounded time to deliver their data and FIN (as the kernel keeps an orphaned
    /// socket), so a program that writes, closes and exits is not cut short.
    /// What is still open afterwards the multiplexer resets.
    pub(super) fn tcp_linger(&mut self) {
        let until = Instant::now() + self.linger;
        loop {
            let busy = self.sockets.iter().flatten().any(|s| match s.tcp.as_ref() {
                Some(TcpSock::Conn(c)) => matches!(
                    c.conn.state(),
                    TcpState::SynReceived
                        | TcpState::FinWait1
                        | TcpState::Closing
                        | TcpState::LastAck
                ),
                _ => false,
            });
            if !busy || Instant::now() >= until {
                return;
            }
            let now = self.now();
            self.pump(now);
            if !self.nudge(Duration::from_micros(200)) {
                return;
            }
        }
    }
}
