//! `linux-ebpf`: the same classification as a hand-written eBPF program in
//! C, generated per case with the case's constants, compiled with
//! `clang -O2 -mcpu=v3 -target bpf -c` into a temporary directory, loaded as
//! a `BPF_PROG_TYPE_SCHED_CLS` (tc) program with the raw bpf(2) syscall
//! ([`crate::bench::bpf`]), and timed with `BPF_PROG_TEST_RUN` and `repeat`:
//! the kernel runs the program `repeat` times on the frame and reports the
//! average duration of one run.
//!
//! SCHED_CLS because the program reads the frame directly (bounds-checked
//! pointer loads, the fastest access eBPF has; socket filters must call
//! helpers or use the legacy `LD_ABS`), `BPF_PROG_TEST_RUN` reports a
//! per-run duration for it, and it runs at the same place a tc classifier
//! would. XDP would do as well per run, but its test run with `repeat > 1`
//! installs the program in the XDP dispatcher and waits for two RCU grace
//! periods per call, which makes the thousands of calls here take minutes.
//! The program returns 0 for no match and `1 + i` for filter `i`.
//!
//! - `tcp10`, `tcp10-var`: Ethernet type, protocol and source address
//!   compared with constants, then a `switch` on the 32-bit (source port,
//!   destination port) word: the ten tuples are known when the source is
//!   generated, and clang turns the switch into a short tree of compares
//!   against immediates; a map lookup (a call, a hash) would be slower.
//! - `ports-N`: a `BPF_MAP_TYPE_HASH` from destination port to `1 + i`,
//!   filled from user space: what one writes when ports come and go while
//!   the program runs, and the only choice that scales to N = 10000.
//! - `depth-D`: straight-line compares, level by level.
//!
//! The kernel's duration is an integer number of nanoseconds, rounded down;
//! at a few nanoseconds per run that favours linux-ebpf by up to 1 ns. It
//! includes the kernel's test loop (about a nanosecond), as the in-process
//! systems' numbers include theirs.

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;
use std::process::Command;

use super::cases::{
    Case, Kind, DPORT, DST_MAC_WORD, INNER_KEY, INNER_TYPE, SPORT, SRC_IP, XL_CHANNEL, XL_TYPE,
};
use super::{verify, Fail};
use crate::bench::bpf::{self, LoadError, Program};
use crate::bench::measure::{median, Budget};

const PRELUDE: &str = r#"typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

/* struct __sk_buff up to the packet pointers (offsets 76 and 80). */
struct __sk_buff {
	u32 len, pkt_type, mark, queue_mapping, protocol, vlan_present, vlan_tci,
	    vlan_proto, priority, ingress_ifindex, ifindex, tc_index, cb[5], hash,
	    tc_classid;
	u32 data;
	u32 data_end;
};

struct bpf_map_def {
	u32 type;
	u32 key_size;
	u32 value_size;
	u32 max_entries;
	u32 map_flags;
};

#define SEC(name) __attribute__((section(name), used))

/* Loads in the frame's byte order; the constants compared with them were
 * converted by the generator, as bpf_htons()/bpf_htonl() of a constant. */
#define LD16(p) (*(const u16 *)(p))
#define LD32(p) (*(const u32 *)(p))

char _license[] SEC("license") = "GPL";
"#;

const HELPERS: &str =
    "static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;\n";

