//! `struct virtio_net_hdr` (linux/virtio_net.h): the header Linux puts in
//! front of every frame a packet socket (`PACKET_VNET_HDR`) or a TAP device
//! (`IFF_VNET_HDR`) exchanges with it, saying how to finish the frame's
//! checksum and where to cut a super-segment. Little-endian fields. What
//! the links that use it share: the cut of what arrives, and the header of
//! what is sent.

use exonet_wire::ethernet::{ethertype, HEADER_LEN};
use exonet_wire::tso::{Cutter, TcpSuper};

use crate::{LinkStats, MAX_HEADER_LEN};

/// Its length without `num_buffers` (which neither link asks for).
pub(crate) const LEN: usize = 10;
/// How many bytes of header come before each frame: [`LEN`] where the
/// headers are `on`, none otherwise.
pub(crate) fn len(on: bool) -> usize {
    if on {
        LEN
    } else {
        0
    }
}

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the transport checksum is left to the
/// receiver, its field holding the pseudo-header sum.
pub(crate) const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: Linux verified the transport checksum.
pub(crate) const F_DATA_VALID: u8 = 2;
const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`: a UDP super-datagram (`UDP_SEGMENT`), cut
/// into datagrams of `gso_size` payload bytes.
const GSO_UDP_L4: u8 = 5;
const GSO_ECN: u8 = 0x80;

/// Whether `frame` is longer than a frame of `mtu` can be: its header plus
/// `mtu`, counting an 802.1Q (or 802.1ad) tag only if it has one.
pub(crate) fn beyond_mtu(frame: &[u8], mtu: usize) -> bool {
    frame.len() > mtu + MAX_HEADER_LEN
        || (frame.len() > mtu + HEADER_LEN
            && !ethertype::is_vlan(u16::from_be_bytes([frame[12], frame[13]])))
}

/// What [`lend`] did with a frame.
pub(crate) enum Taken {
    /// Lent to the callback.
    Whole,
    /// Dropped: longer than an MTU's frame, and no super-segment.
    Dropped,
    /// Not lent: a TCP super-segment or a UDP super-datagram, to be cut ([`cut`]).
    Super(Cutter),
}

/// Lends `frame` to `f` and counts it, having first finished a checksum Linux
/// left undone (`partial`), so that every frame handed up carries a valid one
/// (counted in `rx_csum_completed`); `f` is told whether it is known good
/// (finished here, or `verified` below). A TCP super-segment is returned
/// instead, to be cut into frames that fit `mtu` (counted in `rx_super`), and
/// so is a UDP super-datagram, to be cut into the datagrams its sender wrote:
/// their size only the frame's header (`vnet`) tells.
pub(crate) fn lend(
    frame: &mut [u8],
    vnet: Option<[u8; LEN]>,
    (partial, verified): (bool, bool),
    mtu: usize,
    stats: &mut LinkStats,
    f: &mut dyn FnMut(&[u8], bool),
) -> Taken {
    let len = frame.len();
    if beyond_mtu(frame, mtu) {
        let cutter = match vnet {
            Some(v) if v[1] & !GSO_ECN == GSO_UDP_L4 => {
                Cutter::udp(frame, usize::from(u16::from_le_bytes([v[4], v[5]])), mtu)
            }
            _ => Cutter::new(frame, mtu),
        };
        return match cutter {
            Some(c) => {
                stats.rx_super += 1;
                Taken::Super(c)
            }
            None => {
                stats.rx_dropped += 1;
                Taken::Dropped
            }
        };
    }
    let completed = partial && exonet_wire::checksum::complete_partial(frame);
    stats.rx_csum_completed += u64::from(completed);
    f(frame, completed || verified);
    stats.rx_frames += 1;
    stats.rx_bytes += len as u64;
    Taken::Whole
}

/// Lends the next segments of a super-segment being cut, at most `max`, and
/// counts them; returns how many.
pub(crate) fn cut(
    c: &mut Cutter,
    frame: &mut [u8],
    max: usize,
    stats: &mut LinkStats,
    f: &mut dyn FnMut(&[u8], bool),
) -> usize {
    c.cut(frame, max, &mut |seg| {
        stats.rx_frames += 1;
        stats.rx_bytes += seg.len() as u64;
        // Its checksums were computed here, over bytes Linux took in whole
        // (merged by GRO only once verified, or sent from this host).
        f(seg, true);
    })
}

/// The header that has the kernel cut `frame`, a TCP super-segment whose
/// packet exceeds `mtu`, into segments that fit it, with their checksums
/// computed there (`NEEDS_CSUM`: the checksum field gets the pseudo-header sum
/// that asks for); `None` if `frame` is no such segment.
pub(crate) fn super_segment(frame: &mut [u8], mtu: usize) -> Option<[u8; LEN]> {
    let h = TcpSuper::parse(frame)?;
    let size = u16::try_from(h.segment_size(mtu)).ok()?;
    if h.end != frame.len() || h.end - h.l3 <= mtu || size == 0 {
        return None;
    }
    let partial = h.pseudo_sum(frame);
    frame[h.l4 + 16..h.l4 + 18].copy_from_slice(&partial.to_be_bytes());
    // RFC 3168 §6.1.2: CWR goes on the first segment only, which the kernel
    // knows to do for an ECN super-segment.
    let cwr = frame[h.l4 + 13] & 0x80 != 0;
    let mut v = [0u8; LEN];
    v[0] = F_NEEDS_CSUM;
    v[1] = GSO_TCPV4 | if cwr { GSO_ECN } else { 0 };
    v[2..4].copy_from_slice(&(h.payload as u16).to_le_bytes());
    v[4..6].copy_from_slice(&size.to_le_bytes());
    v[6..8].copy_from_slice(&(h.l4 as u16).to_le_bytes());
    v[8..10].copy_from_slice(&16u16.to_le_bytes());
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize, ethertype: u16) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f
    }

    #[test]
    fn only_a_tagged_frame_may_pass_the_mtu_by_its_tag() {
        let (mtu, ipv4, vlan) = (1500, ethertype::IPV4, ethertype::VLAN);
        assert!(!beyond_mtu(&frame(mtu + HEADER_LEN, ipv4), mtu));
        assert!(beyond_mtu(&frame(mtu + HEADER_LEN + 1, ipv4), mtu));
        assert!(beyond_mtu(&frame(mtu + MAX_HEADER_LEN, ipv4), mtu));
        assert!(!beyond_mtu(&frame(mtu + MAX_HEADER_LEN, vlan), mtu));
        assert!(beyond_mtu(&frame(mtu + MAX_HEADER_LEN + 1, vlan), mtu));
    }
}
