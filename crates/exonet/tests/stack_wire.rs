//! The protocol library against a scripted network: a multiplexer daemon in this
//! process on one end of a memwire, the test on the other end answering ARP and
//! sending well-formed and hostile frames to an application's sockets.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use exonet_link::memwire::{self, MemWire};
use exonet_link::Link;
use exonet_mux::{Daemon, DaemonConfig, Mux, MuxConfig, Running};
use exonet_stack::ipv4_rx::Ipv4Drop;
use exonet_stack::tcp::TcpConfig;
use exonet_stack::{Stack, StackConfig, TcpListener, UdpSocket};
use exonet_wire::arp::{self, ArpRepr};
use exonet_wire::build;
use exonet_wire::tcp::{flags, TcpOption, TcpOptionIter};
use exonet_wire::{EthernetFrame, Ipv4Packet, MacAddr, TcpPacket, TcpRepr};

const HOST: Ipv4Addr = Ipv4Addr::new(10, 77, 9, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 77, 9, 2);
const PEER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 9, 2]);

struct Net {
    wire: MemWire,
    host_mac: MacAddr,
    _daemon: Running,
    stack: Stack,
}

fn net(name: &str, config: StackConfig) -> Net {
    let (a, wire) = memwire::pair().unwrap();
    let host_mac = MacAddr(a.mac());
    let path = std::env::temp_dir().join(format!(
        "exonet-stackwire-{}-{name}.sock",
        std::process::id()
    ));
    let daemon = Daemon::spawn(
        move || Ok(Mux::new(Box::new(a), vec![HOST], MuxConfig::default())),
        DaemonConfig::new(path, vec![(HOST, 24)]),
    )
    .unwrap();
    let stack = Stack::open_with(daemon.socket(), &config).unwrap();
    Net {
        wire,
        host_mac,
        _daemon: daemon,
        stack,
    }
}

impl Net {
    fn inject(&mut self, frames: &[Vec<u8>]) {
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let mut sent = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while sent < refs.len() {
            sent += self.wire.send_batch(&refs[sent..]).unwrap();
            assert!(Instant::now() < deadline, "the wire stays full");
        }
    }

    /// The next frame the host sends, answering ARP requests on the way.
    fn next_ip_frame(&mut self) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut got = Vec::new();
            self.wire
                .recv_batch(&mut |f| got.push(f.to_vec()), 1)
                .unwrap();
            // The held datagram goes once the stack asks again and hears back.
            self.stack.pump().unwrap();
            for f in got {
                let eth = EthernetFrame::new_checked(&f[..]).unwrap();
                if eth.ethertype() == 0x0806 {
                    let p = arp::ArpPacket::new_checked(&f[14..]).unwrap();
                    let req = ArpRepr::parse(&p).unwrap();
                    if req.oper == arp::OP_REQUEST && req.tpa == PEER {
                        let reply = ArpRepr {
                            oper: arp::OP_REPLY,
                            sha: PEER_MAC,
                            spa: PEER,
                            tha: req.sha,
                            tpa: req.spa,
                        };
                        self.inject(&[build::arp_frame(req.sha, &reply)]);
                    }
                    continue;
                }
                return f;
            }
            assert!(Instant::now() < deadline, "the host sent nothing");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn udp(&self, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        build::udp_frame(PEER_MAC, self.host_mac, PEER, HOST, sport, dport, payload)
    }
}

