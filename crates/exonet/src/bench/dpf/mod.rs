//! `exonet bench dpf`: packet demultiplexing, DPF against its peers, after
//! section 4 of the DPF paper (Engler and Kaashoek, SIGCOMM 1996).
//!
//! One run measures every system on the same frames. Output: one JSON line
//! per (case, system) on stdout as soon as it is measured (see
//! [`crate::bench::report`]), then, on stderr, a table with each system's
//! value and its ratio to exonet-jit per case (`--json-only` leaves only
//! the JSON lines). Exit status 1 if any system reported an error.
//!
//! # Systems
//!
//! - `exonet-jit`: `Dpf::new()`, the filters merged and compiled to native
//!   code, called once per frame; `exonet-jit-batch`: the same code called
//!   with `demux_batch` on 32 frames at a time, as the multiplexer's receive
//!   loop calls it; `exonet-interp`: `Dpf::with_engine(Engine::Interp)`.
//! - `libpcap`: each filter compiled by `pcap_compile` (optimizer on) from
//!   the equivalent tcpdump expression ([`cases`] says how they match), run
//!   with `pcap_offline_filter`: one program per filter, tried in turn, the
//!   first match wins, as a libpcap user demultiplexes.
//! - `hand-rust`: hand-written Rust ([`hand`]): EtherType, protocol, then a
//!   hash map (FxHash) on the port / address tuple.
//! - `linux-ebpf`: a hand-written eBPF program per case, in C ([`ebpf`]),
//!   loaded as a tc (`SCHED_CLS`) program and timed in the kernel by
//!   `BPF_PROG_TEST_RUN`. Skipped (a `"skipped"` line) without root or
//!   clang, or when the kernel refuses.
//!
//! # Cases ([`cases`])
//!
//! - `tcp10`: the ten TCP/IP filters of Table 3 / Figure 1 (type IP,
//!   protocol TCP, source 192.12.69.1, fixed 20-byte IP header, source and
//!   destination port; the ten differ in their ports); ten frames, one per
//!   filter in turn. `tcp10-var`: the same past a variable-length IP header
//!   (`SHIFT((0:8 & 0x0f) << 2)`); two thirds of the frames carry options.
//! - `ports-N`, N in 1, 2, 3, 10, 100, 1000, 10000 (Table 2): N filters
//!   that differ only in the destination port (type IP, protocol TCP,
//!   variable header); max(4096, N) frames reaching the N filters equally
//!   often in a shuffled order, a quarter of them with an IP option.
//! - `depth-D`, D in 1..=5 (Figure 3): one filter of D levels, two atoms
//!   each: Ethernet (type, dst-mac word), IP (protocol, source), TCP
//!   (ports), a made-up encapsulation header (type, channel; its length in
//!   its first nibble), the header inside it (type, key), with a SHIFT per
//!   level; eight matching frames of varying header lengths.
//! - `insert-N`, N in 10, 1000, 10000: `us_per_insert`, exonet-jit only
//!   ([`insert`]).
//!
//! All demultiplexing cases report `ns_per_pkt`.
//!
//! # Measurement
//!
//! Before timing, every system classifies every frame of the case, and the
//! answer (mapped to the case's filter index) must be the filter the frame
//! was built for; a system that disagrees gets an `"error"` line naming
//! the first wrong frame, and is not timed. Then [`measure`]: batches of
//! consecutive frames (cycling through the case's frames) timed with
//! `Instant` and `black_box`, the batch length calibrated so that each
//! (case, system) takes about 200 ms (30 ms with `--quick`), after a
//! warm-up batch; the median over 7 (5) repetitions (linux-ebpf instead
//! runs each frame `repeat` times in the kernel and averages over the
//! frames, see [`ebpf`]). Every value includes
//! the cost of the harness: about a nanosecond per frame for the loop in
//! process, and for linux-ebpf the kernel's test loop, which on a VM can
//! cost 20 ns and more per run (and whose per-run average the kernel rounds
//! down to whole nanoseconds). The table's footer gives both floors,
//! measured with a classifier that returns at once.
//!
//! [`measure`]: crate::bench::measure

