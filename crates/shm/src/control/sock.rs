//! Unix `SOCK_SEQPACKET` sockets with descriptor passing (`SCM_RIGHTS`) and
//! peer credentials (`SO_PEERCRED`), which `std` does not offer.

use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 8;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is a valid (empty) address.
    let mut addr: libc::sockaddr_un = unsafe { mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // Keep the terminating NUL that the zeroed array provides.
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad socket path {}", path.display()),
        ));
    }
    for (d, &s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    let len = mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; a non-negative result is a new descriptor.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Who is at the other end of a socket, as the kernel saw it at connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// A listening `SOCK_SEQPACKET` socket bound to a path.
pub struct SeqListener {
    fd: OwnedFd,
}

impl SeqListener {
    /// Binds and listens at `path`. A socket file left by a dead listener
    /// (nobody accepts on it) is replaced; a live one is an `AddrInUse`
    /// error.
    pub fn bind(path: &Path) -> io::Result<SeqListener> {
        match SeqListener::bind_exclusive(path) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                if connect_or_remove_dead(path)?.is_some() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{} is served by a running daemon", path.display()),
                    ));
                }
                SeqListener::bind_exclusive(path)
            }
            r => r,
        }
    }

    /// Binds and listens at `path`, which must not exist (`AddrInUse` if
    /// it does). The socket is bound at a temporary name beside `path`,
    /// listens, and is then linked to `path`: a connect never finds it
    /// there yet refusing, so a refused connect always means a dead
    /// listener (see [`connect_or_remove_dead`]).
    pub fn bind_exclusive(path: &Path) -> io::Result<SeqListener> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_file_name(format!(".{:x}.{n:x}.sock", std::process::id()));
        // A name of this process's pid and counter can only have been left
        // by a dead process that had the same pid.
        let _ = std::fs::remove_file(&tmp);
        let (addr, len) = sockaddr(&tmp)?;
        let fd = socket()?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                len,
            )
        })?;
        // SAFETY: plain syscall on our descriptor.
        let linked = cvt(unsafe { libc::listen(fd.as_raw_fd(), 64) })
            .and_then(|_| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} exists", path.display()),
            )),
            Err(e) => Err(e),
            Ok(()) => Ok(SeqListener { fd }),
        }
    }

    /// Accepts one connection (blocking unless the listener is
    /// non-blocking, see [`set_nonblocking`](Self::set_nonblocking)).
    pub fn accept(&self) -> io::Result<SeqPacket> {
        // SAFETY: null address pointers are allowed; a non-negative result
        // is a new descriptor that we own.
        let fd = cvt(unsafe {
            libc::accept4(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        })?;
        Ok(SeqPacket {
            // SAFETY: fresh descriptor.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        set_nonblocking(self.fd.as_fd(), on)
    }
}

impl AsFd for SeqListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for SeqListener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Connects to the listener at `path`; `None` if there is none: no file,
/// or a file whose listener died without removing it, which is then
/// removed. Listeners bound by [`SeqListener::bind_exclusive`] never
/// refuse while they start, so a refusal means a dead one; its file is
/// removed only if it is still the one that refused.
pub fn connect_or_remove_dead(path: &Path) -> io::Result<Option<SeqPacket>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    // Only a socket is ours to remove: a connect to any other file is
    // refused too.
    let inode = |path: &Path| match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => Ok(Some(m.ino())),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    };
    let Some(ino) = inode(path)? else {
        return Ok(None);
    };
    match SeqPacket::connect(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            if inode(path)? == Some(ino) {
                match std::fs::remove_file(path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Sets or clears `O_NONBLOCK` on `fd`'s open file description.
fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: fcntl flag calls on a live descriptor.
    unsafe {
        let flags = cvt(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        cvt(libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags))?;
    }
    Ok(())
}

/// A connected `SOCK_SEQPACKET` socket: message boundaries are kept, and
/// messages may carry descriptors.
pub struct SeqPacket {
    fd: OwnedFd,
}

/// Room for [`MAX_FDS`] descriptors in a control message, aligned as
/// `cmsghdr` wants.
#[repr(C, align(8))]
struct CmsgBuf([u8; 128]);

impl SeqPacket {
    pub fn connect(path: &Path) -> io::Result<SeqPacket> {
        let (addr, len) = sockaddr(path)?;
        let fd = socket()?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        cvt(unsafe {
            libc::connect(
                fd.as_raw_fd(),
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                len,
            )
        })?;
        Ok(SeqPacket { fd })
    }

    /// A connected pair, for tests and for handing one end to a child.
    pub fn pair() -> io::Result<(SeqPacket, SeqPacket)> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        cvt(unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        })?;
        // SAFETY: both are fresh descriptors that we own.
        unsafe {
            Ok((
                SeqPacket {
                    fd: OwnedFd::from_raw_fd(fds[0]),
                },
                SeqPacket {
                    fd: OwnedFd::from_raw_fd(fds[1]),
                },
            ))
        }
    }

    /// The peer's pid, uid and gid (`SO_PEERCRED`).
    pub fn peer_cred(&self) -> io::Result<PeerCred> {
        // SAFETY: getsockopt writes at most `len` bytes into `cred`.
        let cred = unsafe {
            let mut cred: libc::ucred = mem::zeroed();
            let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
            cvt(libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                &mut cred as *mut libc::ucred as *mut libc::c_void,
                &mut len,
            ))?;
            cred
        };
        Ok(PeerCred {
            pid: cred.pid,
            uid: cred.uid,
            gid: cred.gid,
        })
    }

    /// Sends one message with `fds` attached.
    pub fn send(&self, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many descriptors",
            ));
        }
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut cmsg = CmsgBuf([0; 128]);
        // SAFETY: an all-zero msghdr is valid (no name, no control).
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let bytes = mem::size_of_val(fds) as u32;
            // SAFETY: CMSG_SPACE of at most 8 ints fits the 128-byte buffer,
            // which is aligned for cmsghdr; CMSG_FIRSTHDR then points into
            // it and CMSG_DATA has room for `bytes` bytes.
            unsafe {
                msg.msg_control = cmsg.0.as_mut_ptr() as *mut libc::c_void;
                msg.msg_controllen = libc::CMSG_SPACE(bytes) as usize;
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(bytes) as usize;
                let data = libc::CMSG_DATA(c) as *mut RawFd;
                for (i, fd) in fds.iter().enumerate() {
                    data.add(i).write_unaligned(fd.as_raw_fd());
                }
            }
        }
        loop {
            // SAFETY: `msg` points at live buffers for the call's duration.
            let r = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
            if r >= 0 {
                return if r as usize == data.len() {
                    Ok(())
                } else {
                    Err(io::Error::new(io::ErrorKind::WriteZero, "message cut"))
                };
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Sends each of `messages` as a message of its own, in order, with one
    /// system call (and one wake-up of a reader that sleeps), no descriptors.
    pub fn send_many(&self, messages: &[Vec<u8>]) -> io::Result<()> {
        let mut iovs: Vec<libc::iovec> = messages
            .iter()
            .map(|m| libc::iovec {
                iov_base: m.as_ptr() as *mut libc::c_void,
                iov_len: m.len(),
            })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: an all-zero mmsghdr is valid (no name, no control).
                let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        let mut sent = 0;
        while sent < hdrs.len() {
            let rest = &mut hdrs[sent..];
            // SAFETY: each header points at one iovec of `iovs`, which
            // points into `messages`; all live for the call's duration.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    rest.as_mut_ptr(),
                    rest.len() as libc::c_uint,
                    libc::MSG_NOSIGNAL,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let done = &messages[sent..sent + r as usize];
            if rest
                .iter()
                .zip(done)
                .any(|(h, m)| h.msg_len as usize != m.len())
            {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "message cut"));
            }
            sent += r as usize;
        }
        Ok(())
    }

    /// Receives one message into `buf` and the descriptors it carried.
    /// Returns 0 bytes at end of stream. A message longer than `buf`, or
    /// with more descriptors than [`MAX_FDS`], is an `InvalidData` error
    /// (and whatever descriptors did arrive are closed).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        self.recv_with(buf, 0)
    }

    /// As [`recv`](Self::recv), but a `WouldBlock` error when no message
    /// waits.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        self.recv_with(buf, libc::MSG_DONTWAIT)
    }

    fn recv_with(&self, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, Vec<OwnedFd>)> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let mut cmsg = CmsgBuf([0; 128]);
        // SAFETY: an all-zero msghdr is valid.
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = cmsg.0.len();
        let n = loop {
            // SAFETY: `msg` points at live buffers for the call's duration.
            let r = unsafe {
                libc::recvmsg(
                    self.fd.as_raw_fd(),
                    &mut msg,
                    libc::MSG_CMSG_CLOEXEC | flags,
                )
            };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut fds = Vec::new();
        // SAFETY: the kernel filled `msg_controllen` bytes of `cmsg`; the
        // CMSG_* macros walk only within them. Every descriptor in an
        // SCM_RIGHTS message is new and ours, so wrapping each in an
        // OwnedFd (closed on drop) is right.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c) as *const RawFd;
                    let header = data as usize - c as usize;
                    let count = ((*c).cmsg_len as usize).saturating_sub(header) / 4;
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "message or its descriptors cut",
            ));
        }
        Ok((n, fds))
    }

    /// A timeout for [`recv`](Self::recv) (`None`: block).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        let tv = match timeout {
            Some(t) => libc::timeval {
                tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_usec: t.subsec_micros().max(u32::from(t.is_zero())) as libc::suseconds_t,
            },
            None => libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            },
        };
        // SAFETY: setsockopt reads `size_of::<timeval>()` bytes from `tv`.
        cvt(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        })?;
        Ok(())
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        set_nonblocking(self.fd.as_fd(), on)
    }

    /// Shuts both directions: the peer reads end of stream and can send no
    /// more, while this socket stays open (and pollable) until dropped.
    pub fn shutdown(&self) -> io::Result<()> {
        // SAFETY: plain syscall on our descriptor.
        cvt(unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) })?;
        Ok(())
    }

    /// Whether the peer has closed its end (checked without blocking).
    pub fn peer_closed(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one live pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }
}

impl AsFd for SeqPacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for SeqPacket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