fn socket(n: &Net, port: u16) -> UdpSocket {
    let s = UdpSocket::bind(&n.stack, (HOST, port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

#[test]
fn arp_goes_through_the_multiplexer_and_frames_are_well_formed() {
    let mut n = net("arp", StackConfig::default());
    let s = socket(&n, 4000);
    // Non-blocking: the datagram is held while the multiplexer asks the wire (a
    // blocking send would wait, and this thread is the one to answer).
    s.set_nonblocking(true).unwrap();
    s.send_to(b"first", (PEER, 9)).unwrap();
    let f = n.next_ip_frame();
    let d = etherparse_udp(&f);
    assert_eq!(d, (PEER_MAC.0, 4000, 9, b"first".to_vec()));
    // Cached now: no second question to the multiplexer.
    s.send_to(b"second", (PEER, 9)).unwrap();
    assert_eq!(etherparse_udp(&n.next_ip_frame()).3, b"second");
    let arp = n.stack.stats().arp;
    assert_eq!((arp.asks, arp.resolved), (arp.asks, 1));
    assert!(arp.hits >= 1);
}

/// (dst MAC, ports, payload) of a UDP frame, checked by an independent parser.
fn etherparse_udp(f: &[u8]) -> ([u8; 6], u16, u16, Vec<u8>) {
    let p = etherparse::SlicedPacket::from_ethernet(f).unwrap();
    let Some(etherparse::NetSlice::Ipv4(ip)) = &p.net else {
        panic!("not IPv4")
    };
    let Some(etherparse::TransportSlice::Udp(u)) = &p.transport else {
        panic!("not UDP")
    };
    let src = ip.header().source_addr();
    let dst = ip.header().destination_addr();
    let ok = u
        .to_header()
        .calc_checksum_ipv4_raw(src.octets(), dst.octets(), u.payload());
    assert_eq!(ok.unwrap(), u.checksum(), "UDP checksum");
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&f[..6]);
    (
        mac,
        u.source_port(),
        u.destination_port(),
        u.payload().to_vec(),
    )
}

#[test]
fn checksums_are_verified_in_the_copy() {
    let mut n = net("cksum", StackConfig::default());
    let s = socket(&n, 4001);
    let mut bad = n.udp(1, 4001, &[7u8; 300]);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let mut bad_inline = n.udp(1, 4001, b"short");
    bad_inline[40..42].copy_from_slice(&[0x12, 0x34]);
    let mut none = n.udp(2, 4001, b"no checksum");
    none[40..42].copy_from_slice(&[0, 0]);
    let good = n.udp(3, 4001, &[9u8; 1001]);
    n.inject(&[bad, bad_inline, none, good]);
    let mut buf = [0u8; 2048];
    let (len, from) = s.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..len], from), (&b"no checksum"[..], addr(2)));
    // A short buffer still verifies the whole datagram (the rest is summed).
    let mut small = [0u8; 333];
    assert_eq!(s.recv_from(&mut small).unwrap(), (333, addr(3)));
    assert_eq!(n.stack.stats().sockets.bad_checksum, 2);
    // Odd splits: the sum of the part read and of the rest join correctly.
    for cut in [1usize, 7, 8, 9, 1000] {
        let payload: Vec<u8> = (0..1001u32).map(|i| (i * 13) as u8).collect();
        let f = n.udp(4, 4001, &payload);
        n.inject(&[f]);
        let mut b = vec![0u8; cut];
        assert_eq!(s.recv(&mut b).unwrap(), cut, "cut {cut}");
        assert_eq!(&b[..], &payload[..cut]);
    }
    assert_eq!(n.stack.stats().sockets.bad_checksum, 2);
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from((PEER, port))
}

#[test]
fn hostile_datagrams_are_counted_and_dropped() {
    let mut n = net("hostile", StackConfig::default());
    let s = socket(&n, 4002);
    let good = n.udp(5, 4002, b"ok");
    // UDP length beyond the IP payload, and below the header.
    let mut long = n.udp(5, 4002, b"abcdef");
    long[38..40].copy_from_slice(&100u16.to_be_bytes());
    let mut short = n.udp(5, 4002, b"abcdef");
    short[38..40].copy_from_slice(&4u16.to_be_bytes());
    // Bad IP header checksum.
    let mut ipsum = n.udp(5, 4002, b"abcdef");
    ipsum[24] ^= 0xff;
    n.inject(&[long, short, ipsum, good]);
    let mut buf = [0u8; 64];
    assert_eq!(s.recv(&mut buf).unwrap(), 2);
    let st = n.stack.stats();
    assert_eq!(st.udp.bad_length, 2, "{st:?}");
    // The multiplexer classifies on the header and leaves the checksum to the
    // library, which drops it.
    assert_eq!(st.ipv4.dropped(Ipv4Drop::BadChecksum), 1, "{st:?}");
    assert_eq!((st.udp.delivered, st.queued), (1, 0));
}

