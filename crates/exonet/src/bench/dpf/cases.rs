//! The cases of the `dpf` suite: the DPF filters, the same filters as
//! tcpdump expressions, the frames, and which filter each frame must reach.
//!
//! The libpcap expressions say exactly what the DPF filters say, with two
//! caveats of the tcpdump language: `ip[..]` implies `ether proto 0x800`
//! and `tcp[..]` implies `ip proto 6` (so those atoms are not repeated,
//! which would only make libpcap's program longer), and `tcp[..]` also
//! requires the datagram not to be a later fragment (`ip[6:2] & 0x1fff ==
//! 0`), which no frame here is.

use exonet_dpf::Filter;
use exonet_wire::rng::SplitMix64;

use crate::bench::frames::{TcpFrame, OPT_ROUTER_ALERT};

/// Source address of DPF Figure 1 (192.12.69.1).
pub const SRC_IP: u32 = 0xc00c_4501;
pub const DST_IP: u32 = 0xc00c_4502;
pub const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// The first four bytes of [`DST_MAC`], the dst-mac atom of the depth cases.
pub const DST_MAC_WORD: u32 = 0x0200_0000;

/// Ports of Figure 1; the tcp10 filters count up from them.
pub const SPORT: u16 = 1234;
pub const DPORT: u16 = 4321;

/// The made-up encapsulation of depth levels 4 and 5: a header whose first
/// byte's low nibble is its length in 4-byte words, then a type byte; level
/// 4 checks type and a 16-bit channel, level 5 (the header after it) a type
/// and a 32-bit key.
pub const XL_TYPE: u8 = 0x42;
pub const XL_CHANNEL: u16 = 0x1001;
pub const INNER_TYPE: u8 = 0x43;
pub const INNER_KEY: u32 = 0xdead_beef;
pub const MAX_DEPTH: usize = 5;

/// Shared by all the `ports-N` filters.
const ETH_IP_TCP_VAR: &str = "12:16 == 0x800 & SHIFT(14) & 9:8 == 6 & SHIFT((0:8 & 0x0f) << 2)";

/// One case of the suite, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// `tcp10` / `tcp10-var`: the ten TCP/IP filters of Table 3 / Figure 1.
    Tcp10 { var_header: bool },
    /// `ports-N`: N filters that differ only in the destination port.
    Ports(usize),
    /// `depth-D`: one filter of D protocol levels, two atoms each (Figure 3).
    Depth(usize),
    /// `insert-N`: time to insert one more filter with N installed.
    Insert(usize),
}

impl Spec {
    /// Every case, in the order they run.
    pub fn all() -> Vec<Spec> {
        let mut v = vec![
            Spec::Tcp10 { var_header: false },
            Spec::Tcp10 { var_header: true },
        ];
        v.extend([1, 2, 3, 10, 100, 1000, 10000].map(Spec::Ports));
        v.extend((1..=MAX_DEPTH).map(Spec::Depth));
        v.extend([10, 1000, 10000].map(Spec::Insert));
        v
    }

    pub fn name(&self) -> String {
        match self {
            Spec::Tcp10 { var_header: false } => "tcp10".into(),
            Spec::Tcp10 { var_header: true } => "tcp10-var".into(),
            Spec::Ports(n) => format!("ports-{n}"),
            Spec::Depth(d) => format!("depth-{d}"),
            Spec::Insert(n) => format!("insert-{n}"),
        }
    }

    /// The demultiplexing case (`None` for the insertion cases).
    pub fn build(&self) -> Option<Case> {
        match *self {
            Spec::Tcp10 { var_header } => Some(tcp10(var_header)),
            Spec::Ports(n) => Some(ports(n)),
            Spec::Depth(d) => Some(depth(d)),
            Spec::Insert(_) => None,
        }
    }
}