use std::collections::HashMap;
use std::process::ExitCode;

use clap::Args;
use exonet_dpf::{Dpf, Engine, FilterId};

use crate::bench::measure::{self, Budget};
use crate::bench::report::{human, Fail, Outcome, Reporter};
use crate::bench::RunOpts;

pub mod cases;
pub mod ebpf;
pub mod hand;
pub mod insert;

use cases::{Case, Kind, Spec, SRC_IP};

#[derive(Debug, Args)]
pub struct DpfArgs {
    #[command(flatten)]
    pub opts: RunOpts,
}

/// The systems, in the order of the table's columns.
pub const SYSTEMS: [&str; 6] = [
    "exonet-jit",
    "exonet-jit-batch",
    "exonet-interp",
    "libpcap",
    "hand-rust",
    "linux-ebpf",
];
const BASELINE: &str = "exonet-jit";

pub fn run(args: &DpfArgs) -> ExitCode {
    let opts = &args.opts;
    let specs = Spec::all();
    let names: Vec<String> = specs.iter().map(Spec::name).collect();
    if let Some(bad) = opts.cases.iter().find(|c| !names.contains(c)) {
        eprintln!("unknown case {bad}; the cases are: {}", names.join(" "));
        return ExitCode::from(2);
    }
    let budget = opts.budget();
    let mut rep = Reporter::new("dpf", opts.json_only);
    let mut ebpf = ebpf::Env::probe();
    if specs
        .iter()
        .any(|s| !matches!(s, Spec::Insert(_)) && opts.wants(&s.name()))
    {
        overheads(&mut rep, &budget, &mut ebpf);
    }
    for spec in specs {
        let name = spec.name();
        if !opts.wants(&name) {
            continue;
        }
        let Some(case) = spec.build() else {
            let Spec::Insert(n) = spec else {
                unreachable!("only insertion cases have no frames")
            };
            rep.progress(&format!("{name}: installing {n} filters"));
            let r = insert::measure(n, &budget).map(|(us, setup_ms)| {
                rep.progress(&format!(
                    "{name}: {n} filters installed in {setup_ms:.1} ms"
                ));
                us
            });
            rep.push(&name, BASELINE, "us_per_insert", Outcome::of(r));
            continue;
        };
        rep.progress(&format!(
            "{name}: {} filters, {} frames",
            case.filters.len(),
            case.frames.len()
        ));
        let checked = case.check();
        for system in SYSTEMS {
            let r = match &checked {
                Err(e) => Err(Fail::Error(format!("the case itself is wrong: {e}"))),
                Ok(()) => run_system(system, &case, &budget, &mut ebpf),
            };
            rep.push(&name, system, "ns_per_pkt", Outcome::of(r));
        }
    }
    rep.print_table(
        &format!(
            "dpf: median of {} repetitions; (Nx) = ratio to {BASELINE}; lower is better",
            budget.reps
        ),
        &SYSTEMS,
        BASELINE,
    );
    rep.exit_code()
}

/// What a classifier that returns at once measures, in process and in the
/// kernel's test loop: the floor under every value of the table. Told in
/// the table's footer, not as JSON lines.
fn overheads(rep: &mut Reporter, budget: &Budget, ebpf: &mut ebpf::Env) {
    let frames = Spec::Tcp10 { var_header: false }
        .build()
        .expect("tcp10 has frames")
        .frames;
    let local = measure::ns_per_frame(&frames, budget, |f| f.len());
    let kernel = match ebpf.empty_program(&frames, budget) {
        Ok(v) => format!(
            "{} ns as an eBPF program (the kernel's test loop)",
            human(v)
        ),
        Err(Fail::Error(e) | Fail::Skip(e)) => format!("no eBPF number: {e}"),
    };
    rep.note(format!(
        "floor (a classifier that returns at once, included in every value): {} ns in process, {kernel}",
        human(local)
    ));
}

