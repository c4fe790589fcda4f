//! SYN cookies answered in the XDP program, below the application: a listener
//! registered with [`AfXdp::answer_syns`](super::AfXdp::answer_syns) has its SYNs
//! answered in the driver's receive path, as Linux answers them in softirq, so a
//! handshake costs the application nothing until its ACK arrives. On a veth the
//! SYN-ACK goes back within the sender's own send call.
//!
//! The SYN-ACK is the one exonet's stack would send as a SYN cookie (RFC 4987
//! §3.6; `exonet_stack::tcp::syn_cookie_reply`), byte for byte in its ISS and
//! TSval: the cookie is a SipHash-2-4 MAC under the listener's key over the
//! 4-tuple, the peer's ISN, a 64-second tick and an MSS index; the TSval is the
//! listener's clock plus the 4-tuple's timestamp offset, with the peer's window
//! scale and SACK-permitted in its low 5 bits. The stack then makes the
//! connection from the ACK as from any cookie of its own.
//!
//! Only the common SYN is answered here: IPv4 without options or fragments,
//! correct checksums, a unicast source, exactly the 20 option bytes of MSS,
//! SACK-permitted, timestamps and window scale in Linux's order or in exonet's.
//! Anything else goes on to the socket and the stack answers it as before.
//! Timestamps are what carry the window scale and SACK through a cookie, so a
//! SYN without them is the stack's too.
//!
//! Registers while a SYN is checked: r6 the context (r1 again before the
//! steering code runs on), r8 the frame. Once a listener is found the frame is
//! answered: r7 its entry, r9 the listener's clock (nanoseconds since its epoch),
//! the BPF stack for the values the two hashes need.

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use super::*;
use crate::bpf::frame::*;
use crate::SynListener;

/// Most listeners a link answers for.
pub const MAX_SYN_LISTENERS: u32 = 64;
pub(super) const KEY_LEN: u32 = 8;
pub(super) const ENTRY_LEN: u32 = 40;
/// Offsets in an entry.
const E_K0: i16 = 0;
const E_K1: i16 = 8;
const E_EPOCH: i16 = 16;
pub(super) const E_ANSWERED: usize = 24;
const E_MSS: i16 = 32;
const E_WINDOW: i16 = 34;
const E_WSCALE: i16 = 36;
const E_SACK: i16 = 37;
const E_TTL: i16 = 38;
/// An entry's `wscale` when the SYN-ACK offers none.
const NO_WSCALE: u8 = 0xff;

/// The map key: the address and port as they are on the wire.
pub(super) fn key(ip: Ipv4Addr, port: u16) -> [u8; KEY_LEN as usize] {
    let mut k = [0u8; KEY_LEN as usize];
    k[..4].copy_from_slice(&ip.octets());
    k[4..6].copy_from_slice(&port.to_be_bytes());
    k
}

/// The map value, laid out as the program reads it (host order).
pub(super) fn entry(l: &SynListener) -> [u8; ENTRY_LEN as usize] {
    let mut e = [0u8; ENTRY_LEN as usize];
    let a = &l.answers;
    e[..16].copy_from_slice(&a.key);
    e[16..24].copy_from_slice(&a.epoch.to_ne_bytes());
    e[32..34].copy_from_slice(&a.mss.to_ne_bytes());
    e[34..36].copy_from_slice(&a.window.to_ne_bytes());
    e[36] = a.wscale.unwrap_or(NO_WSCALE);
    e[37] = u8::from(a.sack);
    e[38] = a.ttl;
    e
}

/// A SYN's length: Ethernet, then IPv4 without options, then TCP with 20
/// option bytes (offsets in [`crate::bpf::frame`]). Every multi-byte access
/// is aligned once NET_IP_ALIGN's 2 bytes are counted (strict alignment).
const FRAME: i32 = 74;