/// What the hand-written classifiers (Rust and eBPF) are built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Source address [`SRC_IP`]; filter `i` has ports `ports[i]`
    /// (source, destination).
    Tcp10 {
        var_header: bool,
        ports: Vec<(u16, u16)>,
    },
    /// Filter `i` has destination port `ports[i]`.
    Ports(Vec<u16>),
    /// One filter of this many levels.
    Depth(usize),
}

/// A demultiplexing case.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub kind: Kind,
    pub filters: Vec<Filter>,
    /// `pcap[i]` is `filters[i]` in tcpdump syntax.
    pub pcap: Vec<String>,
    pub frames: Vec<Vec<u8>>,
    /// The index of the filter each frame must reach.
    pub expected: Vec<Option<usize>>,
}

impl Case {
    /// Checks the case against the filters' own definition
    /// ([`Filter::matches`]): each frame matches the filter it is meant for.
    /// (That no other filter matches is checked by the unit tests, which
    /// can afford the quadratic check.)
    pub fn check(&self) -> Result<(), String> {
        if self.frames.len() != self.expected.len() || self.filters.len() != self.pcap.len() {
            return Err("case is malformed".into());
        }
        for (j, (f, e)) in self.frames.iter().zip(&self.expected).enumerate() {
            if let Some(i) = *e {
                if !self.filters[i].matches(f) {
                    return Err(format!("frame {j} does not match its filter {i}"));
                }
            }
        }
        Ok(())
    }
}

/// IPv4 options of the variable-header frames: none, 4 or 8 bytes.
fn options(k: usize) -> &'static [u8] {
    const RA_NOP: [u8; 8] = [0x94, 0x04, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00];
    match k % 3 {
        0 => &[],
        1 => &OPT_ROUTER_ALERT,
        _ => &RA_NOP,
    }
}

// ---- tcp10 / tcp10-var ----

/// The ports of the ten tcp10 filters (source, destination).
pub fn tcp10_ports() -> Vec<(u16, u16)> {
    (0..10).map(|i| (SPORT + i, DPORT + i)).collect()
}

/// Figure 1, with a fixed 20-byte or a variable-length IP header.
pub fn tcp10_filter(var_header: bool, sport: u16, dport: u16) -> Filter {
    let skip_ip = if var_header {
        "SHIFT((0:8 & 0x0f) << 2)"
    } else {
        "SHIFT(20)"
    };
    format!(
        "12:16 == 0x800 & SHIFT(14) & 9:8 == 6 & 12:32 == {SRC_IP:#x} & {skip_ip} \
         & 0:16 == {sport} & 2:16 == {dport}"
    )
    .parse()
    .expect("tcp10 filter parses")
}

pub fn tcp10_pcap(var_header: bool, sport: u16, dport: u16) -> String {
    if var_header {
        format!("ip[12:4] == {SRC_IP:#x} and tcp[0:2] == {sport} and tcp[2:2] == {dport}")
    } else {
        // The TCP ports at fixed offsets: 14 + 20 and 14 + 22.
        format!(
            "ip[9] == 6 and ip[12:4] == {SRC_IP:#x} and ether[34:2] == {sport} \
             and ether[36:2] == {dport}"
        )
    }
}

fn tcp10(var_header: bool) -> Case {
    let ports = tcp10_ports();
    let frames = ports
        .iter()
        .enumerate()
        .map(|(i, &(sport, dport))| {
            TcpFrame {
                dst_mac: DST_MAC,
                src_ip: SRC_IP,
                dst_ip: DST_IP,
                ip_options: if var_header { options(i) } else { &[] },
                src_port: sport,
                dst_port: dport,
                seq: i as u32,
                ..TcpFrame::default()
            }
            .build()
        })
        .collect();
    Case {
        name: Spec::Tcp10 { var_header }.name(),
        filters: ports
            .iter()
            .map(|&(s, d)| tcp10_filter(var_header, s, d))
            .collect(),
        pcap: ports
            .iter()
            .map(|&(s, d)| tcp10_pcap(var_header, s, d))
            .collect(),
        expected: (0..ports.len()).map(Some).collect(),
        frames,
        kind: Kind::Tcp10 { var_header, ports },
    }
}

