//! exonet-mux: the trusted multiplexer.
//!
//! A [`Mux`] owns one [`Link`] and serves endpoints ([`MuxEndpoint`], the
//! multiplexer's side of an `exonet-shm` segment). Each endpoint has
//! channels; a channel binds a DPF filter (what it receives) to a transmit
//! header template (what it may send). The channel id travels in the
//! descriptors.
//!
//! Receive ([`Mux::poll_rx`]): a batch from the link is staged, classified
//! with one [`Dpf::demux_batch`] call, and each frame goes to its channel:
//! its handler runs first (if any) and may consume the frame; otherwise the
//! frame is copied into the endpoint's segment (inline in the rx ring when
//! short, else into a buffer taken from its free ring) and a descriptor is
//! pushed on its rx ring. No buffer: the frame is dropped and counted
//! against that endpoint alone. Each endpoint is notified once per batch.
//! ARP frames always go to the host as well; frames no channel accepts go
//! to the host, which answers as a host would ([`host`]), except ICMP
//! errors quoting a socket channel's UDP or TCP datagram, which go to that
//! channel (RFC 1122 §4.1.3.3). IPv4 fragments
//! go through the fragment pool ([`frag`]): a head fragment is classified
//! like any frame and the body fragments follow it to its channel.
//!
//! Transmit ([`Mux::poll_tx`]): endpoints with pending descriptors are
//! visited in deficit round robin by bytes, weighted per endpoint. Each
//! descriptor is read once and validated, the frame is copied out of the
//! segment (gathered from its parts, when it is a chain of descriptors:
//! [`Desc::MORE`]), the copy is checked against the channel's template (and
//! the channel against the endpoint), and only then sent. The buffer goes
//! back on the completion ring, flagged [`Desc::REJECTED`] when the frame
//! was not sent; a chain gets one completion ([`Desc::CHAIN`]). Fragments
//! an application sends are held to the template of their datagram's head,
//! which must go first, and get an identification the multiplexer
//! allocates (the `ident` module).
//!
//! Every cycle spent on an endpoint's behalf (delivery, handler, transmit)
//! and an even share of each batch's classification is charged to it
//! ([`EndpointStats::rx_cycles`], [`EndpointStats::copy_cycles`],
//! [`EndpointStats::tx_cycles`]).
//!
//! The registry ([`registry`]) allocates ports (and ICMP echo
//! identifiers), builds the filter and template of UDP/TCP/ICMP echo
//! channels ([`Mux::bind_socket`]), and refuses raw
//! filters and templates of unprivileged endpoints that could receive or
//! send what is not theirs ([`Mux::bind_channel`]).
//!
//! A TCP connection channel (a remote given) is followed from the segments
//! that pass through (the `conn` module). When it goes, unbound or with its
//! endpoint, its connection is reset if it was not finished, or held in
//! TIME-WAIT by the multiplexer for what remains of 2×MSL, as Thekkath's
//! registry server inherits the connections of an application that exits
//! (§III-D).

mod conn;
pub mod control;
pub mod cycles;
pub mod frag;
mod handlers;
pub mod host;
mod ident;
mod idle;
mod in_process;
pub mod registry;
pub mod template;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use exonet_dpf::{Dpf, DpfError, Filter, FilterId};
use exonet_link::direct::{DirectConn, DirectPort, Rate};
use exonet_link::{LendScratch, Lent, Link};
use exonet_shm::{
    Consumer, Desc, DescError, Frames, IdMap, Layout, MuxEndpoint, INLINE_MAX, MAX_PARTS,
};
use exonet_wire::tcp::flags;

pub use control::{Daemon, DaemonConfig, Running, StopHandle};
pub use exonet_ash;
pub use frag::{FragKind, FragPool, FragStats};
pub use handlers::{Handler, HandlerLimits};
pub use host::{HostConfig, HostStats, TokenBucket};
pub use idle::{Idle, RunConfig};
pub use in_process::InProcess;
pub use registry::{ChannelSpec, Proto};
pub use template::Template;

use conn::{ConnTrack, Fate, Followed, Hold, Received, TimeWaits, Tuple};
use exonet_ash::handler::{Abort, Engine, Outbox, Outcome};
use exonet_shm::control::{HandlerSpec, SynAnswers};
use frag::To;
use handlers::Budget;
use host::Host;
use ident::{Idents, TxFrags};
use registry::Ports;

/// Names an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(pub u32);

/// Names a channel; this is the value in the `channel` field of descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u32);

/// Most frames taken from the link in one receive batch.
pub const MAX_RX_BATCH: usize = 256;

/// Frames classified together: [`Dpf::demux_batch`] gets this many at most.
const CLASSIFY_CHUNK: usize = 32;

/// A chunk of at most this many frames is classified in arrays of its size.
const SMALL_CHUNK: usize = 4;

/// Most transmit descriptors taken from one endpoint's ring at a time.
const TX_BATCH: usize = 64;
/// How long filter changes must pause before the JIT compiles them (the
/// interpreter classifies meanwhile): connection setups come in bursts, and
/// one compilation then serves them all. Long enough that a short transfer
/// ends first: at 2 ms, the compilation a 10 MB transfer's own binds
/// started stopped the multiplexer for about a millisecond in its middle
/// (in 4 of 5 transfers, pcap on both daemons; likely the idle-priority
/// compiler given the daemon's CPU by its yields, not proven), and 10 MB
/// moved at 2.77 Gbit/s (mean of 6 medians of 5) against 3.05 at 50 ms;
/// connections a second were even (8,405 against 8,125, 4 interleaved
/// runs), the interpreter costing them nothing seen.
const DPF_SETTLE: Duration = Duration::from_millis(50);

/// What a channel's handler decided about an arrived frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandlerVerdict {
    /// The handler dealt with the frame; it is not delivered.
    Consumed,
    /// Deliver the frame to the endpoint as usual.
    Deliver,
}

/// Why a control operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MuxError {
    NoSuchEndpoint(EndpointId),
    NoSuchChannel(ChannelId),
    Filter(DpfError),
    /// The endpoint may not do this (a privileged port, a filter or
    /// template that does not pin what it owns).
    NotPermitted(String),
    PortInUse {
        proto: Proto,
        port: u16,
    },
    NoPortsLeft(Proto),
    NotOurAddress(Ipv4Addr),
    /// The multiplexer holds this TCP connection in TIME-WAIT for an
    /// application that went away (Thekkath §III-D); its port may still
    /// listen, or connect elsewhere.
    InTimeWait {
        local: (Ipv4Addr, u16),
        remote: (Ipv4Addr, u16),
    },
    /// A handler (module, pipe list or window) that does not validate or
    /// compile.
    BadHandler(String),
    /// The link refused (it cannot answer SYNs, or holds no more listeners).
    Link(String),
}

impl fmt::Display for MuxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MuxError::NoSuchEndpoint(e) => write!(f, "no endpoint {}", e.0),
            MuxError::NoSuchChannel(c) => write!(f, "no channel {}", c.0),
            MuxError::Filter(e) => write!(f, "filter refused: {e}"),
            MuxError::NotPermitted(why) => write!(f, "not permitted: {why}"),
            MuxError::PortInUse { proto, port } => write!(f, "{proto:?} port {port} is in use"),
            MuxError::NoPortsLeft(p) => write!(f, "no {p:?} ports left"),
            MuxError::NotOurAddress(a) => write!(f, "{a} is not an address of this host"),
            MuxError::InTimeWait { local, remote } => write!(
                f,
                "TCP {}:{} to {}:{} is in TIME-WAIT",
                local.0, local.1, remote.0, remote.1
            ),
            MuxError::BadHandler(why) => write!(f, "handler refused: {why}"),
            MuxError::Link(why) => write!(f, "the link refused: {why}"),
        }
    }
}

impl std::error::Error for MuxError {}

impl From<DpfError> for MuxError {
    fn from(e: DpfError) -> Self {
        MuxError::Filter(e)
    }
}

/// Tunables.
#[derive(Clone, Copy, Debug)]
pub struct MuxConfig {
    /// Frames per receive batch (at most [`MAX_RX_BATCH`]).
    pub rx_batch: usize,
    /// Most frames one transmit scan takes from all endpoints together.
    pub tx_budget: usize,
    /// Bytes a weight of 1 earns per deficit-round-robin round.
    pub quantum: u32,
    /// Most invalid free-ring descriptors skipped while looking for a
    /// buffer for one frame.
    pub free_retries: u32,
    /// How long a fragmented datagram's association lives at most, and
    /// how long its body fragments wait for their head (Linux's 30 s
    /// reassembly timeout by default; at most a day).
    pub frag_timeout: Duration,
    /// Most bytes of body fragments waiting for their head, each charged
    /// its length plus a fixed bookkeeping cost.
    pub frag_memory: usize,
    /// Most body fragments of one datagram waiting for its head.
    pub frag_per_datagram: usize,
    /// Most datagrams the fragment pool knows at once (associations and
    /// datagrams waiting for their head); a head evicts the oldest.
    pub frag_datagrams: usize,
    /// Most fragmented datagrams one channel may be sending at once (its
    /// transmit associations, see the `ident` module); a new head evicts
    /// the oldest.
    pub tx_frag_datagrams: usize,
    /// How long after its head a datagram's body fragments may still be
    /// sent (at most a day).
    pub tx_frag_timeout: Duration,
    /// The maximum segment lifetime: a TCP connection whose application
    /// goes in TIME-WAIT is held 2×MSL after the peer's FIN arrived (30 s,
    /// as Linux's 60 s TIME-WAIT; at most a day).
    pub msl: Duration,
    /// Most TCP connections held in TIME-WAIT at once; a new one evicts the
    /// one that would expire first.
    pub time_wait_max: usize,
    /// Fuel, memory and sends of handlers (ASH).
    pub handlers: HandlerLimits,
    pub host: HostConfig,
}

impl Default for MuxConfig {
    fn default() -> Self {
        MuxConfig {
            rx_batch: 64,
            tx_budget: 256,
            quantum: 1514,
            free_retries: 4,
            frag_timeout: Duration::from_secs(30),
            frag_memory: 256 * 1024,
            frag_per_datagram: 64,
            frag_datagrams: 1024,
            tx_frag_datagrams: 64,
            tx_frag_timeout: Duration::from_secs(5),
            msl: Duration::from_secs(30),
            time_wait_max: 4096,
            handlers: HandlerLimits::default(),
            host: HostConfig::default(),
        }
    }
}

/// How long a peer's FIN on a quiet channel may wait in the rx ring for
/// the application's next wake-up before it causes one. The peer waits for
/// the ACK of its FIN (in LAST-ACK, its application gone on), but a FIN
/// sent alone is probed again only after 200 ms (RFC 8985's PTO for one
/// segment in flight, with Linux's and our delayed-ACK allowance), and a
/// server that closed first is woken by its next request far sooner. In
/// a connections-per-second run through two daemons, a server woken for
/// each FIN slept and woke 2.4 times per connection, against 1.1, and used
/// a third more CPU.
pub const QUIET_FIN_WAKE: Duration = Duration::from_millis(1);

/// How often an empty poll of a spinning loop reads the clock to run the
/// multiplexer's own timers (fragments, reassembly, TIME-WAIT holds).
const TIMED_POLL_EVERY: u32 = 64;

