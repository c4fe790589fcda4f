//! Ethernet II frames (RFC 894 for IPv4 over Ethernet) with up to two IEEE 802.1Q /
//! 802.1ad VLAN tags.

use std::fmt;
use std::str::FromStr;

use crate::field::{get_u16, set_u16};
use crate::WireError;

/// Length of an untagged Ethernet II header: two addresses and the EtherType.
pub const HEADER_LEN: usize = 14;
/// Length of one 802.1Q tag (TPID + TCI).
pub const VLAN_TAG_LEN: usize = 4;
/// Tags parsed before the EtherType is taken as final: 802.1ad "Q-in-Q" uses two, and a
/// bound keeps header parsing constant-time.
pub const MAX_VLAN_TAGS: usize = 2;

/// EtherType values used in this crate.
pub mod ethertype {
    /// IPv4 (RFC 894).
    pub const IPV4: u16 = 0x0800;
    /// ARP (RFC 826).
    pub const ARP: u16 = 0x0806;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
    /// IEEE 802.1Q customer VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// IEEE 802.1ad service VLAN tag (outer tag of Q-in-Q).
    pub const QINQ: u16 = 0x88a8;
    /// Pre-standard Q-in-Q outer tag still seen in the wild.
    pub const QINQ_LEGACY: u16 = 0x9100;

    /// Whether `t` is a TPID announcing a VLAN tag rather than a payload type.
    pub fn is_vlan(t: u16) -> bool {
        matches!(t, VLAN | QINQ | QINQ_LEGACY)
    }
}

/// A 48-bit IEEE MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// The six octets, first transmitted first.
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// All ones.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Group bit (least significant bit of the first octet) set; includes broadcast.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }

    /// Neither multicast nor broadcast.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Parses six hex octets separated by `:` or `-` (one or two digits each).
impl FromStr for MacAddr {
    type Err = WireError;

    fn from_str(s: &str) -> Result<Self, WireError> {
        let sep = if s.contains('-') { '-' } else { ':' };
        let mut out = [0u8; 6];
        let mut parts = s.split(sep);
        for o in &mut out {
            let p = parts.next().ok_or(WireError::BadAddress)?;
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(WireError::BadAddress);
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| WireError::BadAddress)?;
        }
        match parts.next() {
            None => Ok(MacAddr(out)),
            Some(_) => Err(WireError::BadAddress),
        }
    }
}

/// One 802.1Q tag: the TPID that announced it and the decoded Tag Control Information.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// Tag protocol identifier ([`ethertype::VLAN`], [`ethertype::QINQ`], ...).
    pub tpid: u16,
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

impl VlanTag {
    /// A customer tag (TPID 0x8100) with priority 0.
    pub fn new(vid: u16) -> Self {
        VlanTag {
            tpid: ethertype::VLAN,
            pcp: 0,
            dei: false,
            vid,
        }
    }

    fn tci(&self) -> u16 {
        (u16::from(self.pcp) << 13) | (u16::from(self.dei) << 12) | self.vid
    }
}

/// A view of an Ethernet II frame, possibly VLAN-tagged.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps without validation; getters may panic on a short buffer. Prefer
    /// [`EthernetFrame::new_checked`] for untrusted input.
    #[inline]
    pub fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps after checking that the header and every VLAN tag it announces are present.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let mut n = 0;
        while n < MAX_VLAN_TAGS && ethertype::is_vlan(get_u16(b, 12 + n * VLAN_TAG_LEN)) {
            n += 1;
            if b.len() < HEADER_LEN + n * VLAN_TAG_LEN {
                return Err(WireError::Truncated);
            }
        }
        Ok(EthernetFrame { buffer })
    }

    /// The wrapped buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[0..6]);
        MacAddr(a)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[6..12]);
        MacAddr(a)
    }

    /// Number of VLAN tags (0..=[`MAX_VLAN_TAGS`]).
    #[inline]
    pub fn vlan_count(&self) -> usize {
        let b = self.buffer.as_ref();
        (0..MAX_VLAN_TAGS)
            .take_while(|&i| ethertype::is_vlan(get_u16(b, 12 + i * VLAN_TAG_LEN)))
            .count()
    }

    /// Tag `i`, outermost first.
    #[inline]
    pub fn vlan(&self, i: usize) -> Option<VlanTag> {
        if i >= self.vlan_count() {
            return None;
        }
        let b = self.buffer.as_ref();
        let at = 12 + i * VLAN_TAG_LEN;
        let tci = get_u16(b, at + 2);
        Some(VlanTag {
            tpid: get_u16(b, at),
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        })
    }

    /// The outermost tag's VLAN id, if tagged.
    #[inline]
    pub fn vlan_id(&self) -> Option<u16> {
        self.vlan(0).map(|t| t.vid)
    }

    /// Header length including tags: where the payload starts.
    #[inline]
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.vlan_count() * VLAN_TAG_LEN
    }

    /// The EtherType of the payload, after any VLAN tags.
    #[inline]
    pub fn ethertype(&self) -> u16 {
        get_u16(self.buffer.as_ref(), self.header_len() - 2)
    }

    /// Everything after the header (including any Ethernet padding).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[0..6].copy_from_slice(&a.0);
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[6..12].copy_from_slice(&a.0);
    }

    /// Sets the payload EtherType (the one after the existing tags).
    #[inline]
    pub fn set_ethertype(&mut self, t: u16) {
        let at = self.header_len() - 2;
        set_u16(self.buffer.as_mut(), at, t);
    }

    /// Mutable payload.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let at = self.header_len();
        &mut self.buffer.as_mut()[at..]
    }
}