// ---- ports-N and insert-N ----

/// The destination port of filter `i` of the ports family: distinct for
/// `i < 64000` and scattered over 1024..65024 (not a dense range).
pub fn port(i: usize) -> u16 {
    assert!(i < 64000);
    (1024 + (i * 40503) % 64000) as u16
}

/// Ethernet, IPv4, TCP, variable IP header, destination port.
pub fn ports_filter(port: u16) -> Filter {
    format!("{ETH_IP_TCP_VAR} & 2:16 == {port}")
        .parse()
        .expect("ports filter parses")
}

pub fn ports_pcap(port: u16) -> String {
    format!("tcp[2:2] == {port}")
}

/// The `j`th frame to destination port `port`; every fourth carries an IP
/// option.
pub fn ports_frame(port: u16, j: usize) -> Vec<u8> {
    TcpFrame {
        src_ip: 0x0a00_0000 | (j as u32 & 0xffff),
        dst_ip: DST_IP,
        ip_options: if j % 4 == 3 { &OPT_ROUTER_ALERT } else { &[] },
        src_port: 32768 + (j % 16384) as u16,
        dst_port: port,
        seq: j as u32,
        ..TcpFrame::default()
    }
    .build()
}

fn ports(n: usize) -> Case {
    let ports: Vec<u16> = (0..n).map(port).collect();
    // A fixed frame set: every filter equally often, in a shuffled order.
    let mut order: Vec<usize> = (0..n.max(4096)).map(|j| j % n).collect();
    // Deterministic, so every run measures the same frames.
    SplitMix64::new(n as u64).shuffle(&mut order);
    Case {
        name: Spec::Ports(n).name(),
        filters: ports.iter().map(|&p| ports_filter(p)).collect(),
        pcap: ports.iter().map(|&p| ports_pcap(p)).collect(),
        frames: order
            .iter()
            .enumerate()
            .map(|(j, &i)| ports_frame(ports[i], j))
            .collect(),
        expected: order.into_iter().map(Some).collect(),
        kind: Kind::Ports(ports),
    }
}

// ---- depth-D ----

/// One filter of `d` levels, two atoms each: Ethernet (type, dst-mac word),
/// IP (protocol, source), TCP (ports), the encapsulation header (type,
/// channel), the inner header (type, key); a SHIFT between levels.
pub fn depth_filter(d: usize) -> Filter {
    assert!((1..=MAX_DEPTH).contains(&d));
    let levels = [
        format!("12:16 == 0x800 & 0:32 == {DST_MAC_WORD:#x}"),
        format!("SHIFT(14) & 9:8 == 6 & 12:32 == {SRC_IP:#x}"),
        format!("SHIFT((0:8 & 0x0f) << 2) & 0:16 == {SPORT} & 2:16 == {DPORT}"),
        format!("SHIFT(20) & 1:8 == {XL_TYPE:#x} & 2:16 == {XL_CHANNEL:#x}"),
        format!("SHIFT((0:8 & 0x0f) << 2) & 1:8 == {INNER_TYPE:#x} & 4:32 == {INNER_KEY:#x}"),
    ];
    levels[..d]
        .join(" & ")
        .parse()
        .expect("depth filter parses")
}

