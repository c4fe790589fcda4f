//! The demo's raw part: two hosts on an in-memory cable, each a multiplexer
//! driven by hand with an application on its own endpoint and no protocol
//! library. The client resolves the server through its multiplexer's ARP,
//! then they ping-pong UDP frames that the applications write raw into their
//! segments; one forged frame shows the template check at work. Everything
//! runs on one thread, so the round trip is the cost of the path, not of any
//! wake-up: the floor under the sockets' numbers.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use exonet_link::memwire;
use exonet_mux::{ChannelSpec, EndpointId, Mux, MuxConfig, Proto};
use exonet_shm::{AppEndpoint, Segment, SegmentConfig, INLINE_MAX};
use exonet_wire::build;
use exonet_wire::ethernet::MacAddr;

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const ECHO_PORT: u16 = 7007;

struct Host {
    mux: Mux,
    app: AppEndpoint,
    ep: EndpointId,
    channel: u32,
    port: u16,
}

fn host(link: memwire::MemWire, ip: Ipv4Addr, port: u16) -> Result<Host, String> {
    let mut mux = Mux::new(Box::new(link), vec![ip], MuxConfig::default());
    let (app, side) = Segment::create(&SegmentConfig {
        frame_size: 2048,
        frame_count: 64,
        ring_entries: [64; 4],
    })
    .map_err(|e| e.to_string())?
    .split()
    .map_err(|e| e.to_string())?;
    // An ordinary user's application: the registry holds it to its port.
    let ep = mux.add_endpoint(side, 1000, false);
    let (ch, port) = mux
        .bind_socket(
            ep,
            ChannelSpec {
                proto: Proto::Udp,
                local_addr: ip,
                local_port: port,
                remote: None,
            },
        )
        .map_err(|e| e.to_string())?;
    Ok(Host {
        mux,
        app,
        ep,
        channel: ch.0,
        port,
    })
}

fn send(h: &mut Host, frame: &[u8]) -> Result<(), String> {
    match h.app.tx.push_inline(h.channel, frame) {
        Ok(true) => Ok(()),
        other => Err(format!("tx ring: {other:?}")),
    }
}

fn recv(h: &mut Host, buf: &mut [u8; INLINE_MAX]) -> Option<usize> {
    let d = h.app.rx.pop_frame(buf).ok()??;
    d.is_inline().then_some(d.len as usize)
}

fn io(e: std::io::Error) -> String {
    e.to_string()
}

/// Runs the raw round trips and the forged frame; returns the round trips'
/// times.
pub fn tour(round_trips: usize) -> Result<Vec<Duration>, String> {
    let (a, b) = memwire::pair().map_err(io)?;
    let mut server = host(a, SERVER, ECHO_PORT)?;
    let mut client = host(b, CLIENT, 0)?;

    // ARP on the application's behalf: ask, let the server's multiplexer
    // answer, ask again.
    let deadline = Instant::now() + Duration::from_secs(5);
    let server_mac = loop {
        if let Some(m) = client.mux.resolve(SERVER).map_err(io)? {
            break MacAddr(m);
        }
        server.mux.poll().map_err(io)?;
        client.mux.poll().map_err(io)?;
        if Instant::now() > deadline {
            return Err("ARP did not resolve".into());
        }
    };
    let client_mac = MacAddr(client.mux.mac());

    let mut rtts = Vec::with_capacity(round_trips);
    let mut buf = [0u8; INLINE_MAX];
    for i in 0..round_trips as u32 {
        let payload = i.to_be_bytes();
        let q = build::udp_frame(
            client_mac,
            server_mac,
            CLIENT,
            SERVER,
            client.port,
            ECHO_PORT,
            &payload,
        );
        let t = Instant::now();
        send(&mut client, &q)?;
        client.mux.poll_tx().map_err(io)?;
        server.mux.poll_rx().map_err(io)?;
        let n = recv(&mut server, &mut buf).ok_or("the server got nothing")?;
        // The echo: the same frame, addresses and ports swapped, as
        // `exonet raw-echo` answers.
        let r = &mut buf[..n];
        if !crate::raw_echo::swap(r, server_mac.0) {
            return Err(format!(
                "round trip {i}: the server got a frame it cannot answer"
            ));
        }
        send(&mut server, r)?;
        server.mux.poll_tx().map_err(io)?;
        client.mux.poll_rx().map_err(io)?;
        let n = recv(&mut client, &mut buf).ok_or("the client got nothing back")?;
        rtts.push(t.elapsed());
        if n < 4 || buf[n - 4..n] != payload {
            return Err(format!("round trip {i} came back wrong"));
        }
    }

    // A forged frame: the client claims the server's port as its source.
    let forged = build::udp_frame(
        client_mac, server_mac, CLIENT, SERVER, ECHO_PORT, ECHO_PORT, b"forged",
    );
    send(&mut client, &forged)?;
    client.mux.poll_tx().map_err(io)?;
    let refused = client
        .mux
        .endpoint_stats(client.ep)
        .ok_or("endpoint gone")?
        .tx_template_mismatch;
    if refused != 1 {
        return Err(format!(
            "the template check refused {refused} frames, not the one forged"
        ));
    }

    println!(
        "\nraw frames between two multiplexers on one thread (server {SERVER}:{ECHO_PORT}, \
         client {CLIENT}:{}): ARP resolved by the client's multiplexer, then {round_trips} \
         UDP round trips written raw into the segments",
        client.port
    );
    println!(
        "  {:<8} {:>9} {:>9} {:>10} {:>10} {:>10}",
        "host", "rx frames", "tx frames", "refused", "cycles/rx", "cycles/tx"
    );
    for (name, h) in [("server", &server), ("client", &client)] {
        let s = h.mux.endpoint_stats(h.ep).ok_or("endpoint gone")?;
        let per = |c: u64, n: u64| c.checked_div(n).unwrap_or(0);
        println!(
            "  {name:<8} {:>9} {:>9} {:>10} {:>10} {:>10}",
            s.rx_frames,
            s.tx_frames,
            s.tx_template_mismatch,
            per(s.rx_cycles + s.copy_cycles, s.rx_frames),
            per(s.tx_cycles, s.tx_frames),
        );
    }
    println!(
        "  the server's multiplexer answered {} ARP request(s); the client's forged frame \
         (source port {ECHO_PORT}, not its own) was refused by the template check, never sent",
        server.mux.stats().host.arp_replies_sent
    );
    Ok(rtts)
}
