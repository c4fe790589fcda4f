//! Protocol composition: IPv4 + UDP + an application layer as one handler,
//! against doing the same separately (etherparse), and the final phase's
//! commit/abort order.

use std::sync::{Arc, Mutex};

use etherparse::PacketBuilder;
use exonet_ash::layer::{
    ComposeError, Composition, Ipv4Layer, Layer, LayerError, LayerPipes, Message, Pass, UdpLayer,
    Verdict, MAX_LAYERS, MAX_PIPE_LAYERS,
};
use exonet_ash::pipe::builtins;
use proptest::prelude::*;

const PAYLOAD_AT: usize = 14 + 20 + 8;

fn udp_frame(payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .udp(4000, 5000);
    let mut out = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut out, payload).expect("frame builds");
    out
}

fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}

/// The byte swap pipe's reference: 32-bit words swapped, a partial word
/// at the end copied.
fn swapped(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    for c in v.chunks_exact_mut(4) {
        c.reverse();
    }
    v
}

#[derive(Default)]
struct AppState {
    data: Vec<u8>,
    bodies: u32,
    commits: u32,
    aborts: u32,
}

/// The application: copies (up to `take` bytes of) the payload into its
/// buffer through its own byte swap pipe.
struct App {
    state: Arc<Mutex<AppState>>,
    take: Option<usize>,
}

impl Layer for App {
    fn pipes(&self) -> LayerPipes {
        LayerPipes {
            up: Vec::new(),
            own: vec![builtins::byte_swap32()],
        }
    }

    fn body(&mut self, msg: &mut Message<'_>) -> Result<Pass, LayerError> {
        let mut st = self.state.lock().expect("not poisoned");
        st.bodies += 1;
        let n = self.take.unwrap_or(usize::MAX).min(msg.remaining());
        st.data.resize(n, 0);
        msg.consume_into(&mut st.data, n, true)?;
        Ok(Pass::Consumed)
    }

    fn commit(&mut self, _: &Message<'_>) -> Result<(), LayerError> {
        self.state.lock().expect("not poisoned").commits += 1;
        Ok(())
    }

    fn abort(&mut self) {
        let mut st = self.state.lock().expect("not poisoned");
        st.aborts += 1;
        st.data.clear();
    }
}

fn stack(take: Option<usize>) -> (Composition, Arc<Mutex<AppState>>) {
    let state = Arc::new(Mutex::new(AppState::default()));
    let c = Composition::new(vec![
        Box::new(Ipv4Layer),
        Box::new(UdpLayer::default()),
        Box::new(App {
            state: state.clone(),
            take,
        }),
    ])
    .expect("composes");
    (c, state)
}

#[test]
fn good_datagrams_are_consumed_by_one_compiled_loop() {
    let (mut c, state) = stack(None);
    let compiled = c.stats().compiled;
    assert!(compiled > 0);
    for (i, len) in [0usize, 1, 2, 3, 7, 8, 9, 63, 64, 65, 1000, 1472]
        .into_iter()
        .enumerate()
    {
        let payload = noise(len as u64, len);
        let frame = udp_frame(&payload);
        let before = c.stats();
        assert_eq!(c.run(&frame), Verdict::Consumed, "len {len}");
        let after = c.stats();
        // The UDP checksum and the application's byte swap ran in one
        // compiled transfer: no second pass over the payload.
        assert_eq!(after.transfers - before.transfers, 1, "len {len}");
        assert_eq!(after.scans, before.scans, "len {len}");
        let st = state.lock().expect("not poisoned");
        // The same bytes as parsing and swapping separately.
        let sliced = etherparse::SlicedPacket::from_ethernet(&frame).expect("parses");
        let Some(etherparse::TransportSlice::Udp(udp)) = sliced.transport else {
            panic!("not UDP");
        };
        let separate = swapped(udp.payload());
        assert_eq!(st.data, separate, "len {len}");
        assert_eq!(st.commits as usize, i + 1);
        assert_eq!(st.aborts, 0);
    }
    // Everything was compiled when the layers were composed.
    assert_eq!(c.stats().compiled, compiled);
    assert_eq!(c.stats().consumed, 12);
}

#[test]
fn corrupt_payload_fails_the_udp_commit_and_aborts_the_application() {
    let (mut c, state) = stack(None);
    for at in [0usize, 1, 99, 200] {
        let mut frame = udp_frame(&noise(7, 201));
        frame[PAYLOAD_AT + at] ^= 0x10;
        assert_eq!(c.run(&frame), Verdict::Drop);
        let st = state.lock().expect("not poisoned");
        assert_eq!(st.commits, 0);
        assert!(st.data.is_empty(), "the abort undid the copy");
    }
    assert_eq!(state.lock().expect("not poisoned").aborts, 4);
    // A corrupt checksum field too.
    let mut frame = udp_frame(&noise(8, 50));
    frame[PAYLOAD_AT - 1] ^= 1;
    assert_eq!(c.run(&frame), Verdict::Drop);
    assert_eq!(c.stats().dropped, 5);
}