#[test]
fn fragments_out_of_order_overlaps_and_floods() {
    let mut n = net("frag", StackConfig::default());
    let s = socket(&n, 4003);
    let payload: Vec<u8> = (0..8000u32).map(|i| (i % 253) as u8).collect();
    let mut whole = n.udp(6, 4003, &payload);
    // build sets DF, as a host would for a datagram this size on a path it knows.
    whole[20] &= !0x40;
    Ipv4Packet::new_unchecked(&mut whole[14..]).fill_checksum();
    let mut pieces = exonet_stack::fragment(&whole[14..], 1500).unwrap();
    assert_eq!(pieces.len(), 6);
    // Head last-but-one, the rest reversed: the multiplexer's fragment pool holds
    // the body fragments until the head names the channel.
    pieces.reverse();
    pieces.swap(0, 4);
    let frames: Vec<Vec<u8>> = pieces.iter().map(|p| eth(&n, p)).collect();
    n.inject(&frames);
    let mut buf = vec![0u8; 65536];
    let (len, from) = s.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..len], from), (&payload[..], addr(6)));
    let st = n.stack.stats();
    assert_eq!(st.reasm.reassembled, 1);
    assert_eq!(st.reasm_bytes, 0);

    // Overlapping fragments with different data poison the datagram (RFC 5722).
    let mut id_pieces = exonet_stack::fragment(&whole[14..], 1500).unwrap();
    let mut evil = id_pieces[1].clone();
    let off = u16::from_be_bytes([evil[6], evil[7]]) & 0x1fff;
    evil[6..8].copy_from_slice(&((off - 1) | 0x2000).to_be_bytes());
    Ipv4Packet::new_unchecked(&mut evil[..]).fill_checksum();
    id_pieces.insert(2, evil);
    let frames: Vec<Vec<u8>> = id_pieces.iter().map(|p| eth(&n, p)).collect();
    n.inject(&frames);
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert_eq!(s.recv(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
    let st = n.stack.stats();
    assert_eq!(st.reasm.overlap, 1, "{:?}", st.reasm);
}

fn eth(n: &Net, ip: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + ip.len());
    f.extend_from_slice(&n.host_mac.0);
    f.extend_from_slice(&PEER_MAC.0);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(ip);
    f
}

#[test]
fn a_full_socket_drops_and_counts() {
    let config = StackConfig {
        socket_queue: 8,
        ..StackConfig::default()
    };
    let mut n = net("full", config);
    let s = socket(&n, 4004);
    let frames: Vec<Vec<u8>> = (0..20u8).map(|i| n.udp(7, 4004, &[i; 200])).collect();
    n.inject(&frames);
    // All of them sorted before the first read (the daemon delivers them in
    // batches; a read between two would make room).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        n.stack.pump().unwrap();
        let st = n.stack.stats();
        if st.sockets.queue_full + st.queued as u64 >= 20 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut buf = [0u8; 256];
    let mut got = Vec::new();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    while let Ok(len) = s.recv(&mut buf) {
        got.push(buf[..len][0]);
    }
    let st = n.stack.stats();
    assert_eq!(got.len() as u64 + st.sockets.queue_full, 20, "{st:?}");
    assert!(st.sockets.queue_full >= 12);
    assert_eq!(st.queued, 0);
}

