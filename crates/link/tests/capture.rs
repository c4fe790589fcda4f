//! PcapCapture and Tracer over a memwire cable.

use std::time::Duration;

use exonet_link::memwire;
use exonet_link::tracer::Summary;
use exonet_link::{Direction, FaultInjector, Faults, Link, ManualClock, PcapCapture, Tracer};
use exonet_wire::pcap::{PcapReader, PcapWriter, LINKTYPE_ETHERNET};
use exonet_wire::{build, MacAddr};

fn udp(i: u8) -> Vec<u8> {
    build::udp_frame(
        MacAddr([2, 0, 0, 0, 0, 1]),
        MacAddr([2, 0, 0, 0, 0, 2]),
        "10.77.0.1".parse().unwrap(),
        "10.77.0.2".parse().unwrap(),
        1000,
        2000,
        &[i; 20],
    )
}

#[test]
fn pcap_records_both_directions_with_clock_timestamps() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1_700_000_000));
    let (a, mut b) = memwire::pair().unwrap();
    let writer = PcapWriter::new(Vec::new()).unwrap();
    let mut a = PcapCapture::with_clock(a, writer, clock.clone());

    let out = [udp(1), udp(2), udp(3)];
    assert_eq!(a.send_batch(&[&out[0], &out[1], &out[2]]).unwrap(), 3);
    let mut echoed = Vec::new();
    b.recv_batch(&mut |f| echoed.push(f.to_vec()), 8).unwrap();
    clock.advance(Duration::from_micros(1500));
    let back = udp(9);
    b.send_batch(&[&back]).unwrap();
    assert_eq!(a.recv_batch(&mut |_| {}, 8).unwrap(), 1);
    // A frame the link drops is not recorded as sent.
    assert_eq!(a.send_batch(&[&[0u8; 3]]).unwrap(), 1);
    a.flush().unwrap();

    let (_, writer) = a.into_parts();
    let records: Vec<_> = PcapReader::new(&writer.into_inner()[..])
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    let data: Vec<&[u8]> = records.iter().map(|r| &r.data[..]).collect();
    assert_eq!(data, [&out[0][..], &out[1], &out[2], &back]);
    assert!(records.iter().all(|r| r.linktype == LINKTYPE_ETHERNET));
    let t0 = Duration::from_secs(1_700_000_000);
    assert_eq!(records[0].ts, t0);
    assert_eq!(records[3].ts, t0 + Duration::from_micros(1500));
    assert_eq!(echoed, out);
}

#[test]
fn capture_outside_faults_sees_what_the_application_sent() {
    let (a, mut b) = memwire::pair().unwrap();
    let lossy = FaultInjector::new(a, 0).with_faults(
        Direction::Tx,
        Faults {
            loss_rate: 1.0,
            ..Faults::default()
        },
    );
    let mut a = PcapCapture::new(lossy, PcapWriter::new(Vec::new()).unwrap());
    let f = udp(5);
    assert_eq!(a.send_batch(&[&f, &f]).unwrap(), 2);
    assert_eq!(b.recv_batch(&mut |_| {}, 8).unwrap(), 0);
    let (lossy, writer) = a.into_parts();
    assert_eq!(lossy.fault_stats(Direction::Tx).lost, 2);
    let n = PcapReader::new(&writer.into_inner()[..]).unwrap().count();
    assert_eq!(n, 2);
}

#[test]
fn tracer_sees_every_frame_and_summarizes_it() {
    let (a, mut b) = memwire::pair().unwrap();
    let mut log = Vec::new();
    {
        // Wrappers compose over trait objects too.
        let a: Box<dyn Link> = Box::new(a);
        let mut a = Tracer::new(a, |dir, f: &[u8]| log.push(format!("{dir} {}", Summary(f))));
        assert_eq!(a.max_frame_len(), 1518);
        a.send_batch(&[&udp(1)]).unwrap();
        b.recv_batch(&mut |_| {}, 8).unwrap();
        b.send_batch(&[&udp(2), &[0u8; 10]]).unwrap();
        assert_eq!(a.recv_batch(&mut |_| {}, 8).unwrap(), 1);
    }
    assert_eq!(
        log,
        [
            "tx 02:00:00:00:00:01 > 02:00:00:00:00:02 IPv4 10.77.0.1:1000 > 10.77.0.2:2000 UDP len 20",
            "rx 02:00:00:00:00:01 > 02:00:00:00:00:02 IPv4 10.77.0.1:1000 > 10.77.0.2:2000 UDP len 20",
        ]
    );
    assert_eq!(Summary(&[0u8; 5]).to_string(), "runt frame, 5 bytes");
    let arp = build::arp_request(
        MacAddr([2, 0, 0, 0, 0, 1]),
        "10.77.0.1".parse().unwrap(),
        "10.77.0.2".parse().unwrap(),
    );
    assert!(Summary(&arp)
        .to_string()
        .ends_with("ARP who-has 10.77.0.2 tell 10.77.0.1"));
}
