//! Segmentation offload done in software, the two halves a link needs where
//! the "hardware" is a veth: Linux hands TCP *super-segments* and UDP
//! *super-datagrams* (up to 64 KB in one frame, left to a NIC's TSO or to
//! GSO's UDP segmentation, `UDP_SEGMENT`) across it, and takes TCP
//! super-segments from a packet socket to cut or pass on.
//!
//! - [`Cutter`] cuts a received super-frame into frames that fit the MTU, in
//!   place and a few at a time if need be ([`segment`]: all at once), as
//!   Linux's GSO would have on the wire. TCP (`tcp_gso_segment`): the
//!   sequence number advances by the segment size, FIN and PSH stay on the
//!   last segment, CWR on the first. UDP (`__udp_gso_segment`): each datagram
//!   carries the sender's segment size of payload (the last one the rest),
//!   with its own length. Either way the IPv4 identification counts up, and
//!   every segment gets its own checksums.
//! - [`TcpSuper`] recognizes a super-frame to send and gives what the kernel
//!   needs to cut it (`virtio_net_hdr`): where the headers end, the segment
//!   size, and the pseudo-header sum its checksum field must hold
//!   (`CHECKSUM_PARTIAL`).

use crate::checksum;
use crate::ipv4;

const TCP: u8 = 6;
const UDP: u8 = 17;
/// TCP flags that belong to the last segment only (RFC 9293: a FIN ends the
/// data; PSH marks the end of what was pushed) and to the first only (RFC
/// 3168 §6.1.2: CWR once per window reduction).
const FIN: u8 = 0x01;
const PSH: u8 = 0x08;
const CWR: u8 = 0x80;
/// Longest header block: Ethernet with one 802.1Q tag, IPv4 and TCP with all
/// their options.
const MAX_HEADERS: usize = 18 + 60 + 60;
/// The UDP header's length (RFC 768).
const UDP_HEADER: usize = 8;

/// The offsets of the IPv4 header, the transport header and the packet's end
/// in `frame`, if it is an untagged or 802.1Q-tagged Ethernet frame carrying
/// a whole (unfragmented) IPv4 packet of protocol `proto` that lies within it.
fn ipv4_packet(frame: &[u8], proto: u8) -> Option<(usize, usize, usize)> {
    let p = ipv4::in_frame(frame).filter(|p| p.proto == proto && !p.fragment)?;
    Some((p.l3, p.l4, p.end))
}

/// Where a TCP/IPv4 frame's headers are (see [`TcpSuper::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSuper {
    /// Offset of the IPv4 header (14, or 18 behind an 802.1Q tag).
    pub l3: usize,
    /// Offset of the TCP header.
    pub l4: usize,
    /// Offset of the TCP payload: the end of the headers.
    pub payload: usize,
    /// End of the IPv4 packet in the frame (from its total length).
    pub end: usize,
}

impl TcpSuper {
    /// The headers of `frame` if it is an untagged or 802.1Q-tagged Ethernet
    /// frame carrying a whole (unfragmented) IPv4 packet of TCP whose lengths
    /// are consistent and lie within the frame; `None` otherwise.
    pub fn parse(frame: &[u8]) -> Option<TcpSuper> {
        let (l3, l4, end) = ipv4_packet(frame, TCP)?;
        let doff = usize::from(*frame.get(l4 + 12)? >> 4) * 4;
        let payload = l4 + doff;
        if doff < 20 || payload > end {
            return None;
        }
        Some(TcpSuper {
            l3,
            l4,
            payload,
            end,
        })
    }

    /// The TCP payload bytes that fit in a packet of `mtu` bytes behind
    /// these headers; 0 if not even the headers fit.
    pub fn segment_size(&self, mtu: usize) -> usize {
        (mtu + self.l3).saturating_sub(self.payload)
    }

    /// The sum of the TCP pseudo-header (RFC 9293 §3.1) of the packet in
    /// `frame`: what the checksum field holds while the checksum is left to
    /// whoever cuts the segment (the `CHECKSUM_PARTIAL` convention).
    pub fn pseudo_sum(&self, frame: &[u8]) -> u16 {
        checksum::pseudo_sum_in(frame, self.l3, self.l4, self.end, TCP)
    }
}

