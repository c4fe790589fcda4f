//! `exonet filter EXPR`: compile a filter and explain it, or run it over a
//! capture file like `tcpdump -# -r FILE EXPR` (matching frame numbers,
//! 1-based, one per line).

use std::process::ExitCode;

use clap::Args;
use exonet_dpf::{tcpdump, Dpf, Filter};

#[derive(Debug, Args)]
pub struct FilterArgs {
    /// The filter: tcpdump syntax (`tcp and dst port 80`), or DPF syntax
    /// with `--dpf` (`12:16 == 0x800 & SHIFT(14) & 9:8 == 6`).
    pub expr: String,
    /// EXPR is in DPF's own filter language.
    #[arg(long)]
    pub dpf: bool,
    /// Print the canonical atoms, the trie and the generated code size.
    #[arg(long)]
    pub explain: bool,
    /// Print the numbers (1-based) of the frames of this pcap/pcapng file
    /// that match.
    #[arg(long, value_name = "FILE")]
    pub read: Option<std::path::PathBuf>,
}

/// The conjunctions EXPR stands for, in either syntax.
pub fn conjunctions(expr: &str, dpf_syntax: bool) -> Result<Vec<Filter>, String> {
    if dpf_syntax {
        expr.parse::<Filter>()
            .map(|f| vec![f])
            .map_err(|e| e.to_string())
    } else {
        tcpdump::compile(expr).map_err(|e| e.to_string())
    }
}

pub fn run(args: &FilterArgs) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exonet filter: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_inner(args: &FilterArgs) -> Result<(), String> {
    let conj = conjunctions(&args.expr, args.dpf)?;
    let mut dpf = Dpf::new();
    let id = dpf.insert_any(&conj).map_err(|e| e.to_string())?;
    if args.explain || args.read.is_none() {
        if !args.dpf {
            println!("conjunctions ({}):", conj.len());
            for f in &conj {
                println!("  {f}");
            }
        }
        print!("{}", dpf.explain());
    }
    if let Some(path) = &args.read {
        let frames =
            exonet_wire::pcap::read_frames(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut out = String::new();
        for (i, frame) in frames.iter().enumerate() {
            if dpf.demux(frame) == Some(id) {
                out.push_str(&format!("{}\n", i + 1));
            }
        }
        print!("{out}");
    }
    Ok(())
}
