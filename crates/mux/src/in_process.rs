//! A multiplexer in the application's own process ([`InProcess`]): the
//! application's stack drives it from its own threads, so a frame goes from the
//! link to the socket with no hand-off between threads. The application owns the
//! link outright (it opened it), so its endpoints are privileged; the template
//! check and the rest run as in a daemon.

use std::collections::VecDeque;
use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use exonet_shm::control::{ControlError, HandlerSpec, HostInfo, SynAnswers};
use exonet_shm::{AppEndpoint, Segment, SegmentConfig};
use exonet_stack::Multiplexer;

use crate::control::{proto_of, refused};
use crate::{ChannelId, ChannelSpec, EndpointId, Mux, MuxError};

/// A [`Mux`] serving the stacks of this process.
pub struct InProcess {
    mux: Mux,
    prefixes: Vec<(Ipv4Addr, u8)>,
    /// Answers to begun binds, done at once.
    begun: VecDeque<io::Result<(u32, u16)>>,
}

impl InProcess {
    /// Serves `mux`, whose addresses have these prefix lengths.
    pub fn new(mux: Mux, prefixes: Vec<(Ipv4Addr, u8)>) -> InProcess {
        InProcess {
            mux,
            prefixes,
            begun: VecDeque::new(),
        }
    }

    pub fn mux(&self) -> &Mux {
        &self.mux
    }
}

fn io_error((code, message): (exonet_shm::control::ErrorCode, String)) -> io::Error {
    ControlError::Refused { code, message }.into()
}

impl From<MuxError> for io::Error {
    fn from(e: MuxError) -> io::Error {
        io_error(refused(e))
    }
}

impl Multiplexer for InProcess {
    fn info(&mut self) -> io::Result<HostInfo> {
        Ok(HostInfo {
            mac: self.mux.mac(),
            addrs: self.prefixes.clone(),
            mtu: self.mux.link().max_frame_len() as u32,
            max_send: self.mux.link().max_send_len() as u32,
        })
    }

    fn create_endpoint(&mut self, config: &SegmentConfig) -> io::Result<(u32, AppEndpoint)> {
        let (app, side) = Segment::create(config).map_err(io::Error::other)?.split()?;
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        let id = self.mux.add_endpoint(side, uid, true);
        Ok((id.0, app))
    }

    fn bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> io::Result<(u32, u16)> {
        let spec = ChannelSpec {
            proto: proto_of(proto).map_err(io_error)?,
            local_addr: local.0,
            local_port: local.1,
            remote,
        };
        let (ch, port) = self.mux.bind_socket(EndpointId(endpoint), spec)?;
        Ok((ch.0, port))
    }

    fn begin_bind_socket(
        &mut self,
        endpoint: u32,
        proto: u8,
        local: (Ipv4Addr, u16),
        remote: Option<(Ipv4Addr, u16)>,
    ) -> io::Result<()> {
        let r = self.bind_socket(endpoint, proto, local, remote);
        self.begun.push_back(r);
        Ok(())
    }

    fn bound_socket(&mut self, _wait: bool) -> Option<io::Result<(u32, u16)>> {
        self.begun.pop_front()
    }

    fn unbind(&mut self, channel: u32) -> io::Result<()> {
        Ok(self.mux.unbind_channel(ChannelId(channel))?)
    }

    fn install_handler(&mut self, channel: u32, spec: &HandlerSpec) -> io::Result<()> {
        Ok(self
            .mux
            .install_handler(ChannelId(channel), spec, &spec.module)?)
    }

    fn remove_handler(&mut self, channel: u32) -> io::Result<()> {
        Ok(self.mux.set_handler(ChannelId(channel), None)?)
    }

    fn answer_syns(&mut self, channel: u32, answers: &SynAnswers) -> io::Result<()> {
        Ok(self.mux.answer_syns(ChannelId(channel), answers)?)
    }

    fn resolve(&mut self, ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
        self.mux.resolve(ip)
    }

    fn in_process(&self) -> bool {
        true
    }

    fn drive(&mut self) -> io::Result<usize> {
        self.mux.poll()
    }

    fn sleep(&mut self, timeout: Duration) -> io::Result<()> {
        self.mux.wait(timeout).map(drop)
    }
}
