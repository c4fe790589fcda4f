//! Two threads drive both directions of one endpoint at once, with random
//! batch sizes, frames inline and in buffers, and sleeping whenever idle.
//! Every frame arrives once, in order, intact; no sleep ever times out
//! (which would be a lost wake-up).
#![cfg(not(loom))]

use std::thread;
use std::time::Duration;

use exonet_shm::*;

const FRAMES: u32 = 300_000;
const SLEEP: Option<Duration> = Some(Duration::from_secs(20));

/// xorshift32: batch sizes that differ between the two threads.
struct Rng(u32);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0 % n
    }
}

/// Frame `seq` of direction `dir`: its bytes, and whether it goes inline.
fn frame(dir: u8, seq: u32) -> (Vec<u8>, bool) {
    let len = 4 + (seq.wrapping_mul(2654435761) >> 8) as usize % 400;
    let mut bytes: Vec<u8> = (0..len).map(|k| (k as u32 + seq) as u8 ^ dir).collect();
    bytes[..4].copy_from_slice(&seq.to_le_bytes());
    (bytes, len <= INLINE_MAX && !seq.is_multiple_of(4))
}

/// The bytes of a received frame, from the ring or its buffer.
fn received(c: &Consumer, frames: &Frames, i: u32, d: Desc, out: &mut [u8; 512]) -> usize {
    frames.layout().validate_frame(d).unwrap();
    if d.is_inline() {
        c.read_inline(i, &d, out)
    } else {
        frames.read(d, out).unwrap()
    }
}

fn application(mut app: AppEndpoint) -> (u32, u32) {
    let layout = *app.frames.layout();
    let buffers: Vec<u32> = layout.buffers().collect();
    let (for_rx, mut tx_pool) = (buffers[..64].to_vec(), buffers[64..].to_vec());
    for b in for_rx {
        assert!(app.free.push(Desc::buffer(b, 0, 0)).unwrap());
    }
    let mut rng = Rng(0x1234_5678);
    let (mut rx_seq, mut tx_seq, mut woken, mut ready) = (0, 0, 0, 0);
    let mut out = [0u8; 512];
    while rx_seq < FRAMES || tx_seq < FRAMES {
        let mut kick = false;
        // Receive a batch; buffers go straight back to free.
        let k = app.rx.peek(1 + rng.below(32)).unwrap();
        let mut back = vec![];
        for i in 0..k {
            let d = app.rx.read(i);
            let n = received(&app.rx, &app.frames, i, d, &mut out);
            let (bytes, inline) = frame(1, rx_seq);
            assert_eq!(
                (d.is_inline(), &out[..n]),
                (inline, &bytes[..]),
                "rx frame {rx_seq}"
            );
            if !inline {
                back.push(layout.buffer_of(d.offset).unwrap());
            }
            rx_seq += 1;
        }
        app.rx.release(k);
        assert_eq!(
            app.free.reserve(back.len() as u32).unwrap() as usize,
            back.len()
        );
        for (i, &b) in back.iter().enumerate() {
            app.free.write(i as u32, Desc::buffer(b, 0, 0));
        }
        app.free.submit(back.len() as u32);
        kick |= k > 0;
        // Buffers of sent frames come back.
        while let Some(c) = app.completion.pop().unwrap() {
            layout.validate_buffer(c).unwrap();
            tx_pool.push(c.offset);
        }
        // Send a batch, as far as ring room and buffers allow.
        let want = (1 + rng.below(32)).min(FRAMES - tx_seq);
        let room = app.tx.reserve(want).unwrap();
        let mut written = 0;
        while written < room {
            let (bytes, inline) = frame(2, tx_seq);
            if inline {
                app.tx.write_inline(written, 2, &bytes).unwrap();
            } else {
                let Some(b) = tx_pool.pop() else { break };
                app.frames.write(b, &bytes).unwrap();
                app.tx
                    .write(written, Desc::buffer(b, bytes.len() as u32, 2));
            }
            written += 1;
            tx_seq += 1;
        }
        app.tx.submit(written);
        kick |= written > 0;
        if kick {
            app.kick.notify_if_sleeping().unwrap();
            continue;
        }
        let can_send = tx_seq < FRAMES && (!tx_pool.is_empty() || frame(2, tx_seq).1);
        let w = app
            .wake
            .sleep(SLEEP, || {
                app.rx.has_pending()
                    || app.completion.has_pending()
                    || (can_send && app.tx.reserve(1).unwrap() > 0)
            })
            .unwrap();
        assert_ne!(
            w,
            Wakeup::TimedOut,
            "application: lost wake-up at rx {rx_seq} tx {tx_seq}"
        );
        woken += (w == Wakeup::Signaled) as u32;
        ready += (w == Wakeup::Ready) as u32;
    }
    (woken, ready)
}

