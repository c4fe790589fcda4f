//! Two hosts on an in-memory cable in this process, each a multiplexer daemon
//! on a thread of its own ([`Daemon::spawn`]) that applications reach through
//! its control socket, as they would a separate `exonet daemon`; or each a
//! multiplexer inside the application ([`InProcess`]), driven by its sockets'
//! calls. The demo's sockets tour and the stack's tests both stand on it.

use std::io;
use std::net::Ipv4Addr;

use exonet_link::{memwire, Direction, FaultInjector, Faults, Link, Segmenter};
use exonet_mux::{Daemon, DaemonConfig, InProcess, Mux, MuxConfig, Running};
use exonet_stack::{Stack, StackConfig};

/// Host A's address.
pub const A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// Host B's address.
pub const B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);

/// The two daemons; both stop (and remove their sockets) when this drops.
pub struct TwoHosts {
    pub a: Running,
    pub b: Running,
}

/// Starts A and B joined by a memwire. `name` keeps the control sockets
/// apart from those of other pairs, in this process and in others.
pub fn two_hosts(name: &str) -> io::Result<TwoHosts> {
    two_hosts_scheduled(name, None)
}

/// As [`two_hosts`], each multiplexer thread under this real-time policy
/// and priority (as a kernel's receive path runs ahead of user processes;
/// needs root).
pub fn two_hosts_scheduled(name: &str, sched: Option<(i32, i32)>) -> io::Result<TwoHosts> {
    let (x, y) = memwire::pair()?;
    Ok(TwoHosts {
        a: daemon(&format!("{name}-a"), x, A, sched)?,
        b: daemon(&format!("{name}-b"), y, B, sched)?,
    })
}

fn daemon(
    name: &str,
    link: memwire::MemWire,
    ip: Ipv4Addr,
    sched: Option<(i32, i32)>,
) -> io::Result<Running> {
    let path = std::env::temp_dir().join(format!("exonet-{}-{name}.sock", std::process::id()));
    Daemon::spawn(
        move || {
            if let Some((policy, priority)) = sched {
                set_scheduler(0, policy, priority)?;
            }
            Ok(Mux::new(Box::new(link), vec![ip], MuxConfig::default()))
        },
        DaemonConfig::new(path, vec![(ip, 24)]),
    )
}

/// Puts thread or process `tid` (0: the calling thread) under a scheduling
/// policy (`libc::SCHED_FIFO`, `SCHED_RR`, `SCHED_OTHER`) at a priority.
pub fn set_scheduler(tid: i32, policy: i32, priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler reads one sched_param from a live local.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A and B joined by a memwire, each a stack whose multiplexer runs in this
/// process, on the threads that use the stack's sockets.
pub fn in_process_pair(config: &StackConfig) -> io::Result<(Stack, Stack)> {
    lossy_pair(config, Faults::default(), 0)
}

/// As [`in_process_pair`], with `faults` on what each host sends (seeded,
/// so a run can be repeated).
pub fn lossy_pair(config: &StackConfig, faults: Faults, seed: u64) -> io::Result<(Stack, Stack)> {
    pair_over_memwire(config, faults, seed, false)
}

/// As [`lossy_pair`], each link taking TCP super-segments and cutting them
/// into frames before the faults ([`Segmenter`]), as a NIC's segmentation
/// offload does before the wire.
pub fn offloading_pair(
    config: &StackConfig,
    faults: Faults,
    seed: u64,
) -> io::Result<(Stack, Stack)> {
    pair_over_memwire(config, faults, seed, true)
}

fn pair_over_memwire(
    config: &StackConfig,
    faults: Faults,
    seed: u64,
    segmentation: bool,
) -> io::Result<(Stack, Stack)> {
    let (x, y) = memwire::pair()?;
    let host = |link: memwire::MemWire, ip: Ipv4Addr, seed: u64| {
        let link: Box<dyn Link> = if faults == Faults::default() {
            Box::new(link)
        } else {
            Box::new(FaultInjector::new(link, seed).with_faults(Direction::Tx, faults))
        };
        let link: Box<dyn Link> = if segmentation {
            Box::new(Segmenter::new(link))
        } else {
            link
        };
        let mux = Mux::new(link, vec![ip], MuxConfig::default());
        Stack::over(Box::new(InProcess::new(mux, vec![(ip, 24)])), config)
    };
    Ok((host(x, A, seed)?, host(y, B, seed ^ 0x9e37_79b9)?))
}
