//! Thin wrappers over the system calls the drivers share.

use std::ffi::CString;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// Turns a C return value into a result (negative means `errno`).
pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Takes ownership of a new descriptor returned by a system call.
pub fn owned(ret: libc::c_int) -> io::Result<OwnedFd> {
    let fd = cvt(ret)?;
    // SAFETY: `fd` was just returned by the kernel and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A shared mapping of a descriptor, unmapped on drop.
#[derive(Debug)]
pub struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mmap {
    /// Maps `len` bytes of `fd` from offset 0, readable and writable, shared.
    pub fn shared(fd: RawFd, len: usize) -> io::Result<Mmap> {
        Self::map(fd, len, 0, libc::MAP_SHARED)
    }

    /// Maps `len` bytes of `fd` from `offset` (a kernel-defined ring selector for
    /// AF_XDP), shared and populated up front.
    pub fn shared_at(fd: RawFd, len: usize, offset: libc::off_t) -> io::Result<Mmap> {
        Self::map(fd, len, offset, libc::MAP_SHARED | libc::MAP_POPULATE)
    }

    /// `len` bytes of private zeroed memory, populated up front.
    pub fn anonymous(len: usize) -> io::Result<Mmap> {
        Self::map(
            -1,
            len,
            0,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
        )
    }

    fn map(fd: RawFd, len: usize, offset: libc::off_t, flags: libc::c_int) -> io::Result<Mmap> {
        // SAFETY: a fresh mapping chosen by the kernel aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap at 0"))?;
        Ok(Mmap { ptr, len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: a `Mmap` owns its region like a `Vec` owns its buffer; moving it to another
// thread moves that ownership.
unsafe impl Send for Mmap {}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `shared` with this length and every
        // pointer into it is owned by the same struct that owns this `Mmap`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A non-blocking eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain system call, no pointers.
    owned(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })
}

/// Adds one to an eventfd's counter, making it readable.
pub fn eventfd_signal(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64. It fails only if the counter would
    // overflow, in which case the descriptor is readable anyway.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Resets an eventfd's counter to zero (non-blocking: a zero counter is left alone).
pub fn eventfd_drain(fd: &OwnedFd) {
    let mut v = 0u64;
    // SAFETY: reads at most 8 bytes into a live u64; EAGAIN just means it was zero.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

/// Sets a socket option from a plain value.
pub fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: passes a pointer to a live `T` and its exact size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (v as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// An `ifreq` naming interface `name` (`InvalidInput` if it cannot be one).
pub fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    // SAFETY: `ifreq` is plain data for which all zeroes is valid.
    let mut ifr: libc::ifreq = unsafe { mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(ifr)
}

/// The interface name the kernel wrote back into an `ifreq`.
pub fn ifreq_name(ifr: &libc::ifreq) -> String {
    let bytes: Vec<u8> = ifr
        .ifr_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Issues an interface ioctl on `fd` (any socket).
pub fn ioctl_ifreq(fd: RawFd, req: libc::c_ulong, ifr: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: every request used here reads and writes within one `ifreq`, and
    // SIOCETHTOOL within the live buffer its `ifru_data` points to.
    cvt(unsafe { libc::ioctl(fd, req as _, ifr as *mut libc::ifreq) }).map(drop)
}

/// MTU and hardware address of interface `name`, asked through socket `fd`.
pub fn if_mtu_mac(fd: RawFd, name: &str) -> io::Result<(usize, [u8; 6])> {
    let mut ifr = ifreq(name)?;
    ioctl_ifreq(fd, libc::SIOCGIFMTU, &mut ifr)?;
    // SAFETY: SIOCGIFMTU filled the `ifru_mtu` member.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    let mut ifr = ifreq(name)?;
    ioctl_ifreq(fd, libc::SIOCGIFHWADDR, &mut ifr)?;
    // SAFETY: SIOCGIFHWADDR filled the `ifru_hwaddr` member.
    let hw = unsafe { ifr.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok((usize::try_from(mtu).unwrap_or(0), mac))
}

/// The name of the driver of interface `name` (`ETHTOOL_GDRVINFO`), asked
/// through socket `fd`.
pub fn if_driver(fd: RawFd, name: &str) -> io::Result<String> {
    const ETHTOOL_GDRVINFO: u32 = 3;
    /// The fields of `struct ethtool_drvinfo` after `driver`: four strings
    /// of 32 bytes, 12 reserved bytes and five `u32` counts.
    const REST: usize = 32 * 4 + 12 + 4 * 5;
    /// `struct ethtool_drvinfo`.
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        rest: [u8; REST],
    }
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        rest: [0; REST],
    };
    let mut ifr = ifreq(name)?;
    ifr.ifr_ifru.ifru_data = (&mut info as *mut DrvInfo).cast();
    ioctl_ifreq(fd, libc::SIOCETHTOOL, &mut ifr)?;
    let len = info.driver.iter().position(|&c| c == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..len]).into_owned())
}

/// Whether interface `name` has TCP segmentation offload on
/// (`ETHTOOL_GTSO`, what `ethtool -k` shows as tcp-segmentation-offload),
/// asked through socket `fd`.
pub fn if_tso(fd: RawFd, name: &str) -> io::Result<bool> {
    const ETHTOOL_GTSO: u32 = 0x1e;
    /// `struct ethtool_value`.
    #[repr(C)]
    struct Value {
        cmd: u32,
        data: u32,
    }
    let mut v = Value {
        cmd: ETHTOOL_GTSO,
        data: 0,
    };
    let mut ifr = ifreq(name)?;
    ifr.ifr_ifru.ifru_data = (&mut v as *mut Value).cast();
    ioctl_ifreq(fd, libc::SIOCETHTOOL, &mut ifr)?;
    Ok(v.data != 0)
}

/// Index of interface `name`.
pub fn if_index(name: &str) -> io::Result<libc::c_int> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => libc::c_int::try_from(i).map_err(io::Error::other),
    }
}

/// A datagram socket, only for interface ioctls.
pub fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain system call, no pointers.
    owned(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })
}

/// Whether this process runs as root: tests that need devices skip
/// without.
#[cfg(test)]
pub fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}
