//! Capture of every frame a link moves, both ways, into a pcap file.

use std::io::{self, Write};
use std::os::fd::RawFd;
use std::time::Duration;

use exonet_wire::pcap::PcapWriter;
use exonet_wire::WireError;

use crate::{sendable, Clock, Link, LinkStats, SystemClock};

/// A link that records each frame it receives or sends into a [`PcapWriter`],
/// stamped with its clock (wall-clock time by default).
///
/// Networking does not stop when the capture fails: the first write error ends the
/// capture and is kept for [`flush`](PcapCapture::flush) to return.
#[derive(Debug)]
pub struct PcapCapture<L, W: Write, C = SystemClock> {
    inner: L,
    writer: PcapWriter<W>,
    clock: C,
    error: Option<WireError>,
}

impl<L: Link, W: Write> PcapCapture<L, W> {
    /// Captures to `writer` with wall-clock timestamps.
    pub fn new(inner: L, writer: PcapWriter<W>) -> Self {
        Self::with_clock(inner, writer, SystemClock)
    }
}

impl<L: Link, W: Write, C: Clock> PcapCapture<L, W, C> {
    /// Captures to `writer`, stamping frames with `clock` (taken as time since the
    /// Unix epoch).
    pub fn with_clock(inner: L, writer: PcapWriter<W>, clock: C) -> Self {
        PcapCapture {
            inner,
            writer,
            clock,
            error: None,
        }
    }

    /// Flushes the capture; the first error the capture met, if any.
    pub fn flush(&mut self) -> Result<(), WireError> {
        match self.error.take() {
            Some(e) => Err(e),
            None => self.writer.flush(),
        }
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// The wrapped link and the writer (not flushed).
    pub fn into_parts(self) -> (L, PcapWriter<W>) {
        (self.inner, self.writer)
    }
}

fn record<W: Write>(
    writer: &mut PcapWriter<W>,
    error: &mut Option<WireError>,
    ts: Duration,
    frame: &[u8],
) {
    if error.is_none() {
        if let Err(e) = writer.write_packet(ts, frame) {
            *error = Some(e);
        }
    }
}

impl<L: Link, W: Write + Send, C: Clock + Send> Link for PcapCapture<L, W, C> {
    recv_batch_from_checked!();

    fn recv_batch_checked(
        &mut self,
        f: &mut dyn FnMut(&[u8], bool),
        max: usize,
    ) -> io::Result<usize> {
        // One timestamp per batch: the frames arrived together.
        let ts = self.clock.now();
        let (writer, error) = (&mut self.writer, &mut self.error);
        self.inner.recv_batch_checked(
            &mut |frame, ok| {
                record(writer, error, ts, frame);
                f(frame, ok);
            },
            max,
        )
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        let ts = self.clock.now();
        let (writer, error) = (&mut self.writer, &mut self.error);
        self.inner.send_with(&mut |buf| {
            let len = fill(buf)?;
            if sendable(len, buf.len()) {
                record(writer, error, ts, &buf[..len]);
            }
            Some(len)
        })
    }

    forward_to_inner!();

    forward_kicks_to_inner!();
}