#[test]
fn a_zero_checksum_is_not_checked() {
    let (mut c, state) = stack(None);
    let mut frame = udp_frame(&noise(9, 33));
    frame[PAYLOAD_AT - 2] = 0;
    frame[PAYLOAD_AT - 1] = 0;
    frame[PAYLOAD_AT + 5] ^= 0xff;
    assert_eq!(c.run(&frame), Verdict::Consumed);
    assert_eq!(state.lock().expect("not poisoned").commits, 1);
    // No checksum pipe was pushed: a plain byte swap.
    assert_eq!(
        state.lock().expect("not poisoned").data,
        swapped(&frame[PAYLOAD_AT..])
    );
}

#[test]
fn bytes_no_layer_consumed_still_go_through_the_checksum() {
    let (mut c, state) = stack(Some(6));
    let payload = noise(10, 301);
    assert_eq!(c.run(&udp_frame(&payload)), Verdict::Consumed);
    assert_eq!(
        state.lock().expect("not poisoned").data,
        swapped(&payload[..6])
    );
    let s = c.stats();
    assert_eq!((s.transfers, s.scans), (1, 1));
    let mut frame = udp_frame(&payload);
    frame[PAYLOAD_AT + 300] ^= 4;
    assert_eq!(c.run(&frame), Verdict::Drop);
    assert_eq!(state.lock().expect("not poisoned").aborts, 1);
}

#[test]
fn ethernet_padding_is_stripped() {
    let (mut c, state) = stack(None);
    let payload = [1u8, 2, 3];
    let mut frame = udp_frame(&payload);
    frame.resize(60, 0xee);
    assert_eq!(c.run(&frame), Verdict::Consumed);
    assert_eq!(state.lock().expect("not poisoned").data, payload);
}

#[test]
fn frames_for_others_are_delivered_and_corrupt_headers_dropped() {
    let (mut c, state) = stack(None);
    let tcp = {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .tcp(1, 2, 3, 4);
        let mut out = Vec::new();
        b.write(&mut out, b"hello").expect("frame builds");
        out
    };
    assert_eq!(c.run(&tcp), Verdict::Deliver);
    let mut arp = udp_frame(b"x");
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(c.run(&arp), Verdict::Deliver);
    let mut fragment = udp_frame(b"abc");
    fragment[14 + 6] |= 0x20; // more fragments
    fragment[24..26].fill(0);
    let ck = builtins::fold_checksum(builtins::checksum_accumulate(0, &fragment[14..34]));
    fragment[24..26].copy_from_slice(&ck.to_be_bytes());
    assert_eq!(c.run(&fragment), Verdict::Deliver);
    let mut bad_ip = udp_frame(b"abc");
    bad_ip[14 + 8] ^= 1; // the TTL, under the header checksum
    assert_eq!(c.run(&bad_ip), Verdict::Drop);
    let good = udp_frame(b"abcd");
    assert_eq!(c.run(&good[..good.len() - 1]), Verdict::Drop);
    // The application's body never ran, so it never aborted.
    let st = state.lock().expect("not poisoned");
    assert_eq!((st.bodies, st.commits, st.aborts), (0, 0, 0));
    let s = c.stats();
    assert_eq!((s.runs, s.delivered, s.dropped), (5, 3, 2));
}

/// A layer that logs its phases and fails where told.
struct Probe {
    id: usize,
    log: Arc<Mutex<Vec<String>>>,
    body: Result<Pass, LayerError>,
    commit: Result<(), LayerError>,
}

impl Probe {
    fn boxed(
        id: usize,
        log: &Arc<Mutex<Vec<String>>>,
        body: Result<Pass, LayerError>,
        commit: Result<(), LayerError>,
    ) -> Box<dyn Layer> {
        Box::new(Probe {
            id,
            log: log.clone(),
            body,
            commit,
        })
    }

    fn say(&self, what: &str) {
        self.log
            .lock()
            .expect("not poisoned")
            .push(format!("{what} {}", self.id));
    }
}

impl Layer for Probe {
    fn body(&mut self, msg: &mut Message<'_>) -> Result<Pass, LayerError> {
        self.say("body");
        // Each probe below stripped one byte.
        assert_eq!(msg.offset(), self.id);
        assert_eq!(msg.remaining(), msg.frame().len() - self.id);
        msg.strip(1)?;
        self.body
    }

    fn commit(&mut self, _: &Message<'_>) -> Result<(), LayerError> {
        self.say("commit");
        self.commit
    }

