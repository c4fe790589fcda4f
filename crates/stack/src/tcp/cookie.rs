//! SYN cookies (RFC 4987 §3.6): when a listener's SYN queue is full, the SYN-ACK's
//! ISS carries what the handshake needs and the listener keeps nothing; the ACK
//! that returns ISS + 1 proves the peer got it, and the connection is made then.
//!
//! The cookie, in the layout RFC 4987 §3.6 describes (D. J. Bernstein's): the
//! top 5 bits are a counter of 64-second ticks modulo 32, the next 3
//! index [`MSS_TABLE`] (the largest entry not above the peer's MSS and ours), and
//! the low 24 are a MAC: SipHash-2-4 under the stack's secret over the 4-tuple,
//! the peer's ISN, the whole counter and the MSS index. A cookie is good in the
//! tick it was made and the next (64 to 128 s). A blind guess passes about once
//! in 2^23 tries (24 bits of MAC, two ticks good), and the socket layer checks
//! ACKs for cookies only while its listener sends them, or while the link
//! answers its SYNs (`exonet_link::afxdp` makes the same cookies in its XDP
//! program).
//!
//! The other SYN options have no room in 32 bits. If the SYN offered timestamps
//! (RFC 7323 §3), as Linux does, the low 5 bits of our TSval carry the peer's
//! window scale (4 bits, 15 for none) and SACK-permitted (1 bit), and come back
//! in the ACK's TSecr; the TSval is rounded down for them, so our clock never
//! goes back. These bits are not covered by the MAC (nor are they in Linux): a
//! peer that alters them only spoils its own connection. Without timestamps the
//! SYN-ACK offers neither window scaling nor SACK, and the connection goes
//! without them.
//!
//! The connection starts from the ACK alone, so that ACK (or the first data
//! segment, which acknowledges the same) must come first, its SEG.SEQ one past
//! the peer's ISN: a later segment overtaking both finds no cookie and, in the
//! socket layer, gets the RST of RFC 9293 §3.10.7.2 for an ACK to LISTEN, as in
//! Linux.

use std::net::SocketAddrV4;
use std::time::Duration;

use exonet_wire::tcp::{flags, TcpOption};
use exonet_wire::{TcpPacket, TcpRepr};

use super::connection::{
    mss_option, sack_permitted_option, ts_option, wscale_option, Connection, SynOptions, TcpConfig,
    DEFAULT_MSS, MIN_MSS,
};
use super::isn::{siphash24, timestamp_offset};
use super::seq::SeqNum;
use crate::Time;

/// The cookie counter's tick (Linux's: 64 s).
const TICK_SECS: u64 = 64;
/// How many ticks a cookie outlives the one it was made in.
const MAX_AGE: u32 = 1;
/// The longest a cookie stays good: a listener that sent none for this long need
/// not check ACKs for one (Linux's `tcp_synq_no_recent_overflow`).
pub const SYN_COOKIE_LIFETIME: Duration = Duration::from_secs(TICK_SECS * (MAX_AGE as u64 + 1));
/// The MSS values a cookie can carry: common ones (RFC 9293 §3.7.1's default 536,
/// IPv6-tunnelled 1220, PPPoE and VPN 1400 and 1440, Ethernet 1460, 9000-byte
/// jumbo frames), 256, and the floor a connection puts under any peer's MSS, so
/// that no offer is exceeded.
const MSS_TABLE: [u16; 8] = [MIN_MSS, 256, 536, 1220, 1400, 1440, 1460, 8960];
/// Bits of the 32-bit cookie: the counter's, the MSS index's, the MAC's.
const COUNTER_SHIFT: u32 = 27;
const MSS_SHIFT: u32 = 24;
const MAC_MASK: u32 = (1 << MSS_SHIFT) - 1;
/// The low bits of the cookie's TSval: the peer's window scale, or none, and
/// SACK-permitted.
const TS_BITS: u32 = 5;
const TS_MASK: u32 = (1 << TS_BITS) - 1;
const TS_WSCALE_MASK: u32 = 0xf;
const TS_WSCALE_NONE: u32 = 0xf;
const TS_SACK: u32 = 1 << 4;

fn tick(now: Time) -> u32 {
    (now.as_nanos() / 1_000_000_000 / TICK_SECS) as u32
}

