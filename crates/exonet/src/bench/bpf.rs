//! A minimal eBPF loader over the raw bpf(2) syscall, enough for the
//! benchmarks' hand-written programs: parse a relocatable ELF object from
//! `clang -target bpf -c`, create the maps it declares in a legacy `maps`
//! section (`struct bpf_map_def`), patch the `ld_imm64` instructions that
//! refer to them with `BPF_PSEUDO_MAP_FD`, load one program section, and run
//! it with `BPF_PROG_TEST_RUN`. No libbpf, no BTF. Every descriptor is an
//! [`OwnedFd`], closed on drop.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// `BPF_PROG_TYPE_SCHED_CLS` (a tc classifier).
pub const PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_LD_IMM64: u8 = 0x18;
const R_BPF_64_64: u32 = 1;
const EM_BPF: u16 = 247;
const SHT_SYMTAB: u32 = 2;
const SHT_REL: u32 = 9;

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    /// Explicit, so that it is zero: the kernel refuses (EINVAL) an attr
    /// with non-zero bytes past the command's last field.
    _pad: u32,
}

// No implicit padding anywhere: every byte handed to the kernel is set.
const _: () = {
    assert!(std::mem::size_of::<MapCreateAttr>() == 44);
    assert!(std::mem::size_of::<MapElemAttr>() == 32);
    assert!(std::mem::size_of::<ProgLoadAttr>() == 72);
    assert!(std::mem::size_of::<TestRunAttr>() == 80);
};

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialized `repr(C)` prefix of `union
    // bpf_attr` for `cmd`, and its size is passed along; the pointers in it
    // point into buffers that outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_from(r: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this new descriptor to us alone.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

fn name16(name: &str) -> [u8; 16] {
    let mut n = [0u8; 16];
    for (d, s) in n.iter_mut().zip(
        name.bytes()
            .filter(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .take(15),
    ) {
        *d = s;
    }
    n
}

/// A BPF map.
pub struct Map {
    pub name: String,
    pub key_size: u32,
    pub value_size: u32,
    fd: OwnedFd,
}

impl Map {
    /// `BPF_MAP_CREATE`.
    pub fn create(
        name: &str,
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    ) -> io::Result<Map> {
        let mut attr = MapCreateAttr {
            map_type,
            key_size,
            value_size,
            max_entries,
            map_flags,
            map_name: name16(name),
            ..Default::default()
        };
        let fd = fd_from(bpf(BPF_MAP_CREATE, &mut attr)?);
        Ok(Map {
            name: name.to_string(),
            key_size,
            value_size,
            fd,
        })
    }

    /// `BPF_MAP_UPDATE_ELEM` with `BPF_ANY`.
    pub fn update(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        if key.len() != self.key_size as usize || value.len() != self.value_size as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "key or value of the wrong size",
            ));
        }
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
    }
}

/// What went wrong while loading: the object itself (a bug here or in the
/// generated source) or the kernel's refusal.
#[derive(Debug)]
pub enum LoadError {
    Object(String),
    Kernel(String),
}

/// A loaded program and the maps it refers to.
pub struct Program {
    fd: OwnedFd,
    maps: Vec<Map>,
}

impl Program {
    pub fn map(&self, name: &str) -> Option<&Map> {
        self.maps.iter().find(|m| m.name == name)
    }

    /// `BPF_PROG_TEST_RUN` on `data`, `repeat` times: the program's return
    /// value and the kernel's average duration of one run in nanoseconds
    /// (an integer, rounded down by the kernel).
    pub fn test_run(&self, data: &[u8], repeat: u32) -> io::Result<(u32, u32)> {
        let mut attr = TestRunAttr {
            prog_fd: self.fd.as_raw_fd() as u32,
            data_size_in: data.len() as u32,
            data_in: data.as_ptr() as u64,
            repeat,
            ..Default::default()
        };
        bpf(BPF_PROG_TEST_RUN, &mut attr)?;
        Ok((attr.retval, attr.duration))
    }
}

struct Section<'a> {
    name: &'a str,
    kind: u32,
    link: u32,
    info: u32,
    data: &'a [u8],
}

struct Symbol<'a> {
    name: &'a str,
    shndx: u16,
    value: u64,
}

fn rd<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], String> {
    b.get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| format!("ELF truncated at {at}"))
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, String> {
    rd(b, at).map(u16::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    rd(b, at).map(u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, String> {
    rd(b, at).map(u64::from_le_bytes)
}

fn cstr(b: &[u8], at: usize) -> Result<&str, String> {
    let s = b.get(at..).ok_or("ELF string out of range")?;
    let end = s
        .iter()
        .position(|&c| c == 0)
        .ok_or("unterminated ELF string")?;
    std::str::from_utf8(&s[..end]).map_err(|_| "ELF string is not UTF-8".to_string())
}

fn sections(elf: &[u8]) -> Result<Vec<Section<'_>>, String> {
    if elf.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err("not an ELF file".into());
    }
    if elf[4] != 2 || elf[5] != 1 {
        return Err("not a little-endian 64-bit ELF file".into());
    }
    if u16_at(elf, 18)? != EM_BPF {
        return Err("not a BPF object".into());
    }
    let shoff = u64_at(elf, 0x28)? as usize;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    let shstrndx = u16_at(elf, 0x3e)? as usize;
    let mut raw = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let h = shoff + i * shentsize;
        let kind = u32_at(elf, h + 4)?;
        let (off, size) = (u64_at(elf, h + 24)? as usize, u64_at(elf, h + 32)? as usize);
        // SHT_NOBITS (.bss) has no bytes in the file.
        let data = if kind == 8 {
            &[][..]
        } else {
            elf.get(off..off + size).ok_or("ELF section out of range")?
        };
        raw.push((
            u32_at(elf, h)?,
            kind,
            u32_at(elf, h + 40)?,
            u32_at(elf, h + 44)?,
            data,
        ));
    }
    let names = raw.get(shstrndx).ok_or("no section name table")?.4;
    raw.into_iter()
        .map(|(name, kind, link, info, data)| {
            Ok(Section {
                name: cstr(names, name as usize)?,
                kind,
                link,
                info,
                data,
            })
        })
        .collect()
}