fn run_system(
    system: &str,
    case: &Case,
    budget: &Budget,
    ebpf: &mut ebpf::Env,
) -> Result<f64, Fail> {
    match system {
        "exonet-jit" => dpf(case, Dpf::new(), budget),
        "exonet-jit-batch" => dpf_batch(case, budget),
        "exonet-interp" => dpf(case, Dpf::with_engine(Engine::Interp), budget),
        "libpcap" => libpcap(case, budget),
        "hand-rust" => hand_rust(case, budget),
        "linux-ebpf" => ebpf.run(case, budget),
        other => Err(Fail::Error(format!("no system {other}"))),
    }
}

/// Checks that `classify` sends every frame of the case to the filter it
/// was built for.
pub fn verify(
    case: &Case,
    mut classify: impl FnMut(&[u8]) -> Result<Option<usize>, String>,
) -> Result<(), Fail> {
    let show = |o: Option<usize>| match o {
        Some(i) => format!("filter {i}"),
        None => "no filter".to_string(),
    };
    let mut wrong = 0;
    let mut first = None;
    for (j, (f, want)) in case.frames.iter().zip(&case.expected).enumerate() {
        let got = classify(f).map_err(Fail::Error)?;
        if got != *want {
            wrong += 1;
            first.get_or_insert((j, *want, got));
        }
    }
    match first {
        None => Ok(()),
        Some((j, want, got)) => Err(Fail::Error(format!(
            "disagrees with the filters on {wrong} of {} frames; first: frame {j} \
             should reach {}, reached {}",
            case.frames.len(),
            show(want),
            show(got)
        ))),
    }
}

/// Verifies, then times, an in-process classifier.
fn verified<R>(
    case: &Case,
    budget: &Budget,
    check: impl Fn(&[u8]) -> Result<Option<usize>, String>,
    time: impl FnMut(&[u8]) -> R,
) -> Result<f64, Fail> {
    verify(case, check)?;
    Ok(measure::ns_per_frame(&case.frames, budget, time))
}

/// Installs the case's filters; maps each filter id to its index.
fn install(case: &Case, dpf: &mut Dpf) -> Result<HashMap<FilterId, usize>, Fail> {
    let mut index = HashMap::new();
    for (i, f) in case.filters.iter().enumerate() {
        let id = dpf
            .insert(f)
            .map_err(|e| Fail::Error(format!("insert of filter {i} ({f}) failed: {e}")))?;
        index.insert(id, i);
    }
    Ok(index)
}

/// The filter index of a demux result.
fn index_of(
    index: &HashMap<FilterId, usize>,
    r: Option<FilterId>,
) -> Result<Option<usize>, String> {
    r.map(|id| {
        index
            .get(&id)
            .copied()
            .ok_or(format!("unknown filter {id}"))
    })
    .transpose()
}

fn dpf(case: &Case, mut dpf: Dpf, budget: &Budget) -> Result<f64, Fail> {
    let index = install(case, &mut dpf)?;
    verified(
        case,
        budget,
        |f| index_of(&index, dpf.demux(f)),
        |f| dpf.demux(f),
    )
}

/// The JIT through `demux_batch`, 32 frames a call.
fn dpf_batch(case: &Case, budget: &Budget) -> Result<f64, Fail> {
    let mut dpf = Dpf::new();
    let index = install(case, &mut dpf)?;
    let refs: Vec<&[u8]> = case.frames.iter().map(|f| f.as_slice()).collect();
    let mut out = vec![None; refs.len()];
    dpf.demux_batch(&refs, &mut out);
    verify(case, |f| {
        let j = refs
            .iter()
            .position(|r| *r == f)
            .expect("a frame of the case");
        index_of(&index, out[j])
    })?;
    Ok(measure::ns_per_frame_batched(
        &refs,
        budget,
        32,
        |fs, out| dpf.demux_batch(fs, out),
    ))
}

