use exonet_link::memwire;
use exonet_mux::{Daemon, DaemonConfig, Mux, MuxConfig};
use exonet_stack::{Stack, StackConfig, UdpSocket};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

#[test]
fn scratch_rtt() {
    let a_ip = Ipv4Addr::new(10, 77, 0, 1);
    let b_ip = Ipv4Addr::new(10, 77, 0, 2);
    let (x, y) = memwire::pair().unwrap();
    let pa = std::env::temp_dir().join("scratch-a.sock");
    let pb = std::env::temp_dir().join("scratch-b.sock");
    let da = Daemon::spawn(
        move || Ok(Mux::new(Box::new(x), vec![a_ip], MuxConfig::default())),
        DaemonConfig::new(pa, vec![(a_ip, 24)]),
    )
    .unwrap();
    let db = Daemon::spawn(
        move || Ok(Mux::new(Box::new(y), vec![b_ip], MuxConfig::default())),
        DaemonConfig::new(pb, vec![(b_ip, 24)]),
    )
    .unwrap();
    let busy: u64 = std::env::var("BUSY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let cfg = StackConfig {
        busy_poll: Duration::from_micros(busy),
        ..Default::default()
    };
    let (sa, sb) = if std::env::var("INPROC").is_ok() {
        drop(da);
        drop(db);
        let (x, y) = memwire::pair().unwrap();
        let ma = exonet_mux::InProcess::new(
            Mux::new(Box::new(x), vec![a_ip], MuxConfig::default()),
            vec![(a_ip, 24)],
        );
        let mb = exonet_mux::InProcess::new(
            Mux::new(Box::new(y), vec![b_ip], MuxConfig::default()),
            vec![(b_ip, 24)],
        );
        (
            Stack::over(Box::new(ma), &cfg).unwrap(),
            Stack::over(Box::new(mb), &cfg).unwrap(),
        )
    } else {
        (
            Stack::open_with(da.socket(), &cfg).unwrap(),
            Stack::open_with(db.socket(), &cfg).unwrap(),
        )
    };
    let server = UdpSocket::bind(&sb, (b_ip, 7)).unwrap();
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20000);
    let t = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..n {
            let (k, f) = server.recv_from(&mut buf).unwrap();
            server.send_to(&buf[..k], f).unwrap();
        }
    });
    let c = UdpSocket::bind(&sa, (a_ip, 0)).unwrap();
    c.connect((b_ip, 7)).unwrap();
    let mut buf = [0u8; 64];
    let mut rtts = Vec::with_capacity(n);
    for i in 0..n {
        let t0 = Instant::now();
        c.send(&(i as u32).to_be_bytes()).unwrap();
        c.recv(&mut buf).unwrap();
        rtts.push(t0.elapsed());
    }
    t.join().unwrap();
    rtts.sort();
    eprintln!(
        "RTT p50 {:?} p99 {:?} min {:?}",
        rtts[n / 2],
        rtts[n * 99 / 100],
        rtts[0]
    );
}

#[test]
fn scratch_one_thread() {
    let a_ip = Ipv4Addr::new(10, 77, 0, 1);
    let b_ip = Ipv4Addr::new(10, 77, 0, 2);
    let cfg = StackConfig::default();
    let (x, y) = memwire::pair().unwrap();
    let ma = exonet_mux::InProcess::new(
        Mux::new(Box::new(x), vec![a_ip], MuxConfig::default()),
        vec![(a_ip, 24)],
    );
    let mb = exonet_mux::InProcess::new(
        Mux::new(Box::new(y), vec![b_ip], MuxConfig::default()),
        vec![(b_ip, 24)],
    );
    let (sa, sb) = (
        Stack::over(Box::new(ma), &cfg).unwrap(),
        Stack::over(Box::new(mb), &cfg).unwrap(),
    );
    let server = UdpSocket::bind(&sb, (b_ip, 7)).unwrap();
    let c = UdpSocket::bind(&sa, (a_ip, 0)).unwrap();
    c.connect((b_ip, 7)).unwrap();
    // Resolve first, blocking, with the far side driven by a thread.
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20000);
    let warm = std::thread::spawn(move || {
        let mut b = [0u8; 8];
        let (k, f) = server.recv_from(&mut b).unwrap();
        server.send_to(&b[..k], f).unwrap();
        server
    });
    c.send(b"warm").unwrap();
    let mut buf = [0u8; 64];
    c.recv(&mut buf).unwrap();
    let server = warm.join().unwrap();
    server.set_nonblocking(true).unwrap();
    c.set_nonblocking(true).unwrap();
    let t0 = Instant::now();
    for i in 0..n {
        c.send(&(i as u32).to_be_bytes()).unwrap();
        let (k, f) = loop {
            match server.recv_from(&mut buf) {
                Ok(r) => break r,
                Err(_) => {}
            }
        };
        server.send_to(&buf[..k], f).unwrap();
        loop {
            if c.recv(&mut buf).is_ok() {
                break;
            }
        }
    }
    eprintln!("one-thread RTT {:?}", t0.elapsed() / n as u32);
}
