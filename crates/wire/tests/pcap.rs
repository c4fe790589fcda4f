//! Capture files: writer/reader round trips, both byte orders and resolutions, pcapng
//! block handling, and typed errors for truncated or corrupt files.

use std::time::Duration;

use exonet_wire::pcap::{
    read_frames, CaptureReader, PcapReader, PcapWriter, PcapngReader, Record, TsResolution,
    LINKTYPE_ETHERNET, MAX_RECORD_LEN,
};
use exonet_wire::WireError;
use proptest::prelude::*;

fn write(res: TsResolution, snaplen: u32, pkts: &[(Duration, Vec<u8>)]) -> Vec<u8> {
    let mut w = PcapWriter::with_options(Vec::new(), res, snaplen).unwrap();
    for (ts, d) in pkts {
        w.write_packet(*ts, d).unwrap();
    }
    w.flush().unwrap();
    w.into_inner()
}

/// Re-encodes a little-endian file from [`PcapWriter`] in big-endian byte order.
fn to_big_endian(le: &[u8]) -> Vec<u8> {
    let mut out = le.to_vec();
    let swap = |b: &mut [u8]| b.reverse();
    swap(&mut out[0..4]);
    swap(&mut out[4..6]);
    swap(&mut out[6..8]);
    for f in (8..24).step_by(4) {
        swap(&mut out[f..f + 4]);
    }
    let mut at = 24;
    while at < out.len() {
        let incl = u32::from_le_bytes(out[at + 8..at + 12].try_into().unwrap()) as usize;
        for f in (at..at + 16).step_by(4) {
            swap(&mut out[f..f + 4]);
        }
        at += 16 + incl;
    }
    out
}

fn records() -> impl Strategy<Value = Vec<(Duration, Vec<u8>)>> {
    let ts =
        (0u64..u64::from(u32::MAX), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n));
    proptest::collection::vec((ts, proptest::collection::vec(any::<u8>(), 0..200)), 0..8)
}

