//! The report's frame: the run-to-run comparison of paired ratios, the date
//! and the machine.

use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

/// This run's paired ratios beside the previous run's (read from `path`,
/// then, if `keep`, replaced with this run's): two runs agree on a ratio
/// when their interquartile ranges overlap.
pub(crate) fn run_to_run(records: &[Value], path: &Path, keep: bool) -> String {
    let previous: Vec<Value> = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|doc| doc["ratios"].as_array().cloned())
        .unwrap_or_default();
    let when = previous_run_date(path);
    let doc = json!({"generated": utc_now(), "ratios": records});
    if keep && let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap()) {
        eprintln!("cannot keep the ratios in {}: {e}", path.display());
    }
    let mut out = String::from("## Run to run\n\n");
    if previous.is_empty() {
        out.push_str(
            "No earlier run's ratios to compare with (the next `make bench` compares with this one).\n",
        );
        return out;
    }
    let cell = |r: &Value| {
        format!(
            "{:.2}× (IQR {:.2}–{:.2})",
            r["ratio"].as_f64().unwrap_or(f64::NAN),
            r["q1"].as_f64().unwrap_or(f64::NAN),
            r["q3"].as_f64().unwrap_or(f64::NAN)
        )
    };
    writeln!(
        out,
        "Every paired ratio of this run beside the previous `make bench` ({when}). They agree when \
         their interquartile ranges overlap.\n"
    )
    .unwrap();
    out.push_str("| ratio | this run | previous run | agree |\n|---|---|---|---|\n");
    let (mut agreed, mut compared) = (0, 0);
    for record in records {
        let Some(before) = previous.iter().find(|p| p["name"] == record["name"]) else {
            continue;
        };
        let overlap = record["q1"].as_f64() <= before["q3"].as_f64()
            && before["q1"].as_f64() <= record["q3"].as_f64();
        compared += 1;
        agreed += usize::from(overlap);
        writeln!(
            out,
            "| {} | {} | {} | {} |",
            record["name"].as_str().unwrap_or_default(),
            cell(record),
            cell(before),
            if overlap { "yes" } else { "**no**" }
        )
        .unwrap();
    }
    writeln!(out, "\n{agreed} of {compared} ratios agree.\n").unwrap();
    out
}

pub(crate) fn utc_now() -> String {
    Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

pub(crate) fn previous_run_date(path: &Path) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|doc| doc["generated"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "unknown date".into())
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    // `rustc 1.95.0 (59807616e 2026-04-14)`: the version, without the
    // commit it was built from.
    let rustc = rustc.split(" (").next().unwrap_or_default();
    format!(
        "{cores} cores ({cpu}), {mem_gib:.0} GiB RAM, Linux; {rustc}; wasmtime 48 (release build, pooling allocator, epoch interruption, no fuel)"
    )
}
