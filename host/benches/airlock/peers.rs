//! §11 Peers: Extism, a process per call and a native function doing the
//! same work, paired with Airlock's calls.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{Bench, Pinned, batch, component};
use airlock::{RunContext, ToolCall};
use serde_json::Value;

/// The peers harness (`peers/harness`): Extism running the increment
/// plugin, one batch per request.
struct Harness {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Harness {
    fn start(exe: &str, plugin: &str) -> Self {
        let mut child = Command::new(exe)
            .arg(plugin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{exe}: {e}"));
        let input = child.stdin.take().unwrap();
        let output = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        Self {
            child,
            input,
            output,
        }
    }

    fn ask(&mut self, line: &str) -> String {
        writeln!(self.input, "{line}").unwrap();
        self.input.flush().unwrap();
        self.output.next().unwrap().unwrap()
    }

    /// One batch of `n` calls in `mode`; the per-call time (timed inside
    /// the harness, so the pipe is not counted).
    fn batch(&mut self, mode: &str, n: usize) -> Duration {
        let nanos: u64 = self.ask(&format!("{mode} {n}")).parse().unwrap();
        Duration::from_nanos(nanos) / n.max(1) as u32
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(
        out,
        "## 11. Peers: Extism, a process per call and native, beside Airlock\n"
    )
    .unwrap();
    let (Ok(exe), Ok(plugin)) = (
        std::env::var("AIRLOCK_PEERS_HARNESS"),
        std::env::var("AIRLOCK_PEERS_PLUGIN"),
    ) else {
        writeln!(
            out,
            "Not measured: the peers harness was not built (`make bench` builds it).\n"
        )
        .unwrap();
        return;
    };
    let mut extism = Harness::start(&exe, &plugin);
    let host = b
        .host(&[component("wasm32-wasip2/release/stateful.wasm")])
        .await;
    let call = ToolCall::new("increment", r#"{"name":"n"}"#);
    // The same JSON in, the same JSON out: both see no counters yet.
    let ours = host.call(&mut RunContext::default(), &call).await.unwrap();
    let theirs: Value = serde_json::from_str(&extism.ask("check")).unwrap();
    assert_eq!(theirs["result"], ours.result, "Extism and Airlock disagree");

    let pairs = if b.quick { 5 } else { 45 };
    let mut ctx = RunContext::default();
    let mut rows = Vec::new();
    let _pinned = Pinned::here(&[extism.child.id()]);
    // Batches of about the same length on both sides (a few ms), so that
    // neither side always runs in the other's wake.
    for (mode, name, per_batch, ours_n) in [
        ("reused", "Extism, reused plugin", 800, 1000),
        (
            "fresh",
            "Extism, fresh plugin per call (compiled once)",
            50,
            1000,
        ),
        (
            "bytes",
            "Extism, fresh plugin per call (from the wasm bytes)",
            3,
            1000,
        ),
        ("spawn", "a process per call (the work native)", 15, 1000),
        ("native", "native function (no sandbox)", 15_000, 1000),
    ] {
        // The peer's time over Airlock's: how many times faster Airlock is.
        let measured = b
            .paired(
                &format!("{} / Airlock", peer_name(mode)),
                pairs,
                async || extism.batch(mode, per_batch),
                async || {
                    batch(ours_n, async || {
                        host.call(&mut ctx, &call).await.unwrap();
                    })
                    .await
                },
            )
            .await;
        rows.push((name, measured));
    }
    writeln!(
        out,
        "The Rust `increment` tool's work as an Extism plugin (`peers/plugin`, extism-pdk, \
         wasm32-unknown-unknown) on Extism 1.30.0 (the newest that builds with this rustc; 1.41 needs \
         wasmtime 49 and rustc 1.96), run by `peers/harness`; the same JSON in and out (checked: both \
         return `{}`). Beside it, the two baselines with no sandbox runtime, run by the same harness on \
         the same work (`peers/plugin/src/work.rs`, compiled natively): a new process per call (the \
         harness itself with `--once`, JSON in on stdin and out on stdout: what isolating a tool in a \
         process costs before any container or seccomp), and a plain function call. Airlock's side is \
         `Host::call`: a fresh instance, the context view, the ops validated and applied. Each pair \
         alternates a batch of the peer's calls (timed inside the harness) with a batch of Airlock \
         calls; the ratio is the peer's time over Airlock's: how many times faster Airlock is (under \
         1: slower).\n",
        ours.result
    )
    .unwrap();
    writeln!(
        out,
        "| peer | peer per call | Airlock per call | peer / Airlock (paired) |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|").unwrap();
    for (name, measured) in &rows {
        writeln!(out, "{}", measured.row(name)).unwrap();
    }
    let (reused, fresh, bytes) = (&rows[0].1, &rows[1].1, &rows[2].1);
    writeln!(
        out,
        "\nTargets:\n\n\
         - Airlock's fresh-instance call at or below an Extism reused plugin call (Extism / Airlock \
         at least 1): {} — {}\n\
         - at least 20× faster than an Extism fresh plugin: compiled once, {} — {}; from the wasm \
         bytes, {} — {}\n",
        reused.cell(),
        reused.at_least(1.0),
        fresh.cell(),
        fresh.at_least(20.0),
        bytes.cell(),
        bytes.at_least(20.0),
    )
    .unwrap();
}

/// How the run-to-run table names a peer of §11.
fn peer_name(mode: &str) -> String {
    match mode {
        "spawn" => "process per call".to_owned(),
        "native" => "native".to_owned(),
        extism => format!("Extism {extism}"),
    }
}