const ENTRY: &str = r#"
/* 0: no match; 1 + i: filter i. */
SEC("tc")
int classify(struct __sk_buff *ctx)
{
	const u8 *d = (const u8 *)(long)ctx->data;
	const u8 *end = (const u8 *)(long)ctx->data_end;

"#;

/// A 16-bit field's value as a native load of its big-endian bytes gives it.
fn n16(v: u16) -> u16 {
    u16::from_ne_bytes(v.to_be_bytes())
}

fn n32(v: u32) -> u32 {
    u32::from_ne_bytes(v.to_be_bytes())
}

/// A generated program and the map entries to fill in before it runs.
pub struct Source {
    pub c: String,
    pub maps: Vec<MapFill>,
}

/// The entries of one map of a generated program.
pub struct MapFill {
    pub name: String,
    /// (key, value) as the map stores them.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The C source for a case.
pub fn source(name: &str, kind: &Kind) -> Source {
    let mut c = format!("/* exonet bench dpf, case {name}: generated. */\n{PRELUDE}");
    let mut maps = Vec::new();
    let eth_ip = n16(0x0800);
    match kind {
        Kind::Tcp10 { var_header, ports } => {
            c.push_str(ENTRY);
            let _ = write!(
                c,
                "\tif (d + {} > end)\n\t\treturn 0;\n\
                 \tif (LD16(d + 12) != {eth_ip:#06x}) /* IPv4 */\n\t\treturn 0;\n\
                 \tif (d[23] != 6) /* TCP */\n\t\treturn 0;\n\
                 \tif (LD32(d + 26) != {:#010x}U) /* source {SRC_IP:#x} */\n\t\treturn 0;\n",
                if *var_header { 30 } else { 38 },
                n32(SRC_IP)
            );
            if *var_header {
                c.push_str(
                    "\tconst u8 *tcp = d + 14 + ((d[14] & 0x0f) << 2);\n\
                     \tif (tcp + 4 > end)\n\t\treturn 0;\n",
                );
            } else {
                c.push_str("\tconst u8 *tcp = d + 34;\n");
            }
            c.push_str("\tswitch (LD32(tcp)) { /* source and destination port */\n");
            for (i, &(s, d)) in ports.iter().enumerate() {
                let _ = writeln!(
                    c,
                    "\tcase {:#010x}U: /* {s} -> {d} */\n\t\treturn {};",
                    n32((s as u32) << 16 | d as u32),
                    i + 1
                );
            }
            c.push_str("\t}\n\treturn 0;\n}\n");
        }
        Kind::Ports(ports) => {
            c.push_str(HELPERS);
            let _ = write!(
                c,
                "\n/* destination port (network order) -> 1 + filter index */\n\
                 struct bpf_map_def SEC(\"maps\") ports = {{\n\
                 \t.type = 1, /* BPF_MAP_TYPE_HASH */\n\
                 \t.key_size = 2,\n\t.value_size = 4,\n\t.max_entries = {},\n}};\n",
                ports.len()
            );
            c.push_str(ENTRY);
            let _ = write!(
                c,
                "\tif (d + 24 > end)\n\t\treturn 0;\n\
                 \tif (LD16(d + 12) != {eth_ip:#06x}) /* IPv4 */\n\t\treturn 0;\n\
                 \tif (d[23] != 6) /* TCP */\n\t\treturn 0;\n\
                 \tconst u8 *tcp = d + 14 + ((d[14] & 0x0f) << 2);\n\
                 \tif (tcp + 4 > end)\n\t\treturn 0;\n\
                 \tu16 dport = LD16(tcp + 2);\n\
                 \tu32 *id = bpf_map_lookup_elem(&ports, &dport);\n\
                 \treturn id ? *id : 0;\n}}\n"
            );
            let entries = ports
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    (
                        p.to_be_bytes().to_vec(),
                        (i as u32 + 1).to_ne_bytes().to_vec(),
                    )
                })
                .collect();
            maps.push(MapFill {
                name: "ports".to_string(),
                entries,
            });
        }
        Kind::Depth(depth) => {
            c.push_str(ENTRY);
            let levels = [
                format!(
                    "\tif (d + 14 > end)\n\t\treturn 0;\n\
                     \tif (LD16(d + 12) != {eth_ip:#06x} || LD32(d) != {:#010x}U)\n\t\treturn 0;\n",
                    n32(DST_MAC_WORD)
                ),
                format!(
                    "\tconst u8 *ip = d + 14;\n\
                     \tif (ip + 16 > end)\n\t\treturn 0;\n\
                     \tif (ip[9] != 6 || LD32(ip + 12) != {:#010x}U)\n\t\treturn 0;\n",
                    n32(SRC_IP)
                ),
                format!(
                    "\tconst u8 *tcp = ip + ((ip[0] & 0x0f) << 2);\n\
                     \tif (tcp + 4 > end)\n\t\treturn 0;\n\
                     \tif (LD16(tcp) != {:#06x} || LD16(tcp + 2) != {:#06x})\n\t\treturn 0;\n",
                    n16(SPORT),
                    n16(DPORT)
                ),
                format!(
                    "\tconst u8 *xl = tcp + 20;\n\
                     \tif (xl + 4 > end)\n\t\treturn 0;\n\
                     \tif (xl[1] != {XL_TYPE:#04x} || LD16(xl + 2) != {:#06x})\n\t\treturn 0;\n",
                    n16(XL_CHANNEL)
                ),
                format!(
                    "\tconst u8 *in = xl + ((xl[0] & 0x0f) << 2);\n\
                     \tif (in + 8 > end)\n\t\treturn 0;\n\
                     \tif (in[1] != {INNER_TYPE:#04x} || LD32(in + 4) != {:#010x}U)\n\t\treturn 0;\n",
                    n32(INNER_KEY)
                ),
            ];
            for l in &levels[..*depth] {
                c.push_str(l);
            }
            c.push_str("\treturn 1;\n}\n");
        }
    }
    Source { c, maps }
}

