//! `ring-rtt` (system `exonet`) and `ring-mpps`: the rings of one segment
//! between this process, the multiplexer's side, and a child process, the
//! application's side, as the daemon and an application share an endpoint.
//!
//! This process creates the segment and its eventfds (as the multiplexer
//! does) and hands their descriptors to the child, which opens the segment
//! as a peer would (`Segment::open`: sealed, its header checked) and takes
//! the application's side. Both sides busy-poll, and follow the wake-up
//! protocol all the same (a notify after every batch that moved an index:
//! a fence and a load while the other side is awake).

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use clap::Args;
use exonet_shm::{
    AppEndpoint, Desc, Doorbell, Doorbells, MuxEndpoint, Segment, SegmentConfig, Wakeup, INLINE_MAX,
};

use super::peer::{self, Patience, Peer, PATIENCE};
use super::{error, MSG};
use crate::bench::measure::{self, Budget};
use crate::bench::report::Fail;

/// The channel of every message, and the one that tells the child to stop.
const CHANNEL: u32 = 1;
const STOP: u32 = u32::MAX;
/// Most descriptors moved per batch in `ring-mpps`.
const BATCH: u32 = 64;

fn config() -> SegmentConfig {
    // As many buffers as the free ring holds, so that the application can
    // always give every buffer back at once.
    SegmentConfig {
        frame_size: 2048,
        frame_count: 512,
        ring_entries: [512; 4],
    }
}

/// The child's arguments: the descriptors it was left and how long it may
/// live.
#[derive(Debug, Args)]
pub struct RingArgs {
    /// The segment's memfd.
    #[arg(long)]
    segment: RawFd,
    /// The application's doorbell: the end it sleeps on, the end rung.
    #[arg(long, num_args = 2)]
    app_bell: Vec<RawFd>,
    /// The multiplexer's doorbell, likewise.
    #[arg(long, num_args = 2)]
    mux_bell: Vec<RawFd>,
    #[arg(long)]
    lifetime_ms: u64,
    /// A socket whose hang-up says this process is gone: given, the
    /// application sleeps between frames as a stack does through a daemon
    /// (`Sleeper::sleep_or_hangup`, in `FUTEX_WAIT`).
    #[arg(long)]
    hangup: Option<RawFd>,
}

/// Creates a segment and starts the child `role` on its application side;
/// with `hangup`, one end of a socket pair (kept open by the caller) for the
/// child to sleep with.
fn start(
    role: &str,
    budget: &Budget,
    hangup: Option<&UnixStream>,
) -> Result<(MuxEndpoint, Peer), Fail> {
    let seg = Segment::create(&config()).map_err(error("cannot create a segment"))?;
    let bells = Doorbells::new().map_err(error("cannot create doorbells"))?;
    let (app_rx, app_tx) = bells.app.fds();
    let (mux_rx, mux_tx) = bells.mux.fds();
    let mut fds = [seg.fd(), app_rx, app_tx, mux_rx, mux_tx]
        .map(|fd| fd.as_raw_fd())
        .to_vec();
    let mut cmd = peer::command(None)?;
    cmd.arg(role)
        .arg("--segment")
        .arg(fds[0].to_string())
        .arg("--app-bell")
        .args([fds[1].to_string(), fds[2].to_string()])
        .arg("--mux-bell")
        .args([fds[3].to_string(), fds[4].to_string()])
        .arg("--lifetime-ms")
        .arg(peer::lifetime(budget).as_millis().to_string());
    if let Some(h) = hangup {
        fds.push(h.as_raw_fd());
        cmd.arg("--hangup").arg(h.as_raw_fd().to_string());
    }
    let app = Peer::spawn(cmd, &fds, "application")?;
    Ok((seg.into_mux(bells), app))
}

/// A failed wait for the child is the child's failure if it died.
fn blame<T>(r: Result<T, Fail>, app: &mut Peer) -> Result<T, Fail> {
    r.map_err(|e| app.failed().unwrap_or(e))
}

/// Tells the child to stop and waits for it.
fn stop(mux: &mut MuxEndpoint, app: &mut Peer) -> Result<(), Fail> {
    let mut p = Patience::new(PATIENCE);
    while !mux.rx.push_inline(STOP, &[]).map_err(error("rx"))? {
        p.spin("waiting for room on rx to say stop")?;
    }
    mux.upcall.notify_rx(&mux.rx).map_err(error("upcall"))?;
    app.finish(PATIENCE).map(drop)
}