// BPF stack slots (below r10).
const S_KEY: i16 = -8;
const S_PEER_WS: i16 = -16;
const S_PEER_TSVAL: i16 = -24;
const S_M0: i16 = -32;
const S_M1: i16 = -40;
const S_M2: i16 = -48;
const S_COOKIE: i16 = -56;
const S_TSVAL: i16 = -64;
const S_INDEX: i16 = -72;
const S_TICK: i16 = -80;

/// The cookie's MSS values (`exonet_stack`'s table: a cookie carries an index).
const MSS_TABLE: [u16; 8] = [48, 256, 536, 1220, 1400, 1440, 1460, 8960];
const TICK_NANOS: u64 = 64_000_000_000;
const BPF_FUNC_REDIRECT: i32 = 23;
/// `ingress_ifindex` in `struct xdp_md`.
const XDP_MD_INGRESS_IFINDEX: i16 = 12;

/// Emits the SYN answering code; everything not answered jumps to `steer` with
/// the context in r1.
pub(super) fn assemble(a: &mut Asm, syns: RawFd, steer: Label) {
    let miss = a.new_label();
    a.op(MOV_X, 6, 1, 0, 0);
    a.op(LDX_W, 8, 6, XDP_MD_DATA, 0);
    a.op(LDX_W, 3, 6, XDP_MD_DATA_END, 0);
    a.op(MOV_X, 4, 8, 0, 0);
    a.op(ADD_K, 4, 0, 0, FRAME);
    a.jump(JGT_X, 4, 3, 0, miss);
    // A SYN alone, in a 60-byte IPv4 datagram without options or fragments,
    // from a unicast station and address.
    let field = |a: &mut Asm, code: u8, off: i16| a.op(code, 5, 8, off, 0);
    let expect = |a: &mut Asm, code: u8, off: i16, v: i32| {
        a.op(code, 5, 8, off, 0);
        a.jump(JNE_K, 5, 0, v, miss);
    };
    expect(a, LDX_H, ETH_TYPE, wire16(0x0800));
    field(a, LDX_B, ETH_SRC);
    a.jump(JSET_K, 5, 0, 1, miss);
    expect(a, LDX_B, IP, 0x45);
    expect(a, LDX_H, IP_LEN, wire16(60));
    field(a, LDX_H, IP_FRAG);
    a.jump(JSET_K, 5, 0, wire16(0x3fff), miss);
    expect(a, LDX_B, IP_PROTO, 6);
    field(a, LDX_B, IP_SRC);
    a.jump(JGE_K, 5, 0, 224, miss);
    a.jump(JEQ_K, 5, 0, 0, miss);
    expect(a, LDX_H, DOFF, wire16(0xa002));
    expect(a, LDX_H, OPT, wire16(0x0204));
    // Linux's order: MSS, SACK-permitted, timestamps, NOP, window scale.
    // exonet's: MSS, NOP, window scale, SACK-permitted, timestamps.
    let (linux, options) = (a.new_label(), a.new_label());
    field(a, LDX_H, OPT + 4);
    a.jump(JEQ_K, 5, 0, wire16(0x0402), linux);
    a.jump(JNE_K, 5, 0, wire16(0x0103), miss);
    expect(a, LDX_B, OPT + 6, 3);
    expect(a, LDX_H, OPT + 8, wire16(0x0402));
    expect(a, LDX_H, OPT + 10, wire16(0x080a));
    peer_options(a, OPT + 7, OPT + 12);
    a.jump(JA, 0, 0, 0, options);
    a.label(linux);
    expect(a, LDX_H, OPT + 6, wire16(0x080a));
    expect(a, LDX_H, OPT + 16, wire16(0x0103));
    expect(a, LDX_B, OPT + 18, 3);
    peer_options(a, OPT + 19, OPT + 8);
    a.label(options);
    // Both checksums: a corrupted SYN is the stack's to count.
    ip_sum(a);
    a.jump(JNE_K, 0, 0, 0xffff, miss);
    tcp_sum(a);
    a.jump(JNE_K, 0, 0, 0xffff, miss);
    // The listener, by the destination address and port.
    a.op(LDX_W, 5, 8, IP_DST, 0);
    a.op(STX_W, 10, 5, S_KEY, 0);
    a.op(LDX_H, 5, 8, DPORT, 0);
    a.op(STX_H, 10, 5, S_KEY + 4, 0);
    a.op(ST_H, 10, 0, S_KEY + 6, 0);
    a.ld_map(1, syns);
    a.op(MOV_X, 2, 10, 0, 0);
    a.op(ADD_K, 2, 0, 0, i32::from(S_KEY));
    a.op(CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM);
    a.jump(JEQ_K, 0, 0, 0, miss);
    a.op(MOV_X, 7, 0, 0, 0);
    answer(a);
    a.label(miss);
    a.op(MOV_X, 1, 6, 0, 0);
    a.jump(JA, 0, 0, 0, steer);
}