fn expected(res: TsResolution, snaplen: u32, pkts: &[(Duration, Vec<u8>)]) -> Vec<Record> {
    pkts.iter()
        .map(|(ts, d)| Record {
            ts: match res {
                TsResolution::Micro => Duration::new(ts.as_secs(), ts.subsec_micros() * 1000),
                TsResolution::Nano => *ts,
            },
            orig_len: d.len() as u32,
            linktype: LINKTYPE_ETHERNET,
            data: d[..d.len().min(snaplen as usize)].to_vec(),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pcap_round_trip(pkts in records(), nano in any::<bool>(), big in any::<bool>(), snaplen in 1u32..300) {
        let res = if nano { TsResolution::Nano } else { TsResolution::Micro };
        let mut file = write(res, snaplen, &pkts);
        if big {
            file = to_big_endian(&file);
        }
        let r = PcapReader::new(&file[..]).unwrap();
        prop_assert_eq!((r.linktype(), r.snaplen(), r.resolution()), (LINKTYPE_ETHERNET, snaplen, res));
        let got: Vec<Record> = r.collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&got, &expected(res, snaplen, &pkts));
        let via_detect: Vec<Record> = CaptureReader::new(&file[..]).unwrap().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(got, via_detect);
    }

    /// Any cut yields the records before it, then a single `Truncated` (or nothing, at
    /// a record boundary).
    #[test]
    fn pcap_truncation_is_typed(pkts in records(), cut in any::<usize>()) {
        let file = write(TsResolution::Micro, 65535, &pkts);
        let cut = cut % (file.len() + 1);
        match PcapReader::new(&file[..cut]) {
            Err(e) => prop_assert!(cut < 24 && matches!(e, WireError::Truncated)),
            Ok(r) => {
                let all: Vec<_> = r.collect();
                for r in &all[..all.len().saturating_sub(1)] {
                    prop_assert!(r.is_ok());
                }
                if let Some(Err(e)) = all.last() {
                    prop_assert!(matches!(e, WireError::Truncated), "{e:?}");
                }
            }
        }
    }
}

#[test]
fn corrupt_pcap_errors() {
    let file = write(
        TsResolution::Micro,
        65535,
        &[(Duration::from_secs(1), vec![1, 2, 3])],
    );
    assert!(matches!(
        PcapReader::new(&b"nope, not pcap at all..."[..]),
        Err(WireError::BadFormat)
    ));
    assert!(matches!(
        CaptureReader::new(&b"nope"[..]),
        Err(WireError::BadFormat)
    ));
    assert!(matches!(
        PcapReader::new(&[][..]),
        Err(WireError::Truncated)
    ));

    let mut huge = file.clone();
    huge[24 + 8..24 + 12].copy_from_slice(&(MAX_RECORD_LEN as u32 + 1).to_le_bytes());
    let mut r = PcapReader::new(&huge[..]).unwrap();
    assert!(matches!(r.next(), Some(Err(WireError::BadLength))));
    assert!(r.next().is_none(), "iteration stops after an error");

    let mut bad_usec = file.clone();
    bad_usec[24 + 4..24 + 8].copy_from_slice(&1_000_000u32.to_le_bytes());
    assert!(matches!(
        PcapReader::new(&bad_usec[..]).unwrap().next(),
        Some(Err(WireError::BadLength))
    ));

    let mut v3 = file;
    v3[4] = 3;
    assert!(matches!(
        PcapReader::new(&v3[..]),
        Err(WireError::Unsupported)
    ));
}

/// Minimal pcapng writer for tests: one block, padded, with its trailing length.
fn block(le: bool, btype: u32, body: &[u8]) -> Vec<u8> {
    let u32b = |v: u32| if le { v.to_le_bytes() } else { v.to_be_bytes() };
    let padded = body.len().next_multiple_of(4);
    let total = (12 + padded) as u32;
    let mut b = Vec::new();
    b.extend_from_slice(&u32b(btype));
    b.extend_from_slice(&u32b(total));
    b.extend_from_slice(body);
    b.resize(8 + padded, 0);
    b.extend_from_slice(&u32b(total));
    b
}

fn u16b(le: bool, v: u16) -> [u8; 2] {
    if le {
        v.to_le_bytes()
    } else {
        v.to_be_bytes()
    }
}

fn u32b(le: bool, v: u32) -> [u8; 4] {
    if le {
        v.to_le_bytes()
    } else {
        v.to_be_bytes()
    }
}

fn shb(le: bool) -> Vec<u8> {
    let mut body = u32b(le, 0x1a2b_3c4d).to_vec();
    body.extend_from_slice(&u16b(le, 1));
    body.extend_from_slice(&u16b(le, 0));
    body.extend_from_slice(&[0xff; 8]);
    // An shb_userappl option, to be skipped.
    body.extend_from_slice(&u16b(le, 4));
    body.extend_from_slice(&u16b(le, 5));
    body.extend_from_slice(b"test\0\0\0\0");
    block(le, 0x0a0d_0d0a, &body)
}

fn idb(le: bool, linktype: u16, tsresol: Option<u8>) -> Vec<u8> {
    let mut body = u16b(le, linktype).to_vec();
    body.extend_from_slice(&[0, 0]);
    body.extend_from_slice(&u32b(le, 65535));
    if let Some(r) = tsresol {
        body.extend_from_slice(&u16b(le, 9));
        body.extend_from_slice(&u16b(le, 1));
        body.extend_from_slice(&[r, 0, 0, 0]);
        body.extend_from_slice(&[0; 4]); // opt_endofopt
    }
    block(le, 1, &body)
}

fn epb(le: bool, iface: u32, ticks: u64, data: &[u8], orig_len: u32) -> Vec<u8> {
    let mut body = u32b(le, iface).to_vec();
    body.extend_from_slice(&u32b(le, (ticks >> 32) as u32));
    body.extend_from_slice(&u32b(le, ticks as u32));
    body.extend_from_slice(&u32b(le, data.len() as u32));
    body.extend_from_slice(&u32b(le, orig_len));
    body.extend_from_slice(data);
    block(le, 6, &body)
}

fn spb(le: bool, data: &[u8]) -> Vec<u8> {
    let mut body = u32b(le, data.len() as u32).to_vec();
    body.extend_from_slice(data);
    block(le, 3, &body)
}

fn sample_pcapng() -> Vec<u8> {
    let mut f = shb(true);
    f.extend(idb(true, 1, Some(9))); // nanoseconds
    f.extend(idb(true, 1, Some(0x80 | 10))); // 1/1024 s
    f.extend(block(true, 0x0bad, &[1, 2, 3, 4, 5])); // unknown block: skipped
    f.extend(epb(true, 0, 1_500_000_001, b"frame-one", 60));
    f.extend(epb(true, 1, 2048 + 512, b"frame-two", 9));
    f.extend(spb(true, b"simple"));
    // A second section in the other byte order, default microsecond resolution.
    f.extend(shb(false));
    f.extend(idb(false, 1, None));
    f.extend(epb(false, 0, 3_000_001, b"frame-three", 11));
    f
}

#[test]
fn pcapng_blocks_and_sections() {
    let f = sample_pcapng();
    let got: Vec<Record> = PcapngReader::new(&f[..])
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let rec = |ts: Duration, orig_len: u32, data: &[u8]| Record {
        ts,
        orig_len,
        linktype: 1,
        data: data.to_vec(),
    };
    assert_eq!(
        got,
        vec![
            rec(Duration::new(1, 500_000_001), 60, b"frame-one"),
            rec(Duration::from_millis(2500), 9, b"frame-two"),
            rec(Duration::ZERO, 6, b"simple"),
            rec(Duration::new(3, 1000), 11, b"frame-three"),
        ]
    );
    assert_eq!(CaptureReader::new(&f[..]).unwrap().count(), 4);
}

#[test]
fn pcapng_errors() {
    // Packet on an interface that was never described.
    let mut f = shb(true);
    f.extend(epb(true, 0, 0, b"x", 1));
    assert!(matches!(
        PcapngReader::new(&f[..]).unwrap().next(),
        Some(Err(WireError::BadFormat))
    ));

    // Captured length beyond the block.
    let mut f = shb(true);
    f.extend(idb(true, 1, None));
    let mut e = epb(true, 0, 0, b"abcd", 4);
    e[20..24].copy_from_slice(&100u32.to_le_bytes());
    f.extend(e);
    assert!(matches!(
        PcapngReader::new(&f[..]).unwrap().next(),
        Some(Err(WireError::BadLength))
    ));

    // Block length that is not a multiple of 4, and one that is absurd.
    for bad_len in [13u32, 0xffff_fffc] {
        let mut f = shb(true);
        let mut b = idb(true, 1, None);
        b[4..8].copy_from_slice(&bad_len.to_le_bytes());
        f.extend(b);
        assert!(matches!(
            PcapngReader::new(&f[..]).unwrap().next(),
            Some(Err(WireError::BadLength))
        ));
    }

    // Bad byte-order magic.
    let mut f = shb(true);
    f[8] = 0;
    assert!(matches!(
        PcapngReader::new(&f[..]),
        Err(WireError::BadFormat)
    ));

    // Every truncation of a valid file ends in a typed error or cleanly, never a panic.
    let f = sample_pcapng();
    for cut in 0..f.len() {
        if let Ok(r) = PcapngReader::new(&f[..cut]) {
            let last = r.last();
            assert!(
                matches!(last, None | Some(Ok(_)) | Some(Err(WireError::Truncated))),
                "cut {cut}: {last:?}"
            );
        }
    }
}

#[test]
fn read_frames_detects_format() {
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let pcap_path = dir.join(format!("exonet-wire-{pid}.pcap"));
    let ng_path = dir.join(format!("exonet-wire-{pid}.pcapng"));
    let frames = vec![vec![1u8; 60], vec![2u8; 1514]];
    let pkts: Vec<_> = frames
        .iter()
        .map(|f| (Duration::from_secs(7), f.clone()))
        .collect();
    std::fs::write(&pcap_path, write(TsResolution::Nano, 65535, &pkts)).unwrap();
    std::fs::write(&ng_path, sample_pcapng()).unwrap();

    let from_pcap = read_frames(&pcap_path);
    let from_ng = read_frames(&ng_path);
    let missing = read_frames(dir.join(format!("exonet-wire-{pid}.absent")));
    std::fs::remove_file(&pcap_path).unwrap();

    assert_eq!(from_pcap.unwrap(), frames);
    assert_eq!(from_ng.unwrap().len(), 4);
    assert!(matches!(missing, Err(WireError::Io(_))));

    // Non-Ethernet captures are refused rather than misparsed.
    let mut raw_ip = shb(true);
    raw_ip.extend(idb(true, 101, None));
    raw_ip.extend(epb(true, 0, 0, b"x", 1));
    std::fs::write(&ng_path, raw_ip).unwrap();
    let refused = read_frames(&ng_path);
    std::fs::remove_file(&ng_path).unwrap();
    assert!(matches!(refused, Err(WireError::Unsupported)));
}
