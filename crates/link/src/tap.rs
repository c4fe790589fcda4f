//! A Linux TAP device: the user side of a virtual Ethernet interface.
//!
//! Frames written here arrive at the kernel's interface as if received from a wire;
//! frames the kernel sends out of the interface are read here. The kernel has no
//! batch system call for TAP, so a batch is a loop of non-blocking reads or writes.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::sys;
use crate::{sendable, Link, LinkStats, MAX_HEADER_LEN};

/// Read buffer: large enough for any frame the kernel could hand over.
const RX_BUF: usize = 65_536;

/// An open TAP device (see the [module documentation](self)).
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
    mtu: usize,
    kernel_mac: [u8; 6],
    mac: [u8; 6],
    rx_buf: Vec<u8>,
    tx_buf: Vec<u8>,
    stats: LinkStats,
    /// A device failure met after some frames had moved, returned on the next call.
    deferred: Option<io::Error>,
}

impl Tap {
    /// Attaches to TAP device `name`, creating it if it does not exist (a created
    /// device goes away when the link is dropped; one made persistent with
    /// `ip tuntap add` stays). The device is not brought up: that is the
    /// administrator's call (`ip link set NAME up`); sending while it is down fails
    /// with `EIO`.
    ///
    /// The MTU is read now; [`mac`](Link::mac) is the kernel interface's address with
    /// the last bit flipped, since this side is a different station on the virtual
    /// wire (see [`set_mac`](Tap::set_mac)).
    pub fn open(name: &str) -> io::Result<Tap> {
        // SAFETY: the path is a NUL-terminated literal.
        let fd = sys::owned(unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        })?;
        let mut ifr = sys::ifreq(name)?;
        ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        sys::ioctl_ifreq(fd.as_raw_fd(), libc::TUNSETIFF as libc::c_ulong, &mut ifr)?;
        let name = sys::ifreq_name(&ifr);
        let sock = sys::ioctl_socket()?;
        let (mtu, kernel_mac) = sys::if_mtu_mac(sock.as_raw_fd(), &name)?;
        let mut mac = kernel_mac;
        mac[5] ^= 1;
        Ok(Tap {
            fd,
            name,
            mtu,
            kernel_mac,
            mac,
            rx_buf: vec![0; RX_BUF.max(mtu + MAX_HEADER_LEN)],
            tx_buf: vec![0; mtu + MAX_HEADER_LEN],
            stats: LinkStats::default(),
            deferred: None,
        })
    }

    /// The interface name the kernel gave (a pattern like `tap%d` is filled in).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kernel interface's own MAC address (the station on the other side).
    pub fn kernel_mac(&self) -> [u8; 6] {
        self.kernel_mac
    }

    /// Changes the station address reported by [`mac`](Link::mac).
    pub fn set_mac(&mut self, mac: [u8; 6]) {
        self.mac = mac;
    }

    /// Writes one frame; `Ok(false)` if the device has no room now.
    fn write_frame(&mut self, frame: &[u8]) -> io::Result<bool> {
        // SAFETY: writes from a live slice of the given length.
        let r = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        if r >= 0 {
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += frame.len() as u64;
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(false),
            // The frame itself was refused.
            Some(libc::EINVAL | libc::EMSGSIZE) => {
                self.stats.tx_dropped += 1;
                Ok(true)
            }
            _ => Err(e),
        }
    }
}

impl Link for Tap {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8]), max: usize) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let mut n = 0;
        while n < max {
            let buf = &mut self.rx_buf;
            // SAFETY: reads into a live buffer of the given length.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => break,
                    Some(libc::EINTR) => continue,
                    _ if n > 0 => {
                        self.deferred = Some(e);
                        break;
                    }
                    _ => return Err(e),
                }
            }
            let len = r as usize;
            f(&buf[..len]);
            n += 1;
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += len as u64;
        }
        Ok(n)
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let mut buf = std::mem::take(&mut self.tx_buf);
        let mut n = 0;
        let result = loop {
            let Some(len) = fill(&mut buf) else {
                break Ok(n);
            };
            n += 1;
            if !sendable(len, buf.len()) {
                self.stats.tx_dropped += 1;
                continue;
            }
            match self.write_frame(&buf[..len]) {
                Ok(true) => {}
                // No room: the frame was taken, so it is lost, as on a full NIC queue.
                Ok(false) => {
                    self.stats.tx_dropped += 1;
                    break Ok(n);
                }
                Err(e) => {
                    self.stats.tx_dropped += 1;
                    self.deferred = Some(e);
                    break Ok(n);
                }
            }
        };
        self.tx_buf = buf;
        result
    }

    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let cap = self.max_frame_len();
        for (i, frame) in frames.iter().enumerate() {
            if !sendable(frame.len(), cap) {
                self.stats.tx_dropped += 1;
                continue;
            }
            // Unlike `send_with`, a frame that finds no room is simply not taken.
            match self.write_frame(frame) {
                Ok(true) => {}
                Ok(false) => return Ok(i),
                Err(e) if i > 0 => {
                    self.deferred = Some(e);
                    return Ok(i);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(frames.len())
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn as_raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn stats(&self) -> LinkStats {
        self.stats
    }
}
