//! eBPF by hand, shared by the programs the links attach (AF_XDP's XDP
//! program, the direct port's tc check): the bpf(2) system call for maps,
//! programs and links, a small assembler whose forward jumps name labels, and
//! a loader that tells the verifier's log when it refuses.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::sys;

const BPF_MAP_CREATE: libc::c_int = 0;
pub(crate) const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
pub(crate) const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
pub(crate) const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
pub(crate) const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_int = 21;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_TEST_RUN: libc::c_int = 10;
const BPF_PROG_ATTACH: libc::c_int = 8;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_LINK_UPDATE: libc::c_int = 29;
pub(crate) const BPF_MAP_TYPE_HASH: u32 = 1;
pub(crate) const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub(crate) const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
pub(crate) const BPF_FUNC_KTIME_GET_NS: i32 = 5;

/// A `union bpf_attr`, zeroed beyond the fields a command sets (the kernel insists).
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Default for Attr {
    fn default() -> Self {
        Attr([0; 128])
    }
}

impl Attr {
    fn put_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }

    fn put_u64(&mut self, off: usize, v: u64) {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    }

    fn u32_at(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().expect("4 bytes"))
    }
}

/// The bpf(2) system call.
fn bpf(cmd: libc::c_int, attr: &mut Attr) -> io::Result<libc::c_int> {
    // SAFETY: `attr` is a live, fully initialized buffer of the size passed; pointers
    // stored in it by callers point to live values for the duration of the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), attr.0.len()) };
    sys::cvt(libc::c_int::try_from(r).map_err(io::Error::other)?)
}

/// A new map of `map_type` with `entries` entries of these key and value sizes.
pub(crate) fn map_create(
    map_type: u32,
    key_len: u32,
    value_len: u32,
    entries: u32,
) -> io::Result<OwnedFd> {
    let mut attr = Attr::default();
    attr.put_u32(0, map_type);
    attr.put_u32(4, key_len);
    attr.put_u32(8, value_len);
    attr.put_u32(12, entries);
    sys::owned(bpf(BPF_MAP_CREATE, &mut attr)?)
}

/// A map element command (`BPF_MAP_LOOKUP_ELEM`, `_UPDATE_ELEM`,
/// `_DELETE_ELEM`, `_LOOKUP_AND_DELETE_ELEM`) on `map` for `key`, with the value it reads or writes.
/// The slices are the map's key and value sizes.
pub(crate) fn map_elem(
    cmd: libc::c_int,
    map: &OwnedFd,
    key: &[u8],
    value: Option<&mut [u8]>,
) -> io::Result<()> {
    let mut attr = Attr::default();
    attr.put_u32(0, map.as_raw_fd() as u32);
    attr.put_u64(8, key.as_ptr() as u64);
    if let Some(v) = value {
        attr.put_u64(16, v.as_mut_ptr() as u64);
    }
    bpf(cmd, &mut attr).map(drop)
}

/// What kind of program [`load`] loads, and as what it is named.
#[derive(Clone, Copy)]
pub(crate) struct ProgKind {
    /// `BPF_PROG_TYPE_*`.
    pub prog_type: u32,
    /// The expected attach type (`BPF_XDP`, `BPF_TCX_EGRESS`, ...).
    pub attach_type: u32,
    /// `BPF_F_*` load flags on top of strict alignment.
    pub flags: u32,
    /// The program's name in the kernel (`bpftool prog`): at most 15 bytes.
    pub name: &'static str,
}

