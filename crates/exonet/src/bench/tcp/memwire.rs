//! The memwire cases: two stacks, each with its multiplexer in process, on an
//! in-memory cable in this process (faults injected on what each sends), one
//! connection carrying a bulk transfer between two threads.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::thread;
use std::time::Instant;

use exonet::hosts::{lossy_pair, B};
use exonet_link::Faults;
use exonet_stack::{StackConfig, TcpListener, TcpStream};

use super::node::drain;
use crate::bench::endpoint::error;
use crate::bench::endpoint::peer::PATIENCE;
use crate::bench::report::Fail;

const PORT: u16 = 5001;
const WRITE: usize = 8192;

/// What a transfer achieved.
pub struct Transfer {
    /// Data bits per second at the receiver, from its first byte to the end.
    pub gbps: f64,
    /// Segments the sender sent again.
    pub retransmitted: u64,
    /// Of the losses, those found by the retransmission timer.
    pub timeouts: u64,
}

/// Sends `bytes` from host A to host B over a cable with `faults`, with the
/// stacks set up as `config` says.
pub fn transfer(
    config: &StackConfig,
    faults: Faults,
    bytes: u64,
    seed: u64,
) -> Result<Transfer, Fail> {
    let (sa, sb) = lossy_pair(config, faults, seed).map_err(error("memwire pair"))?;
    let listener = TcpListener::bind(&sb, (B, PORT)).map_err(error("listen"))?;
    listener
        .set_accept_timeout(Some(PATIENCE))
        .map_err(error("accept timeout"))?;
    let receiver = thread::spawn(move || -> Result<(u64, f64), Fail> {
        let (mut s, _) = listener.accept().map_err(error("accept"))?;
        s.set_read_timeout(Some(PATIENCE))
            .map_err(error("timeout"))?;
        drain(&mut s)
    });
    let mut c = TcpStream::connect_timeout(&sa, (B, PORT), PATIENCE).map_err(error("connect"))?;
    c.set_write_timeout(Some(PATIENCE))
        .map_err(error("timeout"))?;
    c.set_read_timeout(Some(PATIENCE))
        .map_err(error("timeout"))?;
    let chunk = vec![0x5au8; WRITE];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(WRITE as u64) as usize;
        c.write_all(&chunk[..n]).map_err(error("write"))?;
        left -= n as u64;
    }
    c.shutdown(Shutdown::Write).map_err(error("shutdown"))?;
    let mut rest = [0u8; 16];
    while c.read(&mut rest).map_err(error("read"))? > 0 {}
    let stats = c.info().map_err(error("info"))?.stats;
    let (total, secs) = receiver
        .join()
        .map_err(|_| Fail::Error("the receiver panicked".into()))??;
    if total != bytes || secs <= 0.0 {
        return Err(Fail::Error(format!("received {total} of {bytes} bytes")));
    }
    Ok(Transfer {
        gbps: total as f64 * 8.0 / secs / 1e9,
        retransmitted: stats.retransmitted,
        timeouts: stats.timeouts,
    })
}

/// Connections per second between the two hosts: connect, a request of
/// `size` bytes, the same back, close; `count` of them after a warm-up of a
/// tenth as many.
pub fn connections(config: &StackConfig, count: u64, size: usize) -> Result<f64, Fail> {
    let (sa, sb) = lossy_pair(config, Faults::default(), 1).map_err(error("memwire pair"))?;
    let listener = TcpListener::bind(&sb, (B, PORT)).map_err(error("listen"))?;
    listener
        .set_accept_timeout(Some(PATIENCE))
        .map_err(error("accept timeout"))?;
    let total = count + count / 10;
    let server = thread::spawn(move || -> Result<(), Fail> {
        let mut req = vec![0u8; size];
        for _ in 0..total {
            let (mut s, _) = listener.accept().map_err(error("accept"))?;
            s.set_read_timeout(Some(PATIENCE))
                .map_err(error("timeout"))?;
            s.read_exact(&mut req).map_err(error("request"))?;
            s.write_all(&req).map_err(error("answer"))?;
        }
        Ok(())
    });
    let mut req = vec![0x5au8; size];
    let mut start = Instant::now();
    for i in 0..total {
        if i == count / 10 {
            start = Instant::now();
        }
        let mut c =
            TcpStream::connect_timeout(&sa, (B, PORT), PATIENCE).map_err(error("connect"))?;
        c.set_read_timeout(Some(PATIENCE))
            .map_err(error("timeout"))?;
        c.set_nodelay(true).map_err(error("nodelay"))?;
        c.write_all(&req).map_err(error("request"))?;
        c.read_exact(&mut req).map_err(error("answer"))?;
    }
    let secs = start.elapsed().as_secs_f64();
    server
        .join()
        .map_err(|_| Fail::Error("the server panicked".into()))??;
    Ok(count as f64 / secs)
}

/// Round trips of a `size`-byte message over one connection (TCP_NODELAY):
/// the median and 99th percentile in microseconds, of `count` after a warm-up
/// of a tenth as many.
pub fn round_trips(config: &StackConfig, count: usize, size: usize) -> Result<[f64; 2], Fail> {
    let (sa, sb) = lossy_pair(config, Faults::default(), 1).map_err(error("memwire pair"))?;
    let listener = TcpListener::bind(&sb, (B, PORT)).map_err(error("listen"))?;
    listener
        .set_accept_timeout(Some(PATIENCE))
        .map_err(error("accept timeout"))?;
    let echo = thread::spawn(move || -> Result<(), Fail> {
        let (mut s, _) = listener.accept().map_err(error("accept"))?;
        s.set_nodelay(true).map_err(error("nodelay"))?;
        s.set_read_timeout(Some(PATIENCE))
            .map_err(error("timeout"))?;
        let mut buf = vec![0u8; size];
        while s.read_exact(&mut buf).is_ok() {
            s.write_all(&buf).map_err(error("echo"))?;
        }
        Ok(())
    });
    let mut c = TcpStream::connect_timeout(&sa, (B, PORT), PATIENCE).map_err(error("connect"))?;
    c.set_nodelay(true).map_err(error("nodelay"))?;
    c.set_read_timeout(Some(PATIENCE))
        .map_err(error("timeout"))?;
    let mut msg = vec![0x5au8; size];
    let mut rtts = Vec::with_capacity(count);
    for i in 0..count + count / 10 {
        let t = Instant::now();
        c.write_all(&msg).map_err(error("send"))?;
        c.read_exact(&mut msg).map_err(error("echo"))?;
        if i >= count / 10 {
            rtts.push(t.elapsed().as_nanos() as f64 / 1e3);
        }
    }
    drop(c);
    echo.join()
        .map_err(|_| Fail::Error("the echo thread panicked".into()))??;
    let p99 = crate::bench::measure::percentile(&mut rtts, 99.0);
    Ok([crate::bench::measure::median(rtts), p99])
}
