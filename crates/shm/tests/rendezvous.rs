//! Listening sockets at a path: the exclusive bind (the socket appears
//! already listening), the replacing bind of the daemon's control socket,
//! and the removal of files left by dead listeners. The race test is the
//! memwire rendezvous: of two ends started together, exactly one offers
//! and the other joins it.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use exonet_shm::control::{connect_or_remove_dead, SeqListener, SeqPacket};

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("exonet-rdv-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn an_exclusive_bind_refuses_an_existing_path_and_leaves_no_temporary_name() {
    let dir = scratch("excl");
    let path = dir.join("r.sock");
    let l = SeqListener::bind_exclusive(&path).unwrap();
    assert_eq!(entries(&dir), ["r.sock"]);
    let e = SeqListener::bind_exclusive(&path).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
    // Also over a plain file: it is not ours to replace.
    let file = dir.join("plain");
    std::fs::write(&file, b"x").unwrap();
    let e = SeqListener::bind_exclusive(&file).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    // Nor does the replacing bind remove it.
    let e = SeqListener::bind(&file).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    // The linked name reaches the listener.
    let c = SeqPacket::connect(&path).unwrap();
    let a = l.accept().unwrap();
    c.send(b"hi", &[]).unwrap();
    let mut buf = [0; 4];
    assert_eq!(a.recv(&mut buf).unwrap().0, 2);
    assert_eq!(entries(&dir), ["plain", "r.sock"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_dead_listeners_file_is_removed_and_a_live_one_is_kept() {
    let dir = scratch("dead");
    let path = dir.join("r.sock");
    assert!(connect_or_remove_dead(&path).unwrap().is_none());
    drop(SeqListener::bind_exclusive(&path).unwrap());
    assert!(path.exists(), "a dropped listener leaves its file");
    assert!(connect_or_remove_dead(&path).unwrap().is_none());
    assert!(!path.exists());

    // The replacing bind takes over a dead file and refuses a live one.
    drop(SeqListener::bind_exclusive(&path).unwrap());
    let live = SeqListener::bind(&path).unwrap();
    let e = SeqListener::bind(&path).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
    assert!(e.to_string().contains("running daemon"), "{e}");
    assert!(connect_or_remove_dead(&path).unwrap().is_some());
    assert!(path.exists());
    drop(live);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One end of a rendezvous, as `exonet daemon --link memwire:PATH` runs
/// it: true if it offered, false if it joined; either way it has the
/// other's message.
fn end(path: &Path, me: u8) -> bool {
    for _ in 0..100 {
        if let Some(s) = connect_or_remove_dead(path).unwrap() {
            let mut buf = [0; 1];
            s.recv(&mut buf).unwrap();
            s.send(&[me], &[]).unwrap();
            assert_ne!(buf[0], me);
            return false;
        }
        match SeqListener::bind_exclusive(path) {
            Ok(l) => {
                let s = l.accept().unwrap();
                let _ = std::fs::remove_file(path);
                s.send(&[me], &[]).unwrap();
                let mut buf = [0; 1];
                s.recv(&mut buf).unwrap();
                assert_ne!(buf[0], me);
                return true;
            }
            Err(e) if e.kind() == ErrorKind::AddrInUse => {}
            Err(e) => panic!("{e}"),
        }
    }
    panic!("no rendezvous at {}", path.display());
}

#[test]
fn of_two_ends_started_together_one_offers_and_the_other_joins() {
    let dir = scratch("race");
    for i in 0..300 {
        let path = Arc::new(dir.join(format!("{i}.sock")));
        let go = Arc::new(Barrier::new(2));
        let ends: Vec<_> = [1u8, 2]
            .map(|me| {
                let (path, go) = (path.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    end(&path, me)
                })
            })
            .into_iter()
            .collect();
        let offered: Vec<bool> = ends.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(offered.iter().filter(|&&o| o).count(), 1, "round {i}");
    }
    assert!(entries(&dir).is_empty(), "{:?}", entries(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}
