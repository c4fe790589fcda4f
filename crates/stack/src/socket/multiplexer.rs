//! [`Multiplexer`]: what a [`Stack`](super::Stack) needs from the multiplexer
//! that serves its endpoint. U-Net (§3) has endpoints served by the network
//! interface and "kernel-emulated" ones behind one interface; here an endpoint
//! is served by a daemon over its control socket ([`Client`]), or by a
//! multiplexer in the application's own process that the stack's threads drive
//! (exonet-mux's `InProcess`), which saves the hand-offs between threads.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use exonet_shm::control::{Client, DirectPort, HandlerSpec, HostInfo, SynAnswers};
use exonet_shm::{AppEndpoint, SegmentConfig};

/// The multiplexer's services to one application.
pub trait Multiplexer: Send {
    /// The host's MAC, addresses and largest frame.
    fn info(&mut self) -> io::Result<HostInfo>;
    /// Serves a new endpoint with a segment of this shape.
    fn create_endpoint(&mut self, config: &SegmentConfig) -> io::Result<(u32, AppEndpoint)>;
    /// Binds a socket channel (`proto` as [`exonet_shm::control::PROTO_UDP`]) on
    /// `endpoint`; returns the channel and the port (allocated for port 0). A
    /// channel with a `remote` receives only from that peer and sends only to it
    /// (a TCP connection's channel).
    fn bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> io::Result<(u32, u16)>;
    /// Begins a [`bind_socket`](Self::bind_socket) without waiting for the
    /// answer, which [`bound_socket`](Self::bound_socket) gives: a daemon
    /// answers in the order asked, and the application goes on meanwhile.
    fn begin_bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> io::Result<()>;
    /// The answer to the oldest begun bind not yet answered: `None` if none
    /// is begun, or (unless `wait`) while its answer has not come.
    fn bound_socket(&mut self, wait: bool) -> Option<io::Result<(u32, u16)>>;
    /// Removes a channel.
    fn unbind(&mut self, channel: u32) -> io::Result<()>;
    /// Removes a channel without waiting to hear how it went: done before
    /// anything asked later, and a refusal is the multiplexer's to count.
    /// Saves a round trip where nothing hangs on the answer.
    fn unbind_async(&mut self, channel: u32) -> io::Result<()> {
        self.unbind(channel)
    }
    /// Sends requests held back (a daemon's client holds
    /// [`unbind_async`](Self::unbind_async)s back to go with the next
    /// request).
    fn flush_deferred(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// Whether deferred requests wait for a request to go with.
    fn has_deferred(&self) -> bool {
        false
    }
    /// Installs a handler (ASH) on a channel, replacing any it had.
    fn install_handler(&mut self, channel: u32, spec: &HandlerSpec) -> io::Result<()>;
    /// Removes a channel's handler.
    fn remove_handler(&mut self, channel: u32) -> io::Result<()>;
    /// Has the link answer the SYNs of TCP listener `channel` with SYN cookies
    /// made as `answers` says; `Unsupported` where it cannot.
    fn answer_syns(&mut self, channel: u32, answers: &SynAnswers) -> io::Result<()> {
        let _ = (channel, answers);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this multiplexer does not answer SYNs",
        ))
    }
    /// The MAC of a neighbour, or `None` while the multiplexer asks the wire.
    fn resolve(&mut self, ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>>;
    /// The endpoint's direct send port: a descriptor to write whole frames
    /// of its connected TCP channels to (not SYNs, FINs or RSTs), which the
    /// kernel checks and sends without the multiplexer. `Unsupported` where
    /// there is none (in process, the multiplexer is no hand-off away).
    fn open_direct(&mut self, endpoint: u32) -> io::Result<DirectPort> {
        let _ = endpoint;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this multiplexer has no direct send ports",
        ))
    }
    /// A descriptor that hangs up when the multiplexer goes away.
    fn hangup_fd(&self) -> Option<RawFd> {
        None
    }
    /// Whether the multiplexer runs only when this process drives it.
    fn in_process(&self) -> bool {
        false
    }
    /// In process: one round of the multiplexer's work (a receive batch and a
    /// transmit scan); returns the frames moved.
    fn drive(&mut self) -> io::Result<usize> {
        Ok(0)
    }
    /// In process: sleeps on the link and the endpoints until there is work or
    /// `timeout` passes.
    fn sleep(&mut self, timeout: Duration) -> io::Result<()> {
        std::thread::sleep(timeout);
        Ok(())
    }
}

impl Multiplexer for Client {
    fn info(&mut self) -> io::Result<HostInfo> {
        Ok(Client::info(self)?)
    }

    fn create_endpoint(&mut self, config: &SegmentConfig) -> io::Result<(u32, AppEndpoint)> {
        Ok(Client::create_endpoint(self, config)?)
    }

    fn bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> io::Result<(u32, u16)> {
        Ok(Client::bind_socket(self, endpoint, proto, local, remote)?)
    }

    fn begin_bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> io::Result<()> {
        Ok(Client::begin_bind_socket(
            self, endpoint, proto, local, remote,
        )?)
    }

    fn bound_socket(&mut self, wait: bool) -> Option<io::Result<(u32, u16)>> {
        Client::bound_socket(self, wait).map(|r| r.map_err(io::Error::from))
    }

    fn unbind(&mut self, channel: u32) -> io::Result<()> {
        Ok(Client::unbind(self, channel)?)
    }

    fn unbind_async(&mut self, channel: u32) -> io::Result<()> {
        Ok(Client::unbind_async(self, channel)?)
    }

    fn flush_deferred(&mut self) -> io::Result<()> {
        Ok(Client::flush(self)?)
    }

    fn has_deferred(&self) -> bool {
        self.deferred_since().is_some()
    }

    fn install_handler(&mut self, channel: u32, spec: &HandlerSpec) -> io::Result<()> {
        Ok(Client::install_handler(self, channel, spec)?)
    }

    fn remove_handler(&mut self, channel: u32) -> io::Result<()> {
        Ok(Client::remove_handler(self, channel)?)
    }

    fn answer_syns(&mut self, channel: u32, answers: &SynAnswers) -> io::Result<()> {
        Ok(Client::answer_syns(self, channel, answers)?)
    }

    fn resolve(&mut self, ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
        Ok(Client::resolve(self, ip)?)
    }

    fn open_direct(&mut self, endpoint: u32) -> io::Result<DirectPort> {
        Ok(Client::open_direct(self, endpoint)?)
    }

    fn hangup_fd(&self) -> Option<RawFd> {
        Some(self.as_fd().as_raw_fd())
    }
}
