//! The registry (Thekkath et al. §III-D): who owns which port (or ICMP echo
//! identifier), the filter and the transmit template of a UDP, TCP or ICMP
//! echo channel, and whether a raw
//! filter or template an unprivileged endpoint offers stays within what it
//! owns ("a filter must not lie", DPF §2).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use exonet_dpf::{Elem, Filter, Op, Shift, Width};

use crate::template::Template;
use crate::{EndpointId, MuxError};

/// First port of the ephemeral range (RFC 6335).
pub const EPHEMERAL_FIRST: u16 = 49152;
/// Last port of the ephemeral range.
pub const EPHEMERAL_LAST: u16 = 65535;
/// Ports below this are for privileged endpoints only.
pub const PRIVILEGED_BELOW: u16 = 1024;

/// A transport protocol whose ports the registry allocates. For `Icmp` the
/// "port" is the echo identifier (an unprivileged ping socket, as Linux's
/// `SOCK_DGRAM`/`IPPROTO_ICMP`): its own space, no privileged range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Udp,
    Tcp,
    Icmp,
}

impl Proto {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Proto::Udp => 17,
            Proto::Tcp => 6,
            Proto::Icmp => 1,
        }
    }

    pub fn from_number(n: u8) -> Option<Proto> {
        match n {
            17 => Some(Proto::Udp),
            6 => Some(Proto::Tcp),
            1 => Some(Proto::Icmp),
            _ => None,
        }
    }

    fn index(self) -> usize {
        match self {
            Proto::Udp => 0,
            Proto::Tcp => 1,
            Proto::Icmp => 2,
        }
    }
}

/// What a UDP, TCP or ICMP echo channel is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelSpec {
    pub proto: Proto,
    /// One of the multiplexer's addresses.
    pub local_addr: Ipv4Addr,
    /// 0 asks for an ephemeral port (ICMP: the echo identifier).
    pub local_port: u16,
    /// A connected channel receives only from this peer (and, having more
    /// atoms, wins over an unconnected one on the same port). ICMP has no
    /// remote port: only the address counts.
    pub remote: Option<(Ipv4Addr, u16)>,
}

/// Offsets in an untagged Ethernet/IPv4 frame without IP options.
pub(crate) mod off {
    pub const ETH_SRC: usize = 6;
    pub const ETHERTYPE: usize = 12;
    pub const IP_VHL: usize = 14;
    pub const IP_FRAG: usize = 20;
    pub const IP_PROTO: usize = 23;
    pub const IP_SRC: usize = 26;
    pub const IP_DST: usize = 30;
    pub const L4_SRC_PORT: usize = 34;
    pub const L4_DST_PORT: usize = 36;
    pub const ICMP_TYPE: usize = 34;
    pub const ICMP_IDENT: usize = 38;
}

/// ICMP echo request and reply types (RFC 792).
const ECHO_REQUEST: u8 = 8;
const ECHO_REPLY: u8 = 0;

/// The receive filter of a channel: IPv4, first fragment, the protocol, our
/// address, and after the (variable-length) IP header the destination port
/// (ICMP: echo replies carrying the identifier); with a remote, also its
/// address and source port.
pub fn socket_filter(spec: &ChannelSpec) -> Filter {
    let mut f = Filter::new()
        .eq(off::ETHERTYPE as u32, Width::U16, 0x0800)
        .eq(off::IP_PROTO as u32, Width::U8, spec.proto.number() as u32)
        .eq(off::IP_DST as u32, Width::U32, u32::from(spec.local_addr))
        .masked(off::IP_FRAG as u32, Width::U16, 0x1fff, Op::Eq, 0);
    if let Some((addr, _)) = spec.remote {
        f = f.eq(off::IP_SRC as u32, Width::U32, u32::from(addr));
    }
    f = f.shift(14).shift_by(0, Width::U8, 0x0f, 2);
    if spec.proto == Proto::Icmp {
        // Only replies: requests to us stay the host's to answer, and
        // errors go where their quote says (`Mux::route_icmp_error`).
        return f
            .eq(0, Width::U8, ECHO_REPLY as u32)
            .eq(4, Width::U16, spec.local_port as u32);
    }
    f = f.eq(2, Width::U16, spec.local_port as u32);
    if let Some((_, port)) = spec.remote {
        f = f.eq(0, Width::U16, port as u32);
    }
    f
}