/// Counters of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Frames delivered on the rx ring, and their bytes.
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Frames its handlers consumed.
    pub rx_consumed: u64,
    /// Times the application was signalled (woken): for received frames,
    /// and because its transmitted frames were taken.
    pub rx_upcalls: u64,
    pub tx_upcalls: u64,
    /// Frames delivered on quiet channels ([`Desc::QUIET`]): they wake
    /// nobody.
    pub rx_quiet: u64,
    /// Wake-ups for a peer's FIN on a quiet channel, left unread for
    /// [`QUIET_FIN_WAKE`] (counted in `rx_upcalls` too).
    pub rx_fin_wakes: u64,
    /// Received frames dropped: no buffer on the free ring.
    pub rx_no_buffer: u64,
    /// Received frames dropped: rx ring full.
    pub rx_ring_full: u64,
    /// Received frames dropped: longer than a frame buffer.
    pub rx_too_long: u64,
    /// Invalid descriptors met on the free ring (skipped).
    pub free_bad_desc: u64,
    /// Frames sent, and their bytes.
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Transmit descriptors refused: invalid (range, alignment, length, flags).
    pub tx_bad_desc: u64,
    /// Transmit chains ([`Desc::MORE`]) refused as a whole, all their
    /// descriptors consumed and nothing sent: longer than [`MAX_PARTS`],
    /// parts on different channels, a later part inline, a part invalid
    /// (outside the frame area, the head outside one buffer, unknown
    /// flags), or longer in all than the link's frames.
    pub tx_bad_chain: u64,
    /// Transmit frames naming a channel that is not the endpoint's.
    pub tx_bad_channel: u64,
    /// Segments of connections accepted at its listeners that could not be
    /// followed before the connections had channels of their own: it
    /// followed its most (1024) already.
    pub tcp_unfollowed: u64,
    /// Frames that failed the channel's template (never sent).
    pub tx_template_mismatch: u64,
    /// Body fragments dropped: their channel sent no head for their
    /// datagram recently (never sent).
    pub tx_frag_no_head: u64,
    /// Frames the link refused.
    pub tx_link_error: u64,
    /// Frames the application wrote to its direct send port that the
    /// kernel's check passed, and their bytes (not in `tx_frames`).
    pub direct_frames: u64,
    pub direct_bytes: u64,
    /// Frames written to the direct send port that failed its check, or
    /// found its token bucket empty (never sent).
    pub direct_refused: u64,
    pub direct_over_rate: u64,
    /// Times a ring index from the application was impossible (a hostile or
    /// broken peer); the ring is skipped for that round.
    pub ring_errors: u64,
    /// Cycles ([`cycles`]) spent receiving for it: its share of
    /// classification, and its handlers.
    pub rx_cycles: u64,
    /// Cycles spent copying received frames into its segment.
    pub copy_cycles: u64,
    /// Cycles spent transmitting for it (reading, copying, checking,
    /// sending).
    pub tx_cycles: u64,
    /// Cycles its handlers ran (part of `rx_cycles`), and the fuel they
    /// burnt.
    pub handler_cycles: u64,
    pub handler_fuel: u64,
    /// Frames delivered without their handler: the endpoint's handlers had
    /// used their budget for the period ([`HandlerLimits::budget`]).
    pub handler_over_budget: u64,
}

impl EndpointStats {
    /// All receive drops.
    pub fn rx_dropped(&self) -> u64 {
        self.rx_no_buffer + self.rx_ring_full + self.rx_too_long
    }

    /// All transmit drops.
    pub fn tx_dropped(&self) -> u64 {
        self.tx_bad_desc
            + self.tx_bad_chain
            + self.tx_bad_channel
            + self.tx_template_mismatch
            + self.tx_frag_no_head
            + self.tx_link_error
            + self.direct_refused
            + self.direct_over_rate
    }

    /// Every counter with its name, for `exonet stats`.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("rx_frames", self.rx_frames),
            ("rx_bytes", self.rx_bytes),
            ("rx_consumed", self.rx_consumed),
            ("rx_upcalls", self.rx_upcalls),
            ("tx_upcalls", self.tx_upcalls),
            ("rx_quiet", self.rx_quiet),
            ("rx_fin_wakes", self.rx_fin_wakes),
            ("rx_no_buffer", self.rx_no_buffer),
            ("rx_ring_full", self.rx_ring_full),
            ("rx_too_long", self.rx_too_long),
            ("free_bad_desc", self.free_bad_desc),
            ("tx_frames", self.tx_frames),
            ("tx_bytes", self.tx_bytes),
            ("tx_bad_desc", self.tx_bad_desc),
            ("tx_bad_chain", self.tx_bad_chain),
            ("tx_bad_channel", self.tx_bad_channel),
            ("tcp_unfollowed", self.tcp_unfollowed),
            ("tx_template_mismatch", self.tx_template_mismatch),
            ("tx_frag_no_head", self.tx_frag_no_head),
            ("tx_link_error", self.tx_link_error),
            ("direct_frames", self.direct_frames),
            ("direct_bytes", self.direct_bytes),
            ("direct_refused", self.direct_refused),
            ("direct_over_rate", self.direct_over_rate),
            ("ring_errors", self.ring_errors),
            ("rx_cycles", self.rx_cycles),
            ("copy_cycles", self.copy_cycles),
            ("tx_cycles", self.tx_cycles),
            ("handler_cycles", self.handler_cycles),
            ("handler_fuel", self.handler_fuel),
            ("handler_over_budget", self.handler_over_budget),
        ]
    }
}

impl ChannelStats {
    /// Every counter with its name, for `exonet stats`.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("rx_frames", self.rx_frames),
            ("rx_bytes", self.rx_bytes),
            ("rx_consumed", self.rx_consumed),
            ("rx_dropped", self.rx_dropped),
            ("tx_frames", self.tx_frames),
            ("tx_bytes", self.tx_bytes),
            ("tx_template_mismatch", self.tx_template_mismatch),
            ("tx_frag_no_head", self.tx_frag_no_head),
            ("tcp_malformed", self.tcp_malformed),
            ("handler_runs", self.handler_runs),
            ("handler_aborts", self.handler_aborts),
            ("handler_out_of_fuel", self.handler_out_of_fuel),
            ("handler_traps", self.handler_traps),
            ("handler_bad_verdict", self.handler_bad_verdict),
            ("handler_dropped", self.handler_dropped),
            ("handler_sent", self.handler_sent),
            ("handler_send_refused", self.handler_send_refused),
        ]
    }
}

/// Counters of one channel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Frames its filter accepted, and their bytes.
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Of those, frames its handler consumed.
    pub rx_consumed: u64,
    /// Of those, frames dropped on delivery (the endpoint's drop counters
    /// say why).
    pub rx_dropped: u64,
    /// Frames sent on it, and their bytes.
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Frames on it that failed its template.
    pub tx_template_mismatch: u64,
    /// Body fragments on it without a recent head (see
    /// [`EndpointStats::tx_frag_no_head`]).
    pub tx_frag_no_head: u64,
    /// Frames on a TCP connection channel, sent or received, whose segment
    /// the connection tracking could not read (the `conn` module); they
    /// went their way untracked.
    pub tcp_malformed: u64,
    /// Times its handler ran; of those, the aborts: asked for by the
    /// handler, out of fuel, trapped (out of bounds, unreachable, stack
    /// overflow, an import misused...), or an unknown verdict. An aborted
    /// frame is delivered untouched.
    pub handler_runs: u64,
    pub handler_aborts: u64,
    pub handler_out_of_fuel: u64,
    pub handler_traps: u64,
    pub handler_bad_verdict: u64,
    /// Of the frames it consumed, those its handler dropped: a composed
    /// handler's layer refused them (see [`handlers::Handler`]).
    pub handler_dropped: u64,
    /// Frames its handler sent, and those the template refused.
    pub handler_sent: u64,
    pub handler_send_refused: u64,
}

/// A snapshot of one channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelSnapshot {
    pub id: ChannelId,
    pub endpoint: EndpointId,
    /// Its filters in DPF text, `" || "` between them.
    pub filter: String,
    pub has_handler: bool,
    pub stats: ChannelStats,
}

/// A snapshot of one endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSnapshot {
    pub id: EndpointId,
    pub uid: u32,
    pub privileged: bool,
    pub weight: u32,
    pub channels: Vec<ChannelId>,
    pub stats: EndpointStats,
}

/// A snapshot of the whole multiplexer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MuxStats {
    pub endpoints: Vec<EndpointSnapshot>,
    pub channels: Vec<ChannelSnapshot>,
    pub link: exonet_link::LinkStats,
    pub host: HostStats,
    /// Received frames no filter accepted (the host looked at them); ICMP
    /// errors routed to a socket channel are counted in
    /// [`HostStats::icmp_errors_delivered`] instead.
    pub rx_unmatched: u64,
    /// Received frames longer than the staging slot (cut; counted here).
    pub rx_truncated: u64,
    /// The fragment pool; body fragments it holds or drops are counted
    /// there, not in `rx_unmatched`.
    pub frag: FragStats,
}

struct Endpoint {
    ep: MuxEndpoint,
    uid: u32,
    privileged: bool,
    weight: u32,
    deficit: u64,
    channels: Vec<ChannelId>,
    stats: EndpointStats,
    /// Transmit descriptors are the rest of a chain too long: they are
    /// consumed, up to and including the next without [`Desc::MORE`].
    tx_skip: bool,
    /// All the tx ring held was the start of a chain, this many descriptors,
    /// whose end was not published: no work until more are, so that an
    /// application cannot keep the multiplexer from sleeping with one.
    tx_stalled: Option<u32>,
    /// Entries written on rx in this batch, published at its end.
    rx_pending: u32,
    /// Of those, entries of channels that are not quiet.
    rx_eager: u32,
    /// Entries taken from free in this batch, given back at its end.
    free_taken: u32,
    /// Its handlers' fuel in this period.
    budget: Budget,
    /// A quiet channel took the peer's FIN, and the wake-up it is owed waits
    /// in [`Mux::quiet_fins`].
    fin_owed: bool,
    /// Its direct send port, once it asked for one ([`Mux::open_direct`]).
    direct: Option<DirectPort>,
}

/// Where the multiplexer makes direct send ports ([`Mux::enable_direct`]).
#[derive(Clone, Debug)]
pub struct DirectConfig {
    /// The link's interface, which the ports are made on.
    pub lower: String,
    /// Each port's token bucket.
    pub rate: Rate,
}

impl Endpoint {
    /// Its counters, the direct send port's included.
    fn counters(&self) -> EndpointStats {
        let mut s = self.stats;
        if let Some(d) = &self.direct {
            let d = d.stats();
            s.direct_frames = d.passed;
            s.direct_bytes = d.passed_bytes;
            s.direct_refused = d.refused;
            s.direct_over_rate = d.over_rate;
        }
        s
    }

    /// Whether its tx ring holds work: anything but the same unfinished
    /// chain as when it was last looked at ([`Endpoint::tx_stalled`]).
    fn tx_ready(&mut self) -> bool {
        if !self.ep.tx.has_pending() {
            return false;
        }
        match self.tx_stalled {
            Some(seen) if self.ep.tx.peek(MAX_PARTS as u32) == Ok(seen) => false,
            _ => {
                self.tx_stalled = None;
                true
            }
        }
    }
}

struct Channel {
    endpoint: EndpointId,
    filter: FilterId,
    /// The filters as installed, for stats, of a channel bound with raw
    /// filters; a socket channel's are its spec's, written out when asked
    /// for (not at each connection's bind).
    text: Option<String>,
    stats: ChannelStats,
    template: Template,
    handler: Option<Box<dyn Handler>>,
    /// What a socket channel ([`Mux::bind_socket`]) is bound to: its port
    /// hold, released with the channel, and where ICMP errors about its
    /// traffic go.
    spec: Option<ChannelSpec>,
    /// Its transmit associations, when the multiplexer identifies its
    /// fragments: for socket channels and every channel of an unprivileged
    /// endpoint (a privileged raw channel sends what it likes).
    frags: Option<TxFrags>,
    /// What the multiplexer follows of a TCP connection channel's
    /// connection, to reset it or hold its TIME-WAIT when the channel goes.
    conn: Option<ConnTrack>,
    /// The link answers this listener's SYNs ([`Mux::answer_syns`]).
    syn_answers: bool,
    /// Its frames wake nobody ([`Desc::QUIET`]).
    quiet: bool,
}

