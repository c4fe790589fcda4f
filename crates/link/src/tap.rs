//! A Linux TAP device: the user side of a virtual Ethernet interface.
//!
//! Frames written here arrive at the kernel's interface as if received from a wire;
//! frames the kernel sends out of the interface are read here. The kernel has no
//! batch system call for TAP, so a batch is a loop of non-blocking reads or writes.
//!
//! Offloads, as a virtio NIC has them (`IFF_VNET_HDR` and `TUNSETOFFLOAD`;
//! [`Tap::open_with`]): every frame both ways follows a `virtio_net_hdr`, the
//! kernel's interface takes checksum and TCP (and, from Linux 6.2, UDP)
//! segmentation offload, and so Linux hands over a TCP stream in super-segments
//! of up to 64 KB, a read each, with their checksums left undone. The link
//! cuts them into frames of the MTU ([`exonet_wire::tso::Cutter`]), a UDP
//! super-datagram by the size its header gives, and finishes the checksums
//! Linux left, as the afpacket link does. It also takes super-segments to
//! send ([`Link::max_send_len`]), which go up Linux's stack whole, as a NIC's
//! receive offload would hand them over.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use exonet_wire::tso::Cutter;

use crate::sys;
use crate::vnet::{self, Taken};
use crate::{sendable, Link, LinkStats, MAX_HEADER_LEN, MAX_SUPER_LEN};

/// Read buffer: large enough for any frame the kernel could hand over, a
/// super-segment and its header included.
const RX_BUF: usize = vnet::LEN + MAX_SUPER_LEN;

/// The offloads asked of the kernel's interface, most first, then without
/// UDP segmentation (before Linux 6.2). The kernel takes UDP segmentation
/// only for both IP versions at once; exonet has no IPv6, and drops its
/// frames as any other.
const OFFLOADS: [libc::c_uint; 2] = [
    libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO_ECN | libc::TUN_F_USO4 | libc::TUN_F_USO6,
    libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO_ECN,
];

/// An open TAP device (see the [module documentation](self)).
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
    mtu: usize,
    kernel_mac: [u8; 6],
    mac: [u8; 6],
    /// Every frame follows a `virtio_net_hdr` (`IFF_VNET_HDR`), and the
    /// kernel's interface has the offloads: super-segments both ways.
    offloads: bool,
    rx_buf: Vec<u8>,
    /// A super-segment being cut, in `rx_buf` after its header, and its length.
    cutting: Option<(Cutter, usize)>,
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
    ///
    /// With offloads where the kernel grants them ([`Tap::open_with`]).
    pub fn open(name: &str) -> io::Result<Tap> {
        Tap::open_with(name, true)
    }

    /// [`Tap::open`], asking for the offloads of the [module
    /// documentation](self) if `offloads` (without them where the kernel
    /// refuses them all: [`Tap::offloads`] says which it is).
    pub fn open_with(name: &str, offloads: bool) -> io::Result<Tap> {
        // SAFETY: the path is a NUL-terminated literal.
        let fd = sys::owned(unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        })?;
        let mut ifr = sys::ifreq(name)?;
        let vnet = if offloads { libc::IFF_VNET_HDR } else { 0 };
        ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI | vnet) as libc::c_short;
        sys::ioctl_ifreq(fd.as_raw_fd(), libc::TUNSETIFF as libc::c_ulong, &mut ifr)?;
        let name = sys::ifreq_name(&ifr);
        // The header's default size is the 10 bytes of `vnet::LEN`.
        let offloads = offloads
            && OFFLOADS.iter().any(|&o| {
                // SAFETY: TUNSETOFFLOAD takes its flags by value.
                let r = unsafe {
                    libc::ioctl(fd.as_raw_fd(), libc::TUNSETOFFLOAD as _, o as libc::c_ulong)
                };
                r == 0
            });
        if vnet != 0 && !offloads {
            // Refused: the header would only cost a copy. A device whose
            // flags were set cannot drop it; reopened, it has none.
            drop(fd);
            return Tap::open_with(&name, false);
        }
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
            offloads,
            rx_buf: vec![0; RX_BUF.max(mtu + MAX_HEADER_LEN)],
            cutting: None,
            tx_buf: vec![0; vnet::LEN + MAX_SUPER_LEN.max(mtu + MAX_HEADER_LEN)],
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

    /// Whether frames cross with a `virtio_net_hdr` and the kernel's
    /// interface has the offloads (see the [module documentation](self)).
    pub fn offloads(&self) -> bool {
        self.offloads
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

    /// Writes the frame of `len` bytes at the front of `tx_buf`'s frame area,
    /// behind its header if the device has them: none for a frame that fits
    /// the MTU, or the one that has the kernel cut a TCP super-segment.
    /// `Ok(None)` if it was dropped (counted), else as `write_frame`.
    fn put(&mut self, len: usize) -> io::Result<Option<bool>> {
        let off = vnet::len(self.offloads);
        if !sendable(len, self.max_send_len()) {
            self.stats.tx_dropped += 1;
            return Ok(None);
        }
        let (head, frame) = self.tx_buf.split_at_mut(off);
        let frame = &mut frame[..len];
        if self.offloads {
            let header = if vnet::beyond_mtu(frame, self.mtu) {
                vnet::super_segment(frame, self.mtu)
            } else {
                Some([0; vnet::LEN])
            };
            let Some(h) = header else {
                self.stats.tx_dropped += 1;
                return Ok(None);
            };
            self.stats.tx_super += u64::from(h[1] != 0);
            head.copy_from_slice(&h);
        }
        let buf = std::mem::take(&mut self.tx_buf);
        let r = self.write_frame(&buf[..off + len]);
        self.tx_buf = buf;
        r.map(Some)
    }
}

