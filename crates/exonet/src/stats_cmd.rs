//! `exonet stats`: the daemon's counters per endpoint and per channel.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use exonet_shm::control::{default_socket_path, Client, Record};

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The daemon's control socket (default as for `exonet daemon`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// One JSON object per record instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &StatsArgs) -> ExitCode {
    let socket = args.socket.clone().unwrap_or_else(default_socket_path);
    let records = match Client::connect(&socket).and_then(|mut c| c.stats()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("exonet stats: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        for r in &records {
            println!("{}", json(r));
        }
    } else {
        print!("{}", tables(&records));
    }
    ExitCode::SUCCESS
}

fn json(r: &Record) -> String {
    let mut s = format!(
        "{{\"kind\":\"{}\",\"id\":{},\"label\":\"{}\"",
        escape(&r.kind),
        r.id,
        escape(&r.label)
    );
    for (k, v) in &r.fields {
        s.push_str(&format!(",\"{}\":{v}", escape(k)));
    }
    s.push('}');
    s
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o
}

/// Columns of the endpoint and channel tables: (header, counter names summed).
const ENDPOINT_COLUMNS: &[(&str, &[&str])] = &[
    ("uid", &["uid"]),
    ("pid", &["pid"]),
    ("ch", &["channels"]),
    ("rx frames", &["rx_frames"]),
    ("rx bytes", &["rx_bytes"]),
    ("rx drops", &["rx_no_buffer", "rx_ring_full", "rx_too_long"]),
    ("consumed", &["rx_consumed"]),
    ("tx frames", &["tx_frames"]),
    ("tx bytes", &["tx_bytes"]),
    ("direct", &["direct_frames"]),
    (
        "tx drops",
        &[
            "tx_bad_desc",
            "tx_bad_chain",
            "tx_bad_channel",
            "tx_template_mismatch",
            "tx_frag_no_head",
            "tx_link_error",
            "direct_refused",
            "direct_over_rate",
        ],
    ),
    ("rx kcyc", &["rx_cycles"]),
    ("copy kcyc", &["copy_cycles"]),
    ("tx kcyc", &["tx_cycles"]),
    ("ash kcyc", &["handler_cycles"]),
    ("ash over", &["handler_over_budget"]),
];

const CHANNEL_COLUMNS: &[(&str, &[&str])] = &[
    ("endpoint", &["endpoint"]),
    ("rx frames", &["rx_frames"]),
    ("rx bytes", &["rx_bytes"]),
    ("consumed", &["rx_consumed"]),
    ("rx drops", &["rx_dropped"]),
    ("tx frames", &["tx_frames"]),
    ("tx bytes", &["tx_bytes"]),
    ("mismatch", &["tx_template_mismatch"]),
    ("no head", &["tx_frag_no_head"]),
    ("ash runs", &["handler_runs"]),
    (
        "ash aborts",
        &[
            "handler_aborts",
            "handler_out_of_fuel",
            "handler_traps",
            "handler_bad_verdict",
        ],
    ),
    ("ash drops", &["handler_dropped"]),
    ("ash sent", &["handler_sent"]),
];

fn tables(records: &[Record]) -> String {
    let mut out = String::new();
    for r in records
        .iter()
        .filter(|r| r.kind != "endpoint" && r.kind != "channel")
    {
        out.push_str(&format!("{} {}\n ", r.kind, r.label));
        for (k, v) in &r.fields {
            out.push_str(&format!(" {k}={v}"));
        }
        out.push('\n');
    }
    for (kind, cols) in [("endpoint", ENDPOINT_COLUMNS), ("channel", CHANNEL_COLUMNS)] {
        let rows: Vec<&Record> = records.iter().filter(|r| r.kind == kind).collect();
        out.push_str(&format!("\n{kind}s: {}\n", rows.len()));
        if rows.is_empty() {
            continue;
        }
        let mut grid = vec![std::iter::once("id".to_string())
            .chain(cols.iter().map(|c| c.0.to_string()))
            .collect::<Vec<_>>()];
        for r in &rows {
            let mut line = vec![r.id.to_string()];
            for (head, names) in cols {
                let v: u64 = names.iter().filter_map(|n| r.get(n)).sum();
                line.push(if head.ends_with("kcyc") {
                    format!("{:.1}", v as f64 / 1000.0)
                } else {
                    v.to_string()
                });
            }
            grid.push(line);
        }
        let widths: Vec<usize> = (0..grid[0].len())
            .map(|i| grid.iter().map(|l| l[i].chars().count()).max().unwrap_or(0))
            .collect();
        for (row, line) in grid.iter().enumerate() {
            for (cell, w) in line.iter().zip(&widths) {
                out.push_str(&format!("{cell:>w$} "));
            }
            if kind == "channel" && row > 0 {
                out.push_str(&rows[row - 1].label);
            }
            out.push('\n');
        }
    }
    out
}