/// Cuts `frame`, a TCP/IPv4 super-frame whose packet is longer than `mtu`,
/// into frames whose packets fit `mtu`, and lends each to `f` in order: all of
/// [`Cutter`] at once. Returns how many segments `f` got, or `None` (without
/// calling `f` or changing `frame`) when `frame` is no such super-frame.
pub fn segment(frame: &mut [u8], mtu: usize, f: &mut dyn FnMut(&[u8])) -> Option<usize> {
    let mut c = Cutter::new(frame, mtu)?;
    Some(c.cut(frame, usize::MAX, f))
}

/// Cuts a super-frame whose packet is longer than the MTU into frames whose
/// packets fit it, a few at a time if need be (a receive batch has room for
/// so many frames): a TCP super-segment ([`Cutter::new`]) or a UDP
/// super-datagram ([`Cutter::udp`]).
///
/// It works in place: the headers of segment *i* are written over the last
/// bytes of segment *i − 1*'s payload, after it was lent; so the frame is
/// clobbered, and must be the same unchanged frame at every call.
///
/// Every segment carries complete IPv4 and transport checksums, whatever the
/// super-frame's held (Linux leaves its TCP and UDP checksums partial, and a
/// TCP one merged by GRO keeps the first segment's).
#[derive(Debug, Clone)]
pub struct Cutter {
    /// The super-frame's offsets; `payload` is the end of its headers.
    h: TcpSuper,
    /// The transport protocol: `TCP` or `UDP`.
    proto: u8,
    /// The super-frame's headers, as they came.
    headers: [u8; MAX_HEADERS],
    /// Payload bytes per segment, and the segments.
    size: usize,
    count: usize,
    /// The next segment to lend.
    next: usize,
}

impl Cutter {
    /// A cutter of a TCP super-segment into segments that fit `mtu`, or
    /// `None` when `frame` is no super-frame to cut: not TCP over IPv4,
    /// inconsistent, or already fitting `mtu`.
    pub fn new(frame: &[u8], mtu: usize) -> Option<Cutter> {
        let h = TcpSuper::parse(frame)?;
        let size = h.segment_size(mtu);
        if h.end - h.l3 <= mtu || size == 0 {
            return None;
        }
        Some(Cutter::of(frame, h, TCP, size))
    }

    /// A cutter of a UDP super-datagram into datagrams of `size` payload
    /// bytes each (the last one the rest): the segment size its sender gave
    /// (`UDP_SEGMENT`; `gso_size` of its `virtio_net_hdr`), which only the
    /// sender knows. `None` when `frame` is no UDP/IPv4 packet whose UDP
    /// length matches its IPv4 length, holds no more than one datagram, or
    /// makes datagrams that do not fit `mtu`.
    pub fn udp(frame: &[u8], size: usize, mtu: usize) -> Option<Cutter> {
        let (l3, l4, end) = ipv4_packet(frame, UDP)?;
        let payload = l4 + UDP_HEADER;
        let udp_len = usize::from(u16::from_be_bytes(
            frame.get(l4 + 4..l4 + 6)?.try_into().ok()?,
        ));
        if payload > end || udp_len != end - l4 || size == 0 {
            return None;
        }
        if end - payload <= size || payload - l3 + size > mtu {
            return None;
        }
        let h = TcpSuper {
            l3,
            l4,
            payload,
            end,
        };
        Some(Cutter::of(frame, h, UDP, size))
    }

    fn of(frame: &[u8], h: TcpSuper, proto: u8, size: usize) -> Cutter {
        let mut headers = [0u8; MAX_HEADERS];
        headers[..h.payload].copy_from_slice(&frame[..h.payload]);
        Cutter {
            h,
            proto,
            headers,
            size,
            count: (h.end - h.payload).div_ceil(size),
            next: 0,
        }
    }

    /// Segments not lent yet.
    pub fn remaining(&self) -> usize {
        self.count - self.next
    }