/// What delivering to a channel takes of the multiplexer, borrowed field by
/// field ([`Receiving::delivery`]).
struct Delivery<'m> {
    channels: &'m mut IdMap<Channel>,
    followed: &'m mut Followed,
    endpoints: &'m mut BTreeMap<EndpointId, Endpoint>,
    hx: &'m mut HandlerTx,
    limits: &'m HandlerLimits,
    free_retries: u32,
    quiet_fins: &'m mut VecDeque<(Instant, EndpointId)>,
}

/// What receiving a batch takes of the multiplexer, borrowed field by field
/// ([`receiving!`]): all but the link, which lends the batch meanwhile
/// ([`Link::recv_lent`]).
struct Receiving<'m> {
    dpf: &'m mut Dpf,
    host: &'m mut Host,
    frag: &'m mut FragPool,
    ports: &'m mut Ports,
    time_wait: &'m mut TimeWaits,
    channels: &'m mut IdMap<Channel>,
    followed: &'m mut Followed,
    endpoints: &'m mut BTreeMap<EndpointId, Endpoint>,
    handler_tx: &'m mut HandlerTx,
    quiet_fins: &'m mut VecDeque<(Instant, EndpointId)>,
    config: &'m MuxConfig,
    rx_unmatched: &'m mut u64,
    rx_truncated: &'m mut u64,
    slot: usize,
}

/// The [`Receiving`] of a `Mux`.
macro_rules! receiving {
    ($mux:ident) => {
        Receiving {
            dpf: &mut $mux.dpf,
            host: &mut $mux.host,
            frag: &mut $mux.frag,
            ports: &mut $mux.ports,
            time_wait: &mut $mux.time_wait,
            channels: &mut $mux.channels,
            followed: &mut $mux.followed,
            endpoints: &mut $mux.endpoints,
            handler_tx: &mut $mux.handler_tx,
            quiet_fins: &mut $mux.quiet_fins,
            config: &$mux.config,
            rx_unmatched: &mut $mux.rx_unmatched,
            rx_truncated: &mut $mux.rx_truncated,
            slot: $mux.slot,
        }
    };
}

/// The multiplexer.
pub struct Mux {
    link: Box<dyn Link>,
    mac: [u8; 6],
    config: MuxConfig,
    dpf: Dpf,
    endpoints: BTreeMap<EndpointId, Endpoint>,
    next_endpoint: u32,
    channels: IdMap<Channel>,
    /// The channels of TCP connections, by 4-tuple: a connection accepted at
    /// a listener may send on the listener's channel until it learns of its
    /// own, and is followed on its own all the same.
    conn_channels: HashMap<Tuple, u32>,
    /// Connections followed on their listeners' channels until they have
    /// their own.
    followed: Followed,
    ports: Ports,
    host: Host,
    frag: FragPool,
    /// TCP connections in TIME-WAIT whose application went away.
    time_wait: TimeWaits,
    /// Endpoints owed a wake-up for a peer's FIN on a quiet channel, and
    /// when: in deadline order, as each is [`QUIET_FIN_WAKE`] after its FIN.
    quiet_fins: VecDeque<(Instant, EndpointId)>,
    rx_unmatched: u64,
    rx_truncated: u64,
    /// The longest frame taken whole (the link's): a longer one is cut to
    /// it and counted in `rx_truncated`.
    slot: usize,
    /// Where a link that cannot lend its frames in place copies them.
    lend: LendScratch,
    /// Endpoints whose tx ring moved in this transmit scan, told once the
    /// link was kicked.
    moved: Vec<EndpointId>,
    /// An application was signalled since [`Mux::take_woken`] last asked.
    woken: bool,
    /// Empty polls left before one reads the clock for the timers alone.
    untimed_polls: u32,
    /// Compiles handlers; made at the first install.
    engine: Option<Engine>,
    /// What handlers sent in this batch, sent at its end.
    handler_tx: HandlerTx,
    /// Where direct send ports are made, if they are.
    direct: Option<DirectConfig>,
    /// Direct send ports made so far (their names number them).
    direct_made: u32,
}

/// Frames handlers sent during a receive batch: one invocation's outbox,
/// then the batch's frames with their channels, checked and sent after it.
struct HandlerTx {
    outbox: Outbox,
    arena: Vec<u8>,
    frames: Vec<(u32, std::ops::Range<usize>)>,
}

impl Mux {
    /// A multiplexer on `link`, answering for `addrs`, with the link's MAC.
    pub fn new(link: Box<dyn Link>, addrs: Vec<Ipv4Addr>, config: MuxConfig) -> Mux {
        let mac = link.mac();
        let slot = link.max_frame_len();
        let rx_batch = config.rx_batch.clamp(1, MAX_RX_BATCH);
        Mux {
            mac,
            config: MuxConfig { rx_batch, ..config },
            dpf: {
                let mut d = Dpf::new();
                d.set_lazy(Some(DPF_SETTLE));
                d
            },
            endpoints: BTreeMap::new(),
            next_endpoint: 0,
            channels: IdMap::default(),
            conn_channels: HashMap::new(),
            followed: Followed::default(),
            ports: Ports::default(),
            host: Host::new(config.host, mac, addrs, link.mtu(), Instant::now()),
            frag: FragPool::new(&config),
            time_wait: TimeWaits::new(config.time_wait_max),
            quiet_fins: VecDeque::new(),
            rx_unmatched: 0,
            rx_truncated: 0,
            slot,
            lend: LendScratch::default(),
            moved: Vec::new(),
            woken: false,
            untimed_polls: 0,
            engine: None,
            handler_tx: HandlerTx {
                outbox: Outbox::new(config.handlers.sends, slot),
                arena: Vec::new(),
                frames: Vec::new(),
            },
            link,
            direct: None,
            direct_made: 0,
        }
    }

    /// Lets endpoints ask for direct send ports ([`Mux::open_direct`]) on
    /// `config.lower`, which must be the link's interface.
    pub fn enable_direct(&mut self, config: DirectConfig) {
        self.direct = Some(config);
    }