impl Link for Tap {
    recv_batch_from_checked!();

    /// A frame whose checksum Linux left undone is finished here, and said to
    /// be good, as one Linux verified (`DATA_VALID`); a super-segment is cut.
    fn recv_batch_checked(
        &mut self,
        f: &mut dyn FnMut(&[u8], bool),
        max: usize,
    ) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let off = vnet::len(self.offloads);
        let mut n = 0;
        while n < max {
            if let Some((mut c, len)) = self.cutting.take() {
                let frame = &mut self.rx_buf[off..off + len];
                n += vnet::cut(&mut c, frame, max - n, &mut self.stats, f);
                if c.remaining() > 0 {
                    self.cutting = Some((c, len));
                }
                continue;
            }
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
            n += 1;
            let len = r as usize;
            if !self.offloads {
                f(&buf[..len], false);
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += len as u64;
                continue;
            }
            // A read that filled the buffer may have been cut short.
            if len < off || len == buf.len() {
                self.stats.rx_dropped += 1;
                continue;
            }
            let (head, frame) = buf[..len].split_at_mut(off);
            let v: [u8; vnet::LEN] = head.try_into().expect("split at its length");
            let csum = (
                v[0] & vnet::F_NEEDS_CSUM != 0,
                v[0] & vnet::F_DATA_VALID != 0,
            );
            match vnet::lend(frame, Some(v), csum, self.mtu, &mut self.stats, f) {
                Taken::Whole | Taken::Dropped => {}
                Taken::Super(c) => {
                    // Its segments count instead.
                    n -= 1;
                    self.cutting = Some((c, len - off));
                }
            }
        }
        Ok(n)
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let off = vnet::len(self.offloads);
        let cap = self.max_send_len();
        let mut n = 0;
        loop {
            let Some(len) = fill(&mut self.tx_buf[off..off + cap]) else {
                return Ok(n);
            };
            n += 1;
            match self.put(len) {
                Ok(Some(true) | None) => {}
                // No room: the frame was taken, so it is lost, as on a full NIC queue.
                Ok(Some(false)) => {
                    self.stats.tx_dropped += 1;
                    return Ok(n);
                }
                Err(e) => {
                    self.stats.tx_dropped += 1;
                    self.deferred = Some(e);
                    return Ok(n);
                }
            }
        }
    }

    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let off = vnet::len(self.offloads);
        for (i, frame) in frames.iter().enumerate() {
            let Some(room) = self.tx_buf.get_mut(off..off + frame.len()) else {
                self.stats.tx_dropped += 1;
                continue;
            };
            room.copy_from_slice(frame);
            // Unlike `send_with`, a frame that finds no room is simply not taken.
            match self.put(frame.len()) {
                Ok(Some(true) | None) => {}
                Ok(Some(false)) => return Ok(i),
                Err(e) if i > 0 => {
                    self.deferred = Some(e);
                    return Ok(i);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(frames.len())
    }

    /// With offloads, a TCP super-segment of up to 64 KB.
    fn max_send_len(&self) -> usize {
        if self.offloads {
            MAX_SUPER_LEN
        } else {
            self.max_frame_len()
        }
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