fn multiplexer(mut mux: MuxEndpoint) -> (u32, u32) {
    let layout = *mux.frames.layout();
    let mut rng = Rng(0x9abc_def0);
    let (mut rx_seq, mut tx_seq, mut woken, mut ready) = (0, 0, 0, 0);
    let mut out = [0u8; 512];
    while rx_seq < FRAMES || tx_seq < FRAMES {
        // Transmit scan: copy out, check, give buffers back.
        let k = mux.tx.peek(1 + rng.below(32)).unwrap();
        for i in 0..k {
            let d = mux.tx.read(i);
            let n = received(&mux.tx, &mux.frames, i, d, &mut out);
            let (bytes, inline) = frame(2, tx_seq);
            assert_eq!(
                (d.is_inline(), &out[..n]),
                (inline, &bytes[..]),
                "tx frame {tx_seq}"
            );
            if !inline {
                let c = Desc::buffer(layout.buffer_of(d.offset).unwrap(), d.len, d.channel);
                assert!(
                    mux.completion.push(c).unwrap(),
                    "completion ring holds every buffer"
                );
            }
            tx_seq += 1;
        }
        mux.tx.release(k);
        if k > 0 {
            // Completions, or at least tx room, for the application.
            mux.upcall.notify_if_sleeping().unwrap();
        }
        // Receive: frames into the application's free buffers.
        let want = (1 + rng.below(32)).min(FRAMES - rx_seq);
        let room = mux.rx.reserve(want).unwrap();
        let mut written = 0;
        while written < room {
            let (bytes, inline) = frame(1, rx_seq);
            if inline {
                mux.rx.write_inline(written, 1, &bytes).unwrap();
            } else {
                let Some(b) = mux.free.pop().unwrap() else {
                    break;
                };
                layout.validate_buffer(b).unwrap();
                mux.frames.write(b.offset, &bytes).unwrap();
                mux.rx
                    .write(written, Desc::buffer(b.offset, bytes.len() as u32, 1));
            }
            written += 1;
            rx_seq += 1;
        }
        mux.rx.submit(written);
        if written > 0 {
            mux.upcall.notify_rx(&mux.rx).unwrap();
        }
        if k > 0 || written > 0 {
            continue;
        }
        let can_receive = rx_seq < FRAMES;
        let w = mux
            .wake
            .sleep(SLEEP, || {
                mux.tx.has_pending()
                    || (can_receive
                        && mux.rx.reserve(1).unwrap() > 0
                        && (frame(1, rx_seq).1 || mux.free.has_pending()))
            })
            .unwrap();
        assert_ne!(
            w,
            Wakeup::TimedOut,
            "multiplexer: lost wake-up at rx {rx_seq} tx {tx_seq}"
        );
        woken += (w == Wakeup::Signaled) as u32;
        ready += (w == Wakeup::Ready) as u32;
    }
    (woken, ready)
}

#[test]
fn both_directions_under_load() {
    let config = SegmentConfig {
        frame_size: 512,
        frame_count: 128,
        ring_entries: [64, 32, 32, 64],
    };
    let seg = Segment::create(&config).unwrap();
    // Two mappings, as across processes.
    let peer = Segment::open(seg.fd().try_clone_to_owned().unwrap()).unwrap();
    let events = Doorbells::new().unwrap();
    let mux_events = events.try_clone().unwrap();
    let app = peer.into_app(events);
    let mux = seg.into_mux(mux_events);
    let a = thread::spawn(move || application(app));
    let m = thread::spawn(move || multiplexer(mux));
    let (a, m) = (a.join().unwrap(), m.join().unwrap());
    eprintln!(
        "{FRAMES} frames each way; application woken {} times (re-check found work {} times), multiplexer {} ({})",
        a.0, a.1, m.0, m.1
    );
}