/// Median round-trip time in nanoseconds of a [`MSG`]-byte frame: inline
/// on rx to the application, which sends it back inline on tx. Both sides
/// busy-poll, or with `sleeping` both sleep while they wait, each as it
/// does in a daemon and a stack: the application in `FUTEX_WAIT`, woken by
/// the multiplexer's notify; the multiplexer on its doorbell, rung by the
/// application's kick.
pub fn rtt(budget: &Budget, sleeping: bool) -> Result<f64, Fail> {
    let pair = if sleeping {
        Some(UnixStream::pair().map_err(error("cannot create a socket pair"))?)
    } else {
        None
    };
    let (mut mux, mut app) = start("ring-echo", budget, pair.as_ref().map(|(_, h)| h))?;
    let msg = [0x5au8; MSG];
    let mut back = [0u8; INLINE_MAX];
    let measured = round_trip(&mut mux, &msg, &mut back, sleeping).and_then(|()| {
        // The first answer also said that the child is up.
        measure::ns_per_op(budget, |n| {
            let t = Instant::now();
            for _ in 0..n {
                round_trip(&mut mux, &msg, &mut back, sleeping)?;
            }
            Ok(t.elapsed())
        })
    });
    let ns = blame(measured, &mut app)?;
    stop(&mut mux, &mut app)?;
    Ok(ns)
}

fn round_trip(
    mux: &mut MuxEndpoint,
    msg: &[u8],
    back: &mut [u8; INLINE_MAX],
    sleeping: bool,
) -> Result<(), Fail> {
    let mut p = Patience::new(PATIENCE);
    while !mux.rx.push_inline(CHANNEL, msg).map_err(error("rx"))? {
        p.spin("waiting for room on rx")?;
    }
    mux.upcall.notify_rx(&mux.rx).map_err(error("upcall"))?;
    p.reset();
    let d = loop {
        if let Some(d) = mux.tx.pop_frame(back).map_err(error("tx"))? {
            break d;
        }
        if sleeping {
            let tx = &mux.tx;
            mux.wake
                .sleep(Some(PATIENCE), || tx.has_pending())
                .map_err(error("sleep"))?;
        }
        p.spin("waiting for the echo on tx")?;
    };
    mux.upcall.notify_if_sleeping().map_err(error("upcall"))?;
    mux.frames
        .layout()
        .validate_frame(d)
        .map_err(error("the echo's descriptor"))?;
    if !d.is_inline() || d.channel != CHANNEL || back[..d.len as usize] != *msg {
        return Err(Fail::Error(format!("the echo is not the message: {d:?}")));
    }
    Ok(())
}

/// Millions of descriptors per second, each naming a [`MSG`]-byte frame,
/// through the rx ring (and their buffers back through the free ring): this
/// process takes buffers from free and puts them on rx, the child takes
/// them from rx and puts them back on free, [`BATCH`] at a time. Frame
/// bytes are not touched; this is the rings' own rate.
pub fn mpps(budget: &Budget) -> Result<f64, Fail> {
    let (mut mux, mut app) = start("ring-sink", budget, None)?;
    // The child is up when its buffers arrive.
    let mut p = Patience::new(PATIENCE);
    let mut up = Ok(());
    while up.is_ok() && !mux.free.has_pending() {
        up = p.spin("waiting for the application's buffers");
    }
    let measured = up.and_then(|()| {
        measure::ns_per_op(budget, |n| {
            let t = Instant::now();
            stream(&mut mux, n)?;
            Ok(t.elapsed())
        })
    });
    let ns = blame(measured, &mut app)?;
    stop(&mut mux, &mut app)?;
    Ok(1e3 / ns)
}

/// Puts `n` descriptors on rx, each on a buffer taken from free.
fn stream(mux: &mut MuxEndpoint, n: u64) -> Result<(), Fail> {
    let layout = *mux.frames.layout();
    let mut left = n;
    let mut p = Patience::new(PATIENCE);
    while left > 0 {
        let room = mux
            .rx
            .reserve(left.min(BATCH.into()) as u32)
            .map_err(error("rx"))?;
        let k = mux.free.peek(room).map_err(error("free"))?;
        if k == 0 {
            p.spin("waiting for buffers on free and room on rx")?;
            continue;
        }
        p.reset();
        for i in 0..k {
            let b = mux.free.read(i);
            layout
                .validate_buffer(b)
                .map_err(error("a buffer on free"))?;
            mux.rx.write(i, Desc::buffer(b.offset, MSG as u32, CHANNEL));
        }
        // Free entries go back before the rx entries appear, so that the
        // application always finds room on free for what it takes from rx.
        mux.free.release(k);
        mux.rx.submit(k);
        mux.upcall.notify_rx(&mux.rx).map_err(error("upcall"))?;
        left -= u64::from(k);
    }
    Ok(())
}