fn mac(
    key: &[u8; 16],
    local: SocketAddrV4,
    remote: SocketAddrV4,
    peer_isn: SeqNum,
    tick: u32,
    mss_index: u32,
) -> u32 {
    let mut msg = [0u8; 24];
    msg[..4].copy_from_slice(&local.ip().octets());
    msg[4..6].copy_from_slice(&local.port().to_be_bytes());
    msg[6..10].copy_from_slice(&remote.ip().octets());
    msg[10..12].copy_from_slice(&remote.port().to_be_bytes());
    msg[12..16].copy_from_slice(&peer_isn.0.to_be_bytes());
    msg[16..20].copy_from_slice(&tick.to_be_bytes());
    msg[20] = mss_index as u8;
    // A tag of its own, so that no ISN or timestamp offset is a cookie's MAC.
    msg[21..].copy_from_slice(b"syn");
    siphash24(key, &msg) as u32 & MAC_MASK
}

/// The cookie for a SYN from `remote` with ISN `peer_isn` whose MSS, clamped to
/// ours, is `mss`, and the MSS it encodes.
pub(super) fn encode(
    key: &[u8; 16],
    local: SocketAddrV4,
    remote: SocketAddrV4,
    peer_isn: SeqNum,
    mss: u16,
    now: Time,
) -> (SeqNum, u16) {
    let index = MSS_TABLE.iter().rposition(|&m| m <= mss).unwrap_or(0);
    let t = tick(now);
    let cookie = (t << COUNTER_SHIFT)
        | ((index as u32) << MSS_SHIFT)
        | mac(key, local, remote, peer_isn, t, index as u32);
    (SeqNum(cookie), MSS_TABLE[index])
}

/// The MSS `cookie` encodes, if it is one of ours for this 4-tuple and peer ISN
/// made in this tick or the last.
pub(super) fn decode(
    key: &[u8; 16],
    local: SocketAddrV4,
    remote: SocketAddrV4,
    peer_isn: SeqNum,
    cookie: SeqNum,
    now: Time,
) -> Option<u16> {
    let (low, index) = (cookie.0 >> COUNTER_SHIFT, (cookie.0 >> MSS_SHIFT) & 7);
    let now = tick(now);
    (0..=MAX_AGE)
        .filter_map(|age| now.checked_sub(age))
        .find(|&t| {
            t & (u32::MAX >> COUNTER_SHIFT) == low
                && mac(key, local, remote, peer_isn, t, index) == cookie.0 & MAC_MASK
        })
        .map(|_| MSS_TABLE[index as usize])
}

/// Our clock's TSval `clock` with the peer's window scale and SACK-permitted in
/// its low bits, not after `clock`: the TSvals we send later come from the clock
/// and must not be older, or the peer's PAWS (RFC 7323 §5) would drop them.
pub(super) fn encode_ts(clock: u32, wscale: Option<u8>, sack: bool) -> u32 {
    let bits =
        wscale.map_or(TS_WSCALE_NONE, |s| u32::from(s.min(14))) | if sack { TS_SACK } else { 0 };
    let ts = (clock & !TS_MASK) | bits;
    if bits > clock & TS_MASK {
        ts.wrapping_sub(1 << TS_BITS)
    } else {
        ts
    }
}

/// The window scale and SACK-permitted a cookie's TSval, echoed, carries.
pub(super) fn decode_ts(tsecr: u32) -> (Option<u8>, bool) {
    let wscale = tsecr & TS_WSCALE_MASK;
    (
        (wscale != TS_WSCALE_NONE).then_some(wscale as u8),
        tsecr & TS_SACK != 0,
    )
}