/// The transmit template of a channel: our MAC as source, IPv4 without
/// options (so that the ports are where the template looks) and with the
/// reserved flag clear (RFC 791), the protocol, our address and port as
/// source (ICMP: echo requests with the identifier); with a remote, also
/// its address and port as destination. Fragments are allowed: the
/// transmit path checks a body fragment against the fields before the
/// transport header and only as part of a datagram whose head the channel
/// sent, and gives every fragment the multiplexer's identification
/// (the `ident` module).
pub fn socket_template(mac: [u8; 6], spec: &ChannelSpec) -> Template {
    // At most nine fields of 24 bytes: one allocation each for the fields,
    // their values and their masks.
    let t = Template::with_capacity(9, 24)
        .field(off::ETH_SRC, &mac)
        .field(off::ETHERTYPE, &[0x08, 0x00])
        .field(off::IP_VHL, &[0x45])
        .masked(off::IP_FRAG, &[0, 0], &[0x80, 0])
        .field(off::IP_PROTO, &[spec.proto.number()])
        .field(off::IP_SRC, &spec.local_addr.octets());
    if spec.proto == Proto::Icmp {
        let t = t
            .field(off::ICMP_TYPE, &[ECHO_REQUEST, 0])
            .field(off::ICMP_IDENT, &spec.local_port.to_be_bytes());
        return match spec.remote {
            Some((addr, _)) => t.field(off::IP_DST, &addr.octets()),
            None => t,
        };
    }
    let mut t = t.field(off::L4_SRC_PORT, &spec.local_port.to_be_bytes());
    if let Some((addr, port)) = spec.remote {
        t = t
            .field(off::IP_DST, &addr.octets())
            .field(off::L4_DST_PORT, &port.to_be_bytes());
    }
    t
}

/// What a filter pins, as far as the registry can tell: fields compared for
/// equality under a full mask, at a base it can follow (the frame, the IP
/// header after `SHIFT(14)`, the transport header after a further
/// `SHIFT((0:8 & 0xf) << 2)`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilterPins {
    pub ipv4: bool,
    pub first_fragment: bool,
    pub protocols: Vec<u8>,
    pub dst_addrs: Vec<Ipv4Addr>,
    pub dst_ports: Vec<u16>,
    /// ICMP type (transport offset 0) and echo identifier (offset 4).
    pub icmp_types: Vec<u8>,
    pub icmp_idents: Vec<u16>,
}

pub fn filter_pins(f: &Filter) -> FilterPins {
    #[derive(Clone, Copy, PartialEq)]
    enum Base {
        Frame,
        Ip,
        Transport,
        Unknown,
    }
    let mut pins = FilterPins::default();
    let mut base = Base::Frame;
    for e in &f.elems {
        match e {
            Elem::Shift(Shift::Const(14)) if base == Base::Frame => base = Base::Ip,
            Elem::Shift(Shift::Const(0)) => {}
            Elem::Shift(Shift::Indirect { field, shl: 2 })
                if base == Base::Ip
                    && field.offset == 0
                    && field.width == Width::U8
                    && field.mask == 0x0f =>
            {
                base = Base::Transport
            }
            Elem::Shift(_) => base = Base::Unknown,
            Elem::Atom(a) if a.op == Op::Eq => {
                let full = a.field.mask == a.field.width.full_mask();
                let at = (base, a.field.offset as usize, a.field.width);
                match at {
                    (Base::Frame, off::ETHERTYPE, Width::U16) if full && a.value == 0x0800 => {
                        pins.ipv4 = true
                    }
                    (Base::Frame, off::IP_PROTO, Width::U8) | (Base::Ip, 9, Width::U8) if full => {
                        pins.protocols.push(a.value as u8)
                    }
                    (Base::Frame, off::IP_DST, Width::U32) | (Base::Ip, 16, Width::U32) if full => {
                        pins.dst_addrs.push(Ipv4Addr::from(a.value))
                    }
                    (Base::Frame, off::IP_FRAG, Width::U16) | (Base::Ip, 6, Width::U16)
                        if a.field.mask & 0x1fff == 0x1fff && a.value & 0x1fff == 0 =>
                    {
                        pins.first_fragment = true
                    }
                    (Base::Transport, 2, Width::U16) if full => pins.dst_ports.push(a.value as u16),
                    (Base::Transport, 0, Width::U8) if full => pins.icmp_types.push(a.value as u8),
                    (Base::Transport, 4, Width::U16) if full => {
                        pins.icmp_idents.push(a.value as u16)
                    }
                    _ => {}
                }
            }
            Elem::Atom(_) => {}
        }
    }
    pins
}

