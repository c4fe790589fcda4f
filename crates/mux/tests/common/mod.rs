//! Shared test fixtures: a multiplexer on one end of a memwire cable, the
//! other end as "the network", and in-process endpoints.
#![allow(dead_code)]

use std::net::Ipv4Addr;

use etherparse::Ipv4HeaderSlice;
use exonet_link::memwire::{self, MemWire};
use exonet_link::Link;
use exonet_mux::{ChannelSpec, Mux, MuxConfig, Proto};
use exonet_shm::{AppEndpoint, Desc, Segment, SegmentConfig, INLINE_MAX};
use exonet_wire::MacAddr;

pub const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const HOST_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
pub const PEER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

pub fn mux_with(config: MuxConfig) -> (Mux, MemWire) {
    let (a, b) = memwire::pair().unwrap();
    (Mux::new(Box::new(a), vec![HOST], config), b)
}

pub fn mux() -> (Mux, MemWire) {
    mux_with(MuxConfig::default())
}

pub fn small_segment() -> SegmentConfig {
    SegmentConfig {
        frame_size: 2048,
        frame_count: 64,
        ring_entries: [64; 4],
    }
}

pub fn segment(cfg: &SegmentConfig) -> Segment {
    Segment::create(cfg).unwrap()
}

/// An endpoint served in-process; `buffers` of its buffers go on the free
/// ring, the others are kept for transmitting.
pub fn endpoint(
    mux: &mut Mux,
    buffers: usize,
    privileged: bool,
) -> (exonet_mux::EndpointId, AppEndpoint, Vec<u32>) {
    let seg = segment(&small_segment());
    let (mut app, me) = seg.split().unwrap();
    let all: Vec<u32> = app.frames.layout().buffers().collect();
    for &b in &all[..buffers] {
        assert!(app.free.push(Desc::buffer(b, 0, 0)).unwrap());
    }
    let id = mux.add_endpoint(me, 1000, privileged);
    (id, app, all[buffers..].to_vec())
}

/// Every frame on the endpoint's rx ring: (channel, bytes).
pub fn drain_rx(app: &mut AppEndpoint) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut inline = [0u8; INLINE_MAX];
    while let Some(d) = app.rx.pop_frame(&mut inline).unwrap() {
        let bytes = if d.is_inline() {
            inline[..d.len as usize].to_vec()
        } else {
            let mut buf = vec![0; d.len as usize];
            let n = app.frames.read(d, &mut buf).unwrap();
            // Give the buffer back for the next frame.
            let base = app.frames.layout().buffer_of(d.offset).unwrap();
            assert!(app.free.push(Desc::buffer(base, 0, 0)).unwrap());
            buf[..n].to_vec()
        };
        out.push((d.channel, bytes));
    }
    out
}

/// Puts `frame` in buffer `buf` and on the tx ring, on `channel`.
pub fn send(app: &mut AppEndpoint, buf: u32, frame: &[u8], channel: u32) {
    app.frames.write(buf, frame).unwrap();
    assert!(app
        .tx
        .push(Desc::buffer(buf, frame.len() as u32, channel))
        .unwrap());
    app.kick.notify_if_sleeping().unwrap();
}

/// Every frame waiting at the far end of the cable.
pub fn drain_wire(wire: &mut MemWire) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    while wire.recv_batch(&mut |f| got.push(f.to_vec()), 64).unwrap() > 0 {}
    got
}

pub fn completions(app: &mut AppEndpoint) -> Vec<Desc> {
    let mut v = Vec::new();
    while let Some(d) = app.completion.pop().unwrap() {
        v.push(d);
    }
    v
}

/// An unconnected UDP socket channel on `port` of [`HOST`].
pub fn spec(port: u16) -> ChannelSpec {
    ChannelSpec {
        proto: Proto::Udp,
        local_addr: HOST,
        local_port: port,
        remote: None,
    }
}

/// What etherparse reads in a frame on the wire: the identification, and
/// whether its header checksum is right.
pub fn ident_of(frame: &[u8]) -> (u16, bool) {
    let h = Ipv4HeaderSlice::from_slice(&frame[14..]).unwrap();
    let sum = h.to_header().calc_header_checksum();
    (h.identification(), sum == h.header_checksum())
}

/// Reassembles the frames of one datagram (any order): its IP payload.
pub fn reassemble(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut pieces: Vec<(usize, bool, Vec<u8>)> = frames
        .iter()
        .map(|f| {
            let h = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
            let start = 14 + h.slice().len();
            let end = 14 + h.total_len() as usize;
            let offset = h.fragments_offset().byte_offset() as usize;
            (offset, h.more_fragments(), f[start..end].to_vec())
        })
        .collect();
    pieces.sort_by_key(|p| p.0);
    let mut data = Vec::new();
    for (offset, _, piece) in &pieces {
        assert_eq!(*offset, data.len(), "a hole or an overlap");
        data.extend_from_slice(piece);
    }
    assert!(!pieces.last().unwrap().1, "the last fragment is there");
    data
}

/// `whole`, an Ethernet frame carrying IPv4, as a datagram of IP
/// identification `ident` cut into fragments of at most 1500 bytes, head
/// first, each with `whole`'s Ethernet header.
pub fn fragments_of(mut whole: Vec<u8>, ident: u16) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut ip = exonet_wire::Ipv4Packet::new_unchecked(&mut whole[14..]);
    ip.set_ident(ident);
    ip.set_frag(false, false, 0);
    ip.fill_checksum();
    let frames = exonet_stack::fragment(&whole[14..], 1500)
        .unwrap()
        .into_iter()
        .map(|f| [&whole[..14], &f[..]].concat())
        .collect();
    (frames, whole)
}

/// A TCP segment without options from [`HOST`]'s `port` to [`PEER`]'s
/// `peer_port`.
pub fn tcp_to_peer(port: u16, peer_port: u16, fl: u8, seq: u32, ack: u32, data: &[u8]) -> Vec<u8> {
    exonet_wire::build::tcp_frame(
        HOST_MAC,
        PEER_MAC,
        HOST,
        PEER,
        port,
        peer_port,
        fl,
        seq,
        ack,
        &[],
        data,
    )
}
