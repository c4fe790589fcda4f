//! IPv4 fragmentation on send (RFC 791 §2.3 "Fragmentation", §3.2 "An Example
//! Fragmentation Procedure").

use std::fmt;

use exonet_wire::ipv4::MIN_HEADER_LEN;
use exonet_wire::{Ipv4Packet, WireError};

/// Why a datagram could not be fragmented.
#[derive(Debug)]
pub enum FragError {
    /// The datagram is larger than the MTU and has DF set; the sender should learn the
    /// MTU (RFC 1191: ICMP "fragmentation needed" carries it).
    DontFragment {
        /// The MTU the datagram did not fit.
        mtu: usize,
    },
    /// The MTU cannot carry a header plus 8 bytes of data (RFC 791 requires every
    /// link to carry 68 bytes, which is always enough).
    MtuTooSmall {
        /// The MTU asked for.
        mtu: usize,
    },
    /// The datagram is not a well-formed IPv4 datagram, or its options are malformed.
    Malformed(WireError),
}

impl fmt::Display for FragError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FragError::DontFragment { mtu } => {
                write!(f, "datagram exceeds the MTU of {mtu} bytes and has DF set")
            }
            FragError::MtuTooSmall { mtu } => write!(f, "MTU of {mtu} bytes is too small"),
            FragError::Malformed(e) => write!(f, "malformed datagram: {e}"),
        }
    }
}

impl std::error::Error for FragError {}

/// Splits `datagram` (a whole IPv4 datagram, header included; the buffer may extend
/// past its total length) into fragments of at most `mtu` bytes, each with its header
/// checksum. A datagram that fits is returned as one piece, unchanged. A datagram that
/// is itself a fragment is split further, keeping its offset and its MF flag on the
/// last piece, as a router would.
pub fn fragment(datagram: &[u8], mtu: usize) -> Result<Vec<Vec<u8>>, FragError> {
    let p = Ipv4Packet::new_checked(datagram).map_err(FragError::Malformed)?;
    let total = usize::from(p.total_len());
    if total <= mtu {
        return Ok(vec![datagram[..total].to_vec()]);
    }
    if p.dont_frag() {
        return Err(FragError::DontFragment { mtu });
    }
    let first_hl = p.header_len();
    let later_options = copied_options(p.options())?;
    let later_hl = MIN_HEADER_LEN + later_options.len();
    // "the fragment offset field is measured in units of 8 octets" (RFC 791 §3.1), so
    // every fragment but the last carries a multiple of 8 bytes.
    let room = |hl: usize| mtu.saturating_sub(hl) & !7;
    if room(first_hl) == 0 || room(later_hl) == 0 {
        return Err(FragError::MtuTooSmall { mtu });
    }
    let payload = p.payload();
    let base = usize::from(p.frag_offset());
    let mut out = Vec::with_capacity(payload.len() / room(later_hl) + 2);
    let mut done = 0;
    while done < payload.len() {
        let first = done == 0;
        let hl = if first { first_hl } else { later_hl };
        let len = room(hl).min(payload.len() - done);
        let last = done + len == payload.len();
        let mut buf = vec![0; hl + len];
        buf[..MIN_HEADER_LEN].copy_from_slice(&datagram[..MIN_HEADER_LEN]);
        if first {
            // The first fragment keeps every option (RFC 791 §3.2 step 1).
            buf[MIN_HEADER_LEN..hl].copy_from_slice(p.options());
        } else {
            buf[MIN_HEADER_LEN..hl].copy_from_slice(&later_options);
        }
        buf[hl..].copy_from_slice(&payload[done..done + len]);
        let mut f = Ipv4Packet::new_unchecked(&mut buf[..]);
        f.set_version_and_header_len(4, hl);
        // Both fit in 16 bits: they are at most the original total length.
        f.set_total_len((hl + len) as u16);
        let more = !last || p.more_frags();
        f.set_frag(false, more, (base + done) as u16);
        f.fill_checksum();
        out.push(buf);
        done += len;
    }
    Ok(out)
}