/// The child's side: opens the segment it was handed.
fn open(args: &RingArgs) -> Result<(AppEndpoint, Instant), Fail> {
    let mut all = vec![args.segment];
    all.extend(&args.app_bell);
    all.extend(&args.mux_bell);
    let fds = peer::adopt(&all)?;
    let [seg, app_rx, app_tx, mux_rx, mux_tx]: [OwnedFd; 5] = fds
        .try_into()
        .map_err(|_| Fail::Error("five descriptors expected".into()))?;
    let seg = Segment::open(seg).map_err(error("cannot open the segment"))?;
    let bells = Doorbells {
        app: Doorbell::from_fds(app_rx, app_tx).map_err(error("doorbell"))?,
        mux: Doorbell::from_fds(mux_rx, mux_tx).map_err(error("doorbell"))?,
    };
    let deadline = Instant::now() + Duration::from_millis(args.lifetime_ms);
    Ok((seg.into_app(bells), deadline))
}

/// `exonet bench-child ring-echo`: sends every frame that arrives on rx
/// back on tx, until told to stop; with `--hangup`, sleeping while none
/// has come.
pub fn echo(args: &RingArgs) -> Result<(), Fail> {
    let (mut app, deadline) = open(args)?;
    let hangup = args.hangup.map(|fd| peer::adopt(&[fd])).transpose()?;
    let hangup = hangup
        .as_ref()
        .and_then(|fds| fds.first())
        .map(|fd| fd.as_fd());
    let layout = *app.frames.layout();
    let mut buf = [0u8; INLINE_MAX];
    let mut count = 0u64;
    loop {
        let mut p = Patience::new(PATIENCE);
        let d = loop {
            if let Some(d) = app.rx.pop_frame(&mut buf).map_err(error("rx"))? {
                break d;
            }
            if let Some(h) = hangup {
                let rx = &app.rx;
                let woke = app
                    .wake
                    .sleep_or_hangup(Some(PATIENCE), Some(h), || rx.has_pending())
                    .map_err(error("sleep"))?;
                if woke == Wakeup::HangUp {
                    return Err(Fail::Error("the multiplexer's side went away".into()));
                }
            }
            p.spin("waiting for a frame on rx")?;
        };
        if d.channel == STOP {
            return Ok(());
        }
        layout.validate_frame(d).map_err(error("a frame on rx"))?;
        if !d.is_inline() {
            return Err(Fail::Error(format!("a frame not inline: {d:?}")));
        }
        p.reset();
        while !app
            .tx
            .push_inline(d.channel, &buf[..d.len as usize])
            .map_err(error("tx"))?
        {
            p.spin("waiting for room on tx")?;
        }
        app.kick.notify_if_sleeping().map_err(error("kick"))?;
        count += 1;
        if count.is_multiple_of(1024) {
            peer::check_lifetime(deadline)?;
        }
    }
}

/// `exonet bench-child ring-sink`: puts every buffer on free, then gives
/// back the buffer of every descriptor that arrives on rx, until told to
/// stop.
pub fn sink(args: &RingArgs) -> Result<(), Fail> {
    let (mut app, deadline) = open(args)?;
    let layout = *app.frames.layout();
    for b in layout.buffers() {
        if !app
            .free
            .push(Desc::buffer(b, 0, 0))
            .map_err(error("free"))?
        {
            return Err(Fail::Error(
                "the free ring holds fewer than all buffers".into(),
            ));
        }
    }
    app.kick.notify_if_sleeping().map_err(error("kick"))?;
    let mut p = Patience::new(PATIENCE);
    let mut batches = 0u64;
    loop {
        let n = app.rx.peek(BATCH).map_err(error("rx"))?;
        if n == 0 {
            p.spin("waiting for descriptors on rx")?;
            continue;
        }
        p.reset();
        let room = app.free.reserve(n).map_err(error("free"))?;
        let mut k = 0;
        while k < n {
            let d = app.rx.read(k);
            if d.channel == STOP {
                break;
            }
            // Every buffer on rx came from free, so free has room for all.
            if k == room {
                return Err(Fail::Error("no room on free for a buffer from rx".into()));
            }
            layout.validate_frame(d).map_err(error("a frame on rx"))?;
            let base = layout
                .buffer_of(d.offset)
                .ok_or_else(|| Fail::Error(format!("no buffer at {:#x}", d.offset)))?;
            app.free.write(k, Desc::buffer(base, 0, 0));
            k += 1;
        }
        app.free.submit(k);
        if k < n {
            app.rx.release(k + 1);
            return Ok(());
        }
        app.rx.release(k);
        app.kick.notify_if_sleeping().map_err(error("kick"))?;
        batches += 1;
        if batches.is_multiple_of(1024) {
            peer::check_lifetime(deadline)?;
        }
    }
}
