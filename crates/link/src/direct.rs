//! A direct send port: an untrusted application's own way to the wire for its
//! latency-bound TCP frames, checked in the kernel instead of by the daemon.
//!
//! Through the daemon, every frame an application sends costs a hand-off
//! between processes (the application's ring, the daemon's transmit scan, the
//! daemon's check of the frame against the socket's template) before it
//! reaches the kernel. A [`DirectPort`] removes that hand-off from each one-way
//! trip: the trusted daemon creates a macvtap device of the application's own
//! on the link's interface, opens its character device and passes the
//! descriptor to the application (`SCM_RIGHTS`), which then writes plain
//! Ethernet frames to it. The descriptor is bound to its macvtap for good: the
//! application cannot point it at another interface, and when the daemon
//! deletes the macvtap (on drop) the descriptor is dead.
//!
//! The daemon's check moves into a BPF program on the macvtap's egress (tcx),
//! which sees every frame written before it leaves, so the application cannot
//! skip it. A frame passes only if all of these hold, else it is dropped and
//! counted (`refused`):
//!
//! - it is one whole, plain frame: from 54 bytes (Ethernet, IPv4, TCP) to the
//!   lower interface's MTU plus 14, no VLAN tag (in the frame or the skb), not
//!   a GSO packet, and no checksum left for the kernel to write
//!   (`CHECKSUM_PARTIAL`). The last two matter because the application can
//!   turn the macvtap's virtio-net header back on (`TUNSETIFF` needs no
//!   privilege on an open queue): a header asking for a checksum at an offset
//!   of its choosing would have the kernel overwrite two bytes of the frame
//!   (a port, an address) after the check;
//! - Ethernet source is the lower interface's address, EtherType IPv4;
//! - IPv4 without options, the whole datagram (no MF, no offset, no reserved
//!   bit; DF allowed), TCP, TTL not 0, its total length within the frame and
//!   nothing after it but Ethernet padding (frames up to 60 bytes);
//! - TCP with ACK and without SYN, FIN or RST (opening and closing stay on the
//!   daemon's path, which follows them), its header within the datagram;
//! - its 4-tuple is one the daemon allowed ([`DirectPort::allow`]);
//! - a token bucket on the bytes passed has room for it; else it is dropped
//!   and counted as `over_rate`. The bucket's state is shared by the CPUs
//!   without a lock: two frames sent at the same instant on two CPUs may
//!   both take the same tokens, which errs by a frame at most per CPU.
//!
//! For each allowed connection the program records what it let through
//! ([`DirectSent`]: the highest sequence number sent plus its payload, the
//! last acknowledgment, the next hop), so that the daemon can take the
//! connection back ([`DirectPort::revoke`]) knowing where it stands.
//!
//! The macvtap is in private mode (it does not talk to the other macvtaps of
//! the interface) and a drop-all program on its ingress keeps the application
//! from reading anything arriving on the interface (broadcasts, frames to the
//! macvtap's own address): it only sends. Its IPv6 is off before it comes up,
//! so that Linux sends nothing of its own through it.
//!
//! Needs `CAP_NET_ADMIN`, `CAP_BPF` and `CAP_MKNOD` (root).

use std::ffi::CString;
use std::fmt;
use std::fs;
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

use crate::bpf::frame::*;
use crate::bpf::{self, *};
use crate::sys;

/// Start of the name of every macvtap [`port_name`] makes, which
/// [`remove_stale`] looks for.
const PREFIX: &str = "exod";
/// Most connections a port allows at once.
pub const MAX_CONNS: u32 = 4096;

const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;
const TCX_PASS: i32 = 0;
const TCX_DROP: i32 = 2;
const BPF_FUNC_SKB_PULL_DATA: i32 = 39;
const BPF_FUNC_CSUM_LEVEL: i32 = 135;
const BPF_CSUM_LEVEL_QUERY: i32 = 0;
const BPF_CSUM_LEVEL_INC: i32 = 1;
const BPF_CSUM_LEVEL_DEC: i32 = 2;
/// Offsets in `struct __sk_buff`.
const SKB_LEN: i16 = 0;
const SKB_VLAN_PRESENT: i16 = 20;
const SKB_DATA: i16 = 76;
const SKB_DATA_END: i16 = 80;
const SKB_GSO_SIZE: i16 = 176;

// Ethernet, IPv4 without options, TCP (offsets in [`crate::bpf::frame`]).
const ETH_HLEN: u32 = 14;
const MIN_FRAME: i32 = 54;

/// The connection map: key the 4-tuple as on the wire (source and
/// destination address, source and destination port), value what passed.
const KEY_LEN: usize = 12;
const CONN_LEN: usize = 16;
const C_SND_MAX: i16 = 0;
const C_ACK: i16 = 4;
const C_NEXT_HOP: i16 = 8;
const C_SENT: i16 = 14;
/// The state map (an array of one entry): the token bucket, then counters.
const STATE_LEN: usize = 48;
const S_TOKENS: i16 = 0;
const S_LAST: i16 = 8;
const S_PASSED: i16 = 16;
const S_PASSED_BYTES: i16 = 24;
const S_REFUSED: i16 = 32;
const S_OVER_RATE: i16 = 40;
// BPF stack slots (below r10).
const K_STATE: i16 = -4;
const K_CONN: i16 = -16;
const K_PAYLOAD: i16 = -24;
/// The bucket counts tokens in nanobytes (bytes × 10⁹), so that a refill of
/// elapsed nanoseconds × bytes per second needs no division and loses nothing.
const NANO: u64 = 1_000_000_000;
/// Bounds on [`Rate`] that keep the bucket's arithmetic within 64 bits.
const MAX_BYTES_PER_SEC: u64 = 1 << 40;
const MAX_BURST: u64 = 1 << 32;

/// A connection sent on directly: its addresses as the application sends
/// (`local` is the frames' source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DirectConn {
    /// The application's address and port: the frames' source.
    pub local: SocketAddrV4,
    /// The peer's: the frames' destination.
    pub remote: SocketAddrV4,
}

impl DirectConn {
    /// The map key: the fields as they are on the wire, in the frame's order.
    fn key(&self) -> [u8; KEY_LEN] {
        let mut k = [0u8; KEY_LEN];
        k[..4].copy_from_slice(&self.local.ip().octets());
        k[4..8].copy_from_slice(&self.remote.ip().octets());
        k[8..10].copy_from_slice(&self.local.port().to_be_bytes());
        k[10..].copy_from_slice(&self.remote.port().to_be_bytes());
        k
    }
}

/// What the check let through for one connection (host-order numbers: the
/// program converts them from the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectSent {
    /// The highest sequence number sent plus its payload length (SND.MAX as
    /// seen on the direct path), compared modulo 2³².
    pub snd_max: u32,
    /// The acknowledgment number of the last frame.
    pub ack: u32,
    /// The destination address of the last frame.
    pub next_hop: [u8; 6],
}