/// Keeps the peer's window scale (the byte at `wscale`) and TSval (the word
/// at `tsval`, as on the wire) in their stack slots.
fn peer_options(a: &mut Asm, wscale: i16, tsval: i16) {
    a.op(LDX_B, 5, 8, wscale, 0);
    a.op(STX_DW, 10, 5, S_PEER_WS, 0);
    a.op(LDX_W, 5, 8, tsval, 0);
    a.op(STX_DW, 10, 5, S_PEER_TSVAL, 0);
}

/// Swaps the frame's fields at `x` and `y`, loaded with `load` and stored
/// with `store` (their size).
fn swap(a: &mut Asm, (load, store): (u8, u8), x: i16, y: i16) {
    a.op(load, 1, 8, x, 0);
    a.op(load, 2, 8, y, 0);
    a.op(store, 8, 2, x, 0);
    a.op(store, 8, 1, y, 0);
}

/// Answers the SYN in r8 for the listener whose entry is r7 (the context in
/// r6), and redirects the SYN-ACK out of the interface.
fn answer(a: &mut Asm) {
    a.op(MOV_K, 1, 0, 0, 1);
    a.op(ATOMIC_DW, 7, 1, E_ANSWERED as i16, 0);
    a.op(CALL, 0, 0, 0, BPF_FUNC_KTIME_GET_NS);
    a.op(MOV_X, 9, 0, 0, 0);
    a.op(LDX_DW, 1, 7, E_EPOCH, 0);
    a.op(SUB_X, 9, 1, 0, 0);

    // The MSS index: the largest table entry not above min(peer's MSS, ours).
    a.op(LDX_H, 1, 8, OPT + 2, 0);
    a.op(TO_BE, 1, 0, 0, 16);
    a.op(LDX_H, 2, 7, E_MSS, 0);
    let clamped = a.new_label();
    a.jump(JLE_X, 1, 2, 0, clamped);
    a.op(MOV_X, 1, 2, 0, 0);
    a.label(clamped);
    let indexed = a.new_label();
    for (i, &m) in MSS_TABLE.iter().enumerate().skip(1).rev() {
        a.op(MOV_K, 2, 0, 0, i as i32);
        a.jump(JGE_K, 1, 0, i32::from(m), indexed);
    }
    a.op(MOV_K, 2, 0, 0, 0);
    a.label(indexed);
    a.op(STX_DW, 10, 2, S_INDEX, 0);
    a.op(MOV_X, 1, 9, 0, 0);
    a.ld_imm64(2, TICK_NANOS);
    a.op(DIV_X, 1, 2, 0, 0);
    a.op(STX_DW, 10, 1, S_TICK, 0);

    // The cookie's message, 24 bytes: our address and port, the peer's, the
    // peer's ISN, the tick (all big-endian), the MSS index, "syn".
    a.op(LDX_W, 1, 8, IP_DST, 0);
    a.op(LDX_H, 2, 8, DPORT, 0);
    a.op(LSH_K, 2, 0, 0, 32);
    a.op(OR_X, 1, 2, 0, 0);
    a.op(LDX_H, 2, 8, IP_SRC, 0);
    a.op(LSH_K, 2, 0, 0, 48);
    a.op(OR_X, 1, 2, 0, 0);
    a.op(STX_DW, 10, 1, S_M0, 0);
    a.op(LDX_H, 1, 8, IP_SRC + 2, 0);
    a.op(LDX_H, 2, 8, SPORT, 0);
    a.op(LSH_K, 2, 0, 0, 16);
    a.op(OR_X, 1, 2, 0, 0);
    a.op(LDX_W, 2, 8, SEQ, 0);
    a.op(LSH_K, 2, 0, 0, 32);
    a.op(OR_X, 1, 2, 0, 0);
    a.op(STX_DW, 10, 1, S_M1, 0);
    a.op(LDX_DW, 1, 10, S_TICK, 0);
    a.op(TO_BE, 1, 0, 0, 32);
    a.op(LDX_DW, 2, 10, S_INDEX, 0);
    a.op(LSH_K, 2, 0, 0, 32);
    a.op(OR_X, 1, 2, 0, 0);
    a.ld_imm64(2, u64::from_le_bytes([0, 0, 0, 0, 0, b's', b'y', b'n']));
    a.op(OR_X, 1, 2, 0, 0);
    a.op(STX_DW, 10, 1, S_M2, 0);
    a.ld_imm64(0, 24 << 56);
    siphash(a, &[S_M0, S_M1, S_M2]);
    // cookie = tick << 27 | index << 24 | MAC (24 bits), in 32 bits.
    a.op(AND_K, 1, 0, 0, 0xff_ffff);
    a.op(LDX_DW, 2, 10, S_TICK, 0);
    a.op(LSH_K, 2, 0, 0, 27);
    a.op(OR_X, 1, 2, 0, 0);
    a.op(LDX_DW, 2, 10, S_INDEX, 0);
    a.op(LSH_K, 2, 0, 0, 24);
    a.op(OR_X, 1, 2, 0, 0);
    a.op(MOV32_X, 1, 1, 0, 0);
    a.op(STX_DW, 10, 1, S_COOKIE, 0);

    // The timestamp offset: the high half of SipHash over our address and
    // port, the peer's, "tsc" (15 bytes).
    a.op(LDX_DW, 0, 10, S_M1, 0);
    a.op(MOV32_X, 0, 0, 0, 0);
    a.ld_imm64(1, u64::from_le_bytes([0, 0, 0, 0, b't', b's', b'c', 15]));
    a.op(OR_X, 0, 1, 0, 0);
    siphash(a, &[S_M0]);
    a.op(RSH_K, 1, 0, 0, 32);
    // TSval = the clock in ms plus the offset, its low 5 bits the peer's window
    // scale (at most 14) and SACK-permitted, rounded down.
    a.op(MOV_X, 0, 9, 0, 0);
    a.op(DIV_K, 0, 0, 0, 1_000_000);
    a.op(ADD_X, 0, 1, 0, 0);
    a.op(MOV32_X, 0, 0, 0, 0);
    a.op(LDX_DW, 2, 10, S_PEER_WS, 0);
    let small = a.new_label();
    a.jump(JLE_K, 2, 0, 14, small);
    a.op(MOV_K, 2, 0, 0, 14);
    a.label(small);
    a.op(OR_K, 2, 0, 0, 16);
    a.op(MOV_X, 3, 0, 0, 0);
    a.op(AND_K, 3, 0, 0, 31);
    a.op(AND_K, 0, 0, 0, !31);
    a.op(OR_X, 0, 2, 0, 0);
    let rounded = a.new_label();
    a.jump(JLE_X, 2, 3, 0, rounded);
    a.op(SUB_K, 0, 0, 0, 32);
    a.op(MOV32_X, 0, 0, 0, 0);
    a.label(rounded);
    a.op(STX_DW, 10, 0, S_TSVAL, 0);

    // The SYN-ACK, in place: addresses and ports swapped.
    const HALF: (u8, u8) = (LDX_H, STX_H);
    for off in [0, 2, 4] {
        swap(a, HALF, off, ETH_SRC + off);
    }
    a.op(ST_H, 8, 0, IP, wire16(0x4500));
    a.op(ST_H, 8, 0, IP_ID, 0);
    a.op(ST_H, 8, 0, IP_FRAG, wire16(0x4000));
    a.op(LDX_B, 1, 7, E_TTL, 0);
    a.op(STX_B, 8, 1, IP_TTL, 0);
    a.op(ST_H, 8, 0, IP_CSUM, 0);
    swap(a, (LDX_W, STX_W), IP_SRC, IP_DST);
    swap(a, HALF, SPORT, DPORT);
    // SEG.ACK = the peer's ISN + 1; SEG.SEQ = the cookie.
    a.op(LDX_W, 1, 8, SEQ, 0);
    a.op(TO_BE, 1, 0, 0, 32);
    a.op(ADD_K, 1, 0, 0, 1);
    a.op(TO_BE, 1, 0, 0, 32);
    a.op(STX_W, 8, 1, ACK, 0);
    a.op(LDX_DW, 1, 10, S_COOKIE, 0);
    a.op(TO_BE, 1, 0, 0, 32);
    a.op(STX_W, 8, 1, SEQ, 0);
    a.op(ST_H, 8, 0, DOFF, wire16(0xa012));
    a.op(LDX_H, 1, 7, E_WINDOW, 0);
    a.op(TO_BE, 1, 0, 0, 16);
    a.op(STX_H, 8, 1, WINDOW, 0);
    a.op(ST_H, 8, 0, TCP_CSUM, 0);
    a.op(ST_H, 8, 0, URG, 0);
    // Options in exonet's order, NOPs for what the listener does not offer.
    a.op(ST_H, 8, 0, OPT, wire16(0x0204));
    a.op(LDX_H, 1, 7, E_MSS, 0);
    a.op(TO_BE, 1, 0, 0, 16);
    a.op(STX_H, 8, 1, OPT + 2, 0);
    let (no_ws, ws_done) = (a.new_label(), a.new_label());
    a.op(LDX_B, 1, 7, E_WSCALE, 0);
    a.jump(JEQ_K, 1, 0, i32::from(NO_WSCALE), no_ws);
    a.op(ST_H, 8, 0, OPT + 4, wire16(0x0103));
    a.op(MOV_K, 2, 0, 0, 3);
    a.op(STX_B, 8, 2, OPT + 6, 0);
    a.op(STX_B, 8, 1, OPT + 7, 0);
    a.jump(JA, 0, 0, 0, ws_done);
    a.label(no_ws);
    a.op(ST_W, 8, 0, OPT + 4, 0x0101_0101);
    a.label(ws_done);
    let (no_sack, sack_done) = (a.new_label(), a.new_label());
    a.op(LDX_B, 1, 7, E_SACK, 0);
    a.jump(JEQ_K, 1, 0, 0, no_sack);
    a.op(ST_H, 8, 0, OPT + 8, wire16(0x0402));
    a.jump(JA, 0, 0, 0, sack_done);
    a.label(no_sack);
    a.op(ST_H, 8, 0, OPT + 8, wire16(0x0101));
    a.label(sack_done);
    a.op(ST_H, 8, 0, OPT + 10, wire16(0x080a));
    a.op(LDX_DW, 1, 10, S_TSVAL, 0);
    a.op(TO_BE, 1, 0, 0, 32);
    a.op(STX_W, 8, 1, OPT + 12, 0);
    a.op(LDX_DW, 1, 10, S_PEER_TSVAL, 0);
    a.op(STX_W, 8, 1, OPT + 16, 0);
    ip_sum(a);
    a.op(XOR_K, 0, 0, 0, 0xffff);
    a.op(STX_H, 8, 0, IP_CSUM, 0);
    tcp_sum(a);
    a.op(XOR_K, 0, 0, 0, 0xffff);
    a.op(STX_H, 8, 0, TCP_CSUM, 0);
    // Out of the interface it came in by. A redirect rather than XDP_TX: a
    // veth passes XDP_TX frames to a peer without an XDP program of its own
    // only when something else wakes the peer, and redirected ones whenever
    // the peer polls (an XDP program or GRO on).
    a.op(LDX_W, 1, 6, XDP_MD_INGRESS_IFINDEX, 0);
    a.op(MOV_K, 2, 0, 0, 0);
    a.op(CALL, 0, 0, 0, BPF_FUNC_REDIRECT);
    a.op(EXIT, 0, 0, 0, 0);
}