    /// Endpoint `id`'s direct send port, made at its first asking: a copy
    /// of its descriptor, for the application, and its token bucket. Its
    /// connected TCP channels, those bound already and those bound later,
    /// may send through it.
    pub fn open_direct(
        &mut self,
        id: EndpointId,
    ) -> Result<(std::os::fd::OwnedFd, Rate), MuxError> {
        let config = self
            .direct
            .as_ref()
            .ok_or_else(|| MuxError::NotPermitted("no direct send ports here".into()))?;
        let e = self
            .endpoints
            .get_mut(&id)
            .ok_or(MuxError::NoSuchEndpoint(id))?;
        if e.direct.is_none() {
            let name = exonet_link::direct::port_name(std::process::id(), self.direct_made);
            let port = DirectPort::create(&config.lower, &name, self.mac, config.rate)
                .map_err(|e| MuxError::Link(format!("direct send port: {e}")))?;
            self.direct_made += 1;
            for ch in &e.channels {
                let conn = self.channels.get(&ch.0).and_then(|c| direct_conn(c.spec?));
                if let Some(conn) = conn {
                    port.allow(conn)
                        .map_err(|e| MuxError::Link(format!("direct send port: {e}")))?;
                }
            }
            e.direct = Some(port);
        }
        let port = e.direct.as_ref().expect("made above");
        let fd = port
            .fd()
            .try_clone_to_owned()
            .map_err(|e| MuxError::Link(format!("direct send port: {e}")))?;
        Ok((fd, config.rate))
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    pub fn addrs(&self) -> &[Ipv4Addr] {
        &self.host.addrs
    }

    pub fn link(&self) -> &dyn Link {
        &*self.link
    }

    pub fn link_mut(&mut self) -> &mut dyn Link {
        &mut *self.link
    }

    /// Serves an endpoint owned by `uid`. A privileged endpoint may bind
    /// any filter and template and ports below 1024.
    pub fn add_endpoint(&mut self, ep: MuxEndpoint, uid: u32, privileged: bool) -> EndpointId {
        let id = EndpointId(self.next_endpoint);
        self.next_endpoint += 1;
        self.endpoints.insert(
            id,
            Endpoint {
                ep,
                uid,
                privileged,
                weight: 1,
                deficit: 0,
                channels: Vec::new(),
                stats: EndpointStats::default(),
                tx_skip: false,
                tx_stalled: None,
                rx_pending: 0,
                rx_eager: 0,
                free_taken: 0,
                budget: Budget::default(),
                fin_owed: false,
                direct: None,
            },
        );
        id
    }

    /// Stops serving an endpoint and reclaims everything it held: its
    /// channels, their filters, its ports. Its TCP connections are reset,
    /// or held in TIME-WAIT (see [`Mux::unbind_channel`]). Returns its side
    /// of the segment.
    pub fn remove_endpoint(&mut self, id: EndpointId) -> Result<MuxEndpoint, MuxError> {
        let e = self
            .endpoints
            .remove(&id)
            .ok_or(MuxError::NoSuchEndpoint(id))?;
        let now = Instant::now();
        for &ch in &e.channels {
            if let Some(mut c) = self.channels.remove(&ch.0) {
                revoke_direct(e.direct.as_ref(), &mut c);
                self.retire(ch, &c, now);
            }
        }
        for (t, conn) in self.followed.drain(id.0, None) {
            self.abandon_conn(&conn, t, now, None);
        }
        self.ports.release_all(id);
        Ok(e.ep)
    }

    /// Has the link answer the SYNs of TCP listener channel `ch` with SYN
    /// cookies, until the channel goes. The SYN-ACKs bypass the template check: they come from
    /// the listener's own address and port, to whoever sent the SYN.
    pub fn answer_syns(&mut self, ch: ChannelId, answers: &SynAnswers) -> Result<(), MuxError> {
        let c = self
            .channels
            .get(&ch.0)
            .ok_or(MuxError::NoSuchChannel(ch))?;
        let Some(spec) = c
            .spec
            .filter(|s| s.proto == Proto::Tcp && s.remote.is_none())
        else {
            return Err(MuxError::NotPermitted(
                "only a TCP listener's SYNs are answered".into(),
            ));
        };
        let l = exonet_link::SynListener {
            ip: spec.local_addr,
            port: spec.local_port,
            answers: answers.clone(),
        };
        self.link
            .answer_syns(&l)
            .map_err(|e| MuxError::Link(e.to_string()))?;
        if let Some(c) = self.channels.get_mut(&ch.0) {
            c.syn_answers = true;
        }
        Ok(())
    }

    /// A channel goes: it is no connection's channel any more, and the link
    /// answers no more SYNs for it.
    fn forget_conn_channel(&mut self, ch: ChannelId, c: &Channel) {
        if let Some(spec) = c.spec.filter(|_| c.syn_answers) {
            self.link
                .stop_answering_syns(spec.local_addr, spec.local_port);
        }
        let Some(t) = c.spec.as_ref().and_then(conn_tuple) else {
            return;
        };
        // A later channel of the same 4-tuple keeps its entry.
        if self.conn_channels.get(&t) == Some(&ch.0) {
            self.conn_channels.remove(&t);
        }
    }

    /// Channel `ch`, taken out of the table as `c`, goes: what it was
    /// followed for, its fragments, its filter, and its connection, which
    /// is reset or held in TIME-WAIT.
    fn retire(&mut self, ch: ChannelId, c: &Channel, now: Instant) {
        self.forget_conn_channel(ch, c);
        self.frag.forget_channel(ch);
        if !self.abandon(c, now) {
            // The filter was installed by us; deleting it cannot fail
            // unless the id is unknown, which would be a bug here.
            let _ = self.dpf.delete(c.filter);
        }
    }

    /// A channel is gone: if it carried a TCP connection, reset it or hold
    /// its TIME-WAIT, as the registry server does for an application that
    /// exits (Thekkath §III-D). Returns whether the hold took the channel's
    /// filter (its 4-tuple's, exactly the hold's).
    fn abandon(&mut self, c: &Channel, now: Instant) -> bool {
        let (Some(conn), Some(t)) = (&c.conn, c.spec.as_ref().and_then(conn_tuple)) else {
            return false;
        };
        self.abandon_conn(conn, t, now, Some(c.filter))
    }

    /// Connection `t`, followed as `conn`, is abandoned. A TIME-WAIT hold
    /// takes `filter` (the 4-tuple's) if there is one, else installs its
    /// own; returns whether it took `filter`.
    fn abandon_conn(
        &mut self,
        conn: &ConnTrack,
        t: Tuple,
        now: Instant,
        filter: Option<FilterId>,
    ) -> bool {
        match conn.fate(now, time_wait_span(&self.config)) {
            Fate::Done => {}
            Fate::Reset { seq, to } => {
                // RFC 9293 §3.10.5 ABORT: <SEQ=SND.NXT><CTL=RST>; SND.MAX is
                // the peer's RCV.NXT when it has everything (RFC 5961 §3.2).
                if self.host.send_tcp(to, t, flags::RST, seq, 0) {
                    self.host.stats.tcp_aborted += 1;
                }
                // What the link does not take now goes with the next poll.
                let _ = self.flush_host();
            }
            Fate::TimeWait(hold) => return self.hold_time_wait(t, hold, filter),
        }
        false
    }

    /// Holds a connection in TIME-WAIT until `until`: a filter of the
    /// multiplexer's own takes its 4-tuple (so that a listener on the port
    /// does not get the old connection's segments), and its port is not
    /// handed out as an ephemeral one.
    /// Its filter is `filter` if given (the channel's that carried the
    /// connection: a delete and an insert of the same filter saved per
    /// connection); returns whether it took it.
    fn hold_time_wait(&mut self, t: Tuple, hold: Hold, filter: Option<FilterId>) -> bool {
        // Another channel of the same 4-tuple was held before: this one is
        // the later incarnation.
        if let Some(old) = self.time_wait.remove_tuple(&t) {
            release_time_wait(&mut self.dpf, &mut self.ports, old);
        }
        while self.time_wait.len() >= self.time_wait.max() {
            let Some(old) = self.time_wait.pop_oldest() else {
                break;
            };
            release_time_wait(&mut self.dpf, &mut self.ports, old);
            self.host.stats.time_wait_evicted += 1;
        }
        let taken = filter.is_some();
        let filter = match (self.time_wait.max(), filter) {
            (0, _) => None,
            (_, Some(f)) => Some(f),
            (_, None) => {
                let spec = ChannelSpec {
                    proto: Proto::Tcp,
                    local_addr: t.local.0,
                    local_port: t.local.1,
                    remote: Some(t.remote),
                };
                self.dpf.insert(&registry::socket_filter(&spec)).ok()
            }
        };
        let Some(filter) = filter else {
            self.host.stats.time_wait_evicted += 1;
            return false;
        };
        self.ports.hold(Proto::Tcp, t.local.1);
        self.time_wait.insert(filter.0, t, hold);
        self.host.stats.time_wait_held += 1;
        taken
    }

    /// Holds the TIME-WAIT of the followed connections that finished: the
    /// library lets go of a connection in TIME-WAIT, and one without a
    /// channel of its own has no unbind to say so.
    fn settle_followed(&mut self, now: Instant) {
        for (t, conn) in self.followed.take_finished() {
            self.abandon_conn(&conn, t, now, None);
        }
    }

    /// Wakes the endpoints whose quiet FIN has waited [`QUIET_FIN_WAKE`],
    /// unless their application has read their rx ring since.
    fn wake_for_quiet_fins(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.quiet_fins.front() {
            if at > now {
                return;
            }
            self.quiet_fins.pop_front();
            let Some(e) = self.endpoints.get_mut(&id) else {
                continue;
            };
            e.fin_owed = false;
            if e.ep.rx.outstanding() == 0 {
                continue;
            }
            // A failed doorbell leaves the FIN to the application's own
            // timers, as for any wake-up.
            if e.ep.upcall.notify_rx_if(&e.ep.rx, true).unwrap_or(false) {
                e.stats.rx_upcalls += 1;
                e.stats.rx_fin_wakes += 1;
                self.woken = true;
            }
        }
    }

    /// Sets an endpoint's transmit weight (at least 1).
    pub fn set_weight(&mut self, id: EndpointId, weight: u32) -> Result<(), MuxError> {
        self.endpoint_mut(id)?.weight = weight.max(1);
        Ok(())
    }

    fn endpoint_mut(&mut self, id: EndpointId) -> Result<&mut Endpoint, MuxError> {
        self.endpoints
            .get_mut(&id)
            .ok_or(MuxError::NoSuchEndpoint(id))
    }

    /// Binds a channel of `ep` to a filter (several: any of them) and a
    /// transmit template. An unprivileged endpoint's filters must pin IPv4,
    /// first fragments, one of our addresses and a protocol and port it
    /// owns ([`Mux::allocate_port`]), and its template our MAC, IPv4
    /// without options, one of our addresses and a protocol
    /// and source port it owns.
    pub fn bind_channel(
        &mut self,
        ep: EndpointId,
        filters: &[Filter],
        template: Template,
    ) -> Result<ChannelId, MuxError> {
        let e = self
            .endpoints
            .get(&ep)
            .ok_or(MuxError::NoSuchEndpoint(ep))?;
        if !e.privileged {
            if filters.is_empty() {
                return Err(MuxError::NotPermitted("no filter".into()));
            }
            for f in filters {
                registry::check_filter(f, ep, &self.host.addrs, &self.ports)?;
            }
            registry::check_template(&template, ep, self.mac, &self.host.addrs, &self.ports)?;
        }
        self.install(ep, filters, template, None)
    }

    fn install(
        &mut self,
        ep: EndpointId,
        filters: &[Filter],
        template: Template,
        spec: Option<ChannelSpec>,
    ) -> Result<ChannelId, MuxError> {
        let privileged = self.endpoints.get(&ep).is_some_and(|e| e.privileged);
        let frags = (spec.is_some() || !privileged).then(|| {
            let timeout = self.config.tx_frag_timeout.min(frag::MAX_TIMEOUT);
            TxFrags::new(self.config.tx_frag_datagrams, timeout)
        });
        let filter = self.dpf.insert_any(filters)?;
        let id = ChannelId(filter.0);
        // A connection's channel takes over what was followed of it on its
        // listener's, "quiet" included.
        let (conn, quiet) = match spec.as_ref().and_then(conn_tuple) {
            Some(t) => {
                self.conn_channels.insert(t, id.0);
                let (conn, quiet) = self.followed.take(ep.0, &t).unwrap_or_default();
                (Some(conn), quiet)
            }
            None => (None, false),
        };
        let text = spec.is_none().then(|| {
            filters
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join(" || ")
        });
        self.channels.insert(
            id.0,
            Channel {
                endpoint: ep,
                filter,
                text,
                stats: ChannelStats::default(),
                template,
                handler: None,
                spec,
                frags,
                conn,
                syn_answers: false,
                quiet,
            },
        );
        if let Some(e) = self.endpoints.get_mut(&ep) {
            e.channels.push(id);
        }
        Ok(id)
    }

    /// Binds a UDP, TCP or ICMP echo channel: allocates the port (ICMP: the
    /// echo identifier; 0: ephemeral) in the registry, builds and installs
    /// its filter and template. Returns the channel and the port. ICMP
    /// errors quoting the channel's UDP or TCP traffic are delivered on it
    /// too.
    pub fn bind_socket(
        &mut self,
        ep: EndpointId,
        spec: ChannelSpec,
    ) -> Result<(ChannelId, u16), MuxError> {
        let privileged = self
            .endpoints
            .get(&ep)
            .ok_or(MuxError::NoSuchEndpoint(ep))?
            .privileged;
        if !self.host.addrs.contains(&spec.local_addr) {
            return Err(MuxError::NotOurAddress(spec.local_addr));
        }
        if let (Proto::Tcp, Some(remote)) = (spec.proto, spec.remote) {
            let local = (spec.local_addr, spec.local_port);
            if self.time_wait.contains(&Tuple { local, remote }) {
                return Err(MuxError::InTimeWait { local, remote });
            }
        }
        let port = self
            .ports
            .allocate(spec.proto, spec.local_port, ep, privileged)?;
        let spec = ChannelSpec {
            local_port: port,
            ..spec
        };
        let filter = registry::socket_filter(&spec);
        let template = registry::socket_template(self.mac, &spec);
        match self.install(ep, &[filter], template, Some(spec)) {
            Ok(ch) => {
                let direct = self.endpoints.get(&ep).and_then(|e| e.direct.as_ref());
                if let (Some(d), Some(conn)) = (direct, direct_conn(spec)) {
                    // Refused rather than bound without it: the application
                    // would send the connection's frames to a port that
                    // drops them.
                    if let Err(e) = d.allow(conn) {
                        let _ = self.unbind_channel(ch);
                        return Err(MuxError::Link(format!("direct send port: {e}")));
                    }
                }
                Ok((ch, port))
            }
            Err(e) => {
                self.ports.release(spec.proto, port, ep);
                Err(e)
            }
        }
    }

    /// Allocates a port to `ep` (0: ephemeral) for channels it binds with
    /// raw filters; held until [`Mux::release_port`] or the endpoint goes.
    pub fn allocate_port(
        &mut self,
        ep: EndpointId,
        proto: Proto,
        port: u16,
    ) -> Result<u16, MuxError> {
        let privileged = self
            .endpoints
            .get(&ep)
            .ok_or(MuxError::NoSuchEndpoint(ep))?
            .privileged;
        self.ports.allocate(proto, port, ep, privileged)
    }

    /// Drops one hold of `ep` on a port; false if it held none.
    pub fn release_port(&mut self, ep: EndpointId, proto: Proto, port: u16) -> bool {
        self.ports.release(proto, port, ep)
    }

    /// The ports `ep` holds.
    pub fn ports_of(&self, ep: EndpointId) -> Vec<(Proto, u16)> {
        self.ports.owned_by(ep)
    }

    /// Removes a channel: its filter, and the port hold of a socket channel.
    /// A TCP connection channel's connection that has not finished is
    /// reset (its application abandoned it); one in TIME-WAIT is held by
    /// the multiplexer for what remains of 2×MSL ([`MuxConfig::msl`]):
    /// segments on it are acknowledged, a connected channel of the same
    /// 4-tuple is refused ([`MuxError::InTimeWait`]) and the port is not
    /// handed out as an ephemeral one meanwhile.
    pub fn unbind_channel(&mut self, ch: ChannelId) -> Result<(), MuxError> {
        let mut c = self
            .channels
            .remove(&ch.0)
            .ok_or(MuxError::NoSuchChannel(ch))?;
        let now = Instant::now();
        let port = self
            .endpoints
            .get(&c.endpoint)
            .and_then(|e| e.direct.as_ref());
        revoke_direct(port, &mut c);
        self.retire(ch, &c, now);
        if let Some(spec) = c.spec {
            self.ports.release(spec.proto, spec.local_port, c.endpoint);
        }
        if let Some(e) = self.endpoints.get_mut(&c.endpoint) {
            e.channels.retain(|&x| x != ch);
        }
        if let Some(spec) = c
            .spec
            .filter(|s| s.proto == Proto::Tcp && s.remote.is_none())
        {
            let local = (spec.local_addr, spec.local_port);
            for (t, conn) in self.followed.drain(c.endpoint.0, Some(local)) {
                self.abandon_conn(&conn, t, now, None);
            }
        }
        Ok(())
    }

    /// Sets (or clears) the handler run on each frame the channel receives.
    pub fn set_handler(
        &mut self,
        ch: ChannelId,
        handler: Option<Box<dyn Handler>>,
    ) -> Result<(), MuxError> {
        self.channels
            .get_mut(&ch.0)
            .ok_or(MuxError::NoSuchChannel(ch))?
            .handler = handler;
        Ok(())
    }

    /// Installs an application's handler (ASH) on one of its channels,
    /// replacing any it had: validates and compiles its pipe lists and
    /// module (`module`, the bytes `spec.module` stands for when they came
    /// in a memfd), and checks its window against the endpoint's frame
    /// area. Refusals are [`MuxError::BadHandler`] with the reason.
    pub fn install_handler(
        &mut self,
        ch: ChannelId,
        spec: &HandlerSpec,
        module: &[u8],
    ) -> Result<(), MuxError> {
        let owner = self.channel_owner(ch).ok_or(MuxError::NoSuchChannel(ch))?;
        let e = self
            .endpoints
            .get(&owner)
            .ok_or(MuxError::NoSuchEndpoint(owner))?;
        let engine = match &self.engine {
            Some(engine) => engine,
            None => self
                .engine
                .insert(Engine::new().map_err(|e| MuxError::BadHandler(e.to_string()))?),
        };
        let h = handlers::download(
            engine,
            spec,
            module,
            &e.ep.frames,
            &self.config.handlers,
            self.slot,
        )
        .map_err(MuxError::BadHandler)?;
        self.set_handler(ch, Some(Box::new(h)))
    }

    /// The channels of an endpoint.
    pub fn channels_of(&self, ep: EndpointId) -> Vec<ChannelId> {
        self.endpoints
            .get(&ep)
            .map_or_else(Vec::new, |e| e.channels.clone())
    }

    /// The endpoint a channel belongs to.
    pub fn channel_owner(&self, ch: ChannelId) -> Option<EndpointId> {
        self.channels.get(&ch.0).map(|c| c.endpoint)
    }

    /// The MAC of `ip` from the ARP cache; if unknown, sends a request (at
    /// most one per [`HostConfig::arp_retry`]) and returns `None`: ask
    /// again later.
    pub fn resolve(&mut self, ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
        let r = self.host.resolve(ip, Instant::now());
        self.flush_host()?;
        Ok(r.map(|m| m.0))
    }

    /// The MAC of `ip` if the ARP cache has it.
    pub fn arp_lookup(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.host.lookup(ip, Instant::now()).map(|m| m.0)
    }

    /// Counters of one endpoint.
    pub fn endpoint_stats(&self, id: EndpointId) -> Option<EndpointStats> {
        self.endpoints.get(&id).map(Endpoint::counters)
    }

    /// Counters of one channel.
    pub fn channel_stats(&self, ch: ChannelId) -> Option<ChannelStats> {
        self.channels.get(&ch.0).map(|c| c.stats)
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> MuxStats {
        MuxStats {
            endpoints: self
                .endpoints
                .iter()
                .map(|(&id, e)| EndpointSnapshot {
                    id,
                    uid: e.uid,
                    privileged: e.privileged,
                    weight: e.weight,
                    channels: e.channels.clone(),
                    stats: e.counters(),
                })
                .collect(),
            channels: {
                let mut v: Vec<ChannelSnapshot> = self
                    .channels
                    .iter()
                    .map(|(&id, c)| ChannelSnapshot {
                        id: ChannelId(id),
                        endpoint: c.endpoint,
                        filter: match (&c.text, &c.spec) {
                            (Some(text), _) => text.clone(),
                            (None, Some(spec)) => registry::socket_filter(spec).to_string(),
                            (None, None) => String::new(),
                        },
                        has_handler: c.handler.is_some(),
                        stats: c.stats,
                    })
                    .collect();
                v.sort_by_key(|c| c.id);
                v
            },
            link: self.link.stats(),
            host: HostStats {
                time_wait_now: self.time_wait.len() as u64,
                ..self.host.stats()
            },
            rx_unmatched: self.rx_unmatched,
            rx_truncated: self.rx_truncated,
            frag: self.frag.stats(),
        }
    }

    /// Sends what the host queued (replies, ARP requests), as far as the
    /// link takes it.
    fn flush_host(&mut self) -> io::Result<()> {
        while let Some(f) = self.host.out.front() {
            if self.link.send_batch(&[f])? == 0 {
                break;
            }
            self.host.out.pop_front();
        }
        Ok(())
    }

    /// One iteration of the loop: a receive batch and a transmit scan.
    /// Returns the frames received plus the frames sent.
    pub fn poll(&mut self) -> io::Result<usize> {
        if self.dpf.is_stale() {
            self.dpf.settle(Instant::now());
        }
        Ok(self.poll_rx()? + self.poll_tx()?)
    }

    /// Whether an application was signalled (woken) since the last ask. A
    /// loop that polls on should then yield the CPU once: the application
    /// may be waiting for this very CPU, and would otherwise wait out the
    /// loop's polls (in a daemon's connections-per-second run, 12–17 µs at
    /// each of its wake-ups).
    pub fn take_woken(&mut self) -> bool {
        std::mem::take(&mut self.woken)
    }

    /// The run loop: busy-polls while there is work; after
    /// `idle_spins` empty polls, sleeps on the link's descriptor and every
    /// endpoint's doorbell for at most `latency` (and the link's own
    /// [`Link::poll_timeout`]). Runs while `keep_going` says so (it is asked
    /// before every iteration).
    pub fn run(
        &mut self,
        config: RunConfig,
        mut keep_going: impl FnMut(&Mux) -> bool,
    ) -> io::Result<()> {
        let mut idle = Idle::new(config);
        while keep_going(self) {
            let work = self.poll()?;
            if self.take_woken() {
                std::thread::yield_now();
            }
            if idle.should_sleep(work) {
                self.wait(config.latency)?;
            }
        }
        Ok(())
    }

    /// Sleeps until the link or an endpoint's doorbell is readable, or
    /// `max` passes. Returns whether something became readable.
    pub fn wait(&mut self, max: Duration) -> io::Result<bool> {
        self.wait_also(max, &[])
    }

    /// [`wait`](Self::wait), also waking when one of `extra` is readable
    /// (control sockets, a stop signal); draining those is the caller's job.
    pub fn wait_also(&mut self, max: Duration, extra: &[BorrowedFd<'_>]) -> io::Result<bool> {
        self.untimed_polls = 0;
        // Tell every application we sleep (so its kick rings our doorbell),
        // then look once more: work published before the flag was seen
        // would otherwise wait for the timeout.
        for e in self.endpoints.values() {
            e.ep.wake.announce_sleep();
        }
        let ready = self.link.prepare_sleep() || self.endpoints.values_mut().any(|e| e.tx_ready());
        let r = if ready {
            Ok(true)
        } else {
            self.block(max, extra)
        };
        for e in self.endpoints.values() {
            e.ep.wake.end_sleep();
        }
        r
    }

    /// The blocking half of [`wait`](Self::wait).
    fn block(&mut self, max: Duration, extra: &[BorrowedFd<'_>]) -> io::Result<bool> {
        let mut timeout = self.link.poll_timeout().map_or(max, |t| t.min(max));
        if self.dpf.is_stale() {
            // Wake to compile the filters once their changes pause.
            timeout = timeout.min(DPF_SETTLE);
        }
        if let Some(&(at, _)) = self.quiet_fins.front() {
            timeout = timeout.min(at.saturating_duration_since(Instant::now()));
        }
        let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.endpoints.len() + extra.len() + 1);
        let events = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        fds.extend(extra.iter().map(|fd| events(fd.as_raw_fd())));
        if let Some(fd) = self.link.as_raw_fd() {
            fds.push(events(fd));
        }
        for e in self.endpoints.values() {
            fds.push(events(e.ep.wake.doorbell().as_fd().as_raw_fd()));
        }
        // SAFETY: `fds` is a live array of `fds.len()` pollfds, for the
        // duration of the call; the descriptors are owned by `self`.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        // Drain the endpoints' doorbells that rang (the link's readiness is
        // level-triggered and cleared by receiving). A doorbell that fails
        // to drain is the application's own trouble: it only costs it
        // wake-ups.
        let first = fds.len() - self.endpoints.len();
        for (e, p) in self.endpoints.values().zip(&fds[first..]) {
            if p.revents != 0 {
                let _ = e.ep.wake.doorbell().drain();
            }
        }
        Ok(r > 0)
    }

    /// One receive batch: takes up to `rx_batch` frames from the link,
    /// classifies and delivers them, answers for the host, wakes each
    /// endpoint that got frames once. Returns the number of frames taken.
    pub fn poll_rx(&mut self) -> io::Result<usize> {
        self.receive(None)
    }

    /// [`poll_rx`](Self::poll_rx) with `now` as the clock of the fragment
    /// pool and the host (tests drive it). The pool's expired associations
    /// and waiting fragments are dropped before the batch is delivered.
    pub fn poll_rx_at(&mut self, now: Instant) -> io::Result<usize> {
        self.receive(Some(now))
    }

    fn receive(&mut self, clock: Option<Instant>) -> io::Result<usize> {
        let max = self.config.rx_batch;
        // The clock is read at the first frame (or given), and the pool's
        // and the holds' expiries run before any frame is delivered.
        let mut now = clock;
        let (mut n, mut expired) = (0, false);
        let mut rx = receiving!(self);
        self.link.recv_lent(&mut self.lend, max, &mut |frames| {
            let frames = &frames[..frames.len().min(max - n)];
            if frames.is_empty() {
                return;
            }
            let t = *now.get_or_insert_with(Instant::now);
            if !expired {
                rx.expire(t);
                expired = true;
            }
            rx.deliver_lent(frames, t);
            n += frames.len();
        })?;
        // The clock is read only when there is something to time, and then
        // by an empty poll of a busy-polling loop only every
        // TIMED_POLL_EVERY: its deadlines are seconds away, and the reads
        // were 3.5% of a spinning daemon's time while it held TIME-WAITs.
        // The first poll after a sleep reads it.
        let timing = n == 0
            && (!self.frag.is_empty()
                || self.host.reassembling()
                || !self.time_wait.is_empty()
                || !self.quiet_fins.is_empty())
            && match self.untimed_polls.checked_sub(1) {
                Some(left) => {
                    self.untimed_polls = left;
                    false
                }
                None => {
                    self.untimed_polls = TIMED_POLL_EVERY - 1;
                    true
                }
            };
        if n > 0 || timing || now.is_some() {
            let now = now.unwrap_or_else(Instant::now);
            if !expired {
                receiving!(self).expire(now);
            }
            if n > 0 {
                for e in self.endpoints.values_mut() {
                    self.woken |= e.publish();
                }
            }
            self.wake_for_quiet_fins(now);
            self.settle_followed(now);
        }
        self.flush_host()?;
        self.flush_handler_tx();
        Ok(n)
    }

    /// Sends what handlers sent in the batch, each frame checked against
    /// its channel's template as the application's own frames are.
    fn flush_handler_tx(&mut self) {
        if self.handler_tx.frames.is_empty() {
            return;
        }
        let mut clock = None;
        let HandlerTx { arena, frames, .. } = &mut self.handler_tx;
        for (chan, range) in frames.drain(..) {
            let Some(ch) = self.channels.get_mut(&chan) else {
                continue;
            };
            let frame = &mut arena[range];
            let fits = check_tx(ch, frame, &mut self.host.idents, &mut clock).is_ok()
                && frame.len() >= exonet_link::MIN_FRAME_LEN
                && frame.len() <= self.link.max_frame_len();
            let e = self.endpoints.get_mut(&ch.endpoint);
            if !fits {
                ch.stats.handler_send_refused += 1;
                ch.stats.tx_template_mismatch += 1;
                if let Some(e) = e {
                    e.stats.tx_template_mismatch += 1;
                }
                continue;
            }
            let sent = matches!(self.link.send_batch(&[frame]), Ok(1));
            let Some(e) = e else { continue };
            if sent {
                ch.stats.handler_sent += 1;
                ch.stats.tx_frames += 1;
                ch.stats.tx_bytes += frame.len() as u64;
                e.stats.tx_frames += 1;
                e.stats.tx_bytes += frame.len() as u64;
                if let Some(conn) = &mut ch.conn {
                    if !conn.on_sent(frame) {
                        ch.stats.tcp_malformed += 1;
                    }
                }
            } else {
                e.stats.tx_link_error += 1;
            }
        }
        arena.clear();
    }

    /// One transmit scan: visits endpoints with pending transmit
    /// descriptors in deficit round robin (by bytes, weighted), checks and
    /// sends their frames, until they are all empty, the link is full, or
    /// `tx_budget` descriptors were handled. Returns the number of frames
    /// sent.
    pub fn poll_tx(&mut self) -> io::Result<usize> {
        self.transmit(None)
    }

    /// [`poll_tx`](Self::poll_tx) with `now` as the clock of the channels'
    /// transmit associations (tests drive it).
    pub fn poll_tx_at(&mut self, now: Instant) -> io::Result<usize> {
        self.transmit(Some(now))
    }

    fn transmit(&mut self, mut clock: Option<Instant>) -> io::Result<usize> {
        if self.endpoints.values().all(|e| !e.ep.tx.has_pending()) {
            // Nothing to scan (most calls of a request-response exchange):
            // only a kick that an earlier scan could not make is retried.
            return self.link.uncork().map(|()| 0);
        }
        let mut budget = self.config.tx_budget;
        let mut sent = 0;
        let mut link_err = None;
        let quantum = self.config.quantum as u64;
        // Frames go to the link one at a time (each checked on its own copy),
        // and into the kernel with one kick for the lot.
        self.link.cork();
        'rounds: while budget > 0 {
            let mut any = false;
            // An endpoint alone with frames to send has nobody to take turns
            // with: its turn may take the whole budget. A round per frame
            // cost each frame two clock reads and a load and a store of each
            // ring's index (1 GB through two daemons: 12% of the sending
            // daemon's own work).
            let alone = self
                .endpoints
                .values_mut()
                .filter_map(|e| e.tx_ready().then_some(()))
                .take(2)
                .count()
                == 1;
            // A turn adds and removes no endpoint: they are visited in place.
            for (&id, e) in self.endpoints.iter_mut() {
                if !e.tx_ready() {
                    e.deficit = 0;
                    continue;
                }
                e.deficit = if alone {
                    u64::MAX
                } else {
                    e.deficit + quantum * e.weight as u64
                };
                let t0 = cycles::now();
                let turn = tx_turn(
                    id,
                    e,
                    TxChannels {
                        by_id: &mut self.channels,
                        conns: &self.conn_channels,
                        followed: &mut self.followed,
                    },
                    &mut *self.link,
                    &mut budget,
                    &mut self.host.idents,
                    &mut clock,
                );
                e.stats.tx_cycles += cycles::now().saturating_sub(t0);
                if alone {
                    // What was left of the budget is no credit for later.
                    e.deficit = 0;
                }
                sent += turn.sent;
                // Only progress, or a deficit still short of the next frame,
                // earns another round: a ring that errs or a completion
                // ring that is full must not keep the scan spinning.
                any |= turn.moved || turn.short;
                if turn.moved && !self.moved.contains(&id) {
                    self.moved.push(id);
                }
                if let Some(err) = turn.link_error {
                    link_err = Some(err);
                    break 'rounds;
                }
                if turn.link_full || budget == 0 {
                    break 'rounds;
                }
            }
            if !any {
                break;
            }
        }
        if let Err(err) = self.link.uncork() {
            link_err.get_or_insert(err);
        }
        // After the kick: waking an application first could delay it.
        for id in self.moved.drain(..) {
            if let Some(e) = self.endpoints.get_mut(&id) {
                let woke = e.ep.upcall.notify_tx_done().unwrap_or(false);
                e.stats.tx_upcalls += u64::from(woke);
                self.woken |= woke;
            }
        }
        if self.followed.any_finished() {
            self.settle_followed(clock.unwrap_or_else(Instant::now));
        }
        match link_err {
            Some(err) if sent == 0 => Err(err),
            _ => Ok(sent),
        }
    }
}

/// The socket channel an ICMP error (RFC 1122 §4.1.3.3, §3.2.2.1)
/// concerns: among the channels of the quoted source port's owner, the one
/// connected to the quoted destination, else the unconnected one. Counted
/// in [`HostStats`] when it is an error for us at all.
fn route_icmp_error(
    host: &mut Host,
    ports: &Ports,
    endpoints: &BTreeMap<EndpointId, Endpoint>,
    channels: &IdMap<Channel>,
    frame: &[u8],
) -> Option<u32> {
    let quoted = host::icmp_error_quote(frame, &host.addrs)?;
    let chan = host::quoted_flow(quoted, &host.addrs).and_then(|q| {
        let owner = ports.owner(q.proto, q.local.1)?;
        let mut unconnected = None;
        for &c in &endpoints.get(&owner)?.channels {
            let Some(spec) = channels.get(&c.0).and_then(|ch| ch.spec) else {
                continue;
            };
            if (spec.proto, spec.local_addr, spec.local_port) != (q.proto, q.local.0, q.local.1) {
                continue;
            }
            match spec.remote {
                Some(r) if r == q.remote => return Some(c.0),
                None => unconnected = unconnected.or(Some(c.0)),
                Some(_) => {}
            }
        }
        unconnected
    });
    match chan {
        Some(_) => host.stats.icmp_errors_delivered += 1,
        None => host.stats.icmp_errors_unclaimed += 1,
    }
    chan
}

impl Receiving<'_> {
    /// Drops what ran out by `now`: the fragment pool's, the host's
    /// reassemblies, and the TIME-WAIT holds.
    fn expire(&mut self, now: Instant) {
        self.frag.expire(now);
        self.host.expire(now);
        self.expire_time_wait(now);
    }

    /// Ends the holds whose 2×MSL ran out by `now`.
    fn expire_time_wait(&mut self, now: Instant) {
        while let Some(old) = self.time_wait.pop_expired(now) {
            release_time_wait(self.dpf, self.ports, old);
            self.host.stats.time_wait_expired += 1;
        }
    }

    fn delivery(&mut self) -> Delivery<'_> {
        Delivery {
            channels: self.channels,
            followed: self.followed,
            endpoints: self.endpoints,
            hx: self.handler_tx,
            limits: &self.config.handlers,
            free_retries: self.config.free_retries,
            quiet_fins: self.quiet_fins,
        }
    }

