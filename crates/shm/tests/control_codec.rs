//! The control protocol's codec: every message round-trips, and no byte
//! string makes the decoder panic or accept trailing garbage.

use std::net::Ipv4Addr;

use exonet_shm::control::{
    Below, ErrorCode, HandlerSpec, Record, Reply, Request, SynAnswers, WireField,
    MAX_HANDLER_MODULE, NO_REPLY, STATS_PAGE,
};
use proptest::prelude::*;

fn ip() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>().prop_map(Ipv4Addr::from)
}

fn request() -> impl Strategy<Value = Request> {
    let field =
        (any::<u16>(), prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(o, b)| WireField {
            offset: o,
            mask: b.iter().map(|x| x ^ 0x55).collect(),
            bytes: b,
        });
    prop_oneof![
        any::<u32>().prop_map(|version| Request::Hello { version }),
        Just(Request::Info),
        Just(Request::CreateEndpoint),
        any::<u32>().prop_map(|endpoint| Request::DestroyEndpoint { endpoint }),
        (
            any::<u32>(),
            any::<u8>(),
            ip(),
            any::<u16>(),
            prop::option::of((ip(), any::<u16>()))
        )
            .prop_map(|(endpoint, proto, local_addr, local_port, remote)| {
                Request::BindSocket {
                    endpoint,
                    proto,
                    local_addr,
                    local_port,
                    remote,
                }
            }),
        (
            any::<u32>(),
            prop::collection::vec("[ -~]{0,80}", 0..16),
            prop::collection::vec(field, 0..32)
        )
            .prop_map(|(endpoint, filters, template)| Request::BindChannel {
                endpoint,
                filters,
                template
            }),
        any::<u32>().prop_map(|channel| Request::Unbind { channel }),
        (any::<u32>(), any::<u8>(), any::<u16>()).prop_map(|(endpoint, proto, port)| {
            Request::AllocatePort {
                endpoint,
                proto,
                port,
            }
        }),
        (any::<u32>(), any::<u8>(), any::<u16>()).prop_map(|(endpoint, proto, port)| {
            Request::ReleasePort {
                endpoint,
                proto,
                port,
            }
        }),
        (any::<u32>(), any::<u32>())
            .prop_map(|(endpoint, weight)| Request::SetWeight { endpoint, weight }),
        ip().prop_map(|ip| Request::Resolve { ip }),
        any::<u32>().prop_map(|from| Request::Stats { from }),
        (
            any::<u32>(),
            0..=MAX_HANDLER_MODULE as u32,
            proptest::option::of((any::<u32>(), any::<u32>())),
            any::<u64>(),
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..4),
            prop_oneof![Just(Below::Nothing), Just(Below::Udp)],
        )
            .prop_map(|(channel, module_len, window, fuel, pipe_lists, below)| {
                Request::InstallHandler {
                    channel,
                    module_len,
                    spec: HandlerSpec {
                        module: Vec::new(),
                        pipe_lists,
                        window,
                        fuel,
                        below,
                    },
                }
            }),
        any::<u32>().prop_map(|channel| Request::RemoveHandler { channel }),
        any::<u32>().prop_map(|endpoint| Request::OpenDirect { endpoint }),
        (
            any::<u32>(),
            any::<[u8; 16]>(),
            any::<u64>(),
            48u16..,
            any::<u16>(),
            prop::option::of(0u8..=14),
            any::<bool>(),
            1u8..,
        )
            .prop_map(|(channel, key, epoch, mss, window, wscale, sack, ttl)| {
                Request::AnswerSyns {
                    channel,
                    answers: SynAnswers {
                        key,
                        epoch,
                        mss,
                        window,
                        wscale,
                        sack,
                        ttl,
                    },
                }
            }),
    ]
}

/// What a link could not put in a SYN-ACK is refused by the decoder.
#[test]
fn syn_answers_out_of_range_are_refused() {
    let good = Request::AnswerSyns {
        channel: 3,
        answers: SynAnswers {
            key: [1; 16],
            epoch: 5,
            mss: 1460,
            window: 65535,
            wscale: Some(7),
            sack: true,
            ttl: 64,
        },
    };
    let bytes = good.encode();
    assert!(Request::decode(&bytes).is_ok());
    // channel(4) key(16) epoch(8) mss(2) window(2) wscale sack ttl, after the kind.
    let at = |field: usize, v: &[u8]| {
        let mut b = bytes.clone();
        b[1 + field..1 + field + v.len()].copy_from_slice(v);
        Request::decode(&b)
    };
    assert!(at(32, &[15]).is_err(), "a window scale of 15");
    assert!(at(32, &[0xff]).is_ok(), "no window scale");
    assert!(at(33, &[2]).is_err(), "SACK-permitted 2");
    assert!(at(34, &[0]).is_err(), "TTL 0");
    assert!(at(28, &47u16.to_le_bytes()).is_err(), "MSS 47");
}