pub fn depth_pcap(d: usize) -> String {
    assert!((1..=MAX_DEPTH).contains(&d));
    let mut atoms = Vec::new();
    if d == 1 {
        atoms.push("ether[12:2] == 0x800".to_string()); // implied by ip[] below
    }
    atoms.push(format!("ether[0:4] == {DST_MAC_WORD:#x}"));
    if d >= 2 {
        if d == 2 {
            atoms.push("ip[9] == 6".into()); // implied by tcp[] below
        }
        atoms.push(format!("ip[12:4] == {SRC_IP:#x}"));
    }
    if d >= 3 {
        atoms.push(format!("tcp[0:2] == {SPORT} and tcp[2:2] == {DPORT}"));
    }
    if d >= 4 {
        atoms.push(format!(
            "tcp[21] == {XL_TYPE:#x} and tcp[22:2] == {XL_CHANNEL:#x}"
        ));
    }
    if d >= 5 {
        let inner = "20 + ((tcp[20] & 0x0f) << 2)";
        atoms.push(format!(
            "tcp[{inner} + 1] == {INNER_TYPE:#x} and tcp[{inner} + 4 : 4] == {INNER_KEY:#x}"
        ));
    }
    atoms.join(" and ")
}

/// A frame that matches every depth filter; `v` varies the IP options and
/// the length of the encapsulation header.
pub fn depth_frame(v: usize) -> Vec<u8> {
    let xl_words = 2 + (v / 2) % 2; // 8 or 12 bytes
    let mut payload = vec![0x10 | xl_words as u8, XL_TYPE];
    payload.extend_from_slice(&XL_CHANNEL.to_be_bytes());
    payload.resize(xl_words * 4, 0);
    payload.extend_from_slice(&[0x12, INNER_TYPE, 0, 0]);
    payload.extend_from_slice(&INNER_KEY.to_be_bytes());
    payload.extend_from_slice(b"payload");
    TcpFrame {
        dst_mac: DST_MAC,
        src_ip: SRC_IP,
        dst_ip: DST_IP,
        ip_options: if v % 2 == 1 { &OPT_ROUTER_ALERT } else { &[] },
        src_port: SPORT,
        dst_port: DPORT,
        seq: v as u32,
        payload: &payload,
        ..TcpFrame::default()
    }
    .build()
}

fn depth(d: usize) -> Case {
    let frames: Vec<Vec<u8>> = (0..8).map(depth_frame).collect();
    Case {
        name: Spec::Depth(d).name(),
        kind: Kind::Depth(d),
        filters: vec![depth_filter(d)],
        pcap: vec![depth_pcap(d)],
        expected: vec![Some(0); frames.len()],
        frames,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every frame matches exactly the filter it is meant for, by the
    /// filters' own definition.
    #[test]
    fn frames_match_exactly_their_filter() {
        for spec in Spec::all() {
            let Some(case) = (match spec {
                Spec::Ports(n) if n > 100 => None,
                s => s.build(),
            }) else {
                continue;
            };
            case.check().unwrap();
            for (j, f) in case.frames.iter().enumerate() {
                let hits: Vec<usize> = (0..case.filters.len())
                    .filter(|&i| case.filters[i].matches(f))
                    .collect();
                assert_eq!(
                    hits,
                    case.expected[j].into_iter().collect::<Vec<_>>(),
                    "{} frame {j}",
                    case.name
                );
            }
        }
        // depth_frame(3): 4 bytes of IP options, a 12-byte encapsulation
        // header; each level needs the frame up to its last atom.
        let f = depth_frame(3);
        for (d, needed) in [(1, 14), (2, 30), (3, 42), (4, 62), (5, 78)] {
            let filter = depth_filter(d);
            assert!(filter.matches(&f[..needed]), "depth {d}");
            assert!(!filter.matches(&f[..needed - 1]), "depth {d}");
        }
    }

    #[test]
    fn names_are_the_documented_ones() {
        let names: Vec<String> = Spec::all().iter().map(Spec::name).collect();
        assert_eq!(
            names.join(" "),
            "tcp10 tcp10-var ports-1 ports-2 ports-3 ports-10 ports-100 ports-1000 \
             ports-10000 depth-1 depth-2 depth-3 depth-4 depth-5 insert-10 insert-1000 \
             insert-10000"
        );
    }

    #[test]
    fn ports_are_distinct() {
        let mut v: Vec<u16> = (0..64000).map(port).collect();
        v.sort_unstable();
        v.dedup();
        assert_eq!(v.len(), 64000);
    }
}
