//! §1 Per-call overhead: the full host path beside the raw wasmtime floor, a
//! reused instance, a native function and a subprocess, in every language.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{Bench, LANGS, Pinned, batch, component, median, us, verdict};
use airlock::{RunContext, ToolCall};
use serde_json::{Map, Value, json};

/// The same work as the Rust `increment` tool, natively: read the counters
/// as JSON text (as the view hands them over), add one, write result and
/// op value as JSON text.
fn native_increment(deps: &Map<String, Value>, name: &str) -> (String, String) {
    let text = deps
        .get("counters")
        .map(Value::to_string)
        .unwrap_or_else(|| "{}".into());
    let mut counters: Map<String, Value> = serde_json::from_str(&text).unwrap();
    let value = counters.get(name).and_then(Value::as_i64).unwrap_or(0) + 1;
    counters.insert(name.into(), json!(value));
    (
        json!({"counter": name, "value": value}).to_string(),
        Value::Object(counters).to_string(),
    )
}

const PY_ECHO: &str = "import json,sys\nd=json.load(sys.stdin)\nc=d.get('counters',{})\nc['vowels']=c.get('vowels',0)+1\nprint(json.dumps({'counter':'vowels','value':c['vowels']}))";

/// The real interpreter behind `python3` (which may be a shell shim, as
/// pyenv's is), so the baseline pays for Python, not for the shim.
fn python() -> String {
    Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

fn subprocess_call(python: &str) {
    let mut child = Command::new(python)
        .args(["-c", PY_ECHO])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"counters":{"vowels":2}}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 1. Per-call overhead\n").unwrap();
    writeln!(
        out,
        "`increment {{\"name\": \"vowels\"}}` on deps `{{\"counters\": {{\"vowels\": 2}}}}`, one call at a time on one run \
         context (as a session's calls are).\n\n\
         - **full host path**: `Host::call` — argument schema check, fresh store and instance from the cached \
         `InstancePre`, limits armed, context view, the call, result and op parsing, atomic op application; \
         a store slow to drop (its memory reset: Python, JavaScript) is dropped after the call returns, on \
         the host's own thread, while fewer calls run than there are cores;\n\
         - **raw floor**: a fresh store and instance from the same `InstancePre` and one call, nothing else \
         (same engine, pooling allocator, limits);\n\
         - **reused instance**: one instance called again and again (what an instance-reusing host such as \
         Extism does; state leaks between calls, which Airlock never allows);\n\
         - **native**: the same work as a Rust function;\n\
         - **subprocess**: the Python interpreter started per call (`python -c`), reading the deps as JSON on stdin.\n"
    )
    .unwrap();
    writeln!(out, "| tool | full host path | raw floor | full / floor (paired) | reused instance | native | subprocess |").unwrap();
    writeln!(out, "|---|---|---|---|---|---|---|").unwrap();
    let deps = json!({"counters": {"vowels": 2}});
    let base = RunContext::from_value(deps.clone()).unwrap();
    let call = ToolCall::new("increment", r#"{"name":"vowels"}"#);
    // The unpaired columns are measured once, in the reporting pass.
    let (native, subprocess) = if b.reporting() {
        let native = median(b.iters(20_000), async || {
            std::hint::black_box(native_increment(base.deps(), "vowels"));
        })
        .await;
        let python = python();
        let subprocess = median(b.iters(60).max(5), async || subprocess_call(&python)).await;
        (native, subprocess)
    } else {
        (Duration::ZERO, Duration::ZERO)
    };
    let mut checks = Vec::new();
    let mut breakdown = Vec::new();
    for lang in &LANGS {
        // Every call instantiates: the ratio is the host's own work.
        let host = b.host_preparing(&[component(lang.file)], 0).await;
        let per_batch = match lang.name {
            "Python" => 8,
            "JavaScript" => 24,
            _ => 1000,
        };
        let pairs = if b.quick { 5 } else { 45 };
        // One run context for every full-path call, as a session's calls
        // share one (the counter goes up; the work per call stays the same).
        let mut ctx = base.clone();
        let pinned = Pinned::here(&[]);
        let measured = b
            .paired(
                &format!("{} full path / raw floor", lang.name),
                pairs,
                async || {
                    batch(per_batch, async || {
                        host.call(&mut ctx, &call).await.unwrap();
                    })
                    .await
                },
                async || {
                    batch(per_batch, async || {
                        host.bench_raw_call(&base, &call).await.unwrap();
                    })
                    .await
                },
            )
            .await;
        drop(pinned);
        if !b.reporting() {
            continue;
        }
        let (full, floor) = (measured.a(), measured.b());
        let reuse_n = b.iters(2000) as u32;
        let reused = host
            .bench_reused_calls(&base, &call, reuse_n)
            .await
            .unwrap()
            / reuse_n;
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            lang.name,
            us(full),
            us(floor),
            measured.cell(),
            us(reused),
            us(native),
            us(subprocess)
        )
        .unwrap();
        checks.push((lang.name, measured));
        // Where the floor's time goes: the median of each phase.
        let runs = b.iters(if per_batch < 1000 { 200 } else { 2000 });
        let mut phases: [Vec<Duration>; 4] = Default::default();
        let faults_before = minor_faults();
        for _ in 0..runs {
            let took = host.bench_phases(&base, &call).await.unwrap();
            for (all, one) in phases.iter_mut().zip(took) {
                all.push(one);
            }
        }
        let faults = (minor_faults() - faults_before) / runs as u64;
        let medians = phases.map(|mut all| {
            all.sort();
            all[all.len() / 2]
        });
        breakdown.push((lang.name, medians, faults, runs));
        eprintln!(
            "per-call {}: full {} floor {}",
            lang.name,
            us(full),
            us(floor)
        );
    }
    writeln!(
        out,
        "\nPython and JavaScript components embed an interpreter (CPython, SpiderMonkey) in a 12-18 MB \
         component: a fresh instance wires its core modules and maps its memory image, and its first call \
         writes to pages of that image, so the raw floor is hundreds of microseconds and Airlock's own work \
         adds little to it. Reusing an instance (the third column) would be cheaper but gives up per-call \
         isolation; Airlock keeps the isolation, so the targets below are for a fresh instance.\n"
    )
    .unwrap();
    writeln!(
        out,
        "Where a fresh-instance call's time goes (`Host::bench_phases`: the raw floor's steps, each the \
         median of its runs): a new store with its admission to the pool and the context view; \
         instantiating from the `InstancePre`; the call itself; dropping the store, which returns the \
         instance's memories and tables to the pool and resets them. docs/performance.md reads these.\n"
    )
    .unwrap();
    writeln!(
        out,
        "| tool | store and view | instantiate | call | drop | page faults a call | runs |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|---|---|").unwrap();
    for (name, [store, instantiate, call, dropped], faults, runs) in &breakdown {
        writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {faults} | {runs} |",
            us(*store),
            us(*instantiate),
            us(*call),
            us(*dropped)
        )
        .unwrap();
    }
    writeln!(out).unwrap();
    writeln!(out, "Targets:\n").unwrap();
    for (name, measured) in &checks {
        writeln!(
            out,
            "- {name}: full path within 1.1× of the raw floor: {} — {}",
            measured.cell(),
            measured.at_most(1.1)
        )
        .unwrap();
    }
    writeln!(out).unwrap();
    prepared_ahead(b, out, &base, &call).await;
}