/// Writes into `buf` (60 bytes at least) the SYN-ACK with a cookie that answers
/// `syn`, a SYN from `remote` to our `local` (see the module doc), and returns its
/// length; `None` if `syn` is not a SYN (ACK or RST set) or `buf` is short. The
/// caller adds the IPv4 header. `config` is the listener's, its MSS clamped to the
/// path; `key` the stack's secret, the same as for [`syn_cookie_accept`].
pub fn syn_cookie_reply(
    config: &TcpConfig,
    key: &[u8; 16],
    local: SocketAddrV4,
    remote: SocketAddrV4,
    syn: &TcpRepr,
    now: Time,
    buf: &mut [u8],
) -> Option<usize> {
    let mut config = config.clone();
    let ts = ts_option(syn).filter(|_| config.timestamps);
    if ts.is_none() {
        // Nowhere to remember them: offered, they would be agreed by the peer
        // and not by us.
        config.window_scaling = false;
        config.sack = false;
    }
    let mss = mss_option(syn).unwrap_or(DEFAULT_MSS).min(config.mss);
    let (iss, _) = encode(key, local, remote, SeqNum(syn.seq_number), mss, now);
    let offset = timestamp_offset(key, local, remote);
    let c = Connection::accept(config, local, remote, iss, syn)?.with_timestamp_offset(offset);
    let mut c = if ts.is_some() {
        let clock = c.ts_now(now);
        let tsval = encode_ts(clock, wscale_option(syn), sack_permitted_option(syn));
        // The SYN-ACK's TSval is the clock's at `now`: set back to the cookie's.
        c.with_timestamp_offset(offset.wrapping_sub(clock.wrapping_sub(tsval)))
    } else {
        c
    };
    c.poll_transmit(now, buf)
}

/// What a cookie's SYN-ACK of a listener with `config` says to a SYN that
/// offers every option (as Linux's does): its window field, the window scale
/// it offers and whether it permits SACK. A link that answers SYNs for the
/// listener (`link_syn_cookies`) says the same. `None` if the listener
/// would not answer such a SYN.
pub fn syn_ack_shape(config: &TcpConfig) -> Option<(u16, Option<u8>, bool)> {
    let local = SocketAddrV4::new(std::net::Ipv4Addr::new(192, 0, 2, 1), 1);
    let remote = SocketAddrV4::new(std::net::Ipv4Addr::new(192, 0, 2, 2), 2);
    let mut options = [0u8; 20];
    let Ok(n) = exonet_wire::tcp::write_options(
        &[
            TcpOption::Mss(u16::MAX),
            TcpOption::SackPermitted,
            TcpOption::Timestamps { tsval: 1, tsecr: 0 },
            TcpOption::NoOp,
            TcpOption::WindowScale(7),
        ],
        &mut options,
    ) else {
        return None;
    };
    let syn = TcpRepr {
        src_port: 2,
        dst_port: 1,
        seq_number: 1,
        ack_number: 0,
        flags: flags::SYN,
        window: u16::MAX,
        urgent_ptr: 0,
        options: &options[..n],
        payload: &[],
    };
    let mut seg = [0u8; 60];
    syn_cookie_reply(config, &[0; 16], local, remote, &syn, Time::ZERO, &mut seg)
        .and_then(|n| TcpPacket::new_checked(&seg[..n]).ok())
        .map(|p| {
            let reply = TcpRepr {
                options: p.options(),
                ..syn
            };
            (
                p.window(),
                wscale_option(&reply),
                sack_permitted_option(&reply),
            )
        })
}