    /// Classifies and delivers a slice of lent frames, each with its
    /// checksum word.
    fn deliver_lent(&mut self, frames: &[Lent<'_>], clock: Instant) {
        // Classified a chunk at a time: small arrays, nothing to clear for
        // frames that are not there. Arrays sized for a few frames serve the
        // small batches of a request-response exchange (filling the whole
        // chunk's for one frame cost more than classifying it).
        for chunk in frames.chunks(CLASSIFY_CHUNK) {
            if chunk.len() <= SMALL_CHUNK {
                self.deliver_chunk::<SMALL_CHUNK>(chunk, clock);
            } else {
                self.deliver_chunk::<CLASSIFY_CHUNK>(chunk, clock);
            }
        }
    }

    /// Delivers `frames` (at most `N`), each with its checksum word.
    fn deliver_chunk<const N: usize>(&mut self, frames: &[Lent<'_>], clock: Instant) {
        let k = frames.len();
        let mut views: [&[u8]; N] = [&[]; N];
        let mut oks = [false; N];
        for ((v, ok), &(f, checked)) in views.iter_mut().zip(&mut oks).zip(frames) {
            // A frame longer than the link's own is cut to it, and its
            // checksum no longer vouched for.
            let whole = f.len() <= self.slot;
            *self.rx_truncated += u64::from(!whole);
            *v = &f[..f.len().min(self.slot)];
            *ok = checked && whole;
        }
        let mut ids = [None; N];
        let t0 = cycles::now();
        self.dpf.demux_batch(&views[..k], &mut ids[..k]);
        let mut now = cycles::now();
        let demux_share = now.saturating_sub(t0) / k as u64;
        // By reference: the array of ids is not copied for the loop.
        for (j, (frame, &id)) in views[..k].iter().zip(&ids[..k]).enumerate() {
            let frame = *frame;
            if frame.len() >= 14 && frame[12..14] == [0x08, 0x06] {
                self.host.on_arp(frame, clock);
            }
            let kind = frag::kind(frame);
            let (to, waited) = match kind {
                FragKind::Whole => (
                    id.map_or(To::Nobody, |id| To::Channel(ChannelId(id.0))),
                    Vec::new(),
                ),
                // A body fragment goes where its head went, whatever a
                // filter says of it: it carries no port to classify on.
                FragKind::Body => (self.frag.body(frame, clock), Vec::new()),
                FragKind::Head => {
                    let chan = id.map(|id| id.0).filter(|c| self.channels.contains_key(c));
                    let to = match chan {
                        Some(c) => To::Channel(ChannelId(c)),
                        None if self.host.takes_fragment(frame) => To::Host,
                        None => To::Nobody,
                    };
                    (to, self.frag.head(frame, to, clock))
                }
            };
            let chan = match to {
                To::Channel(c) => Some(c.0),
                _ => None,
            };
            // An ICMP error no filter took goes to the socket whose
            // datagram it quotes: only here, off the fast path.
            let chan = match chan {
                None if kind == FragKind::Whole => {
                    route_icmp_error(self.host, self.ports, self.endpoints, self.channels, frame)
                }
                c => c,
            };
            // A fragment's checksum is the whole datagram's: never known here.
            let ok = oks[j] && kind == FragKind::Whole;
            let owner =
                chan.and_then(|c| to_channel(self.delivery(), c, (frame, ok), &waited, clock));
            // The clock as the delivery's copy ended, read once for both (a
            // read costs ~27 ns in these VMs: three a frame were 6% of a
            // receiving daemon's samples).
            let t = match &owner {
                Some(d) if d.ended != 0 => d.ended,
                _ => cycles::now(),
            };
            let Some(Delivered {
                endpoint: e, copy, ..
            }) = owner
            else {
                // A filter without a channel: a connection the
                // multiplexer holds in TIME-WAIT.
                if let Some(c) = chan.filter(|&c| self.time_wait.holds(c)) {
                    if let Some((filter, t)) = self.time_wait.reopen(c, frame) {
                        release_time_wait(self.dpf, self.ports, (filter, t));
                        self.host.stats.time_wait_reused += 1;
                        // The SYN goes where it would have without the
                        // hold: a listener, or the host's RST.
                        let again = self.dpf.demux(frame).map(|f| f.0);
                        let taken = again
                            .and_then(|c| to_channel(self.delivery(), c, (frame, ok), &[], clock));
                        if taken.is_none() {
                            *self.rx_unmatched += 1;
                            self.host.on_unmatched(frame, clock);
                        }
                    } else {
                        let span = time_wait_span(self.config);
                        self.time_wait.on_segment(c, frame, clock, span, self.host);
                    }
                } else {
                    if to == To::Host {
                        for f in std::iter::once(frame).chain(waited.iter().map(|f| &f[..])) {
                            self.host.on_echo_fragment(f, clock);
                        }
                    }
                    // Body fragments held or dropped are the pool's to count.
                    if kind != FragKind::Body {
                        *self.rx_unmatched += 1;
                        if to != To::Host {
                            self.host.on_unmatched(frame, clock);
                        }
                    }
                }
                let done = cycles::now();
                self.host.stats.cycles += done.saturating_sub(now) + demux_share;
                now = done;
                continue;
            };
            let spent = t.saturating_sub(now);
            let copy = copy.min(spent);
            e.stats.copy_cycles += copy;
            e.stats.rx_cycles += spent - copy + demux_share;
            now = t;
        }
    }
}

/// Frees what a connection held in TIME-WAIT took: its filter and its port.
fn release_time_wait(dpf: &mut Dpf, ports: &mut Ports, (filter, t): (u32, Tuple)) {
    let _ = dpf.delete(FilterId(filter));
    ports.unhold(Proto::Tcp, t.local.1);
}

/// 2×MSL.
fn time_wait_span(config: &MuxConfig) -> Duration {
    config.msl.min(frag::MAX_TIMEOUT) * 2
}

/// What [`to_channel`] did: the endpoint, to charge, the cycles spent
/// copying into its segment, and the clock when the last copy ended (0 if
/// nothing was copied).
struct Delivered<'e> {
    endpoint: &'e mut Endpoint,
    copy: u64,
    ended: u64,
}

/// Runs the channel's handler on a frame, then on the fragments that
/// waited for it, and delivers each it did not consume to the channel's
/// endpoint; a connection channel's tracking sees each first, at `now`.
/// What the handler sends waits in `hx` for the end of the batch. `None` if
/// the channel or its endpoint is gone.
fn to_channel<'e>(
    d: Delivery<'e>,
    chan: u32,
    (frame, checked): (&[u8], bool),
    waited: &[Box<[u8]>],
    now: Instant,
) -> Option<Delivered<'e>> {
    let Delivery {
        channels,
        followed,
        endpoints,
        hx,
        limits,
        free_retries,
        quiet_fins,
    } = d;
    let ch = channels.get_mut(&chan)?;
    let e = endpoints.get_mut(&ch.endpoint)?;
    let (mut copy, mut ended) = (0, 0);
    let waited = waited.iter().map(|f| (&f[..], false));
    for (f, ok) in std::iter::once((frame, checked)).chain(waited) {
        ch.stats.rx_frames += 1;
        ch.stats.rx_bytes += f.len() as u64;
        let (seen, quiet) = match &mut ch.conn {
            Some(conn) => (conn.on_received(f, now), ch.quiet),
            None => {
                let (seen, quiet) = followed.on_received(ch.endpoint.0, f, now);
                (seen, ch.quiet || quiet)
            }
        };
        ch.stats.tcp_malformed += u64::from(seen == Received::Malformed);
        let verdict = match &mut ch.handler {
            Some(h) if e.budget.allows(now, limits) => {
                run_handler(&mut **h, f, chan, e, &mut ch.stats, hx)
            }
            Some(_) => {
                e.stats.handler_over_budget += 1;
                HandlerVerdict::Deliver
            }
            None => HandlerVerdict::Deliver,
        };
        match verdict {
            HandlerVerdict::Consumed => {
                e.stats.rx_consumed += 1;
                ch.stats.rx_consumed += 1;
                // The handler ran after any copy before: the clock is read again.
                ended = 0;
            }
            HandlerVerdict::Deliver => {
                let t = cycles::now();
                if !deliver(e, chan, f, ok, free_retries, quiet) {
                    ch.stats.rx_dropped += 1;
                } else if quiet && seen == Received::Fin && !e.fin_owed {
                    e.fin_owed = true;
                    quiet_fins.push_back((now + QUIET_FIN_WAKE, ch.endpoint));
                }
                ended = cycles::now();
                copy += ended.saturating_sub(t);
            }
        }
    }
    Some(Delivered {
        endpoint: e,
        copy,
        ended,
    })
}