/// Counters of a port since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectStats {
    /// Frames that passed the check.
    pub passed: u64,
    /// Bytes of those frames.
    pub passed_bytes: u64,
    /// Frames refused by the check.
    pub refused: u64,
    /// Frames that passed the check but found the token bucket short.
    pub over_rate: u64,
}

/// A token bucket on the bytes a port passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Refill rate: from 1 to 2⁴⁰.
    pub bytes_per_sec: u64,
    /// Capacity (full at creation): from the largest frame (MTU + 14) to 2³².
    pub burst: u64,
}

/// A macvtap an application sends on directly (see the [module
/// documentation](self)).
#[derive(Debug)]
pub struct DirectPort {
    /// The application's end; the first to close.
    fd: OwnedFd,
    conns: OwnedFd,
    state: OwnedFd,
    /// Deleted last, when nothing refers to it any more.
    _tap: Macvtap,
    name: String,
}

impl DirectPort {
    /// Creates the macvtap `name` (private mode, up) on `lower`, loads and
    /// attaches the check (egress) and a drop-all (ingress), and opens it.
    /// `mac`: the only source address allowed (the lower interface's).
    /// `rate`: the token bucket on the bytes passed.
    pub fn create(lower: &str, name: &str, mac: [u8; 6], rate: Rate) -> io::Result<DirectPort> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', '\0']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad interface name {name:?}"),
            ));
        }
        let lower_index = sys::if_index(lower).map_err(|e| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {lower}: {e}"),
            )
        })?;
        let sock = sys::ioctl_socket()?;
        let mut ifr = sys::ifreq(lower)?;
        sys::ioctl_ifreq(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr)
            .map_err(context(format!("flags of {lower}")))?;
        // SAFETY: SIOCGIFFLAGS filled the `ifru_flags` member.
        if i32::from(unsafe { ifr.ifr_ifru.ifru_flags }) & libc::IFF_UP == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NetworkDown,
                format!("{lower} is down"),
            ));
        }
        let (mtu, _) = sys::if_mtu_mac(sock.as_raw_fd(), lower)?;
        let max_len = mtu as u64 + u64::from(ETH_HLEN);
        if !(1..=MAX_BYTES_PER_SEC).contains(&rate.bytes_per_sec)
            || !(max_len..=MAX_BURST).contains(&rate.burst)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad rate {rate:?}: burst must hold a frame of {max_len} bytes"),
            ));
        }

        let tap = Macvtap::create(lower_index, name)?;
        // Before it is up: Linux would send IPv6 autoconfiguration through it
        // (and have it refused). A kernel without IPv6 has nothing to turn off.
        let v6 = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
        if Path::new(&v6).exists() {
            fs::write(&v6, "1").map_err(context(format!("turning off IPv6 on {name}")))?;
        }
        let (conns, state) = maps(rate)?;
        let check = bpf::load(
            &check_program(
                conns.as_raw_fd(),
                state.as_raw_fd(),
                mac,
                max_len as u32,
                rate,
            ),
            tc("exonet_direct", BPF_TCX_EGRESS),
        )?;
        let drop_all = bpf::load(&drop_program(), tc("exonet_drop", BPF_TCX_INGRESS))?;
        let attach = |prog: &OwnedFd, at: u32, what: &str| {
            bpf::prog_attach(prog, tap.ifindex, at)
                .map_err(context(format!("attaching the {what} program to {name}")))
        };
        // Both before it is up and opened: nothing reaches the descriptor
        // unchecked, either way. Attached to the macvtap itself, not through
        // BPF links, which close with the daemon: a daemon that dies leaves
        // the applications' descriptors on macvtaps that still check, until
        // the next daemon deletes them ([`remove_stale`]).
        attach(&check, BPF_TCX_EGRESS, "egress")?;
        attach(&drop_all, BPF_TCX_INGRESS, "ingress")?;
        rtnl(Request::link(
            RTM_NEWLINK,
            0,
            tap.ifindex,
            libc::IFF_UP as u32,
        ))
        .map_err(context(format!("bringing {name} up")))?;
        let fd = open_tap(name, tap.ifindex)?;
        Ok(DirectPort {
            fd,
            conns,
            state,
            _tap: tap,
            name: name.to_owned(),
        })
    }

    /// The macvtap's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The macvtap's descriptor, for the application (`SCM_RIGHTS`): each
    /// write sends one Ethernet frame.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Allows the frames of `c`, with nothing sent yet (an allowed
    /// connection starts over). Fails beyond [`MAX_CONNS`].
    pub fn allow(&self, c: DirectConn) -> io::Result<()> {
        put_conn(&self.conns, c).map_err(context(format!("allowing {c:?} on {}", self.name)))
    }

    /// Stops allowing the frames of `c`; returns what passed for it
    /// (`None` if nothing did, or it was not allowed). The record is taken
    /// and deleted at once; a frame of `c` that the program is checking on
    /// another CPU at that instant may still pass, unrecorded.
    pub fn revoke(&self, c: DirectConn) -> io::Result<Option<DirectSent>> {
        self.read_conn(BPF_MAP_LOOKUP_AND_DELETE_ELEM, c, "revoking")
    }

    /// What passed for `c` so far (`None` if nothing did, or it is not allowed).
    pub fn sent(&self, c: DirectConn) -> io::Result<Option<DirectSent>> {
        self.read_conn(BPF_MAP_LOOKUP_ELEM, c, "looking up")
    }

    fn read_conn(
        &self,
        cmd: libc::c_int,
        c: DirectConn,
        what: &str,
    ) -> io::Result<Option<DirectSent>> {
        let mut v = [0u8; CONN_LEN];
        match map_elem(cmd, &self.conns, &c.key(), Some(&mut v)) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(context(format!("{what} {c:?} on {}", self.name))(e)),
            // Allowed, but nothing passed yet.
            Ok(()) if v[C_SENT as usize] == 0 => Ok(None),
            Ok(()) => Ok(Some(DirectSent {
                snd_max: u32::from_ne_bytes(v[0..4].try_into().expect("4 bytes")),
                ack: u32::from_ne_bytes(v[4..8].try_into().expect("4 bytes")),
                next_hop: v[8..14].try_into().expect("6 bytes"),
            })),
        }
    }

    /// Counters since the port was created.
    pub fn stats(&self) -> DirectStats {
        read_stats(&self.state).unwrap_or_default()
    }
}

/// Prefixes an error with the step that failed, keeping its kind.
fn context(what: impl fmt::Display) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A tc program attached with tcx at `attach_type`.
fn tc(name: &'static str, attach_type: u32) -> ProgKind {
    ProgKind {
        prog_type: BPF_PROG_TYPE_SCHED_CLS,
        attach_type,
        flags: 0,
        name,
    }
}

/// Puts `c` in the connection map `conns` with nothing sent yet.
fn put_conn(conns: &OwnedFd, c: DirectConn) -> io::Result<()> {
    let mut fresh = [0u8; CONN_LEN];
    map_elem(BPF_MAP_UPDATE_ELEM, conns, &c.key(), Some(&mut fresh))
}

