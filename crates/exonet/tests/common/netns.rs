//! Real peers over veth (root only): the daemon owns one end of a veth pair
//! in its own namespace, Linux the other (or, for the tap link, the daemon's
//! TAP device, Linux on its kernel side in the same namespace). Everything
//! is torn down on drop, even when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use exonet_shm::control::Client;

use super::until;

pub fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `cmd` and asserts that it succeeded.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

/// `program` in namespace `ns`.
pub fn in_ns(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

/// A daemon counter summed over the records of `kind`.
pub fn stat(sock: &Path, kind: &str, name: &str) -> u64 {
    let mut c = Client::connect(sock).unwrap();
    c.stats()
        .unwrap()
        .iter()
        .filter(|r| r.kind == kind)
        .filter_map(|r| r.get(name))
        .sum()
}

/// Two namespaces, a veth pair between them, the daemon (`procs[0]`) and its
/// applications, and a scratch directory.
pub struct Rig {
    /// The daemon's namespace.
    pub exo: String,
    /// Linux's namespace (the daemon's, with the tap link).
    pub linux: String,
    /// Linux's interface.
    pub vl: String,
    pub exo_ip: String,
    pub linux_ip: String,
    /// The daemon's control socket.
    pub sock: PathBuf,
    pub procs: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.exo, &self.linux] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Rig {
    /// The daemon on `link` (`afpacket`, `afxdp` or `tap`), its interface
    /// followed by `suffix` in the link spec, the addresses 10.77.`subnet`.1
    /// (exonet) and .2 (Linux); returns once the daemon listens and Linux's
    /// side is up. `subnet` must be unique among the tests.
    pub fn new(link: &str, suffix: &str, subnet: u8) -> Rig {
        Rig::with_daemon_args(link, suffix, subnet, &[])
    }

    /// [`Rig::new`], the daemon started with `extra` arguments too.
    pub fn with_daemon_args(link: &str, suffix: &str, subnet: u8, extra: &[&str]) -> Rig {
        let tap = link == "tap";
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("exonet-veth-{pid}-{link}{subnet}"));
        std::fs::create_dir_all(&dir).unwrap();
        let exo = format!("exo-{pid}-{link}{subnet}-x");
        let (vx, vl) = if tap {
            let t = format!("tp{subnet}{}", pid % 10000);
            (t.clone(), t)
        } else {
            (
                format!("vx{subnet}{}", pid % 10000),
                format!("vl{subnet}{}", pid % 10000),
            )
        };
        let mut rig = Rig {
            linux: if tap {
                exo.clone()
            } else {
                format!("exo-{pid}-{link}{subnet}-l")
            },
            exo,
            vl,
            exo_ip: format!("10.77.{subnet}.1"),
            linux_ip: format!("10.77.{subnet}.2"),
            sock: dir.join("control.sock"),
            procs: Vec::new(),
            dir,
        };
        ip(&["netns", "add", &rig.exo]);
        if !tap {
            ip(&["netns", "add", &rig.linux]);
            ip(&["link", "add", &vx, "type", "veth", "peer", "name", &rig.vl]);
            ip(&["link", "set", &vx, "netns", &rig.exo]);
            ip(&["link", "set", &rig.vl, "netns", &rig.linux]);
            ip(&["-n", &rig.exo, "link", "set", &vx, "up"]);
        }
        for ns in [&rig.exo, &rig.linux] {
            let _ = in_ns(ns, "sysctl")
                .args(["-qw", "net.ipv6.conf.all.disable_ipv6=1"])
                .output();
        }
        let daemon = in_ns(&rig.exo, env!("CARGO_BIN_EXE_exonet"))
            .args(["daemon", "--link", &format!("{link}:{vx}{suffix}")])
            .args(["--ip", &format!("{}/24", rig.exo_ip), "--socket"])
            .arg(&rig.sock)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        rig.procs.push(daemon);
        until("the daemon listens", || {
            if let Some(status) = rig.procs[0].try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                let _ = rig.procs[0].stderr.take().unwrap().read_to_string(&mut err);
                panic!("the daemon exited ({status}): {err}");
            }
            Client::connect(&rig.sock).is_ok()
        });
        // The daemon made the TAP device; Linux's side of it comes up now.
        let addr = format!("{}/24", rig.linux_ip);
        ip(&["-n", &rig.linux, "addr", "add", &addr, "dev", &rig.vl]);
        ip(&["-n", &rig.linux, "link", "set", &rig.vl, "up"]);
        // Linux leaves its sockets' checksums to the device (checksum
        // offload), and over a veth nobody fills them in: the afpacket link
        // finishes them (the kernel marks such frames), and so does the
        // afxdp link on a veth (it knows them by their fields); on a TAP
        // Linux computes them itself. They stay on, as a veth comes.
        rig
    }

    /// `program` in Linux's namespace.
    pub fn linux(&self, program: &str) -> Command {
        in_ns(&self.linux, program)
    }

    /// Linux's end sends each TCP segment as its own frame, checksum filled
    /// in, as a host on a wire does: the links' frame-by-frame paths, not
    /// their cutting of super-segments or finishing of checksums.
    pub fn no_offloads(&self) {
        run(self
            .linux("ethtool")
            .args(["-K", &self.vl])
            .args(["tso", "off", "gso", "off", "gro", "off", "tx", "off"]));
    }

    /// The rig's scratch directory (removed with it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The daemon's MAC address as scapy writes it.
    pub fn exo_mac(&self) -> String {
        let mac = Client::connect(&self.sock).unwrap().info().unwrap().mac;
        mac.map(|b| format!("{b:02x}")).join(":")
    }

    /// Whether the daemon still runs.
    pub fn daemon_alive(&mut self) -> bool {
        self.procs[0].try_wait().unwrap().is_none()
    }
}

/// A script of tests/scapy.
pub fn scapy_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scapy")
        .join(name)
}