fn libpcap(case: &Case, budget: &Budget) -> Result<f64, Fail> {
    let cap = pcap::Capture::dead(pcap::Linktype::ETHERNET)
        .map_err(|e| Fail::Error(format!("pcap_open_dead: {e}")))?;
    let progs = case
        .pcap
        .iter()
        .map(|e| {
            cap.compile(e, true)
                .map_err(|err| Fail::Error(format!("pcap_compile `{e}`: {err}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let classify = |f: &[u8]| progs.iter().position(|p| p.filter(f));
    verified(case, budget, |f| Ok(classify(f)), classify)
}

fn hand_rust(case: &Case, budget: &Budget) -> Result<f64, Fail> {
    fn go(
        case: &Case,
        budget: &Budget,
        classify: impl Fn(&[u8]) -> Option<usize>,
    ) -> Result<f64, Fail> {
        verified(case, budget, |f| Ok(classify(f)), &classify)
    }
    match &case.kind {
        Kind::Tcp10 { var_header, ports } => {
            let h = hand::Tcp10::new(SRC_IP, ports);
            if *var_header {
                go(case, budget, |f| h.classify_var(f))
            } else {
                go(case, budget, |f| h.classify_fixed(f))
            }
        }
        Kind::Ports(ports) => {
            let h = hand::Ports::new(ports);
            go(case, budget, |f| h.classify(f))
        }
        Kind::Depth(1) => go(case, budget, hand::depth::<1>),
        Kind::Depth(2) => go(case, budget, hand::depth::<2>),
        Kind::Depth(3) => go(case, budget, hand::depth::<3>),
        Kind::Depth(4) => go(case, budget, hand::depth::<4>),
        Kind::Depth(5) => go(case, budget, hand::depth::<5>),
        Kind::Depth(d) => Err(Fail::Error(format!(
            "no hand-written classifier for depth {d}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn agreement_check_catches_a_wrong_classifier() {
        let case = Spec::Tcp10 { var_header: true }.build().unwrap();
        let h = hand::Tcp10::new(
            SRC_IP,
            match &case.kind {
                Kind::Tcp10 { ports, .. } => ports,
                _ => unreachable!(),
            },
        );
        assert_eq!(verify(&case, |f| Ok(h.classify_var(f))), Ok(()));
        // Reading the ports at the fixed offset misses the frames with IP
        // options.
        let Err(Fail::Error(e)) = verify(&case, |f| Ok(h.classify_fixed(f))) else {
            panic!("a wrong classifier passed")
        };
        assert!(
            e.contains("first: frame 1 should reach filter 1, reached no filter"),
            "{e}"
        );
        // Off by one.
        let Err(Fail::Error(e)) = verify(&case, |f| Ok(h.classify_var(f).map(|i| (i + 1) % 10)))
        else {
            panic!("a wrong classifier passed")
        };
        assert!(e.contains("on 10 of 10 frames"), "{e}");
    }

    /// Every in-process system runs and agrees on a few cases (timing with
    /// a tiny budget; no thresholds).
    #[test]
    fn in_process_systems_agree() {
        let budget = Budget {
            per_case: Duration::from_millis(1),
            reps: 1,
        };
        for spec in [
            Spec::Tcp10 { var_header: false },
            Spec::Ports(3),
            Spec::Depth(5),
        ] {
            let case = spec.build().unwrap();
            for system in ["exonet-jit", "exonet-interp", "libpcap", "hand-rust"] {
                let r = run_system(system, &case, &budget, &mut ebpf::Env::probe());
                assert!(r.is_ok(), "{} {system}: {r:?}", case.name);
            }
        }
        assert!(insert::measure(10, &budget).is_ok());
    }
}