/// Port ownership: each (protocol, port) belongs to at most one endpoint,
/// which may hold it several times (a listening and connected channels).
/// The multiplexer itself holds the local port of each TCP connection it
/// keeps in TIME-WAIT: such a port is not handed out as an ephemeral one,
/// but may be bound by name (a listener, or a connection elsewhere).
#[derive(Debug, Default)]
pub(crate) struct Ports {
    owners: HashMap<(Proto, u16), (EndpointId, u32)>,
    /// The multiplexer's holds, by count.
    held: HashMap<(Proto, u16), u32>,
    next: [u16; 3],
}

impl Ports {
    pub fn owner(&self, proto: Proto, port: u16) -> Option<EndpointId> {
        self.owners.get(&(proto, port)).map(|&(ep, _)| ep)
    }

    /// Allocates `port` (0: an ephemeral one) to `ep`, or takes one more
    /// hold on a port `ep` already owns.
    pub fn allocate(
        &mut self,
        proto: Proto,
        port: u16,
        ep: EndpointId,
        privileged: bool,
    ) -> Result<u16, MuxError> {
        if port == 0 {
            let span = (EPHEMERAL_LAST - EPHEMERAL_FIRST) as u32 + 1;
            let start = self.next[proto.index()];
            for i in 0..span {
                let p = EPHEMERAL_FIRST + ((start as u32 + i) % span) as u16;
                if self.held.contains_key(&(proto, p)) {
                    continue;
                }
                if let std::collections::hash_map::Entry::Vacant(v) = self.owners.entry((proto, p))
                {
                    v.insert((ep, 1));
                    self.next[proto.index()] = ((start as u32 + i + 1) % span) as u16;
                    return Ok(p);
                }
            }
            return Err(MuxError::NoPortsLeft(proto));
        }
        if port < PRIVILEGED_BELOW && !privileged && proto != Proto::Icmp {
            return Err(MuxError::NotPermitted(format!(
                "{proto:?} port {port} is privileged"
            )));
        }
        match self.owners.get_mut(&(proto, port)) {
            Some((owner, holds)) if *owner == ep => {
                *holds += 1;
                Ok(port)
            }
            Some(_) => Err(MuxError::PortInUse { proto, port }),
            None => {
                self.owners.insert((proto, port), (ep, 1));
                Ok(port)
            }
        }
    }

    /// Drops one hold of `ep` on the port.
    pub fn release(&mut self, proto: Proto, port: u16, ep: EndpointId) -> bool {
        match self.owners.get_mut(&(proto, port)) {
            Some((owner, holds)) if *owner == ep => {
                *holds -= 1;
                if *holds == 0 {
                    self.owners.remove(&(proto, port));
                }
                true
            }
            _ => false,
        }
    }

    /// One more hold of the multiplexer's on a port.
    pub fn hold(&mut self, proto: Proto, port: u16) {
        *self.held.entry((proto, port)).or_default() += 1;
    }

    /// Drops one hold of the multiplexer's on a port.
    pub fn unhold(&mut self, proto: Proto, port: u16) {
        if let std::collections::hash_map::Entry::Occupied(mut o) = self.held.entry((proto, port)) {
            *o.get_mut() -= 1;
            if *o.get() == 0 {
                o.remove();
            }
        }
    }

    /// Drops every port of `ep`.
    pub fn release_all(&mut self, ep: EndpointId) {
        self.owners.retain(|_, (owner, _)| *owner != ep);
    }

    pub fn owned_by(&self, ep: EndpointId) -> Vec<(Proto, u16)> {
        let mut v: Vec<_> = self
            .owners
            .iter()
            .filter(|(_, (o, _))| *o == ep)
            .map(|(k, _)| *k)
            .collect();
        v.sort();
        v
    }
}