/// The connection map (empty) and the state map (a full bucket, no counts).
fn maps(rate: Rate) -> io::Result<(OwnedFd, OwnedFd)> {
    let conns = bpf::map_create(
        BPF_MAP_TYPE_HASH,
        KEY_LEN as u32,
        CONN_LEN as u32,
        MAX_CONNS,
    )
    .map_err(context("creating the connection map"))?;
    let state = bpf::map_create(BPF_MAP_TYPE_ARRAY, 4, STATE_LEN as u32, 1)
        .map_err(context("creating the state map"))?;
    let mut v = [0u8; STATE_LEN];
    v[..8].copy_from_slice(&(rate.burst * NANO).to_ne_bytes());
    map_elem(
        BPF_MAP_UPDATE_ELEM,
        &state,
        &0u32.to_ne_bytes(),
        Some(&mut v),
    )?;
    Ok((conns, state))
}

fn read_stats(state: &OwnedFd) -> io::Result<DirectStats> {
    let mut v = [0u8; STATE_LEN];
    map_elem(
        BPF_MAP_LOOKUP_ELEM,
        state,
        &0u32.to_ne_bytes(),
        Some(&mut v),
    )?;
    let at = |off: i16| {
        u64::from_ne_bytes(
            v[off as usize..off as usize + 8]
                .try_into()
                .expect("8 bytes"),
        )
    };
    Ok(DirectStats {
        passed: at(S_PASSED),
        passed_bytes: at(S_PASSED_BYTES),
        refused: at(S_REFUSED),
        over_rate: at(S_OVER_RATE),
    })
}

/// The egress check (see the [module documentation](self)) over the
/// connection map `conns` and the state map `state`, with the source
/// address, the longest frame and the bucket as immediates.
///
/// Registers: r6 the context (then the connection's record), r7 the frame's
/// length, r8 the frame (its first 54 bytes linear), r9 the state.
///
/// Every packet load is aligned to its size once the 2 bytes of
/// `NET_IP_ALIGN` are counted (hence 16-bit loads for the source address), as
/// the verifier checks under strict alignment.
fn check_program(conns: RawFd, state: RawFd, mac: [u8; 6], max_len: u32, rate: Rate) -> Vec<u64> {
    let cap = rate.burst * NANO;
    // The time a bucket takes to fill from empty: a longer wait fills it,
    // and a shorter one's refill (below `cap + rate`) fits in 64 bits.
    let fill_ns = cap.div_ceil(rate.bytes_per_sec);
    let mut a = Asm::default();
    let [refuse, drop, linear, len_ok, full, have, store_max, recorded, over] =
        [(); 9].map(|()| a.new_label());
    let call = |a: &mut Asm, f: i32| a.op(CALL, 0, 0, 0, f);
    let csum_level = |a: &mut Asm, level: i32| {
        a.op(MOV_X, 1, 6, 0, 0);
        a.op(MOV_K, 2, 0, 0, level);
        a.op(CALL, 0, 0, 0, BPF_FUNC_CSUM_LEVEL);
    };

    a.op(MOV_X, 6, 1, 0, 0);
    a.op(ST_W, 10, 0, K_STATE, 0);
    a.ld_map(1, state);
    a.op(MOV_X, 2, 10, 0, 0);
    a.op(ADD_K, 2, 0, 0, K_STATE.into());
    call(&mut a, BPF_FUNC_MAP_LOOKUP_ELEM);
    a.jump(JEQ_K, 0, 0, 0, drop);
    a.op(MOV_X, 9, 0, 0, 0);

    // One whole, plain frame.
    a.op(LDX_W, 7, 6, SKB_LEN, 0);
    a.jump(JLT_K, 7, 0, MIN_FRAME, refuse);
    a.jump(JGT_K, 7, 0, max_len as i32, refuse);
    a.op(LDX_W, 1, 6, SKB_VLAN_PRESENT, 0);
    a.jump(JNE_K, 1, 0, 0, refuse);
    a.op(LDX_W, 1, 6, SKB_GSO_SIZE, 0);
    a.jump(JNE_K, 1, 0, 0, refuse);
    // CHECKSUM_PARTIAL, told from CHECKSUM_NONE (and UNNECESSARY) as the one
    // a level increment leaves without a level; the decrement undoes it.
    csum_level(&mut a, BPF_CSUM_LEVEL_INC);
    csum_level(&mut a, BPF_CSUM_LEVEL_QUERY);
    a.jump(JSLT_K, 0, 0, 0, refuse);
    csum_level(&mut a, BPF_CSUM_LEVEL_DEC);
    // The headers in the linear part. A macvtap write is linear whenever it
    // fits in a page (tap_alloc_skb), so the pull is for jumbo frames.
    a.op(LDX_W, 8, 6, SKB_DATA, 0);
    a.op(LDX_W, 2, 6, SKB_DATA_END, 0);
    a.op(MOV_X, 3, 8, 0, 0);
    a.op(ADD_K, 3, 0, 0, MIN_FRAME);
    a.jump(JLE_X, 3, 2, 0, linear);
    a.op(MOV_X, 1, 6, 0, 0);
    a.op(MOV_K, 2, 0, 0, MIN_FRAME);
    call(&mut a, BPF_FUNC_SKB_PULL_DATA);
    a.jump(JNE_K, 0, 0, 0, refuse);
    a.op(LDX_W, 8, 6, SKB_DATA, 0);
    a.op(LDX_W, 2, 6, SKB_DATA_END, 0);
    a.op(MOV_X, 3, 8, 0, 0);
    a.op(ADD_K, 3, 0, 0, MIN_FRAME);
    a.jump(JGT_X, 3, 2, 0, refuse);
    a.label(linear);

    let expect16 = |a: &mut Asm, off: i16, v: u16| {
        a.op(LDX_H, 1, 8, off, 0);
        a.jump(JNE_K, 1, 0, wire16(v), refuse);
    };
    for (i, pair) in mac.chunks(2).enumerate() {
        expect16(
            &mut a,
            ETH_SRC + 2 * i as i16,
            u16::from_be_bytes([pair[0], pair[1]]),
        );
    }
    expect16(&mut a, ETH_TYPE, 0x0800);
    let byte = |a: &mut Asm, off: i16| a.op(LDX_B, 1, 8, off, 0);
    byte(&mut a, IP);
    a.jump(JNE_K, 1, 0, 0x45, refuse);
    a.op(LDX_H, 1, 8, IP_FRAG, 0);
    a.jump(JSET_K, 1, 0, wire16(0xbfff), refuse);
    byte(&mut a, IP_TTL);
    a.jump(JEQ_K, 1, 0, 0, refuse);
    byte(&mut a, IP_PROTO);
    a.jump(JNE_K, 1, 0, 6, refuse);
    byte(&mut a, FLAGS);
    a.op(AND_K, 1, 0, 0, 0x17); // ACK | RST | SYN | FIN
    a.jump(JNE_K, 1, 0, 0x10, refuse);
    // r1 = total length; within the frame, and only padding after it.
    a.op(LDX_H, 1, 8, IP_LEN, 0);
    a.op(TO_BE, 1, 0, 0, 16);
    a.op(MOV_X, 2, 1, 0, 0);
    a.op(ADD_K, 2, 0, 0, ETH_HLEN as i32);
    a.jump(JGT_X, 2, 7, 0, refuse);
    a.jump(JLE_X, 7, 2, 0, len_ok);
    a.jump(JGT_K, 7, 0, 60, refuse);
    a.label(len_ok);
    // r2 = IP and TCP headers; the payload's length kept on the stack.
    a.op(LDX_B, 2, 8, DOFF, 0);
    a.op(RSH_K, 2, 0, 0, 4);
    a.jump(JLT_K, 2, 0, 5, refuse);
    a.op(LSH_K, 2, 0, 0, 2);
    a.op(ADD_K, 2, 0, 0, 20);
    a.jump(JGT_X, 2, 1, 0, refuse);
    a.op(SUB_X, 1, 2, 0, 0);
    a.op(STX_DW, 10, 1, K_PAYLOAD, 0);

    // An allowed connection.
    for (i, off) in [IP_SRC, IP_DST, SPORT].into_iter().enumerate() {
        a.op(LDX_W, 1, 8, off, 0);
        a.op(STX_W, 10, 1, K_CONN + 4 * i as i16, 0);
    }
    a.ld_map(1, conns);
    a.op(MOV_X, 2, 10, 0, 0);
    a.op(ADD_K, 2, 0, 0, K_CONN.into());
    call(&mut a, BPF_FUNC_MAP_LOOKUP_ELEM);
    a.jump(JEQ_K, 0, 0, 0, refuse);
    a.op(MOV_X, 6, 0, 0, 0);

    // The bucket: r1 tokens, refilled for the time since the last frame (a
    // clock behind the last one, read on another CPU, refills nothing).
    call(&mut a, BPF_FUNC_KTIME_GET_NS);
    a.op(LDX_DW, 1, 9, S_TOKENS, 0);
    a.op(LDX_DW, 2, 9, S_LAST, 0);
    a.op(MOV_X, 3, 0, 0, 0);
    a.op(SUB_X, 3, 2, 0, 0);
    a.jump(JSLE_K, 3, 0, 0, have);
    a.op(STX_DW, 9, 0, S_LAST, 0);
    a.ld_imm64(4, fill_ns);
    a.jump(JGE_X, 3, 4, 0, full);
    a.ld_imm64(4, rate.bytes_per_sec);
    a.op(MUL_X, 3, 4, 0, 0);
    a.op(ADD_X, 1, 3, 0, 0);
    a.ld_imm64(4, cap);
    a.jump(JLE_X, 1, 4, 0, have);
    a.label(full);
    a.ld_imm64(1, cap);
    a.label(have);
    a.op(STX_DW, 9, 1, S_TOKENS, 0);
    a.op(MOV_X, 2, 7, 0, 0);
    a.op(MUL_K, 2, 0, 0, NANO as i32);
    a.jump(JGT_X, 2, 1, 0, over);
    a.op(SUB_X, 1, 2, 0, 0);
    a.op(STX_DW, 9, 1, S_TOKENS, 0);

    // The record: r1 = the end of this frame's data.
    a.op(LDX_W, 1, 8, SEQ, 0);
    a.op(TO_BE, 1, 0, 0, 32);
    a.op(LDX_DW, 2, 10, K_PAYLOAD, 0);
    a.op(ADD_X, 1, 2, 0, 0);
    a.op(LDX_B, 2, 6, C_SENT, 0);
    a.jump(JEQ_K, 2, 0, 0, store_max);
    a.op(LDX_W, 3, 6, C_SND_MAX, 0);
    a.op(MOV32_X, 4, 1, 0, 0);
    a.op(SUB32_X, 4, 3, 0, 0);
    a.jump(JSLE32_K, 4, 0, 0, recorded);
    a.label(store_max);
    a.op(STX_W, 6, 1, C_SND_MAX, 0);
    a.label(recorded);
    a.op(LDX_W, 1, 8, ACK, 0);
    a.op(TO_BE, 1, 0, 0, 32);
    a.op(STX_W, 6, 1, C_ACK, 0);
    for off in [0, 2, 4] {
        a.op(LDX_H, 1, 8, off, 0);
        a.op(STX_H, 6, 1, C_NEXT_HOP + off, 0);
    }
    a.op(ST_B, 6, 0, C_SENT, 1);
    a.op(MOV_K, 1, 0, 0, 1);
    a.op(ATOMIC_DW, 9, 1, S_PASSED, 0);
    a.op(ATOMIC_DW, 9, 7, S_PASSED_BYTES, 0);
    a.op(MOV_K, 0, 0, 0, TCX_PASS);
    a.op(EXIT, 0, 0, 0, 0);

    a.label(over);
    a.op(MOV_K, 1, 0, 0, 1);
    a.op(ATOMIC_DW, 9, 1, S_OVER_RATE, 0);
    a.jump(JA, 0, 0, 0, drop);
    a.label(refuse);
    a.op(MOV_K, 1, 0, 0, 1);
    a.op(ATOMIC_DW, 9, 1, S_REFUSED, 0);
    a.label(drop);
    a.op(MOV_K, 0, 0, 0, TCX_DROP);
    a.op(EXIT, 0, 0, 0, 0);
    a.finish()
}