/// Header fields to emit; tags are listed outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr<'a> {
    /// Destination address.
    pub dst: MacAddr,
    /// Source address.
    pub src: MacAddr,
    /// VLAN tags, outermost first (at most [`MAX_VLAN_TAGS`]).
    pub vlans: &'a [VlanTag],
    /// Payload EtherType.
    pub ethertype: u16,
}

impl EthernetRepr<'_> {
    /// Bytes [`EthernetRepr::emit`] writes.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.vlans.len() * VLAN_TAG_LEN
    }

    /// Writes the header into the front of `buf`.
    ///
    /// Errors: `Unsupported` for more than [`MAX_VLAN_TAGS`] tags or a tag whose TPID is
    /// not a VLAN TPID (the parser would not see it); `BadLength` for a VID or PCP that
    /// does not fit its field; `Truncated` if `buf` is shorter than the header.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if self.vlans.len() > MAX_VLAN_TAGS
            || self.vlans.iter().any(|v| !ethertype::is_vlan(v.tpid))
        {
            return Err(WireError::Unsupported);
        }
        if self.vlans.iter().any(|v| v.vid > 0x0fff || v.pcp > 7) {
            return Err(WireError::BadLength);
        }
        if buf.len() < self.header_len() {
            return Err(WireError::Truncated);
        }
        buf[0..6].copy_from_slice(&self.dst.0);
        buf[6..12].copy_from_slice(&self.src.0);
        let mut at = 12;
        for v in self.vlans {
            set_u16(buf, at, v.tpid);
            set_u16(buf, at + 2, v.tci());
            at += VLAN_TAG_LEN;
        }
        set_u16(buf, at, self.ethertype);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_text_round_trip() {
        let m: MacAddr = "02:00:5e:10:00:ff".parse().unwrap();
        assert_eq!(m.0, [2, 0, 0x5e, 0x10, 0, 0xff]);
        assert_eq!(m.to_string(), "02:00:5e:10:00:ff");
        assert_eq!("2-0-5E-10-0-FF".parse::<MacAddr>().unwrap(), m);
        for bad in [
            "",
            "1:2:3:4:5",
            "1:2:3:4:5:6:7",
            "01:02:03:04:05:0g",
            "001:2:3:4:5:6",
            "1::3:4:5:6",
        ] {
            assert!(
                matches!(bad.parse::<MacAddr>(), Err(WireError::BadAddress)),
                "{bad}"
            );
        }
        assert!(MacAddr::BROADCAST.is_broadcast() && MacAddr::BROADCAST.is_multicast());
        assert!(m.is_unicast());
    }

    #[test]
    fn qinq_frame() {
        let tags = [
            VlanTag {
                tpid: ethertype::QINQ,
                pcp: 5,
                dei: true,
                vid: 100,
            },
            VlanTag::new(4095),
        ];
        let repr = EthernetRepr {
            dst: MacAddr::BROADCAST,
            src: MacAddr([2, 0, 0, 0, 0, 1]),
            vlans: &tags,
            ethertype: ethertype::IPV4,
        };
        let mut buf = vec![0u8; repr.header_len() + 3];
        repr.emit(&mut buf).unwrap();
        let f = EthernetFrame::new_checked(&buf[..]).unwrap();
        assert_eq!(f.header_len(), 22);
        assert_eq!(f.vlan(0), Some(tags[0]));
        assert_eq!(f.vlan(1), Some(tags[1]));
        assert_eq!(f.vlan(2), None);
        assert_eq!(f.vlan_id(), Some(100));
        assert_eq!(f.ethertype(), ethertype::IPV4);
        assert_eq!(f.payload().len(), 3);
        // A tag announced but cut off is truncation, not a short payload.
        assert!(matches!(
            EthernetFrame::new_checked(&buf[..20]),
            Err(WireError::Truncated)
        ));
    }

    #[test]
    fn setters() {
        let mut buf = [0u8; 18];
        set_u16(&mut buf, 12, ethertype::VLAN);
        let mut f = EthernetFrame::new_checked(&mut buf[..]).unwrap();
        f.set_ethertype(ethertype::ARP);
        f.set_src_addr(MacAddr([1; 6]));
        f.set_dst_addr(MacAddr([2; 6]));
        assert_eq!(
            (f.ethertype(), f.vlan_id(), f.src_addr(), f.dst_addr()),
            (ethertype::ARP, Some(0), MacAddr([1; 6]), MacAddr([2; 6]))
        );
        assert!(f.payload_mut().is_empty());
    }
}
