//! Helpers shared by the handler tests: frames, a heap segment as the
//! application's window, and checks of replies with etherparse as the oracle.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::Ipv4Addr;

use etherparse::{LinkSlice, NetSlice, SlicedPacket, TransportSlice, VlanSlice};
use exonet_ash::handler::{Engine, Handler, HandlerConfig, Outbox, Run, Window};
use exonet_wire::{build, MacAddr};

pub const CLIENT_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
pub const SERVER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const CLIENT_PORT: u16 = 40000;
pub const SERVER_PORT: u16 = 7000;

/// A client's UDP request carrying `payload`.
pub fn request(payload: &[u8]) -> Vec<u8> {
    build::udp_frame(
        CLIENT_MAC,
        SERVER_MAC,
        CLIENT_IP,
        SERVER_IP,
        CLIENT_PORT,
        SERVER_PORT,
        payload,
    )
}

pub fn engine() -> Engine {
    Engine::new().expect("engine")
}

pub fn outbox() -> Outbox {
    let c = HandlerConfig::default();
    Outbox::new(c.max_sends, c.max_send_len)
}

/// Installs `wasm` with the default limits.
pub fn install(wasm: &[u8], window: Option<Window>) -> Handler {
    Handler::install(&engine(), wasm, vec![], window, HandlerConfig::default())
        .unwrap_or_else(|e| panic!("install: {e}"))
}

/// Runs on `frame` with a cleared outbox.
pub fn run(h: &mut Handler, frame: &[u8], out: &mut Outbox) -> Run {
    out.clear();
    h.run(frame, out)
}

/// The application's segment: heap memory that handlers reach through a
/// [`Window`] while the test reads and writes it through copies.
pub struct Segment {
    bytes: *mut [u8],
}

impl Segment {
    pub fn new(len: usize) -> Segment {
        Segment {
            bytes: Box::into_raw(vec![0u8; len].into_boxed_slice()),
        }
    }

    /// A window on all of it (the segment must outlive the handler).
    pub fn window(&self) -> Window {
        // SAFETY: the allocation lives until the segment is dropped, which
        // the tests do after the handlers; handler memory and frames are
        // other allocations.
        unsafe { Window::new(self.bytes.cast::<u8>(), self.bytes.len()) }
    }

    pub fn read(&self) -> Vec<u8> {
        // SAFETY: the allocation is live and no handler runs during the copy.
        unsafe { (*self.bytes).to_vec() }
    }

    pub fn write(&self, at: usize, data: &[u8]) {
        // SAFETY: as in `read`.
        unsafe { (&mut (*self.bytes))[at..at + data.len()].copy_from_slice(data) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw in `new`, freed once.
        drop(unsafe { Box::from_raw(self.bytes) });
    }
}

/// Checks that `reply` answers `request` (Ethernet, IPv4 and UDP addresses
/// swapped, TTL 64, DF, valid checksums) and returns its UDP payload.
pub fn reply_payload(reply: &[u8], request: &[u8]) -> Vec<u8> {
    let req = SlicedPacket::from_ethernet(request).expect("request parses");
    let rep = SlicedPacket::from_ethernet(reply).expect("reply parses");
    let (Some(LinkSlice::Ethernet2(qe)), Some(LinkSlice::Ethernet2(pe))) = (&req.link, &rep.link)
    else {
        panic!("not Ethernet II");
    };
    assert_eq!(
        (pe.source(), pe.destination()),
        (qe.destination(), qe.source())
    );
    let (Some(NetSlice::Ipv4(qi)), Some(NetSlice::Ipv4(pi))) = (&req.net, &rep.net) else {
        panic!("not IPv4");
    };
    let (qh, ph) = (qi.header(), pi.header());
    assert_eq!(
        (ph.source(), ph.destination()),
        (qh.destination(), qh.source())
    );
    assert_eq!((ph.ttl(), ph.dont_fragment()), (64, true));
    let header = ph.to_header();
    assert_eq!(
        header.calc_header_checksum(),
        ph.header_checksum(),
        "IPv4 checksum"
    );
    let (Some(TransportSlice::Udp(qu)), Some(TransportSlice::Udp(pu))) =
        (&req.transport, &rep.transport)
    else {
        panic!("not UDP");
    };
    assert_eq!(
        (pu.source_port(), pu.destination_port()),
        (qu.destination_port(), qu.source_port())
    );
    let sum = pu
        .to_header()
        .calc_checksum_ipv4(&header, pu.payload())
        .expect("fits");
    assert_eq!(sum, pu.checksum(), "UDP checksum");
    let tags = match rep.vlan {
        None => 0,
        Some(VlanSlice::SingleVlan(_)) => 1,
        Some(VlanSlice::DoubleVlan(_)) => 2,
    };
    let link_len = 14 + 4 * tags;
    assert_eq!(
        usize::from(ph.total_len()) + link_len,
        reply.len(),
        "no trailing bytes"
    );
    pu.payload().to_vec()
}