/// One invocation of a channel's handler: charged to its endpoint, counted,
/// and its sends queued unless it aborted (an abort delivers the frame
/// untouched).
fn run_handler(
    h: &mut dyn Handler,
    frame: &[u8],
    chan: u32,
    e: &mut Endpoint,
    stats: &mut ChannelStats,
    hx: &mut HandlerTx,
) -> HandlerVerdict {
    hx.outbox.clear();
    let t = cycles::now();
    let run = h.on_frame(frame, &mut hx.outbox);
    e.stats.handler_cycles += cycles::now().saturating_sub(t);
    e.stats.handler_fuel += run.fuel;
    e.budget.charge(run.fuel);
    stats.handler_runs += 1;
    let verdict = match run.outcome {
        Outcome::Consumed => HandlerVerdict::Consumed,
        Outcome::Deliver => HandlerVerdict::Deliver,
        Outcome::Dropped => {
            stats.handler_dropped += 1;
            return HandlerVerdict::Consumed;
        }
        Outcome::Aborted(why) => {
            match why {
                Abort::Requested => stats.handler_aborts += 1,
                Abort::OutOfFuel => stats.handler_out_of_fuel += 1,
                Abort::Trap(_) => stats.handler_traps += 1,
                Abort::BadVerdict(_) => stats.handler_bad_verdict += 1,
            }
            return HandlerVerdict::Deliver;
        }
    };
    for f in hx.outbox.iter() {
        let start = hx.arena.len();
        hx.arena.extend_from_slice(f);
        hx.frames.push((chan, start..hx.arena.len()));
    }
    verdict
}

