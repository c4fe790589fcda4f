//! `exonet raw-echo`: an application on an endpoint that answers every UDP
//! frame on its port with the same frame, addresses and ports swapped,
//! written raw into its segment (no protocol library: the multiplexer's
//! template check is what keeps it honest).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::tool;
use exonet_shm::control::{default_socket_path, Client, ControlError, PROTO_UDP};
use exonet_shm::{AppEndpoint, Desc, SegmentConfig, INLINE_MAX};

#[derive(Debug, Args)]
pub struct RawEchoArgs {
    #[command(flatten)]
    at: tool::EchoAt,
}

pub fn run(args: &RawEchoArgs) -> ExitCode {
    match echo(args) {
        Ok(n) => {
            eprintln!("exonet raw-echo: answered {n} frames");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("exonet raw-echo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn echo(args: &RawEchoArgs) -> Result<u64, ControlError> {
    let socket = args.at.socket.clone().unwrap_or_else(default_socket_path);
    let mut c = Client::connect(&socket)?;
    let info = c.info()?;
    let ip = match args.at.ip {
        Some(ip) => ip,
        None => info
            .addrs
            .first()
            .map(|a| a.0)
            .ok_or_else(|| ControlError::Protocol("the daemon has no address".into()))?,
    };
    let config = SegmentConfig {
        frame_size: 2048,
        frame_count: 512,
        ring_entries: [256; 4],
    };
    let (ep, mut app) = c.create_endpoint(&config)?;
    let buffers: Vec<u32> = app.frames.layout().buffers().collect();
    let (rx_bufs, tx_bufs) = buffers.split_at(buffers.len() / 2);
    for &b in rx_bufs {
        app.free
            .push(Desc::buffer(b, 0, 0))
            .map_err(|e| ControlError::Protocol(format!("free ring: {e:?}")))?;
    }
    let mut pool = tx_bufs.to_vec();
    let (_, port) = c.bind_socket(ep, PROTO_UDP, (ip, args.at.port), None)?;
    eprintln!("exonet raw-echo: endpoint {ep}, answering UDP {ip}:{port}");
    let limit = args.at.count.unwrap_or(u64::MAX);
    let mut answered = 0u64;
    let mut frame = vec![0u8; 2048];
    let mut inline = [0u8; INLINE_MAX];
    while answered < limit {
        let mut moved = false;
        while let Ok(Some(d)) = app.completion.pop() {
            if let Some(b) = app.frames.layout().buffer_of(d.offset) {
                pool.push(b);
            }
        }
        while answered < limit {
            let Ok(Some(d)) = app.rx.pop_frame(&mut inline) else {
                break;
            };
            moved = true;
            let len = if d.is_inline() {
                let n = d.len as usize;
                frame[..n].copy_from_slice(&inline[..n]);
                n
            } else {
                let n = app.frames.read(d, &mut frame).unwrap_or(0);
                if let Some(b) = app.frames.layout().buffer_of(d.offset) {
                    // Cannot fail: the ring has room for every buffer.
                    let _ = app.free.push(Desc::buffer(b, 0, 0));
                }
                n
            };
            if swap(&mut frame[..len], info.mac)
                && send(&mut app, &mut pool, &frame[..len], d.channel)
            {
                answered += 1;
            }
        }
        if moved {
            app.kick.notify_if_sleeping()?;
        } else {
            c.wait(&app, Some(Duration::from_millis(100)), || {
                app.rx.has_pending()
            })?;
        }
    }
    Ok(answered)
}

/// Puts a frame on the tx ring, inline when short; false when there is no
/// room (the frame is dropped, as a busy host would).
fn send(app: &mut AppEndpoint, pool: &mut Vec<u32>, frame: &[u8], channel: u32) -> bool {
    if frame.len() <= INLINE_MAX && app.tx.has_inline() {
        return matches!(app.tx.push_inline(channel, frame), Ok(true));
    }
    let Some(b) = pool.pop() else { return false };
    if app.frames.write(b, frame).is_ok()
        && matches!(
            app.tx.push(Desc::buffer(b, frame.len() as u32, channel)),
            Ok(true)
        )
    {
        return true;
    }
    pool.push(b);
    false
}

/// Turns a UDP/IPv4 frame into its answer: Ethernet, IP and port fields
/// swapped (the checksums stay valid: their sums do not depend on order).
/// False for anything else.
pub(crate) fn swap(f: &mut [u8], mac: [u8; 6]) -> bool {
    if f.len() < 42 || f[12..14] != [0x08, 0x00] || f[14] >> 4 != 4 || f[23] != 17 {
        return false;
    }
    let ihl = (f[14] & 0x0f) as usize * 4;
    if ihl < 20 || f.len() < 14 + ihl + 8 {
        return false;
    }
    let (dst, src) = f.split_at_mut(6);
    dst.copy_from_slice(&src[..6]);
    src[..6].copy_from_slice(&mac);
    for i in 0..4 {
        f.swap(26 + i, 30 + i);
    }
    let u = 14 + ihl;
    for i in 0..2 {
        f.swap(u + i, u + 2 + i);
    }
    true
}
