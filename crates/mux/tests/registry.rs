//! Stage 3: ports, socket channels, raw filters and templates, reclaiming.

mod common;

use common::*;
use exonet_dpf::Filter;
use exonet_link::Link;
use exonet_mux::registry::{socket_filter, socket_template};
use exonet_mux::{ChannelSpec, MuxError, Proto, Template};
use exonet_wire::build;

fn spec(proto: Proto, port: u16) -> ChannelSpec {
    ChannelSpec {
        proto,
        local_addr: HOST,
        local_port: port,
        remote: None,
    }
}

#[test]
fn ports_are_not_shared_and_privileged_ports_need_privilege() {
    let (mut mux, _wire) = mux();
    let (a, _app_a, _) = endpoint(&mut mux, 0, false);
    let (b, _app_b, _) = endpoint(&mut mux, 0, false);
    let (root, _app_r, _) = endpoint(&mut mux, 0, true);
    let (_, pa) = mux.bind_socket(a, spec(Proto::Udp, 0)).unwrap();
    assert!(pa >= 49152);
    assert_eq!(
        mux.bind_socket(b, spec(Proto::Udp, pa)),
        Err(MuxError::PortInUse {
            proto: Proto::Udp,
            port: pa
        })
    );
    // Other protocol, same number: fine.
    mux.bind_socket(b, spec(Proto::Tcp, pa)).unwrap();
    assert!(matches!(
        mux.bind_socket(a, spec(Proto::Udp, 53)),
        Err(MuxError::NotPermitted(_))
    ));
    mux.bind_socket(root, spec(Proto::Udp, 53)).unwrap();
    assert_eq!(
        mux.bind_socket(
            a,
            ChannelSpec {
                local_addr: "10.9.9.9".parse().unwrap(),
                ..spec(Proto::Udp, 0)
            }
        ),
        Err(MuxError::NotOurAddress("10.9.9.9".parse().unwrap()))
    );
}

#[test]
fn connected_channel_wins_over_listening_one() {
    let (mut mux, mut wire) = mux();
    let (a, mut app, _) = endpoint(&mut mux, 8, false);
    let (listen, _) = mux.bind_socket(a, spec(Proto::Tcp, 8080)).unwrap();
    let (conn, _) = mux
        .bind_socket(
            a,
            ChannelSpec {
                remote: Some((PEER, 40000)),
                ..spec(Proto::Tcp, 8080)
            },
        )
        .unwrap();
    let from_peer = build::tcp_frame(
        PEER_MAC,
        HOST_MAC,
        PEER,
        HOST,
        40000,
        8080,
        0x10,
        1,
        1,
        &[],
        b"x",
    );
    let from_other = build::tcp_frame(
        PEER_MAC,
        HOST_MAC,
        PEER,
        HOST,
        40001,
        8080,
        0x02,
        1,
        0,
        &[],
        &[],
    );
    wire.send_batch(&[&from_peer, &from_other]).unwrap();
    mux.poll_rx().unwrap();
    let got: Vec<u32> = drain_rx(&mut app).into_iter().map(|(c, _)| c).collect();
    assert_eq!(got, vec![conn.0, listen.0]);
    // Unbinding the connected channel keeps the port (the listener holds it).
    mux.unbind_channel(conn).unwrap();
    assert_eq!(mux.ports_of(a), vec![(Proto::Tcp, 8080)]);
    mux.unbind_channel(listen).unwrap();
    assert_eq!(mux.ports_of(a), vec![]);
}