/// Delivers one frame to an endpoint's rx ring, on a `quiet` channel or
/// not; false if it was dropped (counted in the endpoint's stats).
fn deliver(
    e: &mut Endpoint,
    channel: u32,
    frame: &[u8],
    checked: bool,
    free_retries: u32,
    quiet: bool,
) -> bool {
    // The rings move once per batch ([`Endpoint::publish`]): entries are
    // written past the ones already pending, and the indices stay put.
    let ep = &mut e.ep;
    let slot = e.rx_pending;
    match ep.rx.reserve(slot + 1) {
        Ok(n) if n > slot => {}
        Ok(_) => {
            e.stats.rx_ring_full += 1;
            return false;
        }
        Err(_) => {
            e.stats.ring_errors += 1;
            return false;
        }
    }
    if frame.len() <= INLINE_MAX && ep.rx.has_inline() {
        if ep.rx.write_inline(slot, channel, frame).is_err() {
            e.stats.ring_errors += 1;
            return false;
        }
    } else {
        let layout = *ep.frames.layout();
        if frame.len() > layout.frame_size() as usize {
            e.stats.rx_too_long += 1;
            return false;
        }
        let mut tries = 0;
        let offset = loop {
            let taken = e.free_taken;
            match ep.free.peek(taken + 1) {
                Ok(n) if n > taken => {}
                Ok(_) => {
                    e.stats.rx_no_buffer += 1;
                    return false;
                }
                Err(_) => {
                    e.stats.ring_errors += 1;
                    return false;
                }
            }
            // Read once; only the copy `d` is validated and used.
            let d = ep.free.read(taken);
            e.free_taken += 1;
            if layout.validate_buffer(d).is_ok() {
                break d.offset;
            }
            e.stats.free_bad_desc += 1;
            tries += 1;
            if tries > free_retries {
                e.stats.rx_no_buffer += 1;
                return false;
            }
        };
        if ep.frames.write(offset, frame).is_err() {
            // Unreachable after `validate_buffer` and the length check; the
            // buffer is lost to the application, as any misuse would lose it.
            e.stats.free_bad_desc += 1;
            return false;
        }
        let mut d = Desc::buffer(offset, frame.len() as u32, channel);
        if checked {
            d.flags |= Desc::CSUM_OK;
        }
        ep.rx.write(slot, d);
    }
    e.rx_pending += 1;
    if quiet {
        e.stats.rx_quiet += 1;
    } else {
        e.rx_eager += 1;
    }
    e.stats.rx_frames += 1;
    e.stats.rx_bytes += frame.len() as u64;
    true
}

impl Endpoint {
    /// Ends a receive batch: publishes the rx entries written, gives back
    /// the free entries taken, and wakes the application if it asked and
    /// some entry is not a quiet channel's.
    fn publish(&mut self) -> bool {
        // Peek and reserve again: a later frame of the batch may have found
        // a ring empty or full and shrunk the grant; what was granted before
        // stays granted unless the application broke an index meanwhile,
        // which costs it this batch's entries.
        let free = std::mem::take(&mut self.free_taken);
        if free > 0 {
            match self.ep.free.peek(free) {
                Ok(n) if n == free => self.ep.free.release(free),
                _ => self.stats.ring_errors += 1,
            }
        }
        let rx = std::mem::take(&mut self.rx_pending);
        let eager = std::mem::take(&mut self.rx_eager) > 0;
        if rx > 0 {
            match self.ep.rx.reserve(rx) {
                Ok(n) if n == rx => {
                    self.ep.rx.submit(rx);
                    // A failed ring leaves the application to find the
                    // frames when it next polls; nothing else is at stake.
                    let woke = self
                        .ep
                        .upcall
                        .notify_rx_if(&self.ep.rx, eager)
                        .unwrap_or(false);
                    self.stats.rx_upcalls += u64::from(woke);
                    return woke;
                }
                _ => self.stats.ring_errors += 1,
            }
        }
        false
    }
}

#[derive(Default)]
struct Turn {
    sent: usize,
    moved: bool,
    link_full: bool,
    /// Stopped because the deficit did not cover the next frame.
    short: bool,
    link_error: Option<io::Error>,
}

/// Why a frame is not sent on its channel.
enum Refusal {
    /// It fails the channel's template.
    Template,
    /// A body fragment whose head the channel did not send recently.
    NoHead,
}

/// Checks a frame (the multiplexer's copy) against its channel, and gives a
/// fragment the identification of its datagram when the multiplexer
/// identifies the channel's fragments (see the `ident` module). The clock
/// is read only for fragments, at most once per scan.
fn check_tx(
    ch: &mut Channel,
    frame: &mut [u8],
    idents: &mut Idents,
    clock: &mut Option<Instant>,
) -> Result<(), Refusal> {
    let Some(frags) = &mut ch.frags else {
        return ch
            .template
            .matches(frame)
            .then_some(())
            .ok_or(Refusal::Template);
    };
    let kind = frag::kind(frame);
    let fits = match kind {
        FragKind::Whole => {
            return ch
                .template
                .matches(frame)
                .then_some(())
                .ok_or(Refusal::Template)
        }
        // No transport header: only the fields before it can be checked
        // (the template pins a header without options, so it ends here).
        FragKind::Body => ch.template.matches_before(frame, ident::IP_END),
        FragKind::Head => ch.template.matches(frame),
    };
    if !fits || frame.len() < ident::IP_END {
        return Err(Refusal::Template);
    }
    let now = *clock.get_or_insert_with(Instant::now);
    let (dst, app) = ident::key(frame);
    let ours = match kind {
        FragKind::Head => frags.head(dst, app, idents, now),
        _ => frags.body(dst, app, now).ok_or(Refusal::NoHead)?,
    };
    ident::set_ident(frame, ours);
    Ok(())
}

/// Why a transmit frame is refused before it is looked at.
enum Malformed {
    /// A one-part frame whose descriptor is invalid.
    Desc,
    /// A chain that is not one (see [`EndpointStats::tx_bad_chain`]).
    Chain,
}

/// A transmit frame as read off the ring: the private copies of its
/// descriptors, each read once.
struct TxFrame {
    parts: [Desc; MAX_PARTS],
    n: usize,
}

impl TxFrame {
    /// Reads the frame that starts at peeked entry `first`: descriptors up
    /// to the first without [`Desc::MORE`], or [`MAX_PARTS`] of them; `None`
    /// if it does not end before `avail`, the end of the peek.
    fn read(tx: &Consumer, first: u32, avail: u32) -> Option<TxFrame> {
        let mut parts = [Desc::default(); MAX_PARTS];
        for (k, i) in (first..avail).enumerate().take(MAX_PARTS) {
            parts[k] = tx.read(i);
            if !parts[k].has_more() || k + 1 == MAX_PARTS {
                return Some(TxFrame { parts, n: k + 1 });
            }
        }
        None
    }

