//! Segmentation offload in software, over any link: what Linux's GSO does for
//! a device without TSO.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use exonet_wire::tso::Cutter;

use crate::{sendable, Link, LinkStats, MAX_SUPER_LEN};

/// A link that takes TCP super-segments to send ([`Link::max_send_len`]) and
/// cuts each into frames that fit the inner link's MTU, copying them into its
/// buffers; other frames go through as they are (copied too). For links with
/// no segmentation of their own (memwire, AF_XDP, TAP), so that a stack sends
/// a 64 KB write as one frame and the link does the per-segment work.
///
/// A frame the inner link has no room for when it comes is lost (counted in
/// `tx_dropped`), as on a cable: the wrapper lends its own buffer before it
/// knows.
#[derive(Debug)]
pub struct Segmenter<L> {
    inner: L,
    buf: Vec<u8>,
    tx_super: u64,
    tx_dropped: u64,
    deferred: Option<io::Error>,
}

impl<L: Link> Segmenter<L> {
    /// Cuts the super-segments sent through `inner`.
    pub fn new(inner: L) -> Self {
        Segmenter {
            inner,
            buf: vec![0; MAX_SUPER_LEN],
            tx_super: 0,
            tx_dropped: 0,
            deferred: None,
        }
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }
}

impl<L: Link> Link for Segmenter<L> {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8]), max: usize) -> io::Result<usize> {
        self.inner.recv_batch(f, max)
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let Segmenter {
            inner,
            buf,
            tx_super,
            tx_dropped,
            deferred,
        } = self;
        let (mtu, max_frame) = (inner.mtu(), inner.max_frame_len());
        let mut n = 0;
        while let Some(len) = fill(buf) {
            n += 1;
            if !sendable(len, buf.len()) {
                *tx_dropped += 1;
                continue;
            }
            let frame = &mut buf[..len];
            let mut sent = 0;
            let mut send = |f: &[u8]| match inner.send_batch(&[f]) {
                Ok(k) => sent += k,
                Err(e) => {
                    deferred.get_or_insert(e);
                }
            };
            let frames = if len <= max_frame {
                send(frame);
                1
            } else if let Some(mut c) = Cutter::new(frame, mtu) {
                *tx_super += 1;
                c.cut(frame, usize::MAX, &mut send)
            } else {
                0
            };
            *tx_dropped += (frames - sent) as u64 + u64::from(frames == 0);
            if deferred.is_some() {
                break;
            }
        }
        match deferred.take() {
            Some(e) if n <= 1 => Err(e),
            e => {
                *deferred = e;
                Ok(n)
            }
        }
    }

    fn mtu(&self) -> usize {
        self.inner.mtu()
    }

    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }

    fn max_send_len(&self) -> usize {
        MAX_SUPER_LEN
    }

    fn mac(&self) -> [u8; 6] {
        self.inner.mac()
    }

    fn as_raw_fd(&self) -> Option<RawFd> {
        self.inner.as_raw_fd()
    }

    fn stats(&self) -> LinkStats {
        let s = self.inner.stats();
        LinkStats {
            tx_super: s.tx_super + self.tx_super,
            tx_dropped: s.tx_dropped + self.tx_dropped,
            ..s
        }
    }

    fn prepare_sleep(&mut self) -> bool {
        self.inner.prepare_sleep()
    }

    forward_kicks_to_inner!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memwire;
    use exonet_wire::build;
    use exonet_wire::tcp::{flags, TcpOption};
    use exonet_wire::{Ipv4Packet, MacAddr, TcpPacket};

    #[test]
    fn super_segments_are_cut_to_the_mtu_and_the_rest_goes_as_is() {
        let (a, mut b) = memwire::pair().unwrap();
        let mut a = Segmenter::new(a);
        assert_eq!((a.max_frame_len(), a.max_send_len()), (1518, MAX_SUPER_LEN));
        let payload: Vec<u8> = (0..30_000u32).map(|i| (i % 249) as u8).collect();
        let ts = TcpOption::Timestamps { tsval: 1, tsecr: 2 };
        let (ma, mb) = (MacAddr(a.mac()), MacAddr(b.mac()));
        let (ia, ib) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let big = build::tcp_frame(ma, mb, ia, ib, 1, 2, flags::ACK, 9, 1, &[ts], &payload);
        let small = build::udp_frame(ma, mb, ia, ib, 3, 4, b"as is");
        assert_eq!(
            a.send_batch(&[&big[..], &small[..], &[0u8; 9000][..]])
                .unwrap(),
            3
        );
        let mut got = Vec::new();
        let mut segs = 0;
        b.recv_batch(
            &mut |f| {
                let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
                assert!(ip.verify_checksum() && f.len() <= 1514);
                if let Ok(t) = TcpPacket::new_checked(ip.payload()) {
                    assert!(t.verify_checksum(ip.src_addr(), ip.dst_addr()));
                    got.extend_from_slice(t.payload());
                    segs += 1;
                } else {
                    assert_eq!(f, &small[..]);
                }
            },
            64,
        )
        .unwrap();
        assert!(got == payload);
        // 1500 − 20 − 32 bytes a segment.
        assert_eq!(segs, payload.len().div_ceil(1448));
        let s = a.stats();
        assert_eq!(
            (s.tx_super, s.tx_dropped, s.tx_frames),
            (1, 1, segs as u64 + 1)
        );
    }
}