    fn abort(&mut self) {
        self.say("abort");
    }
}

fn drain(log: &Arc<Mutex<Vec<String>>>) -> String {
    std::mem::take(&mut *log.lock().expect("not poisoned")).join(", ")
}

#[test]
fn commits_run_in_fifo_order_and_failures_abort_the_affected_layers() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let up = Ok(Pass::Up);
    let ok = Ok(());
    let mut c = Composition::new(vec![
        Probe::boxed(0, &log, up, ok),
        Probe::boxed(1, &log, up, ok),
        Probe::boxed(2, &log, Ok(Pass::Consumed), ok),
    ])
    .expect("composes");
    assert_eq!(c.run(b"abcdef"), Verdict::Consumed);
    assert_eq!(
        drain(&log),
        "body 0, body 1, body 2, commit 0, commit 1, commit 2"
    );
    // A failing commit: the layers above abort.
    let mut c = Composition::new(vec![
        Probe::boxed(0, &log, up, ok),
        Probe::boxed(1, &log, up, Err(LayerError::drop("bad"))),
        Probe::boxed(2, &log, Ok(Pass::Consumed), ok),
    ])
    .expect("composes");
    assert_eq!(c.run(b"abcdef"), Verdict::Drop);
    assert_eq!(
        drain(&log),
        "body 0, body 1, body 2, commit 0, commit 1, abort 2"
    );
    // A failing body: every body that ran aborts; the frame is delivered.
    let mut c = Composition::new(vec![
        Probe::boxed(0, &log, up, ok),
        Probe::boxed(1, &log, Err(LayerError::deliver("not mine")), ok),
        Probe::boxed(2, &log, Ok(Pass::Consumed), ok),
    ])
    .expect("composes");
    assert_eq!(c.run(b"abcdef"), Verdict::Deliver);
    assert_eq!(drain(&log), "body 0, body 1, abort 0, abort 1");
    // A short message fails the body that needs more.
    let mut c = Composition::new(vec![
        Probe::boxed(0, &log, up, ok),
        Probe::boxed(1, &log, up, ok),
    ])
    .expect("composes");
    assert_eq!(c.run(b"a"), Verdict::Drop);
    assert_eq!(drain(&log), "body 0, body 1, abort 0, abort 1");
    // Nobody consumed: delivered after the commits.
    assert_eq!(c.run(b"ab"), Verdict::Deliver);
    assert_eq!(drain(&log), "body 0, body 1, commit 0, commit 1");
}

#[test]
fn compositions_are_send() {
    fn send<T: Send>() {}
    send::<Composition>();
}

#[test]
fn compositions_are_bounded() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let many = (0..=MAX_LAYERS)
        .map(|i| Probe::boxed(i, &log, Ok(Pass::Up), Ok(())))
        .collect();
    assert_eq!(
        Composition::new(many).err(),
        Some(ComposeError::TooManyLayers(MAX_LAYERS + 1))
    );
    let udps: Vec<Box<dyn Layer>> = (0..=MAX_PIPE_LAYERS)
        .map(|_| Box::new(UdpLayer::default()) as Box<dyn Layer>)
        .collect();
    let e = Composition::new(udps).err().expect("refused");
    assert_eq!(
        e.to_string(),
        "5 layers push pipes for the data they pass up (at most 4)"
    );
}

proptest! {
    #[test]
    fn hostile_frames_never_panic(
        seed in any::<u64>(),
        len in 0usize..600,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in any::<usize>(),
    ) {
        let (mut c, state) = stack(None);
        let payload = noise(seed, len);
        let mut frame = udp_frame(&payload);
        let n = frame.len();
        for (at, v) in &edits {
            frame[at % n] = *v;
        }
        let frame = &frame[..cut % (n + 1)];
        let v = c.run(frame);
        let st = state.lock().expect("not poisoned");
        if v == Verdict::Consumed {
            // Only a datagram that etherparse accepts with a right checksum.
            let sliced = etherparse::SlicedPacket::from_ethernet(frame).expect("parses");
            let (Some(etherparse::NetSlice::Ipv4(ip)), Some(etherparse::TransportSlice::Udp(udp))) =
                (sliced.net, sliced.transport) else {
                    return Err(TestCaseError::fail("consumed a non-UDP frame"));
                };
            let h = udp.to_header();
            if h.checksum != 0 {
                let want = h
                    .calc_checksum_ipv4(&ip.header().to_header(), udp.payload())
                    .expect("computes");
                prop_assert_eq!(want, h.checksum);
            }
            prop_assert_eq!(&st.data, &swapped(udp.payload()));
        }
        let s = c.stats();
        prop_assert_eq!(s.runs, s.consumed + s.delivered + s.dropped);
    }
}
