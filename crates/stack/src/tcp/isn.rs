//! Initial sequence numbers per RFC 6528 §3: ISN = M + F(localip, localport,
//! remoteip, remoteport, secretkey), where M is a clock ticking every 4 µs and F a
//! keyed pseudorandom function, here SipHash-2-4 (RFC 6528 suggests MD5; any PRF
//! whose key an off-path attacker cannot learn serves). The key and the time are
//! inputs, so the caller owns the secret and the clock.

use std::net::SocketAddrV4;

use super::seq::SeqNum;
use crate::Time;

/// The ISN for a connection between `local` and `remote` at `now` under `key`. The key
/// should be random, kept secret and fixed for the host's uptime, so that successive
/// connections of one 4-tuple get ISNs that advance with the clock (RFC 6528 §3)
/// while other 4-tuples' are unpredictable.
pub fn initial_sequence_number(
    key: &[u8; 16],
    local: SocketAddrV4,
    remote: SocketAddrV4,
    now: Time,
) -> SeqNum {
    let mut msg = [0u8; 12];
    msg[..4].copy_from_slice(&local.ip().octets());
    msg[4..6].copy_from_slice(&local.port().to_be_bytes());
    msg[6..10].copy_from_slice(&remote.ip().octets());
    msg[10..].copy_from_slice(&remote.port().to_be_bytes());
    // M: the 4 µs timer of RFC 6528 §3 (and RFC 793), truncated to 32 bits.
    let m = (now.as_nanos() / 4_000) as u32;
    SeqNum(m.wrapping_add(siphash24(key, &msg) as u32))
}

/// A random offset for a connection's timestamp clock (RFC 7323 §5.4, for
/// [`super::Connection::with_timestamp_offset`]): the same keyed function as the ISN's,
/// over the 4-tuple and a distinct tag, so that TSvals leak neither the host's uptime
/// nor the ISN.
pub fn timestamp_offset(key: &[u8; 16], local: SocketAddrV4, remote: SocketAddrV4) -> u32 {
    let mut msg = [0u8; 15];
    msg[..4].copy_from_slice(&local.ip().octets());
    msg[4..6].copy_from_slice(&local.port().to_be_bytes());
    msg[6..10].copy_from_slice(&remote.ip().octets());
    msg[10..12].copy_from_slice(&remote.port().to_be_bytes());
    msg[12..].copy_from_slice(b"tsc");
    (siphash24(key, &msg) >> 32) as u32
}

/// SipHash-2-4 (Aumasson and Bernstein, 2012).
pub(super) fn siphash24(key: &[u8; 16], msg: &[u8]) -> u64 {
    let k0 = u64::from_le_bytes(key[..8].try_into().expect("8 bytes"));
    let k1 = u64::from_le_bytes(key[8..].try_into().expect("8 bytes"));
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let compress = |m: u64, v: &mut [u64; 4]| {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    };
    let chunks = msg.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        compress(u64::from_le_bytes(c.try_into().expect("8 bytes")), &mut v);
    }
    let mut last = [0u8; 8];
    last[..rest.len()].copy_from_slice(rest);
    last[7] = msg.len() as u8;
    compress(u64::from_le_bytes(last), &mut v);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn siphash_reference_vectors() {
        // The paper's Appendix A vector and the reference implementation's first ones.
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let msg: Vec<u8> = (0..15).collect();
        assert_eq!(siphash24(&key, &msg), 0xa129_ca61_49be_45e5);
        assert_eq!(siphash24(&key, &[]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash24(&key, &msg[..8]), 0x93f5_f579_9a93_2462);
    }

    #[test]
    fn isn_moves_with_clock_and_differs_by_tuple_and_key() {
        let a = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
        let b = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80);
        let c = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 81);
        let key = [7u8; 16];
        let t0 = initial_sequence_number(&key, a, b, Time::ZERO);
        let t1 = initial_sequence_number(&key, a, b, Time::from_millis(1));
        // 1 ms is 250 ticks of the 4 µs clock.
        assert_eq!(t1.diff(t0), 250);
        assert_ne!(initial_sequence_number(&key, a, c, Time::ZERO), t0);
        assert_ne!(initial_sequence_number(&[8; 16], a, b, Time::ZERO), t0);
    }
}
