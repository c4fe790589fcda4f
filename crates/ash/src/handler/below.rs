//! Trusted protocol layers below a downloaded handler (§2.3): with
//! [`Below::Udp`], the multiplexer checks the Ethernet, IPv4 and UDP
//! headers, the handler sees only the UDP payload as its message, and the
//! UDP checksum is computed in the same loops that move the payload: every
//! pipe list of the handler runs with the checksum pipe in front of its own
//! pipes ([`transfer_for`]). Bytes the handler did not move through a pipe
//! list are checksummed after it returns; a datagram whose checksum fails
//! is then dropped and the handler's sends discarded (what it already
//! wrote to its window is its own concern, as an abort's is in §3.2).

use std::ops::Range;

use crate::layer::{ipv4_header, udp_header, Disposition, LayerError, ETHER_HEADER};
use crate::pipe::{builtins, Compiled, PipeError, PipeList};
use crate::Transfer;

/// What runs below a handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Below {
    /// Nothing: the handler sees the whole frame.
    #[default]
    Nothing,
    /// Ethernet, IPv4 and UDP: the handler sees the UDP payload of frames
    /// that are unfragmented UDP over IPv4 (others are delivered without
    /// running it), and the UDP checksum is verified.
    Udp,
}

/// Compiles `list` for a handler with `below` under it: for UDP, with the
/// checksum pipe in front (the handler still numbers its pipes from 0).
pub fn transfer_for(below: Below, list: &PipeList) -> Result<Box<dyn Transfer>, PipeError> {
    match below {
        Below::Nothing => Ok(Box::new(list.compile()?)),
        Below::Udp => checksummed(list.pipes()),
    }
}

fn checksummed(pipes: &[crate::pipe::Pipe]) -> Result<Box<dyn Transfer>, PipeError> {
    let mut all = vec![builtins::checksum()];
    all.extend_from_slice(pipes);
    Ok(Box::new(Checksummed(PipeList::new(all)?.compile()?)))
}

/// A compiled list whose pipe 0 is the UDP checksum, hidden from the
/// handler's numbering.
struct Checksummed(Compiled);

impl Transfer for Checksummed {
    fn transfer(&mut self, src: &[u8], dst: &mut [u8]) {
        self.0.transfer(src, dst);
    }

    fn reg(&self, pipe: usize, reg: usize) -> Option<u64> {
        self.0.reg(pipe.checked_add(1)?, reg)
    }

    fn set_reg(&mut self, pipe: usize, reg: usize, value: u64) -> bool {
        pipe.checked_add(1)
            .is_some_and(|p| self.0.set_reg(p, reg, value))
    }

    fn cost(&self, n: usize) -> u64 {
        self.0.cost(n)
    }

    fn take_checksum(&mut self) -> Option<u64> {
        let sum = self.0.reg(0, 0);
        self.0.set_reg(0, 0, 0);
        sum
    }
}

/// A datagram's checksum as the handler moves its payload.
pub(crate) struct UdpAccount {
    /// A plain copy with the checksum, for `consume_window` without a
    /// pipe list.
    pub copy: Box<dyn Transfer>,
    /// The pseudo-header's and header's sum; `None` if the datagram
    /// carries no checksum.
    seed: Option<u64>,
    /// Payload ranges moved through a pipe list, and their sums.
    parts: Vec<(Range<usize>, u64)>,
}

/// What the layers below made of a frame.
pub(crate) enum Datagram {
    /// The UDP payload's range in the frame.
    Payload(Range<usize>),
    /// Not for the handler: deliver, or drop (corrupt headers).
    Refused(Disposition),
}

impl UdpAccount {
    pub fn new() -> Result<UdpAccount, PipeError> {
        Ok(UdpAccount {
            copy: checksummed(&[])?,
            seed: None,
            parts: Vec::new(),
        })
    }

    /// Checks `frame`'s headers and starts its account.
    pub fn start(&mut self, frame: &[u8]) -> Datagram {
        let refused = |e: LayerError| Datagram::Refused(e.disposition);
        let ip = match ipv4_header(frame) {
            Ok(ip) => ip,
            Err(e) => return refused(e),
        };
        let l4 = ETHER_HEADER + ip.ihl;
        let udp = match udp_header(&ip.meta, &frame[l4..ETHER_HEADER + ip.total]) {
            Ok(u) => u,
            Err(e) => return refused(e),
        };
        self.seed = udp.seed;
        self.parts.clear();
        Datagram::Payload(l4 + 8..l4 + udp.len)
    }

    /// A pipe list moved `range` of the payload, whose checksum
    /// accumulator is `sum`.
    pub fn moved(&mut self, range: Range<usize>, sum: u64) {
        if self.seed.is_some() {
            self.parts.push((range, sum));
        }
    }

    /// Whether `payload`'s checksum verifies: the parts moved through pipe
    /// lists, each placed at its offset (RFC 1071 §2(B): a part at an odd
    /// offset counts byte-swapped), and the gaps between them summed now.
    /// Parts that overlap (the handler sought back) make it sum the whole
    /// payload instead.
    pub fn verify(&mut self, payload: &[u8]) -> bool {
        let Some(seed) = self.seed else {
            return true;
        };
        self.parts.sort_unstable_by_key(|(r, _)| r.start);
        let overlap = self.parts.windows(2).any(|w| w[0].0.end > w[1].0.start);
        let mut acc = seed;
        if overlap {
            acc = builtins::checksum_accumulate(acc, payload);
        } else {
            let mut at = 0;
            for (r, sum) in &self.parts {
                let gap = builtins::checksum_accumulate(0, &payload[at..r.start]);
                acc = builtins::add_carry(acc, placed(gap, at));
                acc = builtins::add_carry(acc, placed(*sum, r.start));
                at = r.end;
            }
            let rest = builtins::checksum_accumulate(0, &payload[at..]);
            acc = builtins::add_carry(acc, placed(rest, at));
        }
        builtins::fold_checksum(acc) == 0
    }
}

/// An accumulator folded to 16 bits, byte-swapped if its bytes start at an
/// odd offset.
fn placed(acc: u64, at: usize) -> u64 {
    let s = builtins::fold16(acc);
    u64::from(if at % 2 == 1 { s.swap_bytes() } else { s })
}