/// Where eBPF can run here, and the scratch directory for clang.
pub struct Env {
    skip: Option<String>,
    dir: Option<TempDir>,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `clang` runs; the reason if not.
pub fn clang_missing() -> Option<String> {
    match Command::new("clang").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("clang --version failed ({})", o.status)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Some("clang not found".into()),
        Err(e) => Some(format!("cannot run clang: {e}")),
    }
}

/// Whether we are root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl Env {
    /// Checks for root and clang once.
    pub fn probe() -> Env {
        let skip = if !is_root() {
            Some("needs root (bpf(2) BPF_PROG_LOAD, BPF_PROG_TEST_RUN)".into())
        } else {
            clang_missing()
        };
        Env { skip, dir: None }
    }

    /// Compiles `c` to an object file and returns its bytes.
    pub fn compile(&mut self, name: &str, c: &str) -> Result<Vec<u8>, Fail> {
        if self.dir.is_none() {
            let dir = std::env::temp_dir().join(format!("exonet-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir)
                .map_err(|e| Fail::Error(format!("cannot create {}: {e}", dir.display())))?;
            self.dir = Some(TempDir(dir));
        }
        let dir = &self.dir.as_ref().expect("created above").0;
        let (src, obj) = (dir.join(format!("{name}.c")), dir.join(format!("{name}.o")));
        std::fs::write(&src, c).map_err(|e| Fail::Error(format!("{}: {e}", src.display())))?;
        let out = Command::new("clang")
            .args(["-O2", "-mcpu=v3", "-target", "bpf", "-c"])
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .output()
            .map_err(|e| Fail::Skip(format!("cannot run clang: {e}")))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let first: Vec<&str> = err.lines().take(3).collect();
            return Err(Fail::Skip(format!(
                "clang -target bpf failed: {}",
                first.join(" | ")
            )));
        }
        std::fs::read(&obj).map_err(|e| Fail::Error(format!("{}: {e}", obj.display())))
    }

    /// Builds, loads, checks and times the case's program.
    pub fn run(&mut self, case: &Case, budget: &Budget) -> Result<f64, Fail> {
        if let Some(why) = &self.skip {
            return Err(Fail::Skip(why.clone()));
        }
        let prog = self.load(case)?;
        prog.test_run(&case.frames[0], 1)
            .map_err(|e| Fail::Skip(format!("kernel refused BPF_PROG_TEST_RUN: {e}")))?;
        verify(case, |f| classify(&prog, f))?;
        ns_per_frame(&prog, &case.frames, budget)
            .map_err(|e| Fail::Error(format!("BPF_PROG_TEST_RUN: {e}")))
    }

    /// The time the kernel reports for a program that returns at once: the
    /// test loop's own cost per run, included in every linux-ebpf value.
    pub fn empty_program(&mut self, frames: &[Vec<u8>], budget: &Budget) -> Result<f64, Fail> {
        if let Some(why) = &self.skip {
            return Err(Fail::Skip(why.clone()));
        }
        let c = format!(
            "{PRELUDE}\nSEC(\"tc\")\nint classify(struct __sk_buff *ctx)\n{{\n\treturn 0;\n}}\n"
        );
        let obj = self.compile("empty", &c)?;
        let prog = bpf::load(&obj, "tc", bpf::PROG_TYPE_SCHED_CLS).map_err(|e| match e {
            LoadError::Object(m) => Fail::Error(format!("bad BPF object: {m}")),
            LoadError::Kernel(m) => Fail::Skip(format!("kernel refused: {m}")),
        })?;
        ns_per_frame(&prog, frames, budget)
            .map_err(|e| Fail::Skip(format!("BPF_PROG_TEST_RUN: {e}")))
    }

    /// Compiles and loads the case's program and fills its maps.
    pub fn load(&mut self, case: &Case) -> Result<Program, Fail> {
        let src = source(&case.name, &case.kind);
        let obj = self.compile(&case.name, &src.c)?;
        let prog = bpf::load(&obj, "tc", bpf::PROG_TYPE_SCHED_CLS).map_err(|e| match e {
            LoadError::Object(m) => Fail::Error(format!("bad BPF object: {m}")),
            LoadError::Kernel(m) => Fail::Skip(format!("kernel refused: {m}")),
        })?;
        for fill in &src.maps {
            let map = prog
                .map(&fill.name)
                .ok_or_else(|| Fail::Error(format!("no map {} in the object", fill.name)))?;
            for (k, v) in &fill.entries {
                map.update(k, v)
                    .map_err(|e| Fail::Skip(format!("kernel refused BPF_MAP_UPDATE_ELEM: {e}")))?;
            }
        }
        Ok(prog)
    }
}