    /// Lends the next segments of `frame`, at most `max`, to `f`; returns how
    /// many.
    pub fn cut(&mut self, frame: &mut [u8], max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        let (hl, ip, l4) = (self.h.payload, self.h.l3, self.h.l4);
        let head = &self.headers;
        let ident = u16::from_be_bytes([head[ip + 4], head[ip + 5]]);
        let data = self.h.end - hl;
        let mut lent = 0;
        while self.next < self.count && lent < max {
            let i = self.next;
            let (from, len) = (i * self.size, self.size.min(data - i * self.size));
            // The segment's frame: its headers just before its payload.
            let seg = &mut frame[from..hl + from + len];
            seg[..hl].copy_from_slice(&head[..hl]);
            let total = (hl - ip + len) as u16;
            seg[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
            seg[ip + 4..ip + 6].copy_from_slice(&ident.wrapping_add(i as u16).to_be_bytes());
            seg[ip + 10..ip + 12].fill(0);
            let c = checksum::checksum(&seg[ip..l4]);
            seg[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
            let check = if self.proto == TCP {
                self.tcp_fields(seg, i, from);
                l4 + 16
            } else {
                let udp_len = (hl - l4 + len) as u16;
                seg[l4 + 4..l4 + 6].copy_from_slice(&udp_len.to_be_bytes());
                l4 + 6
            };
            let pseudo = checksum::pseudo_sum_in(seg, ip, l4, hl + len, self.proto);
            seg[check..check + 2].copy_from_slice(&pseudo.to_be_bytes());
            // The header's length is even (a multiple of 4), so the sums add.
            let mut c = !checksum::add(checksum::sum(&seg[l4..hl]), checksum::sum(&seg[hl..]));
            if self.proto == UDP && c == 0 {
                // RFC 768: a computed zero is sent as all ones (zero means none).
                c = 0xffff;
            }
            seg[check..check + 2].copy_from_slice(&c.to_be_bytes());
            f(seg);
            self.next += 1;
            lent += 1;
        }
        lent
    }

    /// The TCP fields of segment `i`, whose payload starts `from` bytes into
    /// the super-segment's: its sequence number and flags.
    fn tcp_fields(&self, seg: &mut [u8], i: usize, from: usize) {
        let (head, tcp) = (&self.headers, self.h.l4);
        let mut fl = head[tcp + 13];
        if i > 0 {
            fl &= !CWR;
        }
        if i + 1 < self.count {
            fl &= !(FIN | PSH);
        }
        seg[tcp + 13] = fl;
        let seq = u32::from_be_bytes([head[tcp + 4], head[tcp + 5], head[tcp + 6], head[tcp + 7]]);
        seg[tcp + 4..tcp + 8].copy_from_slice(&seq.wrapping_add(from as u32).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build;
    use crate::ethernet::MacAddr;
    use crate::ipv4::Ipv4Addr;
    use crate::tcp::TcpOption;
    use etherparse::{Ipv4HeaderSlice, TcpSlice, UdpSlice};
    use proptest::prelude::*;

    fn super_frame(payload: &[u8], flags: u8, options: &[TcpOption], vlan: bool) -> Vec<u8> {
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let (ma, mb) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        let mut frame = build::tcp_frame(
            ma,
            mb,
            a,
            b,
            4000,
            80,
            flags,
            0xffff_f000,
            77,
            options,
            payload,
        );
        frame[14 + 4..14 + 6].copy_from_slice(&0xfffeu16.to_be_bytes());
        if vlan {
            frame.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
        }
        frame
    }

    /// Cuts with `segment` and checks every segment with etherparse: the
    /// sequence number, flags, identification and payload of each.
    fn cut(frame: &[u8], mtu: usize) -> Vec<(u32, u8, u16, Vec<u8>)> {
        let l3 = TcpSuper::parse(frame).expect("a TCP frame").l3;
        let mut f = frame.to_vec();
        let mut out = Vec::new();
        let n = segment(&mut f, mtu, &mut |seg| {
            let ip = Ipv4HeaderSlice::from_slice(&seg[l3..]).expect("IPv4");
            assert_eq!(ip.total_len() as usize, seg.len() - l3);
            assert!(ip.total_len() as usize <= mtu);
            assert_eq!(ip.header_checksum(), ip.to_header().calc_header_checksum());
            let t = TcpSlice::from_slice(&seg[l3 + ip.slice().len()..]).expect("TCP");
            let sum = t.calc_checksum_ipv4(ip.source(), ip.destination()).unwrap();
            assert_eq!(t.checksum(), sum, "TCP checksum");
            let mut fl = 0u8;
            for (bit, on) in [
                (0x01, t.fin()),
                (0x08, t.psh()),
                (0x10, t.ack()),
                (0x80, t.cwr()),
            ] {
                if on {
                    fl |= bit;
                }
            }
            out.push((
                t.sequence_number(),
                fl,
                ip.identification(),
                t.payload().to_vec(),
            ));
        })
        .expect("a super-frame");
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn a_super_frame_becomes_mtu_sized_segments() {
        let payload: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let frame = super_frame(
            &payload,
            0x80 | 0x10 | 0x08 | 0x01,
            &[TcpOption::NoOp; 4],
            false,
        );
        let segs = cut(&frame, 1500);
        // 20 + 24 bytes of headers: 1456 bytes of payload per segment.
        assert_eq!(segs.len(), 10_000usize.div_ceil(1456));
        let mut joined = Vec::new();
        for (i, (seq, fl, ident, data)) in segs.iter().enumerate() {
            assert_eq!(*seq, 0xffff_f000u32.wrapping_add(i as u32 * 1456));
            assert_eq!(*ident, 0xfffeu16.wrapping_add(i as u16));
            let last = i + 1 == segs.len();
            assert_eq!(*fl & 0x09 != 0, last, "FIN and PSH on the last only");
            assert_eq!(*fl & 0x80 != 0, i == 0, "CWR on the first only");
            assert!(*fl & 0x10 != 0);
            joined.extend_from_slice(data);
        }
        assert_eq!(joined, payload);
    }

    #[test]
    fn a_cut_goes_on_where_it_stopped() {
        let payload: Vec<u8> = (0..30_000u32).map(|i| (i % 241) as u8).collect();
        let frame = super_frame(&payload, 0x19, &[], false);
        let whole = cut(&frame, 1500);
        let mut f = frame.clone();
        let mut c = Cutter::new(&f, 1500).unwrap();
        let mut got = Vec::new();
        for max in [0, 3, 1, 7, 100] {
            let before = c.remaining();
            let n = c.cut(&mut f, max, &mut |s| got.push(s[54..].to_vec()));
            assert_eq!(n, max.min(before));
            assert_eq!(c.remaining(), before - n);
        }
        assert_eq!(c.remaining(), 0);
        let want: Vec<Vec<u8>> = whole.into_iter().map(|s| s.3).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn tagged_frames_and_partial_checksums_are_cut_too() {
        let payload = vec![0xa5; 4000];
        let mut frame = super_frame(&payload, 0x10, &[], true);
        // A checksum left partial (Linux over a veth) is replaced.
        let h = TcpSuper::parse(&frame).unwrap();
        assert_eq!(h.l3, 18);
        let partial = h.pseudo_sum(&frame);
        frame[h.l4 + 16..h.l4 + 18].copy_from_slice(&partial.to_be_bytes());
        let segs = cut(&frame, 1500);
        assert_eq!(segs.iter().map(|s| s.3.len()).sum::<usize>(), 4000);
        assert_eq!(segs.len(), 3);
    }

    #[test]
    fn frames_that_are_not_super_tcp_are_left_alone() {
        let small = super_frame(&[1; 100], 0x10, &[], false);
        let mut f = small.clone();
        assert_eq!(segment(&mut f, 1500, &mut |_| panic!("lent")), None);
        assert_eq!(f, small);
        let udp = build::udp_frame(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr::BROADCAST,
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            1,
            2,
            &[0; 3000],
        );
        assert_eq!(
            segment(&mut udp.clone(), 1500, &mut |_| panic!("lent")),
            None
        );
        // A total length beyond the frame, or a header longer than the MTU.
        let mut long = super_frame(&[1; 3000], 0x10, &[], false);
        long.truncate(2000);
        assert_eq!(segment(&mut long, 1500, &mut |_| panic!("lent")), None);
        let mut big = super_frame(&[1; 3000], 0x10, &[], false);
        assert_eq!(segment(&mut big, 30, &mut |_| panic!("lent")), None);
    }

    /// A UDP super-datagram of `payload` from 10.0.0.1:4000 to 10.0.0.2:53,
    /// its checksum left partial as Linux leaves it over a veth.
    fn udp_super(payload: &[u8]) -> Vec<u8> {
        let mut frame = build::udp_frame(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            4000,
            53,
            payload,
        );
        frame[14 + 4..14 + 6].copy_from_slice(&0xfffeu16.to_be_bytes());
        let end = frame.len();
        let partial = checksum::pseudo_sum_in(&frame, 14, 34, end, UDP);
        frame[40..42].copy_from_slice(&partial.to_be_bytes());
        frame
    }

    /// Cuts a UDP super-datagram and checks each datagram with etherparse:
    /// lengths and checksums; returns each one's identification and payload.
    fn cut_udp(frame: &[u8], size: usize, mtu: usize) -> Vec<(u16, Vec<u8>)> {
        let mut f = frame.to_vec();
        let mut c = Cutter::udp(&f, size, mtu).expect("a UDP super-datagram");
        let mut out = Vec::new();
        c.cut(&mut f, usize::MAX, &mut |seg| {
            let ip = Ipv4HeaderSlice::from_slice(&seg[14..]).expect("IPv4");
            assert_eq!(ip.total_len() as usize, seg.len() - 14);
            assert!(ip.total_len() as usize <= mtu);
            assert_eq!(ip.header_checksum(), ip.to_header().calc_header_checksum());
            let u = UdpSlice::from_slice(&seg[34..]).expect("UDP");
            assert_eq!(u.length() as usize, seg.len() - 34);
            let want = u
                .to_header()
                .calc_checksum_ipv4_raw(ip.source(), ip.destination(), u.payload())
                .unwrap();
            assert_eq!(u.checksum(), want, "UDP checksum");
            out.push((ip.identification(), u.payload().to_vec()));
        });
        assert_eq!(c.remaining(), 0);
        out
    }

    #[test]
    fn a_udp_super_datagram_becomes_datagrams_of_the_senders_size() {
        let payload: Vec<u8> = (0..5120u32).map(|i| (i * 13 + i / 97) as u8).collect();
        let frame = udp_super(&payload);
        let dgrams = cut_udp(&frame, 1000, 1500);
        let sizes: Vec<usize> = dgrams.iter().map(|d| d.1.len()).collect();
        assert_eq!(sizes, [1000, 1000, 1000, 1000, 1000, 120]);
        for (i, (ident, data)) in dgrams.iter().enumerate() {
            assert_eq!(*ident, 0xfffeu16.wrapping_add(i as u16));
            assert_eq!(data[..], payload[i * 1000..(i * 1000 + 1000).min(5120)]);
        }
    }

    #[test]
    fn a_udp_checksum_that_sums_to_zero_is_sent_as_all_ones() {
        // Find a payload whose datagrams' first one sums to zero: adjust its
        // last two bytes until the checksum computes as 0 (sent as 0xffff).
        let mut payload = vec![0x11u8; 2000];
        let frame = udp_super(&payload);
        let first = cut_udp(&frame, 1000, 1500);
        assert_eq!(first.len(), 2);
        let mut f = frame.clone();
        let mut c = Cutter::udp(&f, 1000, 1500).unwrap();
        let mut check = 0;
        c.cut(&mut f, 1, &mut |seg| {
            check = u16::from_be_bytes([seg[40], seg[41]])
        });
        // Adding the checksum to the last two payload bytes makes the sum
        // of the datagram all ones, its checksum zero.
        let w = u16::from_be_bytes([payload[998], payload[999]]);
        let fixed = checksum::add(w, check);
        payload[998..1000].copy_from_slice(&fixed.to_be_bytes());
        let mut f = udp_super(&payload);
        let mut c = Cutter::udp(&f, 1000, 1500).unwrap();
        let mut got = Vec::new();
        c.cut(&mut f, usize::MAX, &mut |seg| {
            got.push(u16::from_be_bytes([seg[40], seg[41]]))
        });
        assert_eq!(got[0], 0xffff);
        cut_udp(&udp_super(&payload), 1000, 1500);
    }

    #[test]
    fn udp_frames_that_are_no_super_datagram_are_left_alone() {
        let frame = udp_super(&[7; 3000]);
        // One datagram's worth, a size that does not fit, a size of 0.
        assert!(Cutter::udp(&frame, 3000, 9000).is_none());
        assert!(Cutter::udp(&frame, 1473, 1500).is_none());
        assert!(Cutter::udp(&frame, 0, 1500).is_none());
        // A UDP length that is not the IPv4 packet's.
        let mut bad = frame.clone();
        bad[38..40].copy_from_slice(&100u16.to_be_bytes());
        assert!(Cutter::udp(&bad, 1000, 1500).is_none());
        // TCP is no UDP, nor UDP TCP.
        let tcp = super_frame(&[1; 3000], 0x10, &[], false);
        assert!(Cutter::udp(&tcp, 1000, 1500).is_none());
        assert!(Cutter::new(&frame, 1500).is_none());
        assert!(Cutter::udp(&frame, 1472, 1500).is_some());
    }

    proptest! {
        #[test]
        fn any_frame_is_cut_or_left_without_panicking(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..3000),
            mtu in 0usize..2000,
        ) {
            // Make the front plausible often enough to reach the cutting.
            if bytes.len() > 40 {
                bytes[12..14].copy_from_slice(&[0x08, 0x00]);
                bytes[14] = 0x45;
                bytes[23] = 6;
            }
            let mut lent = 0;
            let _ = segment(&mut bytes, mtu, &mut |s| lent += s.len());
        }

        #[test]
        fn udp_datagrams_carry_the_payload_in_order(
            len in 1usize..20_000,
            size in 1usize..3000,
            mtu in 100usize..9000,
        ) {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut f = udp_super(&payload);
            match Cutter::udp(&f, size, mtu) {
                Some(mut c) => {
                    prop_assert!(len > size && size + 28 <= mtu);
                    let mut joined = Vec::new();
                    c.cut(&mut f, usize::MAX, &mut |s| joined.extend_from_slice(&s[42..]));
                    prop_assert_eq!(joined, payload);
                }
                None => prop_assert!(len <= size || size + 28 > mtu),
            }
        }

        #[test]
        fn any_frame_is_cut_as_udp_or_left_without_panicking(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..3000),
            size in 0usize..2000,
            mtu in 0usize..2000,
        ) {
            if bytes.len() > 40 {
                bytes[12..14].copy_from_slice(&[0x08, 0x00]);
                bytes[14] = 0x45;
                bytes[23] = 17;
            }
            if let Some(mut c) = Cutter::udp(&bytes, size, mtu) {
                c.cut(&mut bytes, usize::MAX, &mut |s| assert!(s.len() <= mtu + 14));
            }
        }

        #[test]
        fn segments_carry_the_payload_in_order(len in 1usize..20_000, mtu in 100usize..9000) {
            let payload: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let ts = TcpOption::Timestamps { tsval: 1, tsecr: 2 };
            let frame = super_frame(&payload, 0x18, &[TcpOption::NoOp, TcpOption::NoOp, ts], false);
            let mut f = frame.clone();
            let mut joined = Vec::new();
            let r = segment(&mut f, mtu, &mut |s| joined.extend_from_slice(&s[14 + 20 + 32..]));
            if len + 52 > mtu {
                prop_assert!(r.is_some());
                prop_assert_eq!(joined, payload);
            } else {
                prop_assert_eq!(r, None);
            }
        }
    }
}