    fn parts(&self) -> &[Desc] {
        &self.parts[..self.n]
    }

    fn head(&self) -> Desc {
        self.parts[0]
    }

    fn is_chain(&self) -> bool {
        self.head().has_more()
    }

    /// A chain that did not end within [`MAX_PARTS`] descriptors.
    fn too_long(&self) -> bool {
        self.parts[self.n - 1].has_more()
    }

    /// The frame's length if it is well formed: its descriptors valid (the
    /// parts of a chain against this endpoint's layout, so that none reads
    /// another's memory), a chain on one channel and at most `max_len`
    /// bytes in all.
    fn check(&self, layout: &Layout, max_len: usize) -> Result<usize, Malformed> {
        let head = self.head();
        if !self.is_chain() {
            return match layout.validate_frame(head) {
                Ok(()) => Ok(head.len as usize),
                Err(_) => Err(Malformed::Desc),
            };
        }
        if self.too_long() {
            return Err(Malformed::Chain);
        }
        let mut total = 0u64;
        for (k, &p) in self.parts().iter().enumerate() {
            if layout.validate_part(p, k == 0).is_err() || p.channel != head.channel {
                return Err(Malformed::Chain);
            }
            total += p.len as u64;
        }
        usize::try_from(total)
            .ok()
            .filter(|&t| t <= max_len)
            .ok_or(Malformed::Chain)
    }

    /// The buffer its completion names (see [`Desc::CHAIN`]): that of the
    /// first part not inline, if the layout knows it (the offsets of an
    /// invalid frame are untrusted).
    fn completion_buffer(&self, layout: &Layout) -> Option<u32> {
        self.parts()
            .iter()
            .find(|p| !p.is_inline())
            .and_then(|p| layout.buffer_of(p.offset))
    }

    /// The length its completion reports: what the parts claim in all.
    fn claimed_len(&self) -> u32 {
        let total: u64 = self.parts().iter().map(|p| p.len as u64).sum();
        total.min(u32::MAX as u64) as u32
    }

    /// Copies the checked frame, whose descriptors are entries `first..` of
    /// the peek, into `buf`; returns its length.
    fn gather(
        &self,
        tx: &Consumer,
        first: u32,
        frames: &Frames,
        buf: &mut [u8],
    ) -> Result<usize, DescError> {
        let mut len = 0;
        for (i, p) in (first..).zip(self.parts()) {
            let out = buf
                .get_mut(len..len + p.len as usize)
                .ok_or(DescError::TooLong {
                    offset: p.offset,
                    len: p.len,
                })?;
            if p.is_inline() {
                tx.read_inline(i, p, out);
            } else {
                frames.read_area(p.offset, out)?;
            }
            len += out.len();
        }
        Ok(len)
    }
}

/// The connection a channel spec names, as a direct send port keys it.
fn direct_conn(spec: ChannelSpec) -> Option<DirectConn> {
    let t = conn_tuple(&spec)?;
    Some(DirectConn {
        local: std::net::SocketAddrV4::new(t.local.0, t.local.1),
        remote: std::net::SocketAddrV4::new(t.remote.0, t.remote.1),
    })
}

/// Channel `c` goes: its connection leaves the direct send port, and what
/// the application sent through the port joins what the multiplexer
/// followed, so that the connection's fate (its RST's sequence number)
/// counts every segment.
fn revoke_direct(port: Option<&DirectPort>, c: &mut Channel) {
    let (Some(port), Some(conn)) = (port, c.spec.and_then(direct_conn)) else {
        return;
    };
    if let Ok(Some(sent)) = port.revoke(conn) {
        if let Some(track) = c.conn.as_mut() {
            track.merge_direct(sent);
        }
    }
}

/// The 4-tuple of a TCP connection's channel (one with a remote).
fn conn_tuple(spec: &ChannelSpec) -> Option<Tuple> {
    let remote = spec.remote.filter(|_| spec.proto == Proto::Tcp)?;
    Some(Tuple {
        local: (spec.local_addr, spec.local_port),
        remote,
    })
}

/// The channels, as a transmit turn needs them.
struct TxChannels<'m> {
    by_id: &'m mut IdMap<Channel>,
    /// Connection channels by 4-tuple.
    conns: &'m HashMap<Tuple, u32>,
    followed: &'m mut Followed,
}

impl TxChannels<'_> {
    /// A TCP segment endpoint `ep` sent on a listener's channel: a segment of
    /// a connection it accepted is followed on the connection's own channel
    /// once it has one, and before that in [`Followed`]. False if it could
    /// not be followed (the endpoint has its most). A `quiet` segment
    /// ([`Desc::QUIET`]) quiets the connection's own channel, now or once
    /// it is bound.
    fn follow_sent(&mut self, ep: EndpointId, frame: &[u8], quiet: bool) -> bool {
        let Some((t, fl)) = conn::tuple(frame, true) else {
            return true;
        };
        let own = self
            .conns
            .get(&t)
            .and_then(|c| self.by_id.get_mut(c))
            .filter(|c| c.endpoint == ep);
        match own {
            Some(Channel {
                conn: Some(conn),
                quiet: q,
                ..
            }) => {
                conn.on_sent(frame);
                *q |= quiet;
                true
            }
            _ => self.followed.on_sent(ep.0, t, fl, frame, quiet),
        }
    }
}

/// One endpoint's turn in the transmit scan: sends while its deficit
/// covers the next frame.
#[allow(clippy::too_many_arguments)]
fn tx_turn(
    id: EndpointId,
    e: &mut Endpoint,
    mut channels: TxChannels<'_>,
    link: &mut dyn Link,
    budget: &mut usize,
    idents: &mut Idents,
    clock: &mut Option<Instant>,
) -> Turn {
    let mut turn = Turn::default();
    let layout = *e.ep.frames.layout();
    let max_len = link.max_send_len();
    // The rings move a batch at a time: one index load and one index store
    // per batch on each ring, not per frame.
    'batches: while *budget > 0 {
        // At least a chain's worth, so that a peek from a frame's start
        // holds the whole frame if it is published.
        let want = (*budget).clamp(MAX_PARTS, TX_BATCH) as u32;
        let (avail, room) = match (e.ep.tx.peek(want), e.ep.completion.reserve(want)) {
            (Ok(a), Ok(r)) => (a, r),
            _ => {
                e.stats.ring_errors += 1;
                e.deficit = 0;
                break;
            }
        };
        if avail == 0 {
            e.deficit = 0;
            break;
        }
        let (mut done, mut given) = (0, 0);
        let mut stop = false;
        // The frame at `done` runs past the peek.
        let mut cut = false;
        while done < avail && *budget > 0 && !stop {
            if e.tx_skip {
                // The rest of a chain too long, rejected with its start.
                e.tx_skip = e.ep.tx.read(done).has_more();
                done += 1;
                *budget -= 1;
                continue;
            }
            let Some(f) = TxFrame::read(&e.ep.tx, done, avail) else {
                cut = true;
                break;
            };
            let checked = f.check(&layout, max_len);
            // A valid buffer frame's buffer goes back on completion; an
            // invalid frame's offsets are untrusted, so it gets back only a
            // buffer offset the layout recognizes.
            let give_back = f.completion_buffer(&layout);
            let cost = checked.as_ref().map_or(0, |&len| len as u64);
            if cost > e.deficit {
                turn.short = true;
                break;
            }
            if give_back.is_some() && given == room {
                // The completion ring is full: wait for the application.
                break;
            }
            let mut rejected = true;
            match checked {
                Err(Malformed::Desc) => e.stats.tx_bad_desc += 1,
                Err(Malformed::Chain) => e.stats.tx_bad_chain += 1,
                Ok(len) if len > max_len => {
                    // No link buffer holds it; the link would drop it anyway.
                    e.stats.tx_link_error += 1;
                }
                Ok(_) => {
                    // The frame is gathered straight into the link's buffer,
                    // which only the multiplexer can write: the checks run on
                    // that copy, so no part can change after them, or slip
                    // past them. A refused frame gives its buffer back.
                    let mut offered = false;
                    let mut sent_len = None;
                    let r = link.send_with(&mut |out| {
                        if offered {
                            return None;
                        }
                        offered = true;
                        // Checked above (and it fits the link's buffer), so
                        // this cannot fail; an empty frame would fail every
                        // template anyway.
                        let len = f
                            .gather(&e.ep.tx, done, &e.ep.frames, out)
                            .unwrap_or_default();
                        let frame = &mut out[..len];
                        let Some(ch) = channels
                            .by_id
                            .get_mut(&f.head().channel)
                            .filter(|ch| ch.endpoint == id)
                        else {
                            e.stats.tx_bad_channel += 1;
                            return None;
                        };
                        match check_tx(ch, frame, idents, clock) {
                            Err(Refusal::Template) => {
                                e.stats.tx_template_mismatch += 1;
                                ch.stats.tx_template_mismatch += 1;
                                return None;
                            }
                            Err(Refusal::NoHead) => {
                                e.stats.tx_frag_no_head += 1;
                                ch.stats.tx_frag_no_head += 1;
                                return None;
                            }
                            Ok(()) => {}
                        }
                        if len < exonet_link::MIN_FRAME_LEN {
                            // The link would take it and drop it; say so.
                            e.stats.tx_link_error += 1;
                            return None;
                        }
                        ch.stats.tx_frames += 1;
                        ch.stats.tx_bytes += len as u64;
                        let quiet = f.head().is_quiet();
                        let tcp = ch.spec.is_some_and(|s| s.proto == Proto::Tcp);
                        match &mut ch.conn {
                            Some(conn) => {
                                ch.quiet |= quiet;
                                ch.stats.tcp_malformed += u64::from(!conn.on_sent(frame));
                            }
                            // A listener's channel: the flag is the accepted
                            // connection's, not the listener's.
                            None if tcp => {
                                e.stats.tcp_unfollowed +=
                                    u64::from(!channels.follow_sent(id, frame, quiet));
                            }
                            None => ch.quiet |= quiet,
                        }
                        sent_len = Some(len);
                        Some(len)
                    });
                    if let Some(len) = sent_len {
                        // Taken: sent, or lost by the link as on a cable.
                        rejected = false;
                        e.stats.tx_frames += 1;
                        e.stats.tx_bytes += len as u64;
                        turn.sent += 1;
                    }
                    match r {
                        Ok(_) if !offered => {
                            // No room: the descriptors stay for the next scan.
                            turn.link_full = true;
                            break;
                        }
                        Ok(_) => {}
                        Err(err) => {
                            e.stats.tx_link_error += 1;
                            turn.link_error = Some(err);
                            stop = true;
                        }
                    }
                }
            }
            if let Some(offset) = give_back {
                let mut flags = if rejected { Desc::REJECTED } else { 0 };
                if f.is_chain() {
                    flags |= Desc::CHAIN;
                }
                e.ep.completion.write(
                    given,
                    Desc {
                        offset,
                        len: f.claimed_len(),
                        channel: f.head().channel,
                        flags,
                    },
                );
                given += 1;
            }
            e.tx_skip = f.too_long();
            done += f.n as u32;
            e.deficit -= cost;
            *budget = budget.saturating_sub(f.n);
        }
        if done > 0 {
            e.ep.tx.release(done);
            e.ep.completion.submit(given);
            turn.moved = true;
        }
        if cut && done == 0 {
            // The frame's end is not published yet (a whole chain always
            // fits in the peek): wait for it, as on an empty ring.
            e.deficit = 0;
            e.tx_stalled = Some(avail);
            break;
        }
        // A cut frame with progress before it is read again from its start.
        if stop || (done < avail && !cut) {
            break 'batches;
        }
    }
    turn
}

// An application may run the multiplexer in its own process, on whichever of
// its threads drives it (exonet-stack's in-process stacks).
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Mux>();
};