/// §1's second table: the same call with an instance prepared ahead of
/// demand, its latency when one is ready and its cost back to back.
async fn prepared_ahead(b: &Bench, out: &mut String, base: &RunContext, call: &ToolCall) {
    let mut rows = Vec::new();
    for lang in &LANGS {
        let file = [component(lang.file)];
        let (ready, none) = (b.host(&file).await, b.host_preparing(&file, 0).await);
        let per_batch = match lang.name {
            "Python" => 8,
            "JavaScript" => 24,
            _ => 400,
        };
        let pairs = if b.quick { 5 } else { 30 };
        let (mut ctx_ready, mut ctx_none) = (base.clone(), base.clone());
        // Back to back: each call takes the instance made while the one
        // before ran, if it is ready yet. Not pinned: preparing runs on
        // the runtime's other worker, as it does for a user.
        let back_to_back = b
            .paired(
                &format!("{} back to back, prepared ahead / not", lang.name),
                pairs,
                async || {
                    batch(per_batch, async || {
                        ready.call(&mut ctx_ready, call).await.unwrap();
                    })
                    .await
                },
                async || {
                    batch(per_batch, async || {
                        none.call(&mut ctx_none, call).await.unwrap();
                    })
                    .await
                },
            )
            .await;
        if !b.reporting() {
            continue;
        }
        // Latency: a call that finds its instance ready, the thread kept
        // busy while it waits (untimed), as in a run of calls; and a call
        // after an idle gap of 1 ms on either host, as an agent's calls
        // come between model turns.
        let runs = b.iters(if per_batch < 400 { 300 } else { 2000 });
        let ready_hot = one_by_one(runs, &ready, &mut ctx_ready, call, None).await;
        let gap = Some(Duration::from_millis(1));
        let ready_gap = one_by_one(runs, &ready, &mut ctx_ready, call, gap).await;
        let none_gap = one_by_one(runs, &none, &mut ctx_none, call, gap).await;
        let latency = (ready_hot, ready_gap, none_gap);
        eprintln!(
            "prepared {}: {} ready, {} after a gap (none prepared {}) {:?}",
            lang.name,
            us(ready_hot),
            us(ready_gap),
            us(none_gap),
            ready.pool_usage()
        );
        rows.push((lang.name, latency, back_to_back));
    }
    if !b.reporting() {
        return;
    }
    writeln!(
        out,
        "The same call on a host that prepares one instance of the tool ahead of demand \
         (`prepared_instances`, the default): each call takes a fresh instance made before it was \
         asked for, never used before, and starts the next one on another worker while fewer calls \
         run than there are cores. Components that instantiate in under 30 µs (Rust, C, \
         JavaScript) are not prepared after the first: handing an instance over costs more than \
         making it. **Ready**: one call at a time, each once its instance is ready (the wait, untimed, \
         keeps the thread busy, as a run of calls does); the median. **After a gap**: each call 1 ms \
         after the one before ended, as an agent's calls come between model turns: on this shared \
         2-core VM an idle core wakes cold, and both hosts pay for it. **Back to back** runs calls \
         with no pause between them, so a call finds its instance ready only if it was made while the \
         call before ran: the paired ratio, prepared / not prepared, shows whether preparing costs \
         throughput (over 1.00×) or gains it by using the second core (under).\n"
    )
    .unwrap();
    writeln!(
        out,
        "| tool | ready | after a gap: prepared | not prepared | back to back: prepared | not prepared | prepared / not (paired) |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|---|---|").unwrap();
    for (name, (ready, gap, unprepared), back_to_back) in &rows {
        writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            us(*ready),
            us(*gap),
            us(*unprepared),
            us(back_to_back.a()),
            us(back_to_back.b()),
            back_to_back.cell()
        )
        .unwrap();
    }
    writeln!(out, "\nTargets (issue 30):\n").unwrap();
    for (name, (latency, _, _), back_to_back) in &rows {
        // The interpreters' fresh-instance calls.
        let ceiling = match *name {
            "Python" => Some(400),
            "JavaScript" => Some(150),
            _ => None,
        };
        if let Some(ceiling) = ceiling {
            writeln!(
                out,
                "- {name}: fresh-instance call at most {ceiling} µs: {} with its instance ready — {}",
                us(*latency),
                verdict(latency.as_micros() <= ceiling)
            )
            .unwrap();
        }
        writeln!(
            out,
            "- {name}: preparing ahead costs no throughput back to back (prepared / not at most 1.05×): {} — {}",
            back_to_back.cell(),
            back_to_back.at_most(1.05)
        )
        .unwrap();
    }
    writeln!(out).unwrap();
}

/// The process's minor page faults so far (`/proc/self/stat`, field 10).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, fields)| fields.split_whitespace().nth(7))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The median of `runs` calls of `call` on `host`, one at a time: each
/// after `gap` idle (if any) and, while the host prepares instances, once
/// one is ready (the thread yielding meanwhile, so it stays busy). Neither
/// wait is timed.
async fn one_by_one(
    runs: usize,
    host: &airlock::Host,
    ctx: &mut RunContext,
    call: &ToolCall,
    gap: Option<Duration>,
) -> Duration {
    let preparing = || host.components().iter().any(|c| c.prepared_ahead() > 0);
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        if let Some(gap) = gap {
            tokio::time::sleep(gap).await;
        }
        while preparing() && host.pool_usage().prepared == 0 {
            tokio::task::yield_now().await;
        }
        let started = std::time::Instant::now();
        host.call(ctx, call).await.unwrap();
        samples.push(started.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}
