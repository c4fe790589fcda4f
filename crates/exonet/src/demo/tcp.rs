//! The TCP part of the tour: one transfer between two hosts whose cable loses
//! and reorders frames, the sender's congestion window sampled as it goes and
//! drawn in the terminal, the data checked at the far end.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use exonet::hosts::{lossy_pair, B};
use exonet_link::Faults;
use exonet_stack::{StackConfig, TcpListener, TcpStream};

const PORT: u16 = 8000;
const WRITE: usize = 16 * 1024;
/// How often the sender's window is sampled.
const SAMPLE: Duration = Duration::from_millis(2);
/// Gives up on a stalled transfer.
const PATIENCE: Duration = Duration::from_secs(20);
const CHART_ROWS: usize = 10;
const CHART_COLUMNS: usize = 64;

/// FNV-1a over a stream, fed piece by piece.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn feed(&mut self, data: &[u8]) {
        for &b in data {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Byte `i` of the stream.
fn pattern(from: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = ((from + i as u64) % 251) as u8;
    }
}

/// One sample of the sender.
struct Sample {
    at: Duration,
    cwnd: u32,
    retransmitted: u64,
}

/// Sends `bytes` over a cable that loses 1% of the frames each way and
/// reorders 1%, and prints what happened.
pub fn lossy_transfer(bytes: u64) -> Result<(), String> {
    let faults = Faults {
        loss_rate: 0.01,
        reorder_rate: 0.01,
        delay: Duration::from_micros(200),
        ..Faults::default()
    };
    let (sa, sb) =
        lossy_pair(&StackConfig::default(), faults, 7).map_err(|e| format!("memwire: {e}"))?;
    println!(
        "\nTCP between the two hosts over a cable that loses 1% of the frames each way and \
         reorders 1%\n(in-process multiplexers; {} MB from A to B, CUBIC with SACK, the \
         library's defaults):",
        bytes >> 20
    );
    let listener = TcpListener::bind(&sb, (B, PORT)).map_err(|e| format!("listen: {e}"))?;
    listener
        .set_accept_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    let receiver = thread::spawn(move || -> Result<(u64, u64), String> {
        let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        s.set_read_timeout(Some(PATIENCE))
            .map_err(|e| e.to_string())?;
        let (mut hash, mut total) = (Fnv::new(), 0u64);
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = s.read(&mut buf).map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Ok((total, hash.0));
            }
            hash.feed(&buf[..n]);
            total += n as u64;
        }
    });
    let c = TcpStream::connect_timeout(&sa, (B, PORT), PATIENCE)
        .map_err(|e| format!("connect: {e}"))?;
    c.set_write_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let done = AtomicBool::new(false);
    let (samples, hash) = thread::scope(|scope| {
        // The sampler watches the sender from beside it, also while a write
        // waits for the window.
        let sampler = scope.spawn(|| {
            let mut samples = Vec::new();
            while !done.load(Ordering::Relaxed) {
                if let Ok(info) = c.info() {
                    samples.push(Sample {
                        at: start.elapsed(),
                        cwnd: info.cwnd,
                        retransmitted: info.stats.retransmitted,
                    });
                }
                thread::sleep(SAMPLE);
            }
            samples
        });
        let sent = send(&c, bytes);
        done.store(true, Ordering::Relaxed);
        let samples = sampler.join().unwrap_or_default();
        sent.map(|h| (samples, h))
    })?;
    let secs = start.elapsed().as_secs_f64();
    let info = c.info().map_err(|e| e.to_string())?;
    let (got, got_hash) = receiver
        .join()
        .map_err(|_| "the receiver panicked".to_string())??;
    if got != bytes || got_hash != hash.0 {
        return Err(format!(
            "TCP delivered {got} bytes (hash {got_hash:016x}), sent {bytes} (hash {:016x})",
            hash.0
        ));
    }
    let st = &info.stats;
    println!(
        "  {} bytes arrived intact (FNV-1a {:016x}) in {:.2} s: {:.2} Gbit/s of goodput",
        got,
        hash.0,
        secs,
        got as f64 * 8.0 / secs / 1e9
    );
    println!(
        "  sender: {} segments, {} sent again ({} fast retransmits, {} RACK losses, \
         {} timeouts), HyStart++ exits {} (CSS entered {}), smoothed RTT {}",
        st.segments_sent,
        st.retransmitted,
        st.fast_retransmits,
        st.rack_losses,
        st.timeouts,
        st.hystart_exits,
        st.css_entries,
        info.srtt.map_or("-".to_string(), |d| format!(
            "{:.0} us",
            d.as_secs_f64() * 1e6
        ))
    );
    let tx = sa.stats().tx;
    println!(
        "  {} of A's {} frames carried their data by reference: the multiplexer read it in \
         place from the send buffer in A's segment, for the first sending and every \
         retransmission (no copy into a frame)",
        tx.referenced, tx.frames
    );
    chart(&samples);
    Ok(())
}

/// Writes `bytes` of the pattern, closes, waits for the peer's close;
/// returns the hash of what was sent.
fn send(c: &TcpStream, bytes: u64) -> Result<Fnv, String> {
    let (mut sent, mut hash) = (0u64, Fnv::new());
    let mut chunk = vec![0u8; WRITE];
    let mut w = c;
    while sent < bytes {
        let n = (bytes - sent).min(WRITE as u64) as usize;
        pattern(sent, &mut chunk[..n]);
        hash.feed(&chunk[..n]);
        w.write_all(&chunk[..n])
            .map_err(|e| format!("write: {e}"))?;
        sent += n as u64;
    }
    c.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
    let mut rest = [0u8; 16];
    while w.read(&mut rest).map_err(|e| format!("read: {e}"))? > 0 {}
    Ok(hash)
}

/// The congestion window over time as a terminal chart, with the moments of
/// retransmission marked under it.
fn chart(samples: &[Sample]) {
    let Some(last) = samples.last() else {
        return;
    };
    let span = last.at.as_secs_f64().max(1e-3);
    let top = samples.iter().map(|s| s.cwnd).max().unwrap_or(1).max(1);
    let mut cols = [0u32; CHART_COLUMNS];
    let mut losses = [false; CHART_COLUMNS];
    let mut before = 0;
    for s in samples {
        let col = ((s.at.as_secs_f64() / span) * (CHART_COLUMNS - 1) as f64) as usize;
        cols[col] = cols[col].max(s.cwnd);
        losses[col] |= s.retransmitted > before;
        before = s.retransmitted;
    }
    // A column no sample fell in keeps the window of the one before.
    for i in 1..CHART_COLUMNS {
        if cols[i] == 0 {
            cols[i] = cols[i - 1];
        }
    }
    println!("  congestion window over time (KB; ! marks retransmissions):");
    for row in (0..CHART_ROWS).rev() {
        let level = u64::from(top) * (row as u64 + 1) / CHART_ROWS as u64;
        let line: String = cols
            .iter()
            .map(|&c| if u64::from(c) >= level { '#' } else { ' ' })
            .collect();
        let label = if row == CHART_ROWS - 1 || row == 0 {
            format!("{:>6}", level / 1024)
        } else {
            String::new()
        };
        println!("  {label:>6} |{line}");
    }
    let marks: String = losses.iter().map(|&l| if l { '!' } else { ' ' }).collect();
    println!("         +{}", "-".repeat(CHART_COLUMNS));
    println!("          {marks}");
    println!("          0 s{:>w$.2} s", span, w = CHART_COLUMNS - 3);
}