/// r0 = the folded ones' complement sum of the IPv4 header (0xffff if its
/// checksum is right).
fn ip_sum(a: &mut Asm) {
    a.op(MOV_K, 0, 0, 0, 0);
    for off in (IP..TCP).step_by(4) {
        a.op(LDX_W, 5, 8, off, 0);
        a.op(ADD_X, 0, 5, 0, 0);
    }
    fold(a);
}

/// r0 = the folded ones' complement sum of the TCP segment and its pseudo
/// header (RFC 9293 §3.1).
fn tcp_sum(a: &mut Asm) {
    a.op(LDX_W, 0, 8, IP_SRC, 0);
    a.op(LDX_W, 5, 8, IP_DST, 0);
    a.op(ADD_X, 0, 5, 0, 0);
    // Zero, protocol 6, TCP length 40, as a 32-bit load would read them.
    a.op(ADD_K, 0, 0, 0, i32::from_le_bytes([0, 6, 0, 40]));
    for off in (TCP..FRAME as i16).step_by(4) {
        a.op(LDX_W, 5, 8, off, 0);
        a.op(ADD_X, 0, 5, 0, 0);
    }
    fold(a);
}

/// Folds the sum of 32-bit words in r0 to 16 bits (r5 is scratch). The sum is
/// the same in either byte order, so the words are added as loaded.
fn fold(a: &mut Asm) {
    for _ in 0..2 {
        a.op(MOV_X, 5, 0, 0, 0);
        a.op(RSH_K, 5, 0, 0, 32);
        a.op(MOV32_X, 0, 0, 0, 0);
        a.op(ADD_X, 0, 5, 0, 0);
    }
    for _ in 0..2 {
        a.op(MOV_X, 5, 0, 0, 0);
        a.op(RSH_K, 5, 0, 0, 16);
        a.op(AND_K, 0, 0, 0, 0xffff);
        a.op(ADD_X, 0, 5, 0, 0);
    }
}