/// Checks that an unprivileged endpoint's raw filter accepts only frames
/// for it: IPv4, first fragments, one protocol, one of our addresses, and a
/// destination port the endpoint owns for that protocol (ICMP: echo
/// replies, type 0, with an identifier it owns).
pub(crate) fn check_filter(
    f: &Filter,
    ep: EndpointId,
    addrs: &[Ipv4Addr],
    ports: &Ports,
) -> Result<(), MuxError> {
    let pins = filter_pins(f);
    let deny = |why: &str| Err(MuxError::NotPermitted(format!("filter {why}")));
    if !pins.ipv4 {
        return deny("does not pin ethertype IPv4 (12:16 == 0x800)");
    }
    if !pins.first_fragment {
        return deny("does not pin the fragment offset to 0 ((20:16 & 0x1fff) == 0)");
    }
    if !pins.dst_addrs.iter().any(|a| addrs.contains(a)) {
        return deny("does not pin one of the host's addresses as destination (30:32)");
    }
    let owns = |proto, ids: &[u16]| ids.iter().any(|&id| ports.owner(proto, id) == Some(ep));
    let owned = pins.protocols.iter().any(|&p| match Proto::from_number(p) {
        // Offset 2 of ICMP is the checksum: only the identifier of an echo
        // reply says whose a message is.
        Some(Proto::Icmp) => {
            pins.icmp_types.contains(&ECHO_REPLY) && owns(Proto::Icmp, &pins.icmp_idents)
        }
        Some(proto) => owns(proto, &pins.dst_ports),
        None => false,
    });
    if !owned {
        return deny("does not pin a protocol and a destination port the endpoint owns");
    }
    Ok(())
}