/// Loads a program. The first try runs without a verifier log (a verbose log
/// can overflow its buffer and fail a good program with `ENOSPC`); after a refusal
/// the program is loaded again with the log, whose end says why. Strict alignment
/// makes a misaligned packet load fail here, not only where it would trap.
pub(crate) fn load(prog: &[u64], kind: ProgKind) -> io::Result<OwnedFd> {
    const BPF_F_STRICT_ALIGNMENT: u32 = 1;
    let license = c"GPL";
    let name = kind.name.as_bytes();
    let load = |log: &mut [u8]| {
        let mut attr = Attr::default();
        attr.put_u32(0, kind.prog_type);
        attr.put_u32(4, prog.len() as u32);
        attr.put_u64(8, prog.as_ptr() as u64);
        attr.put_u64(16, license.as_ptr() as u64);
        if !log.is_empty() {
            attr.put_u32(24, 1);
            attr.put_u32(28, log.len() as u32);
            attr.put_u64(32, log.as_mut_ptr() as u64);
        }
        attr.put_u32(44, BPF_F_STRICT_ALIGNMENT | kind.flags);
        attr.0[48..48 + name.len().min(15)].copy_from_slice(&name[..name.len().min(15)]);
        attr.put_u32(68, kind.attach_type);
        bpf(BPF_PROG_LOAD, &mut attr)
    };
    let e = match load(&mut []) {
        Ok(fd) => return sys::owned(fd),
        Err(e) => e,
    };
    let mut log = vec![0u8; 256 * 1024];
    // Whatever the second try returns (a truncated log is ENOSPC), the first error
    // is the one to report; should it succeed after all, the program is good.
    if let Ok(fd) = load(&mut log) {
        return sys::owned(fd);
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let msg = String::from_utf8_lossy(&log[..end]);
    Err(io::Error::new(
        e.kind(),
        format!(
            "loading the BPF program {}: {e}: {}",
            kind.name,
            msg.trim_end()
        ),
    ))
}

/// Attaches `prog` to interface `ifindex` at `attach_type` through a new BPF
/// link, which detaches it when its descriptor closes.
pub(crate) fn link_create(
    prog: &OwnedFd,
    ifindex: u32,
    attach_type: u32,
    flags: u32,
) -> io::Result<OwnedFd> {
    let mut attr = Attr::default();
    attr.put_u32(0, prog.as_raw_fd() as u32);
    attr.put_u32(4, ifindex);
    attr.put_u32(8, attach_type);
    attr.put_u32(12, flags);
    sys::owned(bpf(BPF_LINK_CREATE, &mut attr)?)
}

/// Puts `prog` in the place of the program `link` attaches, in one step:
/// nothing passes unprogrammed meanwhile.
pub(crate) fn link_update(link: &OwnedFd, prog: &OwnedFd) -> io::Result<()> {
    let mut attr = Attr::default();
    attr.put_u32(0, link.as_raw_fd() as u32);
    attr.put_u32(4, prog.as_raw_fd() as u32);
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// Attaches `prog` to interface `ifindex` at `attach_type` (a tcx hook) for
/// as long as the interface lives, whoever holds what descriptors: unlike a
/// link's, the attachment outlives the process that made it.
pub(crate) fn prog_attach(prog: &OwnedFd, ifindex: u32, attach_type: u32) -> io::Result<()> {
    let mut attr = Attr::default();
    attr.put_u32(0, ifindex);
    attr.put_u32(4, prog.as_raw_fd() as u32);
    attr.put_u32(8, attach_type);
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// Runs `prog` once over `data` without attaching it (`BPF_PROG_TEST_RUN`),
/// the packet as it leaves written to `out` unless `out` is empty: returns the
/// program's return value and the length of the packet as it left.
pub(crate) fn test_run(prog: &OwnedFd, data: &[u8], out: &mut [u8]) -> io::Result<(u32, usize)> {
    let mut attr = Attr::default();
    attr.put_u32(0, prog.as_raw_fd() as u32);
    attr.put_u32(8, data.len() as u32);
    attr.put_u64(16, data.as_ptr() as u64);
    if !out.is_empty() {
        attr.put_u32(12, out.len() as u32);
        attr.put_u64(24, out.as_mut_ptr() as u64);
    }
    attr.put_u32(32, 1);
    bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    Ok((attr.u32_at(4), attr.u32_at(12) as usize))
}

/// One eBPF instruction: opcode, registers, offset, immediate.
pub(crate) fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | u64::from(src << 4 | dst) << 8
        | u64::from(off as u16) << 16
        | u64::from(imm as u32) << 32
}

// eBPF opcodes used by the programs (class | operation | source).
pub(crate) const LDX_B: u8 = 0x71;
pub(crate) const LDX_H: u8 = 0x69;
pub(crate) const LDX_W: u8 = 0x61;
pub(crate) const LDX_DW: u8 = 0x79;
pub(crate) const STX_B: u8 = 0x73;
pub(crate) const STX_H: u8 = 0x6b;
pub(crate) const STX_W: u8 = 0x63;
pub(crate) const STX_DW: u8 = 0x7b;
pub(crate) const ST_B: u8 = 0x72;
pub(crate) const ST_H: u8 = 0x6a;
pub(crate) const ST_W: u8 = 0x62;
/// An atomic read-modify-write of a 64-bit word (`imm` 0: add).
pub(crate) const ATOMIC_DW: u8 = 0xdb;
pub(crate) const MOV_K: u8 = 0xb7;
pub(crate) const MOV_X: u8 = 0xbf;
/// A 32-bit move: keeps the low half and clears the high one.
pub(crate) const MOV32_X: u8 = 0xbc;
pub(crate) const ADD_K: u8 = 0x07;
pub(crate) const ADD_X: u8 = 0x0f;
pub(crate) const SUB_K: u8 = 0x17;
pub(crate) const SUB_X: u8 = 0x1f;
/// A 32-bit subtraction (wraps modulo 2^32, high half cleared).
pub(crate) const SUB32_X: u8 = 0x1c;
pub(crate) const MUL_K: u8 = 0x27;
pub(crate) const MUL_X: u8 = 0x2f;
pub(crate) const OR_X: u8 = 0x4f;
pub(crate) const OR_K: u8 = 0x47;
pub(crate) const AND_K: u8 = 0x57;
pub(crate) const XOR_X: u8 = 0xaf;
pub(crate) const XOR_K: u8 = 0xa7;
pub(crate) const LSH_K: u8 = 0x67;
pub(crate) const RSH_K: u8 = 0x77;
pub(crate) const DIV_K: u8 = 0x37;
pub(crate) const DIV_X: u8 = 0x3f;
/// To big-endian (`imm` 16, 32 or 64 bits; the rest cleared).
pub(crate) const TO_BE: u8 = 0xdc;
pub(crate) const LD_IMM64: u8 = 0x18;
pub(crate) const JA: u8 = 0x05;
pub(crate) const JEQ_K: u8 = 0x15;
pub(crate) const JNE_K: u8 = 0x55;
pub(crate) const JGT_K: u8 = 0x25;
pub(crate) const JGE_K: u8 = 0x35;
pub(crate) const JLT_K: u8 = 0xa5;
pub(crate) const JLE_K: u8 = 0xb5;
pub(crate) const JSET_K: u8 = 0x45;
pub(crate) const JSLT_K: u8 = 0xc5;
pub(crate) const JSLE_K: u8 = 0xd5;
pub(crate) const JGT_X: u8 = 0x2d;
pub(crate) const JGE_X: u8 = 0x3d;
pub(crate) const JLE_X: u8 = 0xbd;
/// A 32-bit compare: an address in the low half of a register against a 32-bit
/// immediate (the 64-bit one would sign-extend it).
pub(crate) const JEQ32_K: u8 = 0x16;
/// A signed 32-bit compare (`if (s32)dst <= imm`): sequence numbers.
pub(crate) const JSLE32_K: u8 = 0xd6;
pub(crate) const CALL: u8 = 0x85;
pub(crate) const EXIT: u8 = 0x95;
const BPF_PSEUDO_MAP_FD: u8 = 1;

/// A jump target, placed by [`Asm::label`].
#[derive(Clone, Copy)]
pub(crate) struct Label(usize);

/// A program under construction whose forward jumps name labels, patched at the end.
#[derive(Default)]
pub(crate) struct Asm {
    code: Vec<u64>,
    labels: Vec<usize>,
    jumps: Vec<(usize, Label)>,
}

impl Asm {
    pub(crate) fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.code.push(insn(code, dst, src, off, imm));
    }

    pub(crate) fn new_label(&mut self) -> Label {
        self.labels.push(usize::MAX);
        Label(self.labels.len() - 1)
    }

    pub(crate) fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: Label) {
        self.jumps.push((self.code.len(), to));
        self.op(code, dst, src, 0, imm);
    }

    pub(crate) fn label(&mut self, l: Label) {
        self.labels[l.0] = self.code.len();
    }

    /// `dst = imm` for a 64-bit immediate (two instruction slots).
    pub(crate) fn ld_imm64(&mut self, dst: u8, imm: u64) {
        self.op(LD_IMM64, dst, 0, 0, imm as u32 as i32);
        self.code.push(insn(0, 0, 0, 0, (imm >> 32) as u32 as i32));
    }

    /// `dst = &map` for the map whose descriptor is `fd`.
    pub(crate) fn ld_map(&mut self, dst: u8, fd: RawFd) {
        self.op(LD_IMM64, dst, BPF_PSEUDO_MAP_FD, 0, fd);
        self.code.push(0);
    }

    /// `if (data + len > data_end) goto pass;` with `data` in r2 and `data_end` in r3:
    /// the bounds check the verifier demands before any packet load below `len`.
    pub(crate) fn need(&mut self, len: i32, pass: Label) {
        self.op(MOV_X, 4, 2, 0, 0);
        self.op(ADD_K, 4, 0, 0, len);
        self.jump(JGT_X, 4, 3, 0, pass);
    }

    pub(crate) fn finish(mut self) -> Vec<u64> {
        for (at, to) in self.jumps {
            // Jump offsets count instructions from the one after the jump.
            let off = (self.labels[to.0] - at - 1) as u16;
            self.code[at] = self.code[at] & !(0xffff << 16) | u64::from(off) << 16;
        }
        self.code
    }
}

