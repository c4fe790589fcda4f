//! A microbenchmark helper for `exonet bench`: round trips through all four
//! rings of a real segment between two busy-polling threads.

use std::error::Error;
use std::hint::spin_loop;
use std::thread;
use std::time::{Duration, Instant};

use crate::{AppEndpoint, Desc, RingError, Segment, SegmentConfig, INLINE_MAX};

/// Mean time of one round trip of a `len`-byte frame: the multiplexer
/// thread puts it on rx (inline, or copied into a buffer from the free
/// ring), the application thread reads it and sends it back on tx (inline,
/// or the same buffer), the multiplexer copies it out and returns the
/// buffer on completion, which the application puts back on free. Both
/// threads busy-poll; nobody sleeps.
pub fn round_trip(
    len: usize,
    inline: bool,
    iterations: u32,
) -> Result<Duration, Box<dyn Error + Send + Sync>> {
    let config = SegmentConfig {
        frame_size: 2048,
        frame_count: 256,
        ring_entries: [256; 4],
    };
    if len > config.frame_size as usize || (inline && len > INLINE_MAX) || iterations == 0 {
        return Err(format!(
            "cannot time {iterations} round trips of {len} bytes (inline: {inline})"
        )
        .into());
    }
    let (mut app, mut mux) = Segment::create(&config)?.split()?;
    for buf in app.frames.layout().buffers() {
        app.free.push(Desc::buffer(buf, 0, 0))?;
    }
    let echo = thread::spawn(move || echo(&mut app, iterations));

    let payload = vec![0x5a; len];
    let mut out = vec![0; len];
    let mut inline_buf = [0; INLINE_MAX];
    let start = Instant::now();
    for _ in 0..iterations {
        if inline {
            while !mux.rx.push_inline(1, &payload)? {
                spin_loop();
            }
        } else {
            let buf = loop {
                if let Some(d) = mux.free.pop()? {
                    break d;
                }
                spin_loop();
            };
            mux.frames.layout().validate_buffer(buf)?;
            mux.frames.write(buf.offset, &payload)?;
            while !mux.rx.push(Desc::buffer(buf.offset, len as u32, 1))? {
                spin_loop();
            }
        }
        let d = loop {
            if let Some(d) = mux.tx.pop_frame(&mut inline_buf)? {
                break d;
            }
            spin_loop();
        };
        mux.frames.layout().validate_frame(d)?;
        if !d.is_inline() {
            mux.frames.read(d, &mut out)?;
            while !mux
                .completion
                .push(Desc::buffer(d.offset, d.len, d.channel))?
            {
                spin_loop();
            }
        }
    }
    let elapsed = start.elapsed();
    echo.join().map_err(|_| "echo thread panicked")??;
    Ok(elapsed / iterations)
}

/// The application's half: echo each frame, recycle completed buffers.
fn echo(app: &mut AppEndpoint, iterations: u32) -> Result<(), RingError> {
    let mut inline_buf = [0; INLINE_MAX];
    let mut frame = vec![0; app.frames.layout().frame_size() as usize];
    for _ in 0..iterations {
        let d = loop {
            if let Some(d) = app.rx.pop_frame(&mut inline_buf)? {
                break d;
            }
            while let Some(c) = app.completion.pop()? {
                app.free.push(Desc::buffer(c.offset, 0, 0))?;
            }
            spin_loop();
        };
        let sent = if d.is_inline() {
            app.tx
                .push_inline(d.channel, &inline_buf[..d.len as usize])?
        } else {
            // Read it as an application would, then send it back in place.
            app.frames
                .read(d, &mut frame)
                .expect("the multiplexer's descriptor");
            app.tx.push(d)?
        };
        assert!(sent, "tx ring full with one frame in flight");
    }
    Ok(())
}