/// The connection, ESTABLISHED, that `ack` makes if it is a bare ACK (FIN and data
/// allowed; no SYN, no RST) from `remote` to our `local` whose SEG.ACK − 1 is a
/// cookie of [`syn_cookie_reply`] for SEG.SEQ − 1 as the peer's ISN, made in this
/// tick or the last; `None` otherwise. The options are those of the cookie and,
/// if the ACK carries timestamps, of its TSecr; data on the ACK is taken.
pub fn syn_cookie_accept(
    config: TcpConfig,
    key: &[u8; 16],
    local: SocketAddrV4,
    remote: SocketAddrV4,
    ack: &TcpRepr,
    now: Time,
) -> Option<Connection> {
    if ack.flags & (flags::SYN | flags::ACK | flags::RST) != flags::ACK {
        return None;
    }
    let peer_isn = SeqNum(ack.seq_number) - 1;
    let iss = SeqNum(ack.ack_number) - 1;
    let mss = decode(key, local, remote, peer_isn, iss, now)?;
    // RFC 7323 §3.2: timestamps on the ACK mean our SYN-ACK offered them, which
    // it did only for a SYN that offered them.
    let ts = ts_option(ack).filter(|_| config.timestamps);
    let (wscale, sack) = ts.map_or((None, false), |(_, tsecr)| decode_ts(tsecr));
    let offer = SynOptions {
        mss: Some(mss),
        wscale,
        sack,
        tsval: ts.map(|t| t.0),
    };
    let mut c = Connection::from_cookie(config, local, remote, iss, &offer, ack, now)
        .with_timestamp_offset(timestamp_offset(key, local, remote));
    c.handle_segment(ack, now);
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const KEY: [u8; 16] = [0x3c; 16];
    const LOCAL: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80);
    const REMOTE: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
    const ISN: SeqNum = SeqNum(0xdead_beef);

    fn at(secs: u64) -> Time {
        Time::from_millis(secs * 1000)
    }

    #[test]
    fn every_mss_round_trips_to_the_table_entry_not_above_it() {
        let now = at(1000);
        for (i, &m) in MSS_TABLE.iter().enumerate() {
            for mss in [m, m + 1, MSS_TABLE.get(i + 1).map_or(u16::MAX, |n| n - 1)] {
                let (cookie, got) = encode(&KEY, LOCAL, REMOTE, ISN, mss, now);
                assert_eq!(got, m, "{mss}");
                assert_eq!((cookie.0 >> MSS_SHIFT) & 7, i as u32);
                assert_eq!(decode(&KEY, LOCAL, REMOTE, ISN, cookie, now), Some(m));
            }
        }
        // Below the smallest entry, the smallest.
        assert_eq!(encode(&KEY, LOCAL, REMOTE, ISN, 1, now).1, MSS_TABLE[0]);
    }

    #[test]
    fn every_option_combination_round_trips_through_the_tsval() {
        for clock in [0u32, 5, 31, 32, 0x1234_5678, u32::MAX] {
            for wscale in [None, Some(0), Some(7), Some(14), Some(20)] {
                for sack in [false, true] {
                    let ts = encode_ts(clock, wscale, sack);
                    // Never after the clock, and at most 32 ms behind.
                    assert!(clock.wrapping_sub(ts) < 1 << TS_BITS, "{clock} {ts}");
                    assert_eq!(decode_ts(ts), (wscale.map(|s| s.min(14)), sack));
                }
            }
        }
    }

    #[test]
    fn a_cookie_is_good_for_its_tick_and_the_next_only() {
        let made = at(64 * 100 + 63);
        let (cookie, mss) = encode(&KEY, LOCAL, REMOTE, ISN, 1460, made);
        let check = |now| decode(&KEY, LOCAL, REMOTE, ISN, cookie, now);
        assert_eq!(check(made), Some(mss));
        assert_eq!(check(at(64 * 101)), Some(mss));
        assert_eq!(check(at(64 * 102 - 1)), Some(mss));
        assert_eq!(check(at(64 * 102)), None);
        // 32 ticks later the counter's 5 bits match again; the MAC does not.
        assert_eq!(check(at(64 * 132)), None);
        // Nor is one from the future good.
        assert_eq!(check(at(64 * 99)), None);
        // Tick 0 has no tick before it.
        let (c0, _) = encode(&KEY, LOCAL, REMOTE, ISN, 1460, Time::ZERO);
        assert!(decode(&KEY, LOCAL, REMOTE, ISN, c0, at(1)).is_some());
    }

    #[test]
    fn a_cookie_is_bound_to_key_tuple_isn_and_its_own_bits() {
        let now = at(5000);
        let (cookie, _) = encode(&KEY, LOCAL, REMOTE, ISN, 1460, now);
        let other = |a: SocketAddrV4, ip: [u8; 4], port: u16| {
            let mut o = a.ip().octets();
            for (b, d) in o.iter_mut().zip(ip) {
                *b ^= d;
            }
            SocketAddrV4::new(o.into(), a.port() ^ port)
        };
        let bad = [
            decode(&[0x3d; 16], LOCAL, REMOTE, ISN, cookie, now),
            decode(
                &KEY,
                other(LOCAL, [0, 0, 0, 1], 0),
                REMOTE,
                ISN,
                cookie,
                now,
            ),
            decode(&KEY, other(LOCAL, [0; 4], 1), REMOTE, ISN, cookie, now),
            decode(
                &KEY,
                LOCAL,
                other(REMOTE, [0, 0, 0, 1], 0),
                ISN,
                cookie,
                now,
            ),
            decode(&KEY, LOCAL, other(REMOTE, [0; 4], 1), ISN, cookie, now),
            decode(&KEY, REMOTE, LOCAL, ISN, cookie, now),
            decode(&KEY, LOCAL, REMOTE, ISN + 1, cookie, now),
            decode(&KEY, LOCAL, REMOTE, ISN - 1, cookie, now),
            decode(&KEY, LOCAL, REMOTE, ISN, cookie + 1, now),
            decode(&KEY, LOCAL, REMOTE, ISN, cookie - 1, now),
            // A larger MSS index under the same MAC.
            decode(
                &KEY,
                LOCAL,
                REMOTE,
                ISN,
                SeqNum(cookie.0 ^ 1 << MSS_SHIFT),
                now,
            ),
        ];
        assert_eq!(bad, [None; 11]);
    }

    #[test]
    fn reply_and_accept_over_segments() {
        let now = at(777);
        let config = TcpConfig::default();
        let opts = {
            let mut b = [0u8; 20];
            let n = exonet_wire::tcp::write_options(
                &[
                    exonet_wire::TcpOption::Mss(1460),
                    exonet_wire::TcpOption::SackPermitted,
                    exonet_wire::TcpOption::Timestamps {
                        tsval: 4242,
                        tsecr: 0,
                    },
                    exonet_wire::TcpOption::NoOp,
                    exonet_wire::TcpOption::WindowScale(9),
                ],
                &mut b,
            )
            .unwrap();
            (b, n)
        };
        let syn = TcpRepr {
            src_port: REMOTE.port(),
            dst_port: LOCAL.port(),
            seq_number: ISN.0,
            ack_number: 0,
            flags: flags::SYN,
            window: 64240,
            urgent_ptr: 0,
            options: &opts.0[..opts.1],
            payload: &[],
        };
        let mut buf = [0u8; 60];
        let n = syn_cookie_reply(&config, &KEY, LOCAL, REMOTE, &syn, now, &mut buf).unwrap();
        let p = exonet_wire::TcpPacket::new_checked(&buf[..n]).unwrap();
        let synack = TcpRepr::parse(&p, *LOCAL.ip(), *REMOTE.ip()).unwrap();
        assert_eq!(synack.flags, flags::SYN | flags::ACK);
        assert_eq!(synack.ack_number, ISN.0 + 1);
        let (tsval, tsecr) = ts_option(&synack).unwrap();
        assert_eq!(tsecr, 4242);
        assert_eq!(decode_ts(tsval), (Some(9), true));
        assert_eq!(wscale_option(&synack), Some(7));
        assert!(sack_permitted_option(&synack));
        // The ACK, with data; the peer's window scaled by its 9.
        let mut ts = [0u8; 12];
        let tl = exonet_wire::tcp::write_options(
            &[
                exonet_wire::TcpOption::NoOp,
                exonet_wire::TcpOption::NoOp,
                exonet_wire::TcpOption::Timestamps {
                    tsval: 4243,
                    tsecr: tsval,
                },
            ],
            &mut ts,
        )
        .unwrap();
        let ack = TcpRepr {
            seq_number: ISN.0 + 1,
            ack_number: synack.seq_number.wrapping_add(1),
            flags: flags::ACK | flags::PSH,
            window: 100,
            options: &ts[..tl],
            payload: b"hello",
            ..syn
        };
        let later = now + Duration::from_secs(70);
        let mut c = syn_cookie_accept(config.clone(), &KEY, LOCAL, REMOTE, &ack, later).unwrap();
        assert_eq!(c.state(), super::super::TcpState::Established);
        assert!(c.timestamps() && c.sack());
        assert_eq!(c.window_scales(), Some((7, 9)));
        assert_eq!(c.send_mss(), 1460 - 12);
        let mut got = [0u8; 8];
        assert_eq!(c.recv(&mut got), 5);
        assert_eq!(&got[..5], b"hello");
        // One byte off either number, or a SYN or RST among the flags: nothing.
        for bad in [
            TcpRepr {
                seq_number: ISN.0 + 2,
                ..ack
            },
            TcpRepr {
                ack_number: synack.seq_number.wrapping_add(2),
                ..ack
            },
            TcpRepr {
                flags: flags::ACK | flags::RST,
                ..ack
            },
            TcpRepr {
                flags: flags::ACK | flags::SYN,
                ..ack
            },
        ] {
            assert!(syn_cookie_accept(config.clone(), &KEY, LOCAL, REMOTE, &bad, later).is_none());
        }
        // Two ticks on, too late.
        let stale = now + Duration::from_secs(2 * TICK_SECS);
        assert!(syn_cookie_accept(config, &KEY, LOCAL, REMOTE, &ack, stale).is_none());
    }
}