/// SipHash-2-4 under the key of the entry in r7 over the 64-bit words in the
/// stack slots `words`, then the last word, already in r0 (the tail bytes and
/// the length in its top byte). The result is in r1; r0..r5 are used.
fn siphash(a: &mut Asm, words: &[i16]) {
    const V: [u8; 4] = [1, 2, 3, 4];
    a.op(STX_DW, 10, 0, S_KEY, 0);
    let init = [
        (E_K0, 0x736f_6d65_7073_6575u64),
        (E_K1, 0x646f_7261_6e64_6f6d),
        (E_K0, 0x6c79_6765_6e65_7261),
        (E_K1, 0x7465_6462_7974_6573),
    ];
    for (v, (k, c)) in V.iter().zip(init) {
        a.op(LDX_DW, *v, 7, k, 0);
        a.ld_imm64(5, c);
        a.op(XOR_X, *v, 5, 0, 0);
    }
    let compress = |a: &mut Asm| {
        a.op(XOR_X, V[3], 0, 0, 0);
        sip_round(a);
        sip_round(a);
        a.op(XOR_X, V[0], 0, 0, 0);
    };
    for &w in words {
        a.op(LDX_DW, 0, 10, w, 0);
        compress(a);
    }
    a.op(LDX_DW, 0, 10, S_KEY, 0);
    compress(a);
    a.op(XOR_K, V[2], 0, 0, 0xff);
    for _ in 0..4 {
        sip_round(a);
    }
    a.op(XOR_X, 1, 2, 0, 0);
    a.op(XOR_X, 1, 3, 0, 0);
    a.op(XOR_X, 1, 4, 0, 0);
}

