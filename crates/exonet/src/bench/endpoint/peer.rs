//! The other process of a two-process measurement: started by re-running
//! this binary (`exonet bench-child ...`), handed descriptors by number,
//! always reaped, and killed if it does not finish in time. Also what
//! bounds every busy-wait on either side.

use std::hint::spin_loop;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::bench::measure::Budget;
use crate::bench::report::Fail;

/// Exit status of a child that cannot run here (no AF_XDP, ...): its
/// system is reported as skipped, not as an error.
pub const EXIT_SKIP: u8 = 3;

/// How long any side waits for the other before giving up: the first
/// answer (a child that has just been exec'ed and is setting up a link) as
/// much as any later one.
pub const PATIENCE: Duration = Duration::from_secs(5);

/// How long a child may live: setting up, the measurement (about
/// `per_case`, but calibration and a slow machine may stretch it) and its
/// waits.
pub fn lifetime(budget: &Budget) -> Duration {
    PATIENCE * 2 + budget.per_case * 10
}

/// For a child's loop, now and then: an error once `deadline` (now plus
/// its `--lifetime-ms`) has passed.
pub fn check_lifetime(deadline: Instant) -> Result<(), Fail> {
    if Instant::now() > deadline {
        return Err(Fail::Error("lived too long; is the parent gone?".into()));
    }
    Ok(())
}

/// `exonet bench-child` (in network namespace `netns`), to which the caller
/// adds the role and its arguments.
pub fn command(netns: Option<&str>) -> Result<Command, Fail> {
    let mut cmd = exonet(netns)?;
    cmd.arg("bench-child");
    Ok(cmd)
}

/// This binary (in network namespace `netns`: through `ip netns exec`,
/// which execs it, so the child is still ours), to which the caller adds
/// the subcommand and its arguments.
pub fn exonet(netns: Option<&str>) -> Result<Command, Fail> {
    let exe = std::env::current_exe()
        .map_err(|e| Fail::Error(format!("cannot find the exonet binary: {e}")))?;
    Ok(match netns {
        None => Command::new(exe),
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
    })
}

/// Whether `name` is `<prefix><pid>...` for a process that is gone: what a
/// run killed before it could clean up left behind (a run's own cleanup
/// does not survive SIGKILL). A pid in use again is taken as alive.
pub fn left_by_dead_run(name: &str, prefix: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix) else {
        return false;
    };
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next();
    match digits.and_then(|d| d.parse::<u32>().ok()) {
        Some(pid) => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        None => false,
    }
}

/// A running child, killed (if still running) and reaped on drop, so that
/// no error path leaves one behind.
pub struct Peer {
    child: Child,
    what: String,
}

impl Peer {
    /// Starts `cmd` with `fds` (ours, close-on-exec) left open in the child
    /// under the same numbers, and with SIGKILL as its parent-death signal
    /// (so that it dies with us even if we are killed). Its stdout and
    /// stderr come back to us through pipes.
    pub fn spawn(mut cmd: Command, fds: &[RawFd], what: &str) -> Result<Peer, Fail> {
        let fds = fds.to_vec();
        // SAFETY: the closure runs in the child between fork and exec, and
        // only makes async-signal-safe system calls (fcntl, prctl) on
        // memory that was allocated before the fork; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &fds {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Fail::Error(format!("cannot start the {what} process: {e}")))?;
        Ok(Peer {
            child,
            what: what.to_string(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits at most `limit` for the child to exit by itself (it is killed
    /// otherwise). Its stdout if it succeeded; its stderr as the reason if
    /// not ([`EXIT_SKIP`]: a skip).
    pub fn finish(&mut self, limit: Duration) -> Result<String, Fail> {
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Ok(None) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let tail = self.stderr_tail();
                    return Err(Fail::Error(format!(
                        "the {} process did not finish within {limit:?}{tail}",
                        self.what
                    )));
                }
                Err(e) => return Err(Fail::Error(format!("waiting for {}: {e}", self.what))),
            }
        };
        self.outcome(status)
    }

    /// If the child has already exited unsuccessfully, why (to blame it
    /// rather than its partner that waited for it in vain).
    pub fn failed(&mut self) -> Option<Fail> {
        match self.child.try_wait() {
            Ok(Some(status)) => self.outcome(status).err(),
            _ => None,
        }
    }

    fn outcome(&mut self, status: ExitStatus) -> Result<String, Fail> {
        let mut out = String::new();
        if let Some(mut s) = self.child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if status.success() {
            return Ok(out);
        }
        let tail = self.stderr_tail();
        let why = format!("the {} process failed ({status}){tail}", self.what);
        Err(if status.code() == Some(EXIT_SKIP.into()) {
            Fail::Skip(why)
        } else {
            Fail::Error(why)
        })
    }

    /// The last line of the child's stderr, as ": <line>", once it exited.
    fn stderr_tail(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut s) = self.child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        match err.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => format!(": {}", line.trim()),
            None => String::new(),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Takes ownership of descriptors the parent left open for us, by number;
/// refuses numbers that are not open or are given twice.
pub fn adopt(fds: &[RawFd]) -> Result<Vec<OwnedFd>, Fail> {
    for (i, &fd) in fds.iter().enumerate() {
        // SAFETY: F_GETFD only reads the descriptor's flags.
        if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(Fail::Error(format!("descriptor {fd} is not open")));
        }
        if fds[..i].contains(&fd) {
            return Err(Fail::Error(format!("descriptor {fd} given twice")));
        }
    }
    Ok(fds
        .iter()
        // SAFETY: each number is open (checked above), was passed to this
        // process for its use alone, and is adopted once (no duplicates).
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect())
}

/// Bounds a busy-wait in time without reading the clock on every empty
/// poll (the clock costs as much as a ring handoff): it is first read after
/// 1024 of them. Every 1024 empty polls it also yields the CPU: with more
/// busy-polling processes than CPUs (ours on two CPUs, and anything else
/// running), a waiter that shares a CPU with the process it waits for
/// would otherwise spin out its whole time slice; alone on its CPU, the
/// yield returns at once.
pub struct Patience {
    spins: u32,
    since: Option<Instant>,
    limit: Duration,
}

impl Patience {
    pub fn new(limit: Duration) -> Patience {
        Patience {
            spins: 0,
            since: None,
            limit,
        }
    }

    /// One more empty poll; false once `limit` has passed since the wait
    /// began (or since the last [`reset`](Self::reset)).
    pub fn wait(&mut self) -> bool {
        self.spins = self.spins.wrapping_add(1);
        if self.spins.is_multiple_of(1024) {
            std::thread::yield_now();
            let since = *self.since.get_or_insert_with(Instant::now);
            if since.elapsed() > self.limit {
                return false;
            }
        }
        spin_loop();
        true
    }

    /// [`wait`](Self::wait), with running out of patience an error that
    /// says what we were `doing`.
    pub fn spin(&mut self, doing: &str) -> Result<(), Fail> {
        if self.wait() {
            Ok(())
        } else {
            Err(Fail::Error(format!(
                "nothing within {:?} while {doing}",
                self.limit
            )))
        }
    }

    /// There was progress: the wait starts over.
    pub fn reset(&mut self) {
        self.spins = 0;
        self.since = None;
    }
}