/// Checks that an unprivileged endpoint's template lets it send only as
/// itself: our MAC, IPv4 without options, one protocol, one of our
/// addresses and a source port it owns (ICMP: echo requests, type 8 code 0,
/// with an identifier it owns). It may allow fragments: the transmit path
/// holds them to the head's template and identifies them itself
/// (the `ident` module).
pub(crate) fn check_template(
    t: &Template,
    ep: EndpointId,
    mac: [u8; 6],
    addrs: &[Ipv4Addr],
    ports: &Ports,
) -> Result<(), MuxError> {
    let deny = |why: &str| Err(MuxError::NotPermitted(format!("template {why}")));
    if !t.implies(off::ETH_SRC, &mac, &[0xff; 6]) {
        return deny("does not pin our MAC as source");
    }
    if !t.implies(off::ETHERTYPE, &[0x08, 0x00, 0x45], &[0xff; 3]) {
        return deny("does not pin IPv4 without options");
    }
    match t.pinned(off::IP_SRC, 4) {
        Some(a) if addrs.contains(&Ipv4Addr::new(a[0], a[1], a[2], a[3])) => {}
        _ => return deny("does not pin one of the host's addresses as source"),
    }
    let proto = t
        .pinned(off::IP_PROTO, 1)
        .and_then(|p| Proto::from_number(p[0]));
    let u16_at = |at| t.pinned(at, 2).map(|p| u16::from_be_bytes([p[0], p[1]]));
    let port = match proto {
        Some(Proto::Icmp) if t.implies(off::ICMP_TYPE, &[ECHO_REQUEST, 0], &[0xff; 2]) => {
            u16_at(off::ICMP_IDENT)
        }
        Some(Proto::Icmp) => None,
        _ => u16_at(off::L4_SRC_PORT),
    };
    match (proto, port) {
        (Some(proto), Some(port)) if ports.owner(proto, port) == Some(ep) => Ok(()),
        _ => deny(
            "does not pin UDP or TCP and a source port (or ICMP echo requests and an identifier) \
             the endpoint owns",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(port: u16) -> ChannelSpec {
        ChannelSpec {
            proto: Proto::Udp,
            local_addr: Ipv4Addr::new(10, 0, 0, 1),
            local_port: port,
            remote: None,
        }
    }

    #[test]
    fn ports() {
        let (a, b) = (EndpointId(1), EndpointId(2));
        let mut p = Ports::default();
        let e1 = p.allocate(Proto::Udp, 0, a, false).unwrap();
        let e2 = p.allocate(Proto::Udp, 0, b, false).unwrap();
        assert!(e1 >= EPHEMERAL_FIRST && e2 >= EPHEMERAL_FIRST && e1 != e2);
        assert_eq!(p.allocate(Proto::Udp, e1, a, false), Ok(e1));
        assert_eq!(
            p.allocate(Proto::Udp, e1, b, false),
            Err(MuxError::PortInUse {
                proto: Proto::Udp,
                port: e1
            })
        );
        // Same number, other protocol: independent.
        assert_eq!(p.allocate(Proto::Tcp, e1, b, false), Ok(e1));
        assert!(matches!(
            p.allocate(Proto::Udp, 53, a, false),
            Err(MuxError::NotPermitted(_))
        ));
        assert_eq!(p.allocate(Proto::Udp, 53, a, true), Ok(53));
        assert!(p.release(Proto::Udp, e1, a));
        assert_eq!(p.owner(Proto::Udp, e1), Some(a));
        assert!(p.release(Proto::Udp, e1, a));
        assert_eq!(p.owner(Proto::Udp, e1), None);
        assert!(!p.release(Proto::Udp, e2, a));
        p.release_all(b);
        assert_eq!(p.owned_by(b), vec![]);
        assert_eq!(p.owned_by(a), vec![(Proto::Udp, 53)]);
    }

    #[test]
    fn held_ports_are_not_ephemeral() {
        let (a, b) = (EndpointId(1), EndpointId(2));
        let mut p = Ports::default();
        let first = p.allocate(Proto::Tcp, 0, a, false).unwrap();
        assert!(p.release(Proto::Tcp, first, a));
        p.hold(Proto::Tcp, first);
        p.hold(Proto::Tcp, first);
        p.unhold(Proto::Tcp, first);
        let n = (EPHEMERAL_LAST - EPHEMERAL_FIRST) as usize + 1;
        for _ in 0..n - 1 {
            assert_ne!(p.allocate(Proto::Tcp, 0, a, false), Ok(first));
        }
        assert_eq!(
            p.allocate(Proto::Tcp, 0, a, false),
            Err(MuxError::NoPortsLeft(Proto::Tcp))
        );
        // By name it binds, and released it stays held.
        assert_eq!(p.allocate(Proto::Tcp, first, b, false), Ok(first));
        assert!(p.release(Proto::Tcp, first, b));
        p.unhold(Proto::Tcp, first);
        assert_eq!(p.allocate(Proto::Tcp, 0, a, false), Ok(first));
    }

    #[test]
    fn ephemeral_range_exhausts() {
        let mut p = Ports::default();
        let n = (EPHEMERAL_LAST - EPHEMERAL_FIRST) as usize + 1;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..n {
            assert!(seen.insert(p.allocate(Proto::Tcp, 0, EndpointId(0), false).unwrap()));
        }
        assert_eq!(
            p.allocate(Proto::Tcp, 0, EndpointId(0), false),
            Err(MuxError::NoPortsLeft(Proto::Tcp))
        );
    }

    #[test]
    fn pins_of_socket_filter() {
        let pins = filter_pins(&socket_filter(&spec(5000)));
        assert!(pins.ipv4 && pins.first_fragment);
        assert_eq!(pins.protocols, vec![17]);
        assert_eq!(pins.dst_addrs, vec![Ipv4Addr::new(10, 0, 0, 1)]);
        assert_eq!(pins.dst_ports, vec![5000]);
        // A port after an unknown shift is not a pin.
        let f = Filter::new()
            .eq(12, Width::U16, 0x800)
            .shift(14)
            .shift(20)
            .eq(2, Width::U16, 5000);
        assert_eq!(filter_pins(&f).dst_ports, Vec::<u16>::new());
        // A masked comparison is not a pin.
        let f = Filter::new().masked(12, Width::U16, 0xff00, Op::Eq, 0x800);
        assert!(!filter_pins(&f).ipv4);
    }

    #[test]
    fn socket_template_passes_its_own_check() {
        let mac = [2, 0, 0, 0, 0, 1];
        let mut p = Ports::default();
        p.allocate(Proto::Udp, 5000, EndpointId(3), false).unwrap();
        let addrs = [Ipv4Addr::new(10, 0, 0, 1)];
        let t = socket_template(mac, &spec(5000));
        assert_eq!(check_template(&t, EndpointId(3), mac, &addrs, &p), Ok(()));
        assert!(check_template(&t, EndpointId(4), mac, &addrs, &p).is_err());
        let f = socket_filter(&spec(5000));
        assert_eq!(check_filter(&f, EndpointId(3), &addrs, &p), Ok(()));
        assert!(check_filter(&f, EndpointId(4), &addrs, &p).is_err());
    }
}
