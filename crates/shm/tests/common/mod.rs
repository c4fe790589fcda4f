//! Helpers shared by the tests that run a second process.

use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Lets the child inherit `fds` under the same numbers (they are
/// close-on-exec in the parent, as everything exonet-shm creates is).
pub fn inherit_fds(cmd: &mut Command, fds: Vec<RawFd>) {
    // SAFETY: the hook runs in the child between fork and exec and only
    // calls fcntl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}
