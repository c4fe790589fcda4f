//! `exonet daemon` processes joined by a memwire cable, and their counters
//! as `exonet stats --json` prints them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use exonet_shm::control::Client;

use super::until;

pub fn exonet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_exonet"))
}

/// Children killed when the test ends, however it ends, and their scratch
/// directory.
pub struct Procs(pub Vec<Child>, pub PathBuf);

impl Procs {
    /// A scratch directory named for the test and this process.
    pub fn new(name: &str) -> Procs {
        let dir = std::env::temp_dir().join(format!("exonet-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Procs(Vec::new(), dir)
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// Starts `exonet daemon` on the memwire in `dir` with address `ip` (with
/// its prefix) and control socket `dir/name.sock`; returns once it listens.
pub fn daemon(dir: &Path, name: &str, ip: &str) -> Child {
    daemon_with(dir, name, ip, &[])
}

/// [`daemon`], given `extra` arguments too.
pub fn daemon_with(dir: &Path, name: &str, ip: &str, extra: &[&str]) -> Child {
    let sock = dir.join(format!("{name}.sock"));
    let c = exonet()
        .args(["daemon", "--link"])
        .arg(format!("memwire:{}", dir.join("wire").display()))
        .args(["--ip", ip, "--socket"])
        .arg(&sock)
        .args(extra)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    until("the daemon listens", || Client::connect(&sock).is_ok());
    c
}

/// `exonet stats --json`, one record a line.
pub fn stats(sock: &Path) -> Vec<String> {
    let out = exonet()
        .args(["stats", "--json", "--socket"])
        .arg(sock)
        .output()
        .unwrap();
    assert!(out.status.success(), "exonet stats failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Records of `kind`.
pub fn count(lines: &[String], kind: &str) -> usize {
    let tag = format!("\"kind\":\"{kind}\"");
    lines.iter().filter(|l| l.contains(&tag)).count()
}

/// Counter `name` summed over the records of `kind`.
pub fn field(lines: &[String], kind: &str, name: &str) -> u64 {
    let tag = format!("\"kind\":\"{kind}\"");
    lines
        .iter()
        .filter(|l| l.contains(&tag))
        .filter_map(|l| json_u64(l, name))
        .sum()
}

/// The number under `"name":` in one flat JSON object.
pub fn json_u64(line: &str, name: &str) -> Option<u64> {
    let key = format!("\"{name}\":");
    let rest = &line[line.find(&key)? + key.len()..];
    rest.split([',', '}']).next()?.trim().parse().ok()
}

/// Sends `signal` to a child of ours.
pub fn signal(c: &Child, signal: i32) {
    // SAFETY: signals our own child, which has not been waited for.
    let r = unsafe { libc::kill(c.id() as i32, signal) };
    assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
}

/// Starts `exonet udp-echo` with `args` on the daemon at `sock` and waits
/// for it to say it listens; returns it and its stdout (its counters).
pub fn udp_echo(sock: &Path, args: &[&str]) -> (Child, BufReader<ChildStdout>) {
    let args: Vec<&str> = std::iter::once("udp-echo")
        .chain(args.iter().copied())
        .collect();
    let (mut c, err) = started(sock, &args, "exonet udp-echo: listening on ");
    // Its stderr stays open, as the child's.
    c.stderr = Some(err.into_inner());
    let out = BufReader::new(c.stdout.take().unwrap());
    (c, out)
}

/// `exonet` with `args` on the daemon at `sock`, stdout and stderr piped,
/// once the first line on its stderr contains `ready`; the rest of its
/// stderr.
fn started(sock: &Path, args: &[&str], ready: &str) -> (Child, BufReader<ChildStderr>) {
    let mut c = exonet()
        .args(args)
        .arg("--socket")
        .arg(sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(c.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains(ready), "{args:?}: {line}");
    (c, err)
}

/// The counters a running `exonet udp-echo` prints on SIGUSR1.
pub fn echo_stats(echo: &Child, out: &mut BufReader<ChildStdout>) -> String {
    signal(echo, libc::SIGUSR1);
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    line
}

/// SIGTERM to a running `exonet udp-echo`, which must exit cleanly; its
/// final counters.
pub fn stop_echo(echo: Child, out: &mut BufReader<ChildStdout>) -> String {
    signal(&echo, libc::SIGTERM);
    let status = echo.wait_with_output().unwrap().status;
    assert!(status.success(), "udp-echo: {status}");
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    line
}

/// A child's output as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A server started with `args` on the daemon at `sock`, once it said
/// `ready` on stderr; its later stderr lines are collected, its stdout
/// piped.
pub fn server(sock: &Path, args: &[&str], ready: &str) -> (Child, Arc<Mutex<Vec<String>>>) {
    let (c, err) = started(sock, args, ready);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for l in err.lines().map_while(Result::ok) {
            sink.lock().unwrap().push(l);
        }
    });
    (c, lines)
}

/// Waits until a line of `log` contains `what`.
pub fn logged(log: &Mutex<Vec<String>>, what: &str) {
    until(what, || {
        log.lock().unwrap().iter().any(|l| l.contains(what))
    });
}

/// The output of the last of `procs` once it exits (bounded in time), taken
/// off the list.
pub fn finish(procs: &mut Vec<Child>) -> std::process::Output {
    let c = procs.last_mut().unwrap();
    until("the process exits", || c.try_wait().unwrap().is_some());
    procs.pop().unwrap().wait_with_output().unwrap()
}