/// The program's verdict on one frame as a filter index.
pub fn classify(prog: &Program, frame: &[u8]) -> Result<Option<usize>, String> {
    let (ret, _) = prog
        .test_run(frame, 1)
        .map_err(|e| format!("BPF_PROG_TEST_RUN: {e}"))?;
    Ok(ret.checked_sub(1).map(|i| i as usize))
}

/// The kernel's nanoseconds per run averaged over all frames: `repeat`
/// chosen so that one pass over the frames takes about a repetition's
/// share of the budget; median of the repetitions.
fn ns_per_frame(prog: &Program, frames: &[Vec<u8>], budget: &Budget) -> io::Result<f64> {
    let pass = |repeat: u32| -> io::Result<f64> {
        let mut sum = 0u64;
        for f in frames {
            sum += prog.test_run(f, repeat)?.1 as u64;
        }
        Ok(sum as f64 / frames.len() as f64)
    };
    let calibration = pass(64)?;
    let target = budget.per_rep().as_nanos() as f64;
    let repeat = (target / (frames.len() as f64 * calibration.max(1.0))).clamp(1.0, 1e7) as u32;
    pass(repeat)?; // warm-up
    let samples = (0..budget.reps)
        .map(|_| pass(repeat))
        .collect::<io::Result<Vec<f64>>>()?;
    Ok(median(samples))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::dpf::cases::Spec;

    fn specs() -> Vec<Spec> {
        let mut v = vec![
            Spec::Tcp10 { var_header: false },
            Spec::Tcp10 { var_header: true },
            Spec::Ports(10),
        ];
        v.extend((1..=5).map(Spec::Depth));
        v
    }

    /// The generated programs compile; as root they load, and classify
    /// every case frame (and truncations of it) as the filters do.
    #[test]
    fn programs_compile_load_and_agree() {
        if let Some(why) = clang_missing() {
            eprintln!("skipped: {why}");
            return;
        }
        let mut env = Env {
            skip: None,
            dir: None,
        };
        for spec in specs() {
            let case = spec.build().unwrap();
            let src = source(&case.name, &case.kind);
            let obj = env
                .compile(&case.name, &src.c)
                .unwrap_or_else(|e| panic!("{}: {e:?}\n{}", case.name, src.c));
            assert_eq!(&obj[..4], b"\x7fELF");
            if !is_root() {
                eprintln!("skipped loading {}: needs root", case.name);
                continue;
            }
            let prog = match env.load(&case) {
                Ok(p) => p,
                Err(Fail::Skip(why)) => {
                    eprintln!("skipped {}: {why}", case.name);
                    continue;
                }
                Err(e) => panic!("{}: {e:?}", case.name),
            };
            // The kernel's skb test run refuses IPv4 frames shorter than
            // Ethernet + a 20-byte IP header.
            for f in &case.frames {
                for len in [34, 37, 38, 41, 42, 45, 57, 61, 69, 77, 78, f.len()] {
                    let f = &f[..len.min(f.len())];
                    let want = case.filters.iter().position(|x| x.matches(f));
                    assert_eq!(classify(&prog, f).unwrap(), want, "{} len {len}", case.name);
                }
            }
        }
    }
}