/// A 16-bit field as a load from the packet puts it in a register.
pub(crate) fn wire16(v: u16) -> i32 {
    i32::from(u16::from_ne_bytes(v.to_be_bytes()))
}

/// Offsets in a frame of Ethernet, IPv4 without options and TCP, as the
/// programs load them.
pub(crate) mod frame {
    pub(crate) const ETH_SRC: i16 = 6;
    pub(crate) const ETH_TYPE: i16 = 12;
    /// The IPv4 header: version and header length first.
    pub(crate) const IP: i16 = 14;
    pub(crate) const IP_LEN: i16 = 16;
    pub(crate) const IP_ID: i16 = 18;
    pub(crate) const IP_FRAG: i16 = 20;
    pub(crate) const IP_TTL: i16 = 22;
    pub(crate) const IP_PROTO: i16 = 23;
    pub(crate) const IP_CSUM: i16 = 24;
    pub(crate) const IP_SRC: i16 = 26;
    pub(crate) const IP_DST: i16 = 30;
    /// The TCP header: the source port first.
    pub(crate) const TCP: i16 = 34;
    pub(crate) const SPORT: i16 = 34;
    pub(crate) const DPORT: i16 = 36;
    pub(crate) const SEQ: i16 = 38;
    pub(crate) const ACK: i16 = 42;
    /// The data offset (its high 4 bits), then the flags.
    pub(crate) const DOFF: i16 = 46;
    pub(crate) const FLAGS: i16 = 47;
    pub(crate) const WINDOW: i16 = 48;
    pub(crate) const TCP_CSUM: i16 = 50;
    pub(crate) const URG: i16 = 52;
    /// The first option.
    pub(crate) const OPT: i16 = 54;
}