fn reply() -> impl Strategy<Value = Reply> {
    let record = (
        "[a-z]{1,10}",
        any::<u32>(),
        "[ -~]{0,100}",
        prop::collection::vec(("[a-z_]{1,20}", any::<u64>()), 0..20),
    )
        .prop_map(|(kind, id, label, fields)| Record {
            kind,
            id,
            label,
            fields,
        });
    prop_oneof![
        Just(Reply::Ok),
        any::<u32>().prop_map(|version| Reply::Hello { version }),
        (
            any::<[u8; 6]>(),
            prop::collection::vec((ip(), 0u8..=32), 0..8),
            any::<(u32, u32)>()
        )
            .prop_map(|(mac, addrs, (mtu, max_send))| Reply::Info {
                mac,
                addrs,
                mtu,
                max_send
            }),
        any::<u32>().prop_map(|endpoint| Reply::Endpoint { endpoint }),
        (any::<u32>(), any::<u16>()).prop_map(|(channel, port)| Reply::Bound { channel, port }),
        any::<u16>().prop_map(|port| Reply::Port { port }),
        (any::<u64>(), any::<u64>()).prop_map(|(bytes_per_sec, burst)| Reply::Direct {
            bytes_per_sec,
            burst
        }),
        prop::option::of(any::<[u8; 6]>()).prop_map(Reply::Mac),
        (prop::collection::vec(record, 0..STATS_PAGE), any::<bool>())
            .prop_map(|(records, more)| Reply::Stats { records, more }),
        "[ -~]{0,200}".prop_map(|message| Reply::Error {
            code: ErrorCode::PortInUse,
            message
        }),
    ]
}

proptest! {
    #[test]
    fn requests_round_trip(r in request()) {
        let bytes = r.encode();
        prop_assert_eq!(Request::decode(&bytes), Ok((r.clone(), true)));
        // Every proper prefix is refused, and so is any trailing byte.
        for cut in 0..bytes.len() {
            prop_assert!(Request::decode(&bytes[..cut]).is_err());
        }
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert!(Request::decode(&longer).is_err());
        // Without a reply: the same request, flagged; refused on a request
        // whose reply carries something.
        let mut flagged = bytes.clone();
        flagged[0] |= NO_REPLY;
        match r.encode_unanswered() {
            Some(unanswered) => {
                prop_assert!(r.may_go_unanswered());
                prop_assert_eq!(&unanswered, &flagged);
                prop_assert_eq!(Request::decode(&unanswered), Ok((r, false)));
            }
            None => {
                prop_assert!(!r.may_go_unanswered());
                prop_assert!(Request::decode(&flagged).is_err());
            }
        }
    }

    #[test]
    fn replies_round_trip(r in reply()) {
        let bytes = r.encode();
        prop_assert_eq!(Reply::decode(&bytes), Ok(r));
        for cut in 0..bytes.len() {
            prop_assert!(Reply::decode(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Request::decode(&bytes);
        let _ = Reply::decode(&bytes);
    }

    /// Mutating one byte of a valid message decodes to something or to an
    /// error, never a panic (lengths and counts are checked before use).
    #[test]
    fn mutated_messages_never_panic(r in request(), at in any::<prop::sample::Index>(), v in any::<u8>()) {
        let mut bytes = r.encode();
        let i = at.index(bytes.len());
        bytes[i] = v;
        let _ = Request::decode(&bytes);
    }
}

#[test]
fn declared_lengths_beyond_the_limits_are_refused() {
    // BindChannel with a filter count of 2^32-1.
    let mut b = vec![6, 0, 0, 0, 0];
    b.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Request::decode(&b).is_err());
    // A template field whose bytes and mask differ in length.
    let r = Request::BindChannel {
        endpoint: 0,
        filters: vec![],
        template: vec![WireField {
            offset: 0,
            bytes: vec![1, 2],
            mask: vec![0xff, 0xff],
        }],
    };
    let mut bytes = r.encode();
    let n = bytes.len();
    // The mask's length prefix sits 6 bytes before the end: make it 1.
    bytes[n - 6] = 1;
    bytes.truncate(n - 1);
    assert!(Request::decode(&bytes).is_err());
}

#[test]
fn only_requests_answered_by_ok_go_unanswered() {
    let unbind = Request::Unbind { channel: 7 };
    let bytes = unbind.encode_unanswered().unwrap();
    assert_eq!(bytes[0], 7 | NO_REPLY);
    assert_eq!(Request::decode(&bytes), Ok((unbind, false)));
    for r in [
        Request::Hello { version: 2 },
        Request::Info,
        Request::CreateEndpoint,
        Request::Stats { from: 0 },
        Request::AllocatePort {
            endpoint: 0,
            proto: 6,
            port: 0,
        },
    ] {
        assert_eq!(r.encode_unanswered(), None, "{r:?}");
        let mut b = r.encode();
        b[0] |= NO_REPLY;
        assert!(Request::decode(&b).is_err(), "{r:?}");
    }
}
