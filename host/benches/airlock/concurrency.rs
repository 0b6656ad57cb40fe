//! §5 Concurrency: calls of many sessions at once, and memory.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Bench, component, rss_kib, sample_peak_rss, us};
use airlock::{RunContext, ToolCall};

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 5. Concurrency\n").unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    writeln!(
        out,
        "N sessions at once, each with its own run context, calling the Rust `increment` tool in a loop for \
         {} s on a {cores}-core machine (tokio, {cores} worker threads). Peak RSS is the largest resident size \
         of the whole bench process sampled during the run (it includes the compiled code of every \
         component the bench has loaded so far).\n",
        if b.quick { "0.3" } else { "2" }
    )
    .unwrap();
    writeln!(
        out,
        "| sessions | calls per second | per call | peak RSS | growth over idle |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|").unwrap();
    let host = Arc::new(
        b.host(&[component("wasm32-wasip2/release/stateful.wasm")])
            .await,
    );
    let window = if b.quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(2)
    };
    // The tables are measured once, in the reporting pass.
    let counts: &[usize] = if b.reporting() { &[1, 2, 8, 64] } else { &[] };
    for &n in counts {
        let row = sessions_for(&host, n, window).await;
        writeln!(out, "{}", row.cells()).unwrap();
        eprintln!("concurrency {n}: {:.0}/s", row.per_sec);
    }
    if b.reporting() {
        // With and without an instance prepared ahead of demand: under
        // load, preparing would move instantiation off the call's path but
        // not off the cores, so this is where it would show a throughput
        // or memory cost.
        let file = [component("python-stateful.wasm")];
        let mut rows = String::new();
        for prepared in [1, 0] {
            let python = Arc::new(b.host_preparing(&file, prepared).await);
            let row = sessions_for(&python, 16, window).await;
            writeln!(rows, "| {prepared} {}", row.cells()).unwrap();
            eprintln!(
                "concurrency python 16, {prepared} prepared: {:.0}/s",
                row.per_sec
            );
        }
        writeln!(
            out,
            "\nThe same with the Python `increment` tool (componentize-py), 16 sessions at once, with one \
             instance prepared ahead of demand per tool (`prepared_instances = 1`, the default) and with \
             none. Each memory slot of the instance pool keeps resident at most the 4 MiB it resets in \
             place (`linear_memory_keep_resident`; a Python call dirties about 1 MiB), so warm slots may \
             hold up to 16 × 4 MiB more than a pool that gave every page back; a prepared instance holds \
             one slot more while it waits.\n\n\
             | prepared | sessions | calls per second | per call | peak RSS | growth over idle |\n\
             |---|---|---|---|---|---|\n{rows}"
        )
        .unwrap();
    }
    // 1 → 2 sessions, paired: a batch of calls from one session, then the
    // same number from two sessions at once (half each), alternating.
    let calls = if b.quick { 200 } else { 2000 };
    let sessions = |n: usize| {
        let host = Arc::clone(&host);
        async move {
            let started = Instant::now();
            let tasks: Vec<_> = (0..n)
                .map(|s| {
                    let host = Arc::clone(&host);
                    tokio::spawn(async move {
                        let mut ctx = RunContext::default().with_session_id(format!("p{s}"));
                        let call = ToolCall::new("increment", r#"{"name":"n"}"#);
                        for _ in 0..calls / n {
                            host.call(&mut ctx, &call).await.unwrap();
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            started.elapsed() / calls as u32
        }
    };
    let scaling = b
        .paired(
            "1 → 2 sessions throughput",
            if b.quick { 5 } else { 33 },
            async || sessions(1).await,
            async || sessions(2).await,
        )
        .await;
    writeln!(
        out,
        "\n1 → 2 sessions, paired ({calls} calls a batch, from one session or split over two): \
         throughput {} — target at least 1.8× on {cores} cores: {}.\n",
        scaling.cell(),
        scaling.at_least(1.8)
    )
    .unwrap();
}

/// One row of the concurrency tables.
struct Row {
    sessions: usize,
    per_sec: f64,
    peak_kib: u64,
    idle_kib: u64,
}

impl Row {
    fn cells(&self) -> String {
        format!(
            "| {} | {:.0} | {} | {:.0} MiB | {:.1} MiB |",
            self.sessions,
            self.per_sec,
            us(Duration::from_secs_f64(1.0 / self.per_sec)),
            self.peak_kib as f64 / 1024.0,
            self.peak_kib.saturating_sub(self.idle_kib) as f64 / 1024.0
        )
    }
}

/// `n` sessions calling `increment` on `host` in a loop for `window`, the
/// process's peak RSS sampled meanwhile.
async fn sessions_for(host: &Arc<airlock::Host>, n: usize, window: Duration) -> Row {
    let idle_kib = rss_kib("VmRSS:");
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_peak_rss(Arc::clone(&done));
    let deadline = Instant::now() + window;
    let tasks: Vec<_> = (0..n)
        .map(|s| {
            let host = Arc::clone(host);
            tokio::spawn(async move {
                let mut ctx = RunContext::default().with_session_id(format!("s{s}"));
                let call = ToolCall::new("increment", r#"{"name":"n"}"#);
                let mut calls = 0u64;
                // At least one call per session, however short the window.
                loop {
                    host.call(&mut ctx, &call).await.unwrap();
                    calls += 1;
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                assert_eq!(ctx.deps()["counters"]["n"], calls);
                calls
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    Row {
        sessions: n,
        per_sec: total as f64 / window.as_secs_f64(),
        peak_kib: sampler.join().unwrap(),
        idle_kib,
    }
}