fn sip_round(a: &mut Asm) {
    let (v0, v1, v2, v3) = (1, 2, 3, 4);
    let rotl = |a: &mut Asm, r: u8, n: i32| {
        a.op(MOV_X, 5, r, 0, 0);
        a.op(RSH_K, 5, 0, 0, 64 - n);
        a.op(LSH_K, r, 0, 0, n);
        a.op(OR_X, r, 5, 0, 0);
    };
    a.op(ADD_X, v0, v1, 0, 0);
    rotl(a, v1, 13);
    a.op(XOR_X, v1, v0, 0, 0);
    rotl(a, v0, 32);
    a.op(ADD_X, v2, v3, 0, 0);
    rotl(a, v3, 16);
    a.op(XOR_X, v3, v2, 0, 0);
    a.op(ADD_X, v0, v3, 0, 0);
    rotl(a, v3, 21);
    a.op(XOR_X, v3, v0, 0, 0);
    a.op(ADD_X, v2, v1, 0, 0);
    rotl(a, v1, 17);
    a.op(XOR_X, v1, v2, 0, 0);
    rotl(a, v2, 32);
}

#[cfg(test)]
mod tests {
    use super::super::test_run;
    use super::*;
    use crate::sys::is_root;
    use exonet_wire::build::tcp_frame;
    use exonet_wire::tcp::{flags, SynAnswers, TcpOption};
    use exonet_wire::{Ipv4Packet, Ipv4Repr, MacAddr, TcpPacket, TcpRepr};