/// The ingress program: nothing arriving reaches the application.
fn drop_program() -> Vec<u64> {
    vec![insn(MOV_K, 0, 0, 0, TCX_DROP), insn(EXIT, 0, 0, 0, 0)]
}

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_MACVLAN_MODE: u16 = 1;
const MACVLAN_MODE_PRIVATE: u32 = 1;

/// An rtnetlink link request: a header, an `ifinfomsg`, attributes.
struct Request(Vec<u8>);

impl Request {
    /// A request of type `ty` for interface `index` (0: by name), setting
    /// `up`'s flags (`IFF_UP` or 0) and changing only those.
    fn link(ty: u16, flags: u16, index: u32, up: u32) -> Request {
        let mut b = Vec::with_capacity(128);
        b.extend(0u32.to_ne_bytes()); // its length, set when sent
        b.extend(ty.to_ne_bytes());
        b.extend((NLM_F_REQUEST | NLM_F_ACK | flags).to_ne_bytes());
        b.extend([0u8; 8]); // sequence number, port id
        b.extend([libc::AF_UNSPEC as u8, 0, 0, 0]); // family, pad, type
        b.extend(index.to_ne_bytes());
        b.extend(up.to_ne_bytes());
        b.extend(up.to_ne_bytes()); // ifi_change
        Request(b)
    }

    fn attr(&mut self, ty: u16, data: &[u8]) {
        self.0.extend(((4 + data.len()) as u16).to_ne_bytes());
        self.0.extend(ty.to_ne_bytes());
        self.0.extend(data);
        self.0.resize(self.0.len().next_multiple_of(4), 0);
    }