fn symbols<'a>(secs: &[Section<'a>]) -> Result<Vec<Symbol<'a>>, String> {
    let symtab = secs
        .iter()
        .find(|s| s.kind == SHT_SYMTAB)
        .ok_or("no symbol table")?;
    let strtab = secs
        .get(symtab.link as usize)
        .ok_or("no symbol string table")?
        .data;
    symtab
        .data
        .chunks_exact(24)
        .map(|e| {
            Ok(Symbol {
                name: cstr(strtab, u32_at(e, 0)? as usize)?,
                shndx: u16_at(e, 6)?,
                value: u64_at(e, 8)?,
            })
        })
        .collect()
}

/// Loads program section `section` of the ELF object `elf` as `prog_type`,
/// with the maps of its `maps` section.
pub fn load(elf: &[u8], section: &str, prog_type: u32) -> Result<Program, LoadError> {
    let obj = LoadError::Object;
    let secs = sections(elf).map_err(obj)?;
    let syms = symbols(&secs).map_err(obj)?;
    let prog_idx = secs
        .iter()
        .position(|s| s.name == section)
        .ok_or_else(|| obj(format!("no section {section}")))?;
    let license = secs
        .iter()
        .find(|s| s.name == "license")
        .map(|s| cstr(s.data, 0).unwrap_or("").to_string())
        .unwrap_or_default();

    // Maps: one `struct bpf_map_def` per symbol of the `maps` section.
    let mut maps = Vec::new();
    let mut map_of_sym = vec![None; syms.len()];
    if let Some(mi) = secs.iter().position(|s| s.name == "maps") {
        for (si, sym) in syms.iter().enumerate() {
            if sym.shndx as usize != mi || sym.name.is_empty() {
                continue;
            }
            let d = secs[mi].data;
            let at = sym.value as usize;
            let f = |k: usize| u32_at(d, at + 4 * k).map_err(obj);
            let map = Map::create(sym.name, f(0)?, f(1)?, f(2)?, f(3)?, f(4)?)
                .map_err(|e| LoadError::Kernel(format!("BPF_MAP_CREATE {}: {e}", sym.name)))?;
            map_of_sym[si] = Some(maps.len());
            maps.push(map);
        }
    }

    // Relocations of the program section: only map references.
    let mut insns = secs[prog_idx].data.to_vec();
    for rel in secs
        .iter()
        .filter(|s| s.kind == SHT_REL && s.info as usize == prog_idx)
    {
        for r in rel.data.chunks_exact(16) {
            let off = u64_at(r, 0).map_err(obj)? as usize;
            let info = u64_at(r, 8).map_err(obj)?;
            let (sym, typ) = ((info >> 32) as usize, info as u32);
            let name = syms.get(sym).map_or("?", |s| s.name);
            let map = match map_of_sym.get(sym).copied().flatten() {
                Some(m) if typ == R_BPF_64_64 => &maps[m],
                _ => {
                    return Err(obj(format!(
                        "unsupported relocation (type {typ}) against {name}"
                    )))
                }
            };
            if off & 7 != 0 || insns.get(off) != Some(&BPF_LD_IMM64) || off + 16 > insns.len() {
                return Err(obj(format!("relocation of {name} is not at an ld_imm64")));
            }
            insns[off + 1] = (insns[off + 1] & 0x0f) | (BPF_PSEUDO_MAP_FD << 4);
            insns[off + 4..off + 8].copy_from_slice(&map.fd.as_raw_fd().to_le_bytes());
        }
    }

    let license = CString::new(license).map_err(|_| obj("bad license".into()))?;
    let mut attr = ProgLoadAttr {
        prog_type,
        insn_cnt: (insns.len() / 8) as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name16(section),
        ..Default::default()
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(Program {
            fd: fd_from(fd),
            maps,
        }),
        Err(e) => {
            // Once more with the verifier's log, to say why.
            let mut log = vec![0u8; 1 << 20];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            if let Ok(fd) = bpf(BPF_PROG_LOAD, &mut attr) {
                drop(fd_from(fd));
            }
            let end = log.iter().position(|&c| c == 0).unwrap_or(0);
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(LoadError::Kernel(format!(
                "BPF_PROG_LOAD: {e}{}{}",
                if tail.is_empty() { "" } else { "; verifier: " },
                tail.join(" | ")
            )))
        }
    }
}