    const US: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
    const PEER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
    const XDP_PASS: u32 = 2;
    const XDP_REDIRECT: u32 = 4;

    fn listener() -> SynListener {
        SynListener {
            ip: US,
            port: 80,
            answers: SynAnswers {
                key: [7; 16],
                epoch: 0,
                mss: 1460,
                window: 65535,
                wscale: Some(7),
                sack: true,
                ttl: 64,
            },
        }
    }

    /// An Ethernet frame from PEER:40000 to US:80 with these TCP options.
    fn segment(tcp_flags: u8, options: &[TcpOption]) -> Vec<u8> {
        tcp_frame(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            PEER,
            US,
            40000,
            80,
            tcp_flags,
            0x1234_5678,
            0,
            options,
            &[],
        )
    }

    fn linux_syn() -> Vec<u8> {
        segment(
            flags::SYN,
            &[
                TcpOption::Mss(1460),
                TcpOption::SackPermitted,
                TcpOption::Timestamps {
                    tsval: 0xabcd,
                    tsecr: 0,
                },
                TcpOption::NoOp,
                TcpOption::WindowScale(9),
            ],
        )
    }

    #[test]
    fn a_linux_syn_is_answered_with_a_well_formed_syn_ack() {
        if !is_root() {
            println!("skipped: needs root");
            return;
        }
        let (action, out) = test_run(&[], &[listener()], &linux_syn()).unwrap();
        assert_eq!(action, XDP_REDIRECT);
        assert_eq!(&out[..6], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(&out[6..12], &[2, 0, 0, 0, 0, 2]);
        let ip = Ipv4Packet::new_checked(&out[14..]).unwrap();
        assert!(ip.verify_checksum());
        let ip = Ipv4Repr::parse(&ip).unwrap();
        assert_eq!((ip.src, ip.dst, ip.ttl, ip.dont_frag), (US, PEER, 64, true));
        let tcp = TcpPacket::new_checked(&out[34..]).unwrap();
        let r = TcpRepr::parse(&tcp, US, PEER).unwrap();
        assert_eq!((r.src_port, r.dst_port), (80, 40000));
        assert_eq!(r.flags, flags::SYN | flags::ACK);
        assert_eq!(r.ack_number, 0x1234_5679);
        assert_eq!(r.window, 65535);
        let opts: Vec<_> = tcp.options_iter().collect::<Result<_, _>>().unwrap();
        assert_eq!(opts[0], TcpOption::Mss(1460));
        assert_eq!(opts[1], TcpOption::NoOp);
        assert_eq!(opts[2], TcpOption::WindowScale(7));
        assert_eq!(opts[3], TcpOption::SackPermitted);
        let TcpOption::Timestamps { tsval, tsecr } = opts[4] else {
            panic!("{opts:?}");
        };
        assert_eq!(tsecr, 0xabcd);
        // The peer's window scale and SACK-permitted in the low bits.
        assert_eq!(tsval & 31, 9 | 16);
    }

    #[test]
    fn anything_but_the_common_syn_to_a_listener_goes_on_untouched() {
        if !is_root() {
            println!("skipped: needs root");
            return;
        }
        let exonet_order = [
            TcpOption::Mss(1460),
            TcpOption::NoOp,
            TcpOption::WindowScale(7),
            TcpOption::SackPermitted,
            TcpOption::Timestamps { tsval: 1, tsecr: 0 },
        ];
        let answered = |f: &[u8], ls: &[SynListener]| {
            let (action, out) = test_run(&[], ls, f).unwrap();
            if action == XDP_PASS {
                assert_eq!(out, f, "a passed frame is left as it was");
            }
            action == XDP_REDIRECT
        };
        let l = [listener()];
        assert!(answered(&segment(flags::SYN, &exonet_order), &l));
        assert!(answered(&linux_syn(), &l));
        // Not a listener of ours: another port, or none at all.
        let other = SynListener {
            port: 81,
            ..listener()
        };
        assert!(!answered(&linux_syn(), &[other]));
        assert!(!answered(&linux_syn(), &[]));
        // Other flags, other options.
        assert!(!answered(
            &segment(flags::SYN | flags::ACK, &exonet_order),
            &l
        ));
        assert!(!answered(
            &segment(flags::SYN | flags::FIN, &exonet_order),
            &l
        ));
        assert!(!answered(&segment(flags::ACK, &exonet_order), &l));
        assert!(!answered(&segment(flags::SYN, &exonet_order[..3]), &l));
        let no_ts = [
            TcpOption::Mss(1460),
            TcpOption::NoOp,
            TcpOption::WindowScale(7),
            TcpOption::NoOp,
            TcpOption::NoOp,
            TcpOption::SackPermitted,
        ];
        assert!(!answered(&segment(flags::SYN, &no_ts), &l));
        // Corrupted: either checksum.
        let mut bad = linux_syn();
        bad[60] ^= 1;
        assert!(!answered(&bad, &l));
        let mut bad = linux_syn();
        bad[22] ^= 1;
        assert!(!answered(&bad, &l));
        // A fragment, a multicast source station or address.
        let mut frag = linux_syn();
        frag[20] |= 0x20;
        fix_ip_checksum(&mut frag);
        assert!(!answered(&frag, &l));
        let mut group = linux_syn();
        group[6] |= 1;
        assert!(!answered(&group, &l));
        let mut multicast = linux_syn();
        multicast[26] = 224;
        fix_ip_checksum(&mut multicast);
        assert!(!answered(&multicast, &l));
        // Too short for the SYN, or truncated in its options.
        assert!(!answered(&linux_syn()[..60], &l));
    }

    fn fix_ip_checksum(f: &mut [u8]) {
        f[24..26].fill(0);
        let c = exonet_wire::checksum::checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        assert!(Ipv4Packet::new_checked(&f[14..]).unwrap().verify_checksum());
    }
}