    fn nest(&mut self, ty: u16, inner: impl FnOnce(&mut Request)) {
        let at = self.0.len();
        self.attr(ty | NLA_F_NESTED, &[]);
        inner(self);
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }
}

/// Sends `req` to rtnetlink and waits (up to 5 seconds) for its
/// acknowledgment (the kernel's error as it is: callers say which step).
fn rtnl(mut req: Request) -> io::Result<()> {
    let len = req.0.len() as u32;
    req.0[..4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: plain system call, no pointers.
    let fd = sys::owned(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    })?;
    let timeout = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    sys::setsockopt(
        fd.as_raw_fd(),
        libc::SOL_SOCKET,
        libc::SO_RCVTIMEO,
        &timeout,
    )?;
    // SAFETY: sends from a live buffer of the length given; an unconnected
    // netlink socket sends to the kernel.
    let n = unsafe { libc::send(fd.as_raw_fd(), req.0.as_ptr().cast(), req.0.len(), 0) };
    sys::cvt(n as i32)?;
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: receives into a live buffer of the length given.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let mut msg = &buf[..sys::cvt(n as i32)? as usize];
        while msg.len() >= 20 {
            let len = u32::from_ne_bytes(msg[..4].try_into().expect("4 bytes")) as usize;
            let ty = u16::from_ne_bytes(msg[4..6].try_into().expect("2 bytes"));
            if ty == NLMSG_ERROR {
                return match i32::from_ne_bytes(msg[16..20].try_into().expect("4 bytes")) {
                    0 => Ok(()),
                    e => Err(io::Error::from_raw_os_error(-e)),
                };
            }
            msg = &msg[len.next_multiple_of(4).clamp(16, msg.len())..];
        }
    }
}

/// A macvtap this process created, deleted on drop.
#[derive(Debug)]
struct Macvtap {
    ifindex: u32,
}

impl Macvtap {
    /// Creates the macvtap `name` (private mode, down) on interface `lower`.
    fn create(lower: libc::c_int, name: &str) -> io::Result<Macvtap> {
        let mut req = Request::link(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 0, 0);
        req.attr(IFLA_IFNAME, CString::new(name)?.as_bytes_with_nul());
        req.attr(IFLA_LINK, &(lower as u32).to_ne_bytes());
        req.nest(IFLA_LINKINFO, |r| {
            r.attr(IFLA_INFO_KIND, b"macvtap");
            r.nest(IFLA_INFO_DATA, |r| {
                r.attr(IFLA_MACVLAN_MODE, &MACVLAN_MODE_PRIVATE.to_ne_bytes())
            });
        });
        rtnl(req).map_err(context(format!("creating macvtap {name}")))?;
        let ifindex = sys::if_index(name).map_err(context(format!("index of {name}")))?;
        Ok(Macvtap {
            ifindex: ifindex as u32,
        })
    }
}

impl Drop for Macvtap {
    fn drop(&mut self) {
        // Fails only if it is gone already.
        let _ = delete_link(self.ifindex);
    }
}

fn delete_link(ifindex: u32) -> io::Result<()> {
    rtnl(Request::link(RTM_DELLINK, 0, ifindex, 0))
}

/// Opens the character device of macvtap `name` (index `ifindex`) for plain
/// frames: a node made for the occasion (its number from sysfs) in `/dev`,
/// where device nodes work (`/tmp` and `/run` are often `nodev`), and
/// unlinked at once.
fn open_tap(name: &str, ifindex: u32) -> io::Result<OwnedFd> {
    let dev = format!("/sys/class/net/{name}/macvtap/tap{ifindex}/dev");
    let number = fs::read_to_string(&dev).map_err(context(format!("reading {dev}")))?;
    let (major, minor) = number
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{dev}: {number:?}")))?;
    // SAFETY: plain system call, no pointers.
    let pid = unsafe { libc::getpid() };
    let node = format!("/dev/.exonet-{name}-{pid}");
    // A node left by a crash between the two calls below.
    let _ = fs::remove_file(&node);
    let c = CString::new(node.as_str())?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    sys::cvt(unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(major, minor),
        )
    })
    .map_err(context(format!("making {node}")))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let fd = sys::owned(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    });
    let _ = fs::remove_file(&node);
    let fd = fd.map_err(context(format!("opening {node}")))?;
    // Without IFF_VNET_HDR (on by default) a write is one plain frame.
    set_tap_flags(fd.as_fd(), libc::IFF_TAP | libc::IFF_NO_PI)
        .map_err(context(format!("TUNSETIFF on {name}")))?;
    Ok(fd)
}

fn set_tap_flags(fd: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: `ifreq` is plain data for which all zeroes is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_ifru.ifru_flags = flags as libc::c_short;
    sys::ioctl_ifreq(fd.as_raw_fd(), libc::TUNSETIFF as libc::c_ulong, &mut ifr)
}

/// A name for the `n`th port of process `pid`: `exod{pid}.{n}`, or where
/// that is longer than an interface name may be (15 bytes),
/// `exod{pid}-{n}` in base 36, `n` taken modulo what room is left (at
/// least 36⁵ for any pid Linux hands out). [`remove_stale`] reads the pid
/// back.
pub fn port_name(pid: u32, n: u32) -> String {
    let name = format!("{PREFIX}{pid}.{n}");
    if name.len() < libc::IFNAMSIZ {
        return name;
    }
    let pid = base36(u64::from(pid));
    let room = libc::IFNAMSIZ - 1 - PREFIX.len() - pid.len() - 1;
    let n = u64::from(n) % 36u64.pow(room as u32);
    format!("{PREFIX}{pid}-{}", base36(n))
}

fn base36(mut v: u64) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(char::from_digit((v % 36) as u32, 36).expect("a digit"));
        v /= 36;
        if v == 0 {
            return digits.iter().rev().collect();
        }
    }
}

/// The pid a [`port_name`] holds, if `name` is one.
fn port_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, n, radix) = match rest.split_once('.') {
        Some((pid, n)) => (pid, n, 10),
        None => rest.split_once('-').map(|(pid, n)| (pid, n, 36))?,
    };
    u32::from_str_radix(n, radix).ok()?;
    u32::from_str_radix(pid, radix).ok()
}

/// Deletes the macvtaps named by [`port_name`] whose process is gone (what a
/// crashed daemon left) in this network namespace; returns how many. A
/// process is taken to be alive while `/proc` has its pid, even reused by
/// another.
pub fn remove_stale() -> io::Result<usize> {
    let mut removed = 0;
    for entry in fs::read_dir("/sys/class/net").map_err(context("listing /sys/class/net"))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let Some(pid) = port_pid(&name) else {
            continue;
        };
        if !path.join("macvtap").is_dir() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let Ok(ifindex) = fs::read_to_string(path.join("ifindex")) else {
            continue; // gone meanwhile
        };
        let ifindex = ifindex.trim().parse().map_err(io::Error::other)?;
        match delete_link(ifindex) {
            Ok(()) => removed += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {} // gone meanwhile
            Err(e) => return Err(context(format!("deleting {name}"))(e)),
        }
    }
    Ok(removed)
}