/// The options a non-first fragment carries: those whose copied flag (the type's
/// top bit) is set (RFC 791 §3.1 "Options"), padded with End of Option List to a
/// multiple of 4 bytes.
fn copied_options(options: &[u8]) -> Result<Vec<u8>, FragError> {
    const END: u8 = 0;
    const NOP: u8 = 1;
    const COPIED: u8 = 0x80;
    let mut out = Vec::new();
    let mut rest = options;
    while let Some(&kind) = rest.first() {
        match kind {
            END => break,
            NOP => rest = &rest[1..],
            _ => {
                let len = usize::from(*rest.get(1).unwrap_or(&0));
                if len < 2 || len > rest.len() {
                    return Err(FragError::Malformed(WireError::BadLength));
                }
                if kind & COPIED != 0 {
                    out.extend_from_slice(&rest[..len]);
                }
                rest = &rest[len..];
            }
        }
    }
    out.resize(out.len().next_multiple_of(4), END);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use exonet_wire::ipv4::protocol;
    use exonet_wire::rng::SplitMix64;
    use exonet_wire::{Ipv4Addr, Ipv4Repr};
    use proptest::prelude::*;

    use crate::{ReasmConfig, Reassembler, Time};

    fn datagram(options: &[u8], payload_len: usize, dont_frag: bool) -> Vec<u8> {
        let repr = Ipv4Repr {
            ident: 0x4242,
            dont_frag,
            options,
            ..Ipv4Repr::new(
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(10, 0, 0, 2),
                protocol::UDP,
                payload_len,
            )
        };
        let mut buf = vec![0; repr.total_len()];
        repr.emit(&mut buf).unwrap();
        for (i, b) in buf[repr.header_len()..].iter_mut().enumerate() {
            *b = i as u8;
        }
        buf
    }

    #[test]
    fn rfc791_example_and_options() {
        // Security (0x82, copied) then record route (0x07, not copied), padded.
        let opts = [
            0x82, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x07, 7, 4, 0, 0, 0, 0, 0, 0,
        ];
        let d = datagram(&opts, 1000, false);
        let frags = fragment(&d, 576).unwrap();
        let views: Vec<_> = frags
            .iter()
            .map(|f| Ipv4Packet::new_checked(&f[..]).unwrap())
            .collect();
        assert_eq!(views.len(), 2);
        assert!(views
            .iter()
            .all(|v| v.verify_checksum() && v.ident() == 0x4242));
        assert_eq!(views[0].options(), &opts[..]);
        assert_eq!(views[0].payload().len(), 536); // 576 - 40, a multiple of 8
        assert!(views[0].more_frags() && views[0].frag_offset() == 0);
        assert_eq!(
            views[1].options(),
            &[0x82, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert!(!views[1].more_frags() && views[1].frag_offset() == 536);
        assert_eq!(views[1].payload(), &d[40 + 536..]);
    }

    #[test]
    fn refusals() {
        let d = datagram(&[], 1000, true);
        assert_eq!(fragment(&d, 1020).unwrap(), vec![d.clone()]);
        let e = fragment(&d, 1000).unwrap_err();
        assert!(matches!(e, FragError::DontFragment { mtu: 1000 }));
        assert!(e.to_string().contains("1000"));
        let d = datagram(&[], 1000, false);
        assert!(matches!(
            fragment(&d, 27),
            Err(FragError::MtuTooSmall { mtu: 27 })
        ));
        assert_eq!(fragment(&d, 28).unwrap().len(), 125);
        let bad = datagram(&[0x83, 9, 0, 0], 100, false);
        assert!(matches!(fragment(&bad, 68), Err(FragError::Malformed(_))));
        assert!(matches!(
            fragment(&d[..30], 68),
            Err(FragError::Malformed(_))
        ));
    }

    #[test]
    fn refragmenting_a_fragment_keeps_offset_and_mf() {
        let d = datagram(&[], 3000, false);
        let frags = fragment(&d, 1500).unwrap();
        let again = fragment(&frags[0], 576).unwrap();
        let views: Vec<_> = again
            .iter()
            .map(|f| Ipv4Packet::new_checked(&f[..]).unwrap())
            .collect();
        assert!(views.iter().all(|v| v.more_frags()));
        let mid = fragment(&frags[1], 576).unwrap();
        assert_eq!(
            Ipv4Packet::new_checked(&mid[0][..]).unwrap().frag_offset(),
            1480
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Every fragment is a valid datagram within the MTU; reassembled in any order
        /// they give back the original.
        #[test]
        fn fragment_then_reassemble(
            len in prop_oneof![0usize..10_000, 0usize..=65_475],
            mtu in 68usize..=9000,
            opts in 0usize..3,
            seed: u64,
        ) {
            // None; a copied option (security); a non-copied one (timestamp) filling
            // the header to 60 bytes.
            let options: &[u8] = match opts {
                0 => &[],
                1 => &[0x82, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                _ => &[0x44, 40, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            };
            let len = len.min(65_515 - options.len());
            let d = datagram(options, len, false);
            let mut frags = fragment(&d, mtu).unwrap();
            for (i, f) in frags.iter().enumerate() {
                let v = Ipv4Packet::new_checked(&f[..]).unwrap();
                prop_assert!(v.verify_checksum() && f.len() <= mtu && f.len() == usize::from(v.total_len()));
                prop_assert_eq!(v.more_frags(), i + 1 < frags.len());
                prop_assert!(!v.more_frags() || v.payload().len().is_multiple_of(8));
            }
            SplitMix64::new(seed).shuffle(&mut frags);
            let mut r = Reassembler::new(ReasmConfig { max_fragments: 8192, ..ReasmConfig::default() });
            let mut out = None;
            for f in &frags {
                let got = r.input(Time::ZERO, &Ipv4Packet::new_checked(&f[..]).unwrap()).unwrap();
                if got.is_some() {
                    prop_assert!(out.is_none());
                    out = got;
                }
            }
            prop_assert_eq!(out, Some(d));
        }
    }
}