#[test]
fn fragmentation_needed_lowers_the_path_mtu() {
    let mut n = net("pmtu", StackConfig::default());
    let s = socket(&n, 4005);
    s.set_nonblocking(true).unwrap();
    s.send_to(&[1u8; 1400], (PEER, 9)).unwrap();
    let first = n.next_ip_frame();
    assert_eq!(first.len(), 14 + 20 + 8 + 1400, "fits the link's MTU whole");
    // A router on the way says 576 (RFC 1191), quoting the datagram.
    let icmp = exonet_wire::IcmpRepr::DstUnreachable {
        code: exonet_wire::icmp::unreach::FRAG_NEEDED,
        next_hop_mtu: 576,
        quoted: &first[14..14 + 28],
    };
    let ip = exonet_wire::Ipv4Repr::new(PEER, HOST, 1, icmp.buffer_len());
    let eth = exonet_wire::EthernetRepr {
        dst: n.host_mac,
        src: PEER_MAC,
        vlans: &[],
        ethertype: 0x0800,
    };
    let f = build::ipv4_frame(&eth, &ip, &build::Transport::Icmp(icmp)).unwrap();
    n.inject(&[f]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while n.stack.stats().sockets.pmtu_updates == 0 {
        n.stack.pump().unwrap();
        assert!(Instant::now() < deadline, "the error never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    s.set_nonblocking(false).unwrap();
    s.send_to(&[2u8; 1400], (PEER, 9)).unwrap();
    let mut total = 0;
    while total < 1408 {
        let f = n.next_ip_frame();
        assert!(f.len() - 14 <= 576, "a fragment of {} bytes", f.len() - 14);
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        total += ip.payload().len();
    }
    assert_eq!(total, 1408);
    assert_eq!(n.stack.stats().tx.fragmented, 1);
}

/// A TCP segment the host sent, its fields copied out.
#[derive(Debug)]
struct Seg {
    dport: u16,
    flags: u8,
    seq: u32,
    ack: u32,
    options: Vec<u8>,
    payload: Vec<u8>,
}

impl Seg {
    fn wscale(&self) -> Option<u8> {
        self.option(|o| match o {
            TcpOption::WindowScale(s) => Some(s),
            _ => None,
        })
    }

    fn timestamps(&self) -> Option<(u32, u32)> {
        self.option(|o| match o {
            TcpOption::Timestamps { tsval, tsecr } => Some((tsval, tsecr)),
            _ => None,
        })
    }

    fn first_sack_block(&self) -> Option<(u32, u32)> {
        self.option(|o| match o {
            TcpOption::Sack(blocks) => blocks[0],
            _ => None,
        })
    }

    fn option<T>(&self, f: impl Fn(TcpOption) -> Option<T>) -> Option<T> {
        TcpOptionIter::new(&self.options)
            .map_while(Result::ok)
            .find_map(f)
    }
}

impl Net {
    /// The next TCP segment from the host to the peer's `port` (others, such
    /// as a half-open connection's SYN-ACKs sent again, are passed over).
    fn next_tcp_to(&mut self, port: u16) -> Seg {
        loop {
            let f = self.next_ip_frame();
            let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
            if ip.protocol() != 6 {
                continue;
            }
            let p = TcpPacket::new_checked(ip.payload()).unwrap();
            let r = TcpRepr::parse(&p, HOST, PEER).expect("TCP checksum");
            if r.dst_port == port {
                return Seg {
                    dport: r.dst_port,
                    flags: r.flags,
                    seq: r.seq_number,
                    ack: r.ack_number,
                    options: r.options.to_vec(),
                    payload: r.payload.to_vec(),
                };
            }
        }
    }

    /// The next TCP segment with data from the host to the peer's `port`.
    fn next_data_to(&mut self, port: u16) -> Seg {
        loop {
            let s = self.next_tcp_to(port);
            if !s.payload.is_empty() {
                return s;
            }
        }
    }

    /// A segment from the peer's `sport` to the listener's port.
    fn tcp(
        &self,
        sport: u16,
        f: u8,
        seq: u32,
        ack: u32,
        opts: &[TcpOption],
        data: &[u8],
    ) -> Vec<u8> {
        build::tcp_frame(
            PEER_MAC,
            self.host_mac,
            PEER,
            HOST,
            sport,
            COOKIE_PORT,
            f,
            seq,
            ack,
            opts,
            data,
        )
    }
}

const COOKIE_PORT: u16 = 8000;

/// RFC 4987 §3.6: a listener whose SYN queue (of one) a half-open connection
/// holds full answers the next SYN with a SYN cookie and keeps nothing; the
/// ACK that returns the cookie makes a connection that carries data both
/// ways, with the options of the SYN; a forged ACK makes nothing and is
/// counted (and reset).
#[test]
fn a_full_syn_queue_answers_with_syn_cookies() {
    let mut n = net("cookie", StackConfig::default());
    let l = TcpListener::bind_with(&n.stack, (HOST, COOKIE_PORT), 1, TcpConfig::default()).unwrap();
    l.set_accept_timeout(Some(Duration::from_secs(5))).unwrap();
    // The half-open connection: its SYN-ACK is never answered.
    let syn = n.tcp(1000, flags::SYN, 111, 0, &[TcpOption::Mss(1460)], &[]);
    n.inject(&[syn]);
    let embryo = n.next_tcp_to(1000);
    assert_eq!((embryo.flags, embryo.ack), (flags::SYN | flags::ACK, 112));

    // The legitimate client, with every option.
    let opts = [
        TcpOption::Mss(1400),
        TcpOption::SackPermitted,
        TcpOption::Timestamps {
            tsval: 5000,
            tsecr: 0,
        },
        TcpOption::NoOp,
        TcpOption::WindowScale(7),
    ];
    let syn = n.tcp(2000, flags::SYN, 222, 0, &opts, &[]);
    n.inject(&[syn]);
    let synack = n.next_tcp_to(2000);
    assert_eq!((synack.flags, synack.ack), (flags::SYN | flags::ACK, 223));
    let (tsval, tsecr) = synack.timestamps().expect("timestamps answered");
    assert_eq!(tsecr, 5000);
    // Our window scale offered; the peer's (7) and SACK-permitted in the TSval.
    assert!(synack.wscale().is_some());
    assert_eq!(tsval & 0x1f, 7 | 0x10);
    let st = n.stack.stats().tcp;
    assert_eq!(
        (st.syn_cookies_sent, st.syn_dropped, st.open),
        (1, 0, 1),
        "{st:?}"
    );

    // The ACK returns the cookie, with data.
    let iss = synack.seq;
    let ts = |tsval| {
        [
            TcpOption::NoOp,
            TcpOption::NoOp,
            TcpOption::Timestamps {
                tsval,
                tsecr: tsval_of(&synack),
            },
        ]
    };
    let ack = n.tcp(
        2000,
        flags::ACK | flags::PSH,
        223,
        iss.wrapping_add(1),
        &ts(5001),
        b"hello",
    );
    n.inject(&[ack]);
    let (s, peer) = l.accept().unwrap();
    assert_eq!(peer, SocketAddr::from((PEER, 2000)));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    let mut r: &exonet_stack::TcpStream = &s;
    assert_eq!(r.read(&mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    let mut w: &exonet_stack::TcpStream = &s;
    w.write_all(b"world").unwrap();
    let reply = n.next_data_to(2000);
    assert_eq!(reply.payload, b"world");
    assert_eq!((reply.seq, reply.ack), (iss.wrapping_add(1), 228));
    let (r_tsval, r_tsecr) = reply.timestamps().expect("timestamps agreed");
    assert_eq!(r_tsecr, 5001);
    // The clock goes on from the cookie's TSval (the peer's PAWS).
    assert!(r_tsval.wrapping_sub(tsval) < 1 << 31);
    let st = n.stack.stats().tcp;
    assert_eq!((st.syn_cookies_accepted, st.accepts), (1, 1), "{st:?}");

    // SACK was agreed: data beyond a hole is reported (RFC 2018 §4).
    let late = n.tcp(
        2000,
        flags::ACK,
        238,
        iss.wrapping_add(6),
        &ts(5002),
        b"late",
    );
    n.inject(&[late]);
    let dup = n.next_tcp_to(2000);
    assert_eq!((dup.ack, dup.first_sack_block()), (228, Some((238, 242))));
    let hole = n.tcp(
        2000,
        flags::ACK,
        228,
        iss.wrapping_add(6),
        &ts(5003),
        b"0123456789",
    );
    n.inject(&[hole]);
    assert_eq!(n.next_tcp_to(2000).ack, 242);
    let mut got = [0u8; 14];
    r.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"0123456789late");
    // The MSS: the table's 1400, the offer, less the timestamps.
    w.write_all(&[7u8; 5000]).unwrap();
    let mut seg = n.next_tcp_to(2000);
    while seg.payload.is_empty() {
        seg = n.next_tcp_to(2000);
    }
    assert_eq!(seg.payload.len(), 1400 - 12);

    // A forged ACK: a RST, counted, and nothing to accept.
    let forged = n.tcp(3000, flags::ACK, 0x1234_5678, 0x9abc_def0, &[], b"x");
    n.inject(&[forged]);
    let rst = n.next_tcp_to(3000);
    assert_eq!(
        (rst.flags, rst.seq, rst.dport),
        (flags::RST, 0x9abc_def0, 3000)
    );
    let st = n.stack.stats().tcp;
    assert_eq!(
        (st.syn_cookies_rejected, st.accepts, st.open),
        (1, 1, 2),
        "{st:?}"
    );
    l.set_nonblocking(true).unwrap();
    assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
}

fn tsval_of(s: &Seg) -> u32 {
    s.timestamps().expect("timestamps").0
}

/// With SYN cookies off, the listener drops what its SYN queue has no room for.
#[test]
fn without_syn_cookies_a_full_syn_queue_drops() {
    let mut n = net("nocookie", StackConfig::default());
    let config = TcpConfig {
        syn_cookies: false,
        ..TcpConfig::default()
    };
    let _l = TcpListener::bind_with(&n.stack, (HOST, COOKIE_PORT), 1, config).unwrap();
    let syns = [
        n.tcp(1000, flags::SYN, 111, 0, &[], &[]),
        n.tcp(2000, flags::SYN, 222, 0, &[], &[]),
    ];
    n.inject(&syns);
    assert_eq!(n.next_tcp_to(1000).flags, flags::SYN | flags::ACK);
    let deadline = Instant::now() + Duration::from_secs(10);
    while n.stack.stats().tcp.syn_dropped == 0 {
        n.stack.pump().unwrap();
        assert!(Instant::now() < deadline, "the SYN was not dropped");
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = n.stack.stats().tcp;
    assert_eq!(
        (st.syn_dropped, st.syn_cookies_sent, st.open),
        (1, 0, 1),
        "{st:?}"
    );
}

/// A close takes in what has arrived first: the peer's FIN, already in the
/// rx ring but not yet looked at, is acknowledged by our FIN (CLOSE-WAIT to
/// LAST-ACK, one segment), instead of our FIN crossing it (a simultaneous
/// close: an ACK more, and TIME-WAIT at both ends).
#[test]
fn a_close_acknowledges_the_fin_that_has_arrived() {
    let mut n = net("close", StackConfig::default());
    let l = TcpListener::bind(&n.stack, (HOST, COOKIE_PORT)).unwrap();
    l.set_accept_timeout(Some(Duration::from_secs(5))).unwrap();
    n.inject(&[n.tcp(4000, flags::SYN, 500, 0, &[TcpOption::Mss(1460)], &[])]);
    let synack = n.next_tcp_to(4000);
    assert_eq!((synack.flags, synack.ack), (flags::SYN | flags::ACK, 501));
    let iss = synack.seq.wrapping_add(1);
    n.inject(&[n.tcp(4000, flags::ACK | flags::PSH, 501, iss, &[], b"hi")]);
    let (s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 2];
    (&s).read_exact(&mut buf).unwrap();
    // The FIN reaches the application's rx ring while nobody is in the stack.
    let delivered = rx_frames(&n);
    n.inject(&[n.tcp(4000, flags::FIN | flags::ACK, 503, iss, &[], &[])]);
    common::until("the FIN delivered", || rx_frames(&n) > delivered);
    drop(s);
    let mut seg = n.next_tcp_to(4000);
    // The keeper's pump, had it come first (a tick without a pump, or the
    // delayed ACK of "hi" due): "hi" acknowledged, or the FIN too.
    while seg.flags == flags::ACK && (seg.ack == 503 || seg.ack == 504) {
        seg = n.next_tcp_to(4000);
    }
    assert_eq!(
        (seg.flags, seg.seq, seg.ack),
        (flags::FIN | flags::ACK, iss, 504),
        "{seg:?}"
    );
    n.inject(&[n.tcp(4000, flags::ACK, 504, iss.wrapping_add(1), &[], &[])]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while n.stack.stats().tcp.open > 0 {
        assert!(Instant::now() < deadline, "{:?}", n.stack.stats().tcp);
        n.stack.pump().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Frames the daemon has delivered to its endpoints' rx rings.
fn rx_frames(n: &Net) -> u64 {
    let mut c = exonet_shm::control::Client::connect(n._daemon.socket()).unwrap();
    c.stats()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == "endpoint")
        .flat_map(|r| r.fields)
        .filter(|(name, _)| name == "rx_frames")
        .map(|(_, v)| v)
        .sum()
}

/// The daemon's channels bound to the peer's `port`: a connection channel's
/// filter ends with its source port (DPF's `0:16 == 0x…` on the TCP header).
fn channels_to(n: &Net, port: u16) -> usize {
    let mut c = exonet_shm::control::Client::connect(n._daemon.socket()).unwrap();
    c.stats()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == "channel" && r.label.ends_with(&format!("0:16 == {port:#x}")))
        .count()
}

/// Through a daemon, an accepted connection stays on its listener's channel
/// for its first `StackConfig::lazy_bind`, and asks for a channel of its own
/// only if it lasts: data goes both ways before and after.
#[test]
fn an_accepted_connection_binds_its_own_channel_only_once_it_lasts() {
    for (lazy, lasts) in [
        (Duration::from_secs(60), false),
        (Duration::from_millis(1), true),
    ] {
        let config = StackConfig {
            lazy_bind: lazy,
            // The peer never answers the FIN of the end.
            linger: Duration::ZERO,
            ..StackConfig::default()
        };
        let mut n = net(if lasts { "lazy-binds" } else { "lazy" }, config);
        let l = TcpListener::bind(&n.stack, (HOST, COOKIE_PORT)).unwrap();
        l.set_accept_timeout(Some(Duration::from_secs(5))).unwrap();
        let syn = n.tcp(3000, flags::SYN, 333, 0, &[TcpOption::Mss(1460)], &[]);
        n.inject(&[syn]);
        let synack = n.next_tcp_to(3000);
        assert_eq!(synack.flags, flags::SYN | flags::ACK);
        let iss = synack.seq.wrapping_add(1);
        n.inject(&[n.tcp(3000, flags::ACK | flags::PSH, 334, iss, &[], b"hi")]);
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        let mut r: &exonet_stack::TcpStream = &s;
        assert_eq!(r.read(&mut buf).unwrap(), 2);
        std::thread::sleep(Duration::from_millis(20));
        // A write pumps the stack, past the lazy bound in the second case.
        let mut w: &exonet_stack::TcpStream = &s;
        w.write_all(b"ok").unwrap();
        assert_eq!(n.next_data_to(3000).payload, b"ok");
        let deadline = Instant::now() + Duration::from_secs(5);
        while lasts && channels_to(&n, 3000) == 0 {
            assert!(Instant::now() < deadline, "no channel of its own");
            n.stack.pump().unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(channels_to(&n, 3000), usize::from(lasts), "lazy {lazy:?}");
        // The peer's data still arrives, on whichever channel.
        n.inject(&[n.tcp(
            3000,
            flags::ACK | flags::PSH,
            336,
            iss.wrapping_add(2),
            &[],
            b"more",
        )]);
        assert_eq!(r.read(&mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"more");
        // The listener goes: a connection still on its channel gets its own
        // first, instead of the reset of what the daemon followed there.
        drop(l);
        assert_eq!(channels_to(&n, 3000), 1);
        let last = n.tcp(
            3000,
            flags::ACK | flags::PSH,
            340,
            iss.wrapping_add(2),
            &[],
            b"last",
        );
        n.inject(&[last]);
        assert_eq!(r.read(&mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"last");
    }
}