/// Runs the egress check once over `frame` with the connections `allowed`
/// and the source address `mac` (an MTU of 1500, a bucket that never runs
/// short), without a device (`BPF_PROG_TEST_RUN`): returns whether it
/// passes. For tests; needs root.
pub fn test_check(mac: [u8; 6], allowed: &[DirectConn], frame: &[u8]) -> io::Result<bool> {
    let rate = Rate {
        bytes_per_sec: MAX_BYTES_PER_SEC,
        burst: MAX_BURST,
    };
    let (conns, state) = maps(rate)?;
    for &c in allowed {
        put_conn(&conns, c)?;
    }
    let prog = bpf::load(
        &check_program(conns.as_raw_fd(), state.as_raw_fd(), mac, 1514, rate),
        tc("exonet_direct", BPF_TCX_EGRESS),
    )?;
    let (verdict, _) = bpf::test_run(&prog, frame, &mut [])?;
    Ok(verdict == TCX_PASS as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::is_root;
    use std::net::Ipv4Addr;
    use std::process::Command;
    use std::time::{Duration, Instant};

    const MAC_A: [u8; 6] = [0x02, 0, 0, 0x77, 0x97, 0x01];
    const MAC_B: [u8; 6] = [0x02, 0, 0, 0x77, 0x97, 0x02];
    const SEQ0: u32 = 0xffff_fff0; // wraps within the test
    const ACK0: u32 = 0x1234_5678;

    fn conn() -> DirectConn {
        DirectConn {
            local: SocketAddrV4::new(Ipv4Addr::new(10, 77, 97, 1), 40000),
            remote: SocketAddrV4::new(Ipv4Addr::new(10, 77, 97, 2), 5001),
        }
    }

    /// A TCP/IPv4 frame, field by field (the checksums are left 0: the check
    /// does not read them).
    #[derive(Clone)]
    struct Frame {
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        ethertype: u16,
        vlan: bool,
        ip_opts: usize,
        frag: u16,
        ttl: u8,
        proto: u8,
        c: DirectConn,
        seq: u32,
        ack: u32,
        flags: u8,
        tcp_opts: usize,
        doff: Option<u8>,
        payload: usize,
        /// Bytes after the datagram.
        extra: usize,
        /// Bytes cut off the end.
        cut: usize,
    }

    impl Frame {
        fn good() -> Frame {
            Frame {
                src_mac: MAC_A,
                dst_mac: MAC_B,
                ethertype: 0x0800,
                vlan: false,
                ip_opts: 0,
                frag: 0,
                ttl: 64,
                proto: 6,
                c: conn(),
                seq: SEQ0,
                ack: ACK0,
                flags: 0x10,
                tcp_opts: 0,
                doff: None,
                payload: 10,
                extra: 0,
                cut: 0,
            }
        }

        fn bytes(&self) -> Vec<u8> {
            let (ip_len, tcp_len) = (20 + self.ip_opts, 20 + self.tcp_opts);
            let mut f = Vec::new();
            f.extend(self.dst_mac);
            f.extend(self.src_mac);
            if self.vlan {
                f.extend([0x81, 0x00, 0x00, 0x05]);
            }
            f.extend(self.ethertype.to_be_bytes());
            f.push(0x40 | (ip_len / 4) as u8);
            f.push(0);
            f.extend(((ip_len + tcp_len + self.payload) as u16).to_be_bytes());
            f.extend([0, 0]);
            f.extend(self.frag.to_be_bytes());
            f.extend([self.ttl, self.proto, 0, 0]);
            f.extend(self.c.local.ip().octets());
            f.extend(self.c.remote.ip().octets());
            f.extend(vec![1; self.ip_opts]); // NOPs
            f.extend(self.c.local.port().to_be_bytes());
            f.extend(self.c.remote.port().to_be_bytes());
            f.extend(self.seq.to_be_bytes());
            f.extend(self.ack.to_be_bytes());
            f.push(self.doff.unwrap_or((tcp_len / 4) as u8) << 4);
            f.push(self.flags);
            f.extend([0xff, 0xff, 0, 0, 0, 0]);
            f.extend(vec![1; self.tcp_opts]);
            f.extend(vec![0xab; self.payload]);
            f.extend(vec![0xee; self.extra]);
            f.truncate(f.len() - self.cut);
            f
        }
    }

    #[test]
    fn the_check_passes_only_the_frames_of_the_template() {
        if !is_root() {
            println!("skipped: needs root");
            return;
        }
        let good = Frame::good();
        let other = DirectConn {
            remote: SocketAddrV4::new(Ipv4Addr::new(10, 77, 97, 2), 5002),
            ..conn()
        };
        let with = |f: &dyn Fn(&mut Frame)| {
            let mut g = good.clone();
            f(&mut g);
            g
        };
        let cases: Vec<(&str, Frame, bool)> = vec![
            ("good", good.clone(), true),
            ("DF", with(&|f| f.frag = 0x4000), true),
            ("PSH", with(&|f| f.flags = 0x18), true),
            ("TCP options", with(&|f| f.tcp_opts = 12), true),
            ("no payload", with(&|f| f.payload = 0), true),
            (
                "Ethernet padding",
                with(&|f| (f.payload, f.extra) = (0, 6)),
                true,
            ),
            ("largest frame", with(&|f| f.payload = 1460), true),
            ("source MAC", with(&|f| f.src_mac[5] = 3), false),
            ("VLAN", with(&|f| f.vlan = true), false),
            ("IPv6", with(&|f| f.ethertype = 0x86dd), false),
            ("IP options", with(&|f| f.ip_opts = 4), false),
            ("MF", with(&|f| f.frag = 0x2000), false),
            ("offset", with(&|f| f.frag = 0x0001), false),
            ("reserved bit", with(&|f| f.frag = 0x8000), false),
            ("UDP", with(&|f| f.proto = 17), false),
            ("TTL 0", with(&|f| f.ttl = 0), false),
            ("SYN", with(&|f| f.flags = 0x12), false),
            ("FIN", with(&|f| f.flags = 0x11), false),
            ("RST", with(&|f| f.flags = 0x14), false),
            ("no ACK", with(&|f| f.flags = 0x08), false),
            ("data offset 4", with(&|f| f.doff = Some(4)), false),
            (
                "data offset past the datagram",
                with(&|f| f.doff = Some(9)),
                false,
            ),
            ("tuple not allowed", with(&|f| f.c = other), false),
            (
                "ports swapped",
                with(&|f| {
                    let (l, r) = (f.c.local, f.c.remote);
                    f.c.local.set_port(r.port());
                    f.c.remote.set_port(l.port());
                }),
                false,
            ),
            (
                "the other way",
                with(&|f| (f.c.local, f.c.remote) = (f.c.remote, f.c.local)),
                false,
            ),
            ("truncated", with(&|f| f.cut = 1), false),
            (
                "shorter than the headers",
                with(&|f| (f.payload, f.cut) = (0, 1)),
                false,
            ),
            ("oversize", with(&|f| f.payload = 1461), false),
            (
                "garbage after the datagram",
                with(&|f| (f.payload, f.extra) = (0, 7)),
                false,
            ),
            (
                "garbage after a long datagram",
                with(&|f| f.extra = 1),
                false,
            ),
        ];
        for (what, frame, pass) in cases {
            let got = test_check(MAC_A, &[conn()], &frame.bytes()).unwrap();
            assert_eq!(got, pass, "{what}");
        }
        assert!(!test_check(MAC_A, &[], &good.bytes()).unwrap());
    }

    #[test]
    fn port_names_fit_and_give_their_pid_back() {
        for (pid, n) in [
            (1, 0),
            (4_194_304, 999),
            (4_194_304, 1000),
            (0x3fff_ffff, 7),
            (u32::MAX, u32::MAX),
        ] {
            let name = port_name(pid, n);
            assert!(name.len() <= 15, "{name}");
            assert_eq!(port_pid(&name), Some(pid), "{name}");
        }
        assert_eq!(port_name(4321, 5), "exod4321.5");
        assert_eq!(port_pid("exodus"), None);
        assert_eq!(port_pid("eth0"), None);
    }

    #[test]
    fn a_bad_rate_or_a_missing_interface_is_refused_up_front() {
        let rate = Rate {
            bytes_per_sec: 1_000_000,
            burst: 100_000,
        };
        let e = DirectPort::create("exonet-none0", "exod1.1", MAC_A, rate).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("exonet-none0"), "{e}");
        let small = Rate { burst: 100, ..rate };
        let e = DirectPort::create("lo", "exod1.1", MAC_A, small).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    /// Network namespaces, deleted on drop (with their interfaces).
    struct Namespaces(Vec<String>);

    impl Namespaces {
        fn new(names: &[&str]) -> Namespaces {
            let mut ns = Namespaces(Vec::new());
            for n in names {
                ip(&["netns", "add", n]);
                ns.0.push(n.to_string());
                // Quiet: no IPv6 of Linux's own on the links.
                in_netns(n, || {
                    for c in ["all", "default"] {
                        let path = format!("/proc/sys/net/ipv6/conf/{c}/disable_ipv6");
                        let _ = fs::write(path, "1");
                    }
                });
            }
            ns
        }
    }

    impl Drop for Namespaces {
        fn drop(&mut self) {
            for n in &self.0 {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
        }
    }

    fn ip(args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `f` on a thread of its own in network namespace `ns`, with a
    /// sysfs of that namespace (as `ip netns exec` mounts it), so that the
    /// test's own thread never changes namespace.
    fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            let t = s.spawn(|| {
                let file = fs::File::open(format!("/run/netns/{ns}")).unwrap();
                let cstr = |s: &str| CString::new(s).unwrap();
                let (none, root, sys, sysfs) =
                    (cstr("none"), cstr("/"), cstr("/sys"), cstr("sysfs"));
                // SAFETY: plain system calls on a live descriptor and valid
                // NUL-terminated strings; they change only this thread's
                // namespaces (CLONE_NEWNS unshares its file system state).
                unsafe {
                    sys::cvt(libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET)).unwrap();
                    sys::cvt(libc::unshare(libc::CLONE_NEWNS)).unwrap();
                    sys::cvt(libc::mount(
                        none.as_ptr(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_SLAVE | libc::MS_REC,
                        std::ptr::null(),
                    ))
                    .unwrap();
                    sys::cvt(libc::umount2(sys.as_ptr(), libc::MNT_DETACH)).unwrap();
                    sys::cvt(libc::mount(
                        sysfs.as_ptr(),
                        sys.as_ptr(),
                        sysfs.as_ptr(),
                        0,
                        std::ptr::null(),
                    ))
                    .unwrap();
                }
                f()
            });
            t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// A non-blocking AF_PACKET socket on `ifname` (in this thread's namespace).
    fn packet_socket(ifname: &str) -> OwnedFd {
        let all = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain system call, no pointers.
        let fd = sys::owned(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                all.into(),
            )
        })
        .unwrap();
        // SAFETY: `sockaddr_ll` is plain data; all zeroes is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = all;
        sll.sll_ifindex = sys::if_index(ifname).unwrap();
        // SAFETY: passes a live `sockaddr_ll` and its size.
        sys::cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })
        .unwrap();
        fd
    }

    fn write(fd: BorrowedFd<'_>, frame: &[u8]) -> io::Result<usize> {
        // SAFETY: writes from a live buffer of the length given.
        let n = unsafe { libc::write(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        sys::cvt(n as i32).map(|n| n as usize)
    }

    fn read(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        // SAFETY: reads into a live buffer of the length given.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        buf.truncate(sys::cvt(n as i32)? as usize);
        Ok(buf)
    }

    /// The frames `fd` receives until `done` says enough or `limit` passes,
    /// and for `linger` after that (to see what should not come).
    fn capture(
        fd: BorrowedFd<'_>,
        limit: Duration,
        linger: Duration,
        done: impl Fn(&[Vec<u8>]) -> bool,
    ) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let mut end = Instant::now() + limit;
        let mut lingering = false;
        while Instant::now() < end {
            match read(fd) {
                Ok(f) => got.push(f),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("capture: {e}"),
            }
            if !lingering && done(&got) {
                (end, lingering) = (Instant::now() + linger, true);
            }
        }
        got
    }

    #[test]
    fn a_port_sends_what_passes_and_nothing_else() {
        if !is_root() {
            println!("skipped: needs root");
            return;
        }
        let pid = std::process::id();
        let (a, b) = (format!("xdt{pid}a"), format!("xdt{pid}b"));
        let _ns = Namespaces::new(&[&a, &b]);
        let mac = |m: [u8; 6]| m.map(|b| format!("{b:02x}")).join(":");
        ip(&[
            "link",
            "add",
            &a,
            "address",
            &mac(MAC_A),
            "netns",
            &a,
            "type",
            "veth",
            "peer",
            "name",
            &b,
            "address",
            &mac(MAC_B),
            "netns",
            &b,
        ]);
        ip(&["-n", &a, "addr", "add", "10.77.97.1/24", "dev", &a]);
        ip(&["-n", &b, "addr", "add", "10.77.97.2/24", "dev", &b]);
        ip(&["-n", &a, "link", "set", &a, "up"]);
        ip(&["-n", &b, "link", "set", &b, "up"]);
        let peer = in_netns(&b, || packet_socket(&b));

        let good = Frame::good();
        let big = Frame {
            seq: SEQ0.wrapping_add(10),
            payload: 1460,
            ..good.clone()
        };
        let big2 = Frame {
            seq: SEQ0.wrapping_add(1470),
            ..big.clone()
        };
        let retx = Frame {
            ack: ACK0 + 100,
            ..good.clone()
        };
        let not_allowed = Frame {
            c: DirectConn {
                local: SocketAddrV4::new(Ipv4Addr::new(10, 77, 97, 1), 40001),
                ..conn()
            },
            ..good.clone()
        };
        let syn = Frame {
            flags: 0x02,
            payload: 0,
            ..good.clone()
        };
        let name = port_name(pid, 1);
        in_netns(&a, || {
            // 3000 bytes, refilled at 100 per second: the second big frame
            // finds the bucket short.
            let rate = Rate {
                bytes_per_sec: 100,
                burst: 3000,
            };
            let port = DirectPort::create(&a, &name, MAC_A, rate).unwrap();
            assert_eq!(port.name(), name);
            let fd = port.fd();
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(port.stats(), DirectStats::default(), "Linux sent nothing");
            port.allow(conn()).unwrap();
            assert_eq!(port.sent(conn()).unwrap(), None);

            write(fd, &good.bytes()).unwrap();
            write(fd, &not_allowed.bytes()).unwrap();
            write(fd, &syn.bytes()).unwrap();
            // The application turns the virtio-net header back on and asks
            // for a checksum written over the destination port.
            set_tap_flags(fd, libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR).unwrap();
            let mut vnet = vec![1, 0, 0, 0, 0, 0];
            vnet.extend(36u16.to_le_bytes()); // csum_start
            vnet.extend(0u16.to_le_bytes()); // csum_offset
            vnet.extend(good.bytes());
            write(fd, &vnet).unwrap();
            set_tap_flags(fd, libc::IFF_TAP | libc::IFF_NO_PI).unwrap();
            write(fd, &big.bytes()).unwrap();
            write(fd, &big2.bytes()).unwrap();
            write(fd, &retx.bytes()).unwrap();

            let expected = [good.bytes(), big.bytes(), retx.bytes()];
            let ipv4 = |f: &Vec<u8>| f.get(12..14) == Some(&[8, 0][..]);
            let got = capture(
                peer.as_fd(),
                Duration::from_secs(2),
                Duration::from_millis(200),
                |got| got.iter().filter(|f| ipv4(f)).count() >= 3,
            );
            let got: Vec<_> = got.into_iter().filter(ipv4).collect();
            assert!(got == expected, "{} IPv4 frames arrived", got.len());
            assert_eq!(
                port.stats(),
                DirectStats {
                    passed: 3,
                    passed_bytes: 64 + 1514 + 64,
                    refused: 3,
                    over_rate: 1,
                }
            );
            let sent = DirectSent {
                snd_max: SEQ0.wrapping_add(1470),
                ack: ACK0 + 100,
                next_hop: MAC_B,
            };
            assert_eq!(port.sent(conn()).unwrap(), Some(sent));
            assert_eq!(port.revoke(conn()).unwrap(), Some(sent));
            assert_eq!(port.sent(conn()).unwrap(), None);
            assert_eq!(port.revoke(conn()).unwrap(), None);
            write(fd, &retx.bytes()).unwrap();
            assert_eq!(port.stats().refused, 4, "revoked");

            // A broadcast reaches the interface, not the application.
            let lower = packet_socket(&a);
            let reaches_only_the_interface = |dst: [u8; 6], fill: u8, what: &str| {
                let mut f = dst.to_vec();
                f.extend(MAC_B);
                f.extend([0x88, 0xb5]);
                f.extend([fill; 46]);
                write(peer.as_fd(), &f).unwrap();
                let seen = capture(
                    lower.as_fd(),
                    Duration::from_secs(2),
                    Duration::from_millis(200),
                    |got| got.contains(&f),
                );
                assert!(seen.contains(&f), "{what} went out");
                let e = read(fd).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{what}: {e}");
            };
            reaches_only_the_interface([0xff; 6], 0x5a, "the broadcast");

            // The application gives its macvtap another MAC (the queue
            // takes SIOCSIFHWADDR). Frames to that MAC reach the interface
            // but not the application, and frames from it are refused: the
            // check holds the interface's own.
            const MAC_C: [u8; 6] = [0x02, 0, 0, 0, 0x77, 0xcc];
            // SAFETY: `sockaddr` and `ifreq` are plain data for which all
            // zeroes is valid.
            let (mut sa, mut ifr): (libc::sockaddr, libc::ifreq) =
                unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
            sa.sa_family = libc::ARPHRD_ETHER;
            for (d, b) in sa.sa_data.iter_mut().zip(MAC_C) {
                *d = b as libc::c_char;
            }
            ifr.ifr_ifru.ifru_hwaddr = sa;
            let set = sys::ioctl_ifreq(fd.as_raw_fd(), libc::SIOCSIFHWADDR, &mut ifr);
            assert!(set.is_ok(), "{set:?}");
            reaches_only_the_interface(MAC_C, 0x5b, "the frame to the new MAC");
            port.allow(conn()).unwrap();
            let from_c = Frame {
                src_mac: MAC_C,
                ..good.clone()
            };
            write(fd, &from_c.bytes()).unwrap();
            assert_eq!(port.stats().refused, 5, "from the new MAC");

            drop(port);
            assert!(!Path::new(&format!("/sys/class/net/{name}")).exists());
        });
    }

    #[test]
    fn stale_ports_are_removed_and_live_ones_kept() {
        if !is_root() {
            println!("skipped: needs root");
            return;
        }
        let pid = std::process::id();
        let s = format!("xdt{pid}s");
        let _ns = Namespaces::new(&[&s]);
        let lower = "xdt0";
        ip(&[
            "-n", &s, "link", "add", lower, "type", "veth", "peer", "xdt1",
        ]);
        ip(&["-n", &s, "link", "set", lower, "up"]);
        // No process has a pid this high (the kernel's limit is 2²²).
        let dead = 0x3fff_ffff;
        let stale = port_name(dead, 7);
        let not_a_macvtap = port_name(dead, 8);
        ip(&[
            "-n",
            &s,
            "link",
            "add",
            &not_a_macvtap,
            "type",
            "veth",
            "peer",
            "xdt2",
        ]);
        ip(&[
            "-n", &s, "link", "add", "link", lower, "name", "xdtother", "type", "macvtap",
        ]);
        in_netns(&s, || {
            let index = sys::if_index(lower).unwrap();
            // What a crash leaves: the device, without its owner.
            std::mem::forget(Macvtap::create(index, &stale).unwrap());
            let rate = Rate {
                bytes_per_sec: 1_000_000,
                burst: 100_000,
            };
            let live = DirectPort::create(lower, &port_name(pid, 1), MAC_A, rate).unwrap();
            let down = DirectPort::create("xdt1", "exod1.2", MAC_A, rate).unwrap_err();
            assert_eq!(down.kind(), io::ErrorKind::NetworkDown, "{down}");
            let exists = |n: &str| Path::new(&format!("/sys/class/net/{n}")).exists();
            assert!(exists(&stale));
            assert_eq!(remove_stale().unwrap(), 1);
            assert!(!exists(&stale));
            assert!(exists(live.name()) && exists(&not_a_macvtap) && exists("xdtother"));
            assert_eq!(remove_stale().unwrap(), 0);
        });
    }
}