#[test]
fn raw_filters_must_pin_what_the_endpoint_owns() {
    let (mut mux, _wire) = mux();
    let (a, _app, _) = endpoint(&mut mux, 0, false);
    let (b, _app_b, _) = endpoint(&mut mux, 0, false);
    let (root, _app_r, _) = endpoint(&mut mux, 0, true);
    let mac = mux.mac();
    let port = mux.allocate_port(a, Proto::Udp, 0).unwrap();
    let s = spec(Proto::Udp, port);
    let good_t = socket_template(mac, &s);
    // A catch-all, a filter without our address, one for a port A does
    // not own: refused.
    let catch_all: Filter = "12:16 == 0x800".parse().unwrap();
    let no_addr = Filter::new()
        .eq(12, exonet_dpf::Width::U16, 0x800)
        .eq(23, exonet_dpf::Width::U8, 17)
        .masked(20, exonet_dpf::Width::U16, 0x1fff, exonet_dpf::Op::Eq, 0)
        .shift(14)
        .shift_by(0, exonet_dpf::Width::U8, 0xf, 2)
        .eq(2, exonet_dpf::Width::U16, port as u32);
    let other_port = socket_filter(&spec(Proto::Udp, 5555));
    for f in [catch_all, no_addr, other_port] {
        assert!(matches!(
            mux.bind_channel(a, &[f], good_t.clone()),
            Err(MuxError::NotPermitted(_))
        ));
    }
    // B cannot use A's port either.
    assert!(mux
        .bind_channel(b, &[socket_filter(&s)], good_t.clone())
        .is_err());
    // Templates that would let A spoof: refused.
    let bad_templates = [
        Template::new(),
        socket_template([2, 0, 0, 0, 0, 99], &s),
        socket_template(mac, &spec(Proto::Udp, 5555)),
        socket_template(
            mac,
            &ChannelSpec {
                local_addr: "10.0.0.99".parse().unwrap(),
                ..s
            },
        ),
    ];
    for t in bad_templates {
        assert!(matches!(
            mux.bind_channel(a, &[socket_filter(&s)], t),
            Err(MuxError::NotPermitted(_))
        ));
    }
    // The registry's own filter and template: accepted, also as a union
    // with a connected variant.
    let connected = socket_filter(&ChannelSpec {
        remote: Some((PEER, 53)),
        ..s
    });
    mux.bind_channel(a, &[socket_filter(&s), connected], good_t)
        .unwrap();
    // A privileged endpoint may bind anything.
    mux.bind_channel(root, &["12:16 == 0x806".parse().unwrap()], Template::new())
        .unwrap();
}

#[test]
fn remove_endpoint_reclaims_everything() {
    let (mut mux, mut wire) = mux();
    let (a, _app, _) = endpoint(&mut mux, 8, false);
    let (b, mut app_b, _) = endpoint(&mut mux, 8, false);
    let (ch, _) = mux.bind_socket(a, spec(Proto::Udp, 5000)).unwrap();
    mux.allocate_port(a, Proto::Tcp, 6000).unwrap();
    mux.remove_endpoint(a).unwrap();
    assert_eq!(mux.channel_owner(ch), None);
    assert_eq!(mux.ports_of(a), vec![]);
    assert!(mux.endpoint_stats(a).is_none());
    assert!(matches!(
        mux.remove_endpoint(a),
        Err(MuxError::NoSuchEndpoint(_))
    ));
    // Its frames now go nowhere (the host answers for the port)...
    let f = build::udp_frame(PEER_MAC, HOST_MAC, PEER, HOST, 9, 5000, b"x");
    wire.send_batch(&[&f]).unwrap();
    mux.poll_rx().unwrap();
    assert_eq!(mux.stats().host.udp_unreachables, 1);
    drain_wire(&mut wire);
    // ...and its ports are free for others.
    let (ch_b, _) = mux.bind_socket(b, spec(Proto::Udp, 5000)).unwrap();
    mux.allocate_port(b, Proto::Tcp, 6000).unwrap();
    wire.send_batch(&[&f]).unwrap();
    mux.poll_rx().unwrap();
    assert_eq!(drain_rx(&mut app_b), vec![(ch_b.0, f)]);
    assert_eq!(mux.stats().endpoints.len(), 1);
}
